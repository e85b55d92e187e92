"""torch_step.py against an independent computation of the same step.

A run file with the store's real schema holds a seeded torchvision ResNet-50 (batch 4, 32x32, 10
classes) before the step. torch_step.py replays it; this script recomputes the step without it:
a hand-written forward (no hooks), the loss and its logit gradient in float64 numpy, backward from
those logit gradients, the BN running-stat update in numpy, and SGD with the decay groups by hand.
Cases cover both loss conventions, nesterov off/on, lr from the step table or the config, a decay
flag the name rule would not give (the table wins), a multi-rank dump of one rank (caveats recorded),
and a dump of every rank of a 2-rank job (replayed as DDP: against two single-rank replays averaged).
The reference's own noise (wb.noise, its float64 replay): every float key of the step present, finite,
consistent with the file's float32 tensors, a loss and logits matching an independent float64 forward,
the DDP replay's averaged gradients; --no-noise leaves the float32 tensors bit-identical. Replays whose
noise no check reads run with --no-noise, to save time.

Usage: test_torch_step.py [--tmp DIR]   (leaves DIR/torch_step_ref.safetensors for the C++ side)
"""

import collections
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch

import fixtures
from fixtures import check, rel_err
import wbformat

TOL_ACT = 1e-6      # same kernels in the same order: expected bit-exact, allow float32 noise
TOL_LOSS = 1e-6     # float32 loss against float64 numpy
TOL_GRAD = 1e-4     # backward seeded with float32-rounded float64 logit gradients
TOL_STATS = 1e-5    # BN running stats: float32 batch moments against float64 numpy


def preceding_act(bn_name):
    """The act feeding a BN module: bn1 <- conv1, layerX.Y.bnK <- layerX.Y.convK, downsample.1 <- .0."""
    if bn_name.endswith("downsample.1"):
        return bn_name[:-1] + "0"
    head, _, last = bn_name.rpartition(".")
    conv = "conv" + last[2:]
    return f"{head}.{conv}" if head else conv


def expected_keys(model, has_momentum):
    params = [n for n, _ in model.named_parameters()]
    buffers = [n for n, _ in model.named_buffers()]
    keys = ["input", "label"] + [f"param.{n}" for n in params] + [f"buffer.{n}" for n in buffers]
    keys += [f"act.{n}" for n in fixtures.expected_act_names()] + ["loss"]
    keys += [f"grad.{n}" for n in reversed(params)]
    keys += [f"param_after.{n}" for n in params] + [f"buffer_after.{n}" for n in buffers]
    if has_momentum:
        keys += [f"momentum.{n}" for n in params]
    return keys


def run_case(tmp, case, keep_as=None):
    seed = case["seed"]
    model = fixtures.make_model(seed)
    x, y = fixtures.make_batch(seed)
    config = {"num_classes": 10, "image_size": 32, "batch_size": 4, "lr": case["config_lr"],
              "momentum": case["momentum"], "weight_decay": case["wd"], "nesterov": case["nesterov"],
              "label_smoothing": case["smoothing"], "loss_convention": case["convention"],
              "lr_schedule": "constant", "seed": seed, "dump_step": case["step"]}
    decay = case.get("decay", fixtures.decays)
    run = tmp / f"run_{case['name']}.sqlite"
    ref = keep_as or tmp / f"ref_{case['name']}.safetensors"
    fixtures.write_run(run, model, x, y, config, step=case["step"], rank=case["rank"],
                       world_size=case["world_size"], step_rows=case["step_rows"], decay=decay)
    t0 = time.time()
    rc, out, err = fixtures.run_torch_step(run, ref, "--threads", 2, "--rank", case["rank"], *case.get("extra", ()))
    seconds = time.time() - t0
    check(rc == 0, f"torch_step.py exited {rc}: {err}")
    tensors, meta = wbformat.read_safetensors(ref)
    return model, x, y, config, decay, tensors, meta, err, seconds


