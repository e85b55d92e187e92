// .npz against numpy: np.savez (stored) and np.savez_compressed (deflated) archives must read
// bit-exactly, in archive order; archives we write must load in numpy and pass zipfile's CRC test.
#include "test_store_tensorfile_common.hpp"

#include <algorithm>

using namespace wb::store;
using namespace wb::store::test;

namespace {

const char* kNumpyWritesNpz = R"py(
import json, sys
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(99)
dtypes = {'F32': '<f4', 'F64': '<f8', 'F16': '<f2', 'I32': '<i4', 'I64': '<i8', 'U8': '|u1', 'BOOL': '|b1'}
shapes = [(), (0,), (5,), (3, 4), (2, 3, 5), (16, 3, 3, 3)]
arrays, manifest = {}, []
for name, descr in dtypes.items():
    for si, shape in enumerate(shapes):
        dt = np.dtype(descr)
        n = int(np.prod(shape, dtype=np.int64))
        if dt.kind == 'b':
            a = (rng.integers(0, 2, size=n) > 0).reshape(shape)
        else:
            a = np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt).reshape(shape).copy()
        key = 'layer%d.%s_%d' % (len(arrays), name.lower(), si)
        arrays[key] = a
        with open('%s/%d.bin' % (out, len(manifest)), 'wb') as f:
            f.write(a.tobytes())
        manifest.append({'name': key, 'dtype': name, 'shape': list(shape)})
np.savez(out + '/stored.npz', **arrays)
np.savez_compressed(out + '/deflated.npz', **arrays)
json.dump(manifest, open(out + '/manifest.json', 'w'))
)py";

const char* kNumpyChecksNpz = R"py(
import json, sys, zipfile
import numpy as np

d, archive, method = sys.argv[1], sys.argv[2], sys.argv[3]
manifest = json.load(open(d + '/manifest.json'))
bad = []
with zipfile.ZipFile(archive) as z:
    if z.testzip() is not None:
        bad.append('CRC test failed')
    want = zipfile.ZIP_DEFLATED if method == 'deflated' else zipfile.ZIP_STORED
    bad += ['%s: compress_type %d' % (i.filename, i.compress_type) for i in z.infolist() if i.compress_type != want]
npz = np.load(archive, allow_pickle=False)
if list(npz.files) != [e['name'] for e in manifest]:
    bad.append('order %s' % npz.files)
for i, e in enumerate(manifest):
    a = npz[e['name']]
    raw = open('%s/%d.bin' % (d, i), 'rb').read()
    if a.dtype.str != e['descr'] or list(a.shape) != e['shape'] or a.tobytes() != raw:
        bad.append('%s: %s %s' % (e['name'], a.dtype.str, a.shape))
print('numpy checked %d arrays in %s, problems: %s' % (len(manifest), archive, bad))
sys.exit(1 if bad else 0)
)py";

// Byte offset of `needle` in `hay`, or npos.
std::size_t find_bytes(const std::vector<std::byte>& hay, const std::vector<std::byte>& needle) {
  const auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end());
  return it == hay.end() ? std::string::npos : static_cast<std::size_t>(it - hay.begin());
}

}  // namespace

TEST_CASE("np.savez and np.savez_compressed archives read bit-exactly in order", "[store]") {
  TempDir dir;
  const ProcessResult gen = run_python_script(dir, "gen.py", kNumpyWritesNpz, dir.path().string());
  INFO(gen.output);
  REQUIRE(gen.exit_code == 0);
  const auto manifest = nlohmann::json::parse(read_text(dir / "manifest.json"));
  REQUIRE(manifest.size() == 42);

  const std::string archive = GENERATE(as<std::string>{}, "stored.npz", "deflated.npz");
  CAPTURE(archive);
  const std::vector<HostTensor> tensors = read_npz(dir / archive);
  REQUIRE(tensors.size() == manifest.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(i);
    REQUIRE(tensors[i].name == manifest[i]["name"].get<std::string>());
    REQUIRE(dtype_name(tensors[i].dtype) == manifest[i]["dtype"].get<std::string>());
    REQUIRE(tensors[i].shape == shape_of(manifest[i]["shape"]));
    REQUIRE(tensors[i].data == read_bytes(dir / (std::to_string(i) + ".bin")));
  }
  const auto via_any = read_any(dir / archive);
  REQUIRE(via_any.size() == tensors.size());
  REQUIRE(via_any.back().data == tensors.back().data);
}

