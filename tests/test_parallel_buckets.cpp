// Bucket math: split points (MindSpore all_reduce_fusion_config; their text form and checks are
// allreduce::SplitPoints', tests/test_allreduce_split_points.cpp), size caps checked against PyTorch
// DDP's own bucket assignment (torch.distributed._compute_bucket_assignment_by_size), the default,
// the start-up table and the errors.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/error.hpp"

using namespace wb::parallel;
using wb::allreduce::SplitPoints;

namespace {

struct Param {
  std::string name;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// ResNet-50 v1.5's trainable tensors in torchvision order, laid out back to back like the model's
// gradient buffer: conv weights (no bias), batch-norm weight and bias, fc weight and bias.
std::vector<Param> resnet50_params(int classes) {
  std::vector<Param> out;
  std::int64_t offset = 0;
  const auto add = [&](const std::string& name, std::int64_t numel) {
    out.push_back({name, offset, numel});
    offset += numel;
  };
  const auto conv_bn = [&](const std::string& conv, const std::string& bn, std::int64_t cin, std::int64_t cout, int k) {
    add(conv + ".weight", cout * cin * k * k);
    add(bn + ".weight", cout);
    add(bn + ".bias", cout);
  };
  conv_bn("conv1", "bn1", 3, 64, 7);
  const int blocks[4] = {3, 4, 6, 3};
  std::int64_t cin = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const std::int64_t width = 64LL << layer, cout = width * 4;
    for (int b = 0; b < blocks[layer]; ++b) {
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(b) + ".";
      conv_bn(p + "conv1", p + "bn1", cin, width, 1);
      conv_bn(p + "conv2", p + "bn2", width, width, 3);
      conv_bn(p + "conv3", p + "bn3", width, cout, 1);
      if (b == 0) conv_bn(p + "downsample.0", p + "downsample.1", cin, cout, 1);
      cin = cout;
    }
  }
  add("fc.weight", 2048LL * classes);
  add("fc.bias", classes);
  return out;
}

std::vector<std::string> names_of(const std::vector<Param>& params) {
  std::vector<std::string> out;
  for (const auto& p : params) out.push_back(p.name);
  return out;
}

std::int64_t numel_between(const std::vector<Param>& params, int first, int end) {
  std::int64_t n = 0;
  for (int i = first; i < end; ++i) n += params[static_cast<std::size_t>(i)].numel;
  return n;
}

void require_cover(const std::vector<Bucket>& buckets, const std::vector<Param>& params) {
  REQUIRE_FALSE(buckets.empty());
  REQUIRE(buckets.front().first_param == 0);
  REQUIRE(buckets.back().end_param == static_cast<int>(params.size()));
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    CAPTURE(b);
    REQUIRE(buckets[b].index == static_cast<int>(b));
    REQUIRE(buckets[b].tensors() > 0);
    if (b > 0) REQUIRE(buckets[b].first_param == buckets[b - 1].end_param);
    // A slice of the gradient buffer exactly covering its parameters.
    REQUIRE(buckets[b].offset == params[static_cast<std::size_t>(buckets[b].first_param)].offset);
    REQUIRE(buckets[b].numel == numel_between(params, buckets[b].first_param, buckets[b].end_param));
  }
}

}  // namespace

TEST_CASE("ResNet-50 table matches torchvision's parameter count", "[parallel]") {
  const auto params = resnet50_params(1000);
  REQUIRE(params.size() == 161);
  REQUIRE(numel_between(params, 0, 161) == 25'557'032);  // torchvision's num_params
  REQUIRE(params[160].name == "fc.bias");
}

