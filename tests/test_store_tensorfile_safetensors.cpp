// .safetensors against an independent Python implementation of the format (struct + json +
// numpy.frombuffer; there is no safetensors package here): files Python writes by hand, BF16 and
// __metadata__ included, must read bit-exactly, and files we write must pass Python's reader.
#include "test_store_tensorfile_common.hpp"

#include <cstring>

using namespace wb::store;
using namespace wb::store::test;

namespace {

const char* kPythonWritesSafetensors = R"py(
import json, struct, sys
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(31)
np_dtype = {'F32': '<f4', 'F64': '<f8', 'F16': '<f2', 'BF16': '<u2', 'I32': '<i4', 'I64': '<i8', 'U8': '|u1', 'BOOL': '|b1'}
specs = [('conv1.weight', 'BF16', (8, 3, 7, 7)), ('bn1.running_mean', 'F32', (8,)), ('loss', 'F64', ()),
         ('empty.a', 'I32', (0, 5)), ('half', 'F16', (2, 3)), ('label', 'I64', (6,)), ('input', 'U8', (2, 4, 4, 3)),
         ('mask', 'BOOL', (9,)), ('empty.b', 'F32', (0,)), ('fc.bias', 'BF16', (10,)), ('layer1.0.conv1.weight', 'F32', (4, 8, 1, 1))]
blobs = {}
for name, dtype, shape in specs:
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == 'BOOL':
        blobs[name] = (rng.integers(0, 2, size=n) > 0).astype(np.uint8).tobytes()
    else:
        blobs[name] = rng.bytes(n * np.dtype(np_dtype[dtype]).itemsize)
# Data laid out in a shuffled order, header keys in yet another (reversed spec) order.
layout = [specs[i] for i in rng.permutation(len(specs))]
offsets, pos = {}, 0
for name, dtype, shape in layout:
    offsets[name] = (pos, pos + len(blobs[name]))
    pos += len(blobs[name])
header = {'__metadata__': {'format': 'pt', 'wb.step': '0', 'note': 'caf\u00e9'}}
for index, (name, dtype, shape) in enumerate(reversed(specs)):
    header[name] = {'dtype': dtype, 'shape': list(shape), 'data_offsets': list(offsets[name])}
text = json.dumps(header, separators=(',', ':')).encode('utf-8')
text += b' ' * ((8 - len(text) % 8) % 8)
with open(out + '/python.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(text)))
    f.write(text)
    for name, dtype, shape in layout:
        f.write(blobs[name])
# Expected read order: by data offsets; empty tensors sharing an offset keep header order.
header_index = {name: i for i, name in enumerate(header) if name != '__metadata__'}
order = sorted(header_index, key=lambda k: (offsets[k][0], offsets[k][1], header_index[k]))
spec = {name: (dtype, shape) for name, dtype, shape in specs}
manifest = {'metadata': header['__metadata__'], 'tensors': []}
for i, name in enumerate(order):
    with open('%s/%d.bin' % (out, i), 'wb') as f:
        f.write(blobs[name])
    manifest['tensors'].append({'name': name, 'dtype': spec[name][0], 'shape': list(spec[name][1])})
json.dump(manifest, open(out + '/manifest.json', 'w'))
)py";

const char* kPythonReadsSafetensors = R"py(
import json, struct, sys
import numpy as np

path, d = sys.argv[1], sys.argv[2]
np_dtype = {'F32': '<f4', 'F64': '<f8', 'F16': '<f2', 'I32': '<i4', 'I64': '<i8', 'U8': '|u1', 'BOOL': '|b1'}
expected = json.load(open(d + '/manifest.json'))
blob = open(path, 'rb').read()
(n,) = struct.unpack('<Q', blob[:8])
text = blob[8:8 + n].decode('utf-8')
buf = blob[8 + n:]
problems = []
if n % 8 != 0:
    problems.append('header length %d is not a multiple of 8' % n)
stripped = text.rstrip(' ')
if len(text) - len(stripped) >= 8 or not stripped.endswith('}'):
    problems.append('header padding is not 0-7 trailing spaces')
header = json.loads(text)
metadata = header.pop('__metadata__', {})
if metadata != expected['metadata']:
    problems.append('metadata %r' % metadata)
if list(header) != [e['name'] for e in expected['tensors']]:
    problems.append('names/order %r' % list(header))
pos = 0
for i, e in enumerate(expected['tensors']):
    info = header.get(e['name'], {})
    begin, end = info.get('data_offsets', (-1, -1))
    if begin != pos:
        problems.append('%s: begins at %d, expected %d' % (e['name'], begin, pos))
    pos = end
    if info.get('dtype') != e['dtype'] or info.get('shape') != e['shape']:
        problems.append('%s: %r' % (e['name'], info))
        continue
    raw = buf[begin:end]
    want = open('%s/%d.bin' % (d, i), 'rb').read()
    if e['dtype'] == 'BF16':
        # bfloat16 is the upper half of a float32
        values = (np.frombuffer(raw, '<u2').astype(np.uint32) << 16).view(np.float32).reshape(e['shape'])
    else:
        values = np.frombuffer(raw, np_dtype[e['dtype']]).reshape(e['shape'])
    if values.tobytes() != want:
        problems.append('%s: data differ' % e['name'])
if pos != len(buf):
    problems.append('tensors cover %d of %d data bytes' % (pos, len(buf)))
print('python read %d tensors, problems: %s' % (len(header), problems))
sys.exit(1 if problems else 0)
)py";

