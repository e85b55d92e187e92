#!/usr/bin/python3
"""PyTorch baseline of the step a wb-train run dumped (wb-train --dump-step N).

    torch_step.py RUN.sqlite --out REF.safetensors [--rank R] [--step N] [--device cpu|cuda] [--threads N]
                  [--fault NAME] [--no-noise]
    torch_step.py RUN.sqlite --profile N --out-trace TRACE.json   (PyTorch's profile: torch_profile.py)

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

What is comparable. With world size 1, everything. With world size W > 1 and every rank's dump of
the step in the run file (wb-train --dump-ranks all), the step is replayed as DistributedDataParallel
without SyncBatchNorm runs it: each rank's batch goes forward and backward separately from the same
parameters, with that rank's own BN statistics (batch statistics per rank; each rank's running stats
updated from its own batch), the gradients are averaged over the W ranks, and one SGD step follows.
The output holds the chosen --rank's input, label, params, buffers, activations, loss and
buffer_after, and the averaged grad, param_after and momentum, so everything is comparable. When only
some ranks dumped the step, one process holding one rank's batch cannot reproduce the average:
input, label, params, buffers, activations, loss and buffer_after are comparable; grad, param_after
and momentum are not (recorded in the metadata as "wb.not_comparable"). Likewise, a dump of a step
after the first lacks the momentum buffers from before the step, so with momentum > 0 param_after and
momentum are not comparable there.

The reference's own noise (metadata "wb.noise"). A float32 step is itself off the exact one by
rounding, and by how much differs per tensor: it grows with depth, and small batches make batch norm
amplify it (at 32x32 the last stage normalises over a few values per channel). So after the float32
replay, which is the reference, the same step is replayed again in float64: the same dumped inputs,
parameters and buffers, the same fault, the same path (DDP, --sync-bn, pipeline) and device, in a
model and optimizer of its own (the float32 output is bit for bit what --no-noise writes). Each float64
tensor is compared, as it is recorded, with the float32 one of its key and then dropped; the metadata
key "wb.noise" records per key ||r32 - r64|| ("l2"), max |r32 - r64| ("max_abs") and ||r64|| ("ref_l2"),
for param_after and momentum also the same of their update (after - before, momentum - grad), all
norms in float64 (the JSON is described in wbdump.py, which computes it: wbdump.NoiseMeter). `wb compare`
can then judge a difference against the reference's own noise on that tensor instead of one fixed
threshold. A third replay, in float64 again, lets every ReLU input within one standard deviation of
its float32 rounding noise of zero go the other way (FLIP_REACH), and adds "flip_l2" to each entry; the
loss's entry also gets "input_l2", ||d loss / d logits|| times the logits' noise (wbdump.py describes
the keys). The float64 replays take several times the float32 one on a CPU (float64 kernels are
slower; at 32x32, batch 8: about 18 s in all against 7 s with --no-noise; at 224x224, batch 2: 75 s
against 16 s), and need the float64 step's memory besides the float32 tensors held for the file;
--no-noise skips them, and the reference then has no "wb.noise". If a float64 replay fails (say, out of
memory), a NOTE says so and the reference is written without what it would have measured.

--fault NAME is a testing aid: it plants one known mistake (see FAULTS) into this side, so a test can
check that `wb compare` names the tensor where it first shows.

Bad input (not a run file, no dump, missing or mismatched tensors) prints one line on stderr naming
the file and what was expected, and exits 2. Progress goes to stderr.
"""

import argparse
import json
import math
import os
import pathlib
import sys
import time
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import syncbn_replay  # noqa: E402
import torch_pipeline  # noqa: E402
import wbformat  # noqa: E402
import imagefolder_input  # noqa: E402

PROG = "torch_step.py"
LOSS_CONVENTIONS = ("mindspore", "torch")

