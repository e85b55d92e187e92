#!/usr/bin/python3
"""An independent oracle for `wb report RUN --json`: Holistic Trace Analysis (HTA)'s per-rank analyses.

    hta.py [OPTIONS] TRACE...                        print each trace's analyses as JSON
    hta.py [OPTIONS] --check REPORT.json TRACE...    compare a report's ranks[] with the traces

It reads PyTorch Kineto traces (Chrome trace JSON, .json or .json.gz, one per rank) with the standard
library only, and recomputes, from the rules of facebookresearch/HolisticTraceAnalysis (HEAD f4d0062,
cited below as "HTA <file>: <function>"), over sorted interval lists instead of pandas:

  temporal_breakdown_ns  HTA breakdown_analysis.py: get_temporal_breakdown
  kernel_breakdown_ns    HTA breakdown_analysis.py: _get_gpu_kernel_type_time (include_memory_kernels=True)
  overlap                HTA communication_analysis.py: get_comm_comp_overlap
  idle_breakdown_ns      HTA breakdown_analysis.py: get_idle_time_breakdown / _analyze_idle_time_for_stream
  launch                 HTA cuda_kernel_analysis.py: cuda_kernel_launch_stats
  queue_length           HTA trace_counters.py: _get_queue_length_time_series_for_rank and
                         get_queue_length_summary_from_time_series (pandas describe() per stream)

Units. HTA keeps Kineto's microseconds; its thresholds are microseconds too, whatever its docstrings
say (trace_analysis.py documents consecutive_kernel_delay=30 as "nanoseconds", but it is compared with
gaps of the us timestamps). This oracle works in integer nanoseconds, round(ts * 1000) exactly from the
decimal text, and scales the thresholds: 30 us = 30000 ns, 50 us, 100 us.

Deliberate HTA rules kept (HTA trace.py, Trace.load_traces(include_last_profiler_step=False)):
  the last profiler step is trimmed: when the trace holds two or more distinct ProfilerStep#N names,
  host events are kept only if they start before the start of the last ProfilerStep, and device rows
  only if a kept host event carries their "correlation" (--include-last-step: HTA's
  include_last_profiler_step=True, keep host events starting at or before the last step's end).

Deviations from HTA, each marked DEVIATION where implemented (--hta-literal switches 1, 2, 3 and 5
back to HTA's behaviour, --hta-us-rounding switches 4), are accidents of HTA's implementation:
  1. device rows are the events of cat kernel / gpu_memcpy / gpu_memset; HTA takes every row whose
     args.stream parses as a number other than -1, so it also counts cuda_sync rows ("Stream Wait
     Event", "Stream Sync") and Triton's cpu_op (args.stream = 0) as GPU time in the temporal and
     kernel-type breakdowns, the overlap, the launch stats and the queue length (its own idle-time
     breakdown filters those cats out);
  2. a launch call, for the launch stats and the queue length, is any runtime call (cat cuda_runtime,
     cuda_driver, runtime) whose correlation a device row carries. HTA matches names: its queue length
     the list of trace_symbol_table.py get_runtime_launch_events_mask (cudaLaunchKernel[ExC],
     cuLaunchKernel[Ex], cudaMemcpyAsync, cudaMemsetAsync, hip*), which misses cudaMemcpy,
     cudaLaunchCooperativeKernel, cudaGraphLaunch, ...; cuda_kernel_launch_stats a shorter list still
     (cudaLaunchKernel[ExC], cudaMemcpyAsync, cudaMemsetAsync), which finds no kernel of a Triton or
     ROCm trace;
  3. the last profiler step is found among host ProfilerStep#N events other than gpu_user_annotation;
     HTA also takes the GPU-side gpu_user_annotation "ProfilerStep#N" (no stream arg, so "CPU" to it),
     which starts late when the GPU lags and then moves the trim point into the last step;
  4. times are exact nanoseconds, round(ts * 1000) of the decimal text; HTA rounds the timestamps of a trace with
     fractional ts to whole microseconds (trace_parser.py: round_down_time_stamps: ceil(ts),
     floor(ts + dur), in float64, which at epoch-scale timestamps resolves only 0.25 us), a
     workaround for pytorch#122425;
  5. idle-time gaps on a stream are measured from the latest end so far, and a row that starts
     before it adds nothing; HTA takes the previous row's end, so rows that overlap on one stream
     (a trace artifact) add negative idle time.
Choices where HTA's result is undefined or order-dependent are marked NOTE.

--check matches traces to the report's ranks by distributedInfo.rank, else by their order on the
command line; prints one line per disagreement and a summary; exit 1 on any disagreement.
Tolerances: times 0.1% of the rank's span (temporal_breakdown_ns.span), ratios and queue-length
statistics 0.001, counts exact.
--plant NAME swaps one of the oracle's rules for a wrong one (see PLANTS), to show that a check
catches that kind of error.
"""

