#!/usr/bin/python3
"""Self-tests of tests/oracles/hta.py, without the C++ side.

    /usr/bin/python3 tests/oracles/test_hta_oracle.py

Every expected number below was worked out by hand from the fixtures in tests/fixtures/torch-traces/
(the working is in the comments: times there are in microseconds as in the fixture, "K" a kernel, "rt"
a runtime call, "s7" stream 7, "C"/"comm"/"mem" the computation/communication/memory kernel types).
HTA trims the last profiler step: with two or more ProfilerStep#N, only host events that start before
the last step's start are kept, and only the device rows whose correlation one of them carries.
Each plant (--plant) must change a figure of at least one fixture, and `--check` must pass a report
that agrees with the oracle and fail one that does not.
"""

import copy
import decimal
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hta  # noqa: E402

FIX = os.path.join(HERE, "..", "fixtures", "torch-traces")
ORACLE = os.path.join(HERE, "hta.py")
US = 1000  # ns per microsecond


def fx(name):
    return os.path.join(FIX, name)


def ns(v):
    """Microseconds (int or decimal text) as integer nanoseconds."""
    return int(decimal.Decimal(str(v)) * US)


def tb(idle, compute, non_compute, span):
    return {"idle": ns(idle), "compute": ns(compute), "non_compute": ns(non_compute), "span": ns(span)}


def idle(host_wait=0, kernel_wait=0, other=0):
    return {"host_wait": ns(host_wait), "kernel_wait": ns(kernel_wait), "other": ns(other)}


def q(stream, vals):
    """The describe() row of one stream, from the queue-length samples (worked out in the comments)."""
    return dict(stream=stream, **hta.describe(vals))


def report_of(paths, plant=None, tweak=None, **opts):
    """A `wb report --json` document holding exactly what the oracle computes for paths."""
    ranks = []
    for p in paths:
        a = hta.analyses(p, plant, **opts)
        ranks.append({k: a[k] for k in ("rank", "temporal_breakdown_ns", "kernel_breakdown_ns", "overlap",
                                        "idle_breakdown_ns", "launch", "queue_length")})
    doc = {"ranks": ranks}
    if tweak:
        tweak(doc)
    return doc


def run_check(doc, paths, *extra):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        p = subprocess.run([sys.executable, ORACLE, "--check", f.name, *extra, *paths],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    finally:
        os.unlink(f.name)


def write_trace(events, rank=0):
    """A throwaway Kineto trace holding events (times in us); returns its path."""
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 1},
           "traceEvents": events}
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(doc, f)
    f.close()
    return f.name


def rt(name, ts, dur, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def kern(name, stream, ts, dur, corr, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr}}


class Units(unittest.TestCase):
    def test_intervals(self):
        self.assertEqual(hta.union([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)]), [(0, 3), (5, 9)])
        self.assertEqual(hta.intersect([(0, 3), (5, 9)], [(2, 6), (8, 20)]), [(2, 3), (5, 6), (8, 9)])
        self.assertEqual(hta.total([(0, 3), (5, 9)]), 7)

    def test_to_ns_is_exact(self):
        self.assertEqual(hta.to_ns(decimal.Decimal("1712195495502094.123")), 1712195495502094123)
        self.assertEqual(hta.to_ns(decimal.Decimal("0.0005")), 1)

    def test_kernel_types(self):
        # HTA types.py patterns: communication, then memory, then computation (inverse match), else other
        self.assertEqual(hta.kernel_type("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"), "communication")
        self.assertEqual(hta.kernel_type("void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)"), "communication")
        self.assertEqual(hta.kernel_type("Memcpy HtoD (Pinned -> Device)"), "memory")
        self.assertEqual(hta.kernel_type("Memset (Device)"), "memory")
        self.assertEqual(hta.kernel_type("ampere_sgemm_128x64_nn"), "computation")
        self.assertEqual(hta.kernel_type("Stream Wait Event"), "other")
        self.assertEqual(hta.kernel_type("Event Sync"), "other")
        self.assertEqual(hta.kernel_type("void at::native::copy_Memcpy_like_kernel"), "other")  # (.*Memcpy)

    def test_describe_is_pandas_describe(self):
        # [1,0,1,2,1,0]: mean 5/6; sorted 0,0,1,1,1,2: 25% at 1.25 -> 0.25, 50% at 2.5 -> 1, 75% at 3.75 -> 1;
        # std (ddof 1) = sqrt((2*(5/6)^2 + 3*(1/6)^2 + (7/6)^2) / 5) = sqrt(102/36/5)
        d = hta.describe([1, 0, 1, 2, 1, 0])
        self.assertEqual((d["count"], d["min"], d["max"]), (6, 0, 2))
        self.assertAlmostEqual(d["mean"], 5 / 6)
        self.assertAlmostEqual(d["std"], (102 / 36 / 5) ** 0.5)
        self.assertEqual((d["p25"], d["p50"], d["p75"]), (0.25, 1.0, 1.0))
        self.assertIsNone(hta.describe([3])["std"])


