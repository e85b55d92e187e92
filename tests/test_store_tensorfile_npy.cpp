// .npy and tensor directories against numpy: files numpy writes (v1.0/2.0/3.0, Fortran order,
// big-endian) must read bit-exactly, and files we write must load in numpy bit-exactly and be
// byte-identical to numpy's own output.
#include "test_store_tensorfile_common.hpp"

using namespace wb::store;
using namespace wb::store::test;

namespace {

const char* kNumpyWritesNpy = R"py(
import json, sys
import numpy as np
from numpy.lib import format as F

out = sys.argv[1]
rng = np.random.default_rng(20240601)
dtypes = {'F32': '<f4', 'F64': '<f8', 'F16': '<f2', 'I32': '<i4', 'I64': '<i8', 'U8': '|u1', 'BOOL': '|b1'}
shapes = [(), (0,), (7,), (3, 5), (2, 3, 4), (2, 0, 3), (1, 1, 6), (4, 1, 3, 2)]

def make(descr, shape):
    dt = np.dtype(descr)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == 'b':
        return (rng.integers(0, 2, size=n) > 0).reshape(shape)
    # random bit patterns: NaN payloads, infinities and subnormals included
    return np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt).reshape(shape).copy()

manifest = []
for version in [(1, 0), (2, 0), (3, 0)]:
    for name, descr in dtypes.items():
        for si, shape in enumerate(shapes):
            base = make(descr, shape)
            for layout in ['c', 'f', 'be', 'fbe']:
                arr = base
                if 'f' in layout and arr.ndim > 0:  # asfortranarray makes a 0-d array 1-d
                    arr = np.asfortranarray(arr)
                if 'be' in layout:
                    arr = arr.byteswap().view(arr.dtype.newbyteorder('>'))
                stem = 'v%d_%s_%d_%s' % (version[0], name, si, layout)
                with open('%s/%s.npy' % (out, stem), 'wb') as f:
                    F.write_array(f, arr, version=version)
                with open('%s/%s.bin' % (out, stem), 'wb') as f:
                    f.write(base.tobytes())
                with open('%s/%s.npy' % (out, stem), 'rb') as f:
                    assert F.read_magic(f) == version
                    shape_r, fortran, dtype_r = F.read_array_header_2_0(f) if version[0] > 1 else F.read_array_header_1_0(f)
                assert shape_r == shape
                manifest.append({'stem': stem, 'dtype': name, 'shape': list(shape), 'version': version[0],
                                 'fortran': bool(fortran), 'big': dtype_r.byteorder == '>'})
json.dump(manifest, open(out + '/manifest.json', 'w'))
)py";

const char* kNumpyChecksNpy = R"py(
import io, json, sys
import numpy as np
from numpy.lib import format as F

d = sys.argv[1]
bad = 0
manifest = json.load(open(d + '/manifest.json'))
for e in manifest:
    path = '%s/%s.npy' % (d, e['name'])
    arr = np.load(path, allow_pickle=False)
    raw = open('%s/%s.bin' % (d, e['name']), 'rb').read()
    same_values = arr.dtype.str == e['descr'] and list(arr.shape) == e['shape'] and arr.tobytes() == raw
    ref = io.BytesIO()
    F.write_array(ref, arr)
    same_file = ref.getvalue() == open(path, 'rb').read()
    if not (same_values and same_file):
        print('MISMATCH', e['name'], arr.dtype.str, arr.shape, 'values', same_values, 'file', same_file)
        bad += 1
print('numpy loaded %d files, %d mismatches' % (len(manifest), bad))
sys.exit(1 if bad else 0)
)py";

const char* kNumpyChecksV2 = R"py(
import sys
import numpy as np
from numpy.lib import format as F

path, raw_path, ndim = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, 'rb') as f:
    version = F.read_magic(f)
    shape, fortran, dtype = F.read_array_header_2_0(f, max_header_size=1 << 20)
    aligned = f.tell() % 64 == 0
    data = f.read()
ok = version == (2, 0) and len(shape) == ndim and dtype == np.dtype('u1') and not fortran and aligned
ok = ok and data == open(raw_path, 'rb').read()
print('version', version, 'ndim', len(shape), 'aligned', aligned, 'ok', ok)
sys.exit(0 if ok else 1)
)py";

}  // namespace

