// Every metric of compare/metrics against a numpy float64 oracle run from the test on data the test
// writes (random, near-equal, zero-norm, NaN/Inf at matching and different positions, every dtype).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/metrics.hpp"
#include "store/tensor_file.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using wb::compare::Metrics;
using wb::compare::Tolerance;
using wb::store::DType;
using wb::store::HostTensor;
using wb::test::TempDir;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The oracle: the definitions of compare/metrics.hpp written with numpy in float64.
const char* kOracle = R"PY(
import json, sys, math, warnings
import numpy as np
warnings.simplefilter("ignore")  # casts of NaN/Inf bit patterns warn; they are intended here
EPS = 2.2e-16

def num(x):
    x = float(x)
    if math.isnan(x): return "nan"
    if math.isinf(x): return "inf" if x > 0 else "-inf"
    return x

def metrics(a, b, rtol, atol):
    a = a.astype(np.float64).ravel(); b = b.astype(np.float64).ravel()
    numel = a.size
    fa, fb = np.isfinite(a), np.isfinite(b)
    nf = ~(fa & fb)
    same = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    mism = nf & ~same
    out = dict(numel=numel, nonfinite_mismatch=int(mism.sum()),
               first_nonfinite_mismatch=int(np.argmax(mism)) if mism.any() else -1,
               a_nan=int(np.isnan(a).sum()), a_inf=int(np.isinf(a).sum()),
               b_nan=int(np.isnan(b).sum()), b_inf=int(np.isinf(b).sum()))
    a0 = np.where(nf, 0.0, a); b0 = np.where(nf, 0.0, b)
    valid = ~mism
    av, bv = a0[valid], b0[valid]
    n = av.size
    out['compared'] = n
    if n == 0:
        out.update(max_abs=0.0, max_abs_index=-1, mean_abs=0.0, max_rel=0.0, max_rel_index=-1, rel_l2=0.0,
                   rmse=0.0, euc_dist=0.0, cosine=1.0, sqnr_db=num(math.inf), allclose_count=0, allclose_ratio=1.0,
                   one_thousandth_count=0, one_thousandth_ratio=1.0, five_thousandths_count=0,
                   five_thousandths_ratio=1.0, a_min=0.0, a_max=0.0, a_mean=0.0, a_l2=0.0, b_min=0.0, b_max=0.0,
                   b_mean=0.0, b_l2=0.0, norm_ratio=1.0, scale=1.0, scale_stderr=0.0, scale_z=0.0,
                   scale_noise_p=1.0, residual_rel_l2=0.0)
        return out
    idx = np.nonzero(valid)[0]
    d = av - bv
    ad = np.abs(d)
    rel = ad / np.maximum(np.abs(bv), EPS)
    d2 = np.sum(d * d); a2 = np.sum(av * av); b2 = np.sum(bv * bv)
    na, nb, nd = math.sqrt(a2), math.sqrt(b2), math.sqrt(d2)
    if na == 0 and nb == 0: cos = 1.0
    elif na == 0 or nb == 0: cos = math.nan
    else: cos = min(1.0, max(-1.0, float(np.sum(av * bv)) / (na * nb)))
    close = int(np.sum(ad <= atol + rtol * np.abs(bv)))
    c1k = int(np.sum(rel < 1e-3)); c5k = int(np.sum(rel < 5e-3))
    out.update(max_abs=ad.max(), max_abs_index=int(idx[np.argmax(ad)]), mean_abs=np.mean(ad),
               max_rel=rel.max(), max_rel_index=int(idx[np.argmax(rel)]),
               rel_l2=0.0 if d2 == 0 else (math.inf if nb == 0 else nd / nb),
               rmse=math.sqrt(d2 / n), euc_dist=nd, cosine=cos,
               sqnr_db=math.inf if d2 == 0 else (-math.inf if nb == 0 else 20 * math.log10(nb / nd)),
               allclose_count=close, allclose_ratio=close / n, one_thousandth_count=c1k,
               one_thousandth_ratio=c1k / n, five_thousandths_count=c5k, five_thousandths_ratio=c5k / n,
               a_min=a0.min(), a_max=a0.max(), a_mean=np.sum(a0) / numel, a_l2=na,
               b_min=b0.min(), b_max=b0.max(), b_mean=np.sum(b0) / numel, b_l2=nb)
    # The least-squares scale s = <a,b>/<b,b> and the residual a - s b, through the identities
    # s - 1 = <d,b>/<b,b> and a - s b = d - (s - 1) b: 1 + tiny is not representable, d is.
    if nb == 0:
        out.update(norm_ratio=1.0 if na == 0 else math.inf, scale=1.0 if na == 0 else math.nan,
                   scale_stderr=0.0 if na == 0 else math.nan, scale_z=0.0 if na == 0 else math.nan,
                   scale_noise_p=1.0, residual_rel_l2=0.0 if na == 0 else math.inf)
    else:
        shift = float(np.dot(d, bv)) / float(np.dot(bv, bv))
        s = 1.0 + shift
        r = math.sqrt(float(np.sum((d - shift * bv) ** 2)))
        se = r / nb / math.sqrt(n - 1) if n >= 2 else math.inf
        shift = abs(shift)
        z = 0.0 if d2 == 0 else (math.inf if se == 0 else shift / se)
        out.update(norm_ratio=na / nb, scale=s, scale_stderr=se, scale_z=z, residual_rel_l2=r / nb,
                   scale_noise_p=1.0 if d2 == 0 else (r / nd) ** (n - 1))
    return {k: (num(v) if isinstance(v, (float, np.floating)) else int(v)) for k, v in out.items()}

