#include "compare/load.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "compare/noise_estimate.hpp"
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

// No recorded order: by kind, then by the ResNet-50 forward order known from the names; names it does
// not know follow the known ones of their kind in file order.
void derive_exec_order(TensorSet& set, std::string why) {
  std::vector<std::size_t> order(set.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<std::tuple<int, int, std::int64_t>> keys(set.tensors.size());
  for (std::size_t i = 0; i < set.tensors.size(); ++i) {
    const std::string& key = set.tensors[i].key;
    const TensorKind kind = kind_of_key(key);
    const auto rank = resnet50_forward_rank(base_name(key));
    keys[i] = {walk_rank(kind), rank ? 0 : 1, rank ? *rank : 0};
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return keys[x] < keys[y]; });
  for (std::size_t pos = 0; pos < order.size(); ++pos) set.tensors[order[pos]].exec_order = static_cast<std::int64_t>(pos);
  set.order_source = OrderSource::derived;
  set.order_origin = std::move(why);
}

void recorded_order(TensorSet& set, std::string origin) {
  set.order_source = OrderSource::recorded;
  set.order_origin = std::move(origin);
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

double noise_number(const nlohmann::json& entry, const char* field, const std::string& what) {
  const auto it = entry.find(field);
  if (it == entry.end() || !it->is_number() || !(it->get<double>() >= 0.0)) {
    throw CompareError(what + " needs \"" + field + "\", a finite number >= 0");
  }
  return it->get<double>();
}

// __metadata__["wb.noise"] into set.noise (see load.hpp).
void read_noise(TensorSet& set, const std::string& json, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(what + " is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("tensors") || !j["tensors"].is_object()) {
    throw CompareError(what + " must be a JSON object with \"tensors\": {key: {\"l2\", \"max_abs\", \"ref_l2\"}}");
  }
  if (const auto v = j.find("version"); v != j.end() && !(v->is_number_integer() && v->get<int>() == 1)) {
    throw CompareError(what + " has version " + v->dump() + " (this build reads version 1)");
  }
  for (const auto& [key, entry] : j["tensors"].items()) {
    const std::string at = what + "[\"tensors\"][\"" + key + "\"]";
    if (!entry.is_object()) throw CompareError(at + " must be a JSON object");
    NoiseScale n;
    n.l2 = noise_number(entry, "l2", at);
    n.max_abs = noise_number(entry, "max_abs", at);
    n.ref_l2 = noise_number(entry, "ref_l2", at);
    if (entry.contains("flip_l2")) n.flip_l2 = noise_number(entry, "flip_l2", at);
    if (entry.contains("input_l2")) n.input_l2 = noise_number(entry, "input_l2", at);
    set.noise[key] = n;
  }
  if (const auto u = j.find("updates"); u != j.end()) {
    if (!u->is_object()) throw CompareError(what + "[\"updates\"] must be a JSON object");
    for (const auto& [key, entry] : u->items()) {
      const std::string at = what + "[\"updates\"][\"" + key + "\"]";
      if (!entry.is_object()) throw CompareError(at + " must be a JSON object");
      const auto n = set.noise.find(key);
      if (n == set.noise.end()) continue;  // an update without its value's noise is not used
      n->second.update_l2 = noise_number(entry, "l2", at);
      n->second.update_ref_l2 = noise_number(entry, "ref_l2", at);
      if (entry.contains("flip_l2")) n->second.update_flip_l2 = noise_number(entry, "flip_l2", at);
    }
  }
  const auto method = j.find("method");
  set.noise_method = method != j.end() && method->is_string() ? method->get<std::string>() : "recorded noise";
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
  if (const auto n = metadata.find(kNoiseMetadataKey); n != metadata.end()) {
    read_noise(set, n->second, path.string() + ": __metadata__[\"" + kNoiseMetadataKey + "\"]");
  }
  const auto it = metadata.find(kExecOrderMetadataKey);
  if (it == metadata.end()) {
    derive_exec_order(set, "no order recorded (no __metadata__[\"" + std::string(kExecOrderMetadataKey) + "\"])");
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
  recorded_order(set, std::string("__metadata__[\"") + kExecOrderMetadataKey + "\"]");
  return set;
}

// A directory of .npy files. TroubleShooter's ts.save names them "{id}_{name}.npy" (id counting
// ts.save calls from 0 in execution order; a list, tuple or dict adds ".{idx}" or ".{key}" to the name,
// and suffix=S appends "_S"): with every file numbered, the ids are a recorded order, and files of one
// call keep the ResNet-50 order of their names. Without numbering nothing is recorded.
TensorSet load_npy_dir(const fs::path& dir) {
  struct Entry {
    fs::path path;
    std::optional<std::uint64_t> id;
    std::string name;
  };
  std::vector<Entry> entries;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    if (!de.is_regular_file() || lower_extension(de.path()) != ".npy") continue;
    const std::string stem = de.path().stem().string();
    Entry e{de.path(), std::nullopt, stem};
    const auto underscore = stem.find('_');
    if (underscore != std::string::npos && underscore > 0 && underscore + 1 < stem.size() &&
        std::all_of(stem.begin(), stem.begin() + static_cast<std::ptrdiff_t>(underscore),
                    [](unsigned char c) { return std::isdigit(c) != 0; }) &&
        underscore <= 18) {
      e.id = std::stoull(stem.substr(0, underscore));
      e.name = stem.substr(underscore + 1);
    }
    entries.push_back(std::move(e));
  }
  if (ec) throw CompareError(dir.string() + ": cannot list the directory (" + ec.message() + ")");
  if (entries.empty()) throw CompareError(dir.string() + ": the directory holds no .npy files");
  const bool numbered = std::all_of(entries.begin(), entries.end(), [](const Entry& e) { return e.id.has_value(); });
  if (!numbered) {
    for (auto& e : entries) e.name = e.path.stem().string();
  }
  // ts.save's suffix=S ends every name in "_S": when all of them share one such ending (S without
  // dots or underscores), it is the suffix, not part of the names.
  std::string suffix;
  if (numbered) {
    const std::string& first = entries.front().name;
    const auto cut = first.rfind('_');
    if (cut != std::string::npos && cut > 0 && cut + 1 < first.size() &&
        first.find('.', cut) == std::string::npos) {
      const std::string tail = first.substr(cut);
      const bool shared = std::all_of(entries.begin(), entries.end(), [&](const Entry& e) {
        return e.name.size() > tail.size() && e.name.compare(e.name.size() - tail.size(), tail.size(), tail) == 0;
      });
      if (shared && entries.size() > 1) {
        suffix = tail;
        for (auto& e : entries) e.name.resize(e.name.size() - tail.size());
      }
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) { return x.path.filename() < y.path.filename(); });
  TensorSet set;
  set.source = dir.string();
  for (auto& e : entries) {
    NamedTensor nt;
    nt.key = e.name;
    nt.tensor = store::read_npy(e.path);
    nt.tensor.name = nt.key;
    set.tensors.push_back(std::move(nt));
  }
  if (!numbered) {
    derive_exec_order(set, "no order recorded (.npy files without TroubleShooter's {id}_ numbering)");
    return set;
  }
  // Within one id (one ts.save call of a list or dict) the ResNet-50 order of the names, then the name.
  std::vector<std::size_t> order(set.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto key_of = [&](std::size_t i) {
    const auto rank = resnet50_forward_rank(base_name(set.tensors[i].key));
    return std::tuple{*entries[i].id, rank ? 0 : 1, rank ? *rank : 0};
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return key_of(x) < key_of(y); });
  for (std::size_t pos = 0; pos < order.size(); ++pos) set.tensors[order[pos]].exec_order = static_cast<std::int64_t>(pos);
  recorded_order(set, "TroubleShooter's file numbering" +
                          (suffix.empty() ? std::string() : ", suffix \"" + suffix.substr(1) + "\" left out of the names"));
  return set;
}

// msprobe's dtype spellings: PyTorch's "torch.float32", MindSpore's "Float32".
std::optional<store::DType> msprobe_dtype(const std::string& text) {
  std::string t = text;
  if (t.rfind("torch.", 0) == 0) t = t.substr(6);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "float32" || t == "float") return store::DType::F32;
  if (t == "float64" || t == "double") return store::DType::F64;
  if (t == "float16" || t == "half") return store::DType::F16;
  if (t == "bfloat16") return store::DType::BF16;
  if (t == "int32" || t == "int") return store::DType::I32;
  if (t == "int64" || t == "long") return store::DType::I64;
  if (t == "uint8") return store::DType::U8;
  if (t == "bool") return store::DType::BOOL;
  return std::nullopt;
}

