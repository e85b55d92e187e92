#!/usr/bin/python3
"""An independent oracle for `wb report RUN --json`: the TensorBoard profiler plugin's "Overview".

    tb_overview.py [--plant NAME] TRACE...                    print each trace's overview as JSON
    tb_overview.py [--plant NAME] --check REPORT.json TRACE...  compare a report with the traces

It reads PyTorch Kineto traces (Chrome trace JSON, .json or .json.gz, one per rank) itself, with the
standard library only, and recomputes from the rules of kineto's (since deleted) TensorBoard plugin,
tb_plugin/torch_tb_profiler/profiler/ at kineto 94979607^ (cited below as "plugin <file>: <function>"):
the steps, the per-step time breakdown, the GPU summary and the recommendations. It shares no code
with the project and none with the plugin: the rules are rewritten over sorted interval lists.

Deliberate deviations from the plugin, which the C++ side implements too, are marked DEVIATION where
they are implemented. Choices where the plugin's rule is undefined or order-dependent are marked NOTE.

--check matches traces to the report's ranks by distributedInfo.rank, else by their order on the
command line, and prints one line per disagreement and a summary; exit 1 on any disagreement.
--plant NAME swaps one of the oracle's rules for a wrong one (see PLANTS), to show that a check
catches that kind of error.
"""

import argparse
import bisect
import decimal
import gzip
import json
import sys
from collections import defaultdict

CLASSES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
PLANTS = {
    "dataloader_first": "DataLoader takes priority over Kernel in the breakdown",
    "host_step_end": "a step ends at its host end: no device-side adjustment of the end",
    "sm_eff_no_min": "SM efficiency without min(sum of blocks per SM, 1.0)",
}

# Event classes by lower-cased "cat" (plugin trace.py: EventTypeMap). python_function events get no
# role in the plugin (event_parser.py: _parse_step has no branch for them), so they are not listed.
HOST_CATS = {"cpu_op", "operator", "user_annotation", "python"}
STEP_CATS = {"cpu_op", "operator", "user_annotation"}  # trace.py: create_trace_event makes ProfilerStepEvents
CPU_SPAN_CATS = {"cpu_op", "operator", "python"}  # event_parser.py: _parse_step's cpu_min_ts/cpu_max_ts
# DEVIATION: cuda_driver (e.g. Triton's cuLaunchKernel) counts as Runtime and as a launcher; the plugin
# ignores it. NOTE: the plugin's mtia/glow/xpu/privateuse1_runtime cats are left out, as the brief says.
RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver"}
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
               "gpu_memset": "memset", "memset": "memset"}
# DEVIATION: gpu_user_annotation is ignored entirely. The plugin maps it to USER_ANNOTATION, so it
# counts GPU-side annotation spans as CPU Exec, and one named ProfilerStep#N as an extra step.

# plugin tensor_core.py: TC_Allowlist (substring of a kernel's name) and TC_OP_Allowlist (exact op name)
TC_KERNEL_PATTERNS = ("h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "dgrad_1x1_stride_2x2",
                      "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group",
                      "xmma_implicit_gemm", "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm",
                      "xmma_gemm", "xmma_sparse_gemm", "c1688")
TC_OPS = frozenset((
    "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_tbc",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::convolution",
    "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::prelu", "aten::addmm",
    "aten::addmv", "aten::addr", "aten::matmul", "aten::mm", "aten::mv", "aten::linear", "aten::addbmm",
    "aten::baddbmm", "aten::bmm", "aten::chain_matmul", "aten::linalg_multi_dot",
    "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell", "aten::lstm_cell", "aten::gru_cell",
    "aten::rnn_tanh_cell", "aten::rnn_relu_cell", "CudnnConvolutionBackward", "BmmBackward0",
    "aten::cudnn_convolution_transpose_backward", "CudnnConvolutionTransposeBackward", "MmBackward",
    "aten::cudnn_convolution_backward_weight", "aten::addmm_", "AddmvBackward", "MvBackward",
    "aten::cudnn_convolution_transpose_backward_weight", "aten::cudnn_convolution_transpose_backward_input",
    "AddmmBackward", "aten::cudnn_convolution_backward_input", "AddbmmBackward",
    "aten::cudnn_convolution_backward"))


