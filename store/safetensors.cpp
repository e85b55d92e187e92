// .safetensors reading and writing: u64 LE header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the packed data.
// Validation follows the reference implementation, so a file we accept is one it accepts.
#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <span>

#include <nlohmann/json.hpp>

#include "store/tensor_file.hpp"
#include "store/tensor_file_detail.hpp"

namespace wb::store {

namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::uint64_t kMaxHeader = 100'000'000;  // the reference's MAX_HEADER_SIZE
constexpr const char* kMetadataKey = "__metadata__";

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin;
  std::uint64_t end;
};

TensorInfo parse_info(const std::string& name, const OrderedJson& v, const std::filesystem::path& file) {
  const std::string where = "tensor '" + name + "': ";
  if (!v.is_object()) throw TensorFileError(file, where + "header entry is not an object");
  auto field = [&](const char* key) -> const OrderedJson& {
    const auto it = v.find(key);
    if (it == v.end()) throw TensorFileError(file, where + "header entry lacks \"" + key + "\"");
    return *it;
  };
  TensorInfo info{name, DType::F32, {}, 0, 0};
  const OrderedJson& dtype = field("dtype");
  if (!dtype.is_string()) throw TensorFileError(file, where + "\"dtype\" is not a string");
  const auto d = dtype_from_name(dtype.get<std::string>());
  if (!d) {
    throw TensorFileError(file, where + "unsupported dtype '" + dtype.get<std::string>() +
                                    "' (supported: F32, F64, F16, BF16, I32, I64, U8, BOOL)");
  }
  info.dtype = *d;
  const OrderedJson& shape = field("shape");
  if (!shape.is_array()) throw TensorFileError(file, where + "\"shape\" is not an array");
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned()) throw TensorFileError(file, where + "\"shape\" holds a non-integer or negative value");
    const auto u = dim.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) throw TensorFileError(file, where + "dimension too large");
    info.shape.push_back(static_cast<std::int64_t>(u));
  }
  const OrderedJson& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw TensorFileError(file, where + "\"data_offsets\" must be two non-negative integers [begin, end]");
  }
  info.begin = offsets[0].get<std::uint64_t>();
  info.end = offsets[1].get<std::uint64_t>();
  return info;
}

std::string range_text(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
}

}  // namespace

