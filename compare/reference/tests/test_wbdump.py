"""wbdump.StepDumper: a user's script dumps the same tensors as torch_step.py replays from a run file,
and the naming rules hold on small models (repeated calls, tuple outputs, containers, DataParallel,
module selection, BF16), with misuse reported as errors.

Usage: test_wbdump.py [--tmp DIR]
"""

import json
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
    rc, _, err = fixtures.run_torch_step(run, out_ref, "--threads", 2)
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


def main():
    tmp = fixtures.tmp_dir_from_argv()
    naming_rules(tmp)
    micro_batches(tmp)
    same_step_as_torch_step(tmp)
    print("test_wbdump: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except fixtures.CheckFailed as e:
        print(f"test_wbdump: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
