#pragma once
// Hooks through which the profiler, the gradient communicator and the step dumper watch the model.
// Every method has a no-op default; the model holds a plain pointer and skips all calls when it is null,
// so training without an observer pays one branch per module.
//
// Module ids index ResNet50::module_names() (torchvision module names in first-call order, followed by
// two pseudo-modules "loss" and "optimizer"), so a profiler interns the names once and the hot path
// passes integers only.

#include <string_view>

#include "trainer/backend/tensor.hpp"

namespace wb::model {

enum class Phase { forward, backward, loss, optimizer };

class ModelObserver {
 public:
  virtual ~ModelObserver() = default;

  // Around each module's forward and each module's backward, nested for bottleneck blocks. When batch
  // norm and relu run fused (outputs not wanted), the relu's time is inside the batch norm's range and
  // the relu reports no range of its own. Phase::loss wraps the loss forward and the loss backward;
  // Phase::optimizer wraps the parameter update.
  virtual void on_module_begin(int module_id, Phase phase) {}
  virtual void on_module_end(int module_id, Phase phase) {}

  // Asked once per forward. When true, the model runs every module unfused and calls on_output with each
  // module's output in execution order: the module name, except that each bottleneck's relu (one module,
  // called three times) is named "<block>.relu.0/.1/.2", and the block output is "<block>"; "avgpool" is
  // (N, 2048, 1, 1) and "fc" holds the logits. The tensor is valid only during the call (copy it with
  // Backend::to_host).
  virtual bool wants_outputs() const { return false; }
  virtual void on_output(std::string_view dump_name, const backend::Tensor& output) {}

  // During backward, as soon as the gradients of parameters [first_param, last_param_exclusive) (indices
  // into the forward-ordered ParamInfo table) are final in the gradient buffer. Calls come per module in
  // backward order, so indices only decrease: fc first, conv1 last.
  virtual void on_grads_ready(int first_param, int last_param_exclusive) {}
};

}  // namespace wb::model
