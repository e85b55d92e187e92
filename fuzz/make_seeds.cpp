// Writes the seed corpora of the fuzz targets: for each target a folder of valid inputs made by the
// same writers the tests use (tensor files in every dtype and layout, npz stored and deflated, CIFAR-10
// records, IDX files cut from Debian's Fashion-MNIST, the shipped configs, mapping files, run files
// with every table filled, the small JPEG and PNG files of scripts/make_imagefolder.py --parity and
// --broken, torch.profiler traces cut from tests/fixtures/make_kineto_trace.py's, Kineto and legacy,
// plain and gzipped). scripts/fuzz runs it; nothing it writes is committed.
#include <sqlite3.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/tensor_file.hpp"
#include "store/writer.hpp"
#include "trainer/config.hpp"
#include "trainer/data/dataset.hpp"

namespace fs = std::filesystem;
namespace st = wb::store;

namespace {

st::HostTensor tensor(std::string name, st::DType dtype, std::vector<std::int64_t> shape) {
  st::HostTensor t{std::move(name), dtype, std::move(shape), {}};
  t.data.resize(static_cast<std::size_t>(t.numel()) * st::dtype_size(dtype));
  for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<std::byte>((i * 37 + 11) & 0x3f);
  return t;
}

std::vector<st::HostTensor> sample_tensors() {
  return {tensor("param.conv1.weight", st::DType::F32, {4, 3, 2, 2}), tensor("act.fc", st::DType::F64, {2, 3}),
          tensor("loss", st::DType::F32, {}), tensor("label", st::DType::I64, {3}),
          tensor("half", st::DType::F16, {5}), tensor("mask", st::DType::BOOL, {2, 2}),
          tensor("bytes", st::DType::U8, {7}), tensor("index", st::DType::I32, {1, 2})};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The first `count` items of a Debian Fashion-MNIST IDX file, plain and gzipped.
void idx_seeds(const fs::path& source, std::size_t header, std::size_t item, std::size_t count, const fs::path& out,
               const std::string& stem) {
  gzFile in = gzopen(source.c_str(), "rb");
  if (in == nullptr) return;
  std::string bytes(header + item * count, '\0');
  const int got = gzread(in, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(in);
  if (got != static_cast<int>(bytes.size())) return;
  // The count field (bytes 4..7, big-endian) says `count`.
  bytes[4] = 0, bytes[5] = 0, bytes[6] = static_cast<char>(count >> 8), bytes[7] = static_cast<char>(count & 0xff);
  write_file(out / (stem + ".plain"), bytes);
  gzFile gz = gzopen((out / (stem + ".gz")).c_str(), "wb9");
  gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(gz);
}

void run_file(const fs::path& path, bool complete, bool with_dump) {
  st::WriterOptions opts;
  opts.path = path;
  opts.handle_signals = false;
  opts.overwrite = true;
  st::Writer w(opts);
  w.set_meta("config_json", wb::trainer::TrainConfig{}.to_json().dump());
  w.set_meta("world_size", "1");
  const std::uint32_t main = w.add_track(st::TrackKind::thread, "main");
  const std::uint32_t queue = w.add_track(st::TrackKind::queue, "batch_queue");
  const std::uint32_t stream = w.add_track(st::TrackKind::stream, "stream 7");
  const char* modules[] = {"conv1", "bn1", "layer1.0.conv1", "fc"};
  for (int step = 0; step < 3; ++step) {
    const std::int64_t t0 = 1'000'000 + step * 100'000;
    w.add(st::RangeRow{main, w.intern("step"), t0, t0 + 90'000, static_cast<std::uint8_t>(st::Category::step), 0, step, 0});
    for (int m = 0; m < 4; ++m) {
      w.add(st::RangeRow{main, w.intern(modules[m]), t0 + 1000 + m * 10'000, t0 + 9000 + m * 10'000,
                         static_cast<std::uint8_t>(st::Category::forward), 1, step, static_cast<std::uint64_t>(step * 10 + m + 1)});
      w.add(st::RangeRow{main, w.intern(modules[m]), t0 + 50'000 + m * 8000, t0 + 57'000 + m * 8000,
                         static_cast<std::uint8_t>(st::Category::backward), 1, step, 0});
    }
    st::KernelRow k;
    k.track = stream, k.name = w.intern("sgemm"), k.start_ns = t0 + 2000, k.end_ns = t0 + 5000;
    k.corr_id = static_cast<std::uint64_t>(step * 10 + 1);
    w.add(k);
    w.add(st::CounterRow{queue, t0, 2.0});
    w.add(st::CounterRow{queue, t0 + 500, 1.0});
    w.add(st::AllreduceRow{0, step, 0, 0, 160, 4096, t0 + 70'000, t0 + 71'000, t0 + 80'000});
    w.add(st::StepRow{0, step, t0, t0 + 90'000, 1500, 2000, 2.3 - 0.1 * step, 0.01, 32});
  }
  w.add(st::ParamRow{0, "conv1.weight", {4, 3, 2, 2}, 48, 0, true});
  w.add(st::ParamRow{1, "fc.bias", {10}, 10, 0, false});
  if (with_dump) {
    int order = 0;
    for (const auto& t : sample_tensors()) {
      st::TensorRow row;
      row.kind = "act", row.name = t.name, row.exec_order = order++;
      row.dtype = std::string(st::dtype_name(t.dtype)), row.shape = t.shape, row.data = t.data;
      w.add(std::move(row));
    }
  }
  if (complete) w.finish();
}

// The same file with 512-byte pages: a run file of a few KB instead of hundreds, which the fuzzer
// mutates far faster (every page still holds the rows it held).
void shrink(const fs::path& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK)
    sqlite3_exec(db, "PRAGMA journal_mode = DELETE; PRAGMA page_size = 512; VACUUM;", nullptr, nullptr, nullptr);
  sqlite3_close(db);
}

// Runs one of the project's Python generators (Debian's python3, as the tests do).
void run_python(const std::string& args) {
  const std::string cmd = "/usr/bin/python3 " + args + " >/dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

// Image seeds: every file up to 4 KB that make_imagefolder.py writes for its odd cases (each JPEG
// subsampling, progressive, greyscale, CMYK, EXIF; each PNG colour type and depth) and its broken files
// (truncated, damaged, bad checksum, empty, text). Larger files only slow the fuzzer down.
void image_seeds(const fs::path& source, const fs::path& tmp, const fs::path& out) {
  const std::string maker = (source / "scripts" / "make_imagefolder.py").string();
  run_python(maker + " " + (tmp / "parity").string() + " --parity");
  run_python(maker + " " + (tmp / "broken").string() + " --broken --classes 1 --per-class 1 --size 16:40");
  for (const auto& entry : fs::recursive_directory_iterator(tmp)) {
    if (!entry.is_regular_file() || entry.file_size() > 4096) continue;
    const fs::path rel = fs::relative(entry.path(), tmp);
    std::string flat = rel.string();
    for (char& c : flat) c = c == '/' ? '_' : c;
    fs::copy_file(entry.path(), out / flat, fs::copy_options::overwrite_existing);
  }
}

// Trace seeds: a one-step Kineto trace of make_kineto_trace.py cut to its first 40 events (forward
// ops, runtime calls, kernels, flows) and its last 60 (backward nodes on autograd's thread, the
// optimizer, the ProfilerStep range, metadata), as JSON and gzipped; and the same host events in the
// legacy exporter's shape (a bare list, integer microseconds, "CPU functions", no categories).
void trace_seeds(const fs::path& source, const fs::path& tmp, const fs::path& out) {
  run_python((source / "tests" / "fixtures" / "make_kineto_trace.py").string() + " " + tmp.string() + " --steps 1");
  nlohmann::json trace = nlohmann::json::parse(read_file(tmp / "rank-0.pt.trace.json"));
  const nlohmann::json& all = trace["traceEvents"];
  nlohmann::json cut = nlohmann::json::array();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i < 40 || i + 60 >= all.size()) cut.push_back(all[i]);
  }
  trace["traceEvents"] = cut;
  trace["deviceProperties"] = nlohmann::json::array({trace["deviceProperties"][0]});
  const std::string kineto = trace.dump();
  write_file(out / "kineto.json", kineto);
  gzFile gz = gzopen((out / "kineto.json.gz").c_str(), "wb9");
  gzwrite(gz, kineto.data(), static_cast<unsigned>(kineto.size()));
  gzclose(gz);
  nlohmann::json legacy = nlohmann::json::array();
  for (const auto& e : cut) {
    if (e.value("ph", "") != "X" || e.value("cat", "") == "kernel" || e.value("cat", "").rfind("gpu_", 0) == 0) continue;
    legacy.push_back({{"name", e["name"]}, {"ph", "X"}, {"ts", static_cast<std::int64_t>(e["ts"].get<double>())},
                      {"dur", static_cast<std::int64_t>(e["dur"].get<double>())}, {"tid", 1},
                      {"pid", "CPU functions"}, {"args", nlohmann::json::object()}});
  }
  write_file(out / "legacy.json", legacy.dump(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR SOURCE_DIR\nWrites a seed corpus per fuzz target into OUT_DIR/<target>/.\n",
                 argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path source = argv[2];
  try {
    for (const char* t : {"npy", "npz", "safetensors", "idx", "cifar10", "config", "mapping", "runfile", "image", "torch_trace"}) {
      fs::create_directories(out / t);
    }
    const auto tensors = sample_tensors();
    for (const auto& t : tensors) st::write_npy(out / "npy" / (t.name + ".npy"), t);
    // numpy's own variants: version 2.0, Fortran order, big-endian.
    std::string v1 = read_file(out / "npy" / "act.fc.npy");
    std::string v2 = v1;
    v2[6] = 2;
    v2.insert(10, 2, '\0');
    write_file(out / "npy" / "v2.npy", v2);
    std::string fortran = v1;
    if (auto p = fortran.find("False"); p != std::string::npos) fortran.replace(p, 5, "True ");
    write_file(out / "npy" / "fortran.npy", fortran);
    std::string big = v1;
    if (auto p = big.find("'<f8'"); p != std::string::npos) big[p + 1] = '>';
    write_file(out / "npy" / "big_endian.npy", big);

    st::write_npz(out / "npz" / "stored.npz", tensors, false);
    st::write_npz(out / "npz" / "deflated.npz", tensors, true);
    st::write_npz(out / "npz" / "one.npz", {tensors[0]}, true);

    st::write_safetensors(out / "safetensors" / "all.safetensors", tensors, {{"format", "pt"}});
    st::write_safetensors(out / "safetensors" / "one.safetensors", {tensors[2]});
    st::HostTensor bf16 = tensor("bf", st::DType::BF16, {3, 2});
    st::write_safetensors(out / "safetensors" / "bf16.safetensors", {bf16, tensors[1]});

    wb::data::SyntheticOptions synth;
    synth.test_images = 3;
    wb::data::write_cifar10_file(out / "cifar10" / "three.bin", wb::data::synthetic_images(synth, wb::data::Split::kTest));
    synth.test_images = 1;
    wb::data::write_cifar10_file(out / "cifar10" / "one.bin", wb::data::synthetic_images(synth, wb::data::Split::kTest));

    const fs::path fm = "/usr/share/datasets/fashion-mnist";
    idx_seeds(fm / "t10k-images-idx3-ubyte.gz", 16, 28 * 28, 2, out / "idx", "images");
    idx_seeds(fm / "t10k-labels-idx1-ubyte.gz", 8, 1, 20, out / "idx", "labels");

    for (const auto& entry : fs::directory_iterator(source / "assets" / "configs")) {
      if (entry.path().extension() == ".json") fs::copy_file(entry.path(), out / "config" / entry.path().filename(),
                                                             fs::copy_options::overwrite_existing);
    }
    write_file(out / "config" / "recorded.json", wb::trainer::TrainConfig{}.to_json().dump(1));
    write_file(out / "config" / "split.json", R"({"allreduce_split": [85, 160], "steps": 3, "lr_schedule": "cosine"})");

    write_file(out / "mapping" / "full.json", R"json({
  "pairs": {"param.fc.w": "param.fc.weight"},
  "rules": [{"pattern": "\\.gamma$", "replace": ".weight"}, {"pattern": "^(act)\\.(layer[0-9])", "replace": "$1.$2"}],
  "thresholds": [{"match": "^act\\.layer4\\.", "rel_l2_max": 2e-3}],
  "auto": false
})json");
    write_file(out / "mapping" / "pairs.json", R"({"pairs": {"a": "b", "c": "d"}})");

    run_file(out / "runfile" / "complete.sqlite", true, false);
    run_file(out / "runfile" / "incomplete.sqlite", false, false);
    run_file(out / "runfile" / "dump.sqlite", true, true);
    for (const auto& entry : fs::directory_iterator(out / "runfile")) {
      if (entry.path().extension() != ".sqlite") fs::remove(entry.path());
    }
    for (const char* name : {"complete.sqlite", "incomplete.sqlite", "dump.sqlite"}) shrink(out / "runfile" / name);

    const fs::path tmp = out / "python-made";
    image_seeds(source, tmp / "images", out / "image");
    trace_seeds(source, tmp / "trace", out / "torch_trace");
    fs::remove_all(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
