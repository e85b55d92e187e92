"""torchvision's own preprocessing of the files an image-folder run (wb-train --data imagefolder) put
into its dumped batch, so that `wb compare`'s `input` row checks the preprocessing itself.

wb-train records, with a step dump, which files each rank's batch held and the geometry each got
(meta "dump_input.rank<R>": root, recipe, image_size, resize_size and per sample file, label, flip,
resize, crop). This module opens those files with torchvision's ImageFolder loader (PIL,
convert("RGB")) and runs the recipe with torchvision's transforms:

  torchvision-eval   Resize(R), CenterCrop(S)                         (no recorded geometry used)
  seed-train         hflip if recorded, Resize((R, R)), CenterCrop(S)
  torchvision-train  resized_crop(recorded top, left, height, width, [S, S]), hflip if recorded

then ToTensor and Normalize with ImageNet's mean and std. Labels come from the class folder's position
among the sorted class folders, as ImageFolder indexes them.
"""
import json
import os

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
RECIPES = ("torchvision-eval", "seed-train", "torchvision-train")


class ImageInputError(Exception):
    """Bad or missing image-folder records; str() is one line naming the run file."""


def recorded_batch(meta, path, rank, step):
    """The record of rank `rank`'s dumped batch, or None when the run is not an image-folder run."""
    text = meta.get(f"dump_input.rank{rank}")
    if text is None:
        return None
    try:
        rec = json.loads(text)
        samples = rec["samples"]
        fields = (rec["root"], rec["recipe"], int(rec["image_size"]), int(rec["resize_size"]), int(rec["step"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ImageInputError(f"{path}: meta dump_input.rank{rank} is not a batch record ({e})") from None
    if fields[1] not in RECIPES:
        raise ImageInputError(f"{path}: meta dump_input.rank{rank} names recipe {fields[1]!r}, expected one of "
                              f"{', '.join(RECIPES)}")
    if fields[4] != step:
        raise ImageInputError(f"{path}: meta dump_input.rank{rank} describes step {fields[4]}, the dump is step {step}")
    return rec


def preprocess(rec, path):
    """(images float32 [N, 3, S, S], labels int64 [N]) from the recorded files, with torchvision."""
    import numpy as np
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets.folder import default_loader

    root, recipe = rec["root"], rec["recipe"]
    s, r = int(rec["image_size"]), int(rec["resize_size"])
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError as e:
        raise ImageInputError(f"{path}: the run's image folder {root} cannot be listed ({e.strerror})") from None
    class_to_idx = {c: i for i, c in enumerate(classes)}
    to_tensor = T.Compose([T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    images, labels = [], []
    for sample in rec["samples"]:
        file = os.path.join(root, sample["file"])
        try:
            img = default_loader(file)
        except OSError as e:
            raise ImageInputError(f"{file}: torchvision's loader cannot open it ({e})") from None
        if recipe == "torchvision-eval":
            img = T.CenterCrop(s)(T.Resize(r)(img))
        elif recipe == "seed-train":
            if sample["flip"]:
                img = F.hflip(img)
            img = T.CenterCrop(s)(T.Resize((r, r))(img))
        else:
            top, left, h, w = (int(v) for v in sample["crop"])
            img = F.resized_crop(img, top, left, h, w, [s, s], T.InterpolationMode.BILINEAR)
            if sample["flip"]:
                img = F.hflip(img)
        images.append(to_tensor(img))
        folder = sample["file"].split("/")[0]
        if folder not in class_to_idx:
            raise ImageInputError(f"{file}: not under a class folder of {root}")
        labels.append(class_to_idx[folder])
    return torch.stack(images).numpy().astype(np.float32), np.asarray(labels, dtype=np.int64)


def torchvision_batches(meta, path, ranks, step, dumped_labels):
    """{rank: float32 images} for the ranks of an image-folder run (empty for other runs). Checks that
    ImageFolder's labels for the recorded files are the labels the run dumped."""
    out = {}
    for r in ranks:
        rec = recorded_batch(meta, path, r, step)
        if rec is None:
            continue
        images, labels = preprocess(rec, path)
        want = [int(v) for v in dumped_labels[r]]
        if list(labels) != want:
            raise ImageInputError(f"{path}: rank {r}'s dumped labels {want[:8]}... differ from ImageFolder's "
                                  f"{list(labels)[:8]}... for the recorded files")
        out[r] = images
    return out
