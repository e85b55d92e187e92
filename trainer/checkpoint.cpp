#include "trainer/checkpoint.hpp"

#include <cstring>
#include <map>

#include "store/tensor_file.hpp"
#include "trainer/config.hpp"

namespace wb::trainer {
namespace {

store::HostTensor host_tensor(const std::string& name, store::DType dtype, const std::vector<std::int64_t>& shape,
                              const void* data, std::size_t bytes) {
  store::HostTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  t.data.resize(bytes);
  if (bytes) std::memcpy(t.data.data(), data, bytes);
  return t;
}

}  // namespace

void save_checkpoint(const std::filesystem::path& path, const model::ResNet50& model, const optim::Sgd& sgd,
                     std::span<const float> params, std::span<const float> momentum) {
  const std::vector<model::ParamInfo> table = model.full_params();
  std::vector<float> stats = model.running_stats_to_host();
  const auto counts = model.num_batches_tracked();
  std::vector<store::HostTensor> out;
  for (const model::StateEntry& e : model.state_dict()) {
    if (e.is_param) {
      const auto& p = table[e.index];
      out.push_back(host_tensor(p.name, store::DType::F32, p.shape, params.data() + p.offset, p.numel * sizeof(float)));
    } else {
      const auto& b = model.buffers()[e.index];
      if (b.dtype == backend::DType::i64) {
        out.push_back(host_tensor(b.name, store::DType::I64, b.shape, counts.data() + b.offset, b.numel * sizeof(std::int64_t)));
      } else {
        out.push_back(host_tensor(b.name, store::DType::F32, b.shape, stats.data() + b.offset, b.numel * sizeof(float)));
      }
    }
  }
  for (const auto& p : table) {
    out.push_back(host_tensor("momentum." + p.name, store::DType::F32, p.shape, momentum.data() + p.offset,
                              p.numel * sizeof(float)));
  }
  store::write_safetensors(path, out, {{"format", "pt"}, {"wb.sgd_steps", std::to_string(sgd.steps())}});
}

void load_checkpoint(const std::filesystem::path& path, model::ResNet50& model, optim::Sgd& sgd) {
  std::map<std::string, std::string> meta;
  std::vector<store::HostTensor> tensors;
  try {
    tensors = store::read_safetensors(path, &meta);
  } catch (const std::exception& e) {
    throw ConfigError("--resume: " + std::string(e.what()));
  }
  std::map<std::string, const store::HostTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  auto find = [&](const std::string& name, store::DType dtype, const std::vector<std::int64_t>& shape) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw ConfigError("--resume " + path.string() + ": no tensor '" + name + "'");
    if (it->second->dtype != dtype || it->second->shape != shape) {
      throw ConfigError("--resume " + path.string() + ": tensor '" + name + "' has another shape or dtype than the model's");
    }
    return it->second;
  };
  // The whole model's tensors, then this model's part of them (its slice of a sharded classifier).
  const std::vector<model::ParamInfo> table = model.full_params();
  std::vector<float> full(table.back().offset + table.back().numel);
  std::vector<float> stats = model.running_stats_to_host();
  for (const auto& p : table) {
    const store::HostTensor* t = find(p.name, store::DType::F32, p.shape);
    std::memcpy(full.data() + p.offset, t->data.data(), p.numel * sizeof(float));
  }
  auto counts = model.num_batches_tracked();
  for (const auto& b : model.buffers()) {
    if (b.dtype == backend::DType::i64) {
      const store::HostTensor* t = find(b.name, store::DType::I64, b.shape);
      std::memcpy(counts.data() + b.offset, t->data.data(), b.numel * sizeof(std::int64_t));
    } else {
      const store::HostTensor* t = find(b.name, store::DType::F32, b.shape);
      std::memcpy(stats.data() + b.offset, t->data.data(), b.numel * sizeof(float));
    }
  }
  model.params_from_host(model.slice_of_full(full));
  model.running_stats_from_host(stats);
  // Momentum is optional: a plain torchvision state_dict has none, and SGD then starts fresh.
  if (by_name.count("momentum." + model.params().front().name)) {
    for (const auto& p : table) {
      const store::HostTensor* t = find("momentum." + p.name, store::DType::F32, p.shape);
      std::memcpy(full.data() + p.offset, t->data.data(), p.numel * sizeof(float));
    }
    model.compute_backend().from_host(model.momentum_buffer(), model.slice_of_full(full));
    auto it = meta.find("wb.sgd_steps");
    sgd.set_steps(it != meta.end() ? std::stoll(it->second) : 1);
  }
}

}  // namespace wb::trainer