// A dotted msprobe key ("Module.layer1.0.conv1.Conv2d.forward.0") split at its dots.
std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
    parts.push_back(key.substr(start, dot - start));
  }
  parts.push_back(key.substr(start));
  return parts;
}

// parts[from, to) joined with dots.
std::string join_parts(const std::vector<std::string>& parts, std::size_t from, std::size_t to) {
  std::string s;
  for (std::size_t i = from; i < to; ++i) s += (i > from ? "." : "") + parts[i];
  return s;
}

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// A module's forward call: Module.<path>.<class>.forward.<n>.
bool is_module_forward(const std::vector<std::string>& parts) {
  return parts.size() >= 5 && parts[0] == "Module" && parts[parts.size() - 2] == "forward" && is_number(parts.back());
}

// msprobe's dump.json, checked to be an object with "data"; its order is the order the entries ran.
nlohmann::ordered_json read_msprobe_dump(const fs::path& json_path, const std::string& where) {
  std::ifstream in(json_path);
  if (!in) throw CompareError(where + ": cannot open msprobe's dump.json");
  nlohmann::ordered_json dump;  // the order of "data" is the order the entries ran
  try {
    dump = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!dump.is_object() || !dump.contains("data") || !dump["data"].is_object()) {
    throw CompareError(where + ": expected msprobe's dump.json, an object with \"task\", \"level\" and \"data\"");
  }
  return dump;
}

