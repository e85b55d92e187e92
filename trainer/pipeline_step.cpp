// PipelineStep (pipeline_step.hpp): one training step of a pipeline stage. The stage's activations and
// gradients travel between ranks as messages; the schedule (gpipe or 1f1b) orders each micro-batch's
// forward and backward; the stage's gradients are averaged over its replicas; step dumps are gathered
// on rank 0. The semantics are written out below, above the stage's implementation.
#include "trainer/pipeline_step.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "layout/resnet50.hpp"
#include "profiler/record/clock.hpp"
#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"
#include "trainer/backend/memory.hpp"
#include "trainer/dump/dump.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/pipeline_schedule.hpp"

namespace wb::trainer {
namespace {

using backend::Shape;
using backend::Tensor;
using model::ResNet50;

// Message tags: activations and gradients of micro-batch m, the step's loss, the dump's gathers.
int tag_act(int m) { return 2 * m; }
int tag_grad(int m) { return 2 * m + 1; }
constexpr int kTagLoss = 1 << 20;
constexpr int kTagGather = (1 << 20) + 1;

}  // namespace

namespace {

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<std::int64_t> unit_output_shape(int unit, std::int64_t n, std::int64_t image_size) {
  if (unit >= ResNet50::kUnits - 1) throw std::logic_error("unit_output_shape: the tail's output is the loss");
  return layout::unit_output_shape(unit, n, image_size);
}

// ---- the stage ------------------------------------------------------------------------------------

struct PipelineStep::Impl {
  const TrainConfig& cfg;
  PipelinePlan plan;
  StageSeat seat;
  int rank;
  model::ResNet50& model;
  backend::Backend& be;
  model::ModelObserver* inner;
  PipelineRecording rec;
  std::unique_ptr<parallel::PipelineComm> comm;  // null for one stage
  std::unique_ptr<parallel::GradientSync> sync;  // null for one replica
  std::vector<PipelineWork> work;

  int u0 = 0, u1 = 0;      // this stage's units
  int p0 = 0, p1 = 0;      // its parameters
  std::size_t off0 = 0, off1 = 0;  // their floats in the parameter buffer
  std::vector<backend::ParamSegment> segments;
  bool first = false, last = false;
  int slots = 1;
  std::int64_t mb = 0;     // images per micro-batch
  std::vector<std::int64_t> in_shape, out_shape;  // of the activations received / sent
  std::size_t in_count = 0, out_count = 0;

  std::vector<Tensor> images, labels, act_in;  // per slot
  Tensor dy;                                    // the received gradient of the stage output
  std::vector<float> host_images;
  std::vector<std::int32_t> host_labels;
  // Message buffers per micro-batch: plain backend tensors (host memory on the CPU, device on a GPU).
  std::vector<Tensor> recv_act, recv_grad, send_act, send_grad;
  struct Posted {
    std::unique_ptr<parallel::Transfer> t;  // null until posted
    std::size_t span = 0;                   // index into spans
  };
  std::vector<Posted> recv_act_p, recv_grad_p;  // per micro-batch
  struct Sent {
    std::unique_ptr<parallel::Transfer> t;
    std::size_t span;  // index into spans
    bool done = false;
  };
  std::vector<Sent> sends;
  std::vector<std::vector<StageMessage>> points;  // message_points(plan, stage)
  std::vector<float> losses;

  // Step dumps: replica 0's stages keep every output of the dumped step's forwards, the micro-batches'
  // concatenated in order, and rank 0 writes them all (after_dump).
  bool capturing = false;
  struct Captured {
    std::string name;
    std::vector<std::int64_t> shape;  // of the whole mini-batch so far
    std::vector<float> data;
  };
  std::vector<Captured> captured;
  std::size_t capture_at = 0;  // the next output's entry in the current micro-batch's forward

  // Gradient accumulation over the micro-batches.
  int backwards_run = 0;
  float grad_scale = 1.0f;

  std::int32_t step = 0;
  std::vector<store::PipelineSpanRow> spans;
  store::PipelineStepRow summary;

