#include "profiler/analysis/memory.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <unordered_map>

namespace wb::analysis {

namespace {

using Live = std::unordered_map<std::uint32_t, std::array<std::int64_t, store::kMemoryRoles>>;

void apply(Live& live, const store::MemoryRow& e) { live[e.name][e.role] += e.bytes; }

// The rank's step rows in time order.
std::vector<const store::StepRow*> steps_of(const RunData& run, int rank) {
  std::vector<const store::StepRow*> out;
  for (const auto& s : run.steps)
    if (s.rank == rank) out.push_back(&s);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
  return out;
}

// Fills the breakdown of `m` from what is live; memory live before the first event has no holder.
void breakdown(const RunData& run, const Live& live, StepMemory& m) {
  std::int64_t known = 0;
  for (const auto& [name, roles] : live) {
    MemoryHolder h;
    h.name = run.name(name);
    for (int r = 0; r < store::kMemoryRoles; ++r) {
      const std::int64_t b = roles[static_cast<std::size_t>(r)];
      if (b <= 0) continue;
      h.by_role[static_cast<std::size_t>(r)] = b;
      h.bytes += b;
      m.by_role[static_cast<std::size_t>(r)] += b;
    }
    known += h.bytes;
    if (h.bytes > 0) m.holders.push_back(std::move(h));
  }
  if (m.peak_bytes > known) {
    MemoryHolder h;
    h.name = "(before the recording)";
    h.bytes = m.peak_bytes - known;
    h.by_role[store::kMemoryRoles - 1] = h.bytes;
    m.by_role[store::kMemoryRoles - 1] += h.bytes;
    m.holders.push_back(std::move(h));
  }
  std::sort(m.holders.begin(), m.holders.end(), [](const MemoryHolder& a, const MemoryHolder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
}

}  // namespace

MemoryAnalysis analyze_memory(const RunData& run) {
  MemoryAnalysis out;
  out.recorded = !run.memory.empty();
  if (!out.recorded) return out;
  std::map<int, std::vector<const store::MemoryRow*>> by_rank;
  for (const auto& e : run.memory) by_rank[e.rank].push_back(&e);
  for (auto& [rank, events] : by_rank) {
    std::stable_sort(events.begin(), events.end(), [](auto* a, auto* b) { return a->t_ns < b->t_ns; });
    Live live;
    std::size_t i = 0;
    std::int64_t level = 0;
    const store::MemoryRow* last_alloc = nullptr;
    for (const store::StepRow* s : steps_of(run, rank)) {
      for (; i < events.size() && events[i]->t_ns < s->start_ns; ++i) {
        apply(live, *events[i]);
        level = events[i]->live_bytes;
        if (events[i]->bytes > 0) last_alloc = events[i];
      }
      StepMemory m;
      m.rank = rank;
      m.step = s->step;
      m.start_ns = s->start_ns;
      m.end_ns = s->end_ns;
      m.start_bytes = m.peak_bytes = level;
      m.peak_ns = s->start_ns;
      if (last_alloc) {
        m.peak_op = run.name(last_alloc->name);
        m.peak_op_step = last_alloc->step;
        m.peak_role = last_alloc->role;
      }
      // First pass: the peak; the breakdown replays from a copy of the step's starting state.
      Live at_start = live;
      std::size_t peak_end = i;  // events [i, peak_end) lead to the peak
      std::size_t j = i;
      for (; j < events.size() && events[j]->t_ns <= s->end_ns; ++j) {
        const store::MemoryRow& e = *events[j];
        if (e.bytes > 0) {
          m.allocated_bytes += e.bytes;
          ++m.allocations;
          last_alloc = &e;
        } else {
          m.freed_bytes -= e.bytes;
          ++m.frees;
        }
        apply(live, e);
        level = e.live_bytes;
        if (level > m.peak_bytes) {
          m.peak_bytes = level;
          m.peak_ns = e.t_ns;
          m.peak_op = run.name(last_alloc->name);
          m.peak_op_step = last_alloc->step;
          m.peak_role = last_alloc->role;
          peak_end = j + 1;
        }
      }
      for (std::size_t k = i; k < peak_end; ++k) apply(at_start, *events[k]);
      breakdown(run, at_start, m);
      i = j;
      out.steps.push_back(std::move(m));
    }
  }
  for (std::size_t k = 0; k < out.steps.size(); ++k)
    if (out.peak_index < 0 || out.steps[k].peak_bytes > out.steps[static_cast<std::size_t>(out.peak_index)].peak_bytes)
      out.peak_index = static_cast<int>(k);
  return out;
}

std::vector<std::pair<std::int64_t, std::int64_t>> memory_curve(const RunData& run, int rank, int step) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const store::StepRow* s = nullptr;
  for (const auto& row : run.steps)
    if (row.rank == rank && row.step == step) s = &row;
  if (!s) return out;
  std::int64_t level = 0;
  for (const auto& e : run.memory) {
    if (e.rank != rank) continue;
    if (e.t_ns < s->start_ns) {
      level = e.live_bytes;
      continue;
    }
    if (e.t_ns > s->end_ns) break;
    if (out.empty()) out.emplace_back(s->start_ns, level);
    out.emplace_back(e.t_ns, e.live_bytes);
  }
  if (out.empty()) out.emplace_back(s->start_ns, level);
  out.emplace_back(s->end_ns, out.back().second);
  return out;
}

std::string format_bytes(double bytes) {
  char buf[32];
  const double a = bytes < 0 ? -bytes : bytes;
  if (a >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else if (a >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024));
  else if (a >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

void write_memory_section(const RunData& run, std::ostream& out, std::size_t top_holders) {
  const MemoryAnalysis mem = analyze_memory(run);
  if (!mem.recorded || mem.steps.empty()) return;
  out << "\nMemory (backend allocations, held at each step's peak)\n";
  std::map<int, const StepMemory*> worst;
  for (const StepMemory& m : mem.steps)
    if (!worst.count(m.rank) || m.peak_bytes > worst[m.rank]->peak_bytes) worst[m.rank] = &m;
  for (const auto& [rank, m] : worst) {
    std::int64_t lo = m->peak_bytes, hi = 0;
    for (const StepMemory& s : mem.steps)
      if (s.rank == rank) {
        lo = std::min(lo, s.peak_bytes);
        hi = std::max(hi, s.peak_bytes);
      }
    out << "  rank " << rank << ": peak " << format_bytes(static_cast<double>(m->peak_bytes)) << " ("
        << m->peak_bytes << " B) in step " << m->step << " at " << (m->peak_op.empty() ? "?" : m->peak_op) << " ("
        << store::memory_role_name(m->peak_role) << ")";
    if (m->peak_op_step != m->step)
      out << " (allocated " << (m->peak_op_step < 0 ? std::string("before training") : concat("in step ", std::to_string(m->peak_op_step)))
          << "; the step allocated nothing above what it started with)";
    out << "\n    per step: peak " << format_bytes(static_cast<double>(lo)) << " .. " << format_bytes(static_cast<double>(hi))
        << "; at the peak by role:";
    for (int r = 0; r < store::kMemoryRoles; ++r) {
      const std::int64_t b = m->by_role[static_cast<std::size_t>(r)];
      if (b > 0)
        out << " " << store::memory_role_name(r) << " " << format_bytes(static_cast<double>(b)) << " ("
            << static_cast<int>(100.0 * static_cast<double>(b) / static_cast<double>(std::max<std::int64_t>(1, m->peak_bytes)) + 0.5)
            << "%)";
    }
    out << "\n    top holders at the peak:\n";
    for (std::size_t k = 0; k < m->holders.size() && k < top_holders; ++k) {
      const MemoryHolder& h = m->holders[k];
      int main_role = 0;
      for (int r = 1; r < store::kMemoryRoles; ++r)
        if (h.by_role[static_cast<std::size_t>(r)] > h.by_role[static_cast<std::size_t>(main_role)]) main_role = r;
      char line[160];
      std::snprintf(line, sizeof line, "      %-24s %12s  %5.1f%%  %s\n", h.name.c_str(),
                    format_bytes(static_cast<double>(h.bytes)).c_str(),
                    100.0 * static_cast<double>(h.bytes) / static_cast<double>(std::max<std::int64_t>(1, m->peak_bytes)),
                    std::string(store::memory_role_name(main_role)).c_str());
      out << line;
    }
    if (m->holders.size() > top_holders) out << "      ... " << (m->holders.size() - top_holders) << " more\n";
  }
}

}  // namespace wb::analysis