// Forward calls per module path: act.<path>.<n> for modules that ran more than once.
std::map<std::string, int> count_forward_calls(const nlohmann::ordered_json& data) {
  std::map<std::string, int> forward_calls;
  for (const auto& [key, value] : data.items()) {
    const auto parts = split_key(key);
    if (is_module_forward(parts)) ++forward_calls[join_parts(parts, 1, parts.size() - 3)];
  }
  return forward_calls;
}

// The tensors of msprobe's dump.json entries, gathered in the order the entries ran.
struct MsprobeTensors {
  std::string where;  // dump.json, for errors
  std::string task;   // "tensor" (values in .npy files) or "statistics"
  fs::path data_dir;  // the .npy files
  std::map<std::string, int> forward_calls;
  TensorSet set;
  std::set<std::string> seen;
  std::int64_t skipped_backward = 0, stats_only = 0;

  // The statistics msprobe recorded for an entry (without them the entry cannot be compared).
  RecordedStats recorded_stats(const nlohmann::ordered_json& entry, const std::string& what) const {
    RecordedStats st;
    for (const auto& [field, target] : {std::pair<const char*, double*>{"Max", &st.max}, {"Min", &st.min},
                                        {"Mean", &st.mean}, {"Norm", &st.norm}}) {
      if (!entry.contains(field) || !entry[field].is_number()) {
        throw CompareError(where + ": " + what + " has no number \"" + field + "\" (and no .npy data to read)");
      }
      *target = entry[field].get<double>();
    }
    return st;
  }

