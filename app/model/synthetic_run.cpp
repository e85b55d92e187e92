#include "app/model/synthetic_run.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/merge.hpp"
#include "store/writer.hpp"

namespace wb::app_model {

namespace {

std::int64_t write_rank(const std::filesystem::path& file, int rank, const SyntheticRun& spec) {
  store::WriterOptions o;
  o.path = file;
  o.rank = rank;
  o.handle_signals = false;
  o.overwrite = true;
  store::Writer w(o);
  w.set_meta("world_size", std::to_string(spec.ranks));
  w.set_meta("device", "cpu");
  nlohmann::json config = {{"batch_size", 32}, {"data_workers", 1}, {"prefetch", spec.prefetch}, {"steps", spec.steps},
                           {"data", "synthetic"}, {"lr", 0.1}, {"allreduce_split", std::vector<int>{spec.params / 2}}};
  w.set_meta("config_json", config.dump());
  store::RankRow rr;
  rr.rank = rank;
  rr.host = "synthetic";
  rr.device = "cpu";
  rr.pid = 1000 + rank;
  w.set_rank(rr);
  const std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
  const std::uint32_t worker = w.add_track(store::TrackKind::thread, "data-worker-0");
  const std::uint32_t queue = w.add_track(store::TrackKind::queue, "batch queue");
  const std::uint32_t n_step = w.intern("step"), n_wait = w.intern("data_wait"), n_opt = w.intern("optimizer"), n_batch = w.intern("batch"),
                      n_decode = w.intern("decode");
  std::vector<std::uint32_t> layers, ops;
  for (int l = 0; l < 16; ++l) {
    layers.push_back(w.intern("layer" + std::to_string(l)));
    ops.push_back(w.intern("layer" + std::to_string(l) + ".conv"));
    ops.push_back(w.intern("layer" + std::to_string(l) + ".bn"));
    ops.push_back(w.intern("layer" + std::to_string(l) + ".relu"));
  }
  if (rank == 0)
    for (int p = 0; p < spec.params; ++p)
      w.add(store::ParamRow{p, "layer" + std::to_string(p % 16) + ".conv.weight" + std::to_string(p), {64, 64}, 4096, p >= spec.params / 2 ? 1 : 0, true});

  // Each step: data wait, forward and backward over 16 layers with `ops_per_layer` ops each, optimizer.
  const std::int64_t per_step = std::max<std::int64_t>(spec.ranges_per_rank / spec.steps, 40);
  const std::int64_t ops_per_layer = std::max<std::int64_t>((per_step - 4 - 32) / 32, 1);
  const std::int64_t op_ns = 2000 + 100 * rank;  // rank r is a little slower: a straggler to see
  std::int64_t t = 1'000'000 + rank * 1000;
  std::int64_t written = 0;
  std::vector<store::RangeRow> batch;
  auto flush = [&] {
    w.add(batch);
    written += static_cast<std::int64_t>(batch.size());
    batch.clear();
    w.flush();  // keeps the writer's queue short: it drops rows past its bound
  };
  double depth = spec.prefetch;
  for (int s = 0; s < spec.steps; ++s) {
    const std::int64_t step_start = t;
    const std::int64_t wait = s == 0 ? 50'000 : 5'000;
    batch.push_back({main, n_wait, t, t + wait, 4, 1, s, 0});
    w.add(store::CounterRow{queue, t + wait, depth = std::max(0.0, depth - 1)});
    t += wait;
    for (int pass = 0; pass < 2; ++pass) {
      const std::uint8_t cat = pass == 0 ? 0 : 1;
      for (int l = 0; l < 16; ++l) {
        int layer = pass == 0 ? l : 15 - l;
        std::int64_t ls = t;
        for (std::int64_t k = 0; k < ops_per_layer; ++k) {
          std::uint32_t name = ops[static_cast<std::size_t>(layer * 3 + static_cast<int>(k % 3))];
          std::int64_t d = op_ns + (k * 37 % 11) * 100;
          batch.push_back({main, name, t, t + d, cat, 2, s, 0});
          t += d + 100;
          if (batch.size() >= 65536) flush();
        }
        batch.push_back({main, layers[static_cast<std::size_t>(layer)], ls, t, cat, 1, s, 0});
      }
    }
    const std::int64_t bwd_end = t;
    batch.push_back({main, n_opt, t, t + 20'000, 2, 1, s, 0});
    t += 20'000;
    batch.push_back({main, n_step, step_start, t, 7, 0, s, 0});
    // Two buckets: the second half of the parameters is ready first.
    const std::int64_t bytes0 = 4096LL * 4 * (spec.params / 2), bytes1 = 4096LL * 4 * (spec.params - spec.params / 2);
    const std::int64_t mid = step_start + wait + (bwd_end - step_start - wait) * 3 / 4;
    w.add(store::AllreduceRow{rank, s, 1, spec.params / 2, spec.params - 1, bytes1, mid, mid + 1000, mid + 30'000});
    w.add(store::AllreduceRow{rank, s, 0, 0, spec.params / 2 - 1, bytes0, bwd_end, bwd_end + 500, bwd_end + 40'000});
    w.add(store::StepRow{rank, s, step_start, t, wait, 20'000, 2.3 - 0.1 * s, 0.1, 32});
    // The worker refills the queue during the step.
    batch.push_back({worker, n_batch, step_start + wait, step_start + wait + 30'000, 4, 0, s, 0});
    batch.push_back({worker, n_decode, step_start + wait + 1000, step_start + wait + 20'000, 4, 1, s, 0});
    w.add(store::CounterRow{queue, step_start + wait + 30'000, depth = std::min<double>(spec.prefetch, depth + 1)});
    t += 10'000;
  }
  flush();
  w.finish();
  return written;
}

}  // namespace

std::int64_t write_synthetic_run(const std::filesystem::path& out, const SyntheticRun& spec) {
  std::filesystem::path dir = out;
  dir += ".parts";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  std::int64_t total = 0;
  for (int r = 0; r < spec.ranks; ++r) total += write_rank(dir / ("rank-" + std::to_string(r) + ".sqlite"), r, spec);
  std::filesystem::remove(out, ec);
  store::merge_run(dir, out, true);
  std::filesystem::remove_all(dir, ec);
  return total;
}

}  // namespace wb::app_model
