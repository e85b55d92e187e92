// Tensor files: .npy (v1.0-v3.0), .npz (zip of .npy, stored or deflated), .safetensors, and
// directories of .npy files as TroubleShooter writes them. This is how dumps leave the run file
// (`wb export`) and how a PyTorch or MindSpore dump comes in for comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wb::store {

enum class DType { F32, F64, F16, BF16, I32, I64, U8, BOOL };

// The name as safetensors spells it: "F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; std::nullopt for a name we do not support (e.g. "I8", "F8_E4M3").
std::optional<DType> dtype_from_name(std::string_view name);
std::size_t dtype_size(DType dtype);
// The little-endian numpy descr ('<f4', '|u1', '|b1', ...); std::nullopt for BF16, which numpy lacks.
std::optional<std::string_view> numpy_descr(DType dtype);

// One tensor on the host: data are little-endian, C-order, exactly numel() * dtype_size(dtype) bytes.
struct HostTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;  // empty: a 0-d tensor with one element
  std::vector<std::byte> data;

  std::int64_t numel() const;
};

// Every malformed, truncated or unsupported tensor file; what() names the file and what was expected.
class TensorFileError : public std::runtime_error {
 public:
  TensorFileError(const std::filesystem::path& file, const std::string& what);
  const std::filesystem::path& file() const noexcept { return file_; }

 private:
  std::filesystem::path file_;
};

// .npy. Reads versions 1.0, 2.0 and 3.0; Fortran-order arrays are transposed into C-order and
// big-endian ones byte-swapped. The tensor's name is the file's stem. Writes version 1.0 (2.0 when
// the header does not fit 64 KiB) with numpy's header layout and 64-byte data alignment.
HostTensor read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, const HostTensor& tensor);

// .npz: a zip of NAME.npy entries, read in archive order. Entries may be stored or deflated; each
// entry's CRC-32 is checked. zip64 is not supported, so an archive over 4 GB is an error.
std::vector<HostTensor> read_npz(const std::filesystem::path& path);
void write_npz(const std::filesystem::path& path, const std::vector<HostTensor>& tensors, bool compress);

// .safetensors, returned in data order. The header is validated the way the reference
// implementation does: at most 100 MB, known dtypes, offsets in range, sized by shape, and
// tensors covering the data buffer without overlaps or gaps. `metadata` receives "__metadata__".
std::vector<HostTensor> read_safetensors(const std::filesystem::path& path,
                                         std::map<std::string, std::string>* metadata = nullptr);
// Tensors are laid out in the given order; the header is padded with spaces to a multiple of 8.
void write_safetensors(const std::filesystem::path& path, const std::vector<HostTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor without its data, for writers that fetch the data one tensor at a time.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
};
// Returns the data of specs[index]; called once per tensor, in order.
using TensorDataFn = std::function<std::vector<std::byte>(std::size_t index)>;
// The same file as write_safetensors, but only one tensor's data is in memory at a time, so a dump
// larger than memory can be exported. A wrong-sized fetch is an error, and leaves no file behind.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                       const TensorDataFn& fetch, const std::map<std::string, std::string>& metadata = {});

// A directory of .npy files (not recursive). TroubleShooter's "{index}_{name}.npy" files are
// ordered by index and named "{name}"; other files follow, sorted by file name, named by stem.
std::vector<HostTensor> read_tensor_dir(const std::filesystem::path& dir);

// Dispatches on a directory or the extension (.npy, .npz, .safetensors).
std::vector<HostTensor> read_any(const std::filesystem::path& path);

}  // namespace wb::store
