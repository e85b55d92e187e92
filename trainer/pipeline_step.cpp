#include "trainer/pipeline_step.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "profiler/record/clock.hpp"
#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"
#include "trainer/backend/memory.hpp"
#include "trainer/parallel/buckets.hpp"

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

enum class Op { forward, backward };
struct Work {
  Op op;
  int micro;
};

// The order stage `stage` of `stages` runs its forwards and backwards.
std::vector<Work> schedule_of(const PipelinePlan& plan, int stage) {
  const int M = plan.micro_batches;
  std::vector<Work> w;
  if (!plan.one_f_one_b) {
    for (int m = 0; m < M; ++m) w.push_back({Op::forward, m});
    for (int m = 0; m < M; ++m) w.push_back({Op::backward, m});
    return w;
  }
  const int warm = std::min(plan.stages - stage - 1, M);
  for (int m = 0; m < warm; ++m) w.push_back({Op::forward, m});
  for (int i = 0; i < M - warm; ++i) {
    w.push_back({Op::forward, warm + i});
    w.push_back({Op::backward, i});
  }
  for (int i = M - warm; i < M; ++i) w.push_back({Op::backward, i});
  return w;
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<std::int64_t> unit_output_shape(int unit, std::int64_t n, std::int64_t image_size) {
  auto down = [](std::int64_t h, std::int64_t k, std::int64_t s, std::int64_t p) { return (h + 2 * p - k) / s + 1; };
  std::int64_t h = down(down(image_size, 7, 2, 3), 3, 2, 1);  // conv1, maxpool
  std::int64_t c = 64;
  static constexpr int kBlocks[4] = {3, 4, 6, 3};
  static constexpr std::int64_t kWidth[4] = {64, 128, 256, 512};
  int u = 1;
  for (int s = 0; s < 4; ++s) {
    for (int b = 0; b < kBlocks[s]; ++b, ++u) {
      if (u > unit) return {n, c, h, h};
      if (b == 0 && s > 0) h = down(h, 3, 2, 1);
      c = kWidth[s] * 4;
    }
  }
  if (unit >= ResNet50::kUnits - 1) throw std::logic_error("unit_output_shape: the tail's output is the loss");
  return {n, c, h, h};
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
  std::vector<Work> work;

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
  std::vector<std::vector<float>> recv_act, recv_grad, send_act, send_grad;  // per micro-batch
  std::vector<std::unique_ptr<parallel::Transfer>> recv_act_t, recv_grad_t;
  struct Sent {
    std::unique_ptr<parallel::Transfer> t;
    std::size_t span;  // index into spans
    bool done = false;
  };
  std::vector<Sent> sends;
  float loss_in = 0.0f;  // the step's loss, from the last stage
  std::unique_ptr<parallel::Transfer> loss_t;
  std::vector<float> losses;

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

  void send(std::vector<float>& data, int peer, int tag, const char* kind, int micro) {
    const std::int64_t t = profiler::now_ns();
    Sent s;
    s.t = comm->send(data.data(), data.size(), peer, tag);
    s.span = add_span(kind, micro, peer, static_cast<std::int64_t>(data.size() * sizeof(float)), t, t, t);
    sends.push_back(std::move(s));
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
    const int k = m % slots;
    model.use_slot(k);
    const std::size_t img = static_cast<std::size_t>(mb) * 3 * static_cast<std::size_t>(cfg.image_size * cfg.image_size);
    if (first) {
      be.from_host(images[static_cast<std::size_t>(k)],
                   std::span<const float>(host_images.data() + static_cast<std::size_t>(m) * img, img));
    } else {
      summary.wait_act_ns += wait_recv(*recv_act_t[static_cast<std::size_t>(m)], recv_act_span[static_cast<std::size_t>(m)]);
      be.from_host(act_in[static_cast<std::size_t>(k)], recv_act[static_cast<std::size_t>(m)]);
    }
    if (last) {
      be.from_host(labels[static_cast<std::size_t>(k)],
                   std::span<const std::int32_t>(host_labels.data() + static_cast<std::size_t>(m * mb),
                                                 static_cast<std::size_t>(mb)));
    }
    const std::int64_t t0 = profiler::now_ns();
    const float loss = model.forward_units(u0, u1, first ? images[static_cast<std::size_t>(k)] : act_in[static_cast<std::size_t>(k)],
                                           labels[static_cast<std::size_t>(k)]);
    if (last) {
      losses[static_cast<std::size_t>(m)] = loss;
    } else {
      auto& out = send_act[static_cast<std::size_t>(m)];
      be.to_host(model.units_output(), out);
    }
    const std::int64_t t1 = profiler::now_ns();
    add_span("forward", m, -1, 0, t0, t0, t1);
    summary.busy_ns += t1 - t0;
    if (!last) send(send_act[static_cast<std::size_t>(m)], seat.next_rank, tag_act(m), "send_act", m);
  }

  void backward(int m) {
    const int k = m % slots;
    model.use_slot(k);
    if (!last) {
      summary.wait_grad_ns +=
          wait_recv(*recv_grad_t[static_cast<std::size_t>(m)], recv_grad_span[static_cast<std::size_t>(m)]);
      be.from_host(dy, recv_grad[static_cast<std::size_t>(m)]);
    }
    const std::int64_t t0 = profiler::now_ns();
    const Tensor& dx = model.backward_units(dy);
    ++backwards_run;
    if (!first) be.to_host(dx, send_grad[static_cast<std::size_t>(m)]);
    const std::int64_t t1 = profiler::now_ns();
    add_span("backward", m, -1, 0, t0, t0, t1);
    summary.busy_ns += t1 - t0;
    if (!first) send(send_grad[static_cast<std::size_t>(m)], seat.prev_rank, tag_grad(m), "send_grad", m);
  }

  std::vector<std::size_t> recv_act_span, recv_grad_span;

  void post_receives() {
    const int M = plan.micro_batches;
    recv_act_span.assign(static_cast<std::size_t>(M), 0);
    recv_grad_span.assign(static_cast<std::size_t>(M), 0);
    for (int m = 0; m < M; ++m) {
      const std::int64_t t = profiler::now_ns();
      if (!first) {
        auto& buf = recv_act[static_cast<std::size_t>(m)];
        recv_act_t[static_cast<std::size_t>(m)] = comm->recv(buf.data(), buf.size(), seat.prev_rank, tag_act(m));
        recv_act_span[static_cast<std::size_t>(m)] =
            add_span("recv_act", m, seat.prev_rank, static_cast<std::int64_t>(buf.size() * sizeof(float)), t, t, t);
      }
      if (!last) {
        auto& buf = recv_grad[static_cast<std::size_t>(m)];
        recv_grad_t[static_cast<std::size_t>(m)] = comm->recv(buf.data(), buf.size(), seat.next_rank, tag_grad(m));
        recv_grad_span[static_cast<std::size_t>(m)] =
            add_span("recv_grad", m, seat.next_rank, static_cast<std::int64_t>(buf.size() * sizeof(float)), t, t, t);
      }
    }
    if (!last) loss_t = comm->recv(&loss_in, 1, last_rank(), kTagLoss);
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

  // Replica 0's stages send their part of the state to rank 0, which writes it into its own
  // buffers (whose other stages' parts it never uses otherwise). CPU memory.
  void gather(bool after) {
    if (!comm || seat.replica != 0) return;
    auto pack = [&](const Extent& e) {
      std::vector<float> v;
      auto add = [&](const Tensor& t, std::size_t a, std::size_t b) {
        const float* d = t.data_as<float>();
        v.insert(v.end(), d + a, d + b);
      };
      add(model.param_buffer(), e.p0, e.p1);
      add(model.running_stats(), e.s0, e.s1);
      auto counts = model.num_batches_tracked();
      for (std::size_t i = e.c0; i < e.c1; ++i) v.push_back(static_cast<float>(counts[i]));
      if (after) {
        add(model.grad_buffer(), e.p0, e.p1);
        add(model.momentum_buffer(), e.p0, e.p1);
      }
      return v;
    };
    if (rank != 0) {
      std::vector<float> v = pack(extent_of(seat.stage));
      comm->send(v.data(), v.size(), 0, kTagGather)->wait();
      return;
    }
    for (int s = 1; s < plan.stages; ++s) {
      const Extent e = extent_of(s);
      std::vector<float> v(pack(e).size());
      comm->recv(v.data(), v.size(), s, kTagGather)->wait();
      std::size_t at = 0;
      auto take = [&](const Tensor& t, std::size_t a, std::size_t b) {
        std::memcpy(t.data_as<float>() + a, v.data() + at, (b - a) * sizeof(float));
        at += b - a;
      };
      take(model.param_buffer(), e.p0, e.p1);
      take(model.running_stats(), e.s0, e.s1);
      auto counts = model.num_batches_tracked();
      for (std::size_t i = e.c0; i < e.c1; ++i) counts[i] = static_cast<std::int64_t>(v[at++]);
      if (after) {
        take(model.grad_buffer(), e.p0, e.p1);
        take(model.momentum_buffer(), e.p0, e.p1);
      }
    }
    be.params_written();
  }
};

PipelineStep::PipelineStep(const TrainConfig& cfg, const PipelinePlan& plan, int rank, parallel::Communicator& world,
                           model::ResNet50& model, model::ModelObserver* inner, PipelineRecording recording)
    : impl_(std::make_unique<Impl>(cfg, plan, rank, model, inner, recording)), seat_(seat_of(plan, rank)) {
  Impl& d = *impl_;
  if (model.compute_backend().native_stream() != nullptr) {
    throw ConfigError("--pipeline-stages/--micro-batches: the pipeline runs on the CPU backend only");
  }
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
  tag.reset();
  d.recv_act.assign(static_cast<std::size_t>(M), std::vector<float>(d.in_count));
  d.send_grad.assign(static_cast<std::size_t>(M), std::vector<float>(d.in_count));
  d.recv_grad.assign(static_cast<std::size_t>(M), std::vector<float>(d.out_count));
  d.send_act.assign(static_cast<std::size_t>(M), std::vector<float>(d.out_count));
  d.recv_act_t.resize(static_cast<std::size_t>(M));
  d.recv_grad_t.resize(static_cast<std::size_t>(M));
  d.losses.assign(static_cast<std::size_t>(M), 0.0f);

  if (S > 1) d.comm = parallel::make_pipeline_comm(world, seat_.stage, seat_.replica);
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
    parallel::SyncOptions so;
    profiler::Recorder* recorder = recording.recorder;
    const int shift = d.p0;
    so.on_span = [recorder, shift](const parallel::BucketSpan& s) {
      if (recorder) {
        recorder->add(store::AllreduceRow{s.rank, s.step, s.bucket, s.first_param + shift, s.last_param + shift, s.bytes,
                                          s.ready_ns, s.start_ns, s.end_ns});
      }
    };
    d.sync = std::make_unique<parallel::GradientSync>(d.comm ? d.comm->stage_group() : world,
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
  d.summary = store::PipelineStepRow{d.rank, d.step, seat_.stage, seat_.replica, profiler::now_ns(), 0, 0, 0, 0, 0};
  d.backwards_run = 0;
  if (d.sync) d.sync->begin_step(static_cast<int>(step));
  batch.to_host(d.host_images, d.host_labels);
  batch.forward_done();
  if (d.comm) d.post_receives();
  for (const Work& w : d.work) {
    if (w.op == Op::forward) {
      d.forward(w.micro);
    } else {
      d.backward(w.micro);
    }
    if (d.comm) d.poll_sends();
  }
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
    for (int s = 0; s + 1 < d.plan.stages; ++s) {
      d.comm->send(&loss, 1, seat_.replica * d.plan.stages + s, kTagLoss)->wait();
    }
  } else {
    d.loss_t->wait();
    loss = d.loss_in;
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

void PipelineStep::before_dump(std::int64_t) { impl_->gather(false); }
void PipelineStep::after_dump(std::int64_t) { impl_->gather(true); }

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
  float* acc = d.model.grad_buffer().data_as<float>();
  const float* scr = d.model.gradient_scratch().data_as<float>();
  const float k = d.grad_scale;
  const auto lo = static_cast<std::int64_t>(a), hi = static_cast<std::int64_t>(b);
  if (d.backwards_run == 0) {  // the step's first backward (counted after backward_units returns)
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = lo; i < hi; ++i) acc[i] = k * scr[i];
  } else {
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = lo; i < hi; ++i) acc[i] += k * scr[i];
  }
  if (d.sync && d.backwards_run == d.plan.micro_batches - 1) {
    d.sync->on_grads_ready(first_param - d.p0, last_param_exclusive - d.p0);
  }
}

}  // namespace wb::trainer
