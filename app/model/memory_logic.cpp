#include "app/model/memory_logic.hpp"

#include <set>
#include <string>

namespace wb::app_model {

std::vector<int> memory_ranks(const analysis::MemoryAnalysis& mem) {
  std::set<int> ranks;
  for (const auto& s : mem.steps) ranks.insert(s.rank);
  return {ranks.begin(), ranks.end()};
}

std::vector<std::size_t> memory_steps_of(const analysis::MemoryAnalysis& mem, int rank) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < mem.steps.size(); ++i)
    if (mem.steps[i].rank == rank) out.push_back(i);
  return out;
}

int peak_step_index(const analysis::MemoryAnalysis& mem, int rank) {
  int best = -1;
  for (std::size_t i : memory_steps_of(mem, rank))
    if (best < 0 || mem.steps[i].peak_bytes > mem.steps[static_cast<std::size_t>(best)].peak_bytes) best = static_cast<int>(i);
  return best;
}

std::vector<analysis::MemoryHolder> top_holders(const analysis::StepMemory& m, std::size_t n) {
  std::vector<analysis::MemoryHolder> out;
  analysis::MemoryHolder rest;
  for (std::size_t i = 0; i < m.holders.size(); ++i) {
    if (i < n) {
      out.push_back(m.holders[i]);
      continue;
    }
    rest.bytes += m.holders[i].bytes;
    for (std::size_t r = 0; r < rest.by_role.size(); ++r) rest.by_role[r] += m.holders[i].by_role[r];
  }
  if (m.holders.size() > n) {
    rest.name = analysis::concat("(", std::to_string(m.holders.size() - n), " others)");
    out.push_back(std::move(rest));
  }
  return out;
}

}  // namespace wb::app_model