def verify_full(tmp, case, keep_as=None):
    model, x, y, config, decay, t, meta, err, seconds = run_case(tmp, case, keep_as)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    # Keys: exactly the contract's, in file order and in wb.exec_order.
    keys = expected_keys(model, case["momentum"] != 0)
    check(list(t) == keys, f"keys differ from the contract; first difference at "
                           f"{next((i for i, (a, b) in enumerate(zip(t, keys)) if a != b), min(len(t), len(keys)))}")
    order = json.loads(meta["wb.exec_order"])
    check(order == {k: i for i, k in enumerate(keys)}, "wb.exec_order is not the key order")
    acts = [k for k in keys if k.startswith("act.")]
    check(len(acts) == 174, f"{len(acts)} activations, expected 174")
    check(meta["wb.source"] == "torch_step.py" and meta["torch"] == torch.__version__, "source/torch metadata")
    check(meta["step"] == str(case["step"]) and meta["rank"] == str(case["rank"]), "step/rank metadata")
    lr = case["step_rows"][-1][1] if case["step_rows"] else case["config_lr"]
    check(float(meta["wb.lr"]) == lr, f"lr {meta['wb.lr']}, expected {lr}")
    check(json.loads(meta["wb.not_comparable"]) == [], "world size 1 first step: everything comparable")

    # The state before the step is the run's, bit for bit.
    check(np.array_equal(t["input"], x) and t["input"].dtype == np.float32, "input")
    check(np.array_equal(t["label"], y) and t["label"].dtype == np.int32, "label")
    for n, p in params.items():
        check(np.array_equal(t[f"param.{n}"], p.detach().numpy()), f"param.{n}")
    for n, b in buffers.items():
        check(np.array_equal(t[f"buffer.{n}"], b.detach().numpy()), f"buffer.{n}")

    # Forward, by hand on an identical model.
    torch.set_num_threads(2)
    twin = fixtures.make_model(case["seed"]).train()
    mine = fixtures.manual_forward(twin, torch.from_numpy(x))
    worst_act = max((rel_err(t[f"act.{n}"], a.detach().numpy()), n) for n, a in mine.items())
    check(worst_act[0] <= TOL_ACT, f"act.{worst_act[1]} rel err {worst_act[0]:.3g} > {TOL_ACT}")
    for stage, count in enumerate(fixtures.BLOCKS, start=1):
        for b in range(count):
            blk = f"layer{stage}.{b}"
            check(np.array_equal(t[f"act.{blk}.relu.2"], t[f"act.{blk}"]), f"act.{blk}.relu.2 != act.{blk}")
    check(t["act.avgpool"].shape == (4, 2048, 1, 1) and t["act.fc"].shape == (4, 10), "avgpool/fc shapes")

    # Loss in float64 from the reference's own logits.
    loss64, dlogits = fixtures.loss_and_dlogits(t["act.fc"], y, case["smoothing"], case["convention"])
    loss_err = abs(float(t["loss"]) - loss64) / abs(loss64)
    check(t["loss"].shape == () and loss_err <= TOL_LOSS, f"loss {float(t['loss'])} vs float64 {loss64}")

    # Backward seeded with the numpy logit gradient.
    mine["fc"].backward(torch.from_numpy(dlogits.astype(np.float32)))
    worst_grad = max((rel_err(t[f"grad.{n}"], p.grad.numpy()), n) for n, p in twin.named_parameters())
    check(worst_grad[0] <= TOL_GRAD, f"grad.{worst_grad[1]} rel err {worst_grad[0]:.3g} > {TOL_GRAD}")

    # BN running statistics (momentum 0.1, unbiased variance) from the reference's conv outputs.
    worst_stats = 0.0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            a = t[f"act.{preceding_act(name)}"].astype(np.float64)
            mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3), ddof=1)
            rm = 0.9 * t[f"buffer.{name}.running_mean"] + 0.1 * mean
            rv = 0.9 * t[f"buffer.{name}.running_var"] + 0.1 * var
            worst_stats = max(worst_stats, rel_err(t[f"buffer_after.{name}.running_mean"], rm),
                              rel_err(t[f"buffer_after.{name}.running_var"], rv))
            check(int(t[f"buffer_after.{name}.num_batches_tracked"]) == 8, f"{name}.num_batches_tracked")
    check(worst_stats <= TOL_STATS, f"BN running stats rel err {worst_stats:.3g} > {TOL_STATS}")

    # SGD, first step: buf = d = g + wd * p (wd only in the decay group), update = buf, or d + m * buf
    # with nesterov; param_after = p - lr * update.
    m, wd = case["momentum"], case["wd"]
    worst_sgd, decisive = 0.0, []
    for n, p in params.items():
        p0 = t[f"param.{n}"].astype(np.float64)
        g = t[f"grad.{n}"].astype(np.float64)
        for flip in (False, True):
            group_wd = wd if decay(n, list(p.shape)) != flip else 0.0
            d = g + group_wd * p0
            update = d + m * d if case["nesterov"] else d
            want = p0 - lr * update
            tol = 1e-6 * max(np.abs(p0).max(), lr * np.abs(update).max())
            err = np.abs(t[f"param_after.{n}"] - want).max() / tol
            if not flip:
                worst_sgd = max(worst_sgd, err)
                if m != 0:
                    check(rel_err(t[f"momentum.{n}"], d) <= 1e-6, f"momentum.{n}")
            elif err > 10.0:
                decisive.append(n)
    check(worst_sgd <= 1.0, f"param_after off the hand-written SGD by {worst_sgd:.3g} x tolerance")
    # The check can fail: for most parameters, and in both groups, the other group's update misses by
    # more than 10 x the tolerance (tiny parameters, where wd * p vanishes next to g, cannot tell).
    check(len(decisive) >= 100 and any(decay(n, list(params[n].shape)) for n in decisive)
          and not all(decay(n, list(params[n].shape)) for n in decisive),
          f"decay groups tell apart only {len(decisive)} parameters")
    for n in case.get("must_tell", ()):
        check(n in decisive, f"the decay flag of {n} is not visible in param_after")

    print(f"  {case['name']}: {seconds:.1f} s, {len(t)} tensors ({len(acts)} acts); loss {float(t['loss']):.7f} "
          f"vs float64 {loss64:.7f} (rel {loss_err:.2g}); worst act rel err {worst_act[0]:.2g} ({worst_act[1]}); "
          f"worst grad rel err {worst_grad[0]:.2g} ({worst_grad[1]}); BN stats rel err {worst_stats:.2g}; "
          f"param_after within {worst_sgd:.2f} x tol; the other decay group would miss by > 10 x tol "
          f"on {len(decisive)}/{len(params)} params")