std::vector<HostTensor> read_safetensors(const std::filesystem::path& path,
                                         std::map<std::string, std::string>* metadata) {
  std::ifstream in = detail::open_for_read(path);
  const std::uint64_t file_size = detail::file_size_of(path);
  if (file_size < 8) {
    throw TensorFileError(path, "truncated: " + std::to_string(file_size) +
                                    " bytes, expected at least 8 for the safetensors header length");
  }
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b) header_len = (header_len << 8) | len_bytes[b];
  if (header_len > kMaxHeader) {
    throw TensorFileError(path, "safetensors header length " + std::to_string(header_len) +
                                    " exceeds the 100 MB limit (corrupt file, or not safetensors)");
  }
  if (header_len > file_size - 8) {
    throw TensorFileError(path, "truncated: safetensors header length " + std::to_string(header_len) +
                                    " but only " + std::to_string(file_size - 8) + " bytes follow");
  }
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  if (static_cast<std::uint64_t>(in.gcount()) != header_len) throw TensorFileError(path, "read failed (I/O error)");

  OrderedJson header;
  try {
    header = OrderedJson::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw TensorFileError(path, std::string("safetensors header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw TensorFileError(path, "safetensors header is not a JSON object");

  std::vector<TensorInfo> infos;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) throw TensorFileError(path, "\"__metadata__\" is not an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) throw TensorFileError(path, "\"__metadata__\" value for '" + mk + "' is not a string");
        if (metadata) (*metadata)[mk] = mv.get<std::string>();
      }
      continue;
    }
    infos.push_back(parse_info(key, value, path));
  }

  // Data order is file order; a stable sort keeps header order among empty tensors at one offset.
  std::stable_sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const std::uint64_t data_size = file_size - 8 - header_len;
  std::uint64_t expected_begin = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : infos) {
    const std::string where = "tensor '" + t.name + "': ";
    if (t.end < t.begin) throw TensorFileError(path, where + "data_offsets " + range_text(t) + " end before they begin");
    if (t.end > data_size) {
      throw TensorFileError(path, where + "data_offsets " + range_text(t) + " run past the " +
                                      std::to_string(data_size) + "-byte data buffer (truncated file or bad offsets)");
    }
    const std::uint64_t nbytes = detail::checked_nbytes(t.shape, t.dtype, path, where);
    if (t.end - t.begin != nbytes) {
      throw TensorFileError(path, where + "data_offsets " + range_text(t) + " span " + std::to_string(t.end - t.begin) +
                                      " bytes, but its shape and dtype " + std::string(dtype_name(t.dtype)) +
                                      " need " + std::to_string(nbytes));
    }
    if (t.begin < expected_begin) {
      throw TensorFileError(path, where + "data_offsets " + range_text(t) + " overlap tensor '" + previous->name +
                                      "' " + range_text(*previous));
    }
    if (t.begin > expected_begin) {
      throw TensorFileError(path, where + "data_offsets " + range_text(t) + " leave a gap of " +
                                      std::to_string(t.begin - expected_begin) + " bytes before it");
    }
    expected_begin = t.end;
    previous = &t;
  }
  if (expected_begin != data_size) {
    throw TensorFileError(path, "data buffer has " + std::to_string(data_size) + " bytes but the tensors cover " +
                                    std::to_string(expected_begin));
  }

  std::vector<HostTensor> tensors;
  tensors.reserve(infos.size());
  for (TensorInfo& info : infos) {
    HostTensor t;
    t.name = std::move(info.name);
    t.dtype = info.dtype;
    t.shape = std::move(info.shape);
    t.data.resize(info.end - info.begin);
    in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    if (static_cast<std::uint64_t>(in.gcount()) != t.data.size()) {
      throw TensorFileError(path, "tensor '" + t.name + "': read failed (I/O error)");
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

namespace {

// Returns the data of tensor `index`; `holder` keeps fetched bytes alive until the next call.
using DataView = std::function<std::span<const std::byte>(std::size_t index, std::vector<std::byte>& holder)>;

void write_safetensors_core(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                            const DataView& data_of, const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> names;
  std::vector<std::uint64_t> sizes;
  std::uint64_t offset = 0;
  for (const TensorSpec& t : specs) {
    if (t.name.empty() || t.name == kMetadataKey) {
      throw TensorFileError(path, "invalid tensor name '" + t.name + "' (empty or reserved)");
    }
    if (!names.insert(t.name).second) throw TensorFileError(path, "duplicate tensor name '" + t.name + "'");
    sizes.push_back(detail::checked_nbytes(t.shape, t.dtype, path, "tensor '" + t.name + "': "));
    header[t.name] = OrderedJson{{"dtype", dtype_name(t.dtype)},
                                 {"shape", t.shape},
                                 {"data_offsets", {offset, offset + sizes.back()}}};
    offset += sizes.back();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    throw TensorFileError(path, std::string("a tensor name or metadata string is not valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the reference pads so the data start 8-aligned

  std::ofstream out = detail::open_for_write(path);
  try {
    unsigned char len_bytes[8];
    for (int b = 0; b < 8; ++b) len_bytes[b] = static_cast<unsigned char>((text.size() >> (8 * b)) & 0xFF);
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<std::byte> holder;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::span<const std::byte> data = data_of(i, holder);
      if (data.size() != sizes[i]) {
        throw TensorFileError(path, "tensor '" + specs[i].name + "': has " + std::to_string(data.size()) +
                                        " data bytes, expected " + std::to_string(sizes[i]) +
                                        " for its shape and dtype " + std::string(dtype_name(specs[i].dtype)));
      }
      out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    }
    detail::finish_write(out, path);
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw;
  }
}

}  // namespace

void write_safetensors(const std::filesystem::path& path, const std::vector<HostTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const HostTensor& t : tensors) {
    detail::check_tensor_size(t, path);  // before the file is created
    specs.push_back({t.name, t.dtype, t.shape});
  }
  write_safetensors_core(
      path, specs,
      [&](std::size_t i, std::vector<std::byte>&) { return std::span<const std::byte>(tensors[i].data); }, metadata);
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                       const TensorDataFn& fetch, const std::map<std::string, std::string>& metadata) {
  write_safetensors_core(
      path, specs,
      [&](std::size_t i, std::vector<std::byte>& holder) {
        holder = fetch(i);
        return std::span<const std::byte>(holder);
      },
      metadata);
}

}  // namespace wb::store
