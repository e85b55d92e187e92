// wb-train's device choice and its GPU path. Without a GPU (CI): --device cuda is one line and exit
// code 2, --device auto trains on the CPU and says so, CUDA-only settings are refused on the CPU, and
// GradientSync's bucket-ready hook (what orders NCCL after the gradient kernels) runs before each
// bucket's allreduce. On a GPU ([cuda]; the test main skips them without one, and CTest reports
// test_trainer_device-cuda as skipped, see tests/support/main.cpp): a short CUDA run's losses follow a CPU
// run's on the same data, its kernels link to the host ranges that launched them, and the device
// queue's depth is recorded.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "profiler/record/clock.hpp"
#include "store/db.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/gradient_sync.hpp"

namespace {

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::test::count_lines;
using wb::test::Result;
using wb::test::require_one_line_error;
using wb::test::run_train;
using wb::test::with;
using wb::test::TempDir;
namespace fs = std::filesystem;

// Small, fast settings: ResNet-50 at 32x32, batch 4, synthetic data.
std::vector<std::string> small_run(const fs::path& run, int steps) {
  return {"--run", run.string(), "--steps", std::to_string(steps), "--batch-size", "4", "--synthetic-samples", "64",
          "--data-workers", "1", "--seed", "3"};
}

std::string meta(wb::store::Db& db, const std::string& key) {
  auto& st = db.prepare("SELECT value FROM meta WHERE key = ?");
  st.reset();
  st.bind(1, key);
  return st.step() ? st.column_text(0) : std::string("<missing>");
}

std::string rank_device(wb::store::Db& db) {
  auto& st = db.prepare("SELECT device FROM rank WHERE rank = 0");
  st.reset();
  return st.step() ? st.column_text(0) : std::string("<missing>");
}

std::vector<double> losses(wb::store::Db& db) {
  std::vector<double> out;
  auto& st = db.prepare("SELECT loss FROM step WHERE rank = 0 ORDER BY step");
  st.reset();
  while (st.step()) out.push_back(st.column_double(0));
  return out;
}

bool has_gpu() { return wb::backend::cuda_device_count() > 0; }

}  // namespace

// [no-cuda]: where a device is present the test main reports this case skipped (tests/support/main.cpp).
TEST_CASE("wb-train --device cuda without a GPU: one line, exit code 2, no run file", "[trainer][no-cuda]") {
  TempDir dir;
  const fs::path run = dir / "run.sqlite";
  const Result r = run_train(with(small_run(run, 1), {"--device", "cuda"}));
  // Which of the two depends on the build; both name the flag and say why.
  const bool built = r.err.find("--device cuda: no CUDA device found") != std::string::npos;
  const bool not_built = r.err.find("--device cuda: this wb-train was built without CUDA") != std::string::npos;
  CAPTURE(r.err);
  CHECK((built || not_built));
  require_one_line_error(r, {"--device cuda"});
  CHECK_FALSE(fs::exists(run));
}

TEST_CASE("wb-train --device auto trains on the CPU when there is no GPU, and the run says so", "[trainer]") {
  TempDir dir;
  const fs::path run = dir / "run.sqlite";
  const Result r = run_train(with(small_run(run, 2), {"--device", "auto", "--no-profile"}));
  CAPTURE(r.exit_code, r.err, r.out);
  REQUIRE(r.exit_code == 0);
  wb::store::Db db(run, wb::store::OpenMode::read_only);
  if (has_gpu()) {
    CHECK(meta(db, "device") == "cuda");
    CHECK(rank_device(db).rfind("cuda:0 (", 0) == 0);
    return;
  }
  // The notice: one line on stderr that names the flag and where training went.
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("wb-train: --device auto: ") == 0);
  CHECK(r.err.find("training on the CPU") != std::string::npos);
  CHECK(meta(db, "device") == "cpu");
  CHECK(meta(db, "device_name") == "cpu");
  CHECK(meta(db, "precision") == "fp32");
  CHECK(meta(db, "channels_last") == "0");
  CHECK(rank_device(db) == "cpu");
  CHECK(meta(db, "complete") == "1");
  const std::vector<double> l = losses(db);
  REQUIRE(l.size() == 2);
  CHECK(std::isfinite(l[0]));
  CHECK(std::isfinite(l[1]));
  // The recorded config says what was asked for; meta.device says what ran.
  CHECK(meta(db, "config_json").find("\"device\":\"auto\"") != std::string::npos);
}

