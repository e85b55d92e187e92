"""Dump one training step of your own PyTorch script in the workbench's format.

Import this module into the training script whose numbers you trust and wrap one step:

    import sys; sys.path.insert(0, "<workbench>/compare/reference")   # wbdump.py and wbformat.py
    import wbdump
    d = wbdump.StepDumper(model, optimizer, out="step1.safetensors")
    d.begin(inputs, labels)         # input, label, parameters and buffers before the step; hooks on
    loss = d.loss(criterion(model(inputs), labels))   # every module's forward output; the loss
    loss.backward(); optimizer.step()
    d.end()                         # gradients, parameters/buffers after, momentum; writes the file

Call end() after optimizer.step() and before optimizer.zero_grad(). The file is a .safetensors with
the keys `wb compare` understands, the same ones wb-train dumps into its run file:

    input, label, loss                      the batch and the loss (several inputs: input.0, input.1, ...)
    param.<name>, buffer.<name>             model.named_parameters() / named_buffers() before the step
    act.<module>                            each module's forward output, in execution order
    grad.<name>                             parameter gradients as the optimizer saw them (p.grad)
    param_after.<name>, buffer_after.<name> the same after optimizer.step()
    momentum.<name>                         optimizer.state[p]["momentum_buffer"] after the step

Which modules are hooked: every leaf module, and every composite module that is not the model itself
or a plain container (Sequential, ModuleList, ModuleDict); for torchvision's ResNet-50 that is each
conv/bn/relu/pool/fc and each Bottleneck block (`act.layer1.0`), but not `layer1` or `downsample`.
Pass `modules=` (a list of names or a predicate (name, module) -> bool) to choose others.
A module called more than once in the step gets one key per call, suffixed in call order: torchvision's
Bottleneck calls its single `relu` three times, giving `act.layer1.0.relu.0`, `.relu.1`, `.relu.2`;
a module called once keeps its plain name (the stem's `act.relu`). A module returning a tuple, list
or dict gets `act.<module>[i]` / `act.<module>[key]` per tensor.

The `__metadata__` of the file holds "wb.source", "wb.exec_order" (a JSON object key -> position in
the step: input, label, params, buffers, activations in forward order, loss, gradients in reverse
layer order, param_after, buffer_after, momentum), "torch" (the version) and whatever `metadata=`
adds. Tensors are copied to the host as they are produced (activations before any in-place op can
overwrite them), so dumping a large batch needs host memory for every activation.

"wb.noise" (optional; torch_step.py writes it, a script of yours may too) is the reference's own float32
noise per tensor: its distance to a float64 replay of the same step (same batch, same state before
it), which `wb compare` may use as the scale a difference is judged against. A JSON object:

    {"version": 1, "method": "float64 replay of the same step", "dtype": "float64",
     "tensors": {"<key>": {"l2": ||r32 - r64||, "max_abs": max |r32 - r64|, "ref_l2": ||r64||}, ...},
     "updates": {"param_after.<name>": {"l2": ||(after32 - before) - (after64 - before)||,
                                        "ref_l2": ||after64 - before||},
                 "momentum.<name>": {"l2": ||(mom32 - grad32) - (mom64 - grad64)||,
                                     "ref_l2": ||mom64 - grad64||}, ...}}

torch_step.py adds "flip_l2" to every entry (tensors and updates): ||r32 - r64'||, where r64' is one more
float64 replay in which each ReLU input within one standard deviation of its float32 rounding noise of
zero (per channel) went the other way, and each channel of a batch norm over at most 64 values per
channel whose float64 spread is within that reach of its input's rounding noise was turned the other way
(out = 2 beta - out: over two values a channel's output is +-1 by the sign of their difference); and, at
the top level, "flip_reach" (that reach, in standard deviations), "flipped" (how many ReLU inputs it
flipped) and "flipped_bn_channels" (how many batch norm channels); the loss's entry also gets "input_l2", ||d loss /
d logits|| times the logits' noise: one scalar's own rounding is a single draw and may happen to be tiny,
what its logits' noise allows is not. `wb compare` takes the largest of l2, flip_l2 and input_l2.

The entries cover the float keys of kinds act, loss, grad, param_after, buffer_after and momentum that both replays
hold with the same shape (`before` is the dumped param.<name>); norms are computed in float64, and an
entry with a value that is not finite is left out. noise_metadata(ref32, ref64) computes it from two
dicts key -> tensor or array (the float32 step and its float64 replay, e.g. two dumpers' tensors());
NoiseMeter computes it one float64 tensor at a time (StepDumper(..., sink=meter.add)), so the float64
replay's tensors need not be held:

    d32 = wbdump.StepDumper(model, optimizer, out="step1.safetensors")
    ... the step in float32 ...; d32.end(write=False)
    meter = wbdump.NoiseMeter(d32.tensors())
    d64 = wbdump.StepDumper(model64, optimizer64, sink=meter.add)
    ... the same step in float64, from the same state ...; d64.end()
    d32.metadata["wb.noise"] = json.dumps(meter.metadata()); d32.write()

Micro-batches (`micro_batches=M`): a step that runs the model forward M times over the M slices of
its batch, one after the other (gradient accumulation, or a pipeline's micro-batches run one at a
time), before calling loss(). Each micro-batch's forward makes the same calls in the same order, so
each call's key is named by the first micro-batch's calls, and its tensor is the M outputs joined
along the batch dimension: `act.<module>` over the whole batch, as a workbench pipeline run dumps it.

A model wrapped in DataParallel or DistributedDataParallel is unwrapped, so names carry no "module."
prefix. Under DistributedDataParallel the gradients are the ones averaged across ranks.
"""

