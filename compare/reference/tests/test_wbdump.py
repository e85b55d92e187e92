"""wbdump.StepDumper: a user's script dumps the same tensors as torch_step.py replays from a run file,
and the naming rules hold on small models (repeated calls, tuple outputs, containers, DataParallel,
module selection, BF16), with misuse reported as errors; the "wb.noise" helpers (noise_metadata,
NoiseMeter, a dumper's sink) against norms worked out by hand and against each other.

Usage: test_wbdump.py [--tmp DIR]
"""

import json
import math
import subprocess
import sys
import time

import numpy as np
import torch

import fixtures
from fixtures import check
import wbdump
import wbformat


def same_step_as_torch_step(tmp):
    seed = 21
    lr = 0.1
    out_user = tmp / "user_step1.safetensors"
    t0 = time.time()
    p = subprocess.run([sys.executable, str(fixtures.HERE / "train_with_wbdump.py"), "--seed", str(seed),
                        "--out", str(out_user), "--steps", "2", "--lr", str(lr)], capture_output=True, text=True)
    user_seconds = time.time() - t0
    check(p.returncode == 0, f"train_with_wbdump.py exited {p.returncode}: {p.stderr}")

    # The run file a wb-train dump of that step would hold, and torch_step.py's replay of it.
    model = fixtures.make_model(seed)
    x, y = fixtures.make_batch(seed)
    config = {"num_classes": 10, "image_size": 32, "batch_size": 4, "lr": lr, "momentum": 0.9,
              "weight_decay": 1e-4, "nesterov": True, "label_smoothing": 0.1, "loss_convention": "torch",
              "lr_schedule": "constant", "seed": seed, "dump_step": 1}
    run = tmp / "run_user.sqlite"
    fixtures.write_run(run, model, x, y, config)
    out_ref = tmp / "ref_user.safetensors"
    # (its wb.noise is test_torch_step.py's business; the float64 replay would only cost time here)
    rc, _, err = fixtures.run_torch_step(run, out_ref, "--threads", 2, "--no-noise")
    check(rc == 0, f"torch_step.py exited {rc}: {err}")

    user, user_meta = wbformat.read_safetensors(out_user)
    ref, ref_meta = wbformat.read_safetensors(out_ref)
    check(list(user) == list(ref), "wbdump and torch_step.py keys differ: "
          f"only wbdump {sorted(set(user) - set(ref))[:3]}, only torch_step {sorted(set(ref) - set(user))[:3]}")
    check(json.loads(user_meta["wb.exec_order"]) == json.loads(ref_meta["wb.exec_order"]), "exec orders differ")
    check(user_meta["wb.source"] == "wbdump.py" and user_meta["step"] == "1", "wbdump metadata")
    # The script hooks only its first step: the second forward added no activations.
    check(sum(k.startswith("act.") for k in user) == 174, "acts of the second step leaked into the dump")
    check(user["label"].dtype == np.int64 and np.array_equal(user["label"], ref["label"]), "label values")
    exact, worst = 0, (0.0, "")
    for key in ref:
        if key == "label":
            continue
        a, b = user[key], ref[key]
        check(a.dtype == b.dtype and a.shape == b.shape, f"{key}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        if np.array_equal(a, b):
            exact += 1
        else:
            worst = max(worst, (fixtures.rel_err(a, b), key))
    check(worst[0] <= 1e-6, f"{worst[1]} differs by rel {worst[0]:.3g}")
    print(f"  user script vs torch_step.py: {len(ref)} tensors, {exact} bit-exact, worst other rel err "
          f"{worst[0]:.2g} {worst[1]}; user script {user_seconds:.1f} s")


class Pair(torch.nn.Module):
    def forward(self, x):
        return x, x * 3


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.act = torch.nn.ReLU()
        self.bn = torch.nn.BatchNorm1d(3)
        self.pair = Pair()
        self.head = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())

    def forward(self, x):
        h = self.act(self.bn(self.lin(x)))
        h = self.act(h * 2 - 1)
        a, b = self.pair(h)
        return self.head(a + b)


