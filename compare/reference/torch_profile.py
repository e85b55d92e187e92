"""PyTorch's own profile of the baseline of a wb-train run (torch_step.py RUN --profile N --out-trace T).

Runs N steady training steps of torchvision's ResNet-50 with the run's configuration (batch size,
image size, classes, loss convention, SGD hyperparameters, threads or device) under torch.profiler
with record_shapes and with_modules, after `warmup` untimed steps, and writes the Chrome trace that
`wb import torch-trace` reads. Every module's forward runs inside record_function(<module name>)
(forward pre- and post-hooks), so the trace names the layers ("layer2.0.conv2") even where PyTorch is
built without Kineto and its exporter writes neither categories nor module names (Debian's 1.13).

Memory: the profiler runs with profile_memory=True. Kineto's trace holds its own "[memory]" events;
a legacy trace gets one "[memory]" instant per op whose self_cpu_memory_usage is not 0 (at the op's
start, "Total Allocated" counted from what the step holds before its first op: parameters, momentum
buffers, the gradients its zero_grad frees and the batch). On CUDA, torch.cuda.max_memory_allocated over the profiled steps is added as
a "wb_memory" metadata event. `wb import torch-trace` stores both, and `wb diff` compares the peaks.

Also usable without a run file, for tests and for a trace of any batch:

    torch_profile.py --out-trace T.json [--steps N] [--warmup W] [--batch-size B] [--image-size S]
                     [--num-classes C] [--threads T] [--no-module-names]
"""

import argparse
import pathlib
import sys

PROG = "torch_profile.py"


def name_modules(model):
    """Wraps each module's forward in record_function(<its name>); returns the hook handles.

    Containers (the model itself, nn.Sequential stages) are left out: wb-train records blocks
    ("layer2.0") and layers, not stages. A module called several times (the blocks' relu) gets one
    range per call.
    """
    import torch
    from torch.profiler import record_function

    handles, open_ranges = [], []

    def pre(name):
        def hook(module, inputs):
            r = record_function(name)
            r.__enter__()
            open_ranges.append(r)
        return hook

    def post(module, inputs, output):
        open_ranges.pop().__exit__(None, None, None)

    for name, module in model.named_modules():
        if not name or isinstance(module, torch.nn.Sequential):
            continue
        handles.append(module.register_forward_pre_hook(pre(name)))
        handles.append(module.register_forward_hook(post))
    return handles


def profile_steps(model, optimizer, criterion, batch, steps, out_trace, warmup=1, device="cpu",
                  module_names=True, progress=None):
    """Trains `warmup` + `steps` steps on `batch` (inputs, labels); the last `steps` are profiled.

    Returns the profiler's step count. The trace is written with export_chrome_trace: Kineto's format
    where PyTorch has Kineto, else the legacy exporter's.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    handles = name_modules(model) if module_names else []
    activities = [ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    inputs, labels = batch
    written = []

    def ready(prof):
        prof.export_chrome_trace(str(out_trace))
        add_memory(out_trace, prof, held_bytes(model, optimizer, batch), device)
        written.append(out_trace)

    try:
        with profile(activities=activities, record_shapes=True, with_modules=True, profile_memory=True,
                     schedule=schedule(wait=0, warmup=warmup, active=steps), on_trace_ready=ready) as prof:
            for i in range(warmup + steps):
                if i == warmup and str(device).startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats(device)
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(inputs), labels)
                loss.backward()
                optimizer.step()
                if str(device).startswith("cuda"):
                    torch.cuda.synchronize()
                prof.step()
                if progress:
                    progress(f"step {i + 1}/{warmup + steps}{' (warm-up)' if i < warmup else ''}: loss {loss.item():.6g}")
    finally:
        for h in handles:
            h.remove()
    if not written:
        raise RuntimeError("torch.profiler wrote no trace (its schedule never reached the active steps)")
    return steps


def held_bytes(model, optimizer, batch):
    """What a step holds before its first op: parameters and their gradients from the step before (its
    zero_grad frees them), buffers, the optimizer's state tensors, the batch."""
    import torch

    params = list(model.parameters())
    tensors = params + [p.grad for p in params if p.grad is not None] + list(model.buffers()) + list(batch)
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def add_memory(out_trace, prof, held, device):
    """Adds what `wb import torch-trace` reads of memory to the trace just written (see the top)."""
    import json
    import torch

    path = pathlib.Path(out_trace)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    if not any(e.get("name") == "[memory]" for e in events if isinstance(e, dict)):
        # The legacy profiler keeps memory per op only: its net allocation at the op's start.
        total = held
        for e in sorted(prof.events(), key=lambda e: e.time_range.start):
            if e.device_type != torch.autograd.DeviceType.CPU or not e.self_cpu_memory_usage:
                continue
            total += e.self_cpu_memory_usage
            events.append({"name": "[memory]", "ph": "i", "s": "t", "ts": e.time_range.start,
                           "pid": "CPU functions", "tid": e.thread,
                           "args": {"Bytes": e.self_cpu_memory_usage, "Total Allocated": total, "Device Type": 0}})
    if str(device).startswith("cuda"):
        events.append({"name": "wb_memory", "ph": "M", "pid": 0, "tid": 0,
                       "args": {"max_memory_allocated": torch.cuda.max_memory_allocated(device)}})
    path.write_text(json.dumps(trace))