# ---------------------------------------------------------------- intervals (plugin range_utils.py)
def union(ranges):
    """Sorted, disjoint union of (start, end) pairs; empty ones dropped (range_utils.py: merge_ranges)."""
    out = []
    for s, e in sorted(r for r in ranges if r[1] > r[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersect(a, b):
    """a ∩ b for sorted disjoint lists (range_utils.py: intersection_ranges_lists)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b):
    """a minus b for sorted disjoint lists (range_utils.py: subtract_ranges_lists)."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > s:
                out.append((s, b[k][0]))
            s = max(s, b[k][1])
            k += 1
        if s < e:
            out.append((s, e))
    return out


def total(ranges):
    return sum(e - s for s, e in ranges)


def valued_segments(ranges, clip_at_one=True):
    """range_utils.py: merge_ranges_with_value. Sweeps (start, end, value) triples, starts before ends
    at equal times, and gives the segments where the running sum is > 0, with value min(sum, 1.0)."""
    points = sorted([(s, 0, v) for s, e, v in ranges] + [(e, 1, v) for s, e, v in ranges],
                    key=lambda p: (p[0], p[1]))
    out, level, last = [], 0.0, None
    for t, kind, v in points:
        if last is not None and t > last and level > 0.0:
            out.append((last, t, min(level, 1.0) if clip_at_one else level))
        last = t
        level = level + v if kind == 0 else level - v
    return out


# ---------------------------------------------------------------- reading a trace
def to_ns(v):
    """Kineto microseconds to integer nanoseconds, round(v * 1000), exactly: floats are parsed as
    Decimal, since a double loses the nanoseconds of epoch timestamps (1.7e15 us)."""
    if v is None:
        return 0
    if isinstance(v, int):
        return v * 1000
    return int((decimal.Decimal(str(v)) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_UP))


class Ev:
    __slots__ = ("cat", "name", "start", "end", "args", "thread", "corr", "cls")

    def __init__(self, raw):
        self.cat = str(raw.get("cat", "")).lower()
        self.name = str(raw.get("name", ""))
        self.start = to_ns(raw.get("ts"))
        self.end = self.start + max(to_ns(raw.get("dur")), 0)
        self.args = raw.get("args") or {}
        self.thread = (raw.get("pid"), raw.get("tid"))
        self.corr = self.args.get("correlation")
        self.cls = None


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f, parse_float=decimal.Decimal)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc


def step_number(ev):
    """ProfilerStep#N -> N for a host event of a step cat (trace.py: ProfilerStepEvent), else None."""
    if ev.cat in STEP_CATS and ev.name.startswith("ProfilerStep#"):
        try:
            return int(ev.name.split("#")[1])
        except ValueError:
            return None
    return None


def classify(ev):
    """The role an event's range gets (event_parser.py: _parse_step), or 'step' / None."""
    if ev.cat in DEVICE_CATS:
        kind = DEVICE_CATS[ev.cat]
        # DEVIATION: a kernel is Communication when its name starts with "nccl" (any case); the plugin
        # matches its External id against an nccl:* op's, which recent Kineto traces never satisfy.
        if kind == "kernel" and ev.name.lower().startswith("nccl"):
            return "communication"
        return kind
    if ev.cat in RUNTIME_CATS:
        return "runtime"
    if ev.cat not in HOST_CATS:
        return None
    if step_number(ev) is not None:
        return "step"
    # NOTE: the plugin tests DataLoader names on cpu_op/operator/user_annotation only; here any host op.
    if (ev.name.startswith("enumerate(DataLoader)#") and ev.name.endswith(".__next__")) \
            or ev.name.startswith("enumerate(DataPipe)#"):
        return "dataloader"
    # DEVIATION: any host op named nccl:* or gloo:* is Communication; the plugin lists five exact
    # names (trace.py: NcclOpNameSet, GlooOpNameSet).
    if ev.name.startswith(("nccl:", "gloo:")):
        return "communication"
    return "cpu_exec"


# ---------------------------------------------------------------- steps (plugin event_parser.py)
def host_steps(events):
    """[(N, start, end)] from the ProfilerStep#N events, in time order; without any, one step 0 over
    the cpu_op/operator/python events (StepParser.parse_steps with cpu_min_ts/cpu_max_ts; user
    annotations do not count). NOTE: the plugin keeps the trace's order; here the steps are sorted."""
    steps = sorted((ev.start, ev.end, step_number(ev)) for ev in events if ev.cls == "step")
    if steps:
        return [(n, s, e) for s, e, n in steps]
    host = [ev for ev in events if ev.cat in CPU_SPAN_CATS]
    if not host:
        return []  # NOTE: undefined in the plugin (it would use sys.maxsize bounds)
    return [(0, min(ev.start for ev in host), max(ev.end for ev in host))]


def device_steps(steps, events, plant=None):
    """StepParser._find_device_steps + _update_steps_duration. A runtime call inside a host step span
    (start >= step start, end <= step end; the earliest such step) contributes the device events with
    its correlation id. Each step then becomes [max(prev_end, host start), max(host end, last device
    end)]; prev_end starts at the first step's host start, raised to the latest end of unmatched
    device events ending before step 0's first device start (when step 0 has device events). Trailing
    steps without device events are dropped, and then the last one if it has fewer than 0.8x the
    matched device events of the one before. Without any matched device event the host spans stay.
    NOTE: two runtime calls with one correlation id (not seen in real traces) both contribute."""
    device = [ev for ev in events if ev.cat in DEVICE_CATS]
    by_corr = defaultdict(list)
    for ev in device:
        if ev.corr is not None:
            by_corr[ev.corr].append(ev)
    ends = [e for _, _, e in steps]
    first_dev = [None] * len(steps)
    last_dev = [None] * len(steps)
    count = [0] * len(steps)
    matched = set()
    for rt in sorted((ev for ev in events if ev.cls == "runtime"), key=lambda ev: ev.start):
        i = bisect.bisect_left(ends, rt.end)  # earliest step ending at or after the call
        if i == len(steps) or rt.start < steps[i][1]:
            continue
        for d in by_corr.get(rt.corr, ()):
            first_dev[i] = d.start if first_dev[i] is None else min(first_dev[i], d.start)
            last_dev[i] = d.end if last_dev[i] is None else max(last_dev[i], d.end)
            count[i] += 1
            matched.add(id(d))
    if not matched:
        return list(steps)
    prev_end = steps[0][1]
    if first_dev[0] is not None:
        for d in device:
            if id(d) not in matched and d.end < first_dev[0]:
                prev_end = max(prev_end, d.end)
    out = []
    for i, (n, s, e) in enumerate(steps):
        start = max(prev_end, s)
        if plant == "host_step_end":
            end = e  # PLANT: the host end, no device adjustment
        elif last_dev[i] is None:
            end = max(e, start)
        else:
            end = max(e, last_dev[i])
        end = max(end, start)
        out.append((n, start, end))
        prev_end = end
    if len(out) > 1:
        last = max((i for i in range(len(out)) if count[i] > 0), default=-1)
        if last >= 0:
            keep = last + 1
            if last > 0 and count[last - 1] * 0.8 > count[last]:
                keep = last
            out = out[:keep]
    return out


# ---------------------------------------------------------------- breakdown (plugin overall_parser.py)
def breakdown(steps, events, plant=None):
    """OverallParser.Statistics.create_from_range: each role's union over the whole trace, in priority
    order Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CPU Exec, each less what the roles
    before it took; Other is the rest of the step. Per step, each role's part inside the step span."""
    order = list(CLASSES[:-1])
    if plant == "dataloader_first":
        order.remove("dataloader")
        order.insert(0, "dataloader")  # PLANT: DataLoader before Kernel
    raw = defaultdict(list)
    for ev in events:
        if ev.cls in CLASSES:
            raw[ev.cls].append((ev.start, ev.end))
    taken, exclusive = [], {}
    for cls in order:
        exclusive[cls] = subtract(union(raw[cls]), taken)
        taken = union(taken + exclusive[cls])
    rows = []
    for n, s, e in steps:
        span = [(s, e)] if e > s else []
        b = {cls: total(intersect(exclusive[cls], span)) for cls in CLASSES[:-1]}
        b["other"] = total(subtract(span, taken))
        rows.append({"step": n, "start_ns": s, "end_ns": e, "breakdown_ns": b})
    return rows


# ---------------------------------------------------------------- GPU summary (gpu_metrics_parser.py)
def num(v):
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def gpu_summary(steps, events, plant=None):
    """For the smallest args "device" of any kernel: GPUMetricsParser.calculate_gpu_utilization,
    calculate_approximated_sm_efficiency, calculate_occupancy over [first step start, last step end],
    and TensorCoresParser._calculate_tc_ratio. None without kernels (NOTE: also when no kernel names
    its device, as the plugin then has no gpu_ids)."""
    kernels = [ev for ev in events if ev.cat == "kernel"]
    devices = [ev.args.get("device") for ev in kernels if isinstance(ev.args.get("device"), int)]
    if not devices:
        return None
    dev = min(devices)
    mine = [ev for ev in kernels if ev.args.get("device") == dev]
    out = {"device": dev, "utilization": None, "sm_efficiency": None, "achieved_occupancy": None,
           "tensor_core_share": None}
    if steps and steps[-1][2] > steps[0][1]:
        lo, hi = steps[0][1], steps[-1][2]
        span = hi - lo
        out["utilization"] = total(intersect(union((k.start, k.end) for k in mine), [(lo, hi)])) / span
        # blocks per SM > 0 only; None when nothing of it lies in the steps (the plugin's rule).
        bps = [(k.start, k.end, num(k.args.get("blocks per SM"))) for k in mine]
        segs = valued_segments([r for r in bps if r[2] is not None and r[2] > 0.0],
                               clip_at_one=(plant != "sm_eff_no_min"))  # PLANT: no min(..., 1)
        inside = [(max(s, lo), min(e, hi), v) for s, e, v in segs if min(e, hi) > max(s, lo)]
        if inside:
            out["sm_efficiency"] = sum((e - s) * v for s, e, v in inside) / span
        # est. achieved occupancy % >= 0, weighted by the kernel's duration clipped to the steps.
        weight = occ = 0.0
        for k in mine:
            o = num(k.args.get("est. achieved occupancy %"))
            d = min(k.end, hi) - max(k.start, lo)
            if o is not None and o >= 0.0 and d > 0:
                weight += d
                occ += o * d
        if weight > 0:
            out["achieved_occupancy"] = occ / weight / 100.0
    # Tensor cores: kernels launched by a runtime call (same correlation id), anywhere in the trace.
    launched = launched_kernels(events)
    mine_launched = [k for k in launched if k.args.get("device") == dev]
    all_time = sum(k.end - k.start for k in mine_launched)
    if launched:
        tc = sum(k.end - k.start for k in mine_launched if any(p in k.name for p in TC_KERNEL_PATTERNS))
        out["tensor_core_share"] = tc / all_time if all_time > 0 else 0.0
    return out


def launched_kernels(events):
    corrs = {ev.corr for ev in events if ev.cls == "runtime" and ev.corr is not None}
    return [ev for ev in events if ev.cat == "kernel" and ev.corr is not None and ev.corr in corrs]


# ---------------------------------------------------------------- recommendations (plugin data.py)
def tc_eligible_kernel_time(events):
    """Kernel time launched from a TC-eligible op (tensor_cores_parser.py:
    _get_tc_eligible_ops_kernel_ratio): the runtime call's innermost enclosing host op on its thread
    (the latest-starting one, then the shortest) has a name in TC_OP_Allowlist. Kernels of any device.
    NOTE: the plugin also skips an eligible op that has an eligible descendant; not done here."""
    kernels = defaultdict(list)
    for k in launched_kernels(events):
        kernels[k.corr].append(k)
    per_thread = defaultdict(list)
    for ev in events:
        if ev.cat in HOST_CATS:
            per_thread[ev.thread].append((ev.start, 0, -ev.end, ev))
        elif ev.cls == "runtime" and ev.corr in kernels:
            per_thread[ev.thread].append((ev.start, 1, 0, ev))
    time = 0
    for items in per_thread.values():
        stack = []
        for start, kind, _, ev in sorted(items, key=lambda x: x[:3]):
            while stack and (stack[-1].end <= start if kind == 0 else stack[-1].end < start):
                stack.pop()
            if kind == 0:
                stack.append(ev)
                continue
            op = next((o for o in reversed(stack) if o.end >= ev.end), None)
            if op is not None and op.name in TC_OPS:
                time += sum(k.end - k.start for k in kernels[ev.corr])
    return time


def device_memory_peaks(doc):
    """MemoryParser's peak per device: the largest "Total Allocated" of the "[memory]" events of each
    (Device Type, Device Id), CPU (Device Type 0) left out as the plugin's analyze does."""
    peaks = {}
    for e in doc.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        args = e.get("args") or {}
        dev_type, dev_id, total = num(args.get("Device Type")), num(args.get("Device Id")), num(args.get("Total Allocated"))
        if dev_type is None or dev_type == 0 or total is None:
            continue
        key = (int(dev_type), int(dev_id) if dev_id is not None else 0)
        peaks[key] = max(peaks.get(key, 0), total)
    return peaks


def memory_at_limit(doc):
    """RunProfileData.analyze's memory rule: some device's peak over 0.9 of its deviceProperties
    totalGlobalMem (the entry whose id is the device's)."""
    props = {int(p["id"]): p for p in doc.get("deviceProperties") or []
             if isinstance(p, dict) and num(p.get("id")) is not None}
    for (dev_type, dev_id), peak in device_memory_peaks(doc).items():
        total = num(props.get(dev_id, {}).get("totalGlobalMem"))
        if total is not None and peak > total * 0.9:
            return True
    return False


def recommendations(doc, mean, gpu, events):
    """RunProfileData.analyze: DataLoader > 5% and Communication > 10% of the mean step, GPU
    utilization < 0.5 (for the one device summarised), and AMP when deviceProperties[0] has
    computeMajor >= 7, the tensor core share is 0 and some kernel time comes from a TC-eligible op;
    memory when a device's peak allocation is over 0.9 of its memory (memory_at_limit).
    NOTE: the plugin's AMP rule reads KernelParser's share over all kernels; here tensor_core_share.
    DEVIATION: not on AMD devices (a deviceProperties name starting with "AMD"): their computeMajor is
    the gfx generation, not a CUDA compute capability, and the Tensor Core kernel names are NVIDIA's."""
    recs = []
    step = sum(mean.values()) if mean else 0.0
    if step > 0 and mean["dataloader"] / step > 0.05:
        recs.append("dataloader")
    if step > 0 and mean["communication"] / step > 0.10:
        recs.append("communication")
    if gpu is not None and gpu["utilization"] is not None and gpu["utilization"] < 0.5:
        recs.append("gpu_utilization")
    props = doc.get("deviceProperties") or []
    major = num(props[0].get("computeMajor")) if props and isinstance(props[0], dict) else None
    if props and isinstance(props[0], dict) and str(props[0].get("name", "")).startswith("AMD"):
        major = None
    if major is not None and major >= 7 and gpu is not None and gpu["tensor_core_share"] == 0.0 \
            and tc_eligible_kernel_time(events) > 0:
        recs.append("amp")
    if props and memory_at_limit(doc):
        recs.append("memory")
    return recs


# ---------------------------------------------------------------- overview
def overview(path, plant=None):
    """The overview of one trace file: rank, steps with breakdown, mean breakdown, GPU, recommendations."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}; one of {', '.join(PLANTS)}")
    doc = load(path)
    events = []
    for raw in doc.get("traceEvents") or []:
        if isinstance(raw, dict) and raw.get("ph") == "X":
            ev = Ev(raw)
            ev.cls = classify(ev)
            if ev.cls is not None:
                events.append(ev)
    steps = device_steps(host_steps(events), events, plant)
    rows = breakdown(steps, events, plant)
    mean = {c: (sum(r["breakdown_ns"][c] for r in rows) / len(rows) if rows else 0.0) for c in CLASSES}
    gpu = gpu_summary(steps, events, plant)
    info = doc.get("distributedInfo")
    return {"rank": info.get("rank") if isinstance(info, dict) else None, "steps": rows,
            "breakdown_mean_ns": mean, "gpu": gpu, "recommendations": recommendations(doc, mean, gpu, events)}


# ---------------------------------------------------------------- --check
GPU_FRACTIONS = ("utilization", "sm_efficiency", "achieved_occupancy", "tensor_core_share")


def check(report, paths, plant=None, out=print):
    """Compare a `wb report --json` document with the traces; returns the number of disagreements.
    Recommendations: the report's run-wide list against the union of the traces' ids; a rank entry
    that carries its own "recommendations" is compared with its trace's ids as well."""
    bad = 0

    def say(path, rank, step, what, ours, oracle):
        nonlocal bad
        bad += 1
        out(f"DISAGREE trace={path} rank={rank} step={step} class={what} report={ours} oracle={oracle}")

    ranks = [r for r in report.get("ranks") or [] if isinstance(r, dict)]
    used, rec_union = set(), set()
    for i, path in enumerate(paths):
        ov = overview(path, plant)
        rank = ov["rank"]
        rec_union.update(ov["recommendations"])
        if rank is not None:
            idx = next((j for j, r in enumerate(ranks) if r.get("rank") == rank), None)
        else:
            idx = i if i < len(ranks) else None
        if idx is None:
            say(path, rank, "-", "rank", "missing", "present")
            continue
        used.add(idx)
        entry = ranks[idx]
        theirs = {s.get("step"): s for s in entry.get("steps") or []}
        mine = sorted((r["step"] for r in ov["steps"]), key=str)
        if sorted(theirs, key=str) != mine:
            say(path, rank, "-", "steps", sorted(theirs, key=str), mine)
        for row in ov["steps"]:
            s = theirs.get(row["step"])
            if s is None:
                continue
            dur = row["end_ns"] - row["start_ns"]
            tol = 0.001 * dur
            sdur = (s.get("end_ns") or 0) - (s.get("start_ns") or 0)
            if abs(sdur - dur) > tol:
                say(path, rank, row["step"], "duration", sdur, dur)
            sb = s.get("breakdown_ns") or {}
            for c in CLASSES:
                v = sb.get(c)
                if not isinstance(v, (int, float)) or abs(v - row["breakdown_ns"][c]) > tol:
                    say(path, rank, row["step"], c, v, row["breakdown_ns"][c])
        mb = entry.get("breakdown_mean_ns") or {}
        mtol = 0.001 * sum(ov["breakdown_mean_ns"].values())
        for c in CLASSES:
            v = mb.get(c)
            if not isinstance(v, (int, float)) or abs(v - ov["breakdown_mean_ns"][c]) > mtol:
                say(path, rank, "mean", c, v, ov["breakdown_mean_ns"][c])
        g, og = entry.get("gpu"), ov["gpu"]
        if (g is None) != (og is None):
            say(path, rank, "-", "gpu", g, og)
        elif og is not None:
            if "device" in g and g["device"] != og["device"]:
                say(path, rank, "-", "gpu.device", g["device"], og["device"])
            for k in GPU_FRACTIONS:
                a, b = g.get(k), og[k]
                if (a is None) != (b is None) or (b is not None and (
                        not isinstance(a, (int, float)) or abs(a - b) > 0.001)):
                    say(path, rank, "-", "gpu." + k, a, b)
        if "recommendations" in entry:
            ids = {r.get("id") if isinstance(r, dict) else r for r in entry["recommendations"]}
            if ids != set(ov["recommendations"]):
                say(path, rank, "-", "recommendations", sorted(ids, key=str), sorted(ov["recommendations"]))
    for j, r in enumerate(ranks):
        if j not in used:
            say("-", r.get("rank"), "-", "rank", "present", "no trace")
    ids = {r.get("id") if isinstance(r, dict) else r for r in report.get("recommendations") or []}
    if ids != rec_union:
        say("*", "*", "-", "recommendations", sorted(ids, key=str), sorted(rec_union))
    out(f"tb_overview check: {len(paths)} trace(s), {len(ranks)} report rank(s), {bad} disagreement(s)"
        + (f" [plant {plant}]" if plant else "") + (": FAIL" if bad else ": OK"))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="REPORT.json")
    ap.add_argument("--plant", choices=sorted(PLANTS))
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args(argv)
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            report = json.load(f)
        return 1 if check(report, a.traces, a.plant) else 0
    result = [dict(trace=p, **overview(p, a.plant)) for p in a.traces]
    json.dump(result[0] if len(result) == 1 else result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