def naming_rules(tmp):
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x = torch.randn(5, 3)
    d = wbdump.StepDumper(torch.nn.DataParallel(model), opt, out=tmp / "toy.safetensors",
                          metadata={"note": "toy", "cfg": {"a": 1}})
    d.begin({"image": x, "mask": x > 0}, [torch.arange(5)])
    logits = model(x)
    loss = d.loss(logits.square().mean())
    loss.backward()
    opt.step()
    path = d.end()
    t, meta = wbformat.read_safetensors(path)
    acts = [k for k in t if k.startswith("act.")]
    check(acts == ["act.lin", "act.bn", "act.act.0", "act.act.1", "act.pair[0]", "act.pair[1]",
                   "act.head.0", "act.head.1"], f"toy acts {acts}")
    with torch.no_grad():
        model2 = Toy()
        model2.load_state_dict({k: torch.from_numpy(np.array(t[f"param.{k}"] if f"param.{k}" in t
                                                              else t[f"buffer.{k}"]))
                                for k in model.state_dict()})
        h0 = torch.relu(torch.nn.functional.batch_norm(model2.lin(x), None, None, model2.bn.weight,
                                                       model2.bn.bias, training=True))
    check(np.array_equal(t["act.act.0"], h0.numpy()), "act.act.0 is the first relu call")
    check(np.array_equal(t["act.act.1"], torch.relu(h0 * 2 - 1).numpy()), "act.act.1 is the second relu call")
    check(np.array_equal(t["act.pair[1]"], t["act.pair[0]"] * 3), "tuple outputs")
    check(list(t)[:3] == ["input.image", "input.mask", "label.0"] and t["input.mask"].dtype == np.bool_,
          f"structured inputs {list(t)[:3]}")
    check("param.lin.weight" in t and "momentum.head.0.bias" in t, "DataParallel unwrapped, momentum present")
    check(np.array_equal(t["buffer_after.bn.num_batches_tracked"], np.array(1)), "buffers after the step")
    check(np.array_equal(t["param_after.lin.weight"], model.lin.weight.detach().numpy()), "param_after")
    check(meta["note"] == "toy" and json.loads(meta["cfg"]) == {"a": 1}, "user metadata")
    order = json.loads(meta["wb.exec_order"])
    check(order["loss"] == order["act.head.1"] + 1 and order["grad.head.0.bias"] == order["loss"] + 1,
          "exec order: acts, loss, then grads last layer first")

    # Module selection by name, and by predicate; no optimizer means no momentum.
    d = wbdump.StepDumper(model, out=tmp / "toy_sel.safetensors", modules=["act", "head"])
    d.begin(x)
    model(x).sum().backward()
    d.end()
    t, _ = wbformat.read_safetensors(tmp / "toy_sel.safetensors")
    acts = [k for k in t if k.startswith("act.")]
    check(acts == ["act.act.0", "act.act.1", "act.head"], f"selected acts {acts}")
    check(not any(k.startswith("momentum.") for k in t), "momentum without an optimizer")

    # BF16 models dump BF16, exactly.
    model_bf = Toy().to(torch.bfloat16)
    d = wbdump.StepDumper(model_bf, out=tmp / "toy_bf16.safetensors", modules=lambda n, m: n == "lin")
    xb = torch.randn(5, 3).to(torch.bfloat16)
    out_lin = model_bf.lin(xb)  # before begin(): a call inside the window would be dumped too
    d.begin(xb)
    model_bf(xb).float().sum().backward()
    d.end()
    header, _, _ = wbformat.read_safetensors_header(tmp / "toy_bf16.safetensors")
    t, _ = wbformat.read_safetensors(tmp / "toy_bf16.safetensors", widen_bf16=True)
    check(header["act.lin"]["dtype"] == "BF16" and header["input"]["dtype"] == "BF16", "BF16 dtype")
    check(np.array_equal(t["act.lin"], out_lin.float().detach().numpy()), "BF16 values")

    # Misuse gets an error, not a silent file.
    fresh = wbdump.StepDumper(model, out=tmp / "never.safetensors")
    errors = 0
    for call in (fresh.end, lambda: fresh.loss(torch.zeros(())), lambda: fresh.begin("not a tensor"),
                 lambda: wbdump.StepDumper(model, modules=["nope"]), lambda: wbdump.StepDumper(object())):
        try:
            call()
        except (RuntimeError, TypeError, ValueError):
            errors += 1
    check(errors == 5, f"{errors}/5 misuses raised")
    d = wbdump.StepDumper(model, out=tmp / "twice.safetensors")
    d.begin(x)
    try:
        d.begin(x)
        check(False, "begin() twice must raise")
    except RuntimeError as e:
        check("twice" in str(e), str(e))
    d.remove_hooks()
    check(not (tmp / "never.safetensors").exists(), "a misused dumper wrote a file")
    print("  naming rules: repeated calls, tuple outputs, containers, DataParallel, selection, BF16, misuse: ok")


