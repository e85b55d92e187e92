#!/usr/bin/python3
"""An independent PyTorch reference of a wb-train run's dumped step, as a user's own tooling writes one.

    independent_reference.py RUN.sqlite --out REF.safetensors [--fault NAME] [--threads N]
                             [--format safetensors|ts_save|torch_save|msprobe] [--suffix S]
                             [--msprobe-task tensor|statistics]

It shares nothing with compare/reference/ (no wbformat, no wbdump, no torch_step): it reads the run
file with sqlite3 and numpy, builds torchvision's resnet50, runs the step with plain torch (forward
hooks for the activations, its own smooth cross-entropy and its own momentum SGD written from the
trainer's documented recipe), and writes every tensor with its own minimal safetensors writer: keys in
alphabetical order, no wb.* metadata, PyTorch's own dtypes (int64 labels and num_batches_tracked, a
0-d loss). So `wb compare RUN REF` must find the execution order from the run file, match int32
labels against int64 ones, and so on, as it must for any reference it did not write.

--format writes the same tensors as another tool would: ts_save makes OUT a directory of .npy files
named as TroubleShooter's ts.save names them (one call per activation in execution order, one call
per dict of parameters, gradients, ...: "{id}_{name}.npy", "{id}_{name}.{key}.npy", "_{suffix}" with
--suffix); torch_save writes torch.save(model.state_dict()) after the step to OUT (a .pth); msprobe writes
OUT/step0/rank0/ as msprobe's L0 (module level) dump does: dump.json with one entry per module
forward call in the order they finish ("Module.<name>.<Class>.forward.<n>": input_args, output,
parameters, each tensor with Max/Min/Mean/Norm and its data_name), "...parameters_grad.0" entries
after backward, a backward entry for fc, and with --msprobe-task tensor the .npy files in
dump_tensor_data/ (MindSpore's file type; PyTorch's msprobe writes .pt).

--fault NAME plants one known mistake (see FAULTS); tests/test_compare_independent.cpp holds which
tensor `wb compare` must name for each.

Bad input prints one line naming the file and exits 2.
"""

import argparse
import json
import sqlite3
import struct
import sys

FAULTS = {
    "input_perturbed": "the input batch is renormalised with a slightly different std (x * 1.001)",
    "padding": "the stem conv1 pads by 2 instead of 3 (its output is 15x15 instead of 16x16)",
    "early_bn_unbiased": "layer1.0.bn2 normalises with the unbiased batch variance",
    "activation": "layer3.0's relu is a GELU",
    "bn_eps": "layer2.1.bn2 normalises with eps 1e-3 (Keras' default) instead of 1e-5",
    "mid_conv_transpose": "layer3.2.conv2 convolves with its weight's kh and kw swapped",
    "late_bn_eval": "layer4.2.bn1 normalises with its running statistics (left in eval mode)",
    "loss_convention": "label smoothing spreads s/C over every class (torch) instead of s/(C-1) over the others",
    "grad_scale": "the gradient of layer4.2.bn3.weight is scaled by 1.01",
    "bn_momentum": "layer3.1.bn1 updates its running statistics with momentum 0.01 instead of 0.1",
    "wd_on_bn": "weight decay applies to the BatchNorm weights and biases too",
    "momentum_convention": "the momentum buffer is an average, buf = m buf + (1 - m) g, not buf = m buf + g",
}


class InputError(Exception):
    pass


# --------------------------------------------------------------------------------------------- reading