cases = json.load(open(sys.argv[1]))
res = {}
for c in cases:
    a = np.load(c['a']); b = np.load(c['b'])
    res[c['name']] = metrics(a, b, c['rtol'], c['atol'])
json.dump(res, open(sys.argv[2], 'w'))
)PY";

template <typename T>
HostTensor make(DType dtype, const std::vector<T>& values, std::vector<std::int64_t> shape = {}) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = shape.empty() ? std::vector<std::int64_t>{static_cast<std::int64_t>(values.size())} : shape;
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

HostTensor f32(const std::vector<float>& v) { return make(DType::F32, v); }

// BF16 has no numpy dtype: the oracle gets the exact float32 values.
HostTensor bf16_as_f32(const HostTensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
  }
  return f32(out);
}

struct Case {
  std::string name;
  HostTensor a, b;
  Tolerance tol;
  HostTensor oracle_a, oracle_b;  // what numpy reads (differs from a, b only for BF16)
};

std::vector<Case> build_cases() {
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<Case> cases;
  auto add = [&](std::string name, HostTensor a, HostTensor b, Tolerance tol = {}) {
    Case c{std::move(name), a, b, tol, a, b};
    if (a.dtype == DType::BF16) c.oracle_a = bf16_as_f32(a);
    if (b.dtype == DType::BF16) c.oracle_b = bf16_as_f32(b);
    cases.push_back(std::move(c));
  };
  auto randn = [&](std::size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = scale * normal(rng);
    return v;
  };
  // Near-equal: relative perturbations around the 1‰ / 5‰ / allclose boundaries.
  auto perturb = [&](const std::vector<float>& b, float rel) {
    std::vector<float> a(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) a[i] = b[i] * (1.0f + rel * unit(rng));
    return a;
  };

  add("random_1", f32(randn(1)), f32(randn(1)));
  add("random_7", f32(randn(7)), f32(randn(7)));
  for (std::size_t n : {1000u, 4097u, 100003u}) {
    const auto b = randn(n);
    add("near_" + std::to_string(n), f32(perturb(b, 4e-3f)), f32(b));
  }
  {
    // Many chunks, mixed magnitudes (1e-6 .. 1e6), some exact zeros in B.
    std::vector<float> b = randn(1000003);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] *= std::pow(10.0f, static_cast<float>(i % 13) - 6.0f);
    for (std::size_t i = 0; i < b.size(); i += 9973) b[i] = 0.0f;
    add("near_1000003_mixed", f32(perturb(b, 1e-3f)), f32(b));
  }
  add("random_tolerance", f32(perturb(randn(20000), 1e-2f)), f32(randn(20000)), Tolerance{1e-3, 1e-6});
  {
    // A 1% scale under noise of the same size: the scale metrics' own case.
    std::vector<float> b = randn(5000), a(b.size());
    const std::vector<float> noise = randn(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) a[i] = 1.01f * b[i] + 0.01f * noise[i];
    add("scaled_1pct", f32(a), f32(b));
    const std::vector<float> small = randn(12), small_noise = randn(12);
    std::vector<float> as(small.size());
    for (std::size_t i = 0; i < small.size(); ++i) as[i] = 0.98f * small[i] + 0.02f * small_noise[i];
    add("scaled_small", f32(as), f32(small));
  }
  add("zeros_both", f32(std::vector<float>(50, 0.0f)), f32(std::vector<float>(50, 0.0f)));
  add("zero_b", f32(randn(50)), f32(std::vector<float>(50, 0.0f)));
  add("zero_a", f32(std::vector<float>(50, 0.0f)), f32(randn(50)));
  add("identical", f32(randn(3000)), f32({}));
  cases.back().b = cases.back().a;
  cases.back().oracle_b = cases.back().a;
  add("empty", f32({}), f32({}));
  {
    // NaN and Inf at the same positions (msprobe zeroes them), across a chunk boundary.
    auto b = randn(5000);
    auto a = perturb(b, 1e-4f);
    for (std::size_t i : {3u, 2047u, 2048u, 4999u}) a[i] = b[i] = std::numeric_limits<float>::quiet_NaN();
    a[100] = b[100] = std::numeric_limits<float>::infinity();
    a[4000] = b[4000] = -std::numeric_limits<float>::infinity();
    add("nonfinite_matching", f32(a), f32(b));
  }
  {
    // Different positions: NaN vs number, +Inf vs -Inf, number vs Inf, NaN vs Inf.
    auto b = randn(5000);
    auto a = perturb(b, 1e-4f);
    a[10] = std::numeric_limits<float>::quiet_NaN();
    a[2050] = std::numeric_limits<float>::infinity();
    b[2050] = -std::numeric_limits<float>::infinity();
    b[3000] = std::numeric_limits<float>::infinity();
    a[3001] = std::numeric_limits<float>::quiet_NaN();
    b[3001] = std::numeric_limits<float>::infinity();
    a[7] = b[7] = std::numeric_limits<float>::quiet_NaN();
    add("nonfinite_mismatch", f32(a), f32(b));
  }
  {
    // The largest error sits on a mismatched position's neighbourhood; every pair of one chunk mismatched.
    std::vector<float> b = randn(3000), a = perturb(b, 1e-3f);
    for (std::size_t i = 0; i < 2048; ++i) a[i] = std::numeric_limits<float>::quiet_NaN();
    add("chunk_all_mismatched", f32(a), f32(b));
  }
  add("all_mismatched", f32(std::vector<float>(10, std::numeric_limits<float>::quiet_NaN())), f32(randn(10)));
  {
    std::vector<double> b(3001), a(3001);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (std::size_t i = 0; i < b.size(); ++i) {
      b[i] = nd(rng);
      a[i] = b[i] + 1e-9 * nd(rng);
    }
    add("f64_near", make(DType::F64, a), make(DType::F64, b));
    std::vector<float> bf(b.begin(), b.end());
    add("f32_vs_f64", f32(bf), make(DType::F64, b));
  }
  {
    // Random half and bfloat16 bit patterns: every exponent, subnormals, some Inf and NaN.
    std::uniform_int_distribution<std::uint32_t> bits(0, 65535);
    std::vector<std::uint16_t> ha(6000), hb(6000), ba(6000), bb(6000);
    for (std::size_t i = 0; i < ha.size(); ++i) {
      hb[i] = static_cast<std::uint16_t>(bits(rng));
      ha[i] = static_cast<std::uint16_t>(i % 3 == 0 ? hb[i] : bits(rng));
      bb[i] = static_cast<std::uint16_t>(bits(rng));
      ba[i] = static_cast<std::uint16_t>(i % 3 == 0 ? bb[i] ^ 1u : bits(rng));
    }
    add("f16_bits", make(DType::F16, ha), make(DType::F16, hb));
    add("bf16_bits", make(DType::BF16, ba), make(DType::BF16, bb));
  }
  {
    std::uniform_int_distribution<std::int32_t> ints(-1000000, 1000000);
    std::vector<std::int32_t> ia(4000), ib(4000);
    std::vector<std::int64_t> la(4000), lb(4000);
    std::vector<std::uint8_t> ua(4000), ub(4000), oa(4000), ob(4000);
    for (std::size_t i = 0; i < ia.size(); ++i) {
      ib[i] = ints(rng);
      ia[i] = i % 2 ? ib[i] : ib[i] + ints(rng) % 3;
      lb[i] = static_cast<std::int64_t>(ints(rng)) * 1000003;
      la[i] = i % 2 ? lb[i] : lb[i] + ints(rng) % 100;
      ub[i] = static_cast<std::uint8_t>(ints(rng) & 0xff);
      ua[i] = static_cast<std::uint8_t>(i % 5 ? ub[i] : ints(rng) & 0xff);
      ob[i] = static_cast<std::uint8_t>(ints(rng) & 1);
      oa[i] = static_cast<std::uint8_t>(i % 7 ? ob[i] : 1 - ob[i]);
    }
    add("i32", make(DType::I32, ia), make(DType::I32, ib));
    add("i64", make(DType::I64, la), make(DType::I64, lb));
    add("u8", make(DType::U8, ua), make(DType::U8, ub));
    add("bool", make(DType::BOOL, oa), make(DType::BOOL, ob));
    add("i32_vs_f32", make(DType::I32, ia), f32(std::vector<float>(ib.begin(), ib.end())));
  }
  return cases;
}