import argparse
import decimal
import gzip
import json
import math
import re
import sys
from collections import defaultdict

US = 1000  # ns per microsecond
# HTA trace_analysis.py: get_idle_time_breakdown(consecutive_kernel_delay=30), in us (see the docstring)
CONSECUTIVE_KERNEL_DELAY_NS = 30 * US
# HTA trace_analysis.py: get_cuda_kernel_launch_stats(runtime_cutoff=50, launch_delay_cutoff=100), in us
RUNTIME_CUTOFF_NS = 50 * US
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver", "runtime"))
LAUNCH_DELAY_CUTOFF_NS = 100 * US

PLANTS = {
    "overlap_over_compute": "overlap ratio divided by the compute time instead of the communication time",
    "idle_first_gap": "count the gap before each stream's first row, from the rank's first device row",
}

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# HTA breakdown_analysis.py: get_idle_time_breakdown's kernel_cats (cuda_sync filtered out), case as is
HTA_IDLE_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")

# HTA common/types.py, verbatim; GroupingPattern.match is re.match (anchored at the start)
COMM_RE = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
MEMORY_RE = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(  # ComputeKernelGroupingPattern, inverse_match=True
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)")
PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)")  # ProfilerStepGroupingPattern

# HTA trace_symbol_table.py: get_runtime_launch_events_mask (queue length)
QUEUE_LAUNCH_NAMES = frozenset((
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
    "cudaMemsetAsync", "runFunction - job_prep_and_submit_for_execution", "hipLaunchKernel",
    "hipExtModuleLaunchKernel", "hipMemsetAsync", "hipMemcpyAsync", "hipMemcpyWithStream"))
# HTA cuda_kernel_analysis.py: cuda_kernel_launch_stats (include_memory_events=True)
HTA_LAUNCH_STATS_NAMES = frozenset((
    "cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution",
    "cudaMemcpyAsync", "cudaMemsetAsync"))

# kernel types: HTA utils.py KernelType names; breakdown keys in HTA's analysis order
COMPUTATION, COMMUNICATION, MEMORY, OTHER = "computation", "communication", "memory", "other"
TYPE_ORDER = (COMPUTATION, COMMUNICATION, MEMORY)  # _get_gpu_kernel_type_time bits 1, 2, 4


def kernel_type(name):
    """HTA utils.py: get_kernel_type: communication first, then memory, then computation."""
    if COMM_RE.match(name):
        return COMMUNICATION
    if MEMORY_RE.match(name):
        return MEMORY
    if not NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