# Planted faults (--fault, for testing the comparison): each is one mistake a port could make, placed
# at one known tensor, so a test can check that `wb compare` names that tensor as the first divergence.
FAULTS = {
    "bn_eps": "layer2.1.bn2 normalises with eps 1e-3 (Keras' default) instead of 1e-5",
    "conv_transpose": "layer3.0.conv2 convolves with its weight's kh and kw swapped",
    "missing_relu": "layer1.1 skips the relu after bn1 (its relu.0 passes the input through)",
    "stride": "layer2.0.conv2 has stride 1 instead of 2 (and the block's downsample, so the sum still fits)",
    "bn_momentum": "layer3.1.bn1 updates its running statistics with momentum 0.01 instead of 0.1",
    "no_smoothing": "the loss ignores label smoothing",
    "grad_scale": "the gradient of layer4.2.conv3.weight is doubled before the update",
    "lr": "the update uses twice the learning rate",
    "wd_on_bn": "weight decay applies to the BatchNorm weights and biases too",
    "nesterov": "nesterov momentum is flipped (on when the run has it off, and the reverse)",
}


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

def read_dump(run, step, rank):
    """The batch and the state before the step dumped by `rank`: key -> RunTensor, input/label checked."""
    dumped = {t.key: t for t in run.tensors(step, rank, kinds=("input", "label", "param", "buffer"))}
    for key, dtypes in (("input", ("F32",)), ("label", ("I32", "I64"))):
        if key not in dumped:
            raise InputError(f"{run.path}: dump of step {step} on rank {rank} has no '{key}' tensor")
        if dumped[key].dtype not in dtypes:
            raise InputError(f"{run.path}: tensor '{key}' is {dumped[key].dtype}, expected {' or '.join(dtypes)}")
    x, y = dumped["input"].array, dumped["label"].array
    if x.ndim != 4 or x.shape[1] != 3 or y.shape != (x.shape[0],):
        raise InputError(f"{run.path}: input is {list(x.shape)} and label {list(y.shape)} on rank {rank}, "
                         "expected [N,3,H,W] and [N]")
    return dumped


def replica_ranks(run, step, rank, world_size):
    """The ranks to replay: all of them when every rank of the job dumped `step`, else `rank` alone."""
    if world_size == 1:
        return [rank]
    dumped = [r for r in run.dumped_ranks() if step in run.dumped_steps(r)]
    return list(range(world_size)) if dumped == list(range(world_size)) else [rank]


def check_replicas(path, dumps, rank):
    """Data-parallel replicas start a step from the same parameters; a difference is a broken dump."""
    import numpy as np
    mine = dumps[rank]
    for r, other in dumps.items():
        for key, t in other.items():
            if key.startswith("param.") and not np.array_equal(t.array, mine[key].array):
                raise InputError(f"{path}: tensor '{key}' of rank {r} differs from rank {rank}'s (expected "
                                 "every rank to start the step from the same parameters)")


def load_state(model, state, kinds=("param", "buffer")):
    """Copy the dumped tensors of `kinds` into the model (on whatever device it is)."""
    import numpy as np
    import torch
    with torch.no_grad():
        if "param" in kinds:
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(np.array(state[f"param.{name}"].array)).reshape(p.shape))
        if "buffer" in kinds:
            for name, b in model.named_buffers():
                b.copy_(torch.from_numpy(np.array(state[f"buffer.{name}"].array)).reshape(b.shape))


def check_fault(fault, settings):
    """--fault NAME must be one this run can carry (nesterov needs momentum)."""
    if fault == "nesterov" and settings["momentum"] == 0:
        raise InputError("--fault nesterov: the run has momentum 0, and nesterov needs momentum > 0")