def profile_run(run_path, out_trace, steps, warmup=1, threads=0, device="cpu", progress=None):
    """The baseline of a run file's configuration, profiled (torch_step.py --profile)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import torch_step
    import wbformat

    run = wbformat.RunFile(run_path)
    config = run.config()
    run.close()

    def number(key, kind=float, default=None):
        value = config.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise torch_step.InputError(f"{run_path}: config_json '{key}' is {value!r}, expected a number")
        return kind(value)

    batch = number("batch_size", int)
    size = number("image_size", int)
    classes = number("num_classes", int)
    if batch < 1 or size < 8 or classes < 2:
        raise torch_step.InputError(f"{run_path}: config_json batch_size {batch}, image_size {size}, num_classes "
                                    f"{classes}: expected batch_size >= 1, image_size >= 8, num_classes >= 2")
    smoothing = number("label_smoothing", float, 0.0)
    convention = config.get("loss_convention", "torch")
    if convention not in torch_step.LOSS_CONVENTIONS:
        raise torch_step.InputError(f"{run_path}: config_json loss_convention is {convention!r}")
    if not threads:
        threads = int(config.get("threads", 0) or 0)
    return profile_config(out_trace, steps, warmup, batch, size, classes, threads, device,
                          lr=number("lr", float, 0.1), momentum=number("momentum", float, 0.9),
                          weight_decay=number("weight_decay", float, 0.0), seed=number("seed", int, 0),
                          criterion=torch_step.make_criterion(convention, smoothing), progress=progress)


def profile_config(out_trace, steps, warmup, batch, size, classes, threads=0, device="cpu", lr=0.1, momentum=0.9,
                   weight_decay=0.0, seed=0, criterion=None, module_names=True, progress=None):
    import torch
    import torchvision

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: this PyTorch has no usable CUDA device")
    model = torchvision.models.resnet50(num_classes=classes).to(dev).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    criterion = criterion or torch.nn.CrossEntropyLoss()
    inputs = torch.randn(batch, 3, size, size, device=dev)
    labels = torch.randint(0, classes, (batch,), device=dev)
    if progress:
        progress(f"profiling {steps} steps after {warmup} warm-up: batch {batch}, {size}x{size}, {classes} classes, "
                 f"device {dev}, {torch.get_num_threads()} threads")
    return profile_steps(model, optimizer, criterion, (inputs, labels), steps, out_trace, warmup, dev,
                         module_names=module_names, progress=progress)


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description="Profile ResNet-50 training steps under torch.profiler.")
    p.add_argument("--out-trace", required=True, help="the Chrome trace (.json) to write")
    p.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them (default 1)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-module-names", action="store_true", help="no record_function around the modules")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1 or args.image_size < 8:
        p.error("--steps >= 1, --warmup >= 0, --batch-size >= 1 and --image-size >= 8 expected")
    profile_config(args.out_trace, args.steps, args.warmup, args.batch_size, args.image_size, args.num_classes,
                   args.threads, args.device, module_names=not args.no_module_names,
                   progress=lambda t: print(f"{PROG}: {t}", file=sys.stderr))
    print(f"{PROG}: wrote {args.out_trace}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
