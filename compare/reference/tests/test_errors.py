"""torch_step.py on bad input: exit 2, nothing on stdout, and exactly one line on stderr that names the
file (or flag) and says what was expected. No output file is left behind.

Usage: test_errors.py [--tmp DIR]
"""

import json
import shutil
import sqlite3
import sys
import time

import fixtures
from fixtures import check


def expect_error(tmp, name, run, phrase, *extra, names=None):
    out = tmp / f"{name}.safetensors"
    t0 = time.time()
    rc, stdout, stderr = fixtures.run_torch_step(run, out, *extra)
    seconds = time.time() - t0
    lines = stderr.splitlines()
    check(rc == 2, f"{name}: exit {rc}, expected 2 (stderr: {stderr.strip()})")
    check(stdout == "", f"{name}: stdout not empty: {stdout!r}")
    check(len(lines) == 1, f"{name}: {len(lines)} stderr lines, expected 1: {lines}")
    line = lines[0]
    check(line.startswith("torch_step.py: error: "), f"{name}: {line}")
    check(str(names if names is not None else run) in line, f"{name}: the line does not name {names or run}: {line}")
    check(phrase in line, f"{name}: expected '{phrase}' in: {line}")
    check(not out.exists(), f"{name}: an output file was written")
    print(f"  {name} ({seconds:.1f} s): {line}")


def edit(src, dst, *statements):
    shutil.copyfile(src, dst)
    db = sqlite3.connect(dst)
    for sql, args in statements:
        db.execute(sql, args)
    db.commit()
    db.close()
    return dst


def main():
    tmp = fixtures.tmp_dir_from_argv()
    config = {"num_classes": 10, "image_size": 32, "batch_size": 4, "lr": 0.1, "momentum": 0.9,
              "weight_decay": 1e-4, "nesterov": False, "label_smoothing": 0.1, "loss_convention": "mindspore",
              "lr_schedule": "constant", "seed": 1, "dump_step": 1}

    # Files that are not run files at all.
    expect_error(tmp, "missing_file", tmp / "does_not_exist.sqlite", "no such run file")
    text = tmp / "notes.txt"
    text.write_text("step,loss\n1,2.3\n")
    expect_error(tmp, "text_file", text, "not a wb run file (expected an SQLite database")
    other = tmp / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t(x)")
    db.commit()
    db.close()
    expect_error(tmp, "other_sqlite", other, "not a wb run file (no meta, param, tensor table")
    newer = tmp / "newer.sqlite"
    db = fixtures.create_run(newer, config)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    expect_error(tmp, "newer_schema", newer, "schema version 99 is not supported")

    # A run file without a dump.
    empty = tmp / "no_dump.sqlite"
    fixtures.create_run(empty, config).close()
    expect_error(tmp, "no_dump", empty, "run file has no dumped step (expected tensors of source 'run'")

    # A run file with a dump, and broken variants of it.
    model = fixtures.make_model(5)
    x, y = fixtures.make_batch(5)
    good = tmp / "good.sqlite"
    fixtures.write_run(good, model, x, y, config)
    expect_error(tmp, "wrong_rank", good, "no dumped step on rank 1 (dumped ranks: 0", "--rank", 1)
    expect_error(tmp, "wrong_step", good, "step 5 is not dumped on rank 0 (dumped steps: 1)", "--step", 5)
    cfg = dict(config)
    del cfg["momentum"]
    expect_error(tmp, "no_momentum", edit(good, tmp / "no_momentum.sqlite",
                                          ("UPDATE meta SET value = ? WHERE key = 'config_json'", (json.dumps(cfg),))),
                 "config_json has no 'momentum' (expected a number)")
    cfg = dict(config, loss_convention="keras")
    expect_error(tmp, "bad_convention", edit(good, tmp / "bad_convention.sqlite",
                                             ("UPDATE meta SET value = ? WHERE key = 'config_json'", (json.dumps(cfg),))),
                 "loss_convention is 'keras', expected one of mindspore, torch")
    expect_error(tmp, "truncated_blob", edit(good, tmp / "truncated.sqlite",
                                             ("UPDATE tensor SET data = substr(data, 1, 100) WHERE kind = 'input'", ())),
                 "tensor 'input' has 100 bytes of data, expected 49152 for F32[4, 3, 32, 32]")
    expect_error(tmp, "missing_param", edit(good, tmp / "missing_param.sqlite",
                                            ("DELETE FROM tensor WHERE name = 'layer3.2.conv2.weight'", ())),
                 "dump lacks 1 of the 320 tensors torchvision's resnet50 needs: param.layer3.2.conv2.weight")
    cfg = dict(config, num_classes=7)
    expect_error(tmp, "wrong_classes", edit(good, tmp / "wrong_classes.sqlite",
                                            ("UPDATE meta SET value = ? WHERE key = 'config_json'", (json.dumps(cfg),))),
                 "tensor 'param.fc.weight' is F32[10, 2048], expected F32[7, 2048]")

    # Every rank of a 2-rank job dumped the step, but rank 1 does not start from rank 0's parameters.
    replicas = tmp / "replicas.sqlite"
    fixtures.write_run(replicas, model, x, y, config, world_size=2)
    fixtures.add_rank_dump(replicas, fixtures.make_model(6), x, y, step=1, rank=1)
    expect_error(tmp, "replicas_differ", replicas,
                 "tensor 'param.conv1.weight' of rank 1 differs from rank 0's (expected every rank to start")

    # A flag the parser rejects also exits 2 (argparse prints its usage line first).
    rc, _, stderr = fixtures.run_torch_step(good, tmp / "x.safetensors", "--device", "tpu")
    check(rc == 2 and "--device" in stderr, f"bad --device: exit {rc}: {stderr}")
    print("  bad --device: exit 2")
    print("test_errors: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except fixtures.CheckFailed as e:
        print(f"test_errors: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