def plant_fault(model, fault, settings):
    """Apply --fault NAME's change to the model or the settings (see FAULTS). Faults in the update
    (grad_scale, lr, wd_on_bn) are applied where the optimizer is built and run. Each replay plants it
    into its own model and its own copy of the settings."""
    import torch
    check_fault(fault, settings)
    if fault == "bn_eps":
        model.get_submodule("layer2.1.bn2").eps = 1e-3
    elif fault == "conv_transpose":
        conv = model.get_submodule("layer3.0.conv2")
        # An instance attribute shadows Conv2d.forward; hooks still see the module's call.
        conv.forward = lambda x: conv._conv_forward(x, conv.weight.transpose(2, 3), conv.bias)
    elif fault == "missing_relu":
        class ReluAfterFirstCall(torch.nn.Module):
            """Bottleneck calls its one relu three times per forward; the first call (relu.0) does nothing."""

            def __init__(self):
                super().__init__()
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                return x if self.calls % 3 == 1 else torch.relu(x)

        model.get_submodule("layer1.1").relu = ReluAfterFirstCall()
    elif fault == "stride":
        model.get_submodule("layer2.0.conv2").stride = (1, 1)
        model.get_submodule("layer2.0.downsample.0").stride = (1, 1)
    elif fault == "bn_momentum":
        model.get_submodule("layer3.1.bn1").momentum = 0.01
    elif fault == "no_smoothing":
        settings["label_smoothing"] = 0.0
    elif fault == "nesterov":
        settings["nesterov"] = not settings["nesterov"]


def make_optimizer(model, decay, settings, fault):
    import torch
    decays = dict(decay)
    if fault == "wd_on_bn":
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                decays[f"{name}.weight"] = decays[f"{name}.bias"] = True
    params = list(model.named_parameters())
    groups = [{"params": [p for n, p in params if decays[n]], "weight_decay": settings["weight_decay"]},
              {"params": [p for n, p in params if not decays[n]], "weight_decay": 0.0}]
    lr = settings["lr"] * (2.0 if fault == "lr" else 1.0)
    optimizer = torch.optim.SGD(groups, lr=lr, momentum=settings["momentum"], nesterov=settings["nesterov"])
    return optimizer, len(groups[0]["params"]), len(params)


def gather(args):
    """Everything the replays of the step share, read and validated once (bad input raises InputError
    before the first progress line): the run's settings (before any fault), the dumps of the replayed
    ranks, the decay flags, image-folder inputs, --sync-bn groups, the pipeline, the caveats and the
    reference's metadata. Returns a namespace; its `model` (the resnet50 the dumps were checked against)
    is taken by the first replay."""
    run = wbformat.RunFile(args.run)
    rank = args.rank
    step = choose_step(run, rank, args.step)
    settings = read_settings(run, step, rank)
    pipe = torch_pipeline.settings(run.config(), run.path, InputError)
    # A pipeline's gradients are averaged over each stage's replicas only: world / stages of them.
    world = settings["world_size"] // (pipe["stages"] if pipe else 1)
    ranks = replica_ranks(run, step, rank, world)
    dumps = {r: read_dump(run, step, r) for r in ranks}
    x, y = dumps[rank]["input"].array, dumps[rank]["label"].array

    import torch
    import torchvision

    # Everything is validated before the first progress line, so bad input answers with one line.
    model = torchvision.models.resnet50(num_classes=settings["num_classes"])
    for dumped in dumps.values():
        check_state(run.path, model, {k: v for k, v in dumped.items() if k.startswith(("param.", "buffer."))})
        labels = dumped["label"].array
        if labels.size and (labels.min() < 0 or labels.max() >= settings["num_classes"]):
            raise InputError(f"{run.path}: labels range over [{labels.min()}, {labels.max()}], expected "
                             f"[0, {settings['num_classes'] - 1}]")
    check_replicas(run.path, dumps, rank)
    sync_bn, sync_groups = run.config().get("sync_bn", "off"), None
    if sync_bn != "off" and world > 1:
        if len(ranks) < world:
            raise InputError(f"{run.path}: the run trained with --sync-bn {sync_bn}, whose batch statistics span "
                             "several ranks: replaying it needs every rank's dump (wb-train --dump-ranks all)")
        sync_groups = syncbn_replay.groups_of(run, sync_bn, ranks)
    if pipe:
        torch_pipeline.check_batch(pipe, len(y), run.path, InputError)
    decay = decay_flags(run, model)
    # An image-folder run: torchvision preprocesses the same files, so the input row checks our preprocessing.
    tv_inputs = imagefolder_input.torchvision_batches(run.meta, run.path, ranks, step,
                                                      {r: d["label"].array for r, d in dumps.items()})
    run.close()
    check_fault(args.fault, settings)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: this PyTorch has no usable CUDA device (use --device cpu)")
    ddp = len(ranks) > 1
    progress(f"{run.path}: rank {rank}, step {step}, world size {world}, batch {list(x.shape)}"
             + (f"; replaying all {world} ranks as DistributedDataParallel does" if ddp else ""))

    not_comparable, caveats = [], []
    if world > 1 and not ddp:
        not_comparable += ["grad", "param_after", "momentum"]
        caveats.append(f"world size {world}: the run's gradients are averaged over all ranks, but not every rank "
                       f"dumped step {step}, so this single batch cannot reproduce them; only input, label, params, "
                       "buffers, activations, loss and buffer_after are comparable (dump every rank with "
                       "wb-train --dump-ranks all)")
    if settings["steps_before"] > 0 and settings["momentum"] != 0:
        not_comparable += [k for k in ("param_after", "momentum") if k not in not_comparable]
        caveats.append(f"step {step} follows {settings['steps_before']} recorded steps whose momentum buffers "
                       "are not in the dump; this step starts from zero momentum, so param_after and momentum "
                       "are not comparable")
    if pipe:
        progress(torch_pipeline.describe(pipe))
    for text in caveats:
        progress("NOTE: " + text)
    if args.fault:
        progress(f"FAULT planted: {args.fault}: {FAULTS[args.fault]}")

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

    metadata = {"run": str(args.run), "step": str(step), "rank": str(rank),
                "wb.world_size": str(world), "wb.replayed_ranks": json.dumps(ranks),
                "wb.loss_convention": settings["loss_convention"],
                "wb.lr": repr(settings["lr"]), "wb.not_comparable": json.dumps(not_comparable),
                "wb.caveats": json.dumps(caveats)}
    if args.fault:
        metadata["wb.fault"] = args.fault
    return types.SimpleNamespace(
        path=run.path, out=args.out, rank=rank, step=step, world=world, ranks=ranks, ddp=ddp, dumps=dumps,
        settings=settings, decay=decay, tv_inputs=tv_inputs, sync_bn=sync_bn, sync_groups=sync_groups, pipe=pipe,
        fault=args.fault, device=device, metadata=metadata, model=model)


