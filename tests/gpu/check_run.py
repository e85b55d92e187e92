#!/usr/bin/env python3
"""Checks a GPU run file (wb-train --device cuda --profile) in SQL, with the standard library only.

  check_run.py RUN kernels [--min-linked 0.95]   kernel rows, their link to the launching op range, timestamps
  check_run.py RUN memory                         the CUDA memory events (allocator events of the run)

Prints one line of figures per check and exits 1 when a check fails (the reason on the last line).
"""
import argparse
import sqlite3
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def kernels(db, min_linked):
    total, = db.execute("SELECT COUNT(*) FROM kernel WHERE kind = 0").fetchone()
    if total == 0:
        fail("no kernel rows (CUPTI recorded nothing; see the run's meta gpu_trace)")
    linked, = db.execute(
        "SELECT COUNT(*) FROM kernel k WHERE k.kind = 0 AND k.corr_id != 0 "
        "AND EXISTS (SELECT 1 FROM range r WHERE r.corr_id = k.corr_id)").fetchone()
    bad_span, = db.execute("SELECT COUNT(*) FROM kernel WHERE end_ns < start_ns OR start_ns <= 0").fetchone()
    # A kernel cannot start before the host range that launched it began (one clock: CUPTI's timestamps
    # come from the profiler's own clock). 1 us of slack for the two reads of the clock.
    early, = db.execute(
        "SELECT COUNT(*) FROM kernel k JOIN (SELECT corr_id, MIN(start_ns) AS s FROM range WHERE corr_id != 0 "
        "GROUP BY corr_id) r ON r.corr_id = k.corr_id WHERE k.kind = 0 AND k.start_ns < r.s - 1000").fetchone()
    lo, hi = db.execute("SELECT MIN(start_ns), MAX(end_ns) FROM step").fetchone()
    outside = 0
    if lo is not None:
        outside, = db.execute("SELECT COUNT(*) FROM kernel WHERE kind = 0 AND (end_ns < ? OR start_ns > ?)",
                              (lo - 10**9, hi + 10**9)).fetchone()
    top = db.execute(
        "SELECT s.text, COUNT(*), SUM(k.end_ns - k.start_ns) FROM kernel k JOIN range r ON r.corr_id = k.corr_id "
        "JOIN string s ON s.id = r.name_id WHERE k.kind = 0 AND k.corr_id != 0 GROUP BY s.text "
        "ORDER BY 3 DESC LIMIT 5").fetchall()
    share = linked / total
    print(f"kernels {total}, linked to their op {linked} ({100 * share:.1f}%), end before start {bad_span}, "
          f"before their launch {early}, more than 1 s outside the steps {outside}")
    for name, n, ns in top:
        print(f"  {name:32s} {n:7d} kernels {ns / 1e6:10.3f} ms")
    if share < min_linked:
        fail(f"{100 * share:.1f}% of kernels linked to their op, below {100 * min_linked:.0f}%")
    if bad_span:
        fail(f"{bad_span} kernel rows end before they start or have no time")
    if early > total // 1000:
        fail(f"{early} kernels start before the host range that launched them")
    if outside:
        fail(f"{outside} kernels lie more than 1 s outside the run's steps")


def memory(db):
    n, = db.execute("SELECT COUNT(*) FROM memory").fetchone()
    if n == 0:
        fail("no memory events in the run")
    roles = {r for r, in db.execute("SELECT DISTINCT role FROM memory")}
    negative, = db.execute("SELECT COUNT(*) FROM memory WHERE live_bytes < 0").fetchone()
    peak, = db.execute("SELECT MAX(live_bytes) FROM memory").fetchone()
    params, = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM memory WHERE role = 2 AND bytes > 0").fetchone()
    steps = db.execute("SELECT COUNT(DISTINCT step) FROM memory WHERE step >= 0").fetchone()[0]
    print(f"memory events {n}, roles {sorted(roles)}, steps with events {steps}, peak {peak / 2**20:.1f} MiB, "
          f"parameters {params / 2**20:.1f} MiB, negative live bytes {negative}")
    if negative:
        fail("live bytes below zero: a free without its allocation")
    if not {0, 2} <= roles:
        fail("expected activation (0) and parameter (2) events")
    if params < 90 * 2**20:
        fail(f"parameters hold {params / 2**20:.1f} MiB; ResNet-50's 25.6M fp32 parameters need about 98 MiB")
    if peak <= params:
        fail("the peak is not above the parameters' bytes")
    total = db.execute("SELECT value FROM meta WHERE key = 'device_total_memory'").fetchone()
    print(f"device memory {int(total[0]) / 2**30:.1f} GiB (meta device_total_memory)" if total else
          "device memory: no meta device_total_memory")
    if not total or int(total[0]) <= peak:
        fail("meta device_total_memory is missing or not above the run's peak")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("check", choices=["kernels", "memory"])
    ap.add_argument("--min-linked", type=float, default=0.95)
    a = ap.parse_args()
    try:
        db = sqlite3.connect(f"file:{a.run}?mode=ro", uri=True)
        if a.check == "kernels":
            kernels(db, a.min_linked)
        else:
            memory(db)
    except sqlite3.Error as e:
        fail(f"{a.run}: {e}")


if __name__ == "__main__":
    main()