TEST_CASE("wb-train refuses GPU-only settings on the CPU with one line and exit code 2", "[trainer]") {
  TempDir dir;
  const fs::path run = dir / "run.sqlite";
  const auto base = small_run(run, 1);
  SECTION("--precision bf16 on --device cpu") {
    require_one_line_error(run_train(with(base, {"--device", "cpu", "--precision", "bf16"})),
                           {"--precision bf16", "fp32 only", "--device cuda"});
  }
  SECTION("--precision tf32 on the default device (cpu)") {
    require_one_line_error(run_train(with(base, {"--precision", "tf32"})),
                           {"--precision tf32", "fp32 only"});
  }
  SECTION("--channels-last on the CPU") {
    require_one_line_error(run_train(with(base, {"--channels-last"})), {"--channels-last", "--device cuda"});
  }
  SECTION("--nvtx on the CPU") {
    require_one_line_error(run_train(with(base, {"--nvtx"})), {"--nvtx", "--device cuda"});
  }
  SECTION("--device-prefetch 0") {
    require_one_line_error(run_train(with(base, {"--device", "auto", "--device-prefetch", "0"})),
                           {"--device-prefetch", "at least 1"});
  }
  SECTION("--ranks-per-gpu on the CPU, and 0") {
    require_one_line_error(run_train(with(base, {"--ranks-per-gpu", "2"})), {"--ranks-per-gpu", "--device cuda"});
    require_one_line_error(run_train(with(base, {"--device", "auto", "--ranks-per-gpu", "0"})),
                           {"--ranks-per-gpu", "at least 1"});
  }
  SECTION("--precision fp16 (not a precision)") {
    require_one_line_error(run_train(with(base, {"--precision", "fp16"})),
                           {"--precision", "expected fp32, tf32 or bf16", "fp16"});
  }
  CHECK_FALSE(fs::exists(run));
}

TEST_CASE("--device auto --precision bf16 when auto finds no GPU: one line and exit code 2", "[trainer][no-cuda]") {
  TempDir dir;
  const fs::path run = dir / "run.sqlite";
  require_one_line_error(run_train(with(small_run(run, 1), {"--device", "auto", "--precision", "bf16"})),
                         {"--precision bf16", "--device auto found no GPU", "fp32 only"});
  CHECK_FALSE(fs::exists(run));
}

TEST_CASE("GradientSync calls on_ready once per bucket, before that bucket's allreduce, with its slice",
          "[trainer][parallel]") {
  // Five parameters, split 2,4 -> buckets [0,2), [2,4), [4,5); backward reports them last first.
  const std::vector<wb::parallel::ParamExtent> params = {{0, 10}, {10, 6}, {16, 8}, {24, 4}, {28, 2}};
  std::vector<float> grads(30, 1.0f);
  wb::parallel::SelfCommunicator self;
  std::mutex mu;
  struct Seen {
    std::int64_t ready_ns = -1;
    std::int64_t start_ns = -1;
    int ready_calls = 0;
    float* data = nullptr;
  };
  std::map<int, Seen> seen;
  std::vector<int> ready_order;
  wb::parallel::SyncOptions so;
  so.on_ready = [&](const wb::parallel::Bucket& b, float* data) {
    std::lock_guard lock(mu);
    Seen& s = seen[b.index];
    s.ready_ns = wb::profiler::now_ns();
    ++s.ready_calls;
    s.data = data;
    ready_order.push_back(b.index);
  };
  so.on_span = [&](const wb::parallel::BucketSpan& span) {
    std::lock_guard lock(mu);
    seen[span.bucket].start_ns = span.start_ns;
  };
  const std::vector<int> split = {2, 4};
  auto buckets = wb::parallel::buckets_from_split(params, split);
  REQUIRE(buckets.size() == 3);
  wb::parallel::GradientSync sync(self, buckets, grads.data(), so);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    {
      std::lock_guard lock(mu);
      seen.clear();
      ready_order.clear();
    }
    sync.begin_step(step);
    for (int p = 5; p > 0; --p) sync.on_grads_ready(p - 1, p);
    sync.wait_all();
    std::lock_guard lock(mu);
    CHECK(ready_order == std::vector<int>{2, 1, 0});
    for (const auto& b : buckets) {
      CAPTURE(b.index);
      const Seen& s = seen[b.index];
      CHECK(s.ready_calls == 1);
      CHECK(s.data == grads.data() + b.offset);
      REQUIRE(s.start_ns >= 0);
      CHECK(s.ready_ns <= s.start_ns);  // the mark exists before the collective may start
    }
  }
}

// ---- on a GPU ---------------------------------------------------------------------------------------