// A safetensors file with the given header text (padded to 8) and `data_size` zero bytes.
void craft(const std::filesystem::path& path, std::string header, std::size_t data_size) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int b = 0; b < 8; ++b) file[b] = static_cast<char>((header.size() >> (8 * b)) & 0xFF);
  file += header;
  file.append(data_size, '\0');
  write_text(path, file);
}

}  // namespace

TEST_CASE("hand-written safetensors (BF16, __metadata__, shuffled layout) read bit-exactly", "[store]") {
  TempDir dir;
  const ProcessResult gen = run_python_script(dir, "gen.py", kPythonWritesSafetensors, dir.path().string());
  INFO(gen.output);
  REQUIRE(gen.exit_code == 0);
  const auto manifest = nlohmann::json::parse(read_text(dir / "manifest.json"));

  std::map<std::string, std::string> metadata;
  const auto tensors = read_safetensors(dir / "python.safetensors", &metadata);
  REQUIRE(metadata == manifest["metadata"].get<std::map<std::string, std::string>>());
  REQUIRE(metadata.at("note") == "caf\xc3\xa9");
  const auto& expected = manifest["tensors"];
  REQUIRE(tensors.size() == 11);
  REQUIRE(tensors.size() == expected.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(i);
    REQUIRE(tensors[i].name == expected[i]["name"].get<std::string>());
    REQUIRE(dtype_name(tensors[i].dtype) == expected[i]["dtype"].get<std::string>());
    REQUIRE(tensors[i].shape == shape_of(expected[i]["shape"]));
    REQUIRE(tensors[i].data == read_bytes(dir / (std::to_string(i) + ".bin")));
  }
  REQUIRE(read_any(dir / "python.safetensors").size() == 11);
}

TEST_CASE("our safetensors files pass an independent Python reader bit-exactly", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(17);
  std::vector<HostTensor> tensors;
  nlohmann::json expected = nlohmann::json::array();
  auto add = [&](HostTensor t, const std::vector<std::byte>& want) {
    write_bytes(dir / (std::to_string(tensors.size()) + ".bin"), want);
    expected.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
    tensors.push_back(std::move(t));
  };
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U8, DType::BOOL}) {
    for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{}, {0, 3}, {5, 7}}) {
      HostTensor t = random_tensor(numbered("t", tensors.size(), ".") + std::string(dtype_name(dtype)),
                                   dtype, shape, rng);
      const auto data = t.data;
      add(std::move(t), data);
    }
  }
  // BF16: the upper halves of random float32 values; Python widens them back and must get the
  // float32 values with their low 16 bits cleared.
  for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{64, 3, 3, 3}, {}, {0}}) {
    HostTensor t{numbered("bf16.", tensors.size()), DType::BF16, shape, {}};
    std::vector<std::byte> widened;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const auto bits = static_cast<std::uint32_t>(rng());
      const std::uint16_t half = static_cast<std::uint16_t>(bits >> 16);
      const std::uint32_t f32 = bits & 0xFFFF0000u;
      const auto* h = reinterpret_cast<const std::byte*>(&half);
      const auto* f = reinterpret_cast<const std::byte*>(&f32);
      t.data.insert(t.data.end(), h, h + 2);
      widened.insert(widened.end(), f, f + 4);
    }
    add(std::move(t), widened);
  }
  const std::map<std::string, std::string> metadata = {
      {"wb.run", "/tmp/run.sqlite"}, {"wb.step", "3"}, {"wb.exec_order", "{\"a\":1}"}};
  write_text(dir / "manifest.json", nlohmann::json{{"metadata", metadata}, {"tensors", expected}}.dump());

  const auto path = dir / "ours.safetensors";
  write_safetensors(path, tensors, metadata);
  const ProcessResult check = run_python_script(dir, "check.py", kPythonReadsSafetensors,
                                         path.string() + " " + dir.path().string());
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  REQUIRE_THAT(check.output, Catch::Matchers::Contains("python read 24 tensors, problems: []"));

  std::map<std::string, std::string> meta_back;
  const auto back = read_safetensors(path, &meta_back);
  REQUIRE(meta_back == metadata);
  REQUIRE(back.size() == tensors.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    REQUIRE(back[i].name == tensors[i].name);
    REQUIRE(back[i].dtype == tensors[i].dtype);
    REQUIRE(back[i].shape == tensors[i].shape);
    REQUIRE(back[i].data == tensors[i].data);
  }

  // No metadata and no tensors is still a valid file: "{}" padded to 8.
  const auto empty = dir / "empty.safetensors";
  write_safetensors(empty, {});
  REQUIRE(std::filesystem::file_size(empty) == 16);
  REQUIRE(read_safetensors(empty).empty());
}

