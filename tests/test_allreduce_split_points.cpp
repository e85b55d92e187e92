// SplitPoints, the one allreduce split of wb-train, the analysis and the app: the strict text form,
// the single bucket, the check against the parameter count, bucket_of and the bucket ranges.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "allreduce/split_points.hpp"

using wb::allreduce::BucketRange;
using wb::allreduce::SplitError;
using wb::allreduce::SplitPoints;

namespace {

// The message of the SplitError that f throws; fails the test when it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const SplitError& e) {
    return e.what();
  }
  FAIL("no SplitError");
  return {};
}

}  // namespace

TEST_CASE("split points parse from and format to text", "[allreduce]") {
  const SplitPoints s = SplitPoints::parse("85,160");
  CHECK(s.points() == std::vector<int>{85, 160});
  CHECK(s.to_string() == "85,160");
  CHECK(s.bucket_count() == 3);
  CHECK_FALSE(s.is_single_bucket());
  CHECK(SplitPoints::parse("1").points() == std::vector<int>{1});
  CHECK(SplitPoints::parse("40,100,160").to_string() == "40,100,160");
  for (const char* text : {"85,160", "160", "1,2,3,4,5", "none"}) {
    CAPTURE(text);
    CHECK(SplitPoints::parse(SplitPoints::parse(text).to_string()) == SplitPoints::parse(text));
  }
}

TEST_CASE("none is the single bucket, the same as no split points", "[allreduce]") {
  const SplitPoints one = SplitPoints::parse("none");
  CHECK(one.is_single_bucket());
  CHECK(one == SplitPoints::single_bucket());
  CHECK(one == SplitPoints());
  CHECK(one == SplitPoints::from_points({}));
  CHECK(one.points().empty());
  CHECK(one.bucket_count() == 1);
  CHECK(one.to_string() == "none");
  CHECK(one.ranges(161) == std::vector<BucketRange>{{0, 161}});
  CHECK(one.bucket_of(0) == 0);
  CHECK(one.bucket_of(160) == 0);
  CHECK(SplitPoints::format(std::vector<int>{}) == "none");
}

TEST_CASE("malformed split text is one clear error naming the flag", "[allreduce]") {
  struct Case {
    const char* text;
    const char* why;
  };
  for (const Case& c : {Case{"", "no split points given"}, Case{"85,", "item 2 is empty"},
                        Case{",85", "item 1 is empty"}, Case{"85,,160", "item 2 is empty"},
                        Case{",", "item 1 is empty"}, Case{"abc", "'abc' is not a whole number"},
                        Case{"eighty", "'eighty' is not a whole number"}, Case{"85;160", "'85;160' is not a whole number"},
                        Case{"85, 160", "' 160' is not a whole number"}, Case{"8.5", "'8.5' is not a whole number"},
                        Case{"+85", "'+85' is not a whole number"}, Case{"None", "'None' is not a whole number"},
                        Case{"99999999999", "'99999999999' is too large"},
                        Case{"0", "split point 0 would leave the first bucket empty"},
                        Case{"0,85", "split point 0 would leave the first bucket empty"},
                        Case{"-3", "split point -3 is negative"},
                        Case{"160,85", "split point 85 follows 160 (out of order)"},
                        Case{"85,85", "split point 85 appears twice"},
                        Case{"40,85,85,160", "split point 85 appears twice"}}) {
    CAPTURE(c.text);
    const std::string what = error_of([&] { SplitPoints::parse(c.text); });
    CAPTURE(what);
    CHECK(what.rfind("--allreduce-split '" + std::string(c.text) + "': ", 0) == 0);
    CHECK(what.find(c.why) != std::string::npos);
    CHECK(what.find("expected strictly ascending parameter indices") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  // The flag (or file and key) the caller names.
  const std::string what = error_of([] { SplitPoints::parse("85,", "--tuner-splits"); });
  CHECK(what.rfind("--tuner-splits '85,': item 2 is empty", 0) == 0);
}

TEST_CASE("split points from a list are checked like parsed ones", "[allreduce]") {
  CHECK(SplitPoints::from_points({85, 160}) == SplitPoints::parse("85,160"));
  CHECK(error_of([] { SplitPoints::from_points({160, 85}); }).rfind("--allreduce-split 160,85: split point 85 follows 160", 0) == 0);
  CHECK(error_of([] { SplitPoints::from_points({85, 85}); }).find("85 appears twice") != std::string::npos);
  CHECK(error_of([] { SplitPoints::from_points({0, 85}); }).find("0 would leave the first bucket empty") != std::string::npos);
  CHECK(error_of([] { SplitPoints::from_points({-3}, "split"); }).rfind("split -3: split point -3 is negative", 0) == 0);
  // format writes any list, valid or not, for messages.
  CHECK(SplitPoints::format(std::vector<int>{160, 85}) == "160,85");
}

TEST_CASE("split points are validated against the parameter count", "[allreduce]") {
  const SplitPoints s = SplitPoints::parse("85,160");
  CHECK(s.fits(161));
  CHECK_NOTHROW(s.validate(161));
  CHECK_FALSE(s.fits(160));
  const std::string what = error_of([&] { s.validate(160); });
  CHECK(what == "--allreduce-split 85,160: expected ascending split points in [1, 159] (160 is out of range for the 160 trainable parameters)");
  CHECK(error_of([] { SplitPoints::parse("161").validate(161); })
            .find("--allreduce-split 161: expected ascending split points in [1, 160]") == 0);
  CHECK(error_of([] { SplitPoints::parse("40,400").validate(161, "--tuner-splits"); })
            .rfind("--tuner-splits 40,400: expected ascending split points in [1, 160] (400 is out of range", 0) == 0);
  // One parameter: only the single bucket; no parameters: nothing fits.
  CHECK(SplitPoints::single_bucket().fits(1));
  CHECK(error_of([] { SplitPoints::parse("1").validate(1); }).find("expected none") != std::string::npos);
  CHECK_FALSE(SplitPoints::single_bucket().fits(0));
  CHECK_THROWS_AS(SplitPoints::single_bucket().validate(0), SplitError);
}

TEST_CASE("bucket_of and the ranges of 85,160 over ResNet-50's 161 parameters", "[allreduce]") {
  const SplitPoints s = SplitPoints::parse("85,160");
  CHECK(s.ranges(161) == std::vector<BucketRange>{{0, 85}, {85, 160}, {160, 161}});
  CHECK(s.ranges(161)[2].size() == 1);
  CHECK(s.bucket_of(0) == 0);
  CHECK(s.bucket_of(84) == 0);
  CHECK(s.bucket_of(85) == 1);
  CHECK(s.bucket_of(159) == 1);
  CHECK(s.bucket_of(160) == 2);
  // Every parameter lies in the range of its bucket.
  const auto ranges = s.ranges(161);
  for (int i = 0; i < 161; ++i) {
    const BucketRange& r = ranges[static_cast<std::size_t>(s.bucket_of(i))];
    CHECK((r.first <= i && i < r.end));
  }
  // Every index its own bucket.
  std::vector<int> every;
  for (int i = 1; i < 161; ++i) every.push_back(i);
  const SplitPoints all = SplitPoints::from_points(every);
  CHECK(all.ranges(161).size() == 161);
  CHECK(all.bucket_of(160) == 160);
  CHECK_THROWS_AS(s.ranges(100), SplitError);
}
