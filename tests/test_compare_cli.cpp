// `wb compare` end to end: every input format (run file, safetensors with and without recorded order,
// npz, TroubleShooter npy directory), exit codes 0/1/2, --json, --csv, saving into the run file, and
// one clear line for bad input.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compare/compare.hpp"
#include "compare/load.hpp"
#include "compare/test_support/tensor_sets.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/peers.hpp"

namespace fs = std::filesystem;
using namespace wb::compare;
using wb::compare::testing::get_f32;
using wb::compare::testing::set_f32;
using wb::test::TempDir;

namespace {

struct RunResult {
  int code = -1;
  std::string out, err;
};

const fs::path kWb = fs::path(WB_BINARY_DIR) / "bin" / "wb";

RunResult run_wb(const std::string& args) {
  REQUIRE(fs::exists(kWb));  // built by the `wb` target
  const wb::test::ProcessResult r = wb::test::run_command(kWb.string() + " " + args);
  return {r.exit_code, r.out, r.err};
}

TensorSet small_step(std::uint64_t seed) {
  return wb::compare::testing::make_set(wb::compare::testing::resnet50_step(2, 16, 10, 16), seed, "ref");
}

std::vector<wb::store::HostTensor> host_tensors(const TensorSet& s, bool reversed = false) {
  std::vector<wb::store::HostTensor> out;
  for (const auto& t : s.tensors) {
    out.push_back(t.tensor);
    out.back().name = t.key;
  }
  if (reversed) std::reverse(out.begin(), out.end());
  return out;
}

void write_safetensors(const TensorSet& s, const fs::path& p, bool with_order, bool reversed = false) {
  std::map<std::string, std::string> meta;
  if (with_order) {
    nlohmann::json order;
    for (const auto& t : s.tensors) order[t.key] = t.exec_order;
    meta[kExecOrderMetadataKey] = order.dump();
  }
  wb::store::write_safetensors(p, host_tensors(s, reversed), meta);
}

void write_run(const TensorSet& s, const fs::path& p) {
  wb::store::WriterOptions opts;
  opts.path = p;
  opts.handle_signals = false;
  wb::store::Writer w(opts);
  for (const auto& t : s.tensors) {
    wb::store::TensorRow row;
    row.kind = std::string(kind_name(kind_of_key(t.key)));
    row.name = std::string(base_name(t.key));
    row.exec_order = static_cast<std::int32_t>(t.exec_order);
    row.dtype = std::string(wb::store::dtype_name(t.tensor.dtype));
    row.shape = t.tensor.shape;
    row.data = t.tensor.data;
    w.add(std::move(row));
  }
  REQUIRE(w.finish());
}

}  // namespace

TEST_CASE("every input format loads with its execution order", "[compare]") {
  TempDir dir;
  const TensorSet ref = small_step(1);
  const fs::path st = dir.path() / "ordered.safetensors", st2 = dir.path() / "plain.safetensors", npz = dir.path() / "a.npz",
                 npy_dir = dir.path() / "ts_dump", run = dir.path() / "run.sqlite";
  // File order reversed: only the recorded order can restore the walk.
  write_safetensors(ref, st, true, true);
  write_safetensors(ref, st2, false, true);
  wb::store::write_npz(npz, host_tensors(ref), false);
  write_run(ref, run);
  fs::create_directories(npy_dir);
  for (std::size_t i = 0; i < ref.tensors.size(); ++i) {
    wb::store::write_npy(npy_dir / (std::to_string(i) + "_" + ref.tensors[i].key + ".npy"), ref.tensors[i].tensor);
  }

  const auto walk_keys = [](const TensorSet& s) {
    std::vector<std::string> keys;
    for (std::size_t i : s.walk_order()) keys.push_back(s.tensors[i].key);
    return keys;
  };
  const auto expected = walk_keys(ref);
  for (const fs::path& p : {st, npz, npy_dir, run}) {
    CAPTURE(p);
    const TensorSet s = load_tensor_set(p);
    REQUIRE(s.tensors.size() == ref.tensors.size());
    CHECK(walk_keys(s) == expected);
    for (const auto& t : s.tensors) CHECK(t.tensor.data == ref.find(t.key)->tensor.data);
  }
  CHECK(detect_format(run) == SetFormat::run_file);
  CHECK(detect_format(npy_dir) == SetFormat::npy_dir);
  // Without recorded order, kinds still come in walk order (activations in reversed file order).
  const TensorSet plain = load_tensor_set(st2);
  const auto keys = walk_keys(plain);
  CHECK(keys.front() == "input");
  CHECK(kind_of_key(keys.back()) == TensorKind::momentum);

  REQUIRE_THROWS_AS(load_tensor_set(dir.path() / "missing.safetensors"), CompareError);
  std::ofstream(dir.path() / "notes.txt") << "hello";
  REQUIRE_THROWS_AS(load_tensor_set(dir.path() / "notes.txt"), CompareError);
  std::ofstream(dir.path() / "empty.sqlite") << "";
  REQUIRE_THROWS_AS(load_tensor_set(dir.path() / "empty.sqlite"), CompareError);
}