TEST_CASE("safetensors writer refuses bad tensor sets", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(8);
  const auto path = dir / "refused.safetensors";
  const HostTensor t = random_tensor("w", DType::F32, {2}, rng);
  REQUIRE_FILE_ERROR(write_safetensors(path, {t, t}), path, "duplicate tensor name 'w'");
  HostTensor reserved = t;
  reserved.name = "__metadata__";
  REQUIRE_FILE_ERROR(write_safetensors(path, {reserved}), path, "reserved");
  HostTensor wrong = t;
  wrong.shape = {3};
  REQUIRE_FILE_ERROR(write_safetensors(path, {wrong}), path, "expected 12");
}

TEST_CASE("malformed safetensors files are rejected with the file named", "[store]") {
  TempDir dir;
  const auto path = dir / "bad.safetensors";
  const std::string a16 = R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})";

  SECTION("truncated in the data") {
    std::mt19937_64 rng(9);
    write_safetensors(path, {random_tensor("x", DType::F32, {100}, rng)});
    auto bytes = read_bytes(path);
    bytes.resize(bytes.size() - 200);
    write_bytes(path, bytes);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "truncated");
  }
  SECTION("truncated in the header") {
    craft(path, "{" + a16 + "}", 16);
    auto bytes = read_bytes(path);
    bytes.resize(20);
    write_bytes(path, bytes);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "truncated: safetensors header length");
  }
  SECTION("shorter than the length field") {
    write_text(path, "abc");
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "truncated");
  }
  SECTION("header over 100 MB") {
    const std::uint64_t len = 100'000'001;
    std::string file(8, '\0');
    std::memcpy(file.data(), &len, 8);
    write_text(path, file);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "exceeds the 100 MB limit");
  }
  SECTION("offsets past the data") {
    craft(path, "{" + a16 + "}", 12);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "run past the 12-byte data buffer");
  }
  SECTION("overlapping ranges") {
    craft(path, "{" + a16 + R"(,"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "overlap tensor 'a'");
  }
  SECTION("a gap between ranges") {
    craft(path, "{" + a16 + R"(,"b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}})", 36);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "gap of 4 bytes");
  }
  SECTION("range size disagrees with shape") {
    craft(path, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 12);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "need 16");
  }
  SECTION("end before begin") {
    craft(path, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "end before they begin");
  }
  SECTION("bytes after the last tensor") {
    craft(path, "{" + a16 + "}", 20);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "cover 16");
  }
  SECTION("unknown dtype") {
    craft(path, R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "unsupported dtype 'F8_E4M3'");
  }
  SECTION("negative dimension") {
    craft(path, R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "negative");
  }
  SECTION("metadata value not a string") {
    craft(path, R"({"__metadata__":{"step":3}})", 0);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "'step' is not a string");
  }
  SECTION("header not JSON") {
    craft(path, "{not json", 0);
    REQUIRE_FILE_ERROR(read_safetensors(path), path, "not valid JSON");
  }
}

TEST_CASE("streamed safetensors writing equals the in-memory writer byte for byte", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(23);
  const std::vector<HostTensor> tensors = {random_tensor("a", DType::F32, {3, 4}, rng),
                                           random_tensor("b", DType::BF16, {5}, rng),
                                           random_tensor("c", DType::I64, {}, rng)};
  const std::map<std::string, std::string> metadata = {{"wb.step", "0"}};
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  std::vector<std::size_t> fetched;
  const auto streamed = dir / "streamed.safetensors";
  write_safetensors(streamed, specs, [&](std::size_t i) {
    fetched.push_back(i);
    return tensors[i].data;
  }, metadata);
  write_safetensors(dir / "memory.safetensors", tensors, metadata);
  REQUIRE(fetched == std::vector<std::size_t>{0, 1, 2});
  REQUIRE(read_bytes(streamed) == read_bytes(dir / "memory.safetensors"));

  // A fetch that disagrees with its spec is an error and leaves no half-written file.
  const auto bad = dir / "bad.safetensors";
  REQUIRE_FILE_ERROR(write_safetensors(bad, specs, [&](std::size_t i) {
    auto data = tensors[i].data;
    if (i == 1) data.pop_back();
    return data;
  }), bad, "tensor 'b': has 9 data bytes, expected 10");
  REQUIRE_FALSE(std::filesystem::exists(bad));
}