# wb.noise of a full ResNet-50 step: 174 acts, the loss, 161 grads, 161 param_after, the 106 float
# buffer_after (running mean and var; num_batches_tracked is an integer) and 161 momentum buffers.
NOISE_KINDS = {"act": 174, "loss": 1, "grad": 161, "param_after": 161, "buffer_after": 106, "momentum": 161}


def read_noise(meta):
    """The wb.noise object of a reference, its header checked."""
    check("wb.noise" in meta, f"no wb.noise in the reference's metadata (keys {sorted(meta)})")
    noise = json.loads(meta["wb.noise"])
    check(list(noise)[:5] == ["version", "method", "dtype", "tensors", "updates"]
          and set(noise) - {"version", "method", "dtype", "tensors", "updates"} <= {"flip_reach", "flipped",
                                                                                 "flipped_bn_channels"},
          f"wb.noise keys {list(noise)}")
    check(noise["version"] == 1 and noise["method"] == "float64 replay of the same step"
          and noise["dtype"] == "float64", f"wb.noise header {noise['version']} {noise['method']} {noise['dtype']}")
    return noise


def check_noise_entries(noise, t):
    """Every entry finite and >= 0, and consistent with the file's float32 tensors: max_abs <= l2 <=
    max_abs * sqrt(n), and | ||r64|| - ||r32|| | <= ||r32 - r64|| (so ref_l2 is the float64 side's norm),
    likewise for the updates (after - before, momentum - grad)."""
    for key, e in noise["tensors"].items():
        fields = set(e) - ({"input_l2"} if key == "loss" else set())
        check(fields in ({"l2", "max_abs", "ref_l2"}, {"flip_l2", "l2", "max_abs", "ref_l2"}),
              f"wb.noise {key}: fields {sorted(e)}")
        check(all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in e.values()), f"wb.noise {key}: {e}")
        r32 = t[key].astype(np.float64)
        slack = 1e-10 * (e["l2"] + e["ref_l2"]) + 1e-300
        check(e["max_abs"] <= e["l2"] + slack and e["l2"] <= e["max_abs"] * math.sqrt(max(r32.size, 1)) + slack,
              f"wb.noise {key}: l2 {e['l2']} and max_abs {e['max_abs']} disagree")
        check(abs(e["ref_l2"] - np.linalg.norm(r32.ravel())) <= e["l2"] + slack,
              f"wb.noise {key}: ref_l2 {e['ref_l2']} is not within l2 {e['l2']} of ||r32||")
    for key, e in noise["updates"].items():
        kind, _, name = key.partition(".")
        check(kind in ("param_after", "momentum") and key in noise["tensors"], f"wb.noise update {key}")
        check(sorted(e) in (["l2", "ref_l2"], ["flip_l2", "l2", "ref_l2"])
              and all(math.isfinite(v) and v >= 0 for v in e.values()),
              f"wb.noise update {key}: {e}")
        base = t[f"param.{name}" if kind == "param_after" else f"grad.{name}"].astype(np.float64)
        u32 = np.linalg.norm((t[key].astype(np.float64) - base).ravel())
        # ||u32 - u64|| is the update's l2, so the two norms differ by at most that.
        check(abs(e["ref_l2"] - u32) <= e["l2"] + 1e-10 * (e["l2"] + u32) + 1e-300,
              f"wb.noise update {key}: ref_l2 {e['ref_l2']} is not within l2 {e['l2']} of ||u32|| {u32}")


