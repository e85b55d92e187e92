// The Catch2 main of every test executable. GPU test cases carry the tag [cuda], and CTest runs them
// apart from the others (tests/CMakeLists.txt: <test> "~[cuda]" and <test>-cuda "[cuda]"). Where there
// is no CUDA device (or no CUDA in the build):
//   - a run that selects only [cuda] test cases exits with kSkipExitCode (77), which CTest reports as
//     skipped, not passed;
//   - a run that selects [cuda] cases and others leaves the [cuda] ones out, says so, and runs the rest
//     (CTest runs [cuda] and ~[cuda] apart; this is for a plain run of a test executable).
// A run that selects no test case at all (none compiled into this build, or a filter that matches
// nothing) also exits 77: nothing was tested.
// The reverse holds for cases tagged [no-cuda], which check what happens without a device (an error, a
// fallback): where a device is present they are left out the same way, and a run of nothing else exits 77.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

#include "support/gpu.hpp"

namespace {

bool has_tag(const Catch::TestCase& t, const char* tag) {
  return std::find(t.lcaseTags.begin(), t.lcaseTags.end(), tag) != t.lcaseTags.end();
}

// `name` as a test spec that matches it: Catch reads , [ ] " \ and a leading ~ as syntax unless escaped.
std::string spec_escaped(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == ',' || c == '[' || c == ']' || c == '"' || c == '\\' || (i == 0 && c == '~')) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& data = session.configData();
  if (data.showHelp || data.libIdentify || data.listTests || data.listTestNamesOnly || data.listTags ||
      data.listReporters) {
    return session.run();
  }

  const Catch::Config& config = session.config();
  const std::vector<Catch::TestCase> selected =
      Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
  // The cases this machine cannot run: [cuda] without a device, [no-cuda] with one.
  const std::string why_not = wb::test::why_no_gpu();
  const char* tag = why_not.empty() ? "no-cuda" : "cuda";
  const std::string why = why_not.empty() ? "a CUDA device is present" : why_not;
  auto excluded = [&](const Catch::TestCase& t) { return has_tag(t, tag); };
  const auto left_out = static_cast<std::size_t>(std::count_if(selected.begin(), selected.end(), excluded));
  if (selected.empty()) {
    std::printf("%s: no test case selected (none in this build, or the filter matches none): skipped\n",
                program_invocation_short_name);
    return wb::test::kSkipExitCode;
  }
  if (left_out > 0) {
    if (left_out == selected.size()) {
      std::printf("%s: %s: the %zu [%s] test case(s) are skipped\n", program_invocation_short_name, why.c_str(),
                  left_out, tag);
      return wb::test::kSkipExitCode;
    }
    std::printf("%s: %s: the %zu [%s] test case(s) are left out\n", program_invocation_short_name, why.c_str(),
                left_out, tag);
    // The selection again, as the names of its other cases (escaped for Catch's test spec parser).
    Catch::ConfigData narrowed_data = data;
    std::string names;
    for (const Catch::TestCase& t : selected) {
      if (excluded(t)) continue;
      if (!names.empty()) names += ',';
      names += spec_escaped(t.name);
    }
    narrowed_data.testsOrTags = {names};
    session.useConfigData(narrowed_data);
    const Catch::Config& narrowed = session.config();
    const auto left = Catch::filterTests(Catch::getAllTestCasesSorted(narrowed), narrowed.testSpec(), narrowed);
    if (left.size() != selected.size() - left_out || std::any_of(left.begin(), left.end(), excluded)) {
      std::printf("%s: cannot select the test cases other than [%s] by name: add ~[%s] to the filter\n",
                  program_invocation_short_name, tag, tag);
      return 1;
    }
  }
  // Catch's exit code is the number of failed assertions: 77 of them must not read as skipped.
  const int rc = session.run();
  return rc == wb::test::kSkipExitCode ? rc + 1 : rc;
}