import json
import math

import numpy as np
import torch

import wbformat

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def default_module_filter(name, module, root):
    """Leaves, plus composites that are neither the model nor a plain container (see the module doc)."""
    if module is root or isinstance(module, _CONTAINERS):
        return False
    return True


def to_numpy(tensor):
    """(numpy array, safetensors dtype) of a tensor on any device; BF16 travels as its uint16 bits."""
    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16), "BF16"
    array = t.contiguous().numpy()
    return array, wbformat.dtype_name(array)


def _host_copy(tensor):
    # A copy, never a view: torchvision's ReLU(inplace=True) overwrites the batch-norm output the
    # hook has just seen, and optimizer.step() overwrites parameters in place.
    return tensor.detach().to("cpu", copy=True)


class StepDumper:
    """Records one training step of `model` (and `optimizer`, optional) and writes it to `out`."""

    def __init__(self, model, optimizer=None, out="step.safetensors", *, modules=None, metadata=None,
                 step=None, rank=None, source="wbdump.py", micro_batches=1, sink=None):
        """sink: a callable sink(key, host tensor) that receives each tensor as it is recorded, instead of
        this dumper keeping it for write() (then end() writes nothing); e.g. NoiseMeter.add."""
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"StepDumper needs a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise ValueError(f"StepDumper micro_batches: expected a whole number >= 1, got {micro_batches!r}")
        self.model = model
        self.optimizer = optimizer
        self.micro_batches = micro_batches
        self.out = str(out)
        self.metadata = {"wb.source": source, "torch": torch.__version__}
        if step is not None:
            self.metadata["step"] = str(step)
        if rank is not None:
            self.metadata["rank"] = str(rank)
        for key, value in (metadata or {}).items():
            self.metadata[str(key)] = value if isinstance(value, str) else json.dumps(value)
        if modules is None:
            self._wanted = lambda name, m: default_module_filter(name, m, model)
        elif callable(modules):
            self._wanted = modules
        else:
            names = set(modules)
            unknown = names - {n for n, _ in model.named_modules()}
            if unknown:
                raise ValueError(f"StepDumper modules: no submodule named {', '.join(sorted(unknown))}")
            self._wanted = lambda name, m: name in names
        self._entries = []      # (key, host tensor) in execution order (none with a sink)
        self._keys = set()
        self._key_order = []    # every recorded key, in execution order
        self._sink = sink
        self._calls = []        # (module name, host output) in call order, named when the forward ends
        self._hooks = []
        self._state = "new"

    # ---------------------------------------------------------------------------------------- the step

    def begin(self, inputs, labels=None):
        """Capture the batch, parameters and buffers, and start recording module outputs."""
        if self._state != "new":
            raise RuntimeError(f"StepDumper.begin() called twice (this dumper is {self._state}); "
                               "make a new StepDumper per dumped step")
        self._add_structure("input", inputs)
        if labels is not None:
            self._add_structure("label", labels)
        for name, p in self.model.named_parameters():
            self._add(f"param.{name}", p)
        for name, b in self.model.named_buffers():
            self._add(f"buffer.{name}", b)
        for name, module in self.model.named_modules():
            if name and self._wanted(name, module):
                self._hooks.append(module.register_forward_hook(self._make_hook(name)))
        self._state = "forward"

    def loss(self, loss):
        """Record the loss and stop recording module outputs; returns `loss` unchanged."""
        if self._state != "forward":
            raise RuntimeError(f"StepDumper.loss() needs begin() first (this dumper is {self._state})")
        self._close_forward()
        self._add("loss", loss)
        return loss

    def end(self, write=True):
        """Capture gradients, parameters/buffers after the step and momentum; write the file (unless
        write=False, to add metadata first and call write() later, or the dumper has a sink). Returns the
        path written, or None."""
        if self._state == "forward":
            self._close_forward()
        if self._state != "backward":
            raise RuntimeError(f"StepDumper.end() needs begin() first (this dumper is {self._state})")
        params = list(self.model.named_parameters())
        # Reverse layer order: the order backward produces them, last layer first.
        for name, p in reversed(params):
            if p.grad is not None:
                self._add(f"grad.{name}", p.grad)
        for name, p in params:
            self._add(f"param_after.{name}", p)
        for name, b in self.model.named_buffers():
            self._add(f"buffer_after.{name}", b)
        if self.optimizer is not None:
            for name, p in params:
                buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    self._add(f"momentum.{name}", buf)
        if write and self._sink is None:
            self.write()
            self._state = "written"
            return self.out
        self._state = "ended"
        return None

    def remove_hooks(self):
        """Stop recording (for a step abandoned half-way); end() and loss() do this themselves."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ---------------------------------------------------------------------------------------- output

    def keys(self):
        return list(self._key_order)

    def tensors(self):
        """The recorded tensors, key -> host tensor, in execution order."""
        return dict(self._entries)

    def write(self, path=None):
        if self._sink is not None:
            raise RuntimeError("StepDumper.write(): this dumper handed its tensors to its sink and kept none")
        path = str(path or self.out)
        arrays, dtypes = {}, {}
        for key, t in self._entries:
            arrays[key], dtypes[key] = to_numpy(t)
        metadata = dict(self.metadata)
        metadata["wb.exec_order"] = json.dumps({key: i for i, (key, _) in enumerate(self._entries)})
        wbformat.write_safetensors(path, arrays, metadata, dtypes)
        return path

    # ---------------------------------------------------------------------------------------- internals

    def _add(self, key, tensor):
        self._append(key, _host_copy(tensor))

    def _append(self, key, host_tensor):
        if key in self._keys:
            raise ValueError(f"StepDumper: key '{key}' recorded twice")
        self._keys.add(key)
        self._key_order.append(key)
        if self._sink is not None:
            self._sink(key, host_tensor)
        else:
            self._entries.append((key, host_tensor))

    def _add_structure(self, key, value):
        if isinstance(value, torch.Tensor):
            self._add(key, value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, torch.Tensor):
                    self._add(f"{key}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    self._add(f"{key}.{i}", v)
        else:
            raise TypeError(f"StepDumper: {key} must be a tensor, or a list/tuple/dict of tensors, "
                            f"got {type(value).__name__}")

    def _make_hook(self, name):
        def hook(_module, _inputs, output):
            self._calls.append((name, _flatten_output(output)))
        return hook

    def _close_forward(self):
        self.remove_hooks()
        if self.micro_batches > 1:
            self._join_micro_batches()
        counts = {}
        for name, _ in self._calls:
            counts[name] = counts.get(name, 0) + 1
        seen = {}
        for name, outputs in self._calls:
            i = seen.get(name, 0)
            seen[name] = i + 1
            base = f"act.{name}.{i}" if counts[name] > 1 else f"act.{name}"
            for suffix, t in outputs:
                self._append(base + suffix, t)
        self._calls = []
        self._state = "backward"


    def _join_micro_batches(self):
        """The calls of M micro-batch forwards, as the calls of one forward over the whole batch."""
        m = self.micro_batches
        if len(self._calls) % m:
            raise ValueError(f"StepDumper micro_batches={m}: {len(self._calls)} module calls do not divide into "
                             f"{m} micro-batch forwards")
        per = len(self._calls) // m
        chunks = [self._calls[i * per:(i + 1) * per] for i in range(m)]
        joined = []
        for k, (name, outputs) in enumerate(chunks[0]):
            parts = [chunk[k] for chunk in chunks]
            if any(p[0] != name or [s for s, _ in p[1]] != [s for s, _ in outputs] for p in parts):
                raise ValueError(f"StepDumper micro_batches={m}: call {k} of the micro-batch forwards is not the same "
                                 f"module in each (first '{name}')")
            joined.append((name, [(suffix, torch.cat([p[1][j][1] for p in parts]))
                                  for j, (suffix, _) in enumerate(outputs)]))
        self._calls = joined


def _flatten_output(output):
    """[(key suffix, host tensor)] of a module's output: '' for a tensor, '[i]' / '[key]' inside."""
    if isinstance(output, torch.Tensor):
        return [("", _host_copy(output))]
    if isinstance(output, (list, tuple)):
        items = enumerate(output)
    elif isinstance(output, dict):
        items = output.items()
    else:
        return []
    return [(f"[{k}]", _host_copy(v)) for k, v in items if isinstance(v, torch.Tensor)]


