#include "compare/load.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "store/reader.hpp"

namespace wb::compare {
namespace fs = std::filesystem;

namespace {

bool has_sqlite_magic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[16] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 16 && std::memcmp(magic, "SQLite format 3", 16) == 0;
}

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// Order by kind, then by position in the file: what a file without recorded order tells us.
void derive_exec_order(TensorSet& set) {
  std::vector<std::size_t> order(set.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return walk_rank(kind_of_key(set.tensors[x].key)) < walk_rank(kind_of_key(set.tensors[y].key));
  });
  for (std::size_t pos = 0; pos < order.size(); ++pos) set.tensors[order[pos]].exec_order = static_cast<std::int64_t>(pos);
}

TensorSet from_host_tensors(const fs::path& path, std::vector<store::HostTensor> tensors) {
  TensorSet set;
  set.source = path.string();
  set.tensors.reserve(tensors.size());
  for (auto& t : tensors) {
    NamedTensor nt;
    nt.key = t.name;
    nt.tensor = std::move(t);
    set.tensors.push_back(std::move(nt));
  }
  return set;
}

// Losses summed into a pipeline step's loss: M with {"micro_batches": M, "loss": "sum"}, else 1.
int summed_losses(const std::string& json, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(what + " is not JSON: " + e.what());
  }
  if (!j.is_object()) throw CompareError(what + " must be a JSON object");
  const auto m = j.find("micro_batches");
  const auto loss = j.find("loss");
  if (m == j.end() || !m->is_number_integer() || m->get<int>() < 1) {
    throw CompareError(what + " needs \"micro_batches\", a whole number >= 1");
  }
  return loss != j.end() && loss->is_string() && loss->get<std::string>() == "sum" ? m->get<int>() : 1;
}

TensorSet load_safetensors(const fs::path& path) {
  std::map<std::string, std::string> metadata;
  TensorSet set = from_host_tensors(path, store::read_safetensors(path, &metadata));
  if (const auto nc = metadata.find(kNotComparableMetadataKey); nc != metadata.end()) {
    const std::string what = path.string() + ": __metadata__[\"" + kNotComparableMetadataKey + "\"]";
    nlohmann::json kinds;
    try {
      kinds = nlohmann::json::parse(nc->second);
    } catch (const nlohmann::json::exception& e) {
      throw CompareError(what + " is not JSON (expected a list of kind names): " + e.what());
    }
    if (!kinds.is_array()) throw CompareError(what + " must be a JSON list of kind names");
    for (const auto& k : kinds) {
      const auto kind = k.is_string() ? kind_from_name(k.get<std::string>()) : std::nullopt;
      if (!kind) throw CompareError(what + " holds " + k.dump() + " (expected kind names such as \"grad\")");
      set.not_comparable.insert(*kind);
    }
  }
  if (const auto p = metadata.find(kPipelineMetadataKey); p != metadata.end()) {
    set.loss_terms = summed_losses(p->second, path.string() + ": __metadata__[\"" + kPipelineMetadataKey + "\"]");
  }
  const auto it = metadata.find(kExecOrderMetadataKey);
  if (it == metadata.end()) {
    derive_exec_order(set);
    return set;
  }
  nlohmann::json orders;
  try {
    orders = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(path.string() + ": __metadata__[\"" + kExecOrderMetadataKey +
                       "\"] is not JSON (expected an object of tensor name -> integer order): " + e.what());
  }
  if (!orders.is_object()) {
    throw CompareError(path.string() + ": __metadata__[\"" + kExecOrderMetadataKey +
                       "\"] must be a JSON object of tensor name -> integer order");
  }
  // Tensors the metadata does not list follow the listed ones, in file order.
  std::int64_t next = 0;
  for (const auto& [key, value] : orders.items()) {
    if (!value.is_number_integer()) {
      throw CompareError(path.string() + ": __metadata__[\"" + kExecOrderMetadataKey + "\"][\"" + key +
                         "\"] must be an integer");
    }
    next = std::max(next, value.get<std::int64_t>() + 1);
  }
  for (auto& t : set.tensors) {
    const auto o = orders.find(t.key);
    t.exec_order = o != orders.end() ? o->get<std::int64_t>() : next++;
  }
  return set;
}

