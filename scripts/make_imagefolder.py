#!/usr/bin/python3
"""Builds a small ImageNet-style image folder (ROOT/CLASS/IMAGE) from real photographs that Debian
ships, without downloading anything: matplotlib's sample photograph (python-matplotlib-data's
grace_hopper.jpg, 512x600) and its two RGBA sample pictures, cut into varied crops and sizes and saved
as real JPEG (4:2:0, 4:2:2, 4:4:4, progressive, greyscale, CMYK, EXIF-rotated) and PNG (RGB, RGBA,
grey, palette, 16-bit) files.

  make_imagefolder.py OUT [--classes 4] [--per-class 12] [--seed 1] [--size 160:520] [--broken]
                          [--parity] [--formats all|jpeg]

--broken adds deliberately bad files to the first class (a truncated JPEG, a JPEG with a damaged
stream, a PNG with a bad checksum, an empty file, text named .png). --parity writes one folder of odd
cases instead (tall, wide, tiny, greyscale, CMYK, EXIF-rotated, every PNG colour type). --formats jpeg
writes the JPEG variants only, as ImageNet's folders hold (all JPEG, a few of them greyscale or CMYK).
Prints the number of files written.
"""
import argparse
import io
import os
import random
import sys

SAMPLE = "/usr/share/matplotlib/mpl-data/sample_data"
PHOTO = os.path.join(SAMPLE, "grace_hopper.jpg")
EXTRAS = [os.path.join(SAMPLE, "Minduka_Present_Blue_Pack.png"), os.path.join(SAMPLE, "logo2.png")]


def fail(msg):
    print(f"make_imagefolder.py: {msg}", file=sys.stderr)
    sys.exit(2)


def sources():
    from PIL import Image
    if not os.path.exists(PHOTO):
        fail(f"{PHOTO} is missing (install Debian's python-matplotlib-data)")
    photo = Image.open(PHOTO).convert("RGB")
    extras = [Image.open(p).convert("RGB") for p in EXTRAS if os.path.exists(p)]
    return photo, extras