def verify_noise(tmp, case, ref):
    """The default replay's wb.noise (against an independent float64 forward), and --no-noise."""
    t, meta = wbformat.read_safetensors(ref)
    noise = read_noise(meta)
    kinds = collections.Counter(k.partition(".")[0] for k in noise["tensors"])
    check(kinds == NOISE_KINDS, f"wb.noise entries per kind {dict(kinds)}, expected {NOISE_KINDS}")
    check(not any(k.endswith("num_batches_tracked") for k in noise["tensors"]), "wb.noise of an integer buffer")
    check(all(k in t and t[k].dtype == np.float32 for k in noise["tensors"]), "wb.noise of a key the file lacks")
    check(len(noise["updates"]) == 161 * 2, f"{len(noise['updates'])} wb.noise updates, expected 322")
    check_noise_entries(noise, t)
    deep = noise["tensors"]["act.layer4.2"]
    deep_rel = deep["l2"] / deep["ref_l2"]
    check(0 < deep_rel < 1e-2, f"act.layer4.2 noise rel-L2 {deep_rel:.3g}, expected in (0, 1e-2) at 32x32")

    # An independent float64 forward: torchvision's resnet50 in float64 holding the run's dumped state.
    import torchvision
    torch.set_num_threads(2)
    run = tmp / f"run_{case['name']}.sqlite"
    with wbformat.RunFile(run) as rf:
        state = {rt.key: rt.array for rt in rf.tensors(case["step"], case["rank"], kinds=("input", "label",
                                                                                           "param", "buffer"))}
    model = torchvision.models.resnet50(num_classes=10)
    with torch.no_grad():
        for name, v in list(model.named_parameters()) + list(model.named_buffers()):
            kind = "param" if isinstance(v, torch.nn.Parameter) else "buffer"
            v.copy_(torch.from_numpy(np.array(state[f"{kind}.{name}"])).reshape(v.shape))
        model.double().train()
        logits64 = model(torch.from_numpy(np.array(state["input"])).double()).numpy()
    loss64, _ = fixtures.loss_and_dlogits(logits64, state["label"], case["smoothing"], case["convention"])
    e, loss32 = noise["tensors"]["loss"], float(t["loss"])
    check(e["max_abs"] == e["l2"] > 0, f"loss noise {e}: a scalar's l2 is its max_abs, and float32 rounds")
    # The float64 loss the replay saw is loss32 -/+ l2; it must be the independent one.
    off = min(abs(loss32 - e["l2"] - loss64), abs(loss32 + e["l2"] - loss64))
    check(off <= 1e-12 * abs(loss64), f"loss32 {loss32!r} -/+ l2 {e['l2']!r} misses the float64 loss {loss64!r} by {off:.3g}")
    check(abs(e["ref_l2"] - abs(loss64)) <= 1e-12 * abs(loss64), f"loss ref_l2 {e['ref_l2']!r} vs {loss64!r}")
    # The replay with near-zero ReLU inputs flipped: it is the float64 replay until the first ReLU (the
    # stem's conv1 and bn1 match to the bit), and where it flipped anything the gradients move further.
    check(noise.get("flip_reach") == 1.0 and isinstance(noise.get("flipped"), int) and noise["flipped"] >= 0,
          f"wb.noise flip_reach {noise.get('flip_reach')!r}, flipped {noise.get('flipped')!r}")
    flip_entries = [x for x in list(noise["tensors"].values()) + list(noise["updates"].values()) if "flip_l2" in x]
    flipped_any = noise["flipped"] + noise.get("flipped_bn_channels", 0)
    check(flipped_any == 0 or len(flip_entries) == len(noise["tensors"]) + len(noise["updates"]),
          f"{len(flip_entries)} wb.noise entries carry flip_l2")
    check(all(x["flip_l2"] >= 0 for x in flip_entries), "a negative flip_l2")
    if noise["flipped"]:
        for key in ("act.conv1", "act.bn1"):
            x = noise["tensors"][key]
            check(x["flip_l2"] == x["l2"], f"{key}: flip_l2 {x['flip_l2']!r} != l2 {x['l2']!r} before any ReLU")
        moved = sum(x["flip_l2"] > x["l2"] for k, x in noise["tensors"].items() if k.startswith("grad."))
        check(moved > 0, "flipping near-zero ReLU inputs moved no gradient")
    # The loss's bound from its logits' noise: ||d loss / d logits|| x their noise, against the same
    # product from the independent float64 logits and the fixtures' own d loss / d logits.
    fc = noise["tensors"]["act.fc"]
    _, dlogits = fixtures.loss_and_dlogits(logits64, state["label"], case["smoothing"], case["convention"])
    expected = np.linalg.norm(np.asarray(dlogits, dtype=np.float64).ravel()) * max(fc["l2"], fc.get("flip_l2", 0.0))
    check(abs(e.get("input_l2", -1.0) - expected) <= 1e-6 * expected,
          f"loss input_l2 {e.get('input_l2')!r}, expected ||dL/dlogits|| x logit noise = {expected!r}")
    fc_l2 = np.linalg.norm((t["act.fc"].astype(np.float64) - logits64).ravel())
    check(abs(fc_l2 - fc["l2"]) <= 1e-6 * fc_l2 and abs(fc["ref_l2"] - np.linalg.norm(logits64)) <= 1e-12 * fc["ref_l2"],
          f"act.fc noise {fc} vs the independent float64 logits: l2 {fc_l2}")

    # --no-noise: no wb.noise, and the float32 reference bit for bit as the default run wrote it.
    quiet = tmp / f"ref_{case['name']}_no_noise.safetensors"
    t0 = time.time()
    rc, _, err = fixtures.run_torch_step(run, quiet, "--threads", 2, "--rank", case["rank"], "--no-noise")
    seconds = time.time() - t0
    check(rc == 0, f"torch_step.py --no-noise exited {rc}: {err}")
    check("float64" not in err and "noise: " not in err, f"--no-noise still replayed in float64: {err}")
    tq, mq = wbformat.read_safetensors(quiet)
    check("wb.noise" not in mq, "--no-noise wrote wb.noise")
    check(mq == {k: v for k, v in meta.items() if k != "wb.noise"}, "--no-noise changed other metadata")
    check(list(tq) == list(t) and all(tq[k].dtype == t[k].dtype and tq[k].shape == t[k].shape
                                      and tq[k].tobytes() == t[k].tobytes() for k in t),
          "--no-noise and the default run wrote different float32 tensors")
    rels = sorted(x["l2"] / x["ref_l2"] for x in noise["tensors"].values() if x["ref_l2"] > 0)
    print(f"  noise ({case['name']}): {len(noise['tensors'])} tensors + {len(noise['updates'])} updates, median rel-L2 "
          f"{rels[len(rels) // 2]:.2g}, act.layer4.2 {deep_rel:.2g}; loss32 {loss32!r} vs independent float64 "
          f"{loss64!r}: |diff| = l2 within {off:.2g}; act.fc l2 {fc['l2']:.3g} vs {fc_l2:.3g}; --no-noise "
          f"{seconds:.1f} s, bit-identical")