class ReluProbe:
    """Stands in for every torch.nn.ReLU of a replay's model (a planted fault's own module is left alone):
    records each call's input in call order (`record`), or, given `flips` (call index -> boolean tensor),
    lets those elements go the other way: out = x where (x > 0) XOR flip, else 0, which the backward
    follows too.

    It also hooks every torch.nn.BatchNorm2d: a batch norm over a few values per channel (N x H x W at
    most BN_FLIP_COUNT) records its input in the same way, and given `bn_flips` (call index -> boolean
    per channel) turns those channels' normalised values the other way: out = 2 beta - out. Over two
    values a channel's output is +-1 by the sign of their difference; when that difference is within the
    inputs' rounding noise, a correct port can see the other sign, a flip of a whole term as a ReLU's."""

    def __init__(self, flips=None, bn_flips=None):
        self.flips = flips
        self.bn_flips = bn_flips
        self.inputs = []
        self.bn_inputs = []  # per batch norm call: its input, or None when it normalises over more values
        self.calls = 0
        self.bn_calls = 0

    def install(self, model):
        import torch
        probe = self

        class ProbedReLU(torch.nn.Module):
            def forward(self, x):
                return probe.call(x)

        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if type(child) is torch.nn.ReLU:
                    setattr(module, child_name, ProbedReLU())
        for module in model.modules():
            if type(module) is torch.nn.BatchNorm2d:  # a hook keeps the state dict's names
                module.register_forward_hook(lambda m, inputs, out: probe.bn_call(m, inputs[0], out))

    def call(self, x):
        import torch
        i = self.calls
        self.calls += 1
        if self.flips is None:
            self.inputs.append(x.detach().to("cpu", copy=True))
            return torch.relu(x)
        flip = self.flips.get(i)
        if flip is None:
            return torch.relu(x)
        keep = (x > 0) ^ flip.to(x.device)
        return x * keep.to(x.dtype)

    def bn_call(self, module, x, out):
        import torch
        i = self.bn_calls
        self.bn_calls += 1
        if self.flips is None:
            small = x.dim() == 4 and x.numel() // max(x.shape[1], 1) <= BN_FLIP_COUNT
            self.bn_inputs.append(x.detach().to("cpu", copy=True) if small else None)
            return None
        flip = (self.bn_flips or {}).get(i)
        if flip is None:
            return None
        beta = module.bias if module.bias is not None else torch.zeros_like(out[0, :, 0, 0])
        mask = flip.to(out.device).view(1, -1, 1, 1)
        return torch.where(mask, 2.0 * beta.view(1, -1, 1, 1) - out, out)


