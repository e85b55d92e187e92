// Checkpoints as .safetensors with torchvision's state_dict names (a PyTorch user loads them with
// safetensors or our wbformat.py), plus the SGD momentum buffers under "momentum.<name>".
#pragma once

#include <filesystem>

#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"

namespace wb::trainer {

void save_checkpoint(const std::filesystem::path& path, const model::ResNet50& model, const optim::Sgd& sgd);
// Throws ConfigError naming the file and the tensor when a tensor is missing or has another shape.
void load_checkpoint(const std::filesystem::path& path, model::ResNet50& model, optim::Sgd& sgd);

}  // namespace wb::trainer
