// Step dumps: every tensor of one training step, in execution order, into the run file's tensor table
// (kinds and torchvision names as in docs/ARCHITECTURE.md, "Dump keys"). The order the rows get is the
// order the comparison walks:
//   input, label, param.*, buffer.*, act.* (forward order), loss, grad.* (reverse layer order),
//   param_after.*, buffer_after.*, momentum.*
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "store/rows.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/model/resnet50.hpp"

namespace wb::store {
class Writer;
}

namespace wb::dump {

// Every kind a dump writes, in the order above.
inline constexpr std::string_view kDumpKinds[] = {"input", "label",    "param",        "buffer",       "act",
                                                  "loss",  "grad",     "param_after", "buffer_after", "momentum"};
// "input, label, ...", for messages.
std::string dump_kind_list();
// The first entry of a --dump-kinds list ("act,grad" or "all") that is no kind; empty when all are.
std::string unknown_dump_kind(std::string_view list);

class StepDump {
 public:
  // `kinds`: a --dump-kinds list ("all", or kinds separated by commas): the others are not written.
  StepDump(store::Writer& writer, int step, int rank, std::string_view kinds = "all");

  // Before forward: the preprocessed batch, and the state the step starts from. Parameter-sized values
  // (`params` here, the gradients, parameters and momentum after the step) are laid out by
  // model.full_params() (ResNet50::full_to_host): the whole classifier also when it is sharded.
  void before_step(const model::ResNet50& model, std::span<const float> params, std::span<const float> images,
                   std::span<const std::int32_t> labels);
  // One forward output (from ModelObserver::on_output), copied to the host.
  void activation(backend::Backend& backend, std::string_view name, const backend::Tensor& t);
  // The same from host data (plain row-major in `shape`): a pipeline's outputs gathered from its stages.
  void activation(std::string_view name, std::vector<std::int64_t> shape, std::span<const float> data);
  // After the optimizer: loss, gradients (as the optimizer used them), and the state after the update.
  void after_step(model::ResNet50& model, float loss, std::span<const float> grads, std::span<const float> params,
                  std::span<const float> momentum);
  int tensors() const { return order_; }
  bool keeps(std::string_view kind) const;

 private:
  void add(std::string kind, std::string name, std::vector<std::int64_t> shape, const void* data, std::size_t bytes,
           std::string dtype);
  void add_floats(std::string kind, std::string name, std::vector<std::int64_t> shape, const float* data,
                  std::size_t n) {
    add(std::move(kind), std::move(name), std::move(shape), data, n * sizeof(float), "F32");
  }
  void add_params(const model::ResNet50& model, std::span<const float> values, std::string_view kind, bool reverse);
  void add_buffers(const model::ResNet50& model, std::string_view kind);

  store::Writer& writer_;
  int step_;
  int rank_;
  int order_ = 0;
  std::vector<float> host_;  // reused staging for activations
  std::vector<std::string> kinds_;  // empty: every kind
};

}  // namespace wb::dump