  Impl(const TrainConfig& c, const PipelinePlan& p, int r, model::ResNet50& m, model::ModelObserver* in,
       PipelineRecording re)
      : cfg(c), plan(p), seat(seat_of(p, r)), rank(r), model(m), be(m.compute_backend()), inner(in), rec(re) {}

  std::int64_t to_rank0(std::int64_t t) const { return t + rec.clock_offset_ns; }

  std::size_t add_span(const char* kind, int micro, int peer, std::int64_t bytes, std::int64_t post, std::int64_t start,
                       std::int64_t end) {
    store::PipelineSpanRow r;
    r.rank = rank;
    r.step = step;
    r.stage = seat.stage;
    r.micro = micro;
    r.kind = kind;
    r.peer = peer;
    r.bytes = bytes;
    r.post_ns = post;
    r.start_ns = start;
    r.end_ns = end;
    spans.push_back(std::move(r));
    return spans.size() - 1;
  }

  // Sends that have completed get their end time; cheap, called between operations.
  void poll_sends() {
    for (Sent& s : sends) {
      if (!s.done && s.t->test()) {
        s.done = true;
        spans[s.span].end_ns = profiler::now_ns();
      }
    }
  }

  parallel::Message recv_act_msg(int m) {
    return {false, recv_act[static_cast<std::size_t>(m)].data_as<float>(), in_count, seat.prev_rank, tag_act(m)};
  }
  parallel::Message recv_grad_msg(int m) {
    return {false, recv_grad[static_cast<std::size_t>(m)].data_as<float>(), out_count, seat.next_rank, tag_grad(m)};
  }

  // Posts the messages of point `k` of the step as one group (a receive already posted is left out).
  void post(std::size_t k) {
    if (!comm) return;
    std::vector<parallel::Message> msgs;
    struct Record {
      Posted* recv;  // null: a send
      const char* kind;
      int micro;
    };
    std::vector<Record> records;
    for (const StageMessage& sm : points[k]) {
      const auto i = static_cast<std::size_t>(sm.micro);
      const int peer = seat.replica * plan.stages + sm.peer_stage;
      if (sm.send) {
        Tensor& buf = sm.activation ? send_act[i] : send_grad[i];
        msgs.push_back({true, buf.data_as<float>(), sm.activation ? out_count : in_count, peer,
                        sm.activation ? tag_act(sm.micro) : tag_grad(sm.micro)});
        records.push_back({nullptr, sm.activation ? "send_act" : "send_grad", sm.micro});
      } else {
        Posted& r = sm.activation ? recv_act_p[i] : recv_grad_p[i];
        if (r.t) continue;  // posted at the step's start
        msgs.push_back(sm.activation ? recv_act_msg(sm.micro) : recv_grad_msg(sm.micro));
        records.push_back({&r, sm.activation ? "recv_act" : "recv_grad", sm.micro});
      }
    }
    if (msgs.empty()) return;
    const std::int64_t t = profiler::now_ns();
    auto transfers = comm->post(msgs);
    for (std::size_t j = 0; j < msgs.size(); ++j) {
      const auto bytes = static_cast<std::int64_t>(msgs[j].count * sizeof(float));
      const std::size_t span = add_span(records[j].kind, records[j].micro, msgs[j].peer, bytes, t, t, t);
      if (records[j].recv) {
        records[j].recv->t = std::move(transfers[j]);
        records[j].recv->span = span;
      } else {
        sends.push_back({std::move(transfers[j]), span});
      }
    }
  }

  // Waits for a posted receive, recording the wait; returns the time waited.
  std::int64_t wait_recv(parallel::Transfer& t, std::size_t span) {
    const std::int64_t t0 = profiler::now_ns();
    t.wait();
    const std::int64_t t1 = profiler::now_ns();
    spans[span].start_ns = t0;
    spans[span].end_ns = t1;
    return t1 - t0;
  }