def verify_multi_rank(tmp, case):
    _, _, _, _, _, t, meta, err, seconds = run_case(tmp, case)
    check(json.loads(meta["wb.not_comparable"]) == ["grad", "param_after", "momentum"],
          f"not_comparable {meta['wb.not_comparable']}")
    caveats = json.loads(meta["wb.caveats"])
    check(len(caveats) == 2 and "averaged over all ranks" in caveats[0] and "momentum" in caveats[1],
          f"caveats {caveats}")
    notes = [line for line in err.splitlines() if "NOTE:" in line]
    check(len(notes) == 2 and "world size 2" in notes[0], f"stderr notes {notes}")
    check(meta["rank"] == "1" and meta["step"] == "3" and float(meta["wb.lr"]) == 0.07, "rank/step/lr metadata")
    check(len([k for k in t if k.startswith("act.")]) == 174, "acts of a multi-rank dump")
    print(f"  {case['name']}: {seconds:.1f} s; not comparable {meta['wb.not_comparable']}; "
          f"{len(notes)} NOTE lines on stderr")

def verify_ddp(tmp, seed):
    """Both ranks of a 2-rank job dumped step 0: torch_step.py replays it as DDP does, which must equal
    two independent single-rank replays (one per rank's batch and BN state) with their gradients
    averaged and one SGD step on the average."""
    lr, m, wd = 0.1, 0.9, 0.01
    config = {"num_classes": 10, "image_size": 32, "batch_size": 4, "lr": lr, "momentum": m, "weight_decay": wd,
              "nesterov": False, "label_smoothing": 0.1, "loss_convention": "mindspore", "lr_schedule": "constant",
              "seed": seed, "dump_step": 0}
    model0 = fixtures.make_model(seed)
    # Same parameters, its own running statistics (as ranks hold after steps without buffer broadcast).
    model1 = fixtures.make_model(seed)
    with torch.no_grad():
        for name, b in model1.named_buffers():
            if name.endswith("running_mean"):
                b.add_(0.05)
            elif name.endswith("running_var"):
                b.mul_(1.5)
    batches = [fixtures.make_batch(seed), fixtures.make_batch(seed + 1)]
    run = tmp / "run_ddp.sqlite"
    fixtures.write_run(run, model0, *batches[0], config, step=0, rank=0, world_size=2)
    fixtures.add_rank_dump(run, model1, *batches[1], step=0, rank=1)
    singles = []
    for r, model in enumerate((model0, model1)):
        single = tmp / f"run_single{r}.sqlite"
        fixtures.write_run(single, model, *batches[r], config, step=0, rank=0, world_size=1)
        rc, _, err = fixtures.run_torch_step(single, tmp / f"ref_single{r}.safetensors", "--threads", 2, "--no-noise")
        check(rc == 0, f"torch_step.py on rank {r}'s batch alone exited {rc}: {err}")
        singles.append(wbformat.read_safetensors(tmp / f"ref_single{r}.safetensors")[0])
    t0 = time.time()
    rc, _, err = fixtures.run_torch_step(run, tmp / "ref_ddp.safetensors", "--threads", 2, "--rank", 1)
    seconds = time.time() - t0
    check(rc == 0, f"torch_step.py on the 2-rank run exited {rc}: {err}")
    t, meta = wbformat.read_safetensors(tmp / "ref_ddp.safetensors")

    check(json.loads(meta["wb.not_comparable"]) == [] and json.loads(meta["wb.caveats"]) == [],
          f"every rank dumped: everything comparable, got {meta['wb.not_comparable']} {meta['wb.caveats']}")
    check(json.loads(meta["wb.replayed_ranks"]) == [0, 1] and meta["rank"] == "1", "replayed ranks / rank metadata")
    check("NOTE:" not in err and "replaying all 2 ranks" in err, f"stderr: {err}")
    check(list(t) == expected_keys(model1, True), "keys differ from the contract")

    # Rank 1's side of the step is exactly its single-rank replay: batch, state, forward, loss, BN update.
    own = [k for k in t if k.split(".")[0] in ("input", "label", "param", "buffer", "act", "loss", "buffer_after")]
    worst_own = max((rel_err(t[k], singles[1][k]), k) for k in own)
    check(worst_own[0] <= 1e-6, f"{worst_own[1]} differs from rank 1's own replay by {worst_own[0]:.3g}")
    check(not np.array_equal(t["buffer_after.bn1.running_mean"], singles[0]["buffer_after.bn1.running_mean"]),
          "rank 1's running stats must come from its own batch, not rank 0's")

    # Gradients: the mean of the two single-rank gradients; far from either one alone.
    params = dict(model1.named_parameters())
    worst_grad, apart = (0.0, ""), 0
    for n in params:
        mean = (singles[0][f"grad.{n}"].astype(np.float64) + singles[1][f"grad.{n}"]) / 2
        worst_grad = max(worst_grad, (rel_err(t[f"grad.{n}"], mean), n))
        apart += rel_err(t[f"grad.{n}"], singles[1][f"grad.{n}"]) > 1e-2
    check(worst_grad[0] <= 1e-6, f"grad.{worst_grad[1]} is off the mean of the ranks by {worst_grad[0]:.3g}")
    check(apart >= 150, f"only {apart} of {len(params)} averaged gradients differ from rank 1's own")

    # One SGD step on the average (first step: buf = d = g + wd * p in the decay group).
    worst_sgd = 0.0
    for n, p in params.items():
        p0 = t[f"param.{n}"].astype(np.float64)
        d = t[f"grad.{n}"] + (wd if fixtures.decays(n, list(p.shape)) else 0.0) * p0
        worst_sgd = max(worst_sgd, rel_err(t[f"param_after.{n}"], p0 - lr * d), rel_err(t[f"momentum.{n}"], d))
    check(worst_sgd <= 1e-6, f"param_after/momentum off one SGD step on the averaged gradients by {worst_sgd:.3g}")

    # wb.noise of the DDP replay: its float64 replay averaged the two ranks too (the averaged gradient is
    # far from rank 1's own, so a float64 side without the average could not be this close).
    noise = read_noise(meta)
    check_noise_entries(noise, t)
    check("float64 rank 0: loss" in err, "the float64 replay did not replay rank 0")
    grads = {n: noise["tensors"].get(f"grad.{n}") for n in params}
    check(all(grads.values()), f"wb.noise lacks grads: {[n for n, e in grads.items() if not e][:4]}")
    check(all(f"momentum.{n}" in noise["updates"] for n in params), "wb.noise lacks momentum updates")
    below = sum(e["l2"] / e["ref_l2"] < rel_err(t[f"grad.{n}"], singles[1][f"grad.{n}"]) / 10
                for n, e in grads.items() if e["ref_l2"] > 0)
    check(below >= 150, f"the float64 grads are within a tenth of rank 1's own distance on only {below}/{len(params)}")
    grad_rel = sorted(e["l2"] / e["ref_l2"] for e in grads.values() if e["ref_l2"] > 0)
    print(f"  ddp_two_ranks: {seconds:.1f} s; rank 1's tensors within {worst_own[0]:.2g} of its own replay; "
          f"averaged grads within {worst_grad[0]:.2g} of the mean of two single-rank replays ({apart}/{len(params)} "
          f"differ from rank 1's alone by > 1e-2); SGD on the average within {worst_sgd:.2g}; grad noise median "
          f"rel-L2 {grad_rel[len(grad_rel) // 2]:.2g}, under a tenth of the averaging's effect on {below}")


