// Hand-built runs with memory events, for the memory analysis and the Memory view's logic.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "profiler/analysis/run_data.hpp"

namespace wb::test {

inline constexpr int kActivation = 0, kGradient = 1, kParameter = 2, kMomentum = 3, kWorkspace = 4, kData = 5, kOther = 6;

// A run with names and steps; events are added by the test.
struct MemoryBuilder {
  analysis::RunData run;
  std::map<std::string, std::uint32_t> ids;
  std::int64_t live = 0;
  MemoryBuilder() { run.strings.push_back(""); }
  std::uint32_t id(const std::string& name) {
    auto [it, fresh] = ids.try_emplace(name, static_cast<std::uint32_t>(run.strings.size()));
    if (fresh) run.strings.push_back(name);
    return it->second;
  }
  void step(int step, std::int64_t start, std::int64_t end) {
    store::StepRow s;
    s.step = step;
    s.start_ns = start;
    s.end_ns = end;
    run.steps.push_back(s);
  }
  void event(std::int64_t t, std::int64_t bytes, int role, const std::string& name, int step = 0) {
    live += bytes;
    run.memory.push_back(store::MemoryRow{0, t, step, bytes, live, static_cast<std::uint8_t>(role), id(name)});
  }
};

}  // namespace wb::test