TEST_CASE("numpy-written npy files (v1-v3, Fortran, big-endian) read bit-exactly", "[store]") {
  TempDir dir;
  const ProcessResult gen = run_python_script(dir, "gen.py", kNumpyWritesNpy, dir.path().string());
  INFO(gen.output);
  REQUIRE(gen.exit_code == 0);

  const auto manifest = nlohmann::json::parse(read_text(dir / "manifest.json"));
  int checked = 0, fortran = 0, big = 0, per_version[4] = {0, 0, 0, 0};
  for (const auto& e : manifest) {
    const std::string stem = e["stem"];
    CAPTURE(stem);
    const HostTensor t = read_npy(dir / (stem + ".npy"));
    REQUIRE(t.name == stem);
    REQUIRE(dtype_name(t.dtype) == e["dtype"].get<std::string>());
    REQUIRE(t.shape == shape_of(e["shape"]));
    REQUIRE(t.data == read_bytes(dir / (stem + ".bin")));
    ++checked;
    fortran += e["fortran"].get<bool>();
    big += e["big"].get<bool>();
    ++per_version[e["version"].get<int>()];
  }
  // 3 versions x 7 dtypes x 8 shapes x 4 layouts
  REQUIRE(checked == 672);
  REQUIRE(per_version[1] == 224);
  REQUIRE(per_version[2] == 224);
  REQUIRE(per_version[3] == 224);
  // numpy records Fortran order only when the array is not also C-contiguous: (3, 5), (2, 3, 4) and
  // (4, 1, 3, 2), in both Fortran layouts, 3 versions, 7 dtypes. Big-endian: the 5 multi-byte dtypes.
  REQUIRE(fortran == 3 * 2 * 3 * 7);
  REQUIRE(big == 2 * 8 * 3 * 5);
}

TEST_CASE("our npy files load in numpy bit-exactly and equal numpy's own bytes", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(7);
  const std::vector<std::pair<DType, std::string>> dtypes = {
      {DType::F32, "<f4"}, {DType::F64, "<f8"}, {DType::F16, "<f2"}, {DType::I32, "<i4"},
      {DType::I64, "<i8"}, {DType::U8, "|u1"},  {DType::BOOL, "|b1"}};
  const std::vector<std::vector<std::int64_t>> shapes = {
      {}, {0}, {1}, {13}, {3, 5}, {2, 3, 4}, {2, 0, 3}, {64, 3, 7, 7}, {1234567890123, 0}};
  nlohmann::json manifest = nlohmann::json::array();
  int n = 0;
  for (const auto& [dtype, descr] : dtypes) {
    for (const auto& shape : shapes) {
      const std::string name = numbered("t", static_cast<std::size_t>(n++), "_") + std::string(dtype_name(dtype));
      const HostTensor t = random_tensor(name, dtype, shape, rng);
      write_npy(dir / (name + ".npy"), t);
      write_bytes(dir / (name + ".bin"), t.data);
      manifest.push_back({{"name", name}, {"descr", descr}, {"shape", shape}});

      const HostTensor back = read_npy(dir / (name + ".npy"));
      REQUIRE(back.dtype == dtype);
      REQUIRE(back.shape == shape);
      REQUIRE(back.data == t.data);
    }
  }
  write_text(dir / "manifest.json", manifest.dump());
  const ProcessResult check = run_python_script(dir, "check.py", kNumpyChecksNpy, dir.path().string());
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  REQUIRE_THAT(check.output, Catch::Matchers::Contains("numpy loaded 63 files, 0 mismatches"));
}

TEST_CASE("npy header over 64 KiB switches to format 2.0", "[store]") {
  // numpy cannot hold 22000 dimensions, so it checks the header with its parser only.
  TempDir dir;
  HostTensor t{"many_dims", DType::U8, std::vector<std::int64_t>(22000, 1), {std::byte{42}}};
  const auto path = dir / "v2.npy";
  write_npy(path, t);
  write_bytes(dir / "v2.bin", t.data);
  const auto bytes = read_bytes(path);
  REQUIRE(bytes[6] == std::byte{2});
  REQUIRE(bytes[7] == std::byte{0});

  const HostTensor back = read_npy(path);
  REQUIRE(back.shape == t.shape);
  REQUIRE(back.data == t.data);

  const ProcessResult check = run_python_script(dir, "check_v2.py", kNumpyChecksV2,
                                         path.string() + " " + (dir / "v2.bin").string() + " 22000");
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
}

