#!/usr/bin/python3
"""PyTorch baseline of the step a wb-train run dumped (wb-train --dump-step N).

    torch_step.py RUN.sqlite --out REF.safetensors [--rank R] [--step N] [--device cpu|cuda] [--threads N]

Reads the run file's configuration, the dumped batch (input, label) and the parameters and buffers
before the step; builds torchvision's resnet50(num_classes=...) with exactly those tensors; runs the
same step in train mode (forward, the run's loss convention, backward, SGD with the run's two
parameter groups) and writes every tensor under the keys of the run's dump (see wbdump.py) to a
.safetensors file for `wb compare RUN REF.safetensors`.

Loss conventions (config loss_convention, label smoothing s, C classes):
  mindspore  the seed guide's CrossEntropySmooth: one-hot target with 1 - s on the label and s/(C-1)
             elsewhere, softmax cross-entropy, mean over the batch;
  torch      nn.CrossEntropyLoss(label_smoothing=s): target (1 - s) * onehot + s/C, mean.
Optimizer: torch.optim.SGD with {decay params, weight_decay} and {the others, weight_decay 0}, where
"decay" is the run's param.decay column; lr is the step table's lr for the step (else config lr).

What is comparable. With world size 1, everything. With world size > 1 the run's gradients are
the average over all ranks, which one process holding one rank's batch cannot reproduce: input,
label, params, buffers, activations, loss and buffer_after are comparable; grad, param_after and
momentum are not (recorded in the metadata as "wb.not_comparable"). Likewise, a dump of a step after
the first lacks the momentum buffers from before the step, so with momentum > 0 param_after and
momentum are not comparable there.

Bad input (not a run file, no dump, missing or mismatched tensors) prints one line on stderr naming
the file and what was expected, and exits 2. Progress goes to stderr.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import wbformat  # noqa: E402

PROG = "torch_step.py"
LOSS_CONVENTIONS = ("mindspore", "torch")


class InputError(Exception):
    """Bad input; str() is the one line printed before exiting 2."""


def progress(text):
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ loss

def mindspore_smooth_ce(logits, labels, smoothing):
    """CrossEntropySmooth of the seed guide: on = 1 - s, off = s / (C - 1), mean over the batch."""
    import torch
    classes = logits.shape[1]
    off = smoothing / (classes - 1) if classes > 1 else 0.0
    target = torch.full_like(logits, off)
    target.scatter_(1, labels.long().view(-1, 1), 1.0 - smoothing)
    return -(target * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


def make_criterion(convention, smoothing):
    import torch
    if convention == "mindspore":
        return lambda logits, labels: mindspore_smooth_ce(logits, labels, smoothing)
    ce = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)
    return lambda logits, labels: ce(logits, labels.long())


# ------------------------------------------------------------------------------------------------ reading

def _number(config, key, path, default=None, kind=float):
    value = config.get(key, default)
    if value is None:
        raise InputError(f"{path}: config_json has no '{key}' (expected a number)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise InputError(f"{path}: config_json '{key}' is {value!r}, expected {'an integer' if kind is int else 'a number'}")
    return kind(value)


def read_settings(run, step, rank):
    """The hyperparameters of the dumped step, validated."""
    path = run.path
    config = run.config()
    s = {
        "num_classes": _number(config, "num_classes", path, kind=int),
        "momentum": _number(config, "momentum", path),
        "weight_decay": _number(config, "weight_decay", path),
        "label_smoothing": _number(config, "label_smoothing", path, default=0.0),
        "seed": _number(config, "seed", path, default=0, kind=int),
    }
    if s["num_classes"] < 2:
        raise InputError(f"{path}: config_json num_classes is {s['num_classes']}, expected at least 2")
    if not 0.0 <= s["label_smoothing"] < 1.0:
        raise InputError(f"{path}: config_json label_smoothing is {s['label_smoothing']}, expected 0 <= s < 1")
    nesterov = config.get("nesterov", False)
    if not isinstance(nesterov, bool):
        raise InputError(f"{path}: config_json nesterov is {nesterov!r}, expected true or false")
    s["nesterov"] = nesterov
    # With s = 0 both conventions are the plain cross-entropy, so the key only matters when smoothing.
    convention = config.get("loss_convention", "torch" if s["label_smoothing"] == 0 else None)
    if convention not in LOSS_CONVENTIONS:
        raise InputError(f"{path}: config_json loss_convention is {convention!r}, expected one of "
                         f"{', '.join(LOSS_CONVENTIONS)}")
    s["loss_convention"] = convention
    lr = run.step_lr(step, rank)
    s["lr"] = lr if lr is not None else _number(config, "lr", path)
    s["lr_from"] = "step table" if lr is not None else "config lr"
    s["world_size"] = run.world_size()
    s["steps_before"] = run.steps_before(step, rank)
    return s


def choose_step(run, rank, step):
    ranks = run.dumped_ranks()
    if not ranks:
        raise InputError(f"{run.path}: run file has no dumped step (expected tensors of source 'run'; "
                         "record them with wb-train --dump-step N)")
    if rank not in ranks:
        raise InputError(f"{run.path}: no dumped step on rank {rank} (dumped ranks: "
                         f"{', '.join(map(str, ranks))}; choose one with --rank)")
    steps = run.dumped_steps(rank)
    if step is not None:
        if step not in steps:
            raise InputError(f"{run.path}: step {step} is not dumped on rank {rank} (dumped steps: "
                             f"{', '.join(map(str, steps))})")
        return step
    if len(steps) == 1:
        return steps[0]
    raise InputError(f"{run.path}: rank {rank} has several dumped steps ({', '.join(map(str, steps))}); "
                     "choose one with --step")


def _describe(names, limit=4):
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_state(path, model, dumped):
    """Every model parameter and buffer must be dumped, with its shape and dtype, and nothing else."""
    import torch
    expected = {f"param.{n}": p for n, p in model.named_parameters()}
    expected.update({f"buffer.{n}": b for n, b in model.named_buffers()})
    missing = set(expected) - set(dumped)
    if missing:
        raise InputError(f"{path}: dump lacks {len(missing)} of the {len(expected)} tensors torchvision's resnet50 "
                         f"needs: {_describe(missing)}")
    unexpected = set(dumped) - set(expected)
    if unexpected:
        raise InputError(f"{path}: dump has tensors torchvision's resnet50 does not: {_describe(unexpected)}")
    for key, ref in expected.items():
        rt = dumped[key]
        want_dtype = "I64" if ref.dtype == torch.int64 else "F32"
        # A scalar (num_batches_tracked) may be dumped as [] or [1]; both hold its one value.
        scalar_alike = ref.dim() == 0 and rt.array.size == 1 and rt.array.ndim <= 1
        if (list(rt.array.shape) != list(ref.shape) and not scalar_alike) or rt.dtype != want_dtype:
            raise InputError(f"{path}: tensor '{key}' is {rt.dtype}{list(rt.array.shape)}, expected "
                             f"{want_dtype}{list(ref.shape)} (torchvision resnet50)")


def decay_flags(run, model):
    """name -> whether weight decay applies, from the run's param table (forward order must match)."""
    names = [n for n, _ in model.named_parameters()]
    rows = run.params()
    if not rows:
        raise InputError(f"{run.path}: param table is empty (expected the {len(names)} trainable parameters "
                         "with their decay flags)")
    table = [name for _, name, _, _ in rows]
    if table != names:
        first = next((i for i, (a, b) in enumerate(zip(table, names)) if a != b), min(len(table), len(names)))
        found = table[first] if first < len(table) else "(end of table)"
        want = names[first] if first < len(names) else "(end of model)"
        raise InputError(f"{run.path}: param table row {first} is '{found}', expected '{want}' "
                         f"(torchvision resnet50 parameters in forward order, {len(names)} rows)")
    return {name: decay for _, name, _, decay in rows}