TensorSet load_run_file(const fs::path& path, const LoadOptions& options) {
  store::Reader reader(path);
  const std::vector<store::TensorInfo> infos = reader.tensors();
  if (infos.empty()) {
    throw CompareError(path.string() + ": the run file holds no tensors (record a dump with wb-train --dump-step N)");
  }
  std::set<std::string> sources;
  for (const auto& i : infos) sources.insert(i.source);
  std::string source;
  if (options.source) {
    if (!sources.count(*options.source)) {
      throw CompareError(path.string() + ": no tensors of source '" + *options.source + "' (found: " +
                         [&] {
                           std::string s;
                           for (const auto& x : sources) {
                             if (!s.empty()) s += ", ";
                             s += x;
                           }
                           return s;
                         }() + ")");
    }
    source = *options.source;
  } else {
    source = sources.count("run") ? std::string("run") : *sources.begin();
  }
  std::optional<std::int32_t> step = options.step, rank = options.rank;
  for (const auto& i : infos) {
    if (i.source != source) continue;
    if (!options.step && (!step || i.step < *step)) step = i.step;
  }
  for (const auto& i : infos) {
    if (i.source != source || i.step != *step) continue;
    if (!options.rank && (!rank || i.rank < *rank)) rank = i.rank;
  }
  TensorSet set;
  set.source = path.string();
  if (source == "run") {
    const auto meta = reader.meta();
    if (const auto p = meta.find("pipeline_json"); p != meta.end() && !p->second.empty()) {
      set.loss_terms = summed_losses(p->second, path.string() + ": meta pipeline_json");
    }
  }
  for (const auto& i : infos) {
    if (i.source != source || i.step != *step || i.rank != *rank) continue;
    store::TensorRow row = reader.tensor(i.source, i.kind, i.name, i.step, i.rank);
    const auto dtype = store::dtype_from_name(row.dtype);
    if (!dtype) {
      throw CompareError(path.string() + ": tensor " + make_key(row.kind, row.name) + " has dtype '" + row.dtype +
                         "' (expected F32, F64, F16, BF16, I32, I64, U8 or BOOL)");
    }
    NamedTensor nt;
    nt.key = make_key(row.kind, row.name);
    nt.exec_order = row.exec_order;
    nt.tensor.name = nt.key;
    nt.tensor.dtype = *dtype;
    nt.tensor.shape = std::move(row.shape);
    nt.tensor.data = std::move(row.data);
    const auto expected = static_cast<std::size_t>(nt.tensor.numel()) * store::dtype_size(*dtype);
    if (nt.tensor.data.size() != expected) {
      throw CompareError(path.string() + ": tensor " + nt.key + " holds " + std::to_string(nt.tensor.data.size()) +
                         " bytes, its shape and dtype need " + std::to_string(expected));
    }
    set.tensors.push_back(std::move(nt));
  }
  if (set.tensors.empty()) {
    throw CompareError(path.string() + ": no tensors for source '" + source + "', step " + std::to_string(*step) +
                       ", rank " + std::to_string(*rank));
  }
  return set;
}

}  // namespace

SetFormat detect_format(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw CompareError(path.string() + ": no such file or directory");
  if (fs::is_directory(status)) return SetFormat::npy_dir;
  if (has_sqlite_magic(path)) return SetFormat::run_file;
  const std::string ext = lower_extension(path);
  if (ext == ".safetensors") return SetFormat::safetensors;
  if (ext == ".npz") return SetFormat::npz;
  if (ext == ".npy") return SetFormat::npy;
  if (ext == ".sqlite" || ext == ".db") {
    throw CompareError(path.string() + ": not a wb run file (no SQLite header)");
  }
  throw CompareError(path.string() +
                     ": unrecognised format (expected a run file, .safetensors, .npz, .npy or a directory of .npy files)");
}

TensorSet load_tensor_set(const fs::path& path, const LoadOptions& options) {
  TensorSet set;
  switch (detect_format(path)) {
    case SetFormat::run_file: set = load_run_file(path, options); break;
    case SetFormat::safetensors: set = load_safetensors(path); break;
    case SetFormat::npz:
      set = from_host_tensors(path, store::read_npz(path));
      derive_exec_order(set);
      break;
    case SetFormat::npy: {
      std::vector<store::HostTensor> one;
      one.push_back(store::read_npy(path));
      set = from_host_tensors(path, std::move(one));
      derive_exec_order(set);
      break;
    }
    case SetFormat::npy_dir:
      set = from_host_tensors(path, store::read_tensor_dir(path));
      if (set.tensors.empty()) throw CompareError(path.string() + ": the directory holds no .npy files");
      derive_exec_order(set);
      break;
  }
  set.index();
  return set;
}

}  // namespace wb::compare
