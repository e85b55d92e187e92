# The PyTorch side of the convergence check: torchvision ResNet-50 trained for one epoch on Fashion-MNIST
# with the recipe of wb-train's demo config (same data, transforms, schedule and optimizer), then
# evaluated on the test split like `wb-train --eval`. Compare its top-1 with
#   build/bin/wb-train --config assets/configs/resnet50_fashion_mnist.json --epochs 1 --eval
# Run with Debian's interpreter: /usr/bin/python3 bench/fashion_mnist_epoch_torch.py [flags]
import argparse
import gzip
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision


def read_idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-path", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--lr-schedule", choices=["constant", "cosine"], default="cosine")
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--crop-padding", type=int, default=4)
    ap.add_argument("--no-random-flip", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)

    d = a.data_path
    xtr = read_idx(f"{d}/train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28).astype(np.float32)
    ytr = read_idx(f"{d}/train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    xte = read_idx(f"{d}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28).astype(np.float32)
    yte = read_idx(f"{d}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)
    mean, std = 0.2860, 0.3530  # wb-train's Fashion-MNIST normalisation

    def prep(x, train):
        x = torch.from_numpy(x).unsqueeze(1)
        if train:
            p = a.crop_padding
            padded = F.pad(x, (p, p, p, p))
            out = torch.empty_like(x)
            for i in range(x.shape[0]):
                t, l = rng.integers(0, 2 * p + 1, 2)
                crop = padded[i, :, t:t + 28, l:l + 28]
                if not a.no_random_flip and rng.random() < 0.5:
                    crop = crop.flip(-1)
                out[i] = crop
            x = out
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
        return ((x / 255 - mean) / std).repeat(1, 3, 1, 1)

    model = torchvision.models.resnet50(num_classes=10)
    model.train()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0}],
                          lr=a.lr, momentum=0.9)
    steps = len(xtr) // a.batch_size

    def lr_at(i):  # wb-train's cosine: the seed guide's _generate_cosine_lr
        if a.lr_schedule == "constant":
            return a.lr
        if i < a.warmup_steps:
            return a.lr / a.warmup_steps * (i + 1)
        decay_steps = steps - a.warmup_steps
        return a.lr * ((steps - i) / decay_steps * 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / decay_steps)) + 1e-5)

    perm = rng.permutation(len(xtr))
    t0 = time.time()
    losses = []
    for s in range(steps):
        idx = perm[s * a.batch_size:(s + 1) * a.batch_size]
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        opt.zero_grad()
        loss = F.cross_entropy(model(prep(xtr[idx], True)), torch.from_numpy(ytr[idx]), label_smoothing=a.label_smoothing)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (s + 1) % 100 == 0 or s + 1 == steps:
            print(f"step {s + 1}/{steps}  loss (mean of last 100) {np.mean(losses[-100:]):.4f}  {time.time() - t0:.0f} s",
                  flush=True)

    model.eval()
    n = len(xte) // a.batch_size * a.batch_size  # whole batches, as wb-train evaluates
    top1 = top5 = 0
    with torch.no_grad():
        for i in range(0, n, a.batch_size):
            logits = model(prep(xte[i:i + a.batch_size], False))
            y = torch.from_numpy(yte[i:i + a.batch_size])
            top1 += (logits.argmax(1) == y).sum().item()
            top5 += (logits.topk(5, 1).indices == y[:, None]).any(1).sum().item()
    print(f"eval on {n} test images: top-1 {100 * top1 / n:.2f}%, top-5 {100 * top5 / n:.2f}%")


if __name__ == "__main__":
    main()