def cut(rng, photo, w, h):
    """A random crop of the photograph (at least a quarter of each side), resized to w x h."""
    from PIL import Image
    pw, ph = photo.size
    cw = rng.randint(pw // 4, pw)
    ch = rng.randint(ph // 4, ph)
    x = rng.randint(0, pw - cw)
    y = rng.randint(0, ph - ch)
    img = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def save_variant(img, path_stem, kind, rng):
    """Writes `img` as one of the JPEG / PNG variants; returns the file name."""
    from PIL import Image
    if kind == "jpeg420":
        path = path_stem + ".jpg"
        img.save(path, "JPEG", quality=rng.randint(70, 95), subsampling=2)
    elif kind == "jpeg422":
        path = path_stem + ".JPEG"
        img.save(path, "JPEG", quality=rng.randint(70, 95), subsampling=1)
    elif kind == "jpeg444":
        path = path_stem + ".jpeg"
        img.save(path, "JPEG", quality=rng.randint(80, 100), subsampling=0)
    elif kind == "progressive":
        path = path_stem + ".jpg"
        img.save(path, "JPEG", quality=85, progressive=True)
    elif kind == "grey":
        path = path_stem + ".jpg"
        img.convert("L").save(path, "JPEG", quality=90)
    elif kind == "cmyk":
        path = path_stem + ".jpg"
        img.convert("CMYK").save(path, "JPEG", quality=92)
    elif kind == "exif":
        path = path_stem + ".jpg"
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: rotate 90 CW to display; torchvision's loader ignores it
        img.save(path, "JPEG", quality=90, exif=exif.tobytes())
    elif kind == "png":
        path = path_stem + ".png"
        img.save(path, "PNG")
    elif kind == "png_rgba":
        path = path_stem + ".png"
        rgba = img.convert("RGBA")
        rgba.putalpha(img.convert("L"))
        rgba.save(path, "PNG")
    elif kind == "png_grey":
        path = path_stem + ".png"
        img.convert("L").save(path, "PNG")
    elif kind == "png_palette":
        path = path_stem + ".png"
        img.convert("P", palette=Image.ADAPTIVE, colors=64).save(path, "PNG")
    elif kind == "png16":
        import numpy as np
        path = path_stem + ".png"
        a = np.asarray(img.convert("L"), dtype=np.uint16) * 257
        Image.fromarray(a.astype(np.uint16)).save(path, "PNG")  # 16-bit grey (PIL clips it to 255)
    elif kind == "png_la":
        path = path_stem + ".png"
        img.convert("LA").save(path, "PNG")
    else:
        raise ValueError(kind)
    return os.path.basename(path)


KINDS = ["jpeg420", "jpeg420", "jpeg422", "jpeg444", "progressive", "grey", "cmyk", "exif", "png", "png_rgba",
         "png_grey", "png_palette"]
JPEG_KINDS = [k for k in KINDS if not k.startswith("png")]


def write_classes(out, classes, per_class, seed, size_range, kinds):
    photo, extras = sources()
    rng = random.Random(seed)
    lo, hi = size_range
    count = 0
    for c in range(classes):
        folder = os.path.join(out, f"class_{c:02d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            w, h = rng.randint(lo, hi), rng.randint(lo, hi)
            src = photo if (not extras or rng.random() < 0.85) else rng.choice(extras)
            img = cut(rng, src, w, h)
            # Each class leans on its own colour cast so that a model can tell them apart.
            from PIL import ImageEnhance
            img = ImageEnhance.Color(img).enhance(0.4 + 0.4 * c)
            save_variant(img, os.path.join(folder, f"img_{i:04d}"), kinds[(i + c) % len(kinds)], rng)
            count += 1
    return count


def write_parity(out, seed):
    """Odd sizes and every decoder path, one folder."""
    photo, _ = sources()
    rng = random.Random(seed)
    folder = os.path.join(out, "odd")
    os.makedirs(folder, exist_ok=True)
    sizes = [(512, 600), (300, 225), (225, 300), (1000, 120), (90, 700), (7, 5), (1, 1), (3, 400), (257, 256),
             (224, 224), (255, 257), (640, 480)]
    kinds = ["jpeg420", "jpeg422", "jpeg444", "progressive", "grey", "cmyk", "exif", "png", "png_rgba", "png_grey",
             "png_palette", "png16", "png_la"]
    count = 0
    for i, (w, h) in enumerate(sizes):
        for kind in kinds:
            if (i + kinds.index(kind)) % 3 and (w, h) not in ((512, 600), (1, 1), (7, 5)):
                continue  # every kind at every third size, and at the odd ones
            img = photo.copy() if (w, h) == photo.size else cut(rng, photo, w, h)
            save_variant(img, os.path.join(folder, f"s{i:02d}_{w}x{h}_{kind}"), kind, rng)
            count += 1
    return count


def write_broken(folder, photo):
    buf = io.BytesIO()
    photo.resize((200, 150)).save(buf, "JPEG", quality=90)
    good = buf.getvalue()
    with open(os.path.join(folder, "broken_truncated.jpg"), "wb") as f:
        f.write(good[: len(good) // 2])
    damaged = bytearray(good)
    for i in range(len(good) // 2, len(good) // 2 + 64):
        damaged[i] = 0xFF if i % 2 else 0xD9  # markers in the middle of the entropy-coded data
    with open(os.path.join(folder, "broken_stream.jpg"), "wb") as f:
        f.write(bytes(damaged))
    buf = io.BytesIO()
    photo.resize((64, 48)).save(buf, "PNG")
    png = bytearray(buf.getvalue())
    png[40] ^= 0x55  # inside IHDR/IDAT: the chunk's CRC no longer matches
    with open(os.path.join(folder, "broken_crc.png"), "wb") as f:
        f.write(bytes(png))
    open(os.path.join(folder, "broken_empty.jpg"), "wb").close()
    with open(os.path.join(folder, "broken_text.png"), "w") as f:
        f.write("not an image\n")
    return 5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--size", default="160:520", help="LO:HI side lengths of the images")
    p.add_argument("--broken", action="store_true")
    p.add_argument("--parity", action="store_true")
    p.add_argument("--formats", choices=["all", "jpeg"], default="all",
                   help="all: the JPEG and PNG variants; jpeg: the JPEG variants only")
    a = p.parse_args()
    try:
        lo, hi = (int(v) for v in a.size.split(":"))
        assert 1 <= lo <= hi
    except (ValueError, AssertionError):
        fail(f"--size '{a.size}': expected LO:HI with 1 <= LO <= HI")
    if a.classes < 1 or a.per_class < 1:
        fail("--classes and --per-class: expected at least 1")
    if a.parity:
        n = write_parity(a.out, a.seed)
    else:
        n = write_classes(a.out, a.classes, a.per_class, a.seed, (lo, hi),
                          JPEG_KINDS if a.formats == "jpeg" else KINDS)
    if a.broken:
        photo, _ = sources()
        n += write_broken(os.path.join(a.out, "class_00" if not a.parity else "odd"), photo)
    print(n)


if __name__ == "__main__":
    main()
