#include "trainer/dump/dump.hpp"

#include <cstring>
#include <stdexcept>

#include "store/writer.hpp"

namespace wb::dump {

namespace {

// The entries of a comma-separated list, trimmed of spaces; empty entries dropped.
std::vector<std::string> split_list(std::string_view list) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    std::size_t end = list.find(',', at);
    if (end == std::string_view::npos) end = list.size();
    std::string_view item = list.substr(at, end - at);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    at = end + 1;
  }
  return out;
}

bool is_kind(std::string_view k) {
  for (std::string_view kind : kDumpKinds)
    if (k == kind) return true;
  return false;
}

}  // namespace

std::string dump_kind_list() {
  std::string out;
  for (std::string_view kind : kDumpKinds) {
    if (!out.empty()) out += ", ";
    out += kind;
  }
  return out;
}

std::string unknown_dump_kind(std::string_view list) {
  const std::vector<std::string> items = split_list(list);
  if (items.empty()) return std::string(list);
  if (items.size() == 1 && items[0] == "all") return {};
  for (const std::string& item : items)
    if (!is_kind(item)) return item;
  return {};
}

StepDump::StepDump(store::Writer& writer, int step, int rank, std::string_view kinds)
    : writer_(writer), step_(step), rank_(rank) {
  if (const std::string bad = unknown_dump_kind(kinds); !bad.empty()) {
    throw std::invalid_argument("StepDump: '" + bad + "' is no dump kind (expected all, or some of " +
                                dump_kind_list() + ")");
  }
  if (kinds != "all") kinds_ = split_list(kinds);
}

bool StepDump::keeps(std::string_view kind) const {
  if (kinds_.empty()) return true;
  for (const std::string& k : kinds_)
    if (k == kind) return true;
  return false;
}

void StepDump::add(std::string kind, std::string name, std::vector<std::int64_t> shape, const void* data,
                   std::size_t bytes, std::string dtype) {
  const int order = order_++;  // the execution order counts the kinds left out too
  if (!keeps(kind)) return;
  store::TensorRow row;
  row.source = "run";
  row.step = step_;
  row.rank = rank_;
  row.kind = std::move(kind);
  row.name = std::move(name);
  row.exec_order = order;
  row.dtype = std::move(dtype);
  row.shape = std::move(shape);
  row.data.resize(bytes);
  if (bytes) std::memcpy(row.data.data(), data, bytes);
  writer_.add(std::move(row));
}

void StepDump::add_params(const model::ResNet50& model, std::span<const float> values, std::string_view kind,
                          bool reverse) {
  if (!keeps(kind)) {
    order_ += static_cast<int>(model.full_params().size());
    return;
  }
  const std::vector<model::ParamInfo> params = model.full_params();
  const model::ParamInfo& last = params.back();
  if (values.size() != last.offset + last.numel) {
    throw std::invalid_argument("StepDump: " + std::to_string(values.size()) + " values of " + std::string(kind) +
                                ", expected the whole model's " + std::to_string(last.offset + last.numel));
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    const model::ParamInfo& p = params[reverse ? params.size() - 1 - k : k];
    add_floats(std::string(kind), p.name, p.shape, values.data() + p.offset, p.numel);
  }
}

void StepDump::add_buffers(const model::ResNet50& model, std::string_view kind) {
  std::vector<float> stats = model.running_stats_to_host();
  auto counts = model.num_batches_tracked();
  for (const model::BufferInfo& b : model.buffers()) {
    if (b.dtype == backend::DType::i64) {
      add(std::string(kind), b.name, b.shape, counts.data() + b.offset, b.numel * sizeof(std::int64_t), "I64");
    } else {
      add_floats(std::string(kind), b.name, b.shape, stats.data() + b.offset, b.numel);
    }
  }
}

void StepDump::before_step(const model::ResNet50& model, std::span<const float> params,
                           std::span<const float> images, std::span<const std::int32_t> labels) {
  const auto& cfg = model.config();
  // The batch's own size: a pipeline's model is built for one micro-batch, the dump holds the step's batch.
  const auto batch = static_cast<std::int64_t>(labels.size());
  add_floats("input", "input", {batch, 3, cfg.image_size, cfg.image_size}, images.data(), images.size());
  add("label", "label", {static_cast<std::int64_t>(labels.size())}, labels.data(), labels.size_bytes(), "I32");
  add_params(model, params, "param", false);
  add_buffers(model, "buffer");
}

void StepDump::activation(backend::Backend& backend, std::string_view name, const backend::Tensor& t) {
  if (!keeps("act")) {
    ++order_;
    return;
  }
  host_.resize(static_cast<std::size_t>(t.numel()));
  backend.to_host(t, host_);
  activation(name, t.shape().to_vector(), host_);
}

void StepDump::activation(std::string_view name, std::vector<std::int64_t> shape, std::span<const float> data) {
  add_floats("act", std::string(name), std::move(shape), data.data(), data.size());
}

void StepDump::after_step(model::ResNet50& model, float loss, std::span<const float> grads,
                          std::span<const float> params, std::span<const float> momentum) {
  add_floats("loss", "loss", {}, &loss, 1);
  add_params(model, grads, "grad", true);
  add_params(model, params, "param_after", false);
  add_buffers(model, "buffer_after");
  add_params(model, momentum, "momentum", false);
}

}  // namespace wb::dump
