#!/usr/bin/env python3
"""`wb whatif`'s predictions against measured runs with the change planted.

    bench/whatif_validate.py [--nproc N] [--image PX] [--batch B] [--steps S] [--warmup W] [--rounds R]
                             [--slow-us US] [--data-delay-us D] [--out DIR]

A first base wb-train run (synthetic data, profiled) picks the splits. Each change is predicted with
`wb whatif --json` from a base run, and planted in real runs with wb-train's own flags:
  - a slow layer on one rank:   --slow-rank 1:layer3.0.conv2:US     /  --add 'rank:1&layer3.0.conv2&class:forward:+US'
  - a slow layer on every rank: --slow-rank all:layer3.0.conv2:US   /  --add 'layer3.0.conv2&class:forward:+US'
  - a slower input pipeline:    --data-delay-us D (per sample)       /  --add 'data:+D*B'
  - three allreduce splits:     --allreduce-split S                  /  --split S (the single bucket and the
                                                                       split model's two best other candidates)
Measured: R rounds; in each, every change runs once between two base runs (base, change, base, change,
..., base; the order of the changes reversed every other round); a run's step is the mean over its ranks'
steps from W on, and a change's measured ratio is the median over rounds of its step over the mean of the
two base runs around it. Its predicted ratio, per round, is whatif's predicted step over the measured step
of the base run just before it, the run it is predicted from (a single base run for every prediction let
one slow run, 20% slower than the rounds' bases on this shared machine, bias every ratio); the median over
rounds. Error: |predicted ratio / measured ratio - 1|, both medians.
The last line is the median and worst error over the changes.
"""
import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("WB_BUILD_DIR", os.path.join(ROOT, "build")) + "/bin"


def train(args, extra, run):
    if os.path.exists(run):
        os.remove(run)
    cmd = [f"{BIN}/wb-train", "--data", "synthetic", "--image-size", str(args.image), "--batch-size", str(args.batch),
           "--nproc", str(args.nproc), "--steps", str(args.steps), "--run", run] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def mean_step(run, warmup):
    with sqlite3.connect(f"file:{run}?mode=ro", uri=True) as db:
        d = [e - s for s, e in db.execute("SELECT start_ns, end_ns FROM step WHERE step >= ?", (warmup,))]
    return statistics.fmean(d)


def whatif(run, flags, warmup):
    out = subprocess.run([f"{BIN}/wb", "whatif", run, "--json", "--warmup", str(warmup)] + flags, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def model_splits(run):
    """The single bucket and the split model's two best other candidates: its pick, then its optimal (DP)
    split, MG-WFBP's or DDP's 25 MB buckets, whichever differ."""
    out = subprocess.run([f"{BIN}/wb", "suggest-split", run], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.search(r"--allreduce-split (\S+)", line)
        if not m:
            continue
        for key in ("model's pick", "optimal (DP)", "MG-WFBP", "DDP 25 MB", "current"):
            if key in line:
                found.setdefault(key, m.group(1))
    picked = ["none"]
    for key in ("model's pick", "optimal (DP)", "MG-WFBP", "DDP 25 MB"):
        s = found.get(key)
        if s and s not in picked and s != found.get("current") and len(picked) < 3:
            picked.append(s)
    return picked


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slow-us", type=int, default=100000, help="the planted slow layer's sleep per step")
    p.add_argument("--data-delay-us", type=int, default=80000)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "whatif-validate"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    base = os.path.join(args.out, "base.sqlite")
    train(args, [], base)
    d = args.data_delay_us
    u = args.slow_us
    changes = [
        (f"slow layer3.0.conv2 on rank 1, +{u // 1000} ms", ["--slow-rank", f"1:layer3.0.conv2:{u}"],
         ["--add", f"rank:1&layer3.0.conv2&class:forward:+{u}"]),
        (f"slow layer3.0.conv2 on every rank, +{u // 1000} ms", ["--slow-rank", f"all:layer3.0.conv2:{u}"],
         ["--add", f"layer3.0.conv2&class:forward:+{u}"]),
        (f"slower input, +{d} us per sample", ["--data-delay-us", str(d)], ["--add", f"data:+{d * args.batch}"]),
    ]
    for s in model_splits(base):
        changes.append((f"split {s if len(s) < 40 else s[:37] + '...'}", ["--allreduce-split", s], ["--split", s]))

    def predict(run, i):
        w = whatif(run, changes[i][2], args.warmup)
        print(f"predicted  {changes[i][0]}: {w['predicted_step_ns'] / 1e6:.1f} ms (base {w['measured_step_ns'] / 1e6:.1f} ms,"
              f" replayed {w['replay_step_ns'] / 1e6:.1f} ms)", flush=True)
        return w["predicted_step_ns"] / w["measured_step_ns"]

    predicted = [[] for _ in changes]
    ratios = [[] for _ in changes]
    for r in range(args.rounds):
        order = list(range(len(changes)))
        if r % 2 == 1:
            order.reverse()
        # base, change, base, change, ..., base: each change against the mean of the base runs around it.
        def base_run(k):
            run = os.path.join(args.out, f"round{r}-base{k}.sqlite")
            train(args, [], run)
            step = mean_step(run, args.warmup)
            print(f"round {r + 1}: base {step / 1e6:.1f} ms", flush=True)
            return step, run
        before, before_run = base_run(0)
        for k, i in enumerate(order):
            predicted[i].append(predict(before_run, i))
            run = os.path.join(args.out, f"round{r}-change{i}.sqlite")
            train(args, changes[i][1], run)
            step = mean_step(run, args.warmup)
            after, after_run = base_run(k + 1)
            ratio = step / ((before + after) / 2)
            ratios[i].append(ratio)
            print(f"round {r + 1}: {changes[i][0]}: {step / 1e6:.1f} ms ({ratio:.3f}x; predicted "
                  f"{predicted[i][-1]:.3f}x)", flush=True)
            before, before_run = after, after_run

    print(f"\n{'change':<46} {'predicted':>10} {'measured':>10} {'error':>7}")
    errors = []
    for (name, _, _), pred, meas in zip(changes, predicted, ratios):
        m = statistics.median(meas)
        pred = statistics.median(pred)
        err = abs(pred / m - 1.0)
        errors.append(err)
        print(f"{name:<46} {pred:>9.3f}x {m:>9.3f}x {100 * err:>6.1f}%")
    print(f"whatif change error over {len(errors)} changes: median {100 * statistics.median(errors):.1f}%,"
          f" worst {100 * max(errors):.1f}%")


if __name__ == "__main__":
    sys.exit(main())