def near_flips(inputs32, inputs64, flagged):
    """Call index -> flagged(x64, d) (a boolean tensor; d = x32 - x64, both float64) for each recorded
    call, where it flags anything; and the count of flagged entries and of all."""
    import torch
    flips, near, total = {}, 0, 0
    for i, (x32, x64) in enumerate(zip(inputs32, inputs64)):
        if x32 is None or x64 is None or x32.shape != x64.shape:
            continue
        x64 = x64.to(torch.float64)
        flip = flagged(x64, x32.to(torch.float64) - x64)
        total += flip.numel()
        count = int(flip.sum())
        if count:
            flips[i] = flip
            near += count
    return flips, near, total


def relu_flips(inputs32, inputs64, reach):
    """Call index -> the elements of that ReLU call's input within `reach` standard deviations of the
    float32 rounding noise (per channel: rms of x32 - x64 over batch and space) of zero, which a correct
    port may see on the other side of zero; and the count of such elements and of all."""
    def flagged(x64, d):
        dims = [k for k in range(d.dim()) if k != 1] if d.dim() > 1 else [0]
        sigma = d.pow(2).mean(dim=dims, keepdim=True).sqrt() if d.dim() > 1 else d.pow(2).mean().sqrt()
        return x64.abs() < reach * sigma
    return near_flips(inputs32, inputs64, flagged)


def bn_flips(inputs32, inputs64, reach):
    """Call index -> the channels of that batch norm call (one over a few values per channel) whose
    float64 spread (standard deviation over batch and space) is within `reach` of the float32 rounding
    noise of its input (rms of x32 - x64 over the channel): the channels whose normalised values a correct
    port may see the other way; and the count of such channels and of all."""
    def flagged(x64, d):
        return x64.var(dim=(0, 2, 3), unbiased=False).sqrt() < reach * d.pow(2).mean(dim=(0, 2, 3)).sqrt()
    return near_flips(inputs32, inputs64, flagged)


class LogitGradient:
    """||d loss / d logits|| of the chosen rank's step: the squares of the gradient reaching the model's
    fc output, summed over its calls (a pipeline's micro-batches) after reset()."""

    def __init__(self):
        self.squares = 0.0
        self.calls = 0

    def install(self, model):
        def hook(_module, _grad_input, grad_output):
            self.squares += float(grad_output[0].detach().double().pow(2).sum())
            self.calls += 1
        model.fc.register_full_backward_hook(hook)

    def reset(self):
        self.squares, self.calls = 0.0, 0

    def norm(self):
        return self.squares ** 0.5 if self.calls else None


