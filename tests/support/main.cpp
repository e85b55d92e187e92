// The Catch2 main of every test executable. GPU test cases carry the tag [cuda], and CTest runs them
// apart from the others (tests/CMakeLists.txt: <test> "~[cuda]" and <test>-cuda "[cuda]"). Where there
// is no CUDA device (or no CUDA in the build):
//   - a run that selects only [cuda] test cases exits with kSkipExitCode (77), which CTest reports as
//     skipped, not passed;
//   - a run that selects [cuda] cases and others leaves the [cuda] ones out, says so, and runs the rest
//     (CTest runs [cuda] and ~[cuda] apart; this is for a plain run of a test executable).
// A run that selects no test case at all (none compiled into this build, or a filter that matches
// nothing) also exits 77: nothing was tested.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

#include "support/gpu.hpp"

namespace {

bool is_gpu_case(const Catch::TestCase& t) {
  return std::find(t.lcaseTags.begin(), t.lcaseTags.end(), "cuda") != t.lcaseTags.end();
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
  const auto gpu = static_cast<std::size_t>(std::count_if(selected.begin(), selected.end(), is_gpu_case));
  if (selected.empty()) {
    std::printf("%s: no test case selected (none in this build, or the filter matches none): skipped\n",
                program_invocation_short_name);
    return wb::test::kSkipExitCode;
  }
  if (gpu > 0) {
    const std::string why = wb::test::why_no_gpu();
    if (!why.empty()) {
      if (gpu == selected.size()) {
        std::printf("%s: %s: the %zu [cuda] test case(s) are skipped\n", program_invocation_short_name, why.c_str(),
                    gpu);
        return wb::test::kSkipExitCode;
      }
      std::printf("%s: %s: the %zu [cuda] test case(s) are left out\n", program_invocation_short_name, why.c_str(),
                  gpu);
      // The selection again, as the names of its other cases (escaped for Catch's test spec parser).
      Catch::ConfigData without_gpu = data;
      std::string names;
      for (const Catch::TestCase& t : selected) {
        if (is_gpu_case(t)) continue;
        if (!names.empty()) names += ',';
        names += spec_escaped(t.name);
      }
      without_gpu.testsOrTags = {names};
      session.useConfigData(without_gpu);
      const Catch::Config& narrowed = session.config();
      const auto left = Catch::filterTests(Catch::getAllTestCasesSorted(narrowed), narrowed.testSpec(), narrowed);
      if (left.size() != selected.size() - gpu || std::any_of(left.begin(), left.end(), is_gpu_case)) {
        std::printf("%s: cannot select the test cases other than [cuda] by name: add ~[cuda] to the filter\n",
                    program_invocation_short_name);
        return 1;
      }
    }
  }
  // Catch's exit code is the number of failed assertions: 77 of them must not read as skipped.
  const int rc = session.run();
  return rc == wb::test::kSkipExitCode ? rc + 1 : rc;
}
