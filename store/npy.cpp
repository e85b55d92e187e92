// .npy reading and writing. The header is a Python dict literal, parsed here by a small
// recursive-descent parser (it is not JSON: single quotes, True/False, tuples). Writing mirrors
// numpy.lib.format byte for byte: sorted keys, growth padding, 64-byte data alignment.
#include <algorithm>
#include <bit>
#include <cstring>

#include "store/tensor_file.hpp"
#include "store/tensor_file_detail.hpp"

namespace wb::store {

namespace {

static_assert(std::endian::native == std::endian::little, "tensor files assume a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kAlign = 64;            // numpy's ARRAY_ALIGN
constexpr std::size_t kGrowthAxisDigits = 21;  // numpy's GROWTH_AXIS_MAX_DIGITS

class FileSource final : public detail::ByteSource {
 public:
  FileSource(std::ifstream& in, std::uint64_t size, const std::filesystem::path& file)
      : in_(in), remaining_(size), file_(file) {}

  void read(std::byte* dst, std::uint64_t n) override {
    if (n > remaining_) throw TensorFileError(file_, "truncated: unexpected end of file");
    in_.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (static_cast<std::uint64_t>(in_.gcount()) != n) throw TensorFileError(file_, "read failed (I/O error)");
    remaining_ -= n;
  }
  std::uint64_t remaining() const override { return remaining_; }

 private:
  std::ifstream& in_;
  std::uint64_t remaining_;
  const std::filesystem::path& file_;
};

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Parses "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" and nothing more general.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::filesystem::path& file, const std::string& where)
      : s_(text), file_(file), where_(where) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (!consume('}')) {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') fail("structured dtypes (a list descr) are not supported");
        h.descr = parse_string();
        if (have_descr) fail("duplicate key 'descr'");
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        if (have_fortran) fail("duplicate key 'fortran_order'");
        have_fortran = true;
      } else if (key == "shape") {
        h.shape = parse_int_tuple();
        if (have_shape) fail("duplicate key 'shape'");
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (!consume(',')) {
        skip_ws();
        expect('}');
        break;
      }
      skip_ws();
    }
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the header dict");
    if (!have_descr || !have_fortran || !have_shape) {
      fail("header dict lacks one of the keys 'descr', 'fortran_order', 'shape'");
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw TensorFileError(file_, where_ + "bad npy header at offset " + std::to_string(pos_) + ": " + what +
                                     " (header: " + std::string(s_.substr(0, 200)) + ")");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool consume(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    ++pos_;
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out.push_back(s_[pos_++]);
    }
    expect(quote);
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::int64_t parse_int() {
    bool negative = consume('-');
    if (peek() < '0' || peek() > '9') fail("expected an integer");
    std::int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (v > (INT64_MAX - 9) / 10) fail("dimension too large");
      v = v * 10 + (s_[pos_++] - '0');
    }
    consume('L');  // Python 2 wrote long integers as 3L
    return negative ? -v : v;
  }
  std::vector<std::int64_t> parse_int_tuple() {
    std::vector<std::int64_t> out;
    expect('(');
    skip_ws();
    while (!consume(')')) {
      out.push_back(parse_int());
      skip_ws();
      if (!consume(',')) {
        skip_ws();
        expect(')');
        break;
      }
      skip_ws();
    }
    return out;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  const std::filesystem::path& file_;
  const std::string& where_;
};

struct ResolvedDescr {
  DType dtype;
  bool big_endian;
};

ResolvedDescr resolve_descr(const std::string& descr, const std::filesystem::path& file, const std::string& where) {
  std::string_view code = descr;
  char order = '=';
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '|' || code[0] == '=')) {
    order = code[0];
    code.remove_prefix(1);
  }
  static constexpr std::pair<std::string_view, DType> kCodes[] = {
      {"f4", DType::F32}, {"f8", DType::F64}, {"f2", DType::F16}, {"i4", DType::I32},
      {"i8", DType::I64}, {"u1", DType::U8},  {"b1", DType::BOOL},
  };
  for (const auto& [c, dtype] : kCodes) {
    if (c == code) return {dtype, order == '>' && dtype_size(dtype) > 1};
  }
  throw TensorFileError(file, where + "unsupported npy dtype '" + descr +
                                  "' (supported: f4, f8, f2, i4, i8, u1, b1 in either byte order)");
}

