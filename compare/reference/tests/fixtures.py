"""Shared helpers of the reference tests: run files with the real schema, the act names the dump
contract specifies, an independent ResNet-50 forward, and small checking utilities."""

import datetime
import json
import os
import pathlib
import sqlite3
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REFERENCE_DIR = HERE.parent
SOURCE_DIR = REFERENCE_DIR.parent.parent
SCHEMA_SQL = SOURCE_DIR / "store" / "schema.sql"
TORCH_STEP = REFERENCE_DIR / "torch_step.py"
sys.path.insert(0, str(REFERENCE_DIR))

import wbformat  # noqa: E402

BLOCKS = (3, 4, 6, 3)  # Bottleneck blocks per stage of ResNet-50


class CheckFailed(AssertionError):
    pass


def check(condition, what):
    if not condition:
        raise CheckFailed(what)


def expected_act_names():
    """The act names of a ResNet-50 dump in execution order, written out from the dump contract
    (not derived from hooks): torchvision's Bottleneck runs downsample after bn3, and calls its single
    relu three times (.0, .1, .2); the block output follows its last relu."""
    names = ["conv1", "bn1", "relu", "maxpool"]
    for stage, count in enumerate(BLOCKS, start=1):
        for b in range(count):
            p = f"layer{stage}.{b}"
            names += [f"{p}.conv1", f"{p}.bn1", f"{p}.relu.0", f"{p}.conv2", f"{p}.bn2", f"{p}.relu.1",
                      f"{p}.conv3", f"{p}.bn3"]
            if b == 0:
                names += [f"{p}.downsample.0", f"{p}.downsample.1"]
            names += [f"{p}.relu.2", p]
    return names + ["avgpool", "fc"]


def decays(name, shape):
    """The seed guide's parameter groups: conv and fc weights decay; BN gamma/beta and biases do not."""
    return name.endswith(".weight") and len(shape) > 1


def make_model(seed, num_classes=10):
    import torch
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(num_classes=num_classes)
    # Non-trivial BN state, so loading buffers and the running-stat update are both visible.
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand_like(b) + 0.5)
            elif name.endswith("num_batches_tracked"):
                b.fill_(7)
        for name, p in model.named_parameters():
            if ".bn" in name or name.startswith("bn1") or "downsample.1" in name:
                p.add_(torch.randn_like(p) * 0.05)  # gamma/beta away from 1/0
    return model


def make_batch(seed, batch=4, size=32, num_classes=10):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, num_classes, size=batch).astype(np.int32)
    return x, y


def create_run(path, config, *, world_size=1, schema=True):
    """An empty run file with the store's schema, meta rows and config."""
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    if schema:
        db.executescript(SCHEMA_SQL.read_text())
        db.execute("PRAGMA user_version = 2")
        meta = {"schema_version": "2", "created_utc": datetime.datetime.utcnow().isoformat() + "Z",
                "config_json": json.dumps(config), "world_size": str(world_size), "device": "cpu", "complete": "1"}
        db.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", meta.items())
    db.commit()
    return db