def micro_batches(tmp):
    """micro_batches=M: M forwards over the batch's slices dump as one forward over the whole batch."""
    torch.manual_seed(1)
    model = Toy()
    x = torch.randn(6, 3)
    d = wbdump.StepDumper(model, out=tmp / "toy_micro.safetensors", micro_batches=3)
    d.begin(x)
    for part in x.chunk(3):
        model(part).sum().backward()
    d.end()
    t, _ = wbformat.read_safetensors(tmp / "toy_micro.safetensors")
    acts = [k for k in t if k.startswith("act.")]
    check(acts == ["act.lin", "act.bn", "act.act.0", "act.act.1", "act.pair[0]", "act.pair[1]",
                   "act.head.0", "act.head.1"], f"micro-batch acts {acts}")
    # Each slice's outputs, in slice order, from the model as it was (batch norm per slice).
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(np.array(t[f"param.{k}"] if f"param.{k}" in t
                                                             else t[f"buffer.{k}"]))
                               for k in model.state_dict()})
        want = torch.cat([torch.relu(torch.nn.functional.batch_norm(model.lin(p), None, None, model.bn.weight,
                                                                    model.bn.bias, training=True))
                          for p in x.chunk(3)])
    check(t["act.act.0"].shape == (6, 3), f"joined shape {t['act.act.0'].shape}")
    check(np.allclose(t["act.act.0"], want.numpy(), rtol=1e-6, atol=1e-7),
          "act.act.0 is the 3 slices' first relu calls, in order")
    check(np.allclose(t["act.lin"], model.lin(x).detach().numpy(), rtol=1e-6, atol=1e-7), "act.lin joins the slices")
    # Forwards that differ, or do not divide, are errors.
    d = wbdump.StepDumper(model, out=tmp / "toy_micro_bad.safetensors", micro_batches=4)
    d.begin(x)
    model(x)
    try:
        d.loss(torch.zeros(()))
        check(False, "7 calls in 4 micro-batches must raise")
    except ValueError as e:
        check("micro_batches=4" in str(e), str(e))
    try:
        wbdump.StepDumper(model, micro_batches=0)
        check(False, "micro_batches=0 must raise")
    except ValueError as e:
        check("micro_batches" in str(e), str(e))
    print("  micro-batches: outputs joined along the batch in order, mismatches raise: ok")