void byteswap_elements(std::vector<std::byte>& data, std::size_t elsize) {
  for (std::size_t i = 0; i + elsize <= data.size(); i += elsize) std::reverse(&data[i], &data[i] + elsize);
}

// Fortran order of shape (d0, ..., dn-1) is C order of the reversed shape; walk the output in C
// order and gather each element from its column-major offset.
template <std::size_t ElSize>
void gather_fortran(const std::byte* src, std::byte* dst, const std::vector<std::int64_t>& shape) {
  const std::size_t nd = shape.size();
  std::vector<std::uint64_t> fstride(nd);
  std::uint64_t s = 1;
  for (std::size_t k = 0; k < nd; ++k) {
    fstride[k] = s;
    s *= static_cast<std::uint64_t>(shape[k]);
  }
  const std::uint64_t total = s;
  const auto inner = static_cast<std::uint64_t>(shape[nd - 1]);
  const std::uint64_t inner_stride = fstride[nd - 1] * ElSize;
  std::vector<std::uint64_t> idx(nd, 0);
  std::uint64_t src_off = 0;  // offset (elements) of idx with idx[nd-1] == 0
  for (std::uint64_t out = 0; out < total; out += inner) {
    const std::byte* p = src + src_off * ElSize;
    std::byte* q = dst + out * ElSize;
    for (std::uint64_t j = 0; j < inner; ++j, p += inner_stride, q += ElSize) std::memcpy(q, p, ElSize);
    for (std::size_t k = nd - 1; k-- > 0;) {  // advance the outer axes like an odometer
      src_off += fstride[k];
      if (++idx[k] < static_cast<std::uint64_t>(shape[k])) break;
      src_off -= fstride[k] * idx[k];
      idx[k] = 0;
    }
  }
}

void fortran_to_c(HostTensor& t) {
  if (t.shape.size() < 2 || t.data.empty()) return;
  std::vector<std::byte> c_order(t.data.size());
  switch (dtype_size(t.dtype)) {
    case 1: gather_fortran<1>(t.data.data(), c_order.data(), t.shape); break;
    case 2: gather_fortran<2>(t.data.data(), c_order.data(), t.shape); break;
    case 4: gather_fortran<4>(t.data.data(), c_order.data(), t.shape); break;
    default: gather_fortran<8>(t.data.data(), c_order.data(), t.shape); break;
  }
  t.data = std::move(c_order);
}

template <typename T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

