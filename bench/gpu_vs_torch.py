# The PyTorch side of bench/gpu_vs_torch: torchvision ResNet-50 training steps on the GPU, driven over a
# pipe so the two sides alternate in one run and PyTorch's start-up is not timed.
# Arguments: batch size, image size, classes. Commands on stdin, one per line:
#   "config fp32|tf32|bf16 [BATCH]"  rebuild model, optimizer and batch in that precision (and batch
#                            size, default the argument); answers "ok"
#                            (fp32: TF32 off; tf32: TF32 on; bf16: autocast bf16 + channels_last)
#   "step N"                 runs N steps, synchronises, answers "<seconds>"
#   "memory"                 answers "<peak allocated bytes> <peak reserved bytes>" since the last config
#   "release"                drops model, optimizer and batch and returns the cached memory to the driver
#   "quit"
import sys
import time

import torch
import torch.nn.functional as F
import torchvision


def main():
    batch, size, classes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    if not torch.cuda.is_available():
        print("error: this PyTorch sees no CUDA device", flush=True)
        return 1
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True  # what a tuned PyTorch job runs with
    state = {}

    def release():
        state.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def configure(precision, n):
        release()
        torch.cuda.reset_peak_memory_stats()
        gen = torch.Generator(device=dev).manual_seed(0)
        x_nchw = torch.randn(n, 3, size, size, device=dev, generator=gen)
        y = torch.randint(0, classes, (n,), device=dev, generator=gen)
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.manual_seed(0)
        model = torchvision.models.resnet50(num_classes=classes).to(dev)
        x = x_nchw
        if precision == "bf16":
            model = model.to(memory_format=torch.channels_last)
            x = x_nchw.contiguous(memory_format=torch.channels_last)
        model.train()
        decay = [p for n, p in model.named_parameters() if p.dim() > 1]
        no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
        opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=0.01, momentum=0.9)
        state.update(model=model, opt=opt, x=x, y=y, bf16=precision == "bf16")

    def step():
        model, opt, x, y = state["model"], state["opt"], state["x"], state["y"]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=state["bf16"]):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()

    print(f"ready torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "config":
            configure(cmd[1], int(cmd[2]) if len(cmd) > 2 else batch)
            print("ok", flush=True)
            continue
        if cmd[0] == "memory":
            torch.cuda.synchronize()
            print(f"{torch.cuda.max_memory_allocated()} {torch.cuda.max_memory_reserved()}", flush=True)
            continue
        if cmd[0] == "release":
            release()
            print("ok", flush=True)
            continue
        n = int(cmd[1])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        print(f"{time.perf_counter() - t0:.9f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
