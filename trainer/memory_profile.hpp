// wb-train's memory profile: the backend's MemoryListener (trainer/backend/memory.hpp) that turns every
// allocation and free of tensor storage into a row of the run file's memory table, with the rank's
// live bytes after it, the step, the role and the module (or model-level buffer) that made it.
//
// Rows collect in a buffer under a short lock and reach the Writer at each step's end (flush()) or when
// the buffer fills, so an allocation costs a lock and an append. The CPU backend allocates nothing after
// the first step, so a steady CPU step records no row at all.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "store/rows.hpp"
#include "trainer/backend/memory.hpp"

namespace wb::trainer {

class MemoryProfile final : public backend::MemoryListener {
 public:
  // Installs itself as the process's listener; the destructor flushes and removes it. The recorder
  // gives the clock (rank 0's) and the Writer; module ids name ResNet50::module_names().
  MemoryProfile(profiler::Recorder& recorder, int rank);
  ~MemoryProfile() override;
  MemoryProfile(const MemoryProfile&) = delete;
  MemoryProfile& operator=(const MemoryProfile&) = delete;

  void on_alloc(std::size_t bytes, backend::MemoryTag tag) noexcept override;
  void on_free(std::size_t bytes, backend::MemoryTag tag) noexcept override;

  // Hands the buffered rows to the Writer.
  void flush();
  std::int64_t live_bytes() const;

  // The name of a model-level buffer (owner -1) by role: "parameters" (parameters and running
  // statistics), "gradients", "momentum", "batch", "backend" (workspace), "activations", "other".
  static const char* buffer_name(backend::MemoryRole role);

 private:
  void record(std::int64_t bytes, backend::MemoryTag tag) noexcept;
  // Maps the rows' times to rank 0's clock and gives them to the Writer.
  void hand_over(std::vector<store::MemoryRow>& rows);

  profiler::Recorder& recorder_;
  int rank_;
  std::vector<profiler::NameId> module_names_;
  profiler::NameId buffer_names_[backend::kMemoryRoles] = {};
  mutable std::mutex mu_;
  std::int64_t live_ = 0;
  std::vector<store::MemoryRow> rows_;
};

}  // namespace wb::trainer