TEST_CASE("wb compare: exit codes, reports and the saved comparison", "[compare]") {
  TempDir dir;
  const TensorSet ref = small_step(7);
  const fs::path b = dir.path() / "ref.safetensors", same = dir.path() / "same.npz", run = dir.path() / "run.sqlite";
  write_safetensors(ref, b, true);
  wb::store::write_npz(same, host_tensors(ref), true);

  SECTION("identical dumps: exit 0, JSON with no divergence") {
    const fs::path json = dir.path() / "ok.json";
    const RunResult r = run_wb("compare " + same.string() + " " + b.string() + " --json " + json.string());
    CAPTURE(r.out, r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find("No divergence") != std::string::npos);
    const auto j = nlohmann::json::parse(wb::test::read_text(json));
    CHECK(j.at("first_divergence").is_null());
    CHECK(j.at("summary").at("failed") == 0);
    CHECK(j.at("rows").size() == ref.tensors.size());
    CHECK(j.at("profile") == "migration-fp32");
  }

  SECTION("a fault: exit 1, first_divergence in JSON, msprobe columns in CSV, saved into the run file") {
    TensorSet a = ref;
    auto& t = a.tensors[*a.position("act.layer2.0.bn1")].tensor;
    for (std::int64_t i = 0; i < t.numel(); i += 3) set_f32(t, i, get_f32(t, i) * 1.5f);
    write_run(a, run);
    const fs::path json = dir.path() / "bad.json", csv = dir.path() / "bad.csv";
    const RunResult r = run_wb("compare " + run.string() + " " + b.string() + " --json " + json.string() + " --csv " +
                                        csv.string() + " --order exec");
    CAPTURE(r.out, r.err);
    CHECK(r.code == 1);
    CHECK(r.out.find("First divergence: act.layer2.0.bn1") != std::string::npos);
    const auto j = nlohmann::json::parse(wb::test::read_text(json));
    const auto& d = j.at("first_divergence");
    CHECK(d.at("name") == "act.layer2.0.bn1");
    CHECK(d.at("kind") == "act");
    CHECK(d.at("reason").get<std::string>().find("cosine") != std::string::npos);
    CHECK(d.at("worst").size() == 5);

    const std::string text = wb::test::read_text(csv);
    std::istringstream lines(text);
    std::string header;
    std::getline(lines, header);
    for (const char* col : {"NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                            "Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                            "Five Thousandths Err Ratio", "NPU max", "Bench l2norm", "Accuracy Reached or Not",
                            "Err_message", "RMSE", "RelL2", "AllcloseRatio"}) {
      CHECK(header.find(col) != std::string::npos);
    }
    std::size_t rows = 0, failed = 0;
    for (std::string line; std::getline(lines, line);) {
      ++rows;
      failed += line.find(",No,") != std::string::npos;
    }
    CHECK(rows == ref.tensors.size());
    CHECK(failed >= 1);

    wb::store::Reader reader(run);
    const auto saved = reader.comparisons();
    REQUIRE(saved.size() == 1);
    CHECK(saved[0].failed >= 1);
    CHECK(saved[0].profile == "migration-fp32");
    CHECK(nlohmann::json::parse(saved[0].first_divergence).at("name") == "act.layer2.0.bn1");
    CHECK(reader.comparison_rows(saved[0].id).size() == ref.tensors.size());
  }

  SECTION("bad input: one line naming the problem, exit 2") {
    const fs::path garbage = dir.path() / "garbage.safetensors";
    std::ofstream(garbage) << "not a safetensors file at all";
    const fs::path bad_map = dir.path() / "map.json";
    std::ofstream(bad_map) << "{\"rules\": 3}";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"compare " + (dir.path() / "nope.safetensors").string() + " " + b.string(), "nope.safetensors"},
        {"compare " + garbage.string() + " " + b.string(), "garbage.safetensors"},
        {"compare " + same.string() + " " + b.string() + " --profile fp16", "--profile"},
        {"compare " + same.string() + " " + b.string() + " --map " + bad_map.string(), "map.json"},
        {"compare " + same.string() + " " + b.string() + " --order random", "--order"},
        {"compare " + same.string(), "compare"},
    };
    for (const auto& [args, needle] : cases) {
      const RunResult r = run_wb(args);
      CAPTURE(args, r.out, r.err);
      CHECK(r.code == 2);
      CHECK(r.err.find(needle) != std::string::npos);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
  }
}

TEST_CASE("kinds marked not comparable in the reference are shown but not judged", "[compare]") {
  TempDir dir;
  const TensorSet ref = small_step(3);
  TensorSet a = ref;
  for (auto& t : a.tensors) {
    if (kind_of_key(t.key) != TensorKind::grad) continue;
    for (std::int64_t i = 0; i < t.tensor.numel(); ++i) set_f32(t.tensor, i, -get_f32(t.tensor, i));
  }
  const fs::path pa = dir.path() / "a.safetensors", pb = dir.path() / "b.safetensors", bad = dir.path() / "bad.safetensors";
  write_safetensors(a, pa, true);
  wb::store::write_safetensors(pb, host_tensors(ref), {{kNotComparableMetadataKey, R"(["grad", "param_after", "momentum"])"}});
  const Comparison c = compare_sets(load_tensor_set(pa), load_tensor_set(pb));
  CHECK(c.failed == 0);
  CHECK(c.skipped == 3 * 161);  // momentum - grad would see the negated gradients too
  for (const auto& r : c.rows) {
    if (r.kind != TensorKind::grad) continue;
    CHECK(r.status == RowStatus::skipped);
    REQUIRE(r.metrics);
    CHECK_THAT(r.metrics->cosine, Catch::Matchers::WithinAbs(-1.0, 1e-12));
  }
  wb::store::write_safetensors(bad, host_tensors(ref), {{kNotComparableMetadataKey, R"(["gradient"])"}});
  REQUIRE_THROWS_AS(load_tensor_set(bad), CompareError);
}
