#include "trainer/memory_profile.hpp"

#include "store/writer.hpp"
#include "trainer/model/resnet50.hpp"

namespace wb::trainer {

namespace {
constexpr std::size_t kFlushRows = 4096;
}

const char* MemoryProfile::buffer_name(backend::MemoryRole role) {
  switch (role) {
    case backend::MemoryRole::activation: return "activations";
    case backend::MemoryRole::gradient: return "gradients";
    case backend::MemoryRole::parameter: return "parameters";
    case backend::MemoryRole::momentum: return "momentum";
    case backend::MemoryRole::workspace: return "backend";
    case backend::MemoryRole::data: return "batch";
    case backend::MemoryRole::other: return "other";
  }
  return "other";
}

MemoryProfile::MemoryProfile(profiler::Recorder& recorder, int rank) : recorder_(recorder), rank_(rank) {
  for (const std::string& name : model::ResNet50::module_names()) module_names_.push_back(recorder_.intern(name));
  for (int r = 0; r < backend::kMemoryRoles; ++r)
    buffer_names_[r] = recorder_.intern(buffer_name(static_cast<backend::MemoryRole>(r)));
  rows_.reserve(kFlushRows);
  backend::set_memory_listener(this);
}

MemoryProfile::~MemoryProfile() {
  backend::set_memory_listener(nullptr);
  flush();
}

void MemoryProfile::record(std::int64_t bytes, backend::MemoryTag tag) noexcept {
  const std::int64_t t = profiler::now_ns();
  const std::size_t owner = static_cast<std::size_t>(tag.owner);
  const profiler::NameId name = tag.owner >= 0 && owner < module_names_.size()
                                    ? module_names_[owner]
                                    : buffer_names_[static_cast<std::size_t>(tag.role)];
  std::vector<store::MemoryRow> full;
  {
    std::lock_guard lock(mu_);
    live_ += bytes;
    try {
      rows_.push_back(store::MemoryRow{rank_, t, profiler::current_step(), bytes, live_,
                                       static_cast<std::uint8_t>(tag.role), name});
    } catch (...) {
      recorder_.writer().count_dropped(1);
      return;
    }
    if (rows_.size() < kFlushRows) return;
    full.swap(rows_);
  }
  try {
    hand_over(full);
  } catch (...) {
    recorder_.writer().count_dropped(full.size());
  }
}

void MemoryProfile::hand_over(std::vector<store::MemoryRow>& rows) {
  const profiler::ClockMap map = recorder_.clock();
  for (store::MemoryRow& r : rows) r.t_ns = map.to_rank0(r.t_ns);
  recorder_.writer().add(std::span<const store::MemoryRow>(rows));
}

void MemoryProfile::on_alloc(std::size_t bytes, backend::MemoryTag tag) noexcept {
  record(static_cast<std::int64_t>(bytes), tag);
}

void MemoryProfile::on_free(std::size_t bytes, backend::MemoryTag tag) noexcept {
  record(-static_cast<std::int64_t>(bytes), tag);
}

void MemoryProfile::flush() {
  std::vector<store::MemoryRow> rows;
  {
    std::lock_guard lock(mu_);
    if (rows_.empty()) return;
    rows.swap(rows_);
    rows_.reserve(kFlushRows);
  }
  hand_over(rows);
}

std::int64_t MemoryProfile::live_bytes() const {
  std::lock_guard lock(mu_);
  return live_;
}

}  // namespace wb::trainer
