// Tensor-file basics shared by every format (dtypes, errors, file helpers), directory reading
// and format dispatch. The formats themselves live in npy.cpp, npz.cpp and safetensors.cpp.
#include "store/tensor_file.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <limits>

#include "store/one_line.hpp"
#include "store/tensor_file_detail.hpp"

namespace wb::store {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
  std::string_view descr;  // empty: no numpy equivalent
};

constexpr std::array<DTypeInfo, 8> kDTypes{{
    {DType::F32, "F32", 4, "<f4"},
    {DType::F64, "F64", 8, "<f8"},
    {DType::F16, "F16", 2, "<f2"},
    {DType::BF16, "BF16", 2, ""},
    {DType::I32, "I32", 4, "<i4"},
    {DType::I64, "I64", 8, "<i8"},
    {DType::U8, "U8", 1, "|u1"},
    {DType::BOOL, "BOOL", 1, "|b1"},
}};

const DTypeInfo& info_of(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  // Only reachable with a value cast from outside the enum's range.
  throw std::invalid_argument("wb::store: invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

std::string lower_extension(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

}  // namespace

std::string_view dtype_name(DType dtype) { return info_of(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::size_t dtype_size(DType dtype) { return info_of(dtype).size; }

std::optional<std::string_view> numpy_descr(DType dtype) {
  const auto& info = info_of(dtype);
  if (info.descr.empty()) return std::nullopt;
  return info.descr;
}

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

TensorFileError::TensorFileError(const std::filesystem::path& file, const std::string& what)
    : std::runtime_error(one_line(file.string() + ": " + what)), file_(file) {}

namespace detail {

std::ifstream open_for_read(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw TensorFileError(path, "is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TensorFileError(path, "cannot open for reading (missing or unreadable)");
  return in;
}

std::uint64_t file_size_of(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw TensorFileError(path, "cannot determine file size: " + ec.message());
  return size;
}

std::ofstream open_for_write(const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw TensorFileError(path, "cannot open for writing");
  return out;
}

void finish_write(std::ofstream& out, const std::filesystem::path& path) {
  out.flush();
  const bool ok = static_cast<bool>(out);
  out.close();
  if (!ok || out.fail()) throw TensorFileError(path, "write failed (disk full or I/O error)");
}

std::uint64_t checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype,
                             const std::filesystem::path& file, const std::string& where) {
  std::uint64_t n = dtype_size(dtype);
  bool zero = false;
  for (std::int64_t d : shape) {
    if (d < 0) throw TensorFileError(file, where + "negative dimension " + std::to_string(d) + " in shape");
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  for (std::int64_t d : shape) {
    const auto ud = static_cast<std::uint64_t>(d);
    if (n > std::numeric_limits<std::uint64_t>::max() / ud) {
      throw TensorFileError(file, where + "shape's byte size overflows 64 bits");
    }
    n *= ud;
  }
  return n;
}

void check_tensor_size(const HostTensor& tensor, const std::filesystem::path& file) {
  const std::string where = "tensor '" + tensor.name + "': ";
  const std::uint64_t expected = checked_nbytes(tensor.shape, tensor.dtype, file, where);
  if (tensor.data.size() != expected) {
    throw TensorFileError(file, where + "has " + std::to_string(tensor.data.size()) + " data bytes, expected " +
                                    std::to_string(expected) + " for its shape and dtype " +
                                    std::string(dtype_name(tensor.dtype)));
  }
}

}  // namespace detail

std::vector<HostTensor> read_tensor_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw TensorFileError(dir, "not a directory of .npy files");

  struct Entry {
    std::filesystem::path path;
    std::uint64_t index;  // TroubleShooter's order; max() when the name has none
    std::string name;
  };
  std::vector<Entry> entries;
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    if (!de.is_regular_file() || lower_extension(de.path()) != ".npy") continue;
    const std::string stem = de.path().stem().string();
    Entry e{de.path(), std::numeric_limits<std::uint64_t>::max(), stem};
    const auto underscore = stem.find('_');
    if (underscore != std::string::npos && underscore > 0 && underscore + 1 < stem.size()) {
      std::uint64_t index = 0;
      const char* first = stem.data();
      const char* last = stem.data() + underscore;
      const auto [ptr, err] = std::from_chars(first, last, index);
      if (err == std::errc() && ptr == last) {
        e.index = index;
        e.name = stem.substr(underscore + 1);
      }
    }
    entries.push_back(std::move(e));
  }
  if (ec) throw TensorFileError(dir, "cannot list directory: " + ec.message());
  if (entries.empty()) throw TensorFileError(dir, "no .npy files in directory");

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.index != b.index) return a.index < b.index;
    return a.path.filename() < b.path.filename();
  });
  std::vector<HostTensor> tensors;
  tensors.reserve(entries.size());
  for (auto& e : entries) {
    HostTensor t = read_npy(e.path);
    t.name = std::move(e.name);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<HostTensor> read_any(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return read_tensor_dir(path);
  const std::string ext = lower_extension(path);
  if (ext == ".npy") {
    std::vector<HostTensor> one;
    one.push_back(read_npy(path));
    return one;
  }
  if (ext == ".npz") return read_npz(path);
  if (ext == ".safetensors") return read_safetensors(path);
  throw TensorFileError(path, "unknown tensor file type '" + ext +
                                  "', expected .npy, .npz, .safetensors or a directory of .npy files");
}

}  // namespace wb::store
