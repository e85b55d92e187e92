#!/usr/bin/python3
"""Self-tests of tests/oracles/tb_overview.py, without the C++ side.

    /usr/bin/python3 tests/oracles/test_tb_overview_oracle.py

Every expected number below was worked out by hand from the fixture in
tests/fixtures/torch-traces/ (the working is in the comments; times there are in microseconds relative
to the fixture's first event, "K" a kernel, "rt" a runtime call). Each plant (--plant) must change
the numbers of at least one fixture, and `--check` must pass a report that agrees with the oracle
and fail one that does not.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tb_overview as tbo  # noqa: E402

FIX = os.path.join(HERE, "..", "fixtures", "torch-traces")
ORACLE = os.path.join(HERE, "tb_overview.py")
US = 1000  # ns per microsecond
EPOCH = 1712195495500000 * US  # outlive.json's time base


def fx(name):
    return os.path.join(FIX, name)


def bd(kernel=0, memcpy=0, memset=0, communication=0, runtime=0, dataloader=0, cpu_exec=0, other=0):
    """A breakdown in microseconds, as nanoseconds."""
    return {"kernel": kernel * US, "memcpy": memcpy * US, "memset": memset * US,
            "communication": communication * US, "runtime": runtime * US, "dataloader": dataloader * US,
            "cpu_exec": cpu_exec * US, "other": other * US}


def report_of(paths, plant=None, tweak=None):
    """A `wb report --json` document holding exactly what the oracle computes for paths."""
    ranks, recs = [], set()
    for p in paths:
        ov = tbo.overview(p, plant)
        recs.update(ov["recommendations"])
        ranks.append({"rank": ov["rank"], "steps": ov["steps"], "breakdown_mean_ns": ov["breakdown_mean_ns"],
                      "gpu": ov["gpu"]})
    doc = {"ranks": ranks, "recommendations": [{"id": r, "text": "..."} for r in sorted(recs)]}
    if tweak:
        tweak(doc)
    return doc


def run_check(doc, paths, plant=None):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        cmd = [sys.executable, ORACLE, "--check", f.name] + (["--plant", plant] if plant else []) + paths
        p = subprocess.run(cmd, capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    finally:
        os.unlink(f.name)


class Intervals(unittest.TestCase):
    def test_set_operations(self):
        self.assertEqual(tbo.union([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)]), [(0, 3), (5, 9)])
        self.assertEqual(tbo.intersect([(0, 3), (5, 9)], [(2, 6), (8, 20)]), [(2, 3), (5, 6), (8, 9)])
        self.assertEqual(tbo.subtract([(0, 10), (12, 14)], [(2, 3), (5, 13)]), [(0, 2), (3, 5), (13, 14)])
        self.assertEqual(tbo.total([(0, 3), (5, 9)]), 7)

    def test_valued_segments(self):
        # 0.6 on [0,10], 0.8 on [5,15]: [0,5] 0.6, [5,10] 1.4 -> 1.0, [10,15] 0.8
        segs = tbo.valued_segments([(0, 10, 0.6), (5, 15, 0.8)])
        self.assertEqual([(s, e) for s, e, _ in segs], [(0, 5), (5, 10), (10, 15)])
        self.assertEqual([round(v, 9) for _, _, v in segs], [0.6, 1.0, 0.8])
        self.assertAlmostEqual(tbo.valued_segments([(0, 10, 0.6), (5, 15, 0.8)], clip_at_one=False)[1][2], 1.4)

    def test_to_ns_is_exact(self):
        import decimal
        self.assertEqual(tbo.to_ns(decimal.Decimal("1712195495502094.123")), 1712195495502094123)
        self.assertEqual(tbo.to_ns(decimal.Decimal("0.0005")), 1)
        self.assertEqual(tbo.to_ns(17), 17000)


class Fixtures(unittest.TestCase):
    def assertOverview(self, ov, steps, mean, gpu, recs, rank=0):
        self.assertEqual(ov["rank"], rank)
        self.assertEqual([(r["step"], r["start_ns"], r["end_ns"]) for r in ov["steps"]], [s[:3] for s in steps])
        for row, s in zip(ov["steps"], steps):
            self.assertEqual(row["breakdown_ns"], s[3], f"step {s[0]}")
            self.assertEqual(sum(row["breakdown_ns"].values()), row["end_ns"] - row["start_ns"])
        for c in tbo.CLASSES:
            self.assertAlmostEqual(ov["breakdown_mean_ns"][c], mean[c], places=6, msg=c)
        if gpu is None:
            self.assertIsNone(ov["gpu"])
        else:
            self.assertEqual(ov["gpu"]["device"], gpu["device"])
            for k in tbo.GPU_FRACTIONS:
                if gpu[k] is None:
                    self.assertIsNone(ov["gpu"][k], k)
                else:
                    self.assertAlmostEqual(ov["gpu"][k], gpu[k], places=9, msg=k)
        self.assertEqual(ov["recommendations"], recs)

    def test_overlap(self):
        # Step 1 host [0,100]: DataLoader [0,30] holds aten::add [5,12] (rt [6,9] -> K1 [10,28]);
        # aten::mm [40,60] (rt [45,50] -> K2 [55,80]). Device end 80 < 100: the step stays [0,100].
        #   Kernel 18+25=43; Runtime [6,9]+[45,50]=8; DataLoader [0,30]-K1-rt = [0,6]+[9,10]+[28,30] = 9;
        #   CPU Exec: aten::add all taken, aten::mm [40,45]+[50,55] = 10; Other [30,40]+[80,100] = 30.
        # Step 2 host [100,200]: DataLoader [100,120] holds aten::to [102,110] (rt [104,108] -> memcpy
        # [109,115]); aten::relu [130,150] (rt [132,136] -> K3 [140,170]). Stays [100,200].
        #   Kernel 30; Memcpy 6; Runtime 4+4=8; DataLoader [100,104]+[108,109]+[115,120] = 10;
        #   CPU Exec [130,132]+[136,140] = 6; Other [120,130]+[170,200] = 40.
        # Steps match 2 and 2 device events: no tail removal.
        # GPU over [0,200]: kernels 18+25+30 = 73 -> 0.365. SM eff, blocks per SM K1 0.5, K2 2.0 (-> 1.0),
        # K3 1.0: (18*0.5+25*1+30*1)/200 = 0.32. Occupancy (18*50+25*25+30*40)/73 = 37.3288% -> 0.373288.
        # No kernel name on the TC list: share 0. DataLoader 9.5/100 > 0.05; utilization < 0.5; aten::mm
        # (TC-eligible) launched K2 and the share is 0 with computeMajor 8: amp.
        self.assertOverview(
            tbo.overview(fx("overlap.json")),
            [(1, 0, 100 * US, bd(kernel=43, runtime=8, dataloader=9, cpu_exec=10, other=30)),
             (2, 100 * US, 200 * US, bd(kernel=30, memcpy=6, runtime=8, dataloader=10, cpu_exec=6, other=40))],
            bd(kernel=36.5, memcpy=3, runtime=8, dataloader=9.5, cpu_exec=8, other=35),
            {"device": 0, "utilization": 0.365, "sm_efficiency": 0.32, "achieved_occupancy": 2725 / 73 / 100,
             "tensor_core_share": 0.0},
            ["dataloader", "gpu_utilization", "amp"])

    def test_outlive(self):
        # Epoch time base (1712195495500000 us). Step 1 host [0,100]: aten::conv2d [10,90], rt [20,25] ->
        # KA [30,140] (xmma_gemm, TC, bps 0.6, occ 20%); rt [40,45] -> KB [50,80] on stream 20 (bps 0.8,
        # occ 60%). KA outlives the host step: step 1 = [0, max(100,140)] = [0,140].
        # Step 2 host [100,200]: aten::relu [110,150], rt [115,120] -> KC [150,180], rt [125,128] -> KD
        # [185,190] (bps 0.5, occ 30%). Step 2 = [max(140,100), max(200,190)] = [140,200].
        # Step 3 host [200,300]: aten::add, rt [215,220] -> KE [230,240] (bps 0.7, occ 90%). Matched device
        # events 2, 2, 1: 2*0.8 > 1 drops step 3.
        #   Step 1: Kernel [30,140] = 110; Runtime [20,25] = 5 (the others lie under KA); CPU Exec
        #   [10,20]+[25,30] = 15; Other [0,10] = 10.
        #   Step 2: Kernel 30+5 = 35; CPU Exec relu's [140,150] = 10; Other [180,185]+[190,200] = 15.
        # GPU over [0,200]: kernels 110+30+5 = 145 -> 0.725. SM eff: [30,50] 0.6, [50,80] 0.6+0.8 = 1.4 -> 1.0,
        # [80,140] 0.6, [150,180] 0.5, [185,190] 0.5: (12+30+36+15+2.5)/200 = 0.4775 (KE lies outside).
        # Occupancy (110*20+30*60+30*30+5*30)/175 = 28.857% -> 0.288571. TC share over every launched
        # kernel (KE too): 110/(110+30+30+5+10) = 110/185. No recommendation.
        self.assertOverview(
            tbo.overview(fx("outlive.json")),
            [(1, EPOCH, EPOCH + 140 * US, bd(kernel=110, runtime=5, cpu_exec=15, other=10)),
             (2, EPOCH + 140 * US, EPOCH + 200 * US, bd(kernel=35, cpu_exec=10, other=15))],
            bd(kernel=72.5, runtime=2.5, cpu_exec=12.5, other=12.5),
            {"device": 0, "utilization": 0.725, "sm_efficiency": 0.4775, "achieved_occupancy": 5050 / 175 / 100,
             "tensor_core_share": 110 / 185},
            [])

    def test_memory_at_the_limit(self):
        # outlive.json plus device 0's allocation at 95% of its 85100068864 bytes, then nearly all freed,
        # and a CPU allocation of 90 GB (over the GPU's memory, but the rule leaves the CPU out).
        ov = tbo.overview(fx("memory_full.json"))
        self.assertEqual(ov["recommendations"], ["memory"])
        doc = json.load(open(fx("memory_full.json")))
        self.assertEqual(tbo.device_memory_peaks(doc), {(1, 0): int(85100068864 * 0.95)})
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not (e.get("name") == "[memory]" and e["args"]["Device Type"] == 1)]
        self.assertFalse(tbo.memory_at_limit(doc))  # the CPU's 90 GB alone
        self.assertEqual(tbo.overview(fx("outlive.json"))["recommendations"], [])

    def test_nccl_two_streams(self):
        # Step 1 [0,100]: aten::zero_ [2,8] rt [3,6] -> memset [10,14]; aten::copy_ [8,20] rt [9,15] ->
        # memcpy [16,32] (stream 20); aten::mm [20,40] rt [22,26] -> K1 sgemm [28,70] (stream 7);
        # nccl:all_reduce [45,60] rt [47,52] -> ncclDevKernel_AllReduce [55,90] (stream 20).
        #   Kernel 42; Memcpy [16,28] = 12; Memset 4; Communication ([45,60] u [55,90]) - K1 = [70,90] = 20;
        #   Runtime [3,6]+[9,10]+[14,15] = 5; CPU Exec [2,40] less the above = [2,3]+[6,9]+[15,16] = 5;
        #   Other [0,2]+[90,100] = 12.
        # Step 2 [100,200]: aten::zero_ [101,104] rt [102,103] -> memset [104,108]; aten::mm [105,130]
        # rt [110,115] -> K2 xmma_gemm [120,160]; nccl:all_reduce [135,150] rt [138,142] -> nccl K
        # [150,195]; aten::copy_ [152,160] rt [153,156] -> memcpy [165,185] (stream 7).
        #   Kernel 40; Memcpy 20; Memset 4; Communication [135,195]-K2-memcpy = [160,165]+[185,195] = 15;
        #   Runtime 1+5 = 6; CPU Exec [101,102]+[103,104]+[108,110]+[115,120] = 9; Other [100,101]+[195,200] = 6.
        # Matched 4 and 4: both steps stay; no device end passes a host end.
        # GPU over [0,200] (comm kernels count): [28,90]+[120,195] = 137 -> 0.685. SM eff (K 1.0, nccl 0.25):
        # 27*1 + 15*min(1.25,1) + 20*0.25 + 30*1 + 10*1 + 35*0.25 = 95.75 -> 0.47875.
        # Occupancy (42*25+35*10+40*25+45*10)/162 = 17.593% -> 0.175926. TC share 40/162.
        # Communication 17.5/100 > 0.10.
        self.assertOverview(
            tbo.overview(fx("nccl_two_streams.json")),
            [(1, 0, 100 * US, bd(kernel=42, memcpy=12, memset=4, communication=20, runtime=5, cpu_exec=5, other=12)),
             (2, 100 * US, 200 * US,
              bd(kernel=40, memcpy=20, memset=4, communication=15, runtime=6, cpu_exec=9, other=6))],
            bd(kernel=41, memcpy=16, memset=4, communication=17.5, runtime=5.5, cpu_exec=7, other=9),
            {"device": 0, "utilization": 0.685, "sm_efficiency": 0.47875, "achieved_occupancy": 2850 / 162 / 100,
             "tensor_core_share": 40 / 162},
            ["communication"])

    def test_no_steps(self):
        # No ProfilerStep. Step 0 spans the cpu_op events: aten::linear [10,50] ... aten::relu ends at 80:
        # [10,80]. The python_function [0,130] and the user_annotation "forward" [5,85] do not count there.
        # aten::addmm [15,45] rt [20,25] -> K1 sgemm [30,70]; aten::relu [60,80] rt [65,70] -> K2 [90,110].
        # A memset [12,16] with no runtime call is unmatched and ends before K1 starts: the step starts at
        # max(10, 16) = 16 and ends at max(80, 110) = 110.
        #   Kernel 40+20 = 60; Runtime [20,25] = 5; CPU Exec ("forward" counts) [16,85] less kernels and
        #   runtime = [16,20]+[25,30]+[70,85] = 24; Other [85,90] = 5; the memset lies before the step.
        # GPU over [16,110] (94): 60/94. SM eff (K1 0.5, K2 1.0) (20+20)/94. Occupancy (40*40+20*60)/60
        # = 46.667%. TC share 0; addmm (eligible, innermost op around rt [20,25]) launched K1: amp.
        self.assertOverview(
            tbo.overview(fx("no_steps.json")),
            [(0, 16 * US, 110 * US, bd(kernel=60, runtime=5, cpu_exec=24, other=5))],
            bd(kernel=60, runtime=5, cpu_exec=24, other=5),
            {"device": 0, "utilization": 60 / 94, "sm_efficiency": 40 / 94, "achieved_occupancy": 2800 / 60 / 100,
             "tensor_core_share": 0.0},
            ["amp"])

    def test_two_ranks(self):
        # Rank 0, steps 7 and 8 of 100 us each (b = 0, 100): aten::mm [b+10,b+40] rt [b+15,b+20] -> xmma
        # gemm [b+25,b+60] (bps 1, occ 50%); nccl:all_reduce [b+50,b+60] rt [b+52,b+56] -> nccl K
        # [b+62,b+90] (bps 0.5, occ 10%).
        #   Kernel 35; Communication ([50,60] u [62,90]) - gemm = 28; Runtime 5; CPU Exec [10,15]+[20,25]
        #   = 10; Other [0,10]+[60,62]+[90,100] = 22. GPU 0: 2*63/200 = 0.63; SM eff 2*(35+14)/200 = 0.49;
        #   occupancy (35*50+28*10)/63 = 32.22%; TC 70/126. Communication 28% > 10%.
        self.assertOverview(
            tbo.overview(fx("two_ranks/rank0.json")),
            [(7, 0, 100 * US, bd(kernel=35, communication=28, runtime=5, cpu_exec=10, other=22)),
             (8, 100 * US, 200 * US, bd(kernel=35, communication=28, runtime=5, cpu_exec=10, other=22))],
            bd(kernel=35, communication=28, runtime=5, cpu_exec=10, other=22),
            {"device": 0, "utilization": 0.63, "sm_efficiency": 0.49, "achieved_occupancy": 2030 / 63 / 100,
             "tensor_core_share": 70 / 126},
            ["communication"], rank=0)
        # Rank 1 (device 1), slower, steps of 150 us (b = 0, 150): aten::mm [b+10,b+70] -> gemm [b+25,b+110];
        # nccl:all_reduce [b+100,b+110] -> nccl K [b+112,b+130].
        #   Kernel 85; Communication [112,130] = 18; Runtime 5; CPU Exec 10; Other [0,10]+[110,112]+[130,150]
        #   = 32. GPU 1: 2*103/300; SM eff 2*(85+9)/300; occupancy (85*50+18*10)/103; TC 170/206;
        #   Communication 18/150 = 12% > 10%.
        self.assertOverview(
            tbo.overview(fx("two_ranks/rank1.json")),
            [(7, 0, 150 * US, bd(kernel=85, communication=18, runtime=5, cpu_exec=10, other=32)),
             (8, 150 * US, 300 * US, bd(kernel=85, communication=18, runtime=5, cpu_exec=10, other=32))],
            bd(kernel=85, communication=18, runtime=5, cpu_exec=10, other=32),
            {"device": 1, "utilization": 206 / 300, "sm_efficiency": 188 / 300,
             "achieved_occupancy": 4430 / 103 / 100, "tensor_core_share": 170 / 206},
            ["communication"], rank=1)


class Plants(unittest.TestCase):
    def test_dataloader_first(self):
        # overlap.json step 1: DataLoader takes all of [0,30] (30 instead of 9), Kernel loses K1's 18 us.
        ov = tbo.overview(fx("overlap.json"), "dataloader_first")
        self.assertEqual(ov["steps"][0]["breakdown_ns"]["dataloader"], 30 * US)
        self.assertEqual(ov["steps"][0]["breakdown_ns"]["kernel"], 25 * US)

    def test_host_step_end(self):
        # outlive.json step 1 ends at its host end, 100, not at KA's end, 140.
        ov = tbo.overview(fx("outlive.json"), "host_step_end")
        self.assertEqual(ov["steps"][0]["end_ns"], EPOCH + 100 * US)
        # no_steps.json: step 0 ends at 80, not 110.
        self.assertEqual(tbo.overview(fx("no_steps.json"), "host_step_end")["steps"][0]["end_ns"], 80 * US)

    def test_sm_eff_no_min(self):
        # outlive.json: [50,80] counts 1.4, not 1.0: (12+42+36+15+2.5)/200 = 0.5375.
        self.assertAlmostEqual(tbo.overview(fx("outlive.json"), "sm_eff_no_min")["gpu"]["sm_efficiency"], 0.5375)
        # nccl_two_streams.json: 25 us at 1.25: 0.47875 + 25*0.25/200 = 0.51.
        self.assertAlmostEqual(
            tbo.overview(fx("nccl_two_streams.json"), "sm_eff_no_min")["gpu"]["sm_efficiency"], 0.51)

    def test_each_plant_changes_a_fixture(self):
        names = ["overlap.json", "outlive.json", "nccl_two_streams.json", "no_steps.json",
                 "two_ranks/rank0.json", "two_ranks/rank1.json"]
        for plant in tbo.PLANTS:
            changed = [n for n in names if tbo.overview(fx(n), plant) != tbo.overview(fx(n))]
            self.assertTrue(changed, plant)


class Check(unittest.TestCase):
    ALL = ["overlap.json", "outlive.json", "nccl_two_streams.json", "no_steps.json"]

    def test_agreeing_reports_pass(self):
        for name in self.ALL:
            rc, out = run_check(report_of([fx(name)]), [fx(name)])
            self.assertEqual(rc, 0, out)
            self.assertIn("0 disagreement(s)", out)

    def test_ranks_match_by_distributed_rank(self):
        paths = [fx("two_ranks/rank0.json"), fx("two_ranks/rank1.json")]
        doc = report_of(paths, tweak=lambda d: d["ranks"].reverse())
        rc, out = run_check(doc, paths)
        self.assertEqual(rc, 0, out)

    def test_plants_fail_a_correct_report(self):
        for plant, name, what in (("dataloader_first", "overlap.json", "class=dataloader"),
                                  ("host_step_end", "outlive.json", "class=duration"),
                                  ("sm_eff_no_min", "outlive.json", "class=gpu.sm_efficiency")):
            rc, out = run_check(report_of([fx(name)]), [fx(name)], plant)
            self.assertEqual(rc, 1, f"{plant}: {out}")
            self.assertIn(what, out, plant)

    def test_wrong_reports_fail(self):
        def more_kernel(d):
            d["ranks"][0]["steps"][1]["breakdown_ns"]["kernel"] += 101  # tolerance is 0.1% of 100 us
        def no_gpu(d):
            d["ranks"][0]["gpu"] = None
        def no_recs(d):
            d["recommendations"] = []
        def other_steps(d):
            d["ranks"][0]["steps"][1]["step"] = 3
        for tweak, what in ((more_kernel, "step=2 class=kernel"), (no_gpu, "class=gpu "),
                            (no_recs, "class=recommendations"), (other_steps, "class=steps")):
            rc, out = run_check(report_of([fx("overlap.json")], tweak=tweak), [fx("overlap.json")])
            self.assertEqual(rc, 1, out)
            self.assertIn(what, out)
        # Within tolerance: 100 ns on a 100 us step passes.
        def slight(d):
            d["ranks"][0]["steps"][1]["breakdown_ns"]["kernel"] += 100
        self.assertEqual(run_check(report_of([fx("overlap.json")], tweak=slight), [fx("overlap.json")])[0], 0)


if __name__ == "__main__":
    unittest.main()
