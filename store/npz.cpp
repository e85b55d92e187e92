// .npz reading and writing: a zip archive of NAME.npy entries, as numpy.savez (stored) and
// numpy.savez_compressed (deflated) write it. Only the parts of the zip format those files use are
// handled: the central directory is the source of truth for sizes and CRCs (numpy's local headers
// carry zip64 placeholders), entries are stored or raw deflate, and zip64 is refused clearly.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <zlib.h>

#include "store/tensor_file.hpp"
#include "store/tensor_file_detail.hpp"

namespace wb::store {

namespace {

constexpr std::uint32_t kLocalSig = 0x04034b50;
constexpr std::uint32_t kCentralSig = 0x02014b50;
constexpr std::uint32_t kEndSig = 0x06054b50;
constexpr std::size_t kLocalLen = 30;
constexpr std::size_t kCentralLen = 46;
constexpr std::size_t kEndLen = 22;
constexpr std::uint64_t kZip32Max = 0xFFFFFFFFull;
constexpr std::uint16_t kMethodStored = 0;
constexpr std::uint16_t kMethodDeflate = 8;
constexpr std::uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // fixed, so equal inputs give equal files
constexpr std::size_t kChunk = 1 << 18;
constexpr std::uint64_t kMaxZlibChunk = 1u << 30;  // zlib counts in 32-bit uInt
const std::string kZip64Message = "zip64 archives (over 4 GB or 65535 entries) are not supported";

std::uint16_t u16_at(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) | (std::to_integer<unsigned>(p[1]) << 8));
}
std::uint32_t u32_at(const std::byte* p) {
  return static_cast<std::uint32_t>(u16_at(p)) | (static_cast<std::uint32_t>(u16_at(p + 2)) << 16);
}
void put_u16(std::string& out, std::uint64_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>((v >> 8) & 0xFF));
}
void put_u32(std::string& out, std::uint64_t v) {
  put_u16(out, v & 0xFFFF);
  put_u16(out, (v >> 16) & 0xFFFF);
}

std::uint32_t crc_update(std::uint32_t crc, const std::byte* p, std::uint64_t n) {
  if (n == 0) return crc;  // zlib answers 0 for a null buffer, and an empty vector's data() may be null
  return static_cast<std::uint32_t>(crc32_z(crc, reinterpret_cast<const Bytef*>(p), static_cast<z_size_t>(n)));
}

void read_exact(std::ifstream& in, std::uint64_t offset, std::byte* dst, std::uint64_t n,
                const std::filesystem::path& file, const std::string& what) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != n) throw TensorFileError(file, "truncated while reading " + what);
}

struct CentralEntry {
  std::string name;
  std::uint16_t flags = 0;
  std::uint16_t method = 0;
  std::uint32_t crc = 0;
  std::uint64_t csize = 0;
  std::uint64_t usize = 0;
  std::uint64_t local_offset = 0;
};

// One zip entry's uncompressed bytes, stored or inflated on the fly, with a running CRC-32.
class ZipEntrySource final : public detail::ByteSource {
 public:
  ZipEntrySource(std::ifstream& in, const CentralEntry& e, const std::filesystem::path& file, std::string where)
      : in_(in), entry_(e), file_(file), where_(std::move(where)), compressed_left_(e.csize), remaining_(e.usize) {
    if (e.method == kMethodDeflate) {
      std::memset(&zs_, 0, sizeof(zs_));
      if (inflateInit2(&zs_, -MAX_WBITS) != Z_OK) throw TensorFileError(file_, where_ + "zlib inflateInit2 failed");
      inflating_ = true;
      inbuf_.resize(kChunk);
    }
  }
  ~ZipEntrySource() override {
    if (inflating_) inflateEnd(&zs_);
  }
  ZipEntrySource(const ZipEntrySource&) = delete;
  ZipEntrySource& operator=(const ZipEntrySource&) = delete;