TEST_CASE("split points 85,160 make [0,85), [85,160), [160,161)", "[parallel]") {
  const auto params = resnet50_params(10);
  const auto extents = param_extents(params);
  const SplitPoints split = SplitPoints::parse("85,160");
  REQUIRE(split.points() == std::vector<int>{85, 160});
  const auto buckets = buckets_from_split(extents, split);
  REQUIRE(buckets == buckets_from_split(extents, split.points()));
  REQUIRE(buckets.size() == 3);
  require_cover(buckets, params);
  REQUIRE(buckets[0].first_param == 0);
  REQUIRE(buckets[0].end_param == 85);
  REQUIRE(buckets[1].first_param == 85);
  REQUIRE(buckets[1].end_param == 160);
  REQUIRE(buckets[2].first_param == 160);
  REQUIRE(buckets[2].end_param == 161);
  REQUIRE(buckets[2].bytes() == 10 * 4);  // fc.bias alone
  REQUIRE(bucket_of_params(buckets)[84] == 0);
  REQUIRE(bucket_of_params(buckets)[85] == 1);
  REQUIRE(bucket_of_params(buckets)[160] == 2);

  const std::string table = format_buckets(buckets, names_of(params));
  CAPTURE(table);
  REQUIRE(table.find("3 gradient buckets") != std::string::npos);
  REQUIRE(table.find("[0, 85)") != std::string::npos);
  REQUIRE(table.find("[85, 160)") != std::string::npos);
  REQUIRE(table.find("[160, 161)") != std::string::npos);
  REQUIRE(table.find("conv1.weight .. layer3.1.conv1.weight") != std::string::npos);
  REQUIRE(table.find("40  fc.bias\n") != std::string::npos);  // 10 classes x 4 bytes
}

TEST_CASE("split points: one point, many points, and the last bucket only when parameters remain", "[parallel]") {
  const auto params = resnet50_params(10);
  const auto extents = param_extents(params);
  SECTION("one point") {
    const std::vector<int> split = {160};
    const auto b = buckets_from_split(extents, split);
    REQUIRE(b.size() == 2);
    REQUIRE(b[1].first_param == 160);
    require_cover(b, params);
  }
  SECTION("every index is its own bucket") {
    std::vector<int> split;
    for (int i = 1; i < 161; ++i) split.push_back(i);
    const auto b = buckets_from_split(extents, split);
    REQUIRE(b.size() == 161);
    require_cover(b, params);
  }
  SECTION("no points: one bucket") {
    const auto b = buckets_from_split(extents, std::vector<int>{});
    REQUIRE(b.size() == 1);
    require_cover(b, params);
  }
  SECTION("the single bucket, given explicitly, wins over the size default") {
    const auto b = plan_buckets(extents, SplitPoints::single_bucket(), 0.0);
    REQUIRE(b.size() == 1);
    require_cover(b, params);
    REQUIRE(b == plan_buckets(extents, SplitPoints::parse("none"), 0.0));
  }
}

TEST_CASE("bad split points are clear errors", "[parallel]") {
  const auto extents = param_extents(resnet50_params(10));
  const auto fails = [&](std::vector<int> split) { return buckets_from_split(extents, split); };
  REQUIRE_THROWS_AS(fails({85, 161}), DistError);  // index >= P
  REQUIRE_THROWS_AS(fails({200}), DistError);
  REQUIRE_THROWS_AS(fails({160, 85}), DistError);  // not ascending
  REQUIRE_THROWS_AS(fails({85, 85}), DistError);
  REQUIRE_THROWS_AS(fails({0, 85}), DistError);  // empty first bucket
  REQUIRE_THROWS_AS(fails({-3}), DistError);
  try {
    fails({85, 161});
    FAIL("no error");
  } catch (const DistError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    REQUIRE(what.find("--allreduce-split 85,161") != std::string::npos);
    REQUIRE(what.find("161 trainable parameters") != std::string::npos);
  }
  // The text itself is SplitPoints::parse's (tests/test_allreduce_split_points.cpp); a parsed split
  // still meets the parameter count here.
  REQUIRE_THROWS_AS(buckets_from_split(extents, SplitPoints::parse("85,161")), DistError);
  REQUIRE_THROWS_AS(plan_buckets(extents, SplitPoints::parse("85,161"), 0.0), DistError);
  REQUIRE_THROWS_AS(plan_buckets(extents, SplitPoints::parse("85"), 4.0), DistError);  // both ways given
  REQUIRE_THROWS_AS(plan_buckets(extents, SplitPoints::single_bucket(), 4.0), DistError);
}

TEST_CASE("bad parameter tables and bucket sizes are clear errors", "[parallel]") {
  const std::vector<ParamExtent> overlap = {{0, 10}, {5, 10}};
  REQUIRE_THROWS_AS(buckets_by_size(overlap, 1.0), DistError);
  const std::vector<ParamExtent> empty_param = {{0, 10}, {10, 0}};
  REQUIRE_THROWS_AS(buckets_by_size(empty_param, 1.0), DistError);
  REQUIRE_THROWS_AS(buckets_by_size({}, 1.0), DistError);
  const auto extents = param_extents(resnet50_params(10));
  REQUIRE_THROWS_AS(buckets_by_size(extents, 0.0), DistError);
  REQUIRE_THROWS_AS(buckets_by_size(extents, -1.0), DistError);
  REQUIRE_THROWS_AS(buckets_by_size(extents, std::nan("")), DistError);
}