  void forward(int m) {
    const auto i = static_cast<std::size_t>(m);
    const int k = m % slots;
    const auto ks = static_cast<std::size_t>(k);
    model.use_slot(k);
    const std::size_t img = static_cast<std::size_t>(mb) * 3 * static_cast<std::size_t>(cfg.image_size * cfg.image_size);
    if (first) {
      be.from_host(images[ks], std::span<const float>(host_images.data() + i * img, img));
    } else {
      summary.wait_act_ns += wait_recv(*recv_act_p[i].t, recv_act_p[i].span);
      be.copy(recv_act[i], act_in[ks]);
    }
    if (last) {
      be.from_host(labels[ks], std::span<const std::int32_t>(host_labels.data() + i * static_cast<std::size_t>(mb),
                                                             static_cast<std::size_t>(mb)));
    }
    const std::int64_t t0 = profiler::now_ns();
    capture_at = 0;
    const float loss = model.forward_units(u0, u1, first ? images[ks] : act_in[ks], labels[ks]);
    if (last) {
      losses[i] = loss;
    } else {
      be.copy(model.units_output(), send_act[i]);
    }
    be.synchronize();  // a GPU's queue: the span is the device's time (a no-op on the CPU)
    const std::int64_t t1 = profiler::now_ns();
    add_span("forward", m, -1, 0, t0, t0, t1);
    summary.busy_ns += t1 - t0;
  }

  void backward(int m) {
    const auto i = static_cast<std::size_t>(m);
    model.use_slot(m % slots);
    if (!last) {
      summary.wait_grad_ns += wait_recv(*recv_grad_p[i].t, recv_grad_p[i].span);
      be.copy(recv_grad[i], dy);
    }
    const std::int64_t t0 = profiler::now_ns();
    const Tensor& dx = model.backward_units(dy);
    ++backwards_run;
    if (!first) be.copy(dx, send_grad[i]);
    be.synchronize();
    const std::int64_t t1 = profiler::now_ns();
    add_span("backward", m, -1, 0, t0, t0, t1);
    summary.busy_ns += t1 - t0;
  }

  // MPI: every receive of the step is posted at its start, so messages land while the stage computes.
  void post_receives() {
    if (!comm->early_receives()) return;
    for (int m = 0; m < plan.micro_batches; ++m) {
      const auto i = static_cast<std::size_t>(m);
      std::vector<parallel::Message> msgs;
      if (!first) msgs.push_back(recv_act_msg(m));
      if (!last) msgs.push_back(recv_grad_msg(m));
      const std::int64_t t = profiler::now_ns();
      auto transfers = comm->post(msgs);
      for (std::size_t j = 0; j < msgs.size(); ++j) {
        const bool act = !first && j == 0;
        Posted& r = act ? recv_act_p[i] : recv_grad_p[i];
        r.t = std::move(transfers[j]);
        r.span = add_span(act ? "recv_act" : "recv_grad", m, msgs[j].peer,
                          static_cast<std::int64_t>(msgs[j].count * sizeof(float)), t, t, t);
      }
    }
  }

  int last_rank() const { return seat.replica * plan.stages + plan.stages - 1; }

  void record() {
    if (!rec.writer) return;
    for (auto& s : spans) {
      s.post_ns = to_rank0(s.post_ns);
      s.start_ns = to_rank0(s.start_ns);
      s.end_ns = to_rank0(s.end_ns);
    }
    rec.writer->add(std::span<const store::PipelineSpanRow>(spans));
    store::PipelineStepRow row = summary;
    row.start_ns = to_rank0(row.start_ns);
    row.end_ns = to_rank0(row.end_ns);
    rec.writer->add(row);
  }

  // The ranges [offset, offset + count) of stage s (replica 0) in the parameter/gradient/momentum
  // buffers, the running statistics and the batch counters.
  struct Extent {
    std::size_t p0, p1, s0, s1, c0, c1;
  };
  Extent extent_of(int s) const {
    const int a = plan.first_unit[static_cast<std::size_t>(s)], b = plan.first_unit[static_cast<std::size_t>(s) + 1];
    const auto [q0, q1] = model.unit_params(a, b);
    const auto& ps = model.params();
    const std::size_t f0 = ps[static_cast<std::size_t>(q0)].offset;
    const std::size_t f1 = q1 >= static_cast<int>(ps.size()) ? model.param_count() : ps[static_cast<std::size_t>(q1)].offset;
    const auto [s0, s1] = model.unit_stats(a, b);
    const auto [c0, c1] = model.unit_batch_counters(a, b);
    return {f0, f1, s0, s1, c0, c1};
  }

