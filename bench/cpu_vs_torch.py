# The PyTorch side of bench/cpu_vs_torch: torchvision ResNet-50 training steps, driven over a pipe.
# Commands on stdin, one per line: "step N" runs N steps and answers "<seconds>"; "quit" ends.
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision


def main():
    batch, size, classes, threads, data = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=classes)
    model.train()
    x = torch.from_numpy(np.fromfile(data + "/images.bin", dtype=np.float32).reshape(batch, 3, size, size).copy())
    y = torch.from_numpy(np.fromfile(data + "/labels.bin", dtype=np.int32).astype(np.int64))
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()

    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n = int(cmd[1])
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        print(f"{time.perf_counter() - t0:.9f}", flush=True)


if __name__ == "__main__":
    main()
