// The backend-independent checks both backends share (trainer/backend/checks.hpp): output shapes of
// convolution and max pooling against PyTorch's, the error paths with their messages, and the backend
// name or owner that the memory checks put into those messages.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <sstream>

#include "test_backend_util.hpp"
#include "trainer/backend/checks.hpp"

using wb::backend::BackendError;
using wb::backend::Conv2dParams;
using wb::backend::DType;
using wb::backend::LossConvention;
using wb::backend::LossParams;
using wb::backend::ParamSegment;
using wb::backend::Pool2dParams;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

// The message of the BackendError that `f` throws ("" when it throws none).
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const BackendError& e) {
    return e.what();
  }
  return "";
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
};

struct PoolCase {
  Shape x;
  Pool2dParams p;
};

const std::vector<ConvCase> kConvCases = {
    {{2, 3, 7, 7}, {4, 3, 3, 3}, {1, 1}},          {{1, 3, 224, 224}, {64, 3, 7, 7}, {2, 3}},
    {{2, 64, 56, 56}, {64, 64, 1, 1}, {1, 0}},     {{2, 64, 56, 56}, {128, 64, 3, 3}, {2, 1}},
    {{1, 8, 5, 6}, {2, 8, 5, 5}, {2, 0}},          {{1, 1, 3, 3}, {1, 1, 3, 3}, {1, 0}},
    {{1, 2, 4, 4}, {2, 2, 7, 7}, {3, 2}},          {{3, 2, 9, 10}, {1, 2, 2, 2}, {3, 1}},
    {{2, 256, 14, 14}, {1024, 256, 1, 1}, {2, 0}},
};

const std::vector<PoolCase> kPoolCases = {
    {{2, 64, 112, 112}, {3, 2, 1}}, {{1, 3, 7, 7}, {3, 2, 1}}, {{1, 1, 5, 4}, {2, 2, 0}},
    {{2, 3, 8, 9}, {3, 3, 1}},      {{1, 2, 1, 1}, {1, 1, 0}}, {{1, 1, 6, 6}, {5, 1, 2}},
    {{1, 1, 2, 3}, {4, 3, 2}},
};

std::string tuple_of(const Shape& s) {
  std::ostringstream o;
  o << "(";
  for (int i = 0; i < s.rank(); ++i) o << s[i] << ",";
  o << ")";
  return o.str();
}

// PyTorch's output shapes for every case, one line of four numbers each, convolutions first.
std::vector<Shape> torch_output_shapes() {
  wb::test::TempDir dir("checks");
  std::ostringstream body;
  body << "conv = [\n";
  for (const auto& c : kConvCases) {
    body << "  (" << tuple_of(c.x) << ", " << tuple_of(c.w) << ", " << c.p.stride << ", " << c.p.pad << "),\n";
  }
  body << "]\npool = [\n";
  for (const auto& c : kPoolCases) {
    body << "  (" << tuple_of(c.x) << ", " << c.p.kernel << ", " << c.p.stride << ", " << c.p.pad << "),\n";
  }
  body << "]\n"
          "with open('shapes.txt', 'w') as f:\n"
          "    for x, w, s, p in conv:\n"
          "        y = F.conv2d(torch.zeros(x), torch.zeros(w), stride=s, padding=p)\n"
          "        f.write(' '.join(str(d) for d in y.shape) + '\\n')\n"
          "    for x, k, s, p in pool:\n"
          "        y = F.max_pool2d(torch.zeros(x), k, stride=s, padding=p)\n"
          "        f.write(' '.join(str(d) for d in y.shape) + '\\n')\n";
  wb::test::run_torch_script(dir, "shapes", body.str());
  std::ifstream in(dir.file("shapes.txt"));
  std::vector<Shape> shapes;
  std::int64_t a = 0, b = 0, c = 0, d = 0;
  while (in >> a >> b >> c >> d) shapes.push_back(Shape{a, b, c, d});
  REQUIRE(shapes.size() == kConvCases.size() + kPoolCases.size());
  return shapes;
}

}  // namespace

TEST_CASE("conv and max-pool output shapes match PyTorch's", "[trainer][backend]") {
  const std::vector<Shape> want = torch_output_shapes();
  for (std::size_t i = 0; i < kConvCases.size(); ++i) {
    const ConvCase& c = kConvCases[i];
    CAPTURE(c.x.to_string(), c.w.to_string(), c.p.stride, c.p.pad);
    CHECK(wb::backend::conv2d_output_shape(c.x, c.w, c.p, "conv") == want[i]);
  }
  for (std::size_t i = 0; i < kPoolCases.size(); ++i) {
    const PoolCase& c = kPoolCases[i];
    CAPTURE(c.x.to_string(), c.p.kernel, c.p.stride, c.p.pad);
    CHECK(wb::backend::maxpool_output_shape(c.x, c.p, "pool") == want[kConvCases.size() + i]);
  }
}