  // The entry's values from its .npy file when the task dumped them, else its statistics.
  void read_values(NamedTensor& nt, const nlohmann::ordered_json& entry, const std::string& what) {
    const std::string data_name = entry.contains("data_name") && entry["data_name"].is_string()
                                      ? entry["data_name"].get<std::string>() : std::string();
    const fs::path file = data_dir / data_name;
    if (task == "tensor" && !data_name.empty() && lower_extension(file) == ".npy" && fs::exists(file)) {
      store::HostTensor t = store::read_npy(file);
      if (t.numel() != nt.tensor.numel()) {
        throw CompareError(file.string() + ": holds " + std::to_string(t.numel()) + " elements, dump.json's " + what +
                           " says " + std::to_string(nt.tensor.numel()));
      }
      t.name = nt.key;
      t.shape = nt.tensor.shape;
      nt.tensor = std::move(t);
    } else {
      if (task == "tensor" && !data_name.empty() && lower_extension(file) == ".npy") {
        throw CompareError(where + ": " + what + "'s data file " + file.string() + " is missing");
      }
      nt.stats = recorded_stats(entry, what);
      ++stats_only;
    }
  }

  // Adds a tensor entry under `name` (the first entry of a name wins); other entries (ints, None, ...)
  // are left out.
  void add(const std::string& name, const nlohmann::ordered_json& entry, const std::string& what) {
    if (!entry.is_object()) return;
    const std::string type = entry.value("type", std::string());
    if (type.size() < 6 || type.compare(type.size() - 6, 6, "Tensor") != 0) return;  // ints, None, ...
    if (!seen.insert(name).second) return;
    NamedTensor nt;
    nt.key = name;
    nt.exec_order = static_cast<std::int64_t>(set.tensors.size());
    const auto dtype = msprobe_dtype(entry.value("dtype", std::string()));
    if (!dtype) {
      throw CompareError(where + ": " + what + " has dtype " + entry.value("dtype", std::string("(none)")) +
                         " (expected a float, int, uint8 or bool dtype)");
    }
    if (!entry.contains("shape") || !entry["shape"].is_array()) throw CompareError(where + ": " + what + " has no shape");
    nt.tensor.name = name;
    nt.tensor.dtype = *dtype;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) throw CompareError(where + ": " + what + " has a bad shape");
      nt.tensor.shape.push_back(d.get<std::int64_t>());
    }
    read_values(nt, entry, what);
    set.tensors.push_back(std::move(nt));
  }

  // One entry of "data": a module's forward call (its output and parameters), a module's parameter
  // gradients, an API call's outputs; backward entries are counted and left out.
  void add_entry(const std::string& key, const nlohmann::ordered_json& value) {
    const auto parts = split_key(key);
    const bool module = parts.size() >= 4 && parts[0] == "Module";
    if (module && is_module_forward(parts)) {
      const std::string path_name = join_parts(parts, 1, parts.size() - 3);
      const std::string act = "act." + path_name + (forward_calls[path_name] > 1 ? "." + parts.back() : "");
      if (value.contains("output") && value["output"].is_array() && !value["output"].empty()) {
        add(act, value["output"][0], key + " output");
      } else if (value.contains("output") && value["output"].is_object()) {
        add(act, value["output"], key + " output");
      }
      if (value.contains("parameters") && value["parameters"].is_object()) {
        for (const auto& [pname, p] : value["parameters"].items()) add("param." + path_name + "." + pname, p, key + " " + pname);
      }
    } else if (module && (parts.back() == "parameters_grad" || parts[parts.size() - 2] == "parameters_grad")) {
      const std::size_t end = parts.back() == "parameters_grad" ? parts.size() - 2 : parts.size() - 3;
      const std::string path_name = join_parts(parts, 1, end);
      if (!value.is_object()) return;
      for (const auto& [pname, g] : value.items()) {
        add("grad." + path_name + "." + pname, g.is_array() && !g.empty() ? g[0] : g, key + " " + pname);
      }
    } else if (key.find(".backward") != std::string::npos) {
      ++skipped_backward;
    } else if (value.is_object() && value.contains("output")) {
      const auto& out = value["output"];
      if (out.is_array()) {
        for (std::size_t i = 0; i < out.size(); ++i) add(key + ".output." + std::to_string(i), out[i], key + " output");
      } else {
        add(key + ".output.0", out, key + " output");
      }
    }
  }
};

