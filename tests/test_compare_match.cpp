// Name matching: exact names, a MindSpore -> PyTorch mapping file with regex rules, and automatic
// order+shape matching that recovers stripped names and reports its ambiguities.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "compare/match.hpp"
#include "compare/test_support/tensor_sets.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb::compare;
using wb::compare::testing::LayoutEntry;
using wb::test::TempDir;

namespace {

std::map<std::string, std::string> pairs_by_key(const MatchResult& r, const TensorSet& a, const TensorSet& b,
                                                std::map<std::string, MatchMethod>* methods = nullptr) {
  std::map<std::string, std::string> out;
  for (const auto& p : r.pairs) {
    if (p.a && p.b) {
      out[a.tensors[*p.a].key] = b.tensors[*p.b].key;
      if (methods) (*methods)[a.tensors[*p.a].key] = p.method;
    }
  }
  return out;
}

// MindSpore's names for a torchvision state dict: BatchNorm gamma/beta/moving_mean/moving_variance,
// all of them Parameters; the classifier is "end_point"; no num_batches_tracked.
std::vector<LayoutEntry> mindspore_names(const std::vector<LayoutEntry>& torch) {
  std::vector<LayoutEntry> out;
  for (LayoutEntry e : torch) {
    std::string k = e.key;
    auto ends = [&](const std::string& s) { return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0; };
    if (ends(".num_batches_tracked")) continue;
    const bool bn = k.find(".bn") != std::string::npos || k.find("downsample.1") != std::string::npos ||
                    k.rfind("param.bn1", 0) == 0 || k.rfind("buffer.bn1", 0) == 0;
    if (bn && ends(".weight")) k = k.substr(0, k.size() - 7) + ".gamma";
    else if (bn && ends(".bias")) k = k.substr(0, k.size() - 5) + ".beta";
    else if (ends(".running_mean")) k = "param." + k.substr(7, k.size() - 7 - 13) + ".moving_mean";
    else if (ends(".running_var")) k = "param." + k.substr(7, k.size() - 7 - 12) + ".moving_variance";
    if (k.rfind("param.fc.", 0) == 0) k = "param.end_point." + k.substr(9);
    e.key = k;
    out.push_back(e);
  }
  return out;
}

const char* kMindSporeMap = R"({
  "rules": [
    {"pattern": "\\.gamma$", "replace": ".weight"},
    {"pattern": "\\.beta$", "replace": ".bias"},
    {"pattern": "^param\\.(.*)\\.moving_mean$", "replace": "buffer.$1.running_mean"},
    {"pattern": "^param\\.(.*)\\.moving_variance$", "replace": "buffer.$1.running_var"}
  ],
  "pairs": {"param.end_point.weight": "param.fc.weight", "param.end_point.bias": "param.fc.bias"},
  "thresholds": [{"match": "^buffer\\.", "rel_l2_max": 1e-3}]
})";

}  // namespace

TEST_CASE("exact names match every tensor", "[compare]") {
  const auto layout = wb::compare::testing::resnet50_step(2, 32, 10, 16);
  const TensorSet a = wb::compare::testing::make_set(layout, 1), b = wb::compare::testing::make_set(layout, 2);
  const MatchResult r = match_tensors(a, b);
  std::map<std::string, MatchMethod> methods;
  const auto pairs = pairs_by_key(r, a, b, &methods);
  CHECK(pairs.size() == layout.size());
  CHECK(r.pairs.size() == layout.size());
  CHECK(r.ambiguities.empty());
  for (const auto& [k, v] : pairs) {
    CHECK(k == v);
    CHECK(methods[k] == MatchMethod::exact);
  }
}

TEST_CASE("a mapping file maps MindSpore names onto all torchvision ResNet-50 state entries", "[compare]") {
  TempDir dir;
  const fs::path map_path = dir.path() / "mindspore.json";
  std::ofstream(map_path) << kMindSporeMap;
  const MappingFile map = load_mapping(map_path);
  CHECK(map.rules.size() == 4);
  CHECK(map.thresholds.size() == 1);
  CHECK(map.rewrite("param.layer3.5.bn2.moving_variance") == "buffer.layer3.5.bn2.running_var");
  CHECK(map.rewrite("param.layer1.0.downsample.1.gamma") == "param.layer1.0.downsample.1.weight");
  CHECK(map.rewrite("param.conv1.weight") == "param.conv1.weight");

  const auto torch = wb::compare::testing::resnet50_state(1000, 16);
  const auto ms = mindspore_names(torch);
  REQUIRE(torch.size() == 320);
  REQUIRE(ms.size() == 320 - 53);
  const TensorSet a = wb::compare::testing::make_set(ms, 1, "ms");
  const TensorSet b = wb::compare::testing::make_set(torch, 1, "torch");
  MatchOptions opt;
  opt.mapping = &map;
  opt.auto_match = false;
  const MatchResult r = match_tensors(a, b, opt);
  std::map<std::string, MatchMethod> methods;
  const auto pairs = pairs_by_key(r, a, b, &methods);
  CHECK(pairs.size() == ms.size());  // every MindSpore entry found its torch name
  std::size_t only_b = 0, only_a = 0;
  for (const auto& p : r.pairs) {
    if (!p.a) {
      ++only_b;
      CHECK(b.tensors[*p.b].key.find("num_batches_tracked") != std::string::npos);
    }
    if (!p.b) ++only_a;
  }
  CHECK(only_a == 0);
  CHECK(only_b == 53);
  CHECK(pairs.at("param.layer2.0.bn1.gamma") == "param.layer2.0.bn1.weight");
  CHECK(pairs.at("param.layer4.2.bn3.moving_mean") == "buffer.layer4.2.bn3.running_mean");
  CHECK(pairs.at("param.end_point.weight") == "param.fc.weight");
  CHECK(methods.at("param.end_point.weight") == MatchMethod::pair);
  CHECK(methods.at("param.layer2.0.bn1.beta") == MatchMethod::rule);
  CHECK(methods.at("param.layer2.0.conv1.weight") == MatchMethod::exact);
  // Each tensor carries the same data under both names, so shapes agree pair by pair.
  for (const auto& [ak, bk] : pairs) CHECK(a.find(ak)->tensor.shape == b.find(bk)->tensor.shape);
}