TEST_CASE("our npz archives load in numpy bit-exactly", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(5);
  const std::vector<std::pair<DType, std::string>> dtypes = {
      {DType::F32, "<f4"}, {DType::F64, "<f8"}, {DType::F16, "<f2"}, {DType::I32, "<i4"},
      {DType::I64, "<i8"}, {DType::U8, "|u1"},  {DType::BOOL, "|b1"}};
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {9}, {4, 6}, {64, 3, 7, 7}};
  std::vector<HostTensor> tensors;
  nlohmann::json manifest = nlohmann::json::array();
  for (const auto& [dtype, descr] : dtypes) {
    for (const auto& shape : shapes) {
      // Dotted torchvision-like names, and one with a non-ASCII character (zip flag bit 11).
      std::string name = numbered("layer1.", tensors.size(), ".conv") + std::string(dtype_name(dtype));
      if (tensors.size() == 3) name += "_\xc3\xa9";
      HostTensor t = random_tensor(name, dtype, shape, rng);
      write_bytes(dir / (std::to_string(tensors.size()) + ".bin"), t.data);
      manifest.push_back({{"name", name}, {"descr", descr}, {"shape", shape}});
      tensors.push_back(std::move(t));
    }
  }
  // Compressible content too, so the deflated archive is checked on data deflate actually shrinks.
  HostTensor zeros{"zeros", DType::F32, {256, 256}, std::vector<std::byte>(256 * 256 * 4)};
  write_bytes(dir / (std::to_string(tensors.size()) + ".bin"), zeros.data);
  manifest.push_back({{"name", "zeros"}, {"descr", "<f4"}, {"shape", zeros.shape}});
  tensors.push_back(zeros);
  write_text(dir / "manifest.json", manifest.dump());

  const bool compress = GENERATE(false, true);
  const std::string method = compress ? "deflated" : "stored";
  CAPTURE(method);
  const auto path = dir / (method + ".npz");
  write_npz(path, tensors, compress);

  const ProcessResult check = run_python_script(dir, "check.py", kNumpyChecksNpz,
                                         dir.path().string() + " " + path.string() + " " + method);
  INFO(check.output);
  REQUIRE(check.exit_code == 0);

  const std::vector<HostTensor> back = read_npz(path);
  REQUIRE(back.size() == tensors.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    REQUIRE(back[i].name == tensors[i].name);
    REQUIRE(back[i].shape == tensors[i].shape);
    REQUIRE(back[i].data == tensors[i].data);
  }
  // Random bits do not deflate, the 256 KiB of zeros do.
  const auto size = std::filesystem::file_size(path);
  std::uint64_t raw = 0;
  for (const HostTensor& t : tensors) raw += t.data.size();
  if (compress) {
    REQUIRE(size < raw - 256 * 256 * 4 + 4096);
  } else {
    REQUIRE(size > raw);
  }
}

TEST_CASE("npz writer refuses what it cannot write, leaving no file", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(2);
  const auto path = dir / "refused.npz";
  SECTION("BF16") {
    REQUIRE_FILE_ERROR(write_npz(path, {random_tensor("w", DType::BF16, {3}, rng)}, false), path, "no numpy dtype");
  }
  SECTION("duplicate names") {
    const HostTensor t = random_tensor("w", DType::F32, {3}, rng);
    REQUIRE_FILE_ERROR(write_npz(path, {t, t}, true), path, "duplicate tensor name 'w'");
  }
  SECTION("an entry over 4 GB") {
    // The limit is checked from the shapes before anything is written, so no 4 GB buffer is needed.
    HostTensor huge{"huge", DType::U8, {std::int64_t{1} << 32}, {}};
    REQUIRE_FILE_ERROR(write_npz(path, {huge}, false), path, "4 GB");
    REQUIRE_FILE_ERROR(write_npz(path, {huge}, true), path, "zip64");
  }
  REQUIRE_FALSE(std::filesystem::exists(path));
}

TEST_CASE("malformed npz archives are rejected with the file named", "[store]") {
  TempDir dir;
  // A recognisable run of bytes, so the test can find the entry's data inside the archive.
  HostTensor marker{"marker", DType::U8, {64}, {}};
  for (int i = 0; i < 64; ++i) marker.data.push_back(static_cast<std::byte>(i * 3 + 1));
  std::mt19937_64 rng(4);
  const std::vector<HostTensor> tensors = {random_tensor("a", DType::F32, {8, 8}, rng), marker};
  const auto stored = dir / "stored.npz";
  write_npz(stored, tensors, false);
  const auto bytes = read_bytes(stored);

  SECTION("truncated in the middle") {
    const auto path = dir / "cut.npz";
    write_bytes(path, std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2)));
    REQUIRE_FILE_ERROR(read_npz(path), path, "truncated");
  }
  SECTION("a flipped data byte fails the CRC") {
    auto bad = bytes;
    const std::size_t at = find_bytes(bad, marker.data);
    REQUIRE(at != std::string::npos);
    bad[at + 10] ^= std::byte{0x40};
    const auto path = dir / "crc.npz";
    write_bytes(path, bad);
    REQUIRE_FILE_ERROR(read_npz(path), path, "CRC-32 mismatch");
    REQUIRE_THROWS_WITH(read_npz(path), Catch::Matchers::Contains("entry 'marker.npy'"));
  }
  SECTION("corrupt deflate data") {
    const auto path = dir / "deflated.npz";
    write_npz(path, tensors, true);
    auto bad = read_bytes(path);
    // The first entry's compressed stream starts after its 30-byte local header and "a.npy".
    for (std::size_t i = 35; i < 45; ++i) bad[i] = std::byte{0xFF};
    write_bytes(path, bad);
    REQUIRE_THROWS_AS(read_npz(path), TensorFileError);
    REQUIRE_THROWS_WITH(read_npz(path), Catch::Matchers::Contains(path.string()) &&
                                            Catch::Matchers::Contains("entry 'a.npy'"));
  }
  SECTION("an entry that is not .npy") {
    const auto path = dir / "readme.npz";
    const ProcessResult r = run_python("-c \"import zipfile; z = zipfile.ZipFile('" + path.string() +
                                       "', 'w'); z.writestr('readme.txt', 'hello'); z.close()\"");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE_FILE_ERROR(read_npz(path), path, "entry 'readme.txt': not a .npy file");
  }
  SECTION("not a zip at all") {
    const auto path = dir / "text.npz";
    write_text(path, "just some text, no zip records here");
    REQUIRE_FILE_ERROR(read_npz(path), path, "end-of-central-directory record not found");
  }
}