double value_of(const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return kNaN;
    return s == "inf" ? kInf : -kInf;
  }
  return v.get<double>();
}

void check_value(const std::string& what, double ours, const nlohmann::json& expected_json, double rel = 1e-9) {
  const double expected = value_of(expected_json);
  CAPTURE(what, ours, expected);
  if (std::isnan(expected)) {
    CHECK(std::isnan(ours));
  } else if (std::isinf(expected) || expected == 0.0) {
    CHECK(ours == expected);
  } else {
    CHECK_THAT(ours, Catch::Matchers::WithinRel(expected, rel));
  }
}

}  // namespace

TEST_CASE("metrics agree with a numpy float64 oracle", "[compare]") {
  TempDir dir;
  std::vector<Case> cases = build_cases();
  nlohmann::json manifest = nlohmann::json::array();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const fs::path pa = dir.path() / (cases[i].name + "_a.npy"), pb = dir.path() / (cases[i].name + "_b.npy");
    wb::store::write_npy(pa, cases[i].oracle_a);
    wb::store::write_npy(pb, cases[i].oracle_b);
    manifest.push_back({{"name", cases[i].name}, {"a", pa.string()}, {"b", pb.string()},
                        {"rtol", cases[i].tol.rtol}, {"atol", cases[i].tol.atol}});
  }
  const fs::path manifest_path = dir / "cases.json", out = dir / "out.json";
  std::ofstream(manifest_path) << manifest.dump();
  const wb::test::ProcessResult py = wb::test::run_python_script(
      dir, "oracle.py", kOracle, wb::test::shell_quote(manifest_path.string()) + " " + wb::test::shell_quote(out.string()));
  INFO(py.output);
  REQUIRE(py.exit_code == 0);
  std::ifstream in(out);
  const nlohmann::json oracle = nlohmann::json::parse(in);

  // One oracle run for all cases; each case is checked in turn (SECTIONs would rerun the oracle).
  for (const Case& c : cases) {
    {
      const Metrics m = wb::compare::compute_metrics(c.a, c.b, c.tol);
      const nlohmann::json& e = oracle.at(c.name);
      CAPTURE(c.name);
      CHECK(m.numel == e.at("numel").get<std::int64_t>());
      CHECK(m.compared == e.at("compared").get<std::int64_t>());
      CHECK(m.nonfinite_mismatch == e.at("nonfinite_mismatch").get<std::int64_t>());
      CHECK(m.first_nonfinite_mismatch == e.at("first_nonfinite_mismatch").get<std::int64_t>());
      CHECK(m.a.nan_count == e.at("a_nan").get<std::int64_t>());
      CHECK(m.a.inf_count == e.at("a_inf").get<std::int64_t>());
      CHECK(m.b.nan_count == e.at("b_nan").get<std::int64_t>());
      CHECK(m.b.inf_count == e.at("b_inf").get<std::int64_t>());
      CHECK(m.max_abs_index == e.at("max_abs_index").get<std::int64_t>());
      CHECK(m.max_rel_index == e.at("max_rel_index").get<std::int64_t>());
      CHECK(m.allclose_count == e.at("allclose_count").get<std::int64_t>());
      CHECK(m.one_thousandth_count == e.at("one_thousandth_count").get<std::int64_t>());
      CHECK(m.five_thousandths_count == e.at("five_thousandths_count").get<std::int64_t>());
      check_value("max_abs", m.max_abs, e.at("max_abs"));
      check_value("mean_abs", m.mean_abs, e.at("mean_abs"));
      check_value("max_rel", m.max_rel, e.at("max_rel"));
      check_value("rel_l2", m.rel_l2, e.at("rel_l2"));
      check_value("rmse", m.rmse, e.at("rmse"));
      check_value("euc_dist", m.euc_dist, e.at("euc_dist"));
      check_value("cosine", m.cosine, e.at("cosine"));
      check_value("sqnr_db", m.sqnr_db, e.at("sqnr_db"));
      check_value("allclose_ratio", m.allclose_ratio, e.at("allclose_ratio"));
      check_value("one_thousandth_ratio", m.one_thousandth_ratio, e.at("one_thousandth_ratio"));
      check_value("five_thousandths_ratio", m.five_thousandths_ratio, e.at("five_thousandths_ratio"));
      check_value("a.min", m.a.min, e.at("a_min"));
      check_value("a.max", m.a.max, e.at("a_max"));
      check_value("a.mean", m.a.mean, e.at("a_mean"));
      check_value("a.l2norm", m.a.l2norm, e.at("a_l2"));
      check_value("b.min", m.b.min, e.at("b_min"));
      check_value("b.max", m.b.max, e.at("b_max"));
      check_value("b.mean", m.b.mean, e.at("b_mean"));
      check_value("b.l2norm", m.b.l2norm, e.at("b_l2"));
      check_value("norm_ratio", m.norm_ratio, e.at("norm_ratio"));
      check_value("scale", m.scale, e.at("scale"));
      // Differences of near-equal sums: a few more ulps apart.
      check_value("scale_stderr", m.scale_stderr, e.at("scale_stderr"), 1e-6);
      check_value("residual_rel_l2", m.residual_rel_l2, e.at("residual_rel_l2"), 1e-6);
      if (m.numel < 100000) check_value("scale_z", m.scale_z, e.at("scale_z"), 1e-5);
      if (m.numel < 1000) check_value("scale_noise_p", m.scale_noise_p, e.at("scale_noise_p"), 1e-4);
    }
  }
}

