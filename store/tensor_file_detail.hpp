// Internals shared by the tensor-file readers and writers (npy.cpp, npz.cpp, safetensors.cpp,
// tensor_file.cpp). Not part of the store's public API.
#pragma once

#include "store/tensor_file.hpp"

#include <cstdint>
#include <fstream>
#include <string>

namespace wb::store::detail {

// A forward-only stream of bytes with a known length: a plain file, or one entry of a zip archive
// (inflated on the fly). The npy decoder reads through it so array data land directly in the
// tensor's buffer, without an intermediate copy of the whole file.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads exactly n bytes or throws TensorFileError (truncated).
  virtual void read(std::byte* dst, std::uint64_t n) = 0;
  virtual std::uint64_t remaining() const = 0;
};

// Opens `path` for binary reading; throws TensorFileError when it cannot.
std::ifstream open_for_read(const std::filesystem::path& path);
std::uint64_t file_size_of(const std::filesystem::path& path);
// Opens `path` for binary writing (truncating); throws TensorFileError when it cannot.
std::ofstream open_for_write(const std::filesystem::path& path);
// Flushes and closes, throwing TensorFileError when any write failed (a full disk, say).
void finish_write(std::ofstream& out, const std::filesystem::path& path);

// numel * element size, checked: dims non-negative, no overflow. `where` prefixes messages.
std::uint64_t checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype,
                             const std::filesystem::path& file, const std::string& where);
// Throws unless tensor.data.size() matches its shape and dtype.
void check_tensor_size(const HostTensor& tensor, const std::filesystem::path& file);

// Decodes one .npy stream. `where` is prepended to messages ("entry 'x.npy': " inside an npz).
HostTensor decode_npy(ByteSource& src, const std::filesystem::path& file, const std::string& where,
                      std::string name);
// The complete .npy header (magic, version, length, dict, padding): the data follow it directly.
std::string encode_npy_header(const HostTensor& tensor, const std::filesystem::path& file);

}  // namespace wb::store::detail