def verify_bn_flips():
    """torch_step's batch norm flips, against numpy: which channels of a two-value batch norm it deems
    within their noise, and that flipping one turns its output the other way (2 beta - out) and nothing
    else, forward and backward."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    import torch_step
    rng = np.random.default_rng(5)
    # Two samples, 4 channels, 1x1: channel c's values differ by d[c]; float32 noise of rms 0.01 per value.
    d = np.array([0.001, 0.5, -0.004, 0.2])
    x64 = np.zeros((2, 4, 1, 1))
    x64[0, :, 0, 0], x64[1, :, 0, 0] = 1.0 + d / 2, 1.0 - d / 2
    e = rng.choice([-0.01, 0.01], size=x64.shape)  # rms exactly 0.01 per channel
    x32 = x64 + e
    spread = np.abs(d) / 2  # the population standard deviation of two values
    want = spread < 1.0 * 0.01
    flips, near, total = torch_step.bn_flips([torch.from_numpy(x32)], [torch.from_numpy(x64)], 1.0)
    check(total == 4 and near == int(want.sum()) == 2, f"bn_flips: {near} of {total} channels, expected 2 of 4")
    check(np.array_equal(flips[0].numpy(), want), f"bn_flips flagged {flips[0].numpy()}, expected {want}")
    # A batch norm over more than BN_FLIP_COUNT values per channel is not recorded at all.
    bn = torch.nn.BatchNorm2d(4).double().train()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.5, 0.5, 2.0, 1.0]))
        bn.bias.copy_(torch.tensor([0.25, -0.5, 0.0, 1.0]))
    model = torch.nn.Sequential(bn)
    recorder = torch_step.ReluProbe()
    recorder.install(model)
    model(torch.zeros(2, 4, 1, 1, dtype=torch.float64))
    model(torch.zeros(2, 4, 8, 8, dtype=torch.float64))  # 128 values per channel
    check(len(recorder.bn_inputs) == 2 and recorder.bn_inputs[0] is not None and recorder.bn_inputs[1] is None,
          "ReluProbe records the input of a batch norm over a few values, and only of such")
    # Flipping channel 0 of the second call: out = 2 beta - out there, the rest untouched, and the backward
    # follows (d out / d x of channel 0 changes sign). W weighs each element (a batch norm's gradient of a
    # weight constant over a channel is zero).
    W = torch.from_numpy(rng.standard_normal((2, 4, 1, 1)))
    x = torch.from_numpy(x64).clone().requires_grad_(True)
    plain = bn(x)
    (plain * W).sum().backward()
    grad_plain = x.grad.clone()
    model = torch.nn.Sequential(bn)
    flipper = torch_step.ReluProbe({}, {1: torch.tensor([True, False, False, False])})
    flipper.install(model)
    model(x.detach())  # call 0: no flips
    x.grad = None
    out = model(x)
    (out * W).sum().backward()
    mean = x64.mean(axis=(0, 2, 3), keepdims=True)
    normed = (x64 - mean) / np.sqrt(x64.var(axis=(0, 2, 3), keepdims=True) + bn.eps)
    gamma, beta = bn.weight.detach().numpy().reshape(1, 4, 1, 1), bn.bias.detach().numpy().reshape(1, 4, 1, 1)
    expected = gamma * normed + beta
    expected[:, 0] = 2 * beta[:, 0] - expected[:, 0]
    check(np.allclose(out.detach().numpy(), expected, atol=1e-12), "a flipped channel is 2 beta - out, the others as before")
    want_grad = grad_plain.numpy().copy()
    want_grad[:, 0] = -want_grad[:, 0]
    check(np.abs(grad_plain.numpy()[:, 0]).max() > 0 and np.allclose(x.grad.numpy(), want_grad, atol=1e-12),
          "the backward of a flipped channel is the plain one negated, the others as before")
    print(f"  bn flips: {near} of {total} channels within their noise, flipped channel 0 as 2 beta - out")


def main():
    tmp = fixtures.tmp_dir_from_argv()
    verify_bn_flips()
    base = {"momentum": 0.9, "wd": 0.01, "rank": 0, "world_size": 1, "step": 1}
    cases = [
        dict(base, name="mindspore_plain", seed=11, convention="mindspore", smoothing=0.1, nesterov=False,
             config_lr=0.05, step_rows=[(1, 0.1)]),
        # The table, not the name rule, decides: fc.bias decays here.
        dict(base, name="torch_nesterov", seed=12, convention="torch", smoothing=0.2, nesterov=True,
             config_lr=0.1, step_rows=[], must_tell=["fc.bias"],
             decay=lambda n, s: fixtures.decays(n, s) or n == "fc.bias"),
    ]
    verify_full(tmp, cases[0], keep_as=tmp / "torch_step_ref.safetensors")
    verify_noise(tmp, cases[0], tmp / "torch_step_ref.safetensors")
    verify_full(tmp, dict(cases[1], extra=["--no-noise"]))
    verify_multi_rank(tmp, dict(base, name="two_ranks", seed=13, convention="mindspore", smoothing=0.1,
                                nesterov=False, config_lr=0.1, rank=1, world_size=2, step=3,
                                step_rows=[(1, 0.05), (2, 0.06), (3, 0.07)], extra=["--no-noise"]))
    verify_ddp(tmp, seed=14)
    print("test_torch_step: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except fixtures.CheckFailed as e:
        print(f"test_torch_step: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