TEST_CASE("conv and max-pool geometry errors name the op and what was expected", "[trainer][backend]") {
  using wb::backend::conv2d_output_shape;
  using wb::backend::maxpool_output_shape;
  const Shape x{2, 3, 8, 8};
  SECTION("convolution") {
    REQUIRE_THROWS_AS(conv2d_output_shape(Shape{3, 8, 8}, Shape{4, 3, 3, 3}, {}, "op"), BackendError);
    CHECK(message_of([&] { conv2d_output_shape(Shape{3, 8, 8}, Shape{4, 3, 3, 3}, {}, "my_conv"); }) ==
          "my_conv: expected x (N,C,H,W) and w (O,C,K,K), got x [3, 8, 8] w [4, 3, 3, 3]");
    REQUIRE_THROWS_AS(conv2d_output_shape(x, Shape{4, 2, 3, 3}, {}, "op"), BackendError);
    CHECK_THAT(message_of([&] { conv2d_output_shape(x, Shape{4, 3, 3, 2}, {}, "op"); }),
               Catch::Contains("need w[1] == C and a square kernel"));
    REQUIRE_THROWS_AS(conv2d_output_shape(x, Shape{4, 3, 3, 3}, {0, 1}, "op"), BackendError);
    CHECK(message_of([&] { conv2d_output_shape(x, Shape{4, 3, 3, 3}, {1, -1}, "op"); }) ==
          "op: stride must be >= 1 and pad >= 0, got stride 1 pad -1");
    CHECK(message_of([&] { conv2d_output_shape(x, Shape{4, 3, 11, 11}, {1, 1}, "op"); }) ==
          "op: kernel 11 is larger than the padded input [2, 3, 8, 8]");
    // The largest kernel that still fits the padded input is fine: one output position.
    CHECK(conv2d_output_shape(x, Shape{4, 3, 10, 10}, {1, 1}, "op") == Shape{2, 4, 1, 1});
  }
  SECTION("max pooling") {
    REQUIRE_THROWS_AS(maxpool_output_shape(x, {3, 2, 2}, "op"), BackendError);
    CHECK(message_of([&] { maxpool_output_shape(x, {3, 2, 2}, "maxpool"); }) ==
          "maxpool: need kernel >= 1, stride >= 1, 0 <= pad <= kernel / 2; got kernel 3 stride 2 pad 2");
    REQUIRE_THROWS_AS(maxpool_output_shape(x, {3, 0, 1}, "op"), BackendError);
    CHECK(message_of([&] { maxpool_output_shape(x, {11, 1, 1}, "maxpool_forward"); }) ==
          "maxpool_forward: kernel 11 is larger than the padded input [2, 3, 8, 8]");
  }
}

TEST_CASE("memory checks name the backend in their messages", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  SECTION("view: bounds and plain base, and a valid view aliases its base") {
    Tensor base = wb::test::make_tensor(*be, {6}, {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f});
    REQUIRE_THROWS_AS(be->view(base, 4, {3}), BackendError);
    CHECK(message_of([&] { be->view(base, 4, {3}); }) == "cpu backend view: elements [4, 7) exceed the base tensor's 6");
    Tensor v = be->view(base, 4, {2});
    CHECK(v.is_plain());
    CHECK(v.backend() == be.get());
    CHECK(v.shape() == Shape{2});
    CHECK(wb::test::to_vec(*be, v) == std::vector<float>{4.0f, 5.0f});
    be->fill(v, 9.0f);
    CHECK(wb::test::to_vec(*be, base) == std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f, 9.0f, 9.0f});
    Tensor blocked = wb::test::make_tensor(*be, {1, 16, 2, 2}, std::vector<float>(64, 1.0f), true);
    REQUIRE_FALSE(blocked.is_plain());
    REQUIRE_THROWS_AS(be->view(blocked, 0, {4}), BackendError);
    CHECK(message_of([&] { be->view(blocked, 0, {4}); }) ==
          "cpu backend view: the base tensor [1, 16, 2, 2] is not plain");
  }
  SECTION("host transfers, copy and fill") {
    Tensor t = be->empty({4}, DType::f32);
    std::vector<float> three(3);
    REQUIRE_THROWS_AS(be->to_host(t, three), BackendError);
    CHECK(message_of([&] { be->to_host(t, three); }) ==
          "cpu backend to_host: host buffer has 3 elements, tensor [4] has 4");
    Tensor labels = be->empty({4}, DType::i32);
    CHECK(message_of([&] { be->fill(labels, 1.0f); }) == "cpu backend fill: tensor is i32, expected f32");
    REQUIRE_THROWS_AS(be->copy(t, labels), BackendError);
    CHECK(message_of([&] { be->copy(t, labels); }) ==
          "cpu backend copy: source [4] f32 and destination [4] i32 differ");
  }
}