def insert_tensor(db, kind, name, array, *, step, rank, order, dtype=None):
    array = np.asarray(array, order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    dtype = dtype or wbformat.dtype_name(array)
    db.execute("INSERT INTO tensor(source, step, rank, kind, name, exec_order, dtype, shape, data) "
               "VALUES ('run', ?, ?, ?, ?, ?, ?, ?, ?)",
               (step, rank, kind, name, order, dtype, json.dumps(list(array.shape)),
                array.astype(wbformat.numpy_dtype(dtype)).tobytes()))


def write_run(path, model, x, y, config, *, step=1, rank=0, world_size=1, step_rows=(), decay=decays):
    """A run file as wb-train --dump-step writes it: meta, param table, and the tensors before the step
    (input, label, param, buffer). step_rows: [(step, lr)] rows of the step table for `rank`;
    decay(name, shape) gives the param table's decay column."""
    db = create_run(path, config, world_size=world_size)
    for idx, (name, p) in enumerate(model.named_parameters()):
        shape = list(p.shape)
        db.execute("INSERT INTO param(idx, name, shape, numel, bucket, decay) VALUES (?, ?, ?, ?, 0, ?)",
                   (idx, name, json.dumps(shape), p.numel(), int(decay(name, shape))))
    for s, lr in step_rows:
        db.execute("INSERT INTO step(rank, step, start_ns, end_ns, data_wait_ns, comm_exposed_ns, loss, lr, "
                   "images) VALUES (?, ?, 0, 1, 0, 0, 2.3, ?, ?)", (rank, s, lr, len(y)))
    insert_dump(db, model, x, y, step=step, rank=rank)
    db.commit()
    db.close()


def insert_dump(db, model, x, y, *, step, rank):
    """The tensors one rank dumps before the step: input, label, param.*, buffer.* (the batch rows named
    after their kind, as wb-train writes them)."""
    order = 0
    insert_tensor(db, "input", "input", x, step=step, rank=rank, order=order)
    order += 1
    insert_tensor(db, "label", "label", y, step=step, rank=rank, order=order)
    for name, p in model.named_parameters():
        order += 1
        insert_tensor(db, "param", name, p.detach().numpy(), step=step, rank=rank, order=order)
    for name, b in model.named_buffers():
        order += 1
        insert_tensor(db, "buffer", name, b.detach().numpy(), step=step, rank=rank, order=order)


def add_rank_dump(path, model, x, y, *, step, rank):
    """Another rank's dump of the same step, added to a run file made by write_run (--dump-ranks all)."""
    db = sqlite3.connect(path)
    insert_dump(db, model, x, y, step=step, rank=rank)
    db.commit()
    db.close()


def run_torch_step(run, out, *extra):
    """(returncode, stdout, stderr) of torch_step.py RUN --out OUT ..."""
    cmd = [sys.executable, str(TORCH_STEP), str(run), "--out", str(out), *map(str, extra)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def manual_forward(model, x):
    """ResNet-50's forward written out by hand (no hooks, out-of-place relu): name -> output."""
    import torch
    import torch.nn.functional as F
    acts = {}

    def put(name, t):
        acts[name] = t
        return t

    h = put("conv1", model.conv1(x))
    h = put("bn1", model.bn1(h))
    h = put("relu", F.relu(h))
    h = put("maxpool", model.maxpool(h))
    for stage in range(1, 5):
        for b, blk in enumerate(getattr(model, f"layer{stage}")):
            p = f"layer{stage}.{b}"
            o = put(f"{p}.conv1", blk.conv1(h))
            o = put(f"{p}.bn1", blk.bn1(o))
            o = put(f"{p}.relu.0", F.relu(o))
            o = put(f"{p}.conv2", blk.conv2(o))
            o = put(f"{p}.bn2", blk.bn2(o))
            o = put(f"{p}.relu.1", F.relu(o))
            o = put(f"{p}.conv3", blk.conv3(o))
            o = put(f"{p}.bn3", blk.bn3(o))
            identity = h
            if blk.downsample is not None:
                identity = put(f"{p}.downsample.0", blk.downsample[0](h))
                identity = put(f"{p}.downsample.1", blk.downsample[1](identity))
            h = put(f"{p}.relu.2", F.relu(o + identity))
            acts[p] = h
    h = put("avgpool", model.avgpool(h))
    put("fc", model.fc(torch.flatten(h, 1)))
    return acts


def loss_and_dlogits(logits, labels, smoothing, convention):
    """Smoothed softmax cross-entropy and its gradient w.r.t. the logits, in float64 numpy."""
    z = np.asarray(logits, dtype=np.float64)
    n, c = z.shape
    if convention == "mindspore":
        target = np.full((n, c), smoothing / (c - 1))
        target[np.arange(n), labels] = 1.0 - smoothing
    else:
        target = np.full((n, c), smoothing / c)
        target[np.arange(n), labels] += 1.0 - smoothing
    shifted = z - z.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-(target * logp).sum(axis=1).mean())
    dlogits = (np.exp(logp) - target) / n
    return loss, dlogits


def rel_err(a, b):
    """max |a - b| / max |b| in float64 (0 when both are zero)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return 0.0 if diff == 0 else diff / max(scale, 1e-30)


def tmp_dir_from_argv():
    """The directory given with --tmp DIR (the Catch2 driver makes and removes it)."""
    if "--tmp" in sys.argv:
        d = pathlib.Path(sys.argv[sys.argv.index("--tmp") + 1])
        d.mkdir(parents=True, exist_ok=True)
        return d
    import tempfile
    return pathlib.Path(tempfile.mkdtemp(prefix="wb-reference-"))