  // Floats [a, b) of `t` (a plain buffer) appended to `v` / read from `v` at `at`, wherever t lives.
  void append(std::vector<float>& v, const Tensor& t, std::size_t a, std::size_t b) {
    if (b <= a) return;
    const std::size_t at = v.size();
    v.insert(v.end(), b - a, 0.0f);
    be.to_host(be.view(t, a, Shape{static_cast<std::int64_t>(b - a)}), std::span<float>(v.data() + at, b - a));
  }
  void take(const std::vector<float>& v, std::size_t& at, const Tensor& t, std::size_t a, std::size_t b) {
    if (b > a) {
      be.from_host(be.view(t, a, Shape{static_cast<std::int64_t>(b - a)}), std::span<const float>(v.data() + at, b - a));
    }
    at += b - a;
  }

  // Replica 0's stages send their part of the state to rank 0, which writes it into its own
  // buffers (whose other stages' parts it never uses otherwise).
  void gather(bool after) {
    if (!comm || seat.replica != 0) return;
    auto pack = [&](const Extent& e) {
      std::vector<float> v;
      append(v, model.param_buffer(), e.p0, e.p1);
      append(v, model.running_stats(), e.s0, e.s1);
      auto counts = model.num_batches_tracked();
      for (std::size_t i = e.c0; i < e.c1; ++i) v.push_back(static_cast<float>(counts[i]));
      if (after) {
        append(v, model.grad_buffer(), e.p0, e.p1);
        append(v, model.momentum_buffer(), e.p0, e.p1);
      }
      return v;
    };
    if (rank != 0) {
      std::vector<float> v = pack(extent_of(seat.stage));
      comm->send_host(v.data(), v.size(), 0, kTagGather);
      return;
    }
    for (int s = 1; s < plan.stages; ++s) {
      const Extent e = extent_of(s);
      const std::size_t n = (e.p1 - e.p0) * (after ? 3 : 1) + (e.s1 - e.s0) + (e.c1 - e.c0);
      std::vector<float> v(n);
      comm->recv_host(v.data(), v.size(), s, kTagGather);
      std::size_t at = 0;
      take(v, at, model.param_buffer(), e.p0, e.p1);
      take(v, at, model.running_stats(), e.s0, e.s1);
      auto counts = model.num_batches_tracked();
      for (std::size_t i = e.c0; i < e.c1; ++i) counts[i] = static_cast<std::int64_t>(v[at++]);
      if (after) {
        take(v, at, model.grad_buffer(), e.p0, e.p1);
        take(v, at, model.momentum_buffer(), e.p0, e.p1);
      }
    }
    be.params_written();
  }

  // One forward output of the dumped step: the first micro-batch makes its entry, the others append
  // to the same entry (every micro-batch's forward emits the same outputs in the same order).
  void capture(std::string_view name, const Tensor& t) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (capture_at == captured.size()) {
      captured.push_back({std::string(name), t.shape().to_vector(), {}});
      captured.back().shape[0] = 0;
    }
    Captured& c = captured[capture_at++];
    if (c.name != name) throw std::logic_error("pipeline dump: output '" + std::string(name) + "' where '" + c.name + "' was expected");
    c.shape[0] += t.shape().to_vector()[0];
    const std::size_t at = c.data.size();
    c.data.resize(at + n);
    be.to_host(t, std::span<float>(c.data.data() + at, n));
  }