def read_run(path):
    """config, step lr, and the dumped input, label, parameters and buffers of the first dumped step."""
    import numpy as np
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        meta = dict(db.execute("SELECT key, value FROM meta"))
    except sqlite3.Error as e:
        raise InputError(f"{path}: not a readable run file ({e})")
    if "config_json" not in meta:
        raise InputError(f"{path}: meta has no config_json (expected a wb-train run file)")
    config = json.loads(meta["config_json"])
    row = db.execute("SELECT MIN(step) FROM tensor WHERE source = 'run' AND rank = 0").fetchone()
    if row is None or row[0] is None:
        raise InputError(f"{path}: no dumped step (expected wb-train --dump-step N)")
    step = row[0]
    lr_row = db.execute("SELECT lr FROM step WHERE step = ? AND rank = 0", (step,)).fetchone()
    lr = lr_row[0] if lr_row and lr_row[0] is not None else config["lr"]
    dtypes = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8}
    state = {}
    for kind, name, dtype, shape, data in db.execute(
            "SELECT kind, name, dtype, shape, data FROM tensor WHERE source = 'run' AND rank = 0 AND step = ? "
            "AND kind IN ('input', 'label', 'param', 'buffer')", (step,)):
        array = np.frombuffer(data, dtype=dtypes[dtype]).reshape(json.loads(shape))
        state[kind if kind in ("input", "label") else f"{kind}.{name}"] = array
    db.close()
    return config, lr, state


# --------------------------------------------------------------------------------------------- writing

def write_safetensors(path, tensors):
    """A minimal safetensors writer: keys sorted alphabetically, no metadata."""
    import numpy as np
    names = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
    header, blobs, offset = {}, [], 0
    for key in sorted(tensors):
        a = np.ascontiguousarray(tensors[key])
        blob = a.tobytes()
        header[key] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# --------------------------------------------------------------------------------------------- the step

def write_ts_save(directory, out, act_order, suffix):
    """The tensors as TroubleShooter's ts.save(file, data, suffix) writes them: a global call counter
    from 0 prefixes every file; a dict adds ".{key}" after the name; a suffix adds "_{suffix}"."""
    import os
    import numpy as np
    os.makedirs(directory, exist_ok=True)
    calls = [0]

    def save(name, data):
        tail = f"_{suffix}" if suffix else ""
        if isinstance(data, dict):
            for key, value in data.items():
                np.save(os.path.join(directory, f"{calls[0]}_{name}.{key}{tail}.npy"), value)
        else:
            np.save(os.path.join(directory, f"{calls[0]}_{name}{tail}.npy"), data)
        calls[0] += 1

    def group(kind):
        return {k[len(kind) + 1:]: v for k, v in out.items() if k.startswith(kind + ".")}

    save("input", out["input"])
    save("label", out["label"])
    save("param", group("param"))
    save("buffer", group("buffer"))
    for key in act_order:  # one ts.save per forward hook call
        save(key, out[key])
    save("loss", out["loss"])
    save("grad", group("grad"))
    save("param_after", group("param_after"))
    save("buffer_after", group("buffer_after"))
    save("momentum", group("momentum"))


class MsprobeRecorder:
    """msprobe's L0 dump.json, recorded with module hooks as msprobe records it."""

    def __init__(self, task):
        self.task = task
        self.data = {}
        self.files = {}
        self.calls = {}

    def entry(self, t, data_name):
        import torch
        t = t.detach()
        f = t.float()
        e = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
             "Max": float(f.max()), "Min": float(f.min()), "Mean": float(f.mean()), "Norm": float(torch.norm(f)),
             "requires_grad": bool(t.requires_grad)}
        if self.task == "tensor":
            e["data_name"] = data_name
            self.files[data_name] = t.numpy().copy()
        return e

    def forward_hook(self, name):
        def hook(module, inputs, output):
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            key = f"Module.{name}.{type(module).__name__}.forward.{n}"
            self.data[key] = {
                "input_args": [self.entry(x, f"{key}.input.{i}.npy") for i, x in enumerate(inputs)],
                "input_kwargs": {},
                "output": [self.entry(output, f"{key}.output.0.npy")],
                "parameters": {p: self.entry(v, f"{key}.parameters.{p}.npy")
                               for p, v in module.named_parameters(recurse=False)},
            }
        return hook

    def gradients(self, model):
        for name, module in model.named_modules():
            params = dict(module.named_parameters(recurse=False))
            if not name or not params:
                continue
            key = f"Module.{name}.{type(module).__name__}.parameters_grad.0"
            self.data[key] = {p: [self.entry(v.grad, f"{key}.{p}.npy")] for p, v in params.items()}

    def write(self, out):
        import os
        import numpy as np
        rank = os.path.join(out, "step0", "rank0")
        data_dir = os.path.join(rank, "dump_tensor_data")
        os.makedirs(data_dir, exist_ok=True)
        for name, array in self.files.items():
            np.save(os.path.join(data_dir, name), array)
        with open(os.path.join(rank, "dump.json"), "w") as f:
            json.dump({"task": self.task, "level": "L0", "framework": "pytorch",
                       "dump_data_dir": data_dir if self.task == "tensor" else None, "data": self.data}, f, indent=1)
        for extra in ("stack.json", "construct.json"):
            with open(os.path.join(rank, extra), "w") as f:
                json.dump({}, f)