namespace detail {

HostTensor decode_npy(ByteSource& src, const std::filesystem::path& file, const std::string& where,
                      std::string name) {
  std::byte prefix[12];
  if (src.remaining() < 10) {
    throw TensorFileError(file, where + "truncated: " + std::to_string(src.remaining()) +
                                    " bytes, too short for an npy header (expected at least 10)");
  }
  src.read(prefix, 8);
  if (std::memcmp(prefix, kMagic, kMagicLen) != 0) {
    throw TensorFileError(file, where + "not an npy file: bad magic (expected \\x93NUMPY)");
  }
  const int major = static_cast<int>(prefix[6]);
  const int minor = static_cast<int>(prefix[7]);
  std::uint64_t header_len = 0;
  if (major == 1 && minor == 0) {
    src.read(prefix + 8, 2);
    header_len = load_le<std::uint16_t>(prefix + 8);
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (src.remaining() < 4) throw TensorFileError(file, where + "truncated inside the npy header length");
    src.read(prefix + 8, 4);
    header_len = load_le<std::uint32_t>(prefix + 8);
  } else {
    throw TensorFileError(file, where + "unsupported npy format version " + std::to_string(major) + "." +
                                    std::to_string(minor) + " (expected 1.0, 2.0 or 3.0)");
  }
  // numpy's own headers are a few hundred bytes (it refuses to read over 10000 by default); a length
  // field past 1 MiB is damage, not a header, and must not decide an allocation.
  constexpr std::uint64_t kMaxHeaderLen = std::uint64_t{1} << 20;
  if (header_len > kMaxHeaderLen) {
    throw TensorFileError(file, where + "npy header length " + std::to_string(header_len) + " is over the " +
                                    std::to_string(kMaxHeaderLen) + " bytes any npy header needs");
  }
  if (header_len > src.remaining()) {
    throw TensorFileError(file, where + "truncated: npy header length " + std::to_string(header_len) +
                                    " exceeds the " + std::to_string(src.remaining()) + " bytes that remain");
  }
  std::string text(header_len, '\0');
  src.read(reinterpret_cast<std::byte*>(text.data()), header_len);
  const NpyHeader h = HeaderParser(text, file, where).parse();
  const ResolvedDescr rd = resolve_descr(h.descr, file, where);

  HostTensor t;
  t.name = std::move(name);
  t.dtype = rd.dtype;
  t.shape = h.shape;
  const std::uint64_t nbytes = checked_nbytes(t.shape, t.dtype, file, where);
  if (nbytes > src.remaining()) {
    throw TensorFileError(file, where + "truncated: header promises " + std::to_string(nbytes) +
                                    " data bytes but only " + std::to_string(src.remaining()) + " remain");
  }
  // Read in doubling steps: inside an npz the remaining size is what the archive claims, and a
  // damaged claim must fail where the data end, not first allocate all it promised.
  std::uint64_t done = 0;
  while (done < nbytes) {
    const std::uint64_t step = std::min(nbytes - done, std::clamp<std::uint64_t>(done, 1 << 16, std::uint64_t{1} << 28));
    t.data.resize(static_cast<std::size_t>(done + step));
    src.read(t.data.data() + done, step);
    done += step;
  }
  if (rd.big_endian) byteswap_elements(t.data, dtype_size(t.dtype));
  if (h.fortran_order) fortran_to_c(t);
  return t;
}

std::string encode_npy_header(const HostTensor& tensor, const std::filesystem::path& file) {
  const auto descr = numpy_descr(tensor.dtype);
  if (!descr) {
    throw TensorFileError(file, "tensor '" + tensor.name + "' is " + std::string(dtype_name(tensor.dtype)) +
                                    ", which has no numpy dtype; write it as .safetensors or convert it to F32");
  }
  std::string shape = "(";
  for (std::size_t i = 0; i < tensor.shape.size(); ++i) {
    if (i > 0) shape += ", ";
    shape += std::to_string(tensor.shape[i]);
  }
  if (tensor.shape.size() == 1) shape += ",";
  shape += ")";
  std::string dict = "{'descr': '" + std::string(*descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // numpy leaves room to grow the first axis in place; matching it keeps files byte-identical.
  if (!tensor.shape.empty()) {
    const std::size_t digits = std::to_string(tensor.shape[0]).size();
    if (digits < kGrowthAxisDigits) dict.append(kGrowthAxisDigits - digits, ' ');
  }

  const std::size_t hlen = dict.size() + 1;  // + the closing newline
  for (int major : {1, 2}) {
    const std::size_t len_size = major == 1 ? 2 : 4;
    const std::size_t padlen = kAlign - ((kMagicLen + 2 + len_size + hlen) % kAlign);
    const std::uint64_t total = hlen + padlen;
    if (total > (major == 1 ? 0xFFFFull : 0xFFFFFFFFull)) continue;
    std::string out(kMagic, kMagicLen);
    out.push_back(static_cast<char>(major));
    out.push_back('\0');
    for (std::size_t b = 0; b < len_size; ++b) out.push_back(static_cast<char>((total >> (8 * b)) & 0xFF));
    out += dict;
    out.append(padlen, ' ');
    out.push_back('\n');
    return out;
  }
  throw TensorFileError(file, "tensor '" + tensor.name + "': npy header would exceed 4 GB");
}

}  // namespace detail

HostTensor read_npy(const std::filesystem::path& path) {
  std::ifstream in = detail::open_for_read(path);
  FileSource src(in, detail::file_size_of(path), path);
  return detail::decode_npy(src, path, "", path.stem().string());
}

void write_npy(const std::filesystem::path& path, const HostTensor& tensor) {
  detail::check_tensor_size(tensor, path);
  const std::string header = detail::encode_npy_header(tensor, path);
  std::ofstream out = detail::open_for_write(path);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(tensor.data.data()), static_cast<std::streamsize>(tensor.data.size()));
  detail::finish_write(out, path);
}

}  // namespace wb::store
