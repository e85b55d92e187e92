// The profiler and its analyses on real wb-train runs (small: synthetic 32x32 data, batch 8, a few
// steps, one compute thread). wb-train records; `wb report`, `wb info` and `wb export chrome` read back.
//   - a pipeline starved on purpose is flagged input-bound, a well-fed one is not;
//   - a normal run drops nothing and holds every ResNet-50 module (names from torchvision) in forward
//     and backward once per step, one step range per step, a queue sample at every push and pop, and
//     every transform of every sample on the data-worker threads;
//   - the Chrome export of a 2-rank run is valid JSON holding exactly the ranges of the run file;
//   - a recorder pool too small for the run drops events, and every lost event is counted and shown.
//   - wb whatif replays a 2-rank run as recorded, and a change on every rank's path moves every step.
// The runs are made once, on first use, and shared by the test cases.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "support/python.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::WithinAbs;
using wb::test::Result;
using wb::test::run_command;
using wb::test::shell_quote;
using wb::test::TempDir;

constexpr int kBatch = 8;
constexpr int kSteps = 6;
constexpr int kPrefetch = 16;
// The starved pipeline: one worker sleeping this long per sample makes a batch take at least
// 8 x 0.4 s = 3.2 s, more than a step of batch 8 at 32x32 takes even on a busy machine (about 1 s).
constexpr int kStarvedSteps = 4;
constexpr std::int64_t kStarvedDelayUs = 400'000;

std::vector<std::string> common_args(int steps) {
  return {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", std::to_string(kBatch), "--image-size",
          "32", "--steps", std::to_string(steps), "--threads", "1", "--seed", "5"};
}

// The runs, made on first use. A failed run fails every test case that needs it, with its output.
class Runs {
 public:
  static Runs& get() {
    static Runs runs;
    return runs;
  }
  const TempDir& dir() const { return dir_; }

  // Two workers and a deep queue, no delay: the workers stay far ahead of the training loop.
  const fs::path& normal() { return make("normal", {"--data-workers", "2", "--prefetch", std::to_string(kPrefetch)}); }
  const fs::path& starved() {
    return make("starved", {"--data-workers", "1", "--prefetch", "2", "--data-delay-us", std::to_string(kStarvedDelayUs)},
                kStarvedSteps);
  }
  // The normal run with the recorder's pool capped at 64 events: one chunk of 64 records in all.
  const fs::path& tiny_pool() {
    return make("tiny", {"--data-workers", "2", "--prefetch", std::to_string(kPrefetch), "--profile-buffer-events", "64"});
  }
  const fs::path& two_ranks() { return make("ranks2", {"--nproc", "2", "--data-workers", "1"}, 3); }

 private:
  Runs() = default;
  const fs::path& make(const std::string& name, const std::vector<std::string>& extra, int steps = kSteps) {
    auto it = runs_.find(name);
    if (it != runs_.end()) return it->second;
    std::vector<std::string> args = common_args(steps);
    args.insert(args.end(), extra.begin(), extra.end());
    const fs::path run = dir_ / (name + ".sqlite");
    args.push_back("--run");
    args.push_back(run.string());
    Result r = wb::test::run_train(args);
    INFO("wb-train for run '" << name << "' exited " << r.exit_code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(fs::exists(run));
    return runs_.emplace(name, run).first->second;
  }
  TempDir dir_;
  std::map<std::string, fs::path> runs_;
};

Result wb_cli(const std::vector<std::string>& args) {
  std::string cmd = shell_quote(WB_CLI);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += shell_quote(a);
  }
  return run_command(cmd);
}