# ---------------------------------------------------------------- intervals
def union(ranges):
    """Sorted, disjoint union of (start, end) pairs; empty ones dropped; touching ones merged
    (HTA utils.py: merge_kernel_intervals merges a row into a group unless it starts after it)."""
    out = []
    for s, e in sorted(r for r in ranges if r[1] > r[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersect(a, b):
    """Intersection of two sorted disjoint unions."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def total(ranges):
    return sum(e - s for s, e in ranges)


# ---------------------------------------------------------------- reading a trace
def _dec(v):
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, decimal.Decimal)):
        return decimal.Decimal(v)
    if isinstance(v, float):
        return decimal.Decimal(repr(v))
    try:
        return decimal.Decimal(str(v))
    except decimal.InvalidOperation:
        return None


def to_ns(d):
    """Decimal microseconds to integer nanoseconds, round(d * 1000), exactly."""
    return int((d * 1000).to_integral_value(rounding=decimal.ROUND_HALF_UP))


def hta_int(v):
    """An args value as HTA reads it (pd.to_numeric(errors="coerce"), default -1): "0x0" -> -1."""
    if isinstance(v, bool) or v is None:
        return -1
    if isinstance(v, int):
        return v
    try:
        d = decimal.Decimal(str(v))
        return int(d) if d == d.to_integral_value() else -1
    except (decimal.InvalidOperation, ValueError):
        return -1


class Ev:
    __slots__ = ("idx", "cat", "name", "start", "end", "dur", "corr", "stream", "tid", "dev", "gpu")

    def __repr__(self):
        return f"Ev({self.cat}:{self.name[:30]} {self.start}-{self.end} s={self.stream} c={self.corr})"


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f, parse_float=decimal.Decimal)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc


def events(doc, us_rounding=False, literal=False):
    """The rows HTA keeps (trace_parser.py: _compress_df drops rows without dur or cat, and cat
    "Trace"), with integer-ns times and HTA's args.stream / args.correlation (default -1)."""
    raw_events = doc.get("traceEvents") or []
    # HTA rounds only when the ts column is float64: a fractional (JSON float) or missing ts anywhere
    us_rounding = us_rounding and any(
        not isinstance(r.get("ts"), int) or isinstance(r.get("ts"), bool) for r in raw_events if isinstance(r, dict))
    out = []
    for i, raw in enumerate(raw_events):
        if not isinstance(raw, dict) or raw.get("cat") is None or raw.get("cat") == "Trace":
            continue
        ts, dur = _dec(raw.get("ts")), _dec(raw.get("dur"))
        if ts is None or dur is None:
            continue
        e = Ev()
        e.idx, e.cat, e.name = i, str(raw["cat"]), str(raw.get("name", ""))
        if us_rounding:
            # DEVIATION 4 (exact ns) unless us_rounding: HTA trace_parser.py round_down_time_stamps, ceil(ts) and
            # floor(ts + dur) in whole us, in float64 as pandas does it: at epoch-scale timestamps
            # (1.7e15 us) a double resolves only 0.25 us, so HTA's end can move by a microsecond. A
            # sub-us row can come out with end < start: clamped to empty here.
            s_us, e_us = math.ceil(float(ts)), math.floor(float(ts) + float(dur))
            e.start, e.dur = s_us * US, (e_us - s_us) * US
        else:
            e.start, e.dur = to_ns(ts), to_ns(dur)
        e.end = e.start + max(e.dur, 0)
        args = raw.get("args") if isinstance(raw.get("args"), dict) else {}
        e.corr = hta_int(args.get("correlation"))
        e.stream = hta_int(args.get("stream"))
        e.tid = raw.get("tid")
        if literal:
            # HTA's "GPU kernels" (stream.ne(-1)) for the temporal / type breakdowns, overlap, launch
            # stats and queue length
            e.dev = e.stream != -1
            # HTA trace_filter.py: _filter_gpu_kernels_with_cuda_sync (GPUKernelFilter), for the trim
            e.gpu = (e.stream >= 0 and e.corr >= 0) or e.name in ("Event Sync", "Context Sync")
        else:
            # DEVIATION 1: device rows by cat only
            e.dev = e.cat.lower() in DEVICE_CATS
            if e.dev and e.stream == -1:
                e.stream = hta_int(e.tid)  # NOTE: Kineto's tid of a GPU row is its stream
            e.gpu = (e.dev and e.corr >= 0) or e.cat == "cuda_sync"
        out.append(e)
    return out


def trim_last_step(evs, include_last_step=False, literal=False):
    """HTA trace.py: Trace._filter_irrelevant_gpu_kernels (filter_gpu_kernels_with_cpu_correlation).
    Returns (kept events, trim point in ns or None). NOTE: HTA counts the ProfilerStep names over all
    ranks loaded together; this oracle counts them per trace."""
    def is_step_host(e):
        if e.gpu or not PROFILER_STEP_RE.match(e.name):
            return False
        # DEVIATION 3: HTA also takes gpu_user_annotation ProfilerStep#N rows (stream -1 => "CPU")
        return literal or e.cat != "gpu_user_annotation"

    steps = [e for e in evs if is_step_host(e)]
    names = {e.name for e in (evs if literal else steps) if PROFILER_STEP_RE.match(e.name)}
    host = [e for e in evs if not e.gpu]
    if len(names) < 2 or not host:  # HTA: "Skipping GPU kernel filtering since ..."
        return evs, None
    if include_last_step:
        point = max(e.end for e in steps)
        kept_host = [e for e in host if e.start <= point]
    else:
        point = max(e.start for e in steps)
        kept_host = [e for e in host if e.start < point]
    corrs = {e.corr for e in kept_host}
    # NOTE: HTA's merge duplicates a GPU row once per kept host row of its correlation; Kineto gives
    # one runtime call per correlation, so the rows are kept once here.
    kept_gpu = [e for e in evs if e.gpu and e.corr in corrs]
    return sorted(kept_gpu + kept_host, key=lambda e: e.idx), point


def rank_of(doc):
    di = doc.get("distributedInfo")
    r = di.get("rank") if isinstance(di, dict) else None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


# ---------------------------------------------------------------- analyses
def temporal_breakdown(rows):
    """HTA breakdown_analysis.py: get_temporal_breakdown (idle_time_per_rank, _get_idle_time_for_kernels):
    span = last end - first start; idle = span - |union|; compute = |union of computation rows|;
    non_compute = span - compute - idle. HTA fails on a rank without device rows: all 0 here."""
    if not rows:
        return {"idle": 0, "compute": 0, "non_compute": 0, "span": 0}
    span = max(e.end for e in rows) - min(e.start for e in rows)
    idle = span - total(union((e.start, e.end) for e in rows))
    compute = total(union((e.start, e.end) for e in rows if kernel_type(e.name) == COMPUTATION))
    return {"idle": idle, "compute": compute, "non_compute": span - compute - idle, "span": span}


def kernel_breakdown(rows):
    """HTA breakdown_analysis.py: _get_gpu_kernel_type_time with [COMPUTATION, COMMUNICATION, MEMORY]:
    each type's rows merged, then a sweep over +bit/-bit with the running mask; the time of each nonzero
    mask goes to the set of types it holds (HTA names it "A overlapping B"; here "a+b"). Rows of type
    other take no part."""
    points = []
    for bit, t in enumerate(TYPE_ORDER):
        for s, e in union((r.start, r.end) for r in rows if kernel_type(r.name) == t):
            points += [(s, 1 << bit), (e, -(1 << bit))]
    points.sort()
    acc, mask, prev = defaultdict(int), 0, None
    for t, d in points:
        if mask and t > prev:
            acc[mask] += t - prev
        mask += d
        prev = t
    out = {}
    for m in sorted(acc):
        if acc[m]:
            out["+".join(t for bit, t in enumerate(TYPE_ORDER) if m & (1 << bit))] = acc[m]
    return out


def overlap(rows, plant=None):
    """HTA communication_analysis.py: get_comm_comp_overlap: |comm ∩ compute| / |comm|, both merged
    (running status 3 = comm 1 + compute 2). HTA gives NaN without communication rows: null here."""
    comm = union((e.start, e.end) for e in rows if kernel_type(e.name) == COMMUNICATION)
    comp = union((e.start, e.end) for e in rows if kernel_type(e.name) == COMPUTATION)
    comm_ns, ov = total(comm), total(intersect(comm, comp))
    den = comm_ns
    if plant == "overlap_over_compute":
        den = total(comp)  # PLANT: the wrong denominator
    return {"comm_ns": comm_ns, "overlapped_ns": ov, "ratio": (ov / den) if den else None}


def runtime_start_by_corr(evs):
    """HTA trace.py: transform_correlation_to_index links each GPU row to the host (CPUOperatorFilter)
    row of its correlation; with several, the last one wins (df.loc assignment)."""
    m = {}
    for e in evs:
        if not e.gpu and e.corr != -1:
            m[e.corr] = e.start
    return m


def idle_breakdown(evs, literal=False, plant=None):
    """HTA breakdown_analysis.py: get_idle_time_breakdown + _analyze_idle_time_for_stream, summed over
    the streams. Per stream, rows by start; gap = start - previous row's end; host_wait when the row's
    runtime call started after the previous row's end; else kernel_wait when gap < 30 us; else other.
    The first row has no gap (NaN in HTA, left out of the sums). A row without a runtime call is never
    host_wait (NOTE: HTA then joins index_correlation 0 or -1 to trace row 0, or to nothing).
    DEVIATION 5: "previous row's end" is the latest end so far on the stream, and a row starting before
    it has no gap; HTA takes the previous row's end as is, so rows overlapping on one stream (a trace
    artifact) give negative idle time, summed into the categories, and a row inside a longer one
    makes a gap that is not idle.
    NOTE: rows of one stream that start together are ordered by file order (HTA: quicksort, unstable)."""
    if literal:
        rows = [e for e in evs if e.stream != -1 and e.cat in HTA_IDLE_CATS]
    else:
        rows = [e for e in evs if e.dev]
    rt = runtime_start_by_corr(evs)
    out = {"host_wait": 0, "kernel_wait": 0, "other": 0}
    if not rows:
        return out
    first_start = min(e.start for e in rows)
    by_stream = defaultdict(list)
    for e in rows:
        by_stream[e.stream].append(e)
    for stream, lst in by_stream.items():
        lst.sort(key=lambda e: (e.start, e.idx))
        prev_end = None
        if plant == "idle_first_gap":
            prev_end = first_start  # PLANT: a gap before the stream's first row
        for e in lst:
            if prev_end is not None and (literal or e.start > prev_end):
                gap = e.start - prev_end
                r = rt.get(e.corr) if e.corr != -1 else None
                if r is not None and r > prev_end:
                    out["host_wait"] += gap
                elif gap < CONSECUTIVE_KERNEL_DELAY_NS:
                    out["kernel_wait"] += gap
                else:
                    out["other"] += gap
            prev_end = e.end if (literal or prev_end is None) else max(prev_end, e.end)
    return out


def launch_stats(evs, literal=False):
    """HTA cuda_kernel_analysis.py: cuda_kernel_launch_stats, defaults runtime_cutoff=50 us,
    launch_delay_cutoff=100 us, include_memory_events=True: the host rows and the GPU rows whose
    correlation is that of a launch call, joined on correlation; launch_delay = max(0, GPU start -
    (host start + host dur)), i.e. from the end of the launch call; cpu_duration = the host row's dur.
    runtime_outliers: rows with cpu_duration > 50 us; launch_delay_outliers: launch_delay > 100 us."""
    if literal:
        corrs = {e.corr for e in evs if e.name in HTA_LAUNCH_STATS_NAMES}
        cpu = [e for e in evs if e.stream == -1 and e.corr in corrs]
    else:  # DEVIATION 2: every runtime call is a launch call
        cpu = [e for e in evs if not e.gpu and e.cat in RUNTIME_CATS and e.corr != -1]
        corrs = {e.corr for e in cpu}
    gpu_by_corr = defaultdict(list)
    for e in evs:
        if e.dev and e.corr in corrs:
            gpu_by_corr[e.corr].append(e)
    delays, cpu_durs = [], []
    for c in cpu:
        for g in gpu_by_corr.get(c.corr, ()):
            delays.append(max(0, g.start - (c.start + c.dur)))
            cpu_durs.append(c.dur)
    n = len(delays)
    return {"kernels": n,
            "launch_delay_mean_ns": (sum(delays) / n) if n else None,
            "launch_delay_max_ns": max(delays) if n else None,
            "runtime_outliers": sum(1 for d in cpu_durs if d > RUNTIME_CUTOFF_NS),
            "launch_delay_outliers": sum(1 for d in delays if d > LAUNCH_DELAY_CUTOFF_NS)}


def describe(values):
    """pandas Series.describe(): count, mean, std (ddof=1; null below 2 values), min, 25%, 50%, 75%
    (linear interpolation), max; the percentiles are keyed p25, p50, p75."""
    a = sorted(values)
    n = len(a)

    def q(p):
        pos = p * (n - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        return a[lo] + (a[hi] - a[lo]) * (pos - lo)

    mean = sum(a) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in a) / (n - 1)) if n > 1 else None
    return {"count": n, "mean": mean, "std": std, "min": a[0], "p25": q(0.25), "p50": q(0.5),
            "p75": q(0.75), "max": a[-1]}


def queue_length(evs, full_evs=None, literal=False):
    """HTA trace_counters.py: _get_queue_length_time_series_for_rank + get_queue_length_summary:
    +1 at the START of each launch call (get_runtime_launch_events_mask names, linked to a GPU row:
    index_correlation > 0), on the stream of its GPU row; -1 at the START of each GPU row that has such
    a call ("decremented when a kernel executes"); per stream, the running sum after each change,
    summarised with pandas describe() over those samples (not time-weighted).
    NOTE: HTA sorts the changes by ts with an unstable quicksort; here equal timestamps put the +1
    changes (launch calls) first, the order of a stable sort of HTA's concatenation."""
    full_evs = evs if full_evs is None else full_evs
    linked = {e.corr for e in full_evs if e.gpu}  # index_correlation > 0 (set before the trim)
    if literal:
        launches = [e for e in evs if not e.gpu and e.name in QUEUE_LAUNCH_NAMES and e.corr in linked]
    else:  # DEVIATION 2: every runtime call is a launch call
        launches = [e for e in evs if not e.gpu and e.cat in RUNTIME_CATS and e.corr in linked]
    gpu_by_corr = defaultdict(list)
    for e in evs:
        if e.dev:
            gpu_by_corr[e.corr].append(e)
    changes = defaultdict(list)  # stream -> [(ts, order, delta)]
    for c in launches:
        for g in gpu_by_corr.get(c.corr, ()):
            changes[g.stream].append((c.start, 0, c.idx, 1))
            changes[g.stream].append((g.start, 1, g.idx, -1))
    out = []
    for stream in sorted(changes):
        run, vals = 0, []
        for *_, d in sorted(changes[stream]):
            run += d
            vals.append(run)
        out.append(dict(stream=stream, **describe(vals)))
    return out


def analyses(path, plant=None, include_last_step=False, us_rounding=False, literal=False):
    """All figures for one trace (one rank)."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}; one of {', '.join(PLANTS)}")
    doc = load(path)
    full = events(doc, us_rounding=us_rounding, literal=literal)
    evs, point = trim_last_step(full, include_last_step=include_last_step, literal=literal)
    rows = [e for e in evs if e.dev]
    return {
        "rank": rank_of(doc),
        "temporal_breakdown_ns": temporal_breakdown(rows),
        "kernel_breakdown_ns": kernel_breakdown(rows),
        "overlap": overlap(rows, plant),
        "idle_breakdown_ns": idle_breakdown(evs, literal, plant),
        "launch": launch_stats(evs, literal),
        "queue_length": queue_length(evs, full, literal),
        "info": {"device_rows": len(rows), "device_rows_before_trim": sum(1 for e in full if e.dev),
                 "trim_point_ns": point},
    }


# ---------------------------------------------------------------- --check
TIME_KEYS = {
    "temporal_breakdown_ns": ("idle", "compute", "non_compute", "span"),
    "idle_breakdown_ns": ("host_wait", "kernel_wait", "other"),
}
QUEUE_EXACT = ("count", "min", "max")
QUEUE_APPROX = ("mean", "std", "p25", "p50", "p75")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


HTA_SECTIONS = ("temporal_breakdown_ns", "kernel_breakdown_ns", "overlap", "idle_breakdown_ns", "launch", "queue_length")


def check(report, paths, plant=None, out=print, **opts):
    """Compare a `wb report --json` document's ranks[] with the traces; returns the number of
    disagreements."""
    bad = 0

    def say(path, rank, key, theirs, ours, tol=None):
        nonlocal bad
        bad += 1
        t = f" tol={tol:g}" if tol is not None else ""
        out(f"DISAGREE trace={path} rank={rank} key={key} report={json.dumps(theirs)} "
            f"oracle={json.dumps(ours)}{t}")

    def cmp(path, rank, key, theirs, ours, tol):
        """tol None: exact; a number: absolute tolerance. null only equals null."""
        if ours is None or theirs is None:
            if not (ours is None and theirs is None):
                say(path, rank, key, theirs, ours)
            return
        if not _num(theirs) or abs(theirs - ours) > (tol or 0):
            say(path, rank, key, theirs, ours, tol)

    ranks = [r for r in report.get("ranks") or [] if isinstance(r, dict)]
    used = set()
    for i, path in enumerate(paths):
        a = analyses(path, plant, **opts)
        rank = a["rank"]
        if rank is not None:
            idx = next((j for j, r in enumerate(ranks) if r.get("rank") == rank and j not in used), None)
        else:
            idx = i if i < len(ranks) and i not in used else None
        if idx is None:
            say(path, rank, "rank", "missing", "present")
            continue
        used.add(idx)
        entry = ranks[idx]
        if a["info"]["device_rows_before_trim"] == 0:
            # A rank without device rows (a CPU-only trace): the report carries no HTA section for it.
            for sec in HTA_SECTIONS:
                if entry.get(sec) is not None:
                    say(path, rank, sec, entry.get(sec), None)
            continue
        tol = 0.001 * a["temporal_breakdown_ns"]["span"]
        for sec, keys in TIME_KEYS.items():
            theirs = entry.get(sec)
            if not isinstance(theirs, dict):
                say(path, rank, sec, theirs, a[sec])
                continue
            for k in keys:
                cmp(path, rank, f"{sec}.{k}", theirs.get(k), a[sec][k], tol)
        kb = entry.get("kernel_breakdown_ns")
        if not isinstance(kb, dict):
            say(path, rank, "kernel_breakdown_ns", kb, a["kernel_breakdown_ns"])
        else:
            for k in sorted(set(kb) | set(a["kernel_breakdown_ns"])):
                cmp(path, rank, f"kernel_breakdown_ns.{k}", kb.get(k, 0), a["kernel_breakdown_ns"].get(k, 0), tol)
        ov = entry.get("overlap")
        if not isinstance(ov, dict):
            say(path, rank, "overlap", ov, a["overlap"])
        else:
            cmp(path, rank, "overlap.comm_ns", ov.get("comm_ns"), a["overlap"]["comm_ns"], tol)
            cmp(path, rank, "overlap.overlapped_ns", ov.get("overlapped_ns"), a["overlap"]["overlapped_ns"], tol)
            cmp(path, rank, "overlap.ratio", ov.get("ratio"), a["overlap"]["ratio"], 0.001)
        la = entry.get("launch")
        if not isinstance(la, dict):
            say(path, rank, "launch", la, a["launch"])
        else:
            for k in ("kernels", "runtime_outliers", "launch_delay_outliers"):
                cmp(path, rank, f"launch.{k}", la.get(k), a["launch"][k], None)
            for k in ("launch_delay_mean_ns", "launch_delay_max_ns"):
                cmp(path, rank, f"launch.{k}", la.get(k), a["launch"][k], tol)
        ql = entry.get("queue_length")
        if not isinstance(ql, list):
            say(path, rank, "queue_length", ql, a["queue_length"])
        else:
            theirs = {q.get("stream"): q for q in ql if isinstance(q, dict)}
            ours = {q["stream"]: q for q in a["queue_length"]}
            if sorted(theirs, key=str) != sorted(ours, key=str):
                say(path, rank, "queue_length.streams", sorted(theirs, key=str), sorted(ours, key=str))
            for s in sorted(set(theirs) & set(ours), key=str):
                for k in QUEUE_EXACT:
                    cmp(path, rank, f"queue_length[{s}].{k}", theirs[s].get(k), ours[s][k], None)
                for k in QUEUE_APPROX:
                    cmp(path, rank, f"queue_length[{s}].{k}", theirs[s].get(k), ours[s][k], 0.001)
    for j, r in enumerate(ranks):
        if j not in used:
            say("-", r.get("rank"), "rank", "present", "no trace")
    out(f"hta check: {len(paths)} trace(s), {len(ranks)} report rank(s), {bad} disagreement(s)"
        + (f" [plant {plant}]" if plant else "") + (": FAIL" if bad else ": OK"))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="REPORT.json")
    ap.add_argument("--plant", choices=sorted(PLANTS))
    ap.add_argument("--include-last-step", action="store_true",
                    help="HTA's include_last_profiler_step=True: keep the last profiler step")
    ap.add_argument("--hta-us-rounding", action="store_true",
                    help="HTA's whole-microsecond rounding of fractional timestamps (DEVIATION 4 off)")
    ap.add_argument("--hta-literal", action="store_true",
                    help="HTA's row selection, launch names, trim point and idle gaps (DEVIATIONs 1, 2, 3, 5 off)")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args(argv)
    opts = dict(include_last_step=a.include_last_step, us_rounding=a.hta_us_rounding, literal=a.hta_literal)
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            report = json.load(f)
        return 1 if check(report, a.traces, a.plant, **opts) else 0
    result = [dict(trace=p, **analyses(p, a.plant, **opts)) for p in a.traces]
    json.dump(result[0] if len(result) == 1 else result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