TensorSet load_msprobe(const fs::path& path) {
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  const fs::path json_path = fs::is_directory(path) ? path / "dump.json" : path;
  MsprobeTensors m;
  m.where = json_path.string();
  nlohmann::ordered_json dump = read_msprobe_dump(json_path, m.where);
  m.task = dump.value("task", std::string());
  if (m.task != "tensor" && m.task != "statistics") {
    throw CompareError(m.where + ": task \"" + m.task + "\" (expected \"tensor\" or \"statistics\")");
  }
  m.data_dir = dir / "dump_tensor_data";
  if (!fs::is_directory(m.data_dir) && dump.contains("dump_data_dir") && dump["dump_data_dir"].is_string()) {
    m.data_dir = dump["dump_data_dir"].get<std::string>();
  }
  m.set.source = dir.string();
  m.forward_calls = count_forward_calls(dump["data"]);
  for (const auto& [key, value] : dump["data"].items()) m.add_entry(key, value);
  if (m.set.tensors.empty()) {
    throw CompareError(m.where + ": no tensors in \"data\" (expected module or API entries with outputs)");
  }
  std::string origin = "msprobe's dump.json order";
  if (m.stats_only > 0) origin += ", " + std::to_string(m.stats_only) + " tensor(s) with statistics only";
  if (m.skipped_backward > 0) origin += ", " + std::to_string(m.skipped_backward) + " backward entries left out";
  recorded_order(m.set, origin);
  return std::move(m.set);
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
  recorded_order(set, "the run file's exec_order");
  // Our own float32 noise on this dump, when `wb estimate-noise` recorded it (noise_estimate.hpp).
  const std::string noise_key = noise_estimate_key(*step, *rank);
  if (const auto meta = reader.meta(); meta.count(noise_key)) {
    read_noise(set, meta.at(noise_key), path.string() + ": meta " + noise_key);
  }
  return set;
}

}  // namespace

SetFormat detect_format(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw CompareError(path.string() + ": no such file or directory");
  if (fs::is_directory(status)) return fs::exists(path / "dump.json") ? SetFormat::msprobe : SetFormat::npy_dir;
  if (path.filename() == "dump.json") return SetFormat::msprobe;
  if (has_sqlite_magic(path)) return SetFormat::run_file;
  const std::string ext = lower_extension(path);
  if (ext == ".safetensors") return SetFormat::safetensors;
  if (ext == ".npz") return SetFormat::npz;
  if (ext == ".npy") return SetFormat::npy;
  if (ext == ".pt" || ext == ".pth") {
    throw CompareError(path.string() + ": a torch.save pickle, which wb does not read; convert it first with "
                       "/usr/bin/python3 compare/reference/torch_save_to_safetensors.py " + path.string() +
                       " --out REF.safetensors");
  }
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
      derive_exec_order(set, "no order recorded (.npz)");
      break;
    case SetFormat::npy: {
      std::vector<store::HostTensor> one;
      one.push_back(store::read_npy(path));
      set = from_host_tensors(path, std::move(one));
      derive_exec_order(set, "no order recorded (.npy)");
      break;
    }
    case SetFormat::npy_dir:
      set = load_npy_dir(path);
      break;
    case SetFormat::msprobe:
      set = load_msprobe(path);
      break;
  }
  set.index();
  return set;
}

}  // namespace wb::compare
