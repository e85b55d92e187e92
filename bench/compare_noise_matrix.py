#!/usr/bin/python3
"""False alarms and detection of `wb compare`'s verdicts, on correct runs and planted faults.

Each case is a real wb-train step (`--steps 1 --dump-step 0`, synthetic data) against its PyTorch replay
(compare/reference/torch_step.py, which also replays the step in float64 to record the reference's own
float32 noise), compared twice with the default migration-fp32 profile:
  fixed   the fixed thresholds alone (a mapping file sets noise_k to null): the verdicts before noise
  noise   within max(floor, k x the reference's own noise): the verdicts now
A correct run must pass both ways; every FAIL on one is a false alarm. Faults planted into the replay
(torch_step.py --fault NAME) must fail, first at the tensor where each shows.

    bench/compare_noise_matrix.py [--quick] [--seeds N] [--only SUBSTRING] [--faults [--fault NAME,...]]
                                  [--ours [--isas LIST]] [--cap-isa ISA]
                                  [--out DIR]

--quick runs two correct cases, seed 1 (the test suite runs it); the default runs the whole matrix:
batch 2, 4, 8, 32 at 32x32; 224x224; 2 ranks; a pipeline with micro-batches of 2 and 4; --sync-bn
global; --shard-fc 2; --threads 1 and 2; ONEDNN_MAX_CPU_ISA=AVX2; 3 seeds each. --faults adds the
detection table at batch 4 and 32 and the sensitivity to a random error planted on one gradient;
--fault limits the table to the faults named (and leaves the sensitivity out). --ours judges by our own
step's noise instead, as for a reference that records none: each reference is made with --no-noise, and
each run gets `wb estimate-noise` (--isas: its replays' kernels, else its default for this machine).
--cap-isa runs everything under ONEDNN_MAX_CPU_ISA, as on a machine whose best that is: --cap-isa AVX2
--isas SSE41,ref is an AVX2-only machine's default.
The last line is the count of false FAILs before and after, and the margin: the worst error / bound
of any tensor on a correct run (under 1 passes).
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

# --ours: references without their own noise (torch_step.py --no-noise), judged by our step's noise
# instead (wb estimate-noise on each run).
OURS = False
# --isas: wb estimate-noise's --isa flags (default: its own choice for this machine). --cap-isa: every run
# under ONEDNN_MAX_CPU_ISA=ISA, as on a machine whose best is ISA (--cap-isa AVX2 --isas SSE41,ref is what
# an AVX2-only machine runs by default).
ISAS = []
CAP_ISA = None

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(os.environ.get("WB_BUILD_DIR", ROOT / "build")) / "bin"
PY = os.environ.get("WB_PYTHON", "/usr/bin/python3")
TORCH_STEP = ROOT / "compare" / "reference" / "torch_step.py"

# name, wb-train flags, torch_step threads, extra environment
MATRIX = [
    ("b2", "--batch-size 2", {}),
    ("b4", "--batch-size 4", {}),
    ("b8", "--batch-size 8", {}),
    ("b32", "--batch-size 32", {}),
    ("b4-t1", "--batch-size 4 --threads 1", {}),
    ("b8-t1", "--batch-size 8 --threads 1", {}),
    ("b4-t2", "--batch-size 4 --threads 2", {}),
    ("b4-avx2", "--batch-size 4", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("224-b2", "--batch-size 2 --image-size 224", {}),
    ("2rank-b4", "--nproc 2 --batch-size 4 --dump-ranks all", {}),
    ("pipe-m2", "--nproc 2 --pipeline-stages 2 --micro-batches 2 --batch-size 8", {}),
    ("pipe-m4", "--nproc 2 --pipeline-stages 2 --micro-batches 4 --batch-size 16", {}),
    ("syncbn-global", "--nproc 2 --sync-bn global --batch-size 4 --dump-ranks all", {}),
    ("shard-fc2", "--nproc 2 --shard-fc 2 --batch-size 4 --dump-ranks all", {}),
]
QUICK = ["b4", "2rank-b4"]

# planted fault -> the tensor (or prefix ending in '.') where it must first show, then the tensors where it
# may first show instead when it is smaller than the reference's own noise at the first one (written
# "alt" in the table): the loss of a batch of 4 at 32x32 carries float32 noise of about 2e-4, more than
# dropping label smoothing changes it (1.6e-4), and weight decay on BatchNorm moves an update by wd x p,
# under the gradients' noise there, while the momentum buffer's optimizer share (momentum - grad) shows it.
FAULTS = {
    "bn_eps": ("act.layer2.1.bn2",),
    "conv_transpose": ("act.layer3.0.conv2",),
    "missing_relu": ("act.layer1.1.relu.0",),
    "stride": ("act.layer2.0.conv2",),
    "no_smoothing": ("loss", "grad.fc."),
    "grad_scale": ("grad.layer4.2.conv3.weight",),
    "bn_momentum": ("buffer_after.layer3.1.bn1.",),
    "lr": ("param_after.",),
    "nesterov": ("param_after.",),
    "wd_on_bn": ("param_after.", "momentum."),
}


def named(name, expected):
    return name == expected or (expected.endswith(".") and name.startswith(expected))


def sh(cmd, env=None, cwd=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, shell=True, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True)
    return r, time.monotonic() - t0


def need_ok(r, what):
    if r.returncode != 0:
        sys.exit(f"compare_noise_matrix: {what} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def train(work, name, flags, seed, env):
    if CAP_ISA and "ONEDNN_MAX_CPU_ISA" not in env:
        env = {**env, "ONEDNN_MAX_CPU_ISA": CAP_ISA}
    run = work / f"{name}-s{seed}.sqlite"
    size = "" if "--image-size" in flags else "--image-size 32 "
    r, t = sh(f"{BIN / 'wb-train'} --data synthetic --synthetic-samples 64 --steps 1 --dump-step 0 --no-profile "
              f"{size}--seed {seed} --device cpu --precision fp32 {flags} --run {run}", env)
    need_ok(r, f"wb-train {name} seed {seed}")
    if OURS:
        r, _ = sh(f"{BIN / 'wb'} estimate-noise {run}" + "".join(f" --isa {i}" for i in ISAS), env)
        need_ok(r, f"wb estimate-noise {name} seed {seed}")
    return run, t


def replay(run, out, extra=""):
    if OURS:
        extra += " --no-noise"
    r, t = sh(f"{PY} {TORCH_STEP} {run} --out {out} {extra}")
    need_ok(r, f"torch_step.py {run.name} {extra}")
    return t


def compare(run, ref, out, mapping=None):
    r, _ = sh(f"{BIN / 'wb'} compare {run} {ref} --json {out} --no-save --no-color"
              + (f" --map {mapping}" if mapping else ""))
    if r.returncode not in (0, 1):
        need_ok(r, f"wb compare {run.name}")
    with open(out) as f:
        return json.load(f)


def worst_use(j):
    """The judged row nearest its bound (rows not judged, as ill-conditioned ones, do not count)."""
    best = (0.0, "-")
    for row in j["rows"]:
        u = row.get("bound_use")
        if row["status"] in ("pass", "fail") and isinstance(u, (int, float)) and u > best[0]:
            best = (u, row["name"])
    return best


def first_divergence(j):
    d = j.get("first_divergence")
    return d["name"] if d else "-"


def correct_cases(work, cases, seeds, fixed_map):
    print(f"{'case':15} {'seed':>4}  {'fixed: FAIL':>11}  {'noise: FAIL':>11}  {'not judged':>10}  {'worst use':>9}  "
          "at / first divergence", flush=True)
    totals = {"runs": 0, "fixed_runs": 0, "noise_runs": 0, "fixed_rows": 0, "noise_rows": 0}
    margin = (0.0, "-", "-")
    for name, flags, env in cases:
        for seed in range(1, seeds + 1):
            run, _ = train(work, name, flags, seed, env)
            ref = work / f"{name}-s{seed}.safetensors"
            replay(run, ref)
            fixed = compare(run, ref, work / "fixed.json", fixed_map)
            noise = compare(run, ref, work / "noise.json")
            use, at = worst_use(noise)
            if use > margin[0]:
                margin = (use, f"{name} seed {seed}", at)
            nf, nn = fixed["summary"]["failed"], noise["summary"]["failed"]
            totals["runs"] += 1
            totals["fixed_runs"] += nf > 0
            totals["noise_runs"] += nn > 0
            totals["fixed_rows"] += nf
            totals["noise_rows"] += nn
            where = first_divergence(noise) if nn else at
            print(f"{name:15} {seed:>4}  {nf:>11}  {nn:>11}  {noise['summary']['skipped']:>10}  {use:>9.3g}  {where}"
                  + (f"   (fixed: first {first_divergence(fixed)})" if nf else ""), flush=True)
            for p in (run, ref):
                p.unlink(missing_ok=True)
            for p in work.glob(f"{name}-s{seed}*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return totals, margin


def fault_cases(work, fixed_map, only=None):
    print(f"\n{'fault':15} {'batch':>5}  {'expected':32} {'noise: first divergence':40} {'fixed: first divergence':36}")
    missed = 0
    for batch in (4, 32):
        run, _ = train(work, f"fault-b{batch}", f"--batch-size {batch}", 1, {})
        for fault, (expected, *alternatives) in FAULTS.items():
            if only and fault not in only:
                continue
            ref = work / f"fault-{fault}.safetensors"
            replay(run, ref, f"--fault {fault}")
            got = {}
            for mode, mapping in (("noise", None), ("fixed", fixed_map)):
                j = compare(run, ref, work / f"{mode}.json", mapping)
                got[mode] = first_divergence(j)
            ok = named(got["noise"], expected)
            alt = not ok and any(named(got["noise"], a) for a in alternatives)
            missed += not (ok or alt)
            mark = "" if ok else ("  (alt)" if alt else "  MISSED")
            print(f"{fault:15} {batch:>5}  {expected:32} {got['noise'] + mark:40} {got['fixed']:36}", flush=True)
            ref.unlink(missing_ok=True)
        if not only:
            sensitivity(work, run, batch, fixed_map)
        run.unlink(missing_ok=True)
    return missed


def sensitivity(work, run, batch, fixed_map):
    """The smallest random relative error on one gradient that fails it, with and without noise."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "compare" / "reference"))
    import wbformat
    base = work / "clean.safetensors"
    replay(run, base)
    tensors, metadata = wbformat.read_safetensors(base)
    key = "grad.layer3.2.conv2.weight"
    rng = np.random.default_rng(0)
    g = tensors[key].astype(np.float64)
    direction = rng.standard_normal(g.shape)
    direction *= np.linalg.norm(g) / np.linalg.norm(direction)
    found = {}
    for eps in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1):
        planted = dict(tensors)
        planted[key] = (g + eps * direction).astype(np.float32)
        out = work / "planted.safetensors"
        wbformat.write_safetensors(out, planted, metadata)
        for mode, mapping in (("noise", None), ("fixed", fixed_map)):
            if mode in found:
                continue
            j = compare(run, out, work / f"{mode}.json", mapping)
            row = next(r for r in j["rows"] if r["name"] == key)
            if row["status"] == "fail":
                found[mode] = eps
        if len(found) == 2:
            break
    print(f"sensitivity at batch {batch}: a random error of relative size e on {key} fails from "
          f"e = {found.get('noise', '>0.3')} with noise, {found.get('fixed', '>0.3')} with fixed thresholds")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few correct cases, one seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--faults", action="store_true", help="also the detection table and the sensitivity")
    parser.add_argument("--no-correct", action="store_true", help="skip the correct cases")
    parser.add_argument("--fault", help="with --faults: only these faults (comma-separated), no sensitivity")
    parser.add_argument("--out", help="keep the work files here (default: a temporary folder)")
    parser.add_argument("--ours", action="store_true",
                        help="references without noise of their own (torch_step.py --no-noise); each run's own noise "
                             "from wb estimate-noise instead")
    parser.add_argument("--isas", help="with --ours: wb estimate-noise's replays, comma-separated (e.g. SSE41,ref)")
    parser.add_argument("--cap-isa", help="every run under ONEDNN_MAX_CPU_ISA=ISA (a machine whose best is ISA)")
    args = parser.parse_args()
    global OURS, ISAS, CAP_ISA
    OURS = args.ours
    ISAS = args.isas.split(",") if args.isas else []
    CAP_ISA = args.cap_isa
    cases = [c for c in MATRIX if (not args.quick or c[0] in QUICK) and (not args.only or args.only in c[0])]
    seeds = 1 if args.quick else args.seeds
    work = pathlib.Path(args.out or tempfile.mkdtemp(prefix="wb-noise-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    fixed_map = work / "fixed-thresholds.json"
    fixed_map.write_text(json.dumps({"thresholds": [{"match": ".", "noise_k": None}]}))
    t0 = time.monotonic()
    totals, margin = {"runs": 0, "fixed_runs": 0, "noise_runs": 0, "fixed_rows": 0, "noise_rows": 0}, (0.0, "-", "-")
    if not args.no_correct:
        totals, margin = correct_cases(work, cases, seeds, fixed_map)
    only = None
    if args.fault:
        only = args.fault.split(",")
        unknown = [f for f in only if f not in FAULTS]
        if unknown:
            parser.error(f"--fault {','.join(unknown)}: expected one of {', '.join(FAULTS)}")
    missed = fault_cases(work, fixed_map, only) if args.faults else 0
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{time.monotonic() - t0:.0f} s" + (f"; {missed} planted faults missed" if args.faults else ""))
    print(f"false FAILs on {totals['runs']} correct runs: fixed thresholds {totals['fixed_runs']} runs "
          f"({totals['fixed_rows']} tensors), noise-aware {totals['noise_runs']} runs ({totals['noise_rows']} tensors); "
          f"margin: worst error/bound {margin[0]:.3g} ({margin[1]}, {margin[2]})")
    return 1 if totals["noise_runs"] or missed else 0


if __name__ == "__main__":
    sys.exit(main())