# ------------------------------------------------------------------------------------------------ the step

def run_step(args):
    run = wbformat.RunFile(args.run)
    rank = args.rank
    step = choose_step(run, rank, args.step)
    settings = read_settings(run, step, rank)
    dumped = {t.key: t for t in run.tensors(step, rank, kinds=("input", "label", "param", "buffer"))}
    for key, dtypes in (("input", ("F32",)), ("label", ("I32", "I64"))):
        if key not in dumped:
            raise InputError(f"{run.path}: dump of step {step} on rank {rank} has no '{key}' tensor")
        if dumped[key].dtype not in dtypes:
            raise InputError(f"{run.path}: tensor '{key}' is {dumped[key].dtype}, expected {' or '.join(dtypes)}")
    x, y = dumped["input"].array, dumped["label"].array
    if x.ndim != 4 or x.shape[1] != 3 or y.shape != (x.shape[0],):
        raise InputError(f"{run.path}: input is {list(x.shape)} and label {list(y.shape)}, expected [N,3,H,W] and [N]")

    import numpy as np
    import torch
    import torchvision

    import wbdump

    # Everything is validated before the first progress line, so bad input answers with one line.
    model = torchvision.models.resnet50(num_classes=settings["num_classes"])
    state = {k: v for k, v in dumped.items() if k.startswith(("param.", "buffer."))}
    check_state(run.path, model, state)
    decay = decay_flags(run, model)
    run.close()
    if y.size and (y.min() < 0 or y.max() >= settings["num_classes"]):
        raise InputError(f"{run.path}: labels range over [{y.min()}, {y.max()}], expected [0, {settings['num_classes'] - 1}]")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: this PyTorch has no usable CUDA device (use --device cpu)")
    progress(f"{run.path}: rank {rank}, step {step}, world size {settings['world_size']}, batch {list(x.shape)}")

    not_comparable, caveats = [], []
    if settings["world_size"] > 1:
        not_comparable += ["grad", "param_after", "momentum"]
        caveats.append(f"world size {settings['world_size']}: the run's gradients are averaged over all ranks, "
                       "which this single process cannot reproduce; only input, label, params, buffers, "
                       "activations, loss and buffer_after are comparable")
    if settings["steps_before"] > 0 and settings["momentum"] != 0:
        not_comparable += [k for k in ("param_after", "momentum") if k not in not_comparable]
        caveats.append(f"step {step} follows {settings['steps_before']} recorded steps whose momentum buffers "
                       "are not in the dump; this step starts from zero momentum, so param_after and momentum "
                       "are not comparable")
    for text in caveats:
        progress("NOTE: " + text)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        # cuBLAS is deterministic only with a fixed workspace; it reads this before its first call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    # warn_only: a few CUDA backward kernels (adaptive average pooling) have no deterministic variant.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(settings["seed"])

    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            kind = "param" if isinstance(t, torch.nn.Parameter) else "buffer"
            t.copy_(torch.from_numpy(np.array(state[f"{kind}.{name}"].array)).reshape(t.shape))
    model.to(device).train()

    params = list(model.named_parameters())
    groups = [{"params": [p for n, p in params if decay[n]], "weight_decay": settings["weight_decay"]},
              {"params": [p for n, p in params if not decay[n]], "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=settings["lr"], momentum=settings["momentum"],
                                nesterov=settings["nesterov"])
    criterion = make_criterion(settings["loss_convention"], settings["label_smoothing"])
    progress(f"loss {settings['loss_convention']} (smoothing {settings['label_smoothing']}), lr {settings['lr']} "
             f"({settings['lr_from']}), momentum {settings['momentum']}, weight decay {settings['weight_decay']} on "
             f"{len(groups[0]['params'])} of {len(params)} params, nesterov {str(settings['nesterov']).lower()}, "
             f"device {device}, {torch.get_num_threads()} threads")

    metadata = {"run": str(args.run), "step": str(step), "rank": str(rank),
                "wb.world_size": str(settings["world_size"]), "wb.loss_convention": settings["loss_convention"],
                "wb.lr": repr(settings["lr"]), "wb.not_comparable": json.dumps(not_comparable),
                "wb.caveats": json.dumps(caveats)}
    dumper = wbdump.StepDumper(model, optimizer, out=args.out, metadata=metadata, source=PROG)
    inputs = torch.from_numpy(np.array(x)).to(device)
    labels = torch.from_numpy(np.array(y)).to(device)
    dumper.begin(inputs, labels)
    loss = dumper.loss(criterion(model(inputs), labels))
    loss.backward()
    optimizer.step()
    progress(f"loss {loss.item():.9g}")
    try:
        dumper.end()
    except OSError as e:
        raise InputError(f"{args.out}: cannot write the reference ({e.strerror})") from None
    progress(f"wrote {args.out} ({len(dumper.keys())} tensors)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description="PyTorch baseline of a wb-train run's dumped step.")
    parser.add_argument("run", help="run file written by wb-train --dump-step N")
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--rank", type=int, default=0, help="rank whose dump to replay (default 0)")
    parser.add_argument("--step", type=int, help="dumped step to replay (default: the only one)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default: PyTorch's choice)")
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    try:
        run_step(args)
    except (InputError, wbformat.FormatError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