# ------------------------------------------------------------------------------------------------ noise

NOISE_VERSION = 1
NOISE_METHOD = "float64 replay of the same step"
NOISE_KINDS = ("act", "loss", "grad", "param_after", "buffer_after", "momentum")


def _float_array(value):
    """A numpy array of a floating-point tensor or array, without copying where it can (a host tensor's
    memory; BF16 widened to float32, exactly), or None when it is not floating point. Arithmetic with it
    in float64 (np.subtract(..., dtype=np.float64)) converts each element exactly."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return None
        t = value.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    array = np.asarray(value)
    return array if np.issubdtype(array.dtype, np.floating) else None


def _l2(array):
    flat = array.reshape(-1)
    return math.sqrt(float(np.dot(flat, flat)))


def _finite(entry):
    return all(math.isfinite(v) for v in entry.values())


class NoiseMeter:
    """The "wb.noise" metadata (see the module doc), one float64 tensor at a time: add(key, tensor) for
    each tensor of the float64 replay, in execution order (a grad before its momentum), then metadata().
    `ref32` maps key -> the float32 step's tensor or array; it is only read. Of the float64 tensors only
    the gradients whose momentum is still to come are kept."""

    def __init__(self, ref32, *, method=NOISE_METHOD, dtype="float64"):
        self._ref = ref32
        self._method = method
        self._dtype = dtype
        self._grads = {}        # name -> float64 grad, until its momentum arrives
        self.tensors = {}
        self.updates = {}

    def add(self, key, tensor):
        kind, _, name = key.partition(".")
        if kind not in NOISE_KINDS or key not in self._ref:
            return
        r64 = _float_array(tensor)
        r32 = _float_array(self._ref[key])
        if r64 is None or r32 is None or r32.shape != r64.shape:
            return
        r64 = r64.astype(np.float64, copy=False)
        diff = np.subtract(r32, r64, dtype=np.float64)
        entry = {"l2": _l2(diff), "max_abs": float(max(diff.max(), -diff.min())) if diff.size else 0.0,
                 "ref_l2": _l2(r64)}
        del diff
        if _finite(entry):
            self.tensors[key] = entry
        if kind == "grad" and f"momentum.{name}" in self._ref:
            self._grads[name] = r64
        elif kind == "param_after" and f"param.{name}" in self._ref:
            before = _float_array(self._ref[f"param.{name}"])  # the same for both replays
            self._update(key, r32, r64, before, before)
        elif kind == "momentum" and f"grad.{name}" in self._ref and name in self._grads:
            self._update(key, r32, r64, _float_array(self._ref[f"grad.{name}"]), self._grads.pop(name))

    def _update(self, key, r32, r64, base32, base64):
        """||(r32 - base32) - (r64 - base64)|| and ||r64 - base64||, in float64."""
        if base32 is None or base64 is None or base32.shape != r32.shape or base64.shape != r64.shape:
            return
        update64 = np.subtract(r64, base64, dtype=np.float64)
        gap = np.subtract(r32, base32, dtype=np.float64)
        gap -= update64
        entry = {"l2": _l2(gap), "ref_l2": _l2(update64)}
        if _finite(entry):
            self.updates[key] = entry

    def metadata(self):
        """The "wb.noise" object (json.dumps it into the file's __metadata__)."""
        return {"version": NOISE_VERSION, "method": self._method, "dtype": self._dtype,
                "tensors": dict(self.tensors), "updates": dict(self.updates)}


def noise_metadata(ref32_tensors, ref64_tensors, *, method=NOISE_METHOD, dtype="float64"):
    """The "wb.noise" object (see the module doc) of a float32 step and its float64 replay, each a dict
    key -> tensor or numpy array (e.g. StepDumper.tensors(), or wbformat.read_safetensors(...)[0])."""
    meter = NoiseMeter(ref32_tensors, method=method, dtype=dtype)
    # Gradients before momentum buffers (a stable sort keeps the rest in the dict's order).
    for key in sorted(ref64_tensors, key=lambda k: k.startswith("momentum.")):
        meter.add(key, ref64_tensors[key])
    return meter.metadata()


def noise_summary(noise):
    """(entries, median rel-L2, worst rel-L2, its key) of a "wb.noise" object's tensors, rel-L2 = l2 / ref_l2
    over the entries with ref_l2 > 0; (n, None, None, None) when there are none."""
    rel = sorted((e["l2"] / e["ref_l2"], key) for key, e in noise["tensors"].items() if e["ref_l2"] > 0)
    if not rel:
        return len(noise["tensors"]), None, None, None
    return len(noise["tensors"]), float(np.median([r for r, _ in rel])), rel[-1][0], rel[-1][1]