TEST_CASE("a 5-step CUDA run follows a 5-step CPU run on the same data", "[trainer][cuda]") {
  TempDir dir;
  const fs::path cpu_run = dir / "cpu.sqlite", gpu_run = dir / "gpu.sqlite";
  const Result rc = run_train(with(small_run(cpu_run, 5), {"--device", "cpu", "--no-profile"}));
  CAPTURE(rc.err);
  REQUIRE(rc.exit_code == 0);
  const Result rg = run_train(with(small_run(gpu_run, 5), {"--device", "cuda", "--precision", "fp32"}));
  CAPTURE(rg.err, rg.out);
  REQUIRE(rg.exit_code == 0);
  wb::store::Db cdb(cpu_run, wb::store::OpenMode::read_only);
  wb::store::Db gdb(gpu_run, wb::store::OpenMode::read_only);
  const std::vector<double> lc = losses(cdb), lg = losses(gdb);
  REQUIRE(lc.size() == 5);
  REQUIRE(lg.size() == 5);
  // fp32 on both sides (no TF32 on the GPU), the same initial weights and batches: only the order of
  // summation differs, which moves a ResNet-50 loss by about 1e-5 relative after a few steps. 1e-3
  // leaves room for batch-norm over 4 images while still catching any real difference (a wrong
  // gradient or update moves the second step's loss by far more).
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i, lc[i], lg[i]);
    CHECK_THAT(lg[i], WithinRel(lc[i], 1e-3) || WithinAbs(lc[i], 1e-4));
  }
  CHECK(meta(gdb, "device") == "cuda");
  CHECK(meta(gdb, "precision") == "fp32");
  CHECK(meta(gdb, "device_name") != "cpu");
  CHECK(rank_device(gdb).rfind("cuda:0 (", 0) == 0);
  CHECK(meta(gdb, "complete") == "1");

  // Not SECTIONs: each would train both runs again.
  {
    INFO("its kernels link to the host ranges that launched them");
    const std::int64_t kernels = gdb.query_int64("SELECT COUNT(*) FROM kernel WHERE kind = 0");
    const std::int64_t linked = gdb.query_int64(
        "SELECT COUNT(*) FROM kernel k WHERE k.kind = 0 AND k.corr_id != 0 AND "
        "EXISTS (SELECT 1 FROM range r WHERE r.corr_id = k.corr_id)");
    const std::int64_t conv_linked = gdb.query_int64(
        "SELECT COUNT(*) FROM kernel k JOIN range r ON r.corr_id = k.corr_id JOIN string s ON s.id = r.name_id "
        "WHERE k.kind = 0 AND s.text = 'layer1.0.conv1'");
    CAPTURE(kernels, linked, conv_linked);
    CHECK(kernels > 5 * 100);         // hundreds of kernels per ResNet-50 step
    CHECK(linked * 10 >= kernels * 9);  // all but the odd library-internal launch outside a range
    CHECK(conv_linked >= 5 * 2);        // a conv's forward and backward kernels, every step
    CHECK(meta(gdb, "gpu_trace").rfind("cupti", 0) == 0);
  }
  {
    INFO("the device queue's depth and the copies are recorded");
    const std::int64_t samples = gdb.query_int64(
        "SELECT COUNT(*) FROM counter c JOIN track t ON t.id = c.track_id JOIN string s ON s.id = t.name_id "
        "WHERE t.kind = 'queue' AND s.text = 'device_queue'");
    const std::int64_t h2d = gdb.query_int64("SELECT COUNT(*) FROM range WHERE category = 5");
    const std::int64_t memcpy_rows = gdb.query_int64("SELECT COUNT(*) FROM kernel WHERE kind = 1");
    CAPTURE(samples, h2d, memcpy_rows);
    CHECK(samples >= 2 * 5);  // a push and a pop per batch
    CHECK(h2d >= 5);
    CHECK(memcpy_rows >= 5);
    CHECK(meta(gdb, "device_queue_pinned") == "1");
    // Page-locked staging of whole pages per slot (default 2 slots): at least the batch's images twice.
    CHECK(std::stoll(meta(gdb, "device_queue_staging_bytes")) >= 2 * 4 * 3 * 32 * 32 * 4);
  }
}

TEST_CASE("a CUDA run with bf16 and channels-last trains and records its precision", "[trainer][cuda]") {
  TempDir dir;
  const fs::path run = dir / "bf16.sqlite";
  const Result r = run_train(
      with(small_run(run, 3), {"--device", "cuda", "--precision", "bf16", "--channels-last", "--device-prefetch", "3"}));
  CAPTURE(r.err, r.out);
  REQUIRE(r.exit_code == 0);
  wb::store::Db db(run, wb::store::OpenMode::read_only);
  CHECK(meta(db, "precision") == "bf16");
  CHECK(meta(db, "channels_last") == "1");
  CHECK(rank_device(db).find("bf16, channels-last)") != std::string::npos);
  const std::vector<double> l = losses(db);
  REQUIRE(l.size() == 3);
  for (double v : l) CHECK(std::isfinite(v));
}