def smooth_cross_entropy(logits, labels, smoothing, over_others):
    """Cross-entropy against a smoothed one-hot target, mean over the batch. over_others: the label
    keeps 1 - s and the others share s (MindSpore's CrossEntropySmooth); else every class gets s/C."""
    import torch
    classes = logits.shape[1]
    if over_others:
        target = torch.full_like(logits, smoothing / (classes - 1))
        target.scatter_(1, labels.view(-1, 1), 1.0 - smoothing)
    else:
        target = torch.full_like(logits, smoothing / classes)
        target.scatter_add_(1, labels.view(-1, 1), torch.full_like(logits[:, :1], 1.0 - smoothing))
    return -(target * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


def plant_forward_fault(model, fault):
    import torch
    import torch.nn.functional as F
    if fault == "padding":
        model.conv1.padding = (2, 2)
    elif fault == "early_bn_unbiased":
        bn = model.get_submodule("layer1.0.bn2")

        def unbiased(x):
            # The running statistics update as torch's own (unbiased variance); only the normalisation errs.
            mean = x.mean(dim=(0, 2, 3), keepdim=True)
            var = x.var(dim=(0, 2, 3), unbiased=True, keepdim=True)
            with torch.no_grad():
                bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean.flatten())
                bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var.flatten())
                bn.num_batches_tracked += 1
            y = (x - mean) / torch.sqrt(var + bn.eps)
            return y * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
        bn.forward = unbiased
    elif fault == "activation":
        model.get_submodule("layer3.0").relu = torch.nn.GELU()
    elif fault == "bn_eps":
        model.get_submodule("layer2.1.bn2").eps = 1e-3
    elif fault == "mid_conv_transpose":
        conv = model.get_submodule("layer3.2.conv2")
        conv.forward = lambda x: F.conv2d(x, conv.weight.transpose(2, 3), None, conv.stride, conv.padding)
    elif fault == "late_bn_eval":
        bn = model.get_submodule("layer4.2.bn1")
        bn.forward = lambda x: F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    elif fault == "bn_momentum":
        model.get_submodule("layer3.1.bn1").momentum = 0.01