  // Stages 1.. of replica 0 send their captured outputs to rank 0, which writes every stage's into the
  // dump in stage order (the model's forward order). Names and shapes travel as floats (exact below 2^24).
  void write_activations(dump::StepDump* dump) {
    if (seat.replica != 0) return;
    auto describe = [](const std::vector<Captured>& cs) {
      std::vector<float> h{static_cast<float>(cs.size())};
      for (const Captured& c : cs) {
        h.push_back(static_cast<float>(c.name.size()));
        for (unsigned char ch : c.name) h.push_back(static_cast<float>(ch));
        h.push_back(static_cast<float>(c.shape.size()));
        for (auto d : c.shape) h.push_back(static_cast<float>(d));
      }
      return h;
    };
    if (rank != 0) {
      std::vector<float> header = describe(captured);
      const float size = static_cast<float>(header.size());
      comm->send_host(&size, 1, 0, kTagGather);
      comm->send_host(header.data(), header.size(), 0, kTagGather);
      for (const Captured& c : captured) comm->send_host(c.data.data(), c.data.size(), 0, kTagGather);
    } else {
      for (const Captured& c : captured) {
        if (dump) dump->activation(c.name, c.shape, c.data);
      }
      for (int s = 1; s < plan.stages; ++s) {
        float size = 0.0f;
        comm->recv_host(&size, 1, s, kTagGather);
        std::vector<float> header(static_cast<std::size_t>(size));
        comm->recv_host(header.data(), header.size(), s, kTagGather);
        std::size_t at = 0;
        const auto next = [&] { return static_cast<std::int64_t>(header.at(at++)); };
        const std::int64_t entries = next();
        std::vector<float> data;
        for (std::int64_t k = 0; k < entries; ++k) {
          std::string name(static_cast<std::size_t>(next()), ' ');
          for (char& ch : name) ch = static_cast<char>(next());
          std::vector<std::int64_t> shape(static_cast<std::size_t>(next()));
          for (auto& d : shape) d = next();
          data.resize(static_cast<std::size_t>(numel(shape)));
          comm->recv_host(data.data(), data.size(), s, kTagGather);
          if (dump) dump->activation(name, shape, data);
        }
      }
    }
    captured.clear();
  }
};

PipelineStep::PipelineStep(const TrainConfig& cfg, const PipelinePlan& plan, int rank, parallel::Communicator& world,
                           model::ResNet50& model, model::ModelObserver* inner, PipelineRecording recording)
    : impl_(std::make_unique<Impl>(cfg, plan, rank, model, inner, recording)), seat_(seat_of(plan, rank)) {
  Impl& d = *impl_;
  const int S = plan.stages, M = plan.micro_batches;
  d.u0 = plan.first_unit[static_cast<std::size_t>(seat_.stage)];
  d.u1 = plan.first_unit[static_cast<std::size_t>(seat_.stage) + 1];
  d.first = seat_.stage == 0;
  d.last = seat_.stage == S - 1;
  std::tie(d.p0, d.p1) = model.unit_params(d.u0, d.u1);
  const auto& ps = model.params();
  d.off0 = ps[static_cast<std::size_t>(d.p0)].offset;
  d.off1 = d.p1 >= static_cast<int>(ps.size()) ? model.param_count() : ps[static_cast<std::size_t>(d.p1)].offset;
  for (int p = d.p0; p < d.p1; ++p) d.segments.push_back(model.segments()[static_cast<std::size_t>(p)]);
  d.mb = plan.micro_batch_size;
  if (model.config().batch_size != d.mb) {
    throw std::logic_error("PipelineStep: the model is built for batches of " + std::to_string(model.config().batch_size) +
                           ", the micro-batches hold " + std::to_string(d.mb));
  }
  d.slots = plan.one_f_one_b ? std::min(M, S - seat_.stage) : M;
  d.grad_scale = plan.loss_mean ? 1.0f / static_cast<float>(M) : 1.0f;
  d.work = schedule_of(plan, seat_.stage);
  d.points = message_points(plan, seat_.stage);

  model.use_gradient_scratch();
  model.set_activation_slots(d.slots);
  model.set_observer(this);
  auto& be = d.be;
  const std::int64_t side = cfg.image_size;
  std::optional<backend::MemoryTagScope> tag(std::in_place, backend::MemoryRole::data);
  for (int k = 0; k < d.slots; ++k) {
    d.images.push_back(d.first ? be.empty(Shape{d.mb, 3, side, side}, backend::DType::f32) : Tensor());
    d.labels.push_back(d.last ? be.empty(Shape{d.mb}, backend::DType::i32) : Tensor());
  }
  tag.emplace(backend::MemoryRole::activation);
  if (!d.first) {
    d.in_shape = unit_output_shape(d.u0 - 1, d.mb, side);
    d.in_count = static_cast<std::size_t>(numel(d.in_shape));
    for (int k = 0; k < d.slots; ++k) d.act_in.push_back(be.empty(Shape(d.in_shape), backend::DType::f32));
  }
  if (!d.last) {
    d.out_shape = unit_output_shape(d.u1 - 1, d.mb, side);
    d.out_count = static_cast<std::size_t>(numel(d.out_shape));
    tag.emplace(backend::MemoryRole::gradient);
    d.dy = be.empty(Shape(d.out_shape), backend::DType::f32);
  }
  // The message buffers: activations in, gradients out (and the reverse), as the memory profile's roles.
  for (int m = 0; m < M && S > 1; ++m) {
    if (!d.first) {
      tag.emplace(backend::MemoryRole::activation);
      d.recv_act.push_back(be.empty(Shape(d.in_shape), backend::DType::f32));
      tag.emplace(backend::MemoryRole::gradient);
      d.send_grad.push_back(be.empty(Shape(d.in_shape), backend::DType::f32));
    }
    if (!d.last) {
      tag.emplace(backend::MemoryRole::gradient);
      d.recv_grad.push_back(be.empty(Shape(d.out_shape), backend::DType::f32));
      tag.emplace(backend::MemoryRole::activation);
      d.send_act.push_back(be.empty(Shape(d.out_shape), backend::DType::f32));
    }
  }
  tag.reset();
  d.recv_act_p.resize(static_cast<std::size_t>(M));
  d.recv_grad_p.resize(static_cast<std::size_t>(M));
  d.losses.assign(static_cast<std::size_t>(M), 0.0f);

  if (S > 1) d.comm = parallel::make_pipeline_comm(world, seat_.stage, seat_.replica, be.native_stream());
  if (plan.replicas > 1) {
    // The run's buckets cut to this stage's parameters: its split points inside the stage, renumbered.
    std::vector<parallel::ParamExtent> local;
    for (int p = d.p0; p < d.p1; ++p) {
      local.push_back({static_cast<std::int64_t>(ps[static_cast<std::size_t>(p)].offset - d.off0),
                       static_cast<std::int64_t>(ps[static_cast<std::size_t>(p)].numel)});
    }
    std::optional<allreduce::SplitPoints> split;
    if (cfg.allreduce_split) {
      std::vector<int> points;
      for (int x : cfg.allreduce_split->points()) {
        if (x > d.p0 && x < d.p1) points.push_back(x - d.p0);
      }
      split = points.empty() ? allreduce::SplitPoints::single_bucket() : allreduce::SplitPoints::from_points(points);
    }
    parallel::Communicator& group = d.comm ? d.comm->stage_group() : world;
    parallel::SyncOptions so;
    // On a GPU, each bucket's allreduce waits for the accumulation queued for it (a no-op on the CPU).
    so.on_ready = [&group](const parallel::Bucket&, float* data) { group.mark_ready(data); };
    so.watchdog_timeout_s = cfg.watchdog_s;
    profiler::Recorder* recorder = recording.recorder;
    const int shift = d.p0;
    so.on_span = [recorder, shift](const parallel::BucketSpan& s) {
      if (recorder) {
        recorder->add(store::AllreduceRow{s.rank, s.step, s.bucket, s.first_param + shift, s.last_param + shift, s.bytes,
                                          s.ready_ns, s.start_ns, s.end_ns});
      }
    };
    d.sync = std::make_unique<parallel::GradientSync>(group,
                                                       parallel::plan_buckets(local, split, cfg.bucket_mb),
                                                       model.grad_buffer().data_as<float>() + d.off0, so);
  }
}

PipelineStep::~PipelineStep() {
  if (impl_) impl_->model.set_observer(impl_->inner);
}

std::pair<int, int> PipelineStep::stage_params(int stage) const {
  const auto& f = impl_->plan.first_unit;
  return impl_->model.unit_params(f[static_cast<std::size_t>(stage)], f[static_cast<std::size_t>(stage) + 1]);
}

std::span<const backend::ParamSegment> PipelineStep::own_segments(const model::ResNet50&) const {
  return impl_->segments;
}

float PipelineStep::forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) {
  Impl& d = *impl_;
  d.step = static_cast<std::int32_t>(step);
  d.spans.clear();
  d.sends.clear();
  for (auto& p : d.recv_act_p) p.t.reset();
  for (auto& p : d.recv_grad_p) p.t.reset();
  d.summary = store::PipelineStepRow{d.rank, d.step, seat_.stage, seat_.replica, profiler::now_ns(), 0, 0, 0, 0, 0};
  d.backwards_run = 0;
  if (d.sync) d.sync->begin_step(static_cast<int>(step));
  batch.to_host(d.host_images, d.host_labels);
  batch.forward_done();
  if (d.comm) d.post_receives();
  for (std::size_t k = 0; k < d.work.size(); ++k) {
    const PipelineWork& w = d.work[k];
    d.post(k);
    if (w.op == PipelineOp::forward) {
      d.forward(w.micro);
    } else {
      d.backward(w.micro);
    }
    if (d.comm) d.poll_sends();
  }
  d.post(d.work.size());
  if (d.sync) {
    const std::int64_t c0 = profiler::now_ns();
    d.sync->wait_all();
    comm_ns = profiler::now_ns() - c0;
    d.summary.wait_allreduce_ns = comm_ns;
  }
  // The step's loss: the last stage's micro-batch losses, summed (or averaged), handed to the others.
  float loss = 0.0f;
  if (d.last) {
    for (float l : d.losses) loss += l;
    if (d.plan.loss_mean) loss /= static_cast<float>(d.plan.micro_batches);
    for (int s = 0; s + 1 < d.plan.stages; ++s) d.comm->send_host(&loss, 1, seat_.replica * d.plan.stages + s, kTagLoss);
  } else {
    d.comm->recv_host(&loss, 1, d.last_rank(), kTagLoss);
  }
  for (auto& s : d.sends) {
    if (!s.done) {
      s.t->wait();
      s.done = true;
      d.spans[s.span].end_ns = profiler::now_ns();
    }
  }
  d.summary.end_ns = profiler::now_ns();
  d.record();
  return loss;
}