TEST_CASE("f32, label and buffer checks throw with the expected message", "[trainer][backend]") {
  using wb::backend::check_f32;
  auto be = wb::backend::make_cpu_backend({1});
  auto other = wb::backend::make_cpu_backend({1});
  Tensor t = be->empty({2, 3}, DType::f32);
  SECTION("f32") {
    CHECK_NOTHROW(check_f32(t, 2, "op", "t", be.get()));
    CHECK_NOTHROW(check_f32(t, 0, "op", "t", nullptr));
    // Without an owner a foreign tensor passes: the backend's own impl lookup rejects it later.
    CHECK_NOTHROW(check_f32(t, 2, "op", "t", nullptr));
    REQUIRE_THROWS_AS(check_f32(t, 2, "op", "t", other.get()), BackendError);
    CHECK(message_of([&] { check_f32(t, 2, "op", "t", other.get()); }) ==
          "op: t [2, 3] belongs to another backend (expected one made by this cpu backend)");
    CHECK(message_of([&] { check_f32(Tensor(), 2, "op", "t", nullptr); }) == "op: t is undefined");
    CHECK(message_of([&] { check_f32(t, 4, "op", "t", be.get()); }) == "op: t must have 4 dimensions, got [2, 3]");
    Tensor i = be->empty({2}, DType::i32);
    CHECK(message_of([&] { check_f32(i, 1, "op", "t", be.get()); }) == "op: t must be f32, got i32");
  }
  SECTION("labels") {
    Tensor labels = be->empty({2}, DType::i32);
    CHECK_NOTHROW(wb::backend::check_labels(labels, 2, "xent", nullptr));
    CHECK_NOTHROW(wb::backend::check_labels(labels, 2, "xent", be.get()));
    REQUIRE_THROWS_AS(wb::backend::check_labels(labels, 3, "xent", nullptr), BackendError);
    CHECK(message_of([&] { wb::backend::check_labels(labels, 3, "xent", nullptr); }) == "xent: labels must be i32 (3)");
    CHECK(message_of([&] { wb::backend::check_labels(labels, 2, "xent", other.get()); }) ==
          "xent: labels must be i32 (2) on this backend");
    const std::vector<std::int32_t> y{0, 9, 10, -1};
    REQUIRE_THROWS_AS(wb::backend::check_label_range(y, 10, "xent"), BackendError);
    CHECK(message_of([&] { wb::backend::check_label_range(y, 10, "xent"); }) ==
          "xent: label 10 at batch index 2 is outside [0, 10)");
    const std::vector<std::int32_t> in_range{0, 9, 10};
    CHECK_NOTHROW(wb::backend::check_label_range(in_range, 11, "xent"));
  }
  SECTION("sgd buffers and segments") {
    Tensor p6 = be->empty({6}, DType::f32), p7 = be->empty({7}, DType::f32);
    CHECK(wb::backend::check_sgd_buffers(p6, p6, p6, nullptr) == 6);
    REQUIRE_THROWS_AS(wb::backend::check_sgd_buffers(p6, p7, p6, nullptr), BackendError);
    CHECK(message_of([&] { wb::backend::check_sgd_buffers(p6, p7, p6, nullptr); }) ==
          "sgd_update: params, grads and momentum differ in size (6, 7, 6)");
    const std::vector<ParamSegment> segments{{0, 4, true}, {4, 3, false}};
    CHECK_NOTHROW(wb::backend::check_sgd_segments(segments, 7));
    REQUIRE_THROWS_AS(wb::backend::check_sgd_segments(segments, 6), BackendError);
    CHECK(message_of([&] { wb::backend::check_sgd_segments(segments, 6); }) ==
          "sgd_update: segment [4, 7) is outside the 6-element buffers");
  }
}

TEST_CASE("smoothed loss targets sum to one and reject bad smoothing", "[trainer][backend]") {
  for (const auto convention : {LossConvention::torch, LossConvention::mindspore}) {
    for (const std::int64_t k : {2, 10, 1000}) {
      for (const float s : {0.0f, 0.1f, 0.3f}) {
        CAPTURE(static_cast<int>(convention), k, s);
        const auto t = wb::backend::loss_targets(LossParams{convention, s}, k, "xent");
        const double total = static_cast<double>(t.on) + static_cast<double>(k - 1) * static_cast<double>(t.off);
        CHECK_THAT(total, Catch::Matchers::WithinAbs(1.0, 1e-5));
        // torch spreads s over all K classes, mindspore over the K - 1 others.
        const double off = convention == LossConvention::torch ? s / static_cast<double>(k)
                                                                : s / static_cast<double>(k - 1);
        CHECK_THAT(static_cast<double>(t.off), Catch::Matchers::WithinRel(off, 1e-6) ||
                                                   Catch::Matchers::WithinAbs(off, 1e-12));
      }
    }
  }
  REQUIRE_THROWS_AS(wb::backend::loss_targets(LossParams{LossConvention::torch, 1.0f}, 10, "xent"), BackendError);
  CHECK(message_of([] { wb::backend::loss_targets(LossParams{LossConvention::mindspore, 0.1f}, 1, "xent"); }) ==
        "xent: mindspore smoothing needs >= 2 classes");
  const auto one = wb::backend::loss_targets(LossParams{LossConvention::mindspore, 0.0f}, 1, "xent");
  CHECK(one.on == 1.0f);
  CHECK(one.off == 0.0f);
}
