#!/usr/bin/env python3
"""Predicted against measured step time of allreduce splits, for the calibrated model and the alpha-beta fit.

    bench/split_validate.py [--config NPROC,IMAGE,BATCH ...] [--rounds R] [--steps N] [--try 'S1|S2'] [RUN ...]

For each --config: a 20-step wb-train run (synthetic data, profiled, with the communicator's calibration),
then `wb tune-split` on it (the current split, the model's 3 best candidates and the --try splits,
alternated over R rounds). For each RUN given: its recorded trials (RUN's split_trial table) as they are.
Per candidate: the median of its measured round medians, both models' predictions and their errors; then
the median and worst absolute error of each model, over candidates other than the current split, measured
two ways: against the step itself, and as the change from the current split (predicted ratio against
measured ratio, which the base run's own noise does not enter). The last line is the ratio of the two
models' median errors (alpha-beta / calibrated; above 1: the calibrated model is closer).
"""
import argparse
import os
import sqlite3
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("WB_BUILD_DIR", os.path.join(ROOT, "build")) + "/bin"


def make_run(nproc, image, batch, rounds, steps, tries, out_dir):
    run = os.path.join(out_dir, f"split-validate-n{nproc}-i{image}-b{batch}.sqlite")
    for path in (run,):
        if os.path.exists(path):
            os.remove(path)
    subprocess.run([f"{BIN}/wb-train", "--data", "synthetic", "--image-size", str(image), "--batch-size", str(batch),
                    "--nproc", str(nproc), "--steps", "20", "--run", run], check=True, stdout=subprocess.DEVNULL)
    cmd = [f"{BIN}/wb", "tune-split", run, "--candidates", "3", "--rounds", str(rounds), "--steps", str(steps),
           "--warmup", "3"]
    if tries:
        cmd += ["--try", tries]
    subprocess.run(cmd, check=True)
    return run


def trials(run):
    db = sqlite3.connect(f"file:{run}?mode=ro", uri=True)
    rows = db.execute("SELECT candidate, split, median_step_ns, predicted_step_ns, alpha_beta_ns FROM split_trial "
                      "ORDER BY rowid").fetchall()
    by = {}
    for cand, split, measured, predicted, ab in rows:
        c = by.setdefault(cand, {"split": split, "measured": [], "predicted": predicted, "alpha_beta": ab})
        if measured > 0:
            c["measured"].append(measured)
    return {k: v for k, v in by.items() if v["measured"]}


def pct(x):
    return f"{100 * x:+.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--config", action="append", default=[], help="NPROC,IMAGE,BATCH")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--try", dest="tries", default="")
    ap.add_argument("--out-dir", default="/tmp")
    a = ap.parse_args()
    runs = list(a.runs)
    for c in a.config:
        try:
            nproc, image, batch = (int(x) for x in c.split(","))
        except ValueError:
            sys.exit(f"split_validate: --config {c!r}: expected NPROC,IMAGE,BATCH")
        runs.append(make_run(nproc, image, batch, a.rounds, a.steps, a.tries, a.out_dir))
    if not runs:
        sys.exit("split_validate: give --config NPROC,IMAGE,BATCH or run files with wb tune-split trials")
    errs = {"calibrated": [], "alpha-beta": []}
    ratio_errs = {"calibrated": [], "alpha-beta": []}
    print(f"{'run':40} {'candidate':26} {'measured':>10} {'calibrated':>10} {'err':>7} {'alpha-beta':>10} {'err':>7} "
          f"{'d err':>7} {'d err ab':>8}")
    for run in runs:
        t = trials(run)
        if "current" not in t:
            print(f"{run}: no measured trial of the current split", file=sys.stderr)
            continue
        cur = t["current"]
        cur_meas = statistics.median(cur["measured"])
        for name, c in t.items():
            meas = statistics.median(c["measured"])
            e_new = c["predicted"] / meas - 1
            e_old = c["alpha_beta"] / meas - 1
            # The change from the current split, predicted against measured.
            d_new = (c["predicted"] / cur["predicted"]) / (meas / cur_meas) - 1
            d_old = (c["alpha_beta"] / cur["alpha_beta"]) / (meas / cur_meas) - 1
            print(f"{os.path.basename(run)[:40]:40} {name[:26]:26} {meas / 1e6:8.1f}ms {c['predicted'] / 1e6:8.1f}ms "
                  f"{pct(e_new):>7} {c['alpha_beta'] / 1e6:8.1f}ms {pct(e_old):>7} {pct(d_new):>7} {pct(d_old):>8}")
            errs["calibrated"].append(abs(e_new))
            errs["alpha-beta"].append(abs(e_old))
            if name != "current":
                ratio_errs["calibrated"].append(abs(d_new))
                ratio_errs["alpha-beta"].append(abs(d_old))
    for label, e in (("step", errs), ("change from current", ratio_errs)):
        if not e["calibrated"]:
            continue
        print(f"{label}: calibrated median {100 * statistics.median(e['calibrated']):.1f}%, worst "
              f"{100 * max(e['calibrated']):.1f}%; alpha-beta median {100 * statistics.median(e['alpha-beta']):.1f}%, "
              f"worst {100 * max(e['alpha-beta']):.1f}%")
    print(f"alpha-beta / calibrated median error of the change: "
          f"{statistics.median(ratio_errs['alpha-beta']) / max(statistics.median(ratio_errs['calibrated']), 1e-9):.2f}")


if __name__ == "__main__":
    main()