def replay(ctx, dtype, sink=None, say=progress, probe=None, logit_gradient=None):
    """One replay of the step in `dtype` (torch.float32 for the reference, torch.float64 for its noise
    scale): a resnet50 of its own holding the dumped state (cast to dtype), the fault planted, the batch
    cast to dtype, and the step run through the run's path (single rank, DDP, --sync-bn, pipeline).
    Returns (the chosen rank's loss, the dumper), the dumper ended but not written: its tensors() hold
    the step, or with `sink` each went to sink(key, host tensor) as it was recorded."""
    import numpy as np
    import torch
    import torchvision

    import wbdump

    settings = dict(ctx.settings)
    rank, ranks, dumps, device = ctx.rank, ctx.ranks, ctx.dumps, ctx.device
    model = ctx.__dict__.pop("model", None)
    if model is None:
        model = torchvision.models.resnet50(num_classes=settings["num_classes"])
    plant_fault(model, ctx.fault, settings)
    if probe is not None:
        probe.install(model)
    if logit_gradient is not None:
        logit_gradient.install(model)
    torch.manual_seed(settings["seed"])

    load_state(model, dumps[rank])
    model.to(device=device, dtype=dtype).train()
    optimizer, decayed, total = make_optimizer(model, ctx.decay, settings, ctx.fault)
    criterion = make_criterion(settings["loss_convention"], settings["label_smoothing"])
    if dtype == torch.float32:
        say(f"loss {settings['loss_convention']} (smoothing {settings['label_smoothing']}), lr {settings['lr']} "
            f"({settings['lr_from']}), momentum {settings['momentum']}, weight decay {settings['weight_decay']} on "
            f"{decayed} of {total} params, nesterov {str(settings['nesterov']).lower()}, "
            f"device {device}, {torch.get_num_threads()} threads")

    def batch_of(r):
        return (torch.from_numpy(np.array(ctx.tv_inputs.get(r, dumps[r]["input"].array))).to(device=device,
                                                                                            dtype=dtype),
                torch.from_numpy(np.array(dumps[r]["label"].array)).to(device))

    # The other replicas first, each from its own BN state; the chosen rank last, so that its
    # buffer_after is what the model holds when the dumper reads it.
    params = [p for _, p in model.named_parameters()]
    grads = {}
    for r in [] if ctx.sync_groups else ranks:  # --sync-bn replays its groups below
        if r == rank:
            continue
        load_state(model, dumps[r], kinds=("buffer",))
        optimizer.zero_grad(set_to_none=True)
        inputs, labels = batch_of(r)
        loss_r = criterion(model(inputs), labels)
        loss_r.backward()
        grads[r] = [p.grad.detach().clone() for p in params]
        say(f"rank {r}: loss {loss_r.item():.9g}")
    load_state(model, dumps[rank], kinds=("buffer",))
    optimizer.zero_grad(set_to_none=True)
    if logit_gradient is not None:
        logit_gradient.reset()  # the other replicas' backward passes are not this rank's loss

    metadata = dict(ctx.metadata)
    if ctx.sync_groups:
        say(f"--sync-bn {ctx.sync_bn}: replaying the rank groups {ctx.sync_groups}, each as one batch")
        fault = (lambda: model.get_parameter("layer4.2.conv3.weight").grad.mul_(2.0)) \
            if ctx.fault == "grad_scale" else None
        loss, dumper = syncbn_replay.replay(
            model=model, optimizer=optimizer, criterion=criterion, groups=ctx.sync_groups, rank=rank,
            world=ctx.world, batch_of=batch_of, load_buffers=lambda r: load_state(model, dumps[r], kinds=("buffer",)),
            progress=say, fault_hook=fault, dumper_options={"out": ctx.out, "metadata": metadata, "sink": sink})
        dumper.end(write=False)
        return loss, dumper
    pipe = ctx.pipe
    if pipe:
        metadata["wb.pipeline"] = json.dumps(pipe)
    # A pipeline run's activations are its micro-batches' joined along the batch, as wb-train dumps them.
    dumper = wbdump.StepDumper(model, optimizer, out=ctx.out, metadata=metadata, source=PROG,
                               micro_batches=pipe["micro_batches"] if pipe else 1, sink=sink)
    inputs, labels = batch_of(rank)
    dumper.begin(inputs, labels)
    if pipe:
        loss = dumper.loss(torch_pipeline.step(model, criterion, inputs, labels, pipe))
    else:
        loss = dumper.loss(criterion(model(inputs), labels))
        loss.backward()
    if ctx.ddp:
        # The allreduce: a sum over the ranks in rank order, divided by the world size.
        grads[rank] = [p.grad.detach().clone() for p in params]
        with torch.no_grad():
            for i, p in enumerate(params):
                total_grad = grads[ranks[0]][i].clone()
                for r in ranks[1:]:
                    total_grad += grads[r][i]
                p.grad.copy_(total_grad / ctx.world)
    if ctx.fault == "grad_scale":
        model.get_parameter("layer4.2.conv3.weight").grad.mul_(2.0)
    optimizer.step()
    dumper.end(write=False)
    return loss, dumper


