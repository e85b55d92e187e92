// End to end: a run file written by the store's Writer, exported by the built `wb` binary as
// .safetensors and as a .npy directory, read back by our readers and by numpy, compared bit-exactly.
#include "test_store_tensorfile_common.hpp"

#include <algorithm>

#include "store/writer.hpp"
#include "support/peers.hpp"

using namespace wb::store;
using namespace wb::store::test;

namespace {

const char* kNumpyChecksExport = R"py(
import json, struct, sys
import numpy as np

d = sys.argv[1]
expected = json.load(open(d + '/expected.json'))
np_dtype = {'F32': '<f4', 'F64': '<f8', 'I64': '<i8', 'U8': '|u1', 'BF16': '<u2'}
problems = []

# the npy directory: every file through numpy.load
for e in expected['npy']:
    a = np.load('%s/npy/%s' % (d, e['file']), allow_pickle=False)
    raw = open('%s/%s' % (d, e['raw']), 'rb').read()
    if a.dtype.str != np_dtype[e['dtype']] or list(a.shape) != e['shape'] or a.tobytes() != raw:
        problems.append('npy %s: %s %s' % (e['file'], a.dtype.str, a.shape))

# the safetensors file: struct + json + numpy.frombuffer
blob = open(d + '/out.safetensors', 'rb').read()
(n,) = struct.unpack('<Q', blob[:8])
header = json.loads(blob[8:8 + n])
meta = header.pop('__metadata__')
data = blob[8 + n:]
if list(header) != [e['key'] for e in expected['safetensors']]:
    problems.append('keys %s' % list(header))
if json.loads(meta['wb.exec_order']) != {e['key']: e['exec_order'] for e in expected['safetensors']}:
    problems.append('wb.exec_order %s' % meta['wb.exec_order'])
for e in expected['safetensors']:
    info = header[e['key']]
    b, end = info['data_offsets']
    a = np.frombuffer(data[b:end], np_dtype[e['dtype']]).reshape(e['shape'])
    if info['dtype'] != e['dtype'] or a.tobytes() != open('%s/%s' % (d, e['raw']), 'rb').read():
        problems.append('safetensors %s' % e['key'])
print('numpy checked %d npy files and %d safetensors entries, problems: %s' %
      (len(expected['npy']), len(expected['safetensors']), problems))
sys.exit(1 if problems else 0)
)py";

std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

std::string wb_command(const std::string& args) { return std::string(WB_BINARY_DIR) + "/bin/wb " + args; }

}  // namespace