  void read(std::byte* dst, std::uint64_t n) override {
    if (n > remaining_) throw TensorFileError(file_, where_ + "truncated: entry ends early");
    if (inflating_) {
      inflate_into(dst, n);
    } else {
      in_.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
      if (static_cast<std::uint64_t>(in_.gcount()) != n) throw TensorFileError(file_, where_ + "truncated entry data");
    }
    crc_ = crc_update(crc_, dst, n);
    remaining_ -= n;
  }
  std::uint64_t remaining() const override { return remaining_; }

  // Consumes what the npy decoder left (numpy ignores trailing bytes too) and checks the CRC.
  void finish() {
    std::vector<std::byte> scratch(static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, kChunk)));
    while (remaining_ > 0) read(scratch.data(), std::min<std::uint64_t>(remaining_, scratch.size()));
    if (crc_ != entry_.crc) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "CRC-32 mismatch (computed %08x, expected %08x)", crc_, entry_.crc);
      throw TensorFileError(file_, where_ + buf + ": the archive is corrupt");
    }
  }

 private:
  void inflate_into(std::byte* dst, std::uint64_t n) {
    while (n > 0) {
      const std::uint64_t chunk = std::min(n, kMaxZlibChunk);
      zs_.next_out = reinterpret_cast<Bytef*>(dst);
      zs_.avail_out = static_cast<uInt>(chunk);
      while (zs_.avail_out > 0) {
        if (zs_.avail_in == 0) {
          if (compressed_left_ == 0) throw TensorFileError(file_, where_ + "truncated deflate stream");
          const std::uint64_t k = std::min<std::uint64_t>(compressed_left_, inbuf_.size());
          in_.read(reinterpret_cast<char*>(inbuf_.data()), static_cast<std::streamsize>(k));
          if (static_cast<std::uint64_t>(in_.gcount()) != k) throw TensorFileError(file_, where_ + "truncated entry data");
          compressed_left_ -= k;
          zs_.next_in = reinterpret_cast<Bytef*>(inbuf_.data());
          zs_.avail_in = static_cast<uInt>(k);
        }
        const int rc = inflate(&zs_, Z_NO_FLUSH);
        if (rc == Z_STREAM_END && zs_.avail_out > 0) {
          throw TensorFileError(file_, where_ + "deflate stream ends before the entry's declared size");
        }
        if (rc != Z_OK && rc != Z_STREAM_END) {
          throw TensorFileError(file_, where_ + "corrupt deflate data (" + (zs_.msg ? zs_.msg : "zlib error") + ")");
        }
      }
      dst += chunk;
      n -= chunk;
    }
  }

  std::ifstream& in_;
  const CentralEntry& entry_;
  const std::filesystem::path& file_;
  std::string where_;
  std::uint64_t compressed_left_;
  std::uint64_t remaining_;
  std::uint32_t crc_ = 0;
  bool inflating_ = false;
  z_stream zs_{};
  std::vector<std::byte> inbuf_;
};

