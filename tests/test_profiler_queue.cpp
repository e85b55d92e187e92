// Queue-depth counters: the samples of a scripted producer/consumer reconstruct the true depth sequence.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;

TEST_CASE("queue samples reconstruct the true depth sequence of a producer/consumer", "[profiler]") {
  const wb::test::TempDir dir;
  fs::path file = dir / "run.sqlite";

  struct Truth {
    std::int64_t t;
    int depth;
  };
  std::vector<Truth> truth;  // appended under the queue lock, like the trainer's batch queue
  const int kProducers = 3;
  const int kPerProducer = 400;
  const std::size_t kCapacity = 4;
  {
    store::WriterOptions wo;
    wo.path = file;
    wo.handle_signals = false;
    store::Writer writer(wo);
    profiler::RecorderOptions ro;
    ro.chunk_records = 128;
    profiler::Recorder rec(writer, ro);
    profiler::CounterTrack track = rec.add_counter_track("batch queue");

    std::mutex m;
    std::condition_variable not_full, not_empty;
    std::deque<int> queue;
    auto stamp = [&](int depth) {
      // Strictly increasing timestamps under the lock, as the data pipeline's observer guarantees.
      std::int64_t t = profiler::now_ns();
      if (!truth.empty() && t <= truth.back().t) t = truth.back().t + 1;
      truth.push_back({t, depth});
      return t;
    };

    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
      producers.emplace_back([&, p] {
        profiler::set_thread_name("data-worker-" + std::to_string(p));
        for (int i = 0; i < kPerProducer; ++i) {
          std::unique_lock lk(m);
          not_full.wait(lk, [&] { return queue.size() < kCapacity; });
          queue.push_back(i);
          std::int64_t t = stamp(static_cast<int>(queue.size()));
          profiler::counter(track, static_cast<double>(queue.size()), t);
          lk.unlock();
          not_empty.notify_one();
          if (i % 7 == p) std::this_thread::yield();
        }
      });
    }
    std::thread consumer([&] {
      profiler::set_thread_name("main");
      for (int i = 0; i < kProducers * kPerProducer; ++i) {
        std::unique_lock lk(m);
        not_empty.wait(lk, [&] { return !queue.empty(); });
        queue.pop_front();
        std::int64_t t = stamp(static_cast<int>(queue.size()));
        profiler::counter(track, static_cast<double>(queue.size()), t);
        lk.unlock();
        not_full.notify_one();
      }
    });
    for (auto& th : producers) th.join();
    consumer.join();
    rec.stop();
    CHECK(writer.finish());
  }

  store::Reader reader(file);
  std::uint32_t track = 0;
  for (const auto& t : reader.tracks())
    if (reader.string_at(t.name) == "batch queue") track = t.id;
  REQUIRE(track != 0);
  auto samples = reader.counters(track);
  REQUIRE(samples.size() == truth.size());
  REQUIRE(truth.size() == 2u * kProducers * kPerProducer);
  int max_depth = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    CAPTURE(i);
    REQUIRE(samples[i].t_ns == truth[i].t);
    REQUIRE(samples[i].value == static_cast<double>(truth[i].depth));
    max_depth = std::max(max_depth, truth[i].depth);
    // Each sample differs from the previous by one push or one pop.
    if (i > 0) CHECK(std::abs(truth[i].depth - truth[i - 1].depth) == 1);
  }
  CHECK(max_depth <= static_cast<int>(kCapacity));
  CHECK(truth.back().depth == 0);
}