def noise_helpers(tmp):
    """noise_metadata on numbers whose norms are exact; NoiseMeter fed by a dumper's sink equals
    noise_metadata on two kept dumps; a dumper with a sink keeps and writes nothing."""
    f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
    ref32 = {"input": f32(1, 2), "param.w": f32(1, 2), "buffer.n": np.array(7, dtype=np.int64),
             "act.a": torch.tensor([1.0, 2.0]), "act.nan": f32(1, 2), "act.shape": f32(1, 2),
             "loss": np.array(3.0, dtype=np.float32), "grad.w": f32(3, 4), "param_after.w": f32(0, 2),
             "buffer_after.n": np.array(8, dtype=np.int64), "momentum.w": f32(3, 4)}
    # momentum before its grad, float64 tensors and arrays mixed, keys missing on either side.
    ref64 = {"momentum.w": np.array([3.5, 4.5]), "input": np.array([1.5, 2.0]), "param.w": np.array([1.0, 2.0]),
             "act.a": torch.tensor([1.5, 2.0], dtype=torch.float64), "act.nan": np.array([np.nan, 2.0]),
             "act.shape": np.array([1.0, 2.0, 3.0]), "act.only64": np.array([1.0]), "loss": np.array(3.25),
             "grad.w": np.array([3.0, 4.5]), "param_after.w": np.array([0.25, 2.0]),
             "buffer_after.n": np.array(9, dtype=np.int64)}
    noise = wbdump.noise_metadata(ref32, ref64)
    check(list(noise) == ["version", "method", "dtype", "tensors", "updates"] and noise["version"] == 1
          and noise["method"] == "float64 replay of the same step" and noise["dtype"] == "float64",
          f"noise header {[(k, noise[k]) for k in ('version', 'method', 'dtype')]}")
    want = {"act.a": {"l2": 0.5, "max_abs": 0.5, "ref_l2": 2.5}, "loss": {"l2": 0.25, "max_abs": 0.25, "ref_l2": 3.25},
            "grad.w": {"l2": 0.5, "max_abs": 0.5, "ref_l2": math.hypot(3.0, 4.5)},
            "param_after.w": {"l2": 0.25, "max_abs": 0.25, "ref_l2": math.hypot(0.25, 2.0)},
            "momentum.w": {"l2": math.hypot(0.5, 0.5), "max_abs": 0.5, "ref_l2": math.hypot(3.5, 4.5)}}
    check(set(noise["tensors"]) == set(want), f"noise tensors {sorted(noise['tensors'])}, expected {sorted(want)}")
    for key, entry in want.items():
        got = noise["tensors"][key]
        check(all(math.isclose(got[f], v, rel_tol=1e-15) for f, v in entry.items()), f"noise of {key}: {got} vs {entry}")
    # param_after: (after - before) of each side; momentum: (momentum - grad) of each side.
    updates = {"param_after.w": {"l2": 0.25, "ref_l2": 0.75}, "momentum.w": {"l2": 0.5, "ref_l2": 0.5}}
    check(noise["updates"] == updates, f"noise updates {noise['updates']}, expected {updates}")
    json.dumps(noise, allow_nan=False)  # finite numbers only

    # The same step of a toy model in float32 (kept) and float64 (through a sink, and kept).
    torch.manual_seed(3)
    model32 = Toy()
    x = torch.randn(6, 3)
    states = {k: v.clone() for k, v in model32.state_dict().items()}

    def step(dtype, **options):
        model = Toy().to(dtype)
        model.load_state_dict(states)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
        d = wbdump.StepDumper(model, opt, out=tmp / f"toy_{dtype}.safetensors".replace("torch.", ""), **options)
        d.begin(x.to(dtype))
        d.loss(model(x.to(dtype)).square().mean()).backward()
        opt.step()
        return d, d.end(write=False)

    for name in ("toy_float32.safetensors", "toy_float64.safetensors"):
        (tmp / name).unlink(missing_ok=True)
    d32, written = step(torch.float32)
    check(written is None and not (tmp / "toy_float32.safetensors").exists(), "end(write=False) wrote a file")
    d64, _ = step(torch.float64)
    meter = wbdump.NoiseMeter(d32.tensors())
    sunk, written = step(torch.float64, sink=meter.add)
    check(written is None and not (tmp / "toy_float64.safetensors").exists(), "a dumper with a sink wrote a file")
    check(sunk.tensors() == {} and sunk.keys() == d64.keys(), "a dumper with a sink keeps keys, not tensors")
    try:
        sunk.write()
        check(False, "write() of a dumper with a sink must raise")
    except RuntimeError:
        pass
    streamed, kept = meter.metadata(), wbdump.noise_metadata(d32.tensors(), d64.tensors())
    check(streamed == kept, "NoiseMeter through a sink differs from noise_metadata of the kept dumps")
    kinds = sorted({k.split(".")[0] for k in kept["tensors"]})
    check(kinds == ["act", "buffer_after", "grad", "loss", "momentum", "param_after"], f"toy noise kinds {kinds}")
    # (A bias feeding a batch norm has no gradient: float64 gives ~1e-17, float32 ~1e-8, so rel-L2 is
    # judged on the activations and the loss.)
    rel = [e["l2"] / e["ref_l2"] for k, e in kept["tensors"].items() if k.startswith(("act.", "loss"))]
    check(0 < max(rel) < 1e-5, f"toy float32 noise rel-L2 up to {max(rel):.3g}, expected (0, 1e-5)")
    check(set(kept["updates"]) == {f"{k}.{n}" for k in ("param_after", "momentum") for n, _ in model32.named_parameters()},
          f"toy updates {sorted(kept['updates'])}")
    d32.metadata["wb.noise"] = json.dumps(kept)
    _, meta = wbformat.read_safetensors(d32.write())
    check(json.loads(meta["wb.noise"]) == kept, "wb.noise does not survive the file")
    print(f"  noise helpers: hand-worked norms, sink == kept dumps ({len(kept['tensors'])} tensors, worst rel-L2 "
          f"{max(rel):.2g} on acts and loss), no file from a sink: ok")


def main():
    tmp = fixtures.tmp_dir_from_argv()
    naming_rules(tmp)
    micro_batches(tmp)
    noise_helpers(tmp)
    same_step_as_torch_step(tmp)
    print("test_wbdump: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except fixtures.CheckFailed as e:
        print(f"test_wbdump: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