TEST_CASE("documented edge cases", "[compare]") {
  SECTION("both zero: cosine 1, no error") {
    const std::vector<float> z(8, 0.0f);
    const Metrics m = wb::compare::compute_metrics(wb::compare::view_of(z), wb::compare::view_of(z));
    CHECK(m.cosine == 1.0);
    CHECK(m.rel_l2 == 0.0);
    CHECK(std::isinf(m.sqnr_db));
    CHECK(m.bit_exact);
  }
  SECTION("one side zero: cosine NaN, rel-L2 inf when B is zero") {
    const std::vector<float> z(8, 0.0f), x(8, 1.0f);
    const Metrics m = wb::compare::compute_metrics(wb::compare::view_of(x), wb::compare::view_of(z));
    CHECK(std::isnan(m.cosine));
    CHECK(std::isinf(m.rel_l2));
    CHECK(m.sqnr_db == -kInf);
    const Metrics m2 = wb::compare::compute_metrics(wb::compare::view_of(z), wb::compare::view_of(x));
    CHECK(std::isnan(m2.cosine));
    CHECK_THAT(m2.rel_l2, Catch::Matchers::WithinRel(1.0, 1e-15));
  }
  SECTION("bit-exactness needs the same dtype") {
    const std::vector<float> x = {1.0f, 2.0f};
    const std::vector<double> y = {1.0, 2.0};
    const Metrics m = wb::compare::compute_metrics(wb::compare::view_of(x), wb::compare::view_of(y));
    CHECK(m.max_abs == 0.0);
    CHECK_FALSE(m.bit_exact);
  }
  SECTION("integers are exact by value at any width; bool against uint8 too") {
    auto tensor = [](DType dtype, const auto& values) {
      HostTensor t{"t", dtype, {static_cast<std::int64_t>(values.size())}, {}};
      t.data.resize(values.size() * sizeof(values[0]));
      std::memcpy(t.data.data(), values.data(), t.data.size());
      return t;
    };
    const HostTensor i32 = tensor(DType::I32, std::vector<std::int32_t>{3, 7, 0, 9});
    const HostTensor i64 = tensor(DType::I64, std::vector<std::int64_t>{3, 7, 0, 9});
    const HostTensor other = tensor(DType::I64, std::vector<std::int64_t>{3, 7, 1, 9});
    CHECK(wb::compare::compute_metrics(i32, i64).bit_exact);
    const Metrics differ = wb::compare::compute_metrics(i32, other);
    CHECK_FALSE(differ.bit_exact);
    CHECK(differ.max_abs == 1.0);
    HostTensor flags{"f", DType::BOOL, {3}, {std::byte{1}, std::byte{0}, std::byte{1}}};
    HostTensor bytes{"b", DType::U8, {3}, {std::byte{1}, std::byte{0}, std::byte{1}}};
    CHECK(wb::compare::compute_metrics(flags, bytes).bit_exact);
    bytes.data[2] = std::byte{2};
    CHECK_FALSE(wb::compare::compute_metrics(flags, bytes).bit_exact);
  }
  SECTION("element counts must agree") {
    const std::vector<float> x(3, 1.0f), y(4, 1.0f);
    REQUIRE_THROWS_AS(wb::compare::compute_metrics(wb::compare::view_of(x), wb::compare::view_of(y)),
                      std::invalid_argument);
  }
}