TEST_CASE("bad mapping files are rejected with the file named", "[compare]") {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path p = dir.path() / name;
    std::ofstream(p) << text;
    return p;
  };
  REQUIRE_THROWS_AS(load_mapping(write("bad.json", "{\"rules\": [")), CompareError);
  REQUIRE_THROWS_AS(load_mapping(write("regex.json", R"({"rules": [{"pattern": "(", "replace": "x"}]})")), CompareError);
  REQUIRE_THROWS_AS(load_mapping(write("field.json", R"({"renames": {}})")), CompareError);
  REQUIRE_THROWS_AS(load_mapping(write("pair.json", R"({"pairs": {"a": 3}})")), CompareError);
  REQUIRE_THROWS_AS(load_mapping(dir.path() / "missing.json"), CompareError);
  try {
    load_mapping(write("regex2.json", R"({"rules": [{"pattern": "[", "replace": "x"}]})"));
    FAIL("expected CompareError");
  } catch (const CompareError& e) {
    CHECK(std::string(e.what()).find("regex2.json") != std::string::npos);
    CHECK(std::string(e.what()).find("rules[0]") != std::string::npos);
  }
}

TEST_CASE("order+shape matching recovers stripped names", "[compare]") {
  const auto layout = wb::compare::testing::resnet50_step(2, 32, 10, 16);
  const TensorSet b = wb::compare::testing::make_set(layout, 3, "reference");
  // A: the same dump with its names replaced by positions, as a name-less dumper writes it.
  std::vector<LayoutEntry> stripped = layout;
  for (std::size_t i = 0; i < stripped.size(); ++i) stripped[i].key = "t" + std::to_string(i);

  SECTION("complete: every name recovered, nothing ambiguous") {
    const TensorSet a = wb::compare::testing::make_set(stripped, 3, "stripped");
    const MatchResult r = match_tensors(a, b);
    std::map<std::string, MatchMethod> methods;
    const auto pairs = pairs_by_key(r, a, b, &methods);
    REQUIRE(pairs.size() == layout.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      CHECK(pairs.at("t" + std::to_string(i)) == layout[i].key);
      CHECK(methods.at("t" + std::to_string(i)) == MatchMethod::order_shape);
    }
    CHECK(r.ambiguities.empty());
  }

  SECTION("a missing tensor in a run of equal shapes: >= 95% recovered and every ambiguity reported") {
    // Drop buffer.layer1.0.bn1.running_mean: four [64] tensors in a row become three.
    std::vector<LayoutEntry> dropped;
    std::string dropped_key;
    std::map<std::string, std::string> truth;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].key == "buffer.layer1.0.bn1.running_mean") {
        dropped_key = stripped[i].key;
        continue;
      }
      dropped.push_back(stripped[i]);
      truth[stripped[i].key] = layout[i].key;
    }
    REQUIRE_FALSE(dropped_key.empty());
    TensorSet a;
    a.source = "stripped";
    {
      // Same values as B for the kept tensors, so the pairing can be checked by content too.
      for (std::size_t i = 0, k = 0; i < layout.size(); ++i) {
        if (stripped[i].key == dropped_key) continue;
        a.tensors.push_back({stripped[i].key, static_cast<std::int64_t>(k++), b.tensors[i].tensor});
      }
      a.index();
    }
    const MatchResult r = match_tensors(a, b);
    const auto pairs = pairs_by_key(r, a, b);
    std::size_t right = 0;
    for (const auto& [ak, bk] : pairs) right += truth.at(ak) == bk;
    CAPTURE(right, truth.size());
    CHECK(static_cast<double>(right) >= 0.95 * static_cast<double>(truth.size()));
    CHECK(pairs.size() == truth.size());
    REQUIRE_FALSE(r.ambiguities.empty());
    // Every wrongly paired tensor is among the reported ambiguities, with its true name as a candidate.
    for (const auto& [ak, bk] : pairs) {
      if (truth.at(ak) == bk) continue;
      const auto it = std::find_if(r.ambiguities.begin(), r.ambiguities.end(),
                                   [&, key = ak](const Ambiguity& x) { return x.in_a && x.key == key; });
      REQUIRE(it != r.ambiguities.end());
      CHECK(std::find(it->candidates.begin(), it->candidates.end(), truth.at(ak)) != it->candidates.end());
    }
    // Ambiguity stays local: only the [64] run around the gap is affected.
    for (const Ambiguity& x : r.ambiguities) {
      const std::string& name = x.in_a ? truth.at(x.key) : x.key;
      CHECK(name.find("layer1.0.bn1.") != std::string::npos);
    }
  }

  SECTION("auto matching can be turned off") {
    const TensorSet a = wb::compare::testing::make_set(stripped, 3, "stripped");
    MatchOptions opt;
    opt.auto_match = false;
    const MatchResult r = match_tensors(a, b, opt);
    CHECK(pairs_by_key(r, a, b).empty());
    CHECK(r.pairs.size() == 2 * layout.size());
  }
}