void PipelineStep::before_dump(std::int64_t) {
  impl_->gather(false);
  impl_->capturing = seat_.replica == 0;
  impl_->captured.clear();
}

void PipelineStep::after_dump(std::int64_t, dump::StepDump* dump) {
  impl_->gather(true);
  if (impl_->capturing) impl_->write_activations(dump);
  impl_->capturing = false;
}

bool PipelineStep::wants_outputs() const {
  return impl_->capturing || (impl_->inner && impl_->inner->wants_outputs());
}

void PipelineStep::on_output(std::string_view dump_name, const backend::Tensor& output) {
  if (impl_->capturing) impl_->capture(dump_name, output);
  if (impl_->inner && impl_->inner->wants_outputs()) impl_->inner->on_output(dump_name, output);
}

void PipelineStep::on_module_begin(int module_id, model::Phase phase) {
  if (impl_->inner) impl_->inner->on_module_begin(module_id, phase);
}

void PipelineStep::on_module_end(int module_id, model::Phase phase) {
  if (impl_->inner) impl_->inner->on_module_end(module_id, phase);
}

// Accumulates this micro-batch's gradients of [first, last) from the scratch into the gradient
// buffer (the first backward of the step assigns); after the last micro-batch they are final and
// the stage's allreduce may take them.
void PipelineStep::on_grads_ready(int first_param, int last_param_exclusive) {
  Impl& d = *impl_;
  const auto& ps = d.model.params();
  const std::size_t a = ps[static_cast<std::size_t>(first_param)].offset;
  const auto& lp = ps[static_cast<std::size_t>(last_param_exclusive - 1)];
  const std::size_t b = lp.offset + lp.numel;
  const Shape n{static_cast<std::int64_t>(b - a)};
  // The step's first backward assigns (backwards_run counts them after backward_units returns).
  d.be.accumulate(d.be.view(d.model.gradient_scratch(), a, n), d.grad_scale, d.be.view(d.model.grad_buffer(), a, n),
                  d.backwards_run == 0);
  if (d.sync && d.backwards_run == d.plan.micro_batches - 1) {
    d.sync->on_grads_ready(first_param - d.p0, last_param_exclusive - d.p0);
  }
}

}  // namespace wb::trainer