std::string report_of(const fs::path& run) {
  Result r = wb_cli({"report", run.string(), "--no-split"});
  INFO("wb report exited " << r.exit_code << "\n" << r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

// The warnings of a report, as "[kind] message" lines without the indent.
std::vector<std::string> warnings_of(const std::string& report, const std::string& kind) {
  std::vector<std::string> out;
  const std::string tag = "  [" + kind + "] ";
  std::size_t pos = 0;
  while ((pos = report.find(tag, pos)) != std::string::npos) {
    std::size_t end = report.find('\n', pos);
    out.push_back(report.substr(pos + 2, end - pos - 2));
    pos = end;
  }
  return out;
}

// The input-bound percentage of the "all" row of the report's input pipeline table.
double overall_input_percent(const std::string& report) {
  std::smatch m;
  static const std::regex row(R"(\n  all +\d+ +[0-9.]+ [a-z]+ +([0-9.]+)% )");
  REQUIRE(std::regex_search(report, m, row));
  return std::stod(m[1].str());
}

std::int64_t count(wb::store::Db& db, const std::string& sql) { return db.query_int64(sql); }

// Runs a Python script (the interpreter with torch, numpy) from a file; returns its stdout.
std::string python(const std::string& name, const std::string& script, const std::vector<std::string>& args) {
  std::string quoted;
  for (const auto& a : args) {
    if (!quoted.empty()) quoted += ' ';
    quoted += shell_quote(a);
  }
  Result r = wb::test::run_python_script(Runs::get().dir(), name, script, quoted);
  INFO(name << " exited " << r.exit_code << "\nstderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

}  // namespace

TEST_CASE("a starved input pipeline is flagged input-bound, a well-fed one is not", "[analysis][trainer]") {
  SECTION("starved: one worker, 0.4 s per sample") {
    const std::string report = report_of(Runs::get().starved());
    CAPTURE(report);
    const auto bound = warnings_of(report, "input-bound");
    REQUIRE(bound.size() == 1);
    CHECK(bound[0].find("rank 0 is ") != std::string::npos);
    // Each batch takes >= 3.2 s against ~1 s of compute: most of the step waits for input.
    const double percent = overall_input_percent(report);
    CHECK(percent > 20.0);
    CHECK(bound[0].find("highly input-bound") != std::string::npos);
    // One push and one pop per batch, the queue empty after each pop: MindInsight's warning too.
    CHECK(warnings_of(report, "empty-queue").size() == 1);
    // A batch is 8 sleeps of 0.4 s at least, so one worker makes at most 1 / 3.2 s batches per second;
    // the training loop wants more, so more than one worker is needed.
    std::smatch m;
    REQUIRE(std::regex_search(report, m, std::regex(R"(one worker makes ([0-9.]+) batches/s, workers 1; workers to keep the queue non-empty: (\d+))")));
    const double per_worker = std::stod(m[1].str());
    CHECK(per_worker <= 1e6 / (kBatch * static_cast<double>(kStarvedDelayUs)) + 0.05);
    CHECK(per_worker > 0.05);
    CHECK(std::stoi(m[2].str()) >= 2);
  }
  SECTION("well fed: two workers, a queue of 16, no delay") {
    const std::string report = report_of(Runs::get().normal());
    CAPTURE(report);
    CHECK(warnings_of(report, "input-bound").empty());
    CHECK(warnings_of(report, "empty-queue").empty());
    CHECK(overall_input_percent(report) < 5.0);
    CHECK(report.find("not input-bound") != std::string::npos);
  }
}

TEST_CASE("a normal run drops nothing and records every module, step, queue sample and transform",
          "[analysis][trainer]") {
  const fs::path run = Runs::get().normal();

  SECTION("dropped events: 0 in wb info and wb report") {
    Result info = wb_cli({"info", run.string(), "--json"});
    REQUIRE(info.exit_code == 0);
    const auto j = nlohmann::json::parse(info.out);
    CHECK(j["complete"] == true);
    CHECK(j["meta"]["dropped_events"] == "0");
    REQUIRE(j["ranks"].size() == 1);
    CHECK(j["ranks"][0]["dropped_events"] == 0);
    const std::string report = report_of(run);
    CHECK(report.find("dropped events 0,") != std::string::npos);
    CHECK(warnings_of(report, "dropped").empty());
  }

  wb::store::Db db(run, wb::store::OpenMode::read_only);

  SECTION("every ResNet-50 module in forward and in backward, once per step") {
    // The reference list of modules comes from torchvision, not from the trainer.
    const std::string listing = python("modules.py",
                                       "import torchvision\n"
                                       "for name, m in torchvision.models.resnet50().named_modules():\n"
                                       "    if name:\n"
                                       "        print(name, type(m).__name__)\n",
                                       {});
    std::map<std::string, std::string> modules;  // name -> torchvision type
    std::istringstream in(listing);
    std::string name, type;
    while (in >> name >> type) modules[name] = type;
    // 141 modules that run code, the stem relu, and 8 containers (layer1..4, four downsample Sequentials).
    REQUIRE(modules.size() == 150);
    std::map<std::pair<std::string, int>, std::int64_t> counts;  // (name, category) -> ranges
    auto& st = db.prepare(
        "SELECT s.text, r.category, count(*) FROM range r JOIN string s ON s.id = r.name_id GROUP BY s.text, r.category");
    while (st.step()) counts[{st.column_text(0), static_cast<int>(st.column_int64(1))}] = st.column_int64(2);
    st.reset();
    int checked = 0;
    for (const auto& [module, kind] : modules) {
      CAPTURE(module, kind);
      // Sequential containers (layer1, layer1.0.downsample) run no code of their own.
      if (kind == "Sequential") continue;
      // The stem's relu runs fused into bn1's batch norm (the model's documented contract: a fused relu
      // reports no range of its own), so its time is inside bn1's ranges.
      if (module == "relu") {
        CHECK(counts.count({module, 0}) == 0);
        continue;
      }
      CHECK(counts[{module, 0}] == kSteps);  // forward
      CHECK(counts[{module, 1}] == kSteps);  // backward
      ++checked;
    }
    // conv1, bn1, maxpool, avgpool, fc; 16 bottlenecks, each with its 7 modules; 4 downsample conv + bn.
    CHECK(checked == 5 + 16 * 8 + 4 * 2);
    CHECK(counts[{"loss", 3}] == 2 * kSteps);    // the loss's forward and its backward
    CHECK(counts[{"optimizer", 2}] == kSteps);
  }

  SECTION("one step range per step, inside the step table's row") {
    auto& st = db.prepare(
        "SELECT r.step, r.start_ns, r.end_ns, s.start_ns, s.end_ns FROM range r JOIN step s ON s.step = r.step "
        "WHERE r.category = 7 ORDER BY r.step");
    std::vector<std::int64_t> steps;
    while (st.step()) {
      steps.push_back(st.column_int64(0));
      // The step row's clock reads bracket the range (they come just before and after it).
      CHECK(st.column_int64(1) >= st.column_int64(3) - 1'000'000);
      CHECK(st.column_int64(2) <= st.column_int64(4) + 1'000'000);
      CHECK(st.column_int64(2) > st.column_int64(1));
    }
    st.reset();
    CHECK(steps == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
    CHECK(count(db, "SELECT count(*) FROM range WHERE category = 7") == kSteps);
    CHECK(count(db, "SELECT count(*) FROM step") == kSteps);
  }

  SECTION("the batch queue has a sample at every push and pop") {
    auto& st = db.prepare(
        "SELECT c.t_ns, c.value FROM counter c JOIN track t ON t.id = c.track_id JOIN string s ON s.id = t.name_id "
        "WHERE t.kind = 'queue' AND s.text = 'batch queue' ORDER BY c.t_ns");
    std::vector<double> depth;
    std::int64_t last_t = INT64_MIN;
    bool increasing = true;
    while (st.step()) {
      increasing = increasing && st.column_int64(0) > last_t;
      last_t = st.column_int64(0);
      depth.push_back(st.column_double(1));
    }
    st.reset();
    REQUIRE(depth.size() == 2 * kSteps);  // kSteps pushes and kSteps pops
    CHECK(increasing);
    CHECK_THAT(depth.front(), WithinAbs(1.0, 0.0));  // the first event is the first push
    CHECK_THAT(depth.back(), WithinAbs(0.0, 0.0));   // the last is the last pop
    int pushes = 0;
    double prev = 0.0;
    for (double d : depth) {
      CHECK(d >= 0.0);
      CHECK(d <= kPrefetch);
      CHECK_THAT(std::abs(d - prev), WithinAbs(1.0, 0.0));  // every sample moves the depth by one
      pushes += d > prev;
      prev = d;
    }
    CHECK(pushes == kSteps);
  }

  SECTION("every transform of every sample, and every batch, on the data-worker threads") {
    std::map<std::string, std::int64_t> on_workers, elsewhere;
    auto& st = db.prepare(
        "SELECT n.text, tn.text LIKE 'data-worker-%', count(*) FROM range r JOIN track t ON t.id = r.track_id "
        "JOIN string tn ON tn.id = t.name_id JOIN string n ON n.id = r.name_id WHERE r.category = 4 GROUP BY 1, 2");
    while (st.step()) (st.column_int64(1) ? on_workers : elsewhere)[st.column_text(0)] = st.column_int64(2);
    st.reset();
    std::string listing;
    for (const auto& [n, c] : on_workers) listing += n + "=" + std::to_string(c) + " ";
    listing += "| off the workers:";
    for (const auto& [n, c] : elsewhere) listing += " " + n + "=" + std::to_string(c);
    CAPTURE(listing);
    const std::int64_t samples = kBatch * kSteps;
    // 32x32 synthetic images trained at 32x32: the resize is the identity and is skipped.
    for (const char* t : {"decode", "random_crop", "random_flip", "rescale_normalize", "hwc2chw"}) {
      CAPTURE(t);
      CHECK(on_workers[t] == samples);
      CHECK(elsewhere.count(t) == 0);
    }
    CHECK(on_workers.count("resize") == 0);
    CHECK(on_workers["batch"] == kSteps);
    // Batches sit at depth 0 of their worker's lane and every transform nests inside one of them, at depth 1.
    CHECK(count(db, "SELECT count(*) FROM range r JOIN string n ON n.id = r.name_id "
                    "WHERE n.text = 'batch' AND r.depth <> 0") == 0);
    CHECK(count(db, "SELECT count(*) FROM range r JOIN string n ON n.id = r.name_id WHERE r.category = 4 "
                    "AND n.text NOT IN ('batch', 'data_wait') AND r.depth <> 1") == 0);
    CHECK(count(db,
                "SELECT count(*) FROM range r JOIN string n ON n.id = r.name_id WHERE r.category = 4 "
                "AND n.text NOT IN ('batch', 'data_wait') AND NOT EXISTS (SELECT 1 FROM range b JOIN string bn "
                "ON bn.id = b.name_id WHERE bn.text = 'batch' AND b.track_id = r.track_id "
                "AND b.start_ns <= r.start_ns AND r.end_ns <= b.end_ns)") == 0);
    // The only data range off the workers is the training loop's wait for a batch.
    for (const auto& [n, c] : elsewhere) CHECK(n == "data_wait");
    // A worker gets a track with its first event; when one worker alone keeps up, the other may have none.
    const std::int64_t worker_tracks =
        count(db, "SELECT count(*) FROM track t JOIN string s ON s.id = t.name_id WHERE s.text LIKE 'data-worker-%'");
    CHECK(worker_tracks >= 1);
    CHECK(worker_tracks == count(db, "SELECT count(*) FROM track t JOIN string s ON s.id = t.name_id "
                                     "WHERE s.text IN ('data-worker-0', 'data-worker-1')"));
  }
}

TEST_CASE("wb export chrome of a 2-rank run is valid JSON with every range of the run file", "[analysis][trainer][mpi]") {
  const fs::path run = Runs::get().two_ranks();
  const fs::path out = Runs::get().dir() / "ranks2.json";
  Result r = wb_cli({"export", "chrome", run.string(), out.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // Python's json parses the file; every range of the run file (rank, name, start, duration to the
  // nanosecond) must be a complete event of the export, and no other range-category event may exist.
  const std::string verdict = python("chrome_check.py", R"(import collections, decimal, json, sqlite3, sys
run, out = sys.argv[1], sys.argv[2]
with open(out) as f:
    trace = json.load(f, parse_float=decimal.Decimal)
origin = trace["otherData"]["origin_ns"]
db = sqlite3.connect(run)
rows = db.execute("SELECT t.rank, s.text, r.start_ns, r.end_ns FROM range r JOIN track t ON t.id = r.track_id "
                  "JOIN string s ON s.id = r.name_id").fetchall()
want = collections.Counter((rank, name, start - origin, end - start) for rank, name, start, end in rows)
cats = {"forward", "backward", "optimizer", "loss", "data", "h2d", "comm", "step"}
got = collections.Counter((e["pid"], e["name"], int(e["ts"] * 1000), int(e["dur"] * 1000))
                          for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats)
ranks = sorted({k[0] for k in got})
allreduce_db = db.execute("SELECT count(*) FROM allreduce").fetchone()[0]
allreduce_json = sum(1 for e in trace["traceEvents"] if e.get("cat") == "allreduce")
print("db_ranges", sum(want.values()), "json_ranges", sum(got.values()), "missing", sum((want - got).values()),
      "extra", sum((got - want).values()), "ranks", len(ranks), "allreduce_db", allreduce_db, "allreduce_json", allreduce_json)
)",
                                     {run.string(), out.string()});
  CAPTURE(verdict);
  std::map<std::string, std::int64_t> v;
  std::istringstream in(verdict);
  std::string key;
  std::int64_t value = 0;
  while (in >> key >> value) v[key] = value;
  REQUIRE(v.size() == 7);
  CHECK(v["db_ranges"] > 2 * 3 * 284);  // two ranks, three steps, 142 module ranges forward and 142 backward
  CHECK(v["json_ranges"] == v["db_ranges"]);
  CHECK(v["missing"] == 0);
  CHECK(v["extra"] == 0);
  CHECK(v["ranks"] == 2);
  CHECK(v["allreduce_db"] > 0);
  CHECK(v["allreduce_json"] == v["allreduce_db"]);
  // The count the CLI prints agrees with the file.
  const std::string printed = std::to_string(v["db_ranges"]) + " ranges,";
  CHECK(r.out.find(printed) != std::string::npos);
}

TEST_CASE("a recorder pool too small for the run drops events, counts every one and wb report shows them",
          "[analysis][trainer]") {
  const fs::path run = Runs::get().tiny_pool();
  const std::string report = report_of(run);
  CAPTURE(report);
  const auto dropped = warnings_of(report, "dropped");
  REQUIRE(dropped.size() == 1);
  std::smatch m;
  const std::string line = dropped[0];
  REQUIRE(std::regex_search(line, m, std::regex(R"(rank 0 dropped (\d+) events)")));
  const std::int64_t n = std::stoll(m[1].str());
  CHECK(n > 0);
  std::string header = "dropped events ";
  header += std::to_string(n) + ",";
  CHECK(report.find(header) != std::string::npos);

  Result info = wb_cli({"info", run.string(), "--json"});
  REQUIRE(info.exit_code == 0);
  const auto j = nlohmann::json::parse(info.out);
  CHECK(j["ranks"][0]["dropped_events"] == n);
  CHECK(j["meta"]["dropped_events"] == std::to_string(n));

  // Nothing is lost silently: what was stored plus what was counted is what the same run records with
  // the default pool. Only the data waits vary between runs (at most one per step), so they are
  // bounded, not matched.
  auto events = [](const fs::path& file, bool with_waits) {
    wb::store::Db db(file, wb::store::OpenMode::read_only);
    std::string not_wait = with_waits ? "" : " WHERE name_id NOT IN (SELECT id FROM string WHERE text = 'data_wait')";
    return count(db, "SELECT count(*) FROM range" + not_wait) + count(db, "SELECT count(*) FROM counter");
  };
  const std::int64_t expected = events(Runs::get().normal(), false);
  const std::int64_t stored = events(run, true);
  CAPTURE(expected, stored, n);
  CHECK(stored + n >= expected);
  CHECK(stored + n <= expected + kSteps);
  CHECK(stored < expected);
}

TEST_CASE("wb whatif replays a 2-rank run as recorded and moves every step by a change on every rank's path",
          "[analysis][trainer][mpi]") {
  const fs::path run = Runs::get().two_ranks();
  auto whatif = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"whatif", run.string(), "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = wb_cli(args);
    INFO("wb whatif exited " << r.exit_code << "\n" << r.out << r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };
  // The graph replayed with no change gives back the recorded steps (steps 1 and 2: step 0 left out).
  const auto same = whatif({});
  CHECK(same["steps_used"] == 2);
  const double measured = same["measured_step_ns"].get<double>();
  CHECK(measured > 0.0);
  CHECK_THAT(same["replay_step_ns"].get<double>(), WithinAbs(measured, 1e-6 * measured));
  // The optimizer runs after the wait for the allreduces on every rank: 50 ms more there is 50 ms more per
  // step (less only where a data wait in the recording would now be shorter).
  const auto slower = whatif({"--add", "class:optimizer:+50000"});
  CHECK(slower["changes"][0]["matched"].get<int>() == 2 * 3);
  CHECK_THAT(slower["predicted_step_ns"].get<double>() - measured, WithinAbs(50e6, 1e6));
  // Its path holds both steps' ends through an optimizer.
  bool optimizer_on_path = false;
  for (const auto& seg : slower["path"]) optimizer_on_path = optimizer_on_path || seg["name"] == "optimizer";
  CHECK(optimizer_on_path);
  // Each rank recorded its host's CPUs (as the OS counts them) and its compute threads; the caveat on
  // ranks that share too few CPUs follows from them.
  wb::store::Reader reader(run);
  const auto meta = reader.meta();
  long long threads = 0;
  for (int rank : {0, 1}) {
    const std::string suffix = ".rank" + std::to_string(rank);
    REQUIRE(meta.count("host_cpus" + suffix));
    REQUIRE(meta.count("threads" + suffix));
    CHECK(meta.at("host_cpus" + suffix) == std::to_string(std::max(1u, std::thread::hardware_concurrency())));
    threads += std::stoll(meta.at("threads" + suffix));
  }
  CHECK(threads >= 2);
  CHECK(same["caveat"].is_null() == (threads <= std::max(1u, std::thread::hardware_concurrency())));
  // A change that matches nothing is one line and exit status 2, never a silent no-op.
  Result r = wb_cli({"whatif", run.string(), "--add", "layer9.*:+1000"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("'layer9.*:+1000' matches nothing") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}