class Fixtures(unittest.TestCase):
    def assertFigures(self, a, rank, temporal, kernel, ovl, idl, launch, queue):
        self.assertEqual(a["rank"], rank)
        self.assertEqual(a["temporal_breakdown_ns"], temporal)
        self.assertEqual(a["kernel_breakdown_ns"], {k: ns(v) for k, v in kernel.items()})
        comm, over, ratio = ovl
        self.assertEqual((a["overlap"]["comm_ns"], a["overlap"]["overlapped_ns"]), (ns(comm), ns(over)))
        if ratio is None:
            self.assertIsNone(a["overlap"]["ratio"])
        else:
            self.assertAlmostEqual(a["overlap"]["ratio"], ratio, places=12)
        self.assertEqual(a["idle_breakdown_ns"], idl)
        n, mean, mx, rt_out, delay_out = launch
        la = a["launch"]
        self.assertEqual((la["kernels"], la["runtime_outliers"], la["launch_delay_outliers"]), (n, rt_out, delay_out))
        self.assertAlmostEqual(la["launch_delay_mean_ns"], float(decimal.Decimal(str(mean)) * US), places=6)
        self.assertEqual(la["launch_delay_max_ns"], ns(mx))
        self.assertEqual(a["queue_length"], queue)

    def test_overlap(self):
        # ProfilerStep#1 [0,100), #2 [100,200): host rows kept if they start before 100: rt1 [6,9) -> K1 s7
        # [10,28) (add, C), rt2 [45,50) -> K2 s7 [55,80) (sgemm, C). rt3 (104, memcpy) and rt4 (132, relu) are
        # in the last step: their rows go.
        # Temporal: span 80-10 = 70, union 18+25 = 43, idle 27, compute 43, non_compute 0. Types: C 43.
        # No communication: ratio null. Idle s7: K2 gap 55-28 = 27, rt2 45 > 28: host_wait 27.
        # Launch delay = K start - rt end: 10-9 = 1, 55-50 = 5: mean 3, max 5. Queue s7: +1@6 -1@10 +1@45 -1@55.
        self.assertFigures(hta.analyses(fx("overlap.json")), 0, tb(27, 43, 0, 70), {"computation": 43},
                           (0, 0, None), idle(host_wait=27), (2, 3, 5, 0, 0), [q(7, [1, 0, 1, 0])])

    def test_overlap_include_last_step(self):
        # HTA's include_last_profiler_step=True keeps host rows starting at or before the last step's end
        # (200): memcpy s7 [109,115) (mem) and K3 s7 [140,170) (clamp, C) come back.
        # span 170-10 = 160; union 43+6+30 = 79: idle 81; compute 73; non_compute 6. Types C 73, mem 6.
        # Idle s7: K2 27 host (as above); memcpy gap 109-80 = 29, rt3 104 > 80: host; K3 gap 140-115 = 25,
        # rt4 132 > 115: host. host_wait 27+29+25 = 81.
        # Launch: 1, 5, memcpy 109-108 = 1, K3 140-136 = 4: mean 11/4, max 5.
        # Queue s7: +1@6 -1@10 +1@45 -1@55 +1@104 -1@109 +1@132 -1@140.
        a = hta.analyses(fx("overlap.json"), include_last_step=True)
        self.assertFigures(a, 0, tb(81, 73, 6, 160), {"computation": 73, "memory": 6}, (0, 0, None),
                           idle(host_wait=81), (4, 2.75, 5, 0, 0), [q(7, [1, 0] * 4)])

    def test_nccl_two_streams(self):
        # Trim at 100: rt1 [3,6) -> memset s7 [10,14); rt2 [9,15) -> memcpy s20 [16,32); rt3 [22,26) ->
        # sgemm s7 [28,70) (C); rt4 [47,52) -> nccl s20 [55,90) (comm).
        # Temporal: span 90-10 = 80; union [10,14) + [16,90) = 78: idle 2; compute 42; non_compute 36.
        # Types: [10,14) mem 4, [16,28) mem 12, [28,32) C+mem 4, [32,55) C 23, [55,70) C+comm 15,
        # [70,90) comm 20.
        # Overlap: comm 35, comm ∩ compute = [55,70) = 15: 15/35.
        # Idle: s7 sgemm gap 28-14 = 14, rt3 22 > 14: host; s20 nccl gap 55-32 = 23, rt4 47 > 32: host.
        # Launch: 10-6 = 4, 16-15 = 1, 28-26 = 2, 55-52 = 3: mean 2.5, max 4.
        # Queue s7: +1@3 -1@10 +1@22 -1@28; s20: +1@9 -1@16 +1@47 -1@55.
        self.assertFigures(
            hta.analyses(fx("nccl_two_streams.json")), 0, tb(2, 42, 36, 80),
            {"memory": 16, "computation+memory": 4, "computation": 23, "computation+communication": 15,
             "communication": 20},
            (35, 15, 15 / 35), idle(host_wait=37), (4, 2.5, 4, 0, 0), [q(7, [1, 0, 1, 0]), q(20, [1, 0, 1, 0])])

    def test_outlive(self):
        # Epoch time base E = 1712195495500000 us; times below are relative to it. Three steps: trim at the
        # start of ProfilerStep#3 (200): rt5 (215) and its K5 go. K1 s7 [30,140), K2 s20 [50,80),
        # K3 s7 [150,180), K4 s7 [185,190), all C.
        # Temporal: span 190-30 = 160; union 110+30+5 = 145 (K2 lies in K1): idle 15; compute 145.
        # Idle s7: K3 gap 150-140 = 10, rt3 115 < 140, 10 < 30: kernel_wait; K4 gap 5, rt4 125 < 180:
        # kernel_wait. s20 one row. Launch: K1 30-25 = 5, K2 50-45 = 5, K3 150-120 = 30, K4 185-128 = 57:
        # mean 97/4, max 57. Queue s7: +1@20 -1@30 +1@115 +1@125 -1@150 -1@185 -> 1,0,1,2,1,0 (max 2);
        # s20: +1@40 -1@50.
        a = hta.analyses(fx("outlive.json"))
        self.assertFigures(a, 0, tb(15, 145, 0, 160), {"computation": 145}, (0, 0, None), idle(kernel_wait=15),
                           (4, 24.25, 57, 0, 0), [q(7, [1, 0, 1, 2, 1, 0]), q(20, [1, 0])])
        self.assertEqual(a["info"]["trim_point_ns"], (1712195495500000 + 200) * US)

    def test_no_steps(self):
        # No ProfilerStep: nothing trimmed. memset s7 [12,16) (mem, correlation 99: no runtime call),
        # K1 s7 [30,70) (rt1 [20,25)), K2 s7 [90,110) (rt2 [65,70)), both C.
        # Temporal: span 110-12 = 98; union 4+40+20 = 64: idle 34; compute 60; non_compute 4.
        # Idle s7: K1 gap 30-16 = 14, rt1 20 > 16: host; K2 gap 90-70 = 20, rt2 65 < 70, 20 < 30: kernel_wait.
        # Launch (the memset has no launch call): 30-25 = 5, 90-70 = 20: mean 12.5, max 20.
        # Queue s7: +1@20 -1@30 +1@65 -1@90 (the memset has no launch call: no -1 either).
        self.assertFigures(hta.analyses(fx("no_steps.json")), 0, tb(34, 60, 4, 98),
                           {"computation": 60, "memory": 4}, (0, 0, None), idle(host_wait=14, kernel_wait=20),
                           (2, 12.5, 20, 0, 0), [q(7, [1, 0, 1, 0])])

    def test_two_ranks(self):
        # rank0: trim at 100: gemm s7 [25,60) (rt [15,20)), nccl s20 [62,90) (rt [52,56)). span 65, union 63,
        # idle 2, compute 35, non_compute 28; C 35, comm 28; overlap 0/28 = 0; one row per stream: no gaps.
        # Launch 25-20 = 5, 62-56 = 6. rank1: trim at 150: gemm s7 [25,110), nccl s20 [112,130) (rt [102,106)):
        # span 105, union 103, idle 2, compute 85, non_compute 18; overlap 0/18; launch 5, 6.
        self.assertFigures(hta.analyses(fx("two_ranks/rank0.json")), 0, tb(2, 35, 28, 65),
                           {"computation": 35, "communication": 28}, (28, 0, 0.0), idle(), (2, 5.5, 6, 0, 0),
                           [q(7, [1, 0]), q(20, [1, 0])])
        self.assertFigures(hta.analyses(fx("two_ranks/rank1.json")), 1, tb(2, 85, 18, 105),
                           {"computation": 85, "communication": 18}, (18, 0, 0.0), idle(), (2, 5.5, 6, 0, 0),
                           [q(7, [1, 0]), q(20, [1, 0])])

    def test_hta_streams(self):
        # hta_streams.json, rank 3. ProfilerStep#1 [0,1000), #2 [1000,1200): trim at 1000, so rt10 (1010)
        # and its K7 s7 [1020,1040) go. Kept (rt -> row):
        #   rt1 [10,15)      -> K1 s7 [20,120)   sgemm, C
        #   rt2 [16,20)      -> K2 s7 [125,145)  fill, C
        #   rt3 [21,25)      -> K3 s7 [150,200)  xmma gemm, C
        #   rt4 [30,35)      -> N1 s13 [100,300) nccl, comm
        #   rt5 [40,46)      -> M1 s20 [110,160) memcpy, mem (cudaMemcpyAsync)
        #   rt6 [250,255)    -> K4 s7 [260,300)  reduce, C
        #   rt7 [262,266)    -> K5 s7 [400,450)  clamp, C
        #   rt8 [499.7,560.3) -> K6 s7 [570,580.5) sgemm, C (fractional times: exact ns)
        # Not device rows: "Stream Sync" cuda_sync s7 [600,700) (DEVIATION 1), Triton's cpu_op with
        # args.stream 0 [800,810) (DEVIATION 1), gpu_user_annotation ProfilerStep#1/#2 (DEVIATION 3).
        # Temporal: span 580.5-20 = 560.5; union [20,300) 280 + 50 + 10.5 = 340.5: idle 220;
        # compute 100+20+50+40+50+10.5 = 270.5; non_compute 560.5-270.5-220 = 70.
        # Types: [20,100) C 80; [100,110) C+comm 10; [110,120) C+comm+mem 10; [120,125) comm+mem 5;
        # [125,145) C+comm+mem 20; [145,150) comm+mem 5; [150,160) C+comm+mem 10; [160,200) C+comm 40;
        # [200,260) comm 60; [260,300) C+comm 40; [400,450) C 50; [570,580.5) C 10.5.
        # -> C 140.5, C+comm 90, C+comm+mem 40, comm+mem 10, comm 60 (sum 340.5).
        # Overlap: comm 200; N1 ∩ compute = 20+20+50+40 = 130: 0.65.
        # Idle s7: K2 gap 5, rt2 16 < 120: kernel_wait 5; K3 gap 5, rt3 21 < 145: kernel_wait 5;
        # K4 gap 60, rt6 250 > 200: host_wait 60; K5 gap 100, rt7 262 < 300, 100 >= 30: other 100;
        # K6 gap 120, rt8 499.7 > 450: host_wait 120. s13, s20: one row each.
        # Launch delays: K1 20-15 = 5, K2 125-20 = 105, K3 150-25 = 125, N1 100-35 = 65, M1 110-46 = 64,
        # K4 260-255 = 5, K5 400-266 = 134, K6 570-560.3 = 9.7: sum 512.7, mean 64.0875, max 134;
        # delays > 100: 105, 125, 134 -> 3; runtime calls > 50 us: rt8 (60.6) -> 1.
        # Queue s7: +1@10 +1@16 -1@20 +1@21 -1@125 -1@150 +1@250 -1@260 +1@262 -1@400 +1@499.7 -1@570
        # -> 1,2,1,2,1,0,1,0,1,0,1,0 (max 2); s13: +1@30 -1@100; s20: +1@40 -1@110.
        a = hta.analyses(fx("hta_streams.json"))
        self.assertFigures(
            a, 3, tb("220", "270.5", "70", "560.5"),
            {"computation": "140.5", "computation+communication": 90, "computation+communication+memory": 40,
             "communication+memory": 10, "communication": 60},
            (200, 130, 0.65), idle(host_wait=180, kernel_wait=10, other=100), (8, "64.0875", 134, 1, 3),
            [q(7, [1, 2, 1, 2, 1, 0, 1, 0, 1, 0, 1, 0]), q(13, [1, 0]), q(20, [1, 0])])
        self.assertAlmostEqual(a["queue_length"][0]["mean"], 10 / 12)
        self.assertEqual(a["info"], {"device_rows": 8, "device_rows_before_trim": 9, "trim_point_ns": 1000 * US})


