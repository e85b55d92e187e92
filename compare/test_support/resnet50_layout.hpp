// Names and shapes of a torchvision ResNet-50 (v1.5) step dump, computed from the architecture: used
// by tests to build realistic tensor sets and by bench/compare_speed to size a full dump.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/tensor_file.hpp"

namespace wb::compare::testing {

struct LayoutEntry {
  std::string key;  // dump key: "param.conv1.weight", "act.layer1.0.conv1", ...
  std::vector<std::int64_t> shape;
  store::DType dtype = store::DType::F32;
};

// `width_div` divides every channel count (names unchanged), so tests can use the real structure at a
// fraction of the size; 1 is the real network.

// state_dict order: "param.<name>" for the 161 parameters and "buffer.<name>" for the 159 BatchNorm
// buffers (running_mean, running_var, num_batches_tracked), interleaved as torchvision lists them.
std::vector<LayoutEntry> resnet50_state(int num_classes, int width_div = 1);

// Forward outputs of every leaf module (convs, BNs, downsample layers, the block's final relu,
// maxpool, avgpool, fc) for a (batch, 3, image, image) input: "act.<module>".
std::vector<LayoutEntry> resnet50_activations(int batch, int image, int num_classes, int width_div = 1);

// A whole step dump in execution order: input, label, param.*, buffer.*, act.*, loss, grad.* (reverse
// layer order), param_after.*, buffer_after.*, momentum.*.
std::vector<LayoutEntry> resnet50_step(int batch, int image, int num_classes, int width_div = 1);

}  // namespace wb::compare::testing