TEST_CASE("update metrics equal metrics of the explicit differences", "[compare]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t n = 10007;
  std::vector<float> a0(n), a1(n), b0(n), b1(n);
  std::vector<double> da(n), db(n);
  for (std::size_t i = 0; i < n; ++i) {
    a0[i] = b0[i] = nd(rng);
    b1[i] = b0[i] - 0.01f * nd(rng);
    a1[i] = b1[i] + 1e-6f * nd(rng);
    da[i] = static_cast<double>(a1[i]) - a0[i];
    db[i] = static_cast<double>(b1[i]) - b0[i];
  }
  using wb::compare::view_of;
  const Metrics u = wb::compare::compute_update_metrics(view_of(a1), view_of(a0), view_of(b1), view_of(b0));
  const Metrics e = wb::compare::compute_metrics(view_of(da), view_of(db));
  CHECK(u.max_abs == e.max_abs);
  CHECK(u.max_abs_index == e.max_abs_index);
  CHECK(u.rel_l2 == e.rel_l2);
  CHECK(u.cosine == e.cosine);
  CHECK(u.allclose_count == e.allclose_count);
  // The values themselves hide the update's error behind the common starting point.
  const Metrics v = wb::compare::compute_metrics(view_of(a1), view_of(b1));
  CHECK(v.rel_l2 < u.rel_l2 / 10.0);
}

TEST_CASE("worst elements are the largest errors with their coordinates", "[compare]") {
  const std::vector<float> b = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<float> a = b;
  a[5] += 0.5f;    // (1, 1)
  a[11] -= 2.0f;   // (2, 3)
  a[0] += 0.25f;   // (0, 0)
  a[7] = std::numeric_limits<float>::quiet_NaN();  // (1, 3): a mismatch ranks first
  const auto w = wb::compare::worst_elements(wb::compare::view_of(a), wb::compare::view_of(b), {3, 4}, 3);
  REQUIRE(w.size() == 3);
  CHECK(w[0].index == 7);
  CHECK(std::isinf(w[0].abs_err));
  CHECK(w[1].index == 11);
  CHECK(w[1].coord == std::vector<std::int64_t>{2, 3});
  CHECK(w[1].a == 9.0);
  CHECK(w[1].b == 11.0);
  CHECK(w[2].index == 5);
  CHECK(w[2].coord == std::vector<std::int64_t>{1, 1});
  CHECK_THAT(w[2].abs_err, Catch::Matchers::WithinAbs(0.5, 1e-12));
}