TEST_CASE("--bucket-mb matches PyTorch DDP's bucket assignment on ResNet-50", "[parallel]") {
  // DDP assigns parameters in reverse order and closes a bucket once it reaches the cap; passing one
  // cap (no 1 MiB first bucket) gives exactly the --bucket-mb rule.
  const std::string script = R"PY(
import json, torch, torchvision, torch.distributed as dist
for classes in (1000, 10):
    ps = [p for p in torchvision.models.resnet50(num_classes=classes).parameters() if p.requires_grad]
    rev = list(reversed(ps))
    names = [k for k, p in torchvision.models.resnet50(num_classes=classes).named_parameters() if p.requires_grad]
    out = {"classes": classes, "numel": [p.numel() for p in ps], "names": names, "buckets": {}}
    for mb in (1, 5, 25, 100):
        got, _ = dist._compute_bucket_assignment_by_size(rev, [mb * 1024 * 1024], [False] * len(rev),
                                                          list(reversed(range(len(ps)))))
        out["buckets"][str(mb)] = sorted([min(b), max(b) + 1] for b in got)
    print(json.dumps(out))
)PY";
  const wb::test::TempDir dir;
  const wb::test::ProcessResult py = wb::test::run_python_script(dir, "buckets.py", script);
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  const std::string& out = py.out;
  std::size_t lines = 0, pos = 0;
  while (pos < out.size()) {
    const std::size_t nl = std::min(out.find('\n', pos), out.size());
    const auto j = nlohmann::json::parse(out.substr(pos, nl - pos));
    pos = nl + 1;
    ++lines;
    const int classes = j["classes"];
    const auto params = resnet50_params(classes);
    CAPTURE(classes);
    const auto numel = j["numel"].get<std::vector<std::int64_t>>();
    const auto names = j["names"].get<std::vector<std::string>>();
    REQUIRE(numel.size() == params.size());
    REQUIRE(names == names_of(params));
    for (std::size_t i = 0; i < numel.size(); ++i) REQUIRE(numel[i] == params[i].numel);
    for (const auto& [mb, ranges] : j["buckets"].items()) {
      CAPTURE(mb);
      const auto buckets = buckets_by_size(param_extents(params), std::stod(mb));
      require_cover(buckets, params);
      REQUIRE(buckets.size() == ranges.size());
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        REQUIRE(buckets[b].first_param == ranges[b][0].get<int>());
        REQUIRE(buckets[b].end_param == ranges[b][1].get<int>());
      }
    }
    if (classes == 1000) {
      // The 25 MiB default on ImageNet ResNet-50: [0,96), [96,135), [135,147), [147,161).
      const auto buckets = plan_buckets(param_extents(params), {}, 0.0);
      REQUIRE(buckets.size() == 4);
      REQUIRE(buckets[1].first_param == 96);
      REQUIRE(buckets[3].first_param == 147);
      std::printf("%s", format_buckets(buckets, names_of(params)).c_str());
    }
  }
  REQUIRE(lines == 2);
}

TEST_CASE("size buckets: every bucket but the first reaches the cap and closes at once", "[parallel]") {
  const auto params = resnet50_params(10);
  const double mb = GENERATE(0.5, 2.0, 25.0, 1000.0);
  CAPTURE(mb);
  const auto buckets = buckets_by_size(param_extents(params), mb);
  require_cover(buckets, params);
  const double cap = mb * 1024 * 1024;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    CAPTURE(b);
    const double bytes = static_cast<double>(buckets[b].bytes());
    if (b > 0) {
      REQUIRE(bytes >= cap);
      // Without its first (lowest-index) parameter, the bucket was still below the cap.
      const double rest = bytes - 4.0 * static_cast<double>(params[static_cast<std::size_t>(buckets[b].first_param)].numel);
      REQUIRE(rest < cap);
    } else {
      REQUIRE(bytes > 0.0);
    }
  }
  if (mb == 1000.0) REQUIRE(buckets.size() == 1);
}