TEST_CASE("auto matching never pairs different shapes or kinds", "[compare]") {
  std::vector<LayoutEntry> lb = {{"act.x", {4, 4}}, {"act.y", {4, 8}}, {"grad.w", {4, 8}}};
  std::vector<LayoutEntry> la = {{"act.q", {4, 8}}, {"act.r", {2, 2}}, {"act.s", {4, 8}}};
  const TensorSet a = wb::compare::testing::make_set(la, 1), b = wb::compare::testing::make_set(lb, 1);
  const MatchResult r = match_tensors(a, b);
  const auto pairs = pairs_by_key(r, a, b);
  REQUIRE(pairs.size() == 1);
  // act.q and act.s both fit act.y: reported.
  CHECK(!r.ambiguities.empty());
  for (const auto& [ak, bk] : pairs) {
    CHECK(bk == "act.y");
    CHECK(a.find(ak)->tensor.shape == b.find(bk)->tensor.shape);
  }
}

TEST_CASE("TroubleShooter's weight map is a mapping file", "[compare]") {
  // ts.migrator.get_weight_map writes [{PyTorch name: MindSpore name}, {PyTorch name: value conversion}].
  const auto map = parse_mapping(nlohmann::json::parse(R"([{"bn1.weight": "bn1.gamma", "bn1.running_mean": "bn1.moving_mean",
                                                             "conv1.weight": "conv1.weight"}, {}])"),
                                 "map.json");
  auto has = [&](const std::string& a, const std::string& b) {
    return std::find(map.pairs.begin(), map.pairs.end(), std::pair<std::string, std::string>(a, b)) != map.pairs.end();
  };
  for (const char* kind : {"param", "grad", "param_after", "momentum"}) {
    CAPTURE(kind);
    CHECK(has(std::string(kind) + ".bn1.weight", std::string(kind) + ".bn1.gamma"));
  }
  CHECK(has("buffer.bn1.running_mean", "buffer.bn1.moving_mean"));
  CHECK(has("buffer_after.bn1.running_mean", "buffer_after.bn1.moving_mean"));
  CHECK(has("param.bn1.weight", "bn1.gamma"));  // a reference saved without our prefixes
  CHECK(map.auto_match);

  // Matching takes the first pair whose B tensor exists.
  TensorSet a = testing::make_set({{"param.bn1.weight", {4}}, {"grad.bn1.weight", {4}}}, 1, "A");
  TensorSet b = testing::make_set({{"bn1.gamma", {4}}, {"grad.bn1.gamma", {4}}}, 2, "B");
  MatchOptions opt;
  opt.mapping = &map;
  const MatchResult r = match_tensors(a, b, opt);
  int paired = 0;
  for (const auto& p : r.pairs) {
    if (!p.a || !p.b) continue;
    ++paired;
    CHECK(p.method == MatchMethod::pair);
    const std::string ak = a.tensors[*p.a].key, bk = b.tensors[*p.b].key;
    CHECK(((ak == "param.bn1.weight" && bk == "bn1.gamma") || (ak == "grad.bn1.weight" && bk == "grad.bn1.gamma")));
  }
  CHECK(paired == 2);

  // A value conversion cannot be applied here: refused with the entry named.
  try {
    parse_mapping(nlohmann::json::parse(R"([{"fc.weight": "fc.weight"}, {"fc.weight": "transpose"}])"), "map.json");
    FAIL("a value map was accepted");
  } catch (const CompareError& e) {
    CHECK(std::string(e.what()).find("map.json: the weight map converts the value of \"fc.weight\"") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_mapping(nlohmann::json::parse(R"([{"fc.weight": 3}, {}])"), "map.json"), CompareError);
}
