# The PyTorch side of bench/cpu_vs_torch: torchvision ResNet-50 training steps, driven over a pipe.
# Commands on stdin, one per line: "step N" runs N steps and answers "<seconds>"; "memory" runs one step
# under the profiler with profile_memory and answers the most bytes it held (peak_allocated); "quit" ends.
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "compare" / "reference"))
from torch_profile import held_bytes  # noqa: E402


def peak_allocated(step, model, optimizer, batch):
    """The most bytes a step holds: what it holds before its first op, then each op's net allocation in
    time order (the profiler's self_cpu_memory_usage), as compare/reference/torch_profile.py writes the
    "[memory]" events of a trace that `wb diff` compares."""
    from torch.profiler import ProfilerActivity, profile
    total = peak = held_bytes(model, optimizer, batch)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.device_type == torch.autograd.DeviceType.CPU and e.self_cpu_memory_usage:
            total += e.self_cpu_memory_usage
            peak = max(peak, total)
    return peak


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
        if cmd[0] == "memory":
            print(peak_allocated(step, model, opt, (x, y)), flush=True)
            continue
        n = int(cmd[1])
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        print(f"{time.perf_counter() - t0:.9f}", flush=True)


if __name__ == "__main__":
    main()