TEST_CASE("wb export safetensors|npy writes the dump under the dump keys, bit-exactly", "[store]") {
  REQUIRE(std::filesystem::exists(std::string(WB_BINARY_DIR) + "/bin/wb"));
  TempDir dir;
  const auto run = dir / "run.sqlite";
  std::mt19937_64 rng(2024);

  // Step 0 of ranks 0 and 1, step 3 of rank 0, and a reference tensor (source "torch") that no export
  // may pick up. Rows are added out of exec order: the export orders them.
  std::vector<TensorRow> rows;
  auto add = [&](std::int32_t step, std::int32_t rank, std::string kind, std::string name, std::int32_t order,
                 std::string dtype, std::vector<std::int64_t> shape, std::size_t elsize) {
    std::size_t n = elsize;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    rows.push_back(TensorRow{"run", step, rank, std::move(kind), std::move(name), order, std::move(dtype),
                             std::move(shape), random_bytes(rng, n)});
  };
  for (std::int32_t rank : {0, 1}) {
    add(0, rank, "act", "layer1.0.conv1", 4, "F32", {2, 8, 4, 4}, 4);
    add(0, rank, "input", "", 0, "F32", {2, 3, 8, 8}, 4);
    add(0, rank, "label", "", 1, "I64", {2}, 8);
    add(0, rank, "param", "conv1.weight", 2, "F32", {8, 3, 3, 3}, 4);
    add(0, rank, "buffer", "bn1.running_mean", 3, "F32", {8}, 4);
    add(0, rank, "act", "fc", 5, "BF16", {2, 10}, 2);
    add(0, rank, "loss", "", 6, "F64", {}, 8);
    add(0, rank, "grad", "conv1.weight", 7, "F32", {8, 3, 3, 3}, 4);
    add(0, rank, "param_after", "conv1.weight", 8, "F32", {8, 3, 3, 3}, 4);
    add(0, rank, "buffer_after", "bn1.num_batches_tracked", 9, "I64", {}, 8);
    add(0, rank, "momentum", "conv1.weight", 10, "F32", {8, 3, 3, 3}, 4);
    add(0, rank, "act", "empty", 11, "U8", {0, 4}, 1);
  }
  add(3, 0, "input", "", 0, "F32", {2, 3, 8, 8}, 4);
  {
    WriterOptions opts;
    opts.path = run;
    opts.handle_signals = false;
    Writer writer(opts);
    for (const auto& r : rows) writer.add(r);
    writer.add(TensorRow{"torch", 0, 0, "act", "fc", 5, "F32", {2, 10}, random_bytes(rng, 80)});
    REQUIRE(writer.finish());
  }

  const std::vector<std::string> keys = {"input",
                                         "label",
                                         "param.conv1.weight",
                                         "buffer.bn1.running_mean",
                                         "act.layer1.0.conv1",
                                         "act.fc",
                                         "loss",
                                         "grad.conv1.weight",
                                         "param_after.conv1.weight",
                                         "buffer_after.bn1.num_batches_tracked",
                                         "momentum.conv1.weight",
                                         "act.empty"};
  // rows of step 0 in exec order for one rank
  auto rows_of = [&](std::int32_t rank) {
    std::vector<TensorRow> out;
    for (const auto& r : rows)
      if (r.step == 0 && r.rank == rank) out.push_back(r);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.exec_order < b.exec_order; });
    return out;
  };

  SECTION("safetensors and npy, checked by our readers and by numpy") {
    const ProcessResult st = run_command(wb_command("export safetensors " + run.string() + " " +
                                                    (dir / "out.safetensors").string() + " --step 0"));
    INFO(st.output);
    REQUIRE(st.exit_code == 0);
    REQUIRE_THAT(st.output, Catch::Matchers::Contains("wrote 12 tensors (step 0, rank 0"));
    const ProcessResult np = run_command(wb_command("export npy " + run.string() + " " + (dir / "npy").string() +
                                                    " --step 0 --rank 1"));
    INFO(np.output);
    REQUIRE(np.exit_code == 0);

    // safetensors (rank 0): keys in exec order, data as stored, metadata naming run, step, rank
    std::map<std::string, std::string> meta;
    const auto st_tensors = read_safetensors(dir / "out.safetensors", &meta);
    const auto rank0 = rows_of(0);
    REQUIRE(st_tensors.size() == keys.size());
    nlohmann::json expected = {{"npy", nlohmann::json::array()}, {"safetensors", nlohmann::json::array()}};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CAPTURE(i);
      REQUIRE(st_tensors[i].name == keys[i]);
      REQUIRE(dtype_name(st_tensors[i].dtype) == rank0[i].dtype);
      REQUIRE(st_tensors[i].shape == rank0[i].shape);
      REQUIRE(st_tensors[i].data == rank0[i].data);
      const std::string raw = numbered("st_", i, ".bin");
      write_bytes(dir / raw, rank0[i].data);
      expected["safetensors"].push_back({{"key", keys[i]},
                                         {"exec_order", rank0[i].exec_order},
                                         {"dtype", rank0[i].dtype},
                                         {"shape", rank0[i].shape},
                                         {"raw", raw}});
    }
    REQUIRE(meta.at("wb.run") == run.string());
    REQUIRE(meta.at("wb.step") == "0");
    REQUIRE(meta.at("wb.rank") == "0");
    const auto order = nlohmann::json::parse(meta.at("wb.exec_order"));
    REQUIRE(order.at("act.fc") == 5);
    REQUIRE(order.at("act.empty") == 11);

    // npy directory (rank 1): {exec_order:04d}_{key}.npy, BF16 widened exactly to F32
    const auto rank1 = rows_of(1);
    const auto npy_tensors = read_tensor_dir(dir / "npy");
    REQUIRE(npy_tensors.size() == keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CAPTURE(i);
      char file[128];
      std::snprintf(file, sizeof(file), "%04d_%s.npy", rank1[i].exec_order, keys[i].c_str());
      REQUIRE(std::filesystem::exists(dir / "npy" / file));
      REQUIRE(npy_tensors[i].name == keys[i]);
      REQUIRE(npy_tensors[i].shape == rank1[i].shape);
      std::vector<std::byte> want = rank1[i].data;
      std::string dtype = rank1[i].dtype;
      if (dtype == "BF16") {
        std::vector<std::byte> wide;
        for (std::size_t k = 0; k < want.size(); k += 2) {
          wide.insert(wide.end(), {std::byte{0}, std::byte{0}, want[k], want[k + 1]});
        }
        want = wide;
        dtype = "F32";
      }
      REQUIRE(dtype_name(npy_tensors[i].dtype) == dtype);
      REQUIRE(npy_tensors[i].data == want);
      const std::string raw = numbered("npy_", i, ".bin");
      write_bytes(dir / raw, want);
      expected["npy"].push_back({{"file", file}, {"dtype", dtype}, {"shape", rank1[i].shape}, {"raw", raw}});
    }
    REQUIRE(rank1[0].data != rank0[0].data);  // the two ranks really are different dumps

    write_text(dir / "expected.json", expected.dump());
    const ProcessResult check = run_python_script(dir, "check.py", kNumpyChecksExport, dir.path().string());
    INFO(check.output);
    REQUIRE(check.exit_code == 0);
    REQUIRE_THAT(check.output,
                 Catch::Matchers::Contains("checked 12 npy files and 12 safetensors entries, problems: []"));
  }

  SECTION("bad requests exit 2 with one line naming what was expected") {
    const std::string out = (dir / "x.safetensors").string();
    const ProcessResult no_step = run_command(wb_command("export safetensors " + run.string() + " " + out));
    REQUIRE(no_step.exit_code == 2);
    REQUIRE_THAT(no_step.output, Catch::Matchers::Contains("steps 0, 3; choose one with --step N"));
    const ProcessResult missing_step =
        run_command(wb_command("export npy " + run.string() + " " + (dir / "d").string() + " --step 7"));
    REQUIRE(missing_step.exit_code == 2);
    REQUIRE_THAT(missing_step.output, Catch::Matchers::Contains("--step 7"));
    const ProcessResult missing_rank =
        run_command(wb_command("export safetensors " + run.string() + " " + out + " --step 3 --rank 1"));
    REQUIRE(missing_rank.exit_code == 2);
    REQUIRE_THAT(missing_rank.output, Catch::Matchers::Contains("dumped by rank 0"));
    const ProcessResult format = run_command(wb_command("export chrom " + run.string() + " " + out));
    REQUIRE(format.exit_code == 2);
    REQUIRE_THAT(format.output, Catch::Matchers::Contains("unknown format 'chrom'"));
    const ProcessResult not_run =
        run_command(wb_command("export safetensors " + (dir / "absent.sqlite").string() + " " + out));
    REQUIRE(not_run.exit_code == 2);
    REQUIRE_THAT(not_run.output, Catch::Matchers::Contains("absent.sqlite"));
    REQUIRE_FALSE(std::filesystem::exists(out));

    const ProcessResult help = run_command(wb_command("export --help"));
    REQUIRE(help.exit_code == 0);
    REQUIRE_THAT(help.output, Catch::Matchers::Contains("wb export npy RUN DIR"));
  }
}