class Options(unittest.TestCase):
    def test_include_last_step_changes_hta_streams(self):
        # K7 s7 [1020,1040) (rt10 [1010,1015)) comes back: span 1040-20 = 1020; its gap 1020-580.5 = 439.5,
        # rt10 1010 > 580.5: host_wait 180+439.5. Launch +1: delay 1020-1015 = 5.
        a = hta.analyses(fx("hta_streams.json"), include_last_step=True)
        self.assertEqual(a["temporal_breakdown_ns"]["span"], ns(1020))
        self.assertEqual(a["idle_breakdown_ns"]["host_wait"], ns("619.5"))
        self.assertEqual(a["launch"]["kernels"], 9)

    def test_hta_literal_on_hta_streams(self):
        # HTA's own rules: the GPU-side gpu_user_annotation ProfilerStep#2 starts at 1020, later than the host
        # step (1000), so the trim point is 1020 and rt10 (1010) and K7 [1020,1040) stay (DEVIATION 3 off);
        # the Stream Sync [600,700) (other) and the Triton cpu_op [800,810) (args.stream 0: C) count as GPU
        # rows (DEVIATION 1 off). span 1040-20 = 1020; union 340.5+100+10+20 = 470.5: idle 549.5;
        # compute 270.5+10+20 = 300.5; non_compute 1020-300.5-549.5 = 170. The idle breakdown filters cats:
        # only K7 adds, host_wait 180+439.5.
        a = hta.analyses(fx("hta_streams.json"), literal=True)
        self.assertEqual(a["temporal_breakdown_ns"], tb("549.5", "300.5", 170, 1020))
        self.assertEqual(a["idle_breakdown_ns"], idle(host_wait="619.5", kernel_wait=10, other=100))
        self.assertEqual(a["info"]["trim_point_ns"], 1020 * US)

    def test_hta_us_rounding_on_hta_streams(self):
        # HTA's whole-us rounding (ceil ts, floor ts+dur): K6 [570,580.5) -> [570,580); rt8 [499.7,560.3)
        # -> [500,560): compute 270, span 560, K6's delay 10 (mean 513/8), rt8 60 us still > 50.
        a = hta.analyses(fx("hta_streams.json"), us_rounding=True)
        self.assertEqual(a["temporal_breakdown_ns"], tb(220, 270, 70, 560))
        self.assertEqual(a["launch"]["launch_delay_mean_ns"], 64125.0)
        self.assertEqual(a["launch"]["runtime_outliers"], 1)
        # integer traces are left alone
        self.assertEqual(hta.analyses(fx("outlive.json"), us_rounding=True), hta.analyses(fx("outlive.json")))

    def test_launch_names_and_same_stream_overlap(self):
        # DEVIATION 2: a Triton kernel launched by cuLaunchKernel (cuda_driver) and a ROCm kernel launched by
        # hipLaunchKernel count in the launch stats (HTA's list has neither). DEVIATION 5: K2 s7 [30,40)
        # lies inside K1 s7 [10,60); K3 s7 [70,80): its gap is from K1's end 60 (10, kernel_wait), and K2
        # adds nothing; HTA adds K2's 30-60 = -30 and K3's 70-40 = 30 (other).
        p = write_trace([
            rt("cuLaunchKernel", 0, 2, 1, cat="cuda_driver"), kern("triton_poi_fused_0", 7, 10, 50, 1),
            rt("hipLaunchKernel", 3, 2, 2), kern("Cijk_Alik_Bljk_SB", 7, 30, 10, 2),
            rt("cudaLaunchKernel", 6, 2, 3), kern("ampere_sgemm_128x64_nn", 7, 70, 10, 3)])
        try:
            a, lit = hta.analyses(p), hta.analyses(p, literal=True)
        finally:
            os.unlink(p)
        # delays: 10-2 = 8, 30-5 = 25, 70-8 = 62
        self.assertEqual(a["launch"]["kernels"], 3)
        self.assertEqual(a["launch"]["launch_delay_max_ns"], ns(62))
        self.assertEqual(lit["launch"]["kernels"], 1)
        self.assertEqual(a["idle_breakdown_ns"], idle(kernel_wait=10))
        self.assertEqual(lit["idle_breakdown_ns"], idle(kernel_wait=-30, other=30))
        # the queue counts all three launch calls in both modes: +1@0 +1@3 +1@6 -1@10 -1@30 -1@70
        self.assertEqual(a["queue_length"], [q(7, [1, 2, 3, 2, 1, 0])])

    def test_queue_ties_put_launches_first(self):
        # NOTE rule: a launch call and a row start at the same time: the +1 goes first (1,2,1,0, not 1,0,1,0).
        p = write_trace([rt("cudaLaunchKernel", 0, 2, 1), kern("k_a", 7, 10, 5, 1),
                         rt("cudaLaunchKernel", 10, 2, 2), kern("k_b", 7, 20, 5, 2)])
        try:
            self.assertEqual(hta.analyses(p)["queue_length"], [q(7, [1, 2, 1, 0])])
        finally:
            os.unlink(p)

    def test_trace_without_device_rows(self):
        p = write_trace([rt("cudaMalloc", 0, 2, 1), {"ph": "X", "cat": "cpu_op", "name": "aten::empty",
                                                        "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
        try:
            a = hta.analyses(p)
        finally:
            os.unlink(p)
        self.assertEqual(a["temporal_breakdown_ns"], tb(0, 0, 0, 0))
        self.assertEqual(a["kernel_breakdown_ns"], {})
        self.assertIsNone(a["overlap"]["ratio"])
        self.assertEqual(a["launch"]["kernels"], 0)
        self.assertIsNone(a["launch"]["launch_delay_mean_ns"])
        self.assertEqual(a["queue_length"], [])


class Plants(unittest.TestCase):
    def test_overlap_over_compute(self):
        # nccl_two_streams: 15 / compute 42 instead of 15 / comm 35; hta_streams: 130 / 270.5.
        self.assertAlmostEqual(hta.analyses(fx("nccl_two_streams.json"), "overlap_over_compute")["overlap"]["ratio"],
                               15 / 42)
        self.assertAlmostEqual(hta.analyses(fx("hta_streams.json"), "overlap_over_compute")["overlap"]["ratio"],
                               130 / 270.5)

    def test_idle_first_gap(self):
        # nccl_two_streams: the rank's first row starts at 10 (memset s7); s20's first row (memcpy, 16) gets
        # a gap of 6, rt2 9 < 10, 6 < 30: kernel_wait 6.
        self.assertEqual(hta.analyses(fx("nccl_two_streams.json"), "idle_first_gap")["idle_breakdown_ns"],
                         idle(host_wait=37, kernel_wait=6))
        # hta_streams: first row K1 at 20; N1 s13 at 100 (gap 80, rt4 30 > 20: host), M1 s20 at 110 (gap 90,
        # rt5 40 > 20: host): host_wait 180+170.
        self.assertEqual(hta.analyses(fx("hta_streams.json"), "idle_first_gap")["idle_breakdown_ns"],
                         idle(host_wait=350, kernel_wait=10, other=100))

    def test_every_plant_changes_a_figure(self):
        paths = [fx(n) for n in ("overlap.json", "nccl_two_streams.json", "outlive.json", "no_steps.json",
                                 "hta_streams.json", "two_ranks/rank0.json", "two_ranks/rank1.json")]
        for plant in hta.PLANTS:
            changed = [p for p in paths if hta.analyses(p, plant) != hta.analyses(p)]
            self.assertTrue(changed, plant)
            # and --check against the clean figures catches it
            code, out = run_check(report_of(changed), changed, "--plant", plant)
            self.assertEqual(code, 1, out)


class Check(unittest.TestCase):
    PATHS = [fx("two_ranks/rank0.json"), fx("two_ranks/rank1.json"), fx("hta_streams.json")]

    def test_agreeing_report_passes(self):
        code, out = run_check(report_of(self.PATHS), self.PATHS)
        self.assertEqual(code, 0, out)
        self.assertIn("0 disagreement(s): OK", out)

    def test_ranks_match_by_distributed_info(self):
        doc = report_of(self.PATHS)
        doc["ranks"].reverse()
        code, out = run_check(doc, self.PATHS)
        self.assertEqual(code, 0, out)

    def test_within_tolerance_passes(self):
        # hta_streams' span is 560.5 us: times may differ by 560.5 ns, ratios by 0.001
        def tweak(doc):
            r = doc["ranks"][2]
            r["temporal_breakdown_ns"]["idle"] += 560
            r["overlap"]["ratio"] += 0.0009
            r["launch"]["launch_delay_mean_ns"] -= 500
            r["queue_length"][0]["mean"] += 0.0009
            del r["kernel_breakdown_ns"]["communication+memory"]
            r["kernel_breakdown_ns"]["communication+memory"] = 10400  # a zero key may be left out too
        code, out = run_check(report_of(self.PATHS, tweak=tweak), self.PATHS)
        self.assertEqual(code, 0, out)

    def test_disagreements_fail(self):
        cases = {
            "temporal_breakdown_ns.idle": lambda r: r["temporal_breakdown_ns"].__setitem__("idle", 220000 + 600),
            "kernel_breakdown_ns.memory": lambda r: r["kernel_breakdown_ns"].__setitem__("memory", 5000),
            "overlap.ratio": lambda r: r["overlap"].__setitem__("ratio", None),
            "idle_breakdown_ns.other": lambda r: r["idle_breakdown_ns"].__setitem__("other", 0),
            "launch.kernels": lambda r: r["launch"].__setitem__("kernels", 9),
            "launch.runtime_outliers": lambda r: r["launch"].__setitem__("runtime_outliers", 0),
            "queue_length[7].max": lambda r: r["queue_length"][0].__setitem__("max", 3),
            "queue_length.streams": lambda r: r["queue_length"].pop(),
            "launch": lambda r: r.pop("launch"),
        }
        base = report_of(self.PATHS)
        for key, change in cases.items():
            doc = copy.deepcopy(base)
            change(doc["ranks"][2])
            code, out = run_check(doc, self.PATHS)
            self.assertEqual(code, 1, key)
            self.assertIn(f"rank=3 key={key} ", out, key)
            self.assertIn("1 disagreement(s): FAIL", out, key)

    def test_missing_and_extra_ranks_fail(self):
        doc = report_of(self.PATHS[:2])
        code, out = run_check(doc, self.PATHS)
        self.assertEqual(code, 1)
        self.assertIn("key=rank report=\"missing\"", out)
        doc = report_of(self.PATHS)
        doc["ranks"].append(dict(doc["ranks"][0], rank=7))
        code, out = run_check(doc, self.PATHS)
        self.assertEqual(code, 1)
        self.assertIn("rank=7 key=rank", out)

    def test_cli_prints_json(self):
        p = subprocess.run([sys.executable, ORACLE, fx("overlap.json")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        doc = json.loads(p.stdout)
        self.assertEqual(doc["temporal_breakdown_ns"]["span"], 70 * US)
        p = subprocess.run([sys.executable, ORACLE, fx("overlap.json"), fx("outlive.json")],
                           capture_output=True, text=True)
        self.assertEqual([d["trace"] for d in json.loads(p.stdout)], [fx("overlap.json"), fx("outlive.json")])


if __name__ == "__main__":
    unittest.main()
