// LR schedules against values computed independently: MindSpore's _generate_cosine_lr transcribed in
// Python and run by WB_PYTHON, torch's StepLR / MultiStepLR, and a few hand-computed values.
#include <catch2/catch.hpp>

#include <fstream>
#include <numbers>
#include <sstream>

#include "test_backend_util.hpp"
#include "trainer/optim/lr_schedule.hpp"

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::optim::LrSchedule;
using wb::optim::LrScheduleConfig;
using wb::optim::LrScheduleKind;

namespace {

const char* kScript = R"PY(
def _generate_cosine_lr(lr_init, lr_end, lr_max, total_steps, warmup_steps):
    decay_steps = total_steps - warmup_steps
    lr_each_step = []
    for i in range(total_steps):
        if i < warmup_steps:
            lr_inc = (float(lr_max) - float(lr_init)) / float(warmup_steps)
            lr = float(lr_init) + lr_inc * (i + 1)
        else:
            linear_decay = (total_steps - i) / decay_steps
            cosine_decay = 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / decay_steps))
            decayed = linear_decay * cosine_decay + 0.00001
            lr = lr_max * decayed
        lr_each_step.append(lr)
    return lr_each_step
np.array(_generate_cosine_lr(0.0, 0.0, 0.8, 500, 37), dtype=np.float64).tofile("cosine.out")
np.array(_generate_cosine_lr(0.01, 0.0, 0.1, 40, 0), dtype=np.float64).tofile("cosine_nowarm.out")
def torch_lrs(make, n):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.4)
    sched = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step(); sched.step()
    return np.array(out, dtype=np.float64)
torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5), 30).tofile("step.out")
torch_lrs(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[5, 12, 20], gamma=0.1), 30).tofile("multistep.out")
)PY";

// The reference values, computed once (Catch re-enters the test case for every section).
std::vector<double> reference(const char* name) {
  static wb::test::TempDir dir("lr");
  static bool ran = false;
  if (!ran) {
    wb::test::run_torch_script(dir, "lr", kScript);
    ran = true;
  }
  std::ifstream f(dir.file(name), std::ios::binary);
  std::vector<double> v;
  double x;
  while (f.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

}  // namespace

TEST_CASE("cosine with warm-up, step and multistep schedules match Python", "[trainer][model]") {
  auto read64 = [](const char* name) { return reference(name); };
  auto expect = [](const LrSchedule& s, const std::vector<double>& ref) {
    REQUIRE(!ref.empty());
    for (std::size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(i);
      CHECK_THAT(s.lr_at(static_cast<std::int64_t>(i)), WithinRel(ref[i], 1e-12) || WithinAbs(ref[i], 1e-15));
    }
  };
  SECTION("cosine with warm-up (the seed guide's lr_init 0, lr_max 0.8)") {
    LrScheduleConfig c;
    c.kind = LrScheduleKind::cosine;
    c.lr = 0.8;
    c.lr_init = 0.0;
    c.total_steps = 500;
    c.warmup_steps = 37;
    expect(LrSchedule(c), read64("cosine.out"));
    // Past the end the last value holds.
    CHECK_THAT(LrSchedule(c).lr_at(10000), WithinRel(LrSchedule(c).lr_at(499), 1e-15));
  }
  SECTION("cosine without warm-up") {
    LrScheduleConfig c;
    c.kind = LrScheduleKind::cosine;
    c.lr = 0.1;
    c.lr_init = 0.01;
    c.total_steps = 40;
    expect(LrSchedule(c), read64("cosine_nowarm.out"));
  }
  SECTION("step: StepLR(step_size 7, gamma 0.5)") {
    LrScheduleConfig c;
    c.kind = LrScheduleKind::step;
    c.lr = 0.4;
    c.step_size = 7;
    c.gamma = 0.5;
    expect(LrSchedule(c), read64("step.out"));
  }
  SECTION("multistep: MultiStepLR(milestones 5, 12, 20, gamma 0.1)") {
    LrScheduleConfig c;
    c.kind = LrScheduleKind::multistep;
    c.lr = 0.4;
    c.milestones = {5, 12, 20};
    c.gamma = 0.1;
    expect(LrSchedule(c), read64("multistep.out"));
  }
}

TEST_CASE("hand-computed schedule values, world-size scaling and bad settings", "[trainer][model]") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::cosine;
  c.lr = 1.0;
  c.lr_init = 0.0;
  c.total_steps = 10;
  c.warmup_steps = 4;
  LrSchedule s(c);
  // Warm-up: 0 + (1 - 0) / 4 * (i + 1).
  CHECK_THAT(s.lr_at(0), WithinRel(0.25, 1e-15));
  CHECK_THAT(s.lr_at(3), WithinRel(1.0, 1e-15));
  // i = 4, decay_steps 6: (10 - 4) / 6 * 0.5 * (1 + cos(2 pi 0.47 * 4 / 6)) + 1e-5.
  CHECK_THAT(s.lr_at(4), WithinRel(1.0 * 0.5 * (1.0 + std::cos(2.0 * std::numbers::pi * 0.47 * 4.0 / 6.0)) + 1e-5, 1e-14));
  c.scale_by_world_size = true;
  c.world_size = 8;
  CHECK_THAT(LrSchedule(c).lr_at(3), WithinRel(8.0, 1e-15));

  LrScheduleConfig k;
  CHECK_THAT(LrSchedule(k).lr_at(123), WithinRel(0.1, 1e-15));  // constant default
  CHECK(wb::optim::parse_lr_schedule_kind("multistep") == LrScheduleKind::multistep);
  REQUIRE_THROWS_AS(wb::optim::parse_lr_schedule_kind("linear"), wb::optim::LrScheduleError);
  LrScheduleConfig bad = c;
  bad.warmup_steps = 10;  // no decay phase left
  REQUIRE_THROWS_AS(LrSchedule(bad), wb::optim::LrScheduleError);
  LrScheduleConfig bad_step;
  bad_step.kind = LrScheduleKind::step;
  bad_step.step_size = 0;
  REQUIRE_THROWS_AS(LrSchedule(bad_step), wb::optim::LrScheduleError);
  LrScheduleConfig bad_ws;
  bad_ws.world_size = 0;
  REQUIRE_THROWS_AS(LrSchedule(bad_ws), wb::optim::LrScheduleError);
}