std::vector<CentralEntry> read_central_directory(std::ifstream& in, std::uint64_t file_size,
                                                 const std::filesystem::path& file) {
  const std::uint64_t tail_len = std::min<std::uint64_t>(file_size, kEndLen + 0xFFFF);
  std::vector<std::byte> tail(tail_len);
  read_exact(in, file_size - tail_len, tail.data(), tail_len, file, "the end of the archive");
  std::uint64_t end_pos = std::numeric_limits<std::uint64_t>::max();
  for (std::uint64_t i = tail_len >= kEndLen ? tail_len - kEndLen + 1 : 0; i-- > 0;) {
    if (u32_at(&tail[i]) == kEndSig) {
      end_pos = i;
      break;
    }
  }
  if (end_pos == std::numeric_limits<std::uint64_t>::max()) {
    throw TensorFileError(file, "not a zip archive, or truncated: end-of-central-directory record not found");
  }
  const std::byte* eocd = &tail[end_pos];
  const std::uint16_t disk = u16_at(eocd + 4), cd_disk = u16_at(eocd + 6);
  const std::uint16_t count = u16_at(eocd + 10);
  const std::uint32_t cd_size = u32_at(eocd + 12), cd_offset = u32_at(eocd + 16);
  if (count == 0xFFFF || cd_size == kZip32Max || cd_offset == kZip32Max) throw TensorFileError(file, kZip64Message);
  if (disk != 0 || cd_disk != 0) throw TensorFileError(file, "multi-disk zip archives are not supported");
  const std::uint64_t eocd_abs = file_size - tail_len + end_pos;
  if (std::uint64_t{cd_offset} + cd_size > eocd_abs) {
    throw TensorFileError(file, "truncated or corrupt: central directory lies outside the archive");
  }
  std::vector<std::byte> cd(cd_size);
  read_exact(in, cd_offset, cd.data(), cd_size, file, "the central directory");

  std::vector<CentralEntry> entries;
  std::size_t pos = 0;
  for (std::uint16_t i = 0; i < count; ++i) {
    if (pos + kCentralLen > cd.size() || u32_at(&cd[pos]) != kCentralSig) {
      throw TensorFileError(file, "corrupt central directory (entry " + std::to_string(i) + " of " +
                                      std::to_string(count) + ")");
    }
    const std::byte* p = &cd[pos];
    CentralEntry e;
    e.flags = u16_at(p + 8);
    e.method = u16_at(p + 10);
    e.crc = u32_at(p + 16);
    e.csize = u32_at(p + 20);
    e.usize = u32_at(p + 24);
    const std::size_t name_len = u16_at(p + 28), extra_len = u16_at(p + 30), comment_len = u16_at(p + 32);
    e.local_offset = u32_at(p + 42);
    if (pos + kCentralLen + name_len + extra_len + comment_len > cd.size()) {
      throw TensorFileError(file, "corrupt central directory (entry " + std::to_string(i) + " overruns it)");
    }
    e.name.assign(reinterpret_cast<const char*>(p + kCentralLen), name_len);
    if (e.csize == kZip32Max || e.usize == kZip32Max || e.local_offset == kZip32Max) {
      throw TensorFileError(file, "entry '" + e.name + "': " + kZip64Message);
    }
    pos += kCentralLen + name_len + extra_len + comment_len;
    entries.push_back(std::move(e));
  }
  return entries;
}

void write_bytes(std::ofstream& out, const void* p, std::uint64_t n) {
  out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
}

struct WrittenEntry {
  std::string name;
  std::uint16_t flags;
  std::uint16_t method;
  std::uint32_t crc;
  std::uint64_t csize;
  std::uint64_t usize;
  std::uint64_t offset;
};

std::string local_header(const WrittenEntry& e) {
  std::string h;
  put_u32(h, kLocalSig);
  put_u16(h, 20);  // version needed: 2.0 (deflate)
  put_u16(h, e.flags);
  put_u16(h, e.method);
  put_u16(h, 0);  // time 00:00:00
  put_u16(h, kDosDate1980);
  put_u32(h, e.crc);
  put_u32(h, e.csize);
  put_u32(h, e.usize);
  put_u16(h, e.name.size());
  put_u16(h, 0);  // no extra field
  h += e.name;
  return h;
}

// Deflates header + data into `out`; returns the compressed size.
std::uint64_t deflate_to(std::ofstream& out, const std::string& header, const std::vector<std::byte>& data,
                         const std::filesystem::path& file) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw TensorFileError(file, "zlib deflateInit2 failed");
  }
  std::vector<Bytef> outbuf(kChunk);
  std::uint64_t written = 0;
  auto pump = [&](const std::byte* p, std::uint64_t n, bool last) {
    do {
      const std::uint64_t chunk = std::min(n, kMaxZlibChunk);
      zs.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(p));
      zs.avail_in = static_cast<uInt>(chunk);
      const int flush = (last && chunk == n) ? Z_FINISH : Z_NO_FLUSH;
      int rc = Z_OK;
      do {
        zs.next_out = outbuf.data();
        zs.avail_out = static_cast<uInt>(outbuf.size());
        rc = deflate(&zs, flush);
        if (rc == Z_STREAM_ERROR) {
          deflateEnd(&zs);
          throw TensorFileError(file, "zlib deflate failed");
        }
        const std::uint64_t have = outbuf.size() - zs.avail_out;
        write_bytes(out, outbuf.data(), have);
        written += have;
      } while (zs.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
      p += chunk;
      n -= chunk;
    } while (n > 0);
  };
  pump(reinterpret_cast<const std::byte*>(header.data()), header.size(), false);
  pump(data.data(), data.size(), true);
  deflateEnd(&zs);
  return written;
}