# ReLU inputs within this many standard deviations of their float32 rounding noise of zero may go the
# other way in a correct port (its noise and the reference's together span about sqrt(2) of one); so may
# a batch norm channel whose values spread no more than that.
FLIP_REACH = 1.0
# Batch norms over at most this many values per channel (N x H x W) are watched for flips: over more, a
# channel's spread is never as small as its rounding noise.
BN_FLIP_COUNT = 64


def add_flip_noise(ctx, ref32, noise, probe32, probe64):
    """Adds "flip_l2" to the noise entries: ||r32 - r64'|| where r64' is a float64 replay in which every
    ReLU input within FLIP_REACH standard deviations of its rounding noise of zero goes the other way, and
    every batch norm channel over a few values whose spread is within FLIP_REACH of its input's noise is
    turned the other way. Rounding moves a gradient smoothly; a ReLU or a two-value batch norm that flips
    moves single elements by a whole term, which a correct port does now and then at a small batch, so
    the bound must know how far that can go."""
    import torch

    import wbdump

    flips, near, total = relu_flips(probe32.inputs, probe64.inputs, FLIP_REACH)
    channels, bn_near, bn_total = bn_flips(probe32.bn_inputs, probe64.bn_inputs, FLIP_REACH)
    for probe in (probe32, probe64):
        del probe.inputs[:], probe.bn_inputs[:]
    if not flips and not channels:
        progress(f"no ReLU input within {FLIP_REACH:g} sigma of its noise of 0 ({total} elements), no batch norm "
                 f"channel spread within it ({bn_total} channels over at most {BN_FLIP_COUNT} values)")
        return
    start = time.perf_counter()
    meter = wbdump.NoiseMeter(ref32)
    try:
        replay(ctx, torch.float64, sink=meter.add, say=lambda text: None, probe=ReluProbe(flips, channels))
    except (RuntimeError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        progress(f"NOTE: the float64 replay with near-zero ReLUs flipped failed ({first}); wb.noise has rounding only")
        return
    flipped = meter.metadata()
    for section in ("tensors", "updates"):
        for key, entry in noise[section].items():
            other = flipped[section].get(key)
            if other is not None:
                entry["flip_l2"] = other["l2"]
    noise["flip_reach"] = FLIP_REACH
    noise["flipped"] = near
    noise["flipped_bn_channels"] = bn_near
    progress(f"ReLU inputs within {FLIP_REACH:g} sigma of 0: {near} of {total}; batch norm channels spread within "
             f"it: {bn_near} of {bn_total}; float64 replay with them flipped {time.perf_counter() - start:.1f} s")


def add_logit_noise(noise, logit_gradient):
    """Adds "input_l2" to the loss's entry: ||d loss / d logits|| x the logits' noise (the larger of
    rounding and flips), the most the logits' noise can move the loss (Cauchy-Schwarz). One scalar's own
    noise is a single draw, which can happen to be tiny; what its input's noise allows is not."""
    g = logit_gradient.norm() if logit_gradient is not None else None
    loss, fc = noise["tensors"].get("loss"), noise["tensors"].get("act.fc")
    if g is None or loss is None or fc is None:
        return
    value = g * max(fc["l2"], fc.get("flip_l2", 0.0))
    if math.isfinite(value):
        loss["input_l2"] = value


def noise_scale(ctx, ref32, probe32=None):
    """The "wb.noise" object (wbdump.py): `ref32` (the float32 replay's tensors) against a float64 replay of
    the same step, each float64 tensor compared as it is recorded and then dropped. None when the float64
    replay fails (the reference is written without it)."""
    import torch

    import wbdump

    progress(f"float64 replay for the noise scale (the same step, inputs and state, device {ctx.device})")
    start = time.perf_counter()
    meter = wbdump.NoiseMeter(ref32)
    probe64 = ReluProbe() if probe32 is not None else None
    try:
        logit_gradient = None if ctx.sync_groups else LogitGradient()
        loss, _ = replay(ctx, torch.float64, sink=meter.add, say=lambda text: progress("float64 " + text), probe=probe64,
                         logit_gradient=logit_gradient)
    except (RuntimeError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        progress(f"NOTE: the float64 replay failed ({first}); the reference has no wb.noise")
        return None
    seconds = time.perf_counter() - start
    noise = meter.metadata()
    if probe64 is not None:
        add_flip_noise(ctx, ref32, noise, probe32, probe64)
    add_logit_noise(noise, logit_gradient)
    count, median, worst, worst_key = wbdump.noise_summary(noise)
    progress(f"float64 loss {loss.item():.17g}" + (f" (rank {ctx.rank})" if ctx.ddp else "")
             + f"; float64 replay {seconds:.1f} s")
    if median is None:
        progress(f"noise: {count} tensors, none with a nonzero float64 norm")
    else:
        progress(f"noise: {count} tensors, median rel-L2 {median:.3g}, worst {worst:.3g} at {worst_key}")
    return noise


def run_step(args):
    ctx = gather(args)
    import torch
    start = time.perf_counter()
    probe32 = None if args.no_noise else ReluProbe()
    loss, dumper = replay(ctx, torch.float32, probe=probe32)
    seconds = time.perf_counter() - start
    progress(f"loss {loss.item():.9g}" + (f" (rank {ctx.rank})" if ctx.ddp else "") + f"; float32 replay {seconds:.1f} s")
    if not args.no_noise:
        # The float32 model is not needed any more (its tensors are the dumper's host copies).
        dumper.model = dumper.optimizer = None
        del loss
        noise = noise_scale(ctx, dumper.tensors(), probe32)
        if noise is not None:
            dumper.metadata["wb.noise"] = json.dumps(noise, allow_nan=False)
    try:
        dumper.write()
    except OSError as e:
        raise InputError(f"{args.out}: cannot write the reference ({e.strerror})") from None
    progress(f"wrote {args.out} ({len(dumper.keys())} tensors)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description="PyTorch baseline of a wb-train run's dumped step.")
    parser.add_argument("run", help="run file written by wb-train --dump-step N")
    parser.add_argument("--out", help="the .safetensors file to write (required unless --profile)")
    parser.add_argument("--rank", type=int, default=0, help="rank whose dump to replay (default 0)")
    parser.add_argument("--step", type=int, help="dumped step to replay (default: the only one)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default: PyTorch's choice)")
    parser.add_argument("--fault", choices=sorted(FAULTS), metavar="NAME",
                        help="testing aid: plant one known mistake into the replay, to check that wb compare "
                             "finds it: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()))
    parser.add_argument("--no-noise", action="store_true",
                        help="skip the float64 replay of the step that measures the reference's own float32 noise "
                             "(then the reference has no wb.noise)")
    parser.add_argument("--profile", type=int, metavar="N",
                        help="instead (or as well, with --out): profile N steady steps of the run's configuration "
                             "under torch.profiler into --out-trace (see torch_profile.py)")
    parser.add_argument("--out-trace", help="the Chrome trace --profile writes, for wb import torch-trace")
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    if args.profile is not None and (args.profile < 1 or not args.out_trace):
        parser.error("--profile N needs N >= 1 and --out-trace TRACE.json")
    if args.profile is None and not args.out:
        parser.error("the following arguments are required: --out")
    try:
        if args.profile is not None:
            import torch_profile
            torch_profile.profile_run(args.run, args.out_trace, args.profile, threads=args.threads,
                                      device=args.device, progress=progress)
            progress(f"wrote {args.out_trace} ({args.profile} profiled steps)")
        if args.out:
            run_step(args)
    except (InputError, wbformat.FormatError, imagefolder_input.ImageInputError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
