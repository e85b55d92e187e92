// Checkpoints as .safetensors with torchvision's state_dict names (a PyTorch user loads them with
// safetensors or our wbformat.py), plus the SGD momentum buffers under "momentum.<name>". They always
// hold the whole model: a sharded classifier is saved gathered and loaded as this rank's slice, so any
// checkpoint resumes with or without --shard-fc, and with another N.
#pragma once

#include <filesystem>
#include <span>

#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"

namespace wb::trainer {

// `params` and `momentum` laid out by model.full_params() (ResNet50::full_to_host).
void save_checkpoint(const std::filesystem::path& path, const model::ResNet50& model, const optim::Sgd& sgd,
                     std::span<const float> params, std::span<const float> momentum);
// Throws ConfigError naming the file and the tensor when a tensor is missing or has another shape.
void load_checkpoint(const std::filesystem::path& path, model::ResNet50& model, optim::Sgd& sgd);

}  // namespace wb::trainer