TEST_CASE("npy writer refuses BF16 and inconsistent tensors", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(1);
  const auto path = dir / "x.npy";
  REQUIRE_FILE_ERROR(write_npy(path, random_tensor("w", DType::BF16, {4}, rng)), path, "no numpy dtype");
  HostTensor short_data = random_tensor("w", DType::F32, {4}, rng);
  short_data.data.resize(15);
  REQUIRE_FILE_ERROR(write_npy(path, short_data), path, "expected 16");
}

TEST_CASE("malformed npy files are rejected with the file named", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(3);
  const auto good = dir / "good.npy";
  write_npy(good, random_tensor("good", DType::F32, {3, 5}, rng));
  const auto bytes = read_bytes(good);
  REQUIRE(bytes.size() == 128 + 60);

  SECTION("truncated in the data") {
    const auto path = dir / "cut_data.npy";
    write_bytes(path, std::vector<std::byte>(bytes.begin(), bytes.begin() + 128 + 30));
    REQUIRE_FILE_ERROR(read_npy(path), path, "truncated");
  }
  SECTION("truncated in the header") {
    const auto path = dir / "cut_header.npy";
    write_bytes(path, std::vector<std::byte>(bytes.begin(), bytes.begin() + 40));
    REQUIRE_FILE_ERROR(read_npy(path), path, "truncated");
  }
  SECTION("bad magic") {
    auto bad = bytes;
    bad[5] = std::byte{'X'};
    const auto path = dir / "magic.npy";
    write_bytes(path, bad);
    REQUIRE_FILE_ERROR(read_npy(path), path, "bad magic");
  }
  SECTION("unknown format version") {
    auto bad = bytes;
    bad[6] = std::byte{4};
    const auto path = dir / "version.npy";
    write_bytes(path, bad);
    REQUIRE_FILE_ERROR(read_npy(path), path, "version 4.0");
  }
  SECTION("header without a required key") {
    std::string header = "{'descr': '<f4', 'shape': (2,), }";
    header.append(64 - 10 - header.size() - 1, ' ');
    header += '\n';
    std::string file("\x93NUMPY\x01\x00", 8);
    file.push_back(static_cast<char>(header.size()));
    file.push_back('\0');
    file.append(header);
    file.append(8, '\0');
    const auto path = dir / "nokey.npy";
    write_text(path, file);
    REQUIRE_FILE_ERROR(read_npy(path), path, "lacks");
  }
  SECTION("unsupported dtype written by numpy") {
    const auto path = dir / "complex.npy";
    const ProcessResult r =
        run_python("-c \"import numpy as np; np.save('" + path.string() + "', np.ones(3, np.complex64))\"");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE_FILE_ERROR(read_npy(path), path, "unsupported npy dtype '<c8'");
  }
  SECTION("missing file") {
    const auto path = dir / "absent.npy";
    REQUIRE_FILE_ERROR(read_npy(path), path, "cannot open");
  }
}

TEST_CASE("a directory of TroubleShooter-named npy files reads in index order", "[store]") {
  TempDir dir;
  std::mt19937_64 rng(11);
  // file name -> (tensor name, index order); numeric, not lexicographic, order: 2 before 10.
  const std::vector<std::pair<std::string, std::string>> files = {
      {"10_c", "c"}, {"2_b", "b"}, {"1_a", "a"}, {"0003_act.fc", "act.fc"}, {"zeta", "zeta"}, {"_x", "_x"}};
  std::map<std::string, HostTensor> written;
  for (const auto& [file, name] : files) {
    HostTensor t = random_tensor(name, DType::F32, {2, 2}, rng);
    write_npy(dir / (file + ".npy"), t);
    written[name] = t;
  }
  write_text(dir / "notes.txt", "not a tensor");

  for (const auto& tensors : {read_tensor_dir(dir.path()), read_any(dir.path())}) {
    REQUIRE(tensors.size() == 6);
    const std::vector<std::string> expected = {"a", "b", "act.fc", "c", "_x", "zeta"};
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      REQUIRE(tensors[i].name == expected[i]);
      REQUIRE(tensors[i].data == written[expected[i]].data);
    }
  }

  TempDir empty;
  REQUIRE_FILE_ERROR(read_tensor_dir(empty.path()), empty.path(), "no .npy files");
  REQUIRE_FILE_ERROR(read_any(dir / "notes.txt"), dir / "notes.txt", "unknown tensor file type");
}