void write_npz_entries(std::ofstream& out, const std::vector<HostTensor>& tensors,
                       const std::vector<std::string>& headers, bool compress, const std::filesystem::path& path) {
  std::vector<WrittenEntry> written;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const HostTensor& t = tensors[i];
    WrittenEntry e{};
    e.name = t.name + ".npy";
    const bool ascii = std::all_of(e.name.begin(), e.name.end(), [](char c) { return (c & 0x80) == 0; });
    e.flags = ascii ? 0 : 0x800;  // bit 11: the name is UTF-8
    e.method = compress ? kMethodDeflate : kMethodStored;
    e.offset = static_cast<std::uint64_t>(out.tellp());
    if (e.offset > kZip32Max) throw TensorFileError(path, "archive would exceed 4 GB: " + kZip64Message);
    e.usize = headers[i].size() + t.data.size();
    e.crc = crc_update(crc_update(0, reinterpret_cast<const std::byte*>(headers[i].data()), headers[i].size()),
                       t.data.data(), t.data.size());
    if (compress) {
      const std::string placeholder = local_header(e);
      write_bytes(out, placeholder.data(), placeholder.size());
      e.csize = deflate_to(out, headers[i], t.data, path);
      if (e.csize > kZip32Max) throw TensorFileError(path, "archive would exceed 4 GB: " + kZip64Message);
      const auto end = out.tellp();
      out.seekp(static_cast<std::streamoff>(e.offset));  // sizes are known only now
      const std::string h = local_header(e);
      write_bytes(out, h.data(), h.size());
      out.seekp(end);
    } else {
      e.csize = e.usize;
      const std::string h = local_header(e);
      write_bytes(out, h.data(), h.size());
      write_bytes(out, headers[i].data(), headers[i].size());
      write_bytes(out, t.data.data(), t.data.size());
    }
    written.push_back(std::move(e));
  }

  const auto cd_offset = static_cast<std::uint64_t>(out.tellp());
  std::string cd;
  for (const WrittenEntry& e : written) {
    put_u32(cd, kCentralSig);
    put_u16(cd, (3 << 8) | 20);  // made by: Unix, zip 2.0
    put_u16(cd, 20);
    put_u16(cd, e.flags);
    put_u16(cd, e.method);
    put_u16(cd, 0);
    put_u16(cd, kDosDate1980);
    put_u32(cd, e.crc);
    put_u32(cd, e.csize);
    put_u32(cd, e.usize);
    put_u16(cd, e.name.size());
    put_u16(cd, 0);  // extra
    put_u16(cd, 0);  // comment
    put_u16(cd, 0);  // disk
    put_u16(cd, 0);  // internal attributes
    put_u32(cd, 0100644u << 16);  // external attributes: a regular file, rw-r--r--
    put_u32(cd, e.offset);
    cd += e.name;
  }
  const std::uint64_t cd_size = cd.size();
  if (cd_offset + cd_size > kZip32Max) throw TensorFileError(path, "archive would exceed 4 GB: " + kZip64Message);
  put_u32(cd, kEndSig);
  put_u16(cd, 0);
  put_u16(cd, 0);
  put_u16(cd, written.size());
  put_u16(cd, written.size());
  put_u32(cd, cd_size);
  put_u32(cd, cd_offset);
  put_u16(cd, 0);  // comment length
  write_bytes(out, cd.data(), cd.size());
}

}  // namespace