def run(args):
    import numpy as np
    import torch
    import torchvision

    config, lr, state = read_run(args.run)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    num_classes = int(config["num_classes"])
    model = torchvision.models.resnet50(num_classes=num_classes)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(state[f"param.{name}"].copy()).reshape(p.shape))
        for name, b in model.named_buffers():
            b.copy_(torch.from_numpy(state[f"buffer.{name}"].copy()).reshape(b.shape))
    model.train()
    plant_forward_fault(model, args.fault)

    out = {"input": state["input"].copy(), "label": state["label"].astype(np.int64)}
    for name, p in model.named_parameters():
        out[f"param.{name}"] = p.detach().numpy().copy()
    for name, b in model.named_buffers():
        out[f"buffer.{name}"] = b.detach().numpy().copy()

    # Activations: every module's output under its name; a module called several times (a block's one
    # relu) gets ".0", ".1", ... per call. Cloned at once: the next relu works in place.
    calls = {}
    act_order = []
    multi = {f"{n}.relu" for n, m in model.named_modules() if isinstance(m, torchvision.models.resnet.Bottleneck)}

    def hook_for(name):
        def hook(module, inputs, output):
            key = name
            if name in multi:
                key = f"{name}.{calls.get(name, 0)}"
                calls[name] = calls.get(name, 0) + 1
            out[f"act.{key}"] = output.detach().numpy().copy()
            act_order.append(f"act.{key}")
        return hook

    for name, module in model.named_modules():
        if name and (not list(module.children()) or isinstance(module, torchvision.models.resnet.Bottleneck)):
            module.register_forward_hook(hook_for(name))
    msprobe = MsprobeRecorder(args.msprobe_task) if args.format == "msprobe" else None
    if msprobe:
        for name, module in model.named_modules():
            if name:
                module.register_forward_hook(msprobe.forward_hook(name))

    x = torch.from_numpy(out["input"].copy())
    if args.fault == "input_perturbed":
        x = x * 1.001
        out["input"] = x.numpy().copy()
    y = torch.from_numpy(out["label"].copy())
    logits = model(x)
    smoothing = float(config.get("label_smoothing", 0.0))
    over_others = config.get("loss_convention", "mindspore") == "mindspore"
    if args.fault == "loss_convention":
        over_others = not over_others
    if args.format == "msprobe":
        logits.retain_grad()
    loss = smooth_cross_entropy(logits, y, smoothing, over_others)
    out["loss"] = np.array(loss.item(), dtype=np.float32)
    loss.backward()
    if msprobe:
        msprobe.gradients(model)
        if args.fault == "grad_scale":  # as the update sees it
            g = model.get_parameter("layer4.2.bn3.weight").grad * 1.01
            key = "Module.layer4.2.bn3.BatchNorm2d.parameters_grad.0"
            msprobe.data[key]["weight"] = [msprobe.entry(g, f"{key}.weight.npy")]
        key = "Module.fc.Linear.backward.0"  # the gradient reaching fc's output; our dumps hold none
        msprobe.data[key] = {"input": [msprobe.entry(logits.grad, f"{key}.input.0.npy")], "output": []}

    # Momentum SGD as the trainer documents it: weight decay on conv and fc weights, buf = m buf + g
    # (first step: buf = g), p -= lr buf; nesterov: p -= lr (g + m buf).
    momentum = float(config["momentum"])
    decay = float(config["weight_decay"])
    nesterov = bool(config.get("nesterov", False))
    decayed = set()
    for mname, module in model.named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            decayed.add(f"{mname}.weight" if mname else "weight")
        if args.fault == "wd_on_bn" and isinstance(module, torch.nn.BatchNorm2d):
            decayed.update({f"{mname}.weight", f"{mname}.bias"})
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = p.grad
            if args.fault == "grad_scale" and name == "layer4.2.bn3.weight":
                g = g * 1.01
            out[f"grad.{name}"] = g.numpy().copy()
            d = g + decay * p if name in decayed else g.clone()
            buf = (1.0 - momentum) * d if args.fault == "momentum_convention" else d
            step = d + momentum * buf if nesterov else buf
            p.sub_(lr * step)
            out[f"param_after.{name}"] = p.numpy().copy()
            out[f"momentum.{name}"] = buf.numpy().copy()
    for name, b in model.named_buffers():
        out[f"buffer_after.{name}"] = b.detach().numpy().copy()
    if args.format == "ts_save":
        write_ts_save(args.out, out, act_order, args.suffix)
    elif args.format == "torch_save":
        torch.save(model.state_dict(), args.out)
    elif args.format == "msprobe":
        msprobe.write(args.out)
    else:
        write_safetensors(args.out, out)
    print(f"independent_reference.py: wrote {args.out} ({len(out)} tensors, fault {args.fault or 'none'})",
          file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--out", required=True)
    parser.add_argument("--fault", choices=sorted(FAULTS))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--format", choices=("safetensors", "ts_save", "torch_save", "msprobe"), default="safetensors")
    parser.add_argument("--msprobe-task", choices=("tensor", "statistics"), default="tensor")
    parser.add_argument("--suffix", default="", help="ts_save: TroubleShooter's suffix argument")
    args = parser.parse_args()
    try:
        run(args)
    except InputError as e:
        print(f"independent_reference.py: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
