// wb export safetensors|npy: the dumped tensors of one step and rank of a run file, under the dump
// keys docs/ARCHITECTURE.md fixes (input, label, loss, param.<name>, act.<module>, grad.<name>, ...), so the
// files line up with compare/reference/torch_step.py's output and with numpy/PyTorch tooling.
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/cli.hpp"
#include "store/reader.hpp"
#include "store/tensor_file.hpp"

namespace wb::cli {

namespace {

constexpr const char* kUsage =
    "usage: wb export safetensors RUN OUT.safetensors [--step N] [--rank R]\n"
    "       wb export npy RUN DIR [--step N] [--rank R]\n"
    "Writes the tensors dumped by `wb-train --dump-step N` (source 'run' in RUN's tensor table).\n"
    "Keys: input, label, loss, and <kind>.<name> for param, buffer, act, grad, param_after,\n"
    "buffer_after and momentum (e.g. param.conv1.weight, act.layer1.0.conv1).\n"
    "  safetensors  one file; __metadata__ holds wb.run, wb.step, wb.rank and wb.exec_order\n"
    "               (a JSON object: key -> order in which the step produced the tensor)\n"
    "  npy          one file per tensor, DIR/{exec_order:04d}_{key}.npy (TroubleShooter's layout);\n"
    "               BF16 tensors are widened to F32, exactly, since numpy has no bfloat16\n"
    "  --step N     the dumped step to export (needed when RUN holds several)\n"
    "  --rank R     the rank to export (default: the lowest rank with a dump of that step)";

std::string dump_key(const store::TensorInfo& t, const std::string& run) {
  static const std::set<std::string> kNamed = {"param", "buffer", "act", "grad", "param_after", "buffer_after",
                                               "momentum"};
  if (t.kind == "input" || t.kind == "label" || t.kind == "loss") return t.kind;
  if (kNamed.count(t.kind) != 0) {
    if (t.name.empty()) throw store::TensorFileError(run, "a " + t.kind + " tensor has an empty name");
    return t.kind + "." + t.name;
  }
  throw store::TensorFileError(run, "tensor '" + t.name + "' has unknown kind '" + t.kind +
                                        "' (expected input, label, loss, param, buffer, act, grad, "
                                        "param_after, buffer_after or momentum)");
}

std::string join_ints(const std::set<std::int32_t>& values) {
  std::string out;
  for (std::int32_t v : values) {
    if (!out.empty()) out += ", ";
    out += std::to_string(v);
  }
  return out;
}

// The tensors of the chosen step and rank, in exec order.
std::vector<store::TensorInfo> select_tensors(store::Reader& reader, const Args& args, std::int32_t& step,
                                              std::int32_t& rank) {
  const std::string run = reader.path().string();
  const std::vector<store::TensorInfo> all = reader.tensors("run");
  if (all.empty()) {
    throw store::TensorFileError(run, "holds no dumped tensors; record one with `wb-train --dump-step N --run RUN`");
  }
  std::set<std::int32_t> steps;
  for (const auto& t : all) steps.insert(t.step);
  if (const auto s = args.int_value("--step", INT32_MIN, INT32_MAX)) {
    step = static_cast<std::int32_t>(*s);
    if (steps.count(step) == 0) {
      args.fail("--step " + std::to_string(step) + ": " + run + " holds dumps of step " + join_ints(steps));
    }
  } else if (steps.size() == 1) {
    step = *steps.begin();
  } else {
    args.fail(run + " holds dumps of steps " + join_ints(steps) + "; choose one with --step N");
  }
  std::set<std::int32_t> ranks;
  for (const auto& t : all)
    if (t.step == step) ranks.insert(t.rank);
  if (const auto r = args.int_value("--rank", 0, INT32_MAX)) {
    rank = static_cast<std::int32_t>(*r);
    if (ranks.count(rank) == 0) {
      args.fail("--rank " + std::to_string(rank) + ": step " + std::to_string(step) + " of " + run +
                " was dumped by rank " + join_ints(ranks));
    }
  } else {
    rank = *ranks.begin();
  }
  std::vector<store::TensorInfo> out;
  for (const auto& t : all)
    if (t.step == step && t.rank == rank) out.push_back(t);
  return out;  // Reader orders by exec_order
}

store::DType dtype_of(const store::TensorInfo& t, const std::string& run) {
  const auto d = store::dtype_from_name(t.dtype);
  if (!d) {
    throw store::TensorFileError(run, "tensor " + t.kind + " '" + t.name + "' has unsupported dtype '" + t.dtype +
                                          "' (expected F32, F64, F16, BF16, I32, I64, U8 or BOOL)");
  }
  return *d;
}

// bfloat16 is the upper half of a float32, so widening is exact.
void widen_bf16(store::HostTensor& t) {
  std::vector<std::byte> wide(t.data.size() * 2);
  for (std::size_t i = 0; i < t.data.size() / 2; ++i) {
    wide[4 * i + 2] = t.data[2 * i];
    wide[4 * i + 3] = t.data[2 * i + 1];
  }
  t.data = std::move(wide);
  t.dtype = store::DType::F32;
}

}  // namespace

int export_chrome(int argc, char** argv);  // cmd_chrome.cpp

int cmd_export(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "chrome") == 0) return export_chrome(argc, argv);
  Args args(argc, argv, kUsage, {{"--step", true}, {"--rank", true}});
  const auto& pos = args.positionals(3, 3);
  const std::string& format = pos[0];
  if (format != "safetensors" && format != "npy") {
    args.fail("unknown format '" + format + "' (expected safetensors or npy)");
  }
  const std::string& run = pos[1];
  const std::filesystem::path out = pos[2];

  store::Reader reader(run);
  std::int32_t step = 0, rank = 0;
  const std::vector<store::TensorInfo> infos = select_tensors(reader, args, step, rank);
  std::vector<std::string> keys;
  std::vector<store::DType> dtypes;
  for (const auto& t : infos) {
    keys.push_back(dump_key(t, run));
    dtypes.push_back(dtype_of(t, run));
  }

  std::uint64_t bytes = 0;
  if (format == "safetensors") {
    std::vector<store::TensorSpec> specs;
    nlohmann::ordered_json order = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < infos.size(); ++i) {
      specs.push_back({keys[i], dtypes[i], infos[i].shape});
      order[keys[i]] = infos[i].exec_order;
    }
    const std::map<std::string, std::string> metadata = {{"wb.run", run},
                                                         {"wb.step", std::to_string(step)},
                                                         {"wb.rank", std::to_string(rank)},
                                                         {"wb.exec_order", order.dump()}};
    store::write_safetensors(
        out, specs,
        [&](std::size_t i) {
          store::TensorRow row = reader.tensor("run", infos[i].kind, infos[i].name, step, rank);
          bytes += row.data.size();
          return std::move(row.data);
        },
        metadata);
  } else {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec || !std::filesystem::is_directory(out)) {
      throw store::TensorFileError(out, "cannot create the output directory: " + ec.message());
    }
    for (std::size_t i = 0; i < infos.size(); ++i) {
      if (keys[i].find('/') != std::string::npos) {
        throw store::TensorFileError(run, "key '" + keys[i] + "' contains '/', which cannot be a file name");
      }
      char prefix[16];
      std::snprintf(prefix, sizeof(prefix), "%04d_", infos[i].exec_order);
      store::TensorRow row = reader.tensor("run", infos[i].kind, infos[i].name, step, rank);
      store::HostTensor t{keys[i], dtypes[i], row.shape, std::move(row.data)};
      if (t.dtype == store::DType::BF16) widen_bf16(t);
      bytes += t.data.size();
      store::write_npy(out / (prefix + keys[i] + ".npy"), t);
    }
  }
  std::printf("wrote %zu tensors (step %d, rank %d, %.1f MB) to %s\n", infos.size(), step, rank,
              static_cast<double>(bytes) / 1e6, out.string().c_str());
  return 0;
}

}  // namespace wb::cli