std::vector<HostTensor> read_npz(const std::filesystem::path& path) {
  std::ifstream in = detail::open_for_read(path);
  const std::uint64_t file_size = detail::file_size_of(path);
  const std::vector<CentralEntry> entries = read_central_directory(in, file_size, path);

  std::vector<HostTensor> tensors;
  for (const CentralEntry& e : entries) {
    if (!e.name.empty() && e.name.back() == '/') continue;  // a directory entry
    const std::string where = "entry '" + e.name + "': ";
    if (e.name.size() <= 4 || e.name.compare(e.name.size() - 4, 4, ".npy") != 0) {
      throw TensorFileError(path, where + "not a .npy file (an npz holds only NAME.npy entries)");
    }
    if (e.flags & 0x1) throw TensorFileError(path, where + "encrypted entries are not supported");
    if (e.method != kMethodStored && e.method != kMethodDeflate) {
      throw TensorFileError(path, where + "compression method " + std::to_string(e.method) +
                                      " is not supported (expected 0 stored or 8 deflated)");
    }
    if (e.method == kMethodStored && e.csize != e.usize) {
      throw TensorFileError(path, where + "stored entry with different compressed and uncompressed sizes");
    }
    std::byte local[kLocalLen];
    if (e.local_offset + kLocalLen > file_size) throw TensorFileError(path, where + "truncated: local header missing");
    read_exact(in, e.local_offset, local, kLocalLen, path, "a local header");
    if (u32_at(local) != kLocalSig) throw TensorFileError(path, where + "bad local header signature");
    const std::uint64_t data_offset = e.local_offset + kLocalLen + u16_at(local + 26) + u16_at(local + 28);
    if (data_offset + e.csize > file_size) {
      throw TensorFileError(path, where + "truncated: entry data run past the end of the file");
    }
    in.clear();
    in.seekg(static_cast<std::streamoff>(data_offset));
    ZipEntrySource src(in, e, path, where);
    tensors.push_back(detail::decode_npy(src, path, where, e.name.substr(0, e.name.size() - 4)));
    src.finish();
  }
  return tensors;
}

void write_npz(const std::filesystem::path& path, const std::vector<HostTensor>& tensors, bool compress) {
  if (tensors.size() >= 0xFFFF) throw TensorFileError(path, "too many tensors: " + kZip64Message);
  // Everything that can be checked is checked before the file is created, so a refusal leaves no
  // partial archive behind; sizes come from the shapes, which is what the entries will hold.
  std::vector<std::string> headers;
  std::set<std::string> names;
  std::uint64_t stored_total = 0;
  for (const HostTensor& t : tensors) {
    if (t.name.empty()) throw TensorFileError(path, "a tensor has an empty name (entries are NAME.npy)");
    if (!names.insert(t.name).second) throw TensorFileError(path, "duplicate tensor name '" + t.name + "'");
    headers.push_back(detail::encode_npy_header(t, path));
    const std::uint64_t usize = headers.back().size() + detail::checked_nbytes(t.shape, t.dtype, path, "");
    if (usize > kZip32Max) {
      throw TensorFileError(path, "tensor '" + t.name + "' is " + std::to_string(usize) +
                                      " bytes as .npy, over the 4 GB zip limit: " + kZip64Message +
                                      "; write .safetensors instead");
    }
    stored_total += kLocalLen + t.name.size() + 4 + usize;
    if (!compress && stored_total > kZip32Max) {
      throw TensorFileError(path, "archive would exceed 4 GB: " + kZip64Message + "; write .safetensors instead");
    }
    detail::check_tensor_size(t, path);
  }

  std::ofstream out = detail::open_for_write(path);
  try {
    write_npz_entries(out, tensors, headers, compress, path);
    detail::finish_write(out, path);
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw;
  }
}

}  // namespace wb::store
