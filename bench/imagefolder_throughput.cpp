// Image-folder input throughput: our pipeline (libjpeg-turbo/libspng decode, PIL-exact resize and crop,
// normalisation, in worker threads) against torchvision's DataLoader with PIL (worker processes) on the
// same files, with the same worker count and the eval transforms: Resize(R) + CenterCrop(S) +
// ToTensor + Normalize. The folder is cut from matplotlib's sample photograph by
// scripts/make_imagefolder.py: ImageNet-like by default, all JPEG (baseline 4:2:0, 4:2:2, 4:4:4,
// progressive, greyscale, CMYK, EXIF-rotated) of 300-500 pixels a side; `--formats all` adds the PNG
// variants (a third of the files), whose decode (zlib and PNG's row filters, alike on both sides) costs
// four times a JPEG's. Rounds alternate: one pass of ours,
// then one pass of torchvision's (a persistent child process, bench/imagefolder_throughput.py, whose
// start-up and first pass are not timed). The last line is the ratio ours / torchvision in images/s.
//
//   imagefolder_throughput [--workers 1] [--batch 32] [--size 224] [--images 256] [--rounds 3]
//                          [--sizes 300:500] [--formats jpeg|all] [--folder DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/torch_child.hpp"
#include "trainer/data/dataset.hpp"
#include "trainer/data/image_folder.hpp"
#include "trainer/data/pipeline.hpp"
#include "tests/support/peers.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Options {
  int workers = 1, batch = 32, size = 224, images = 256, rounds = 3;
  std::string sizes = "300:500";
  std::string formats = "jpeg";
  std::string folder;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": expected a value");
      return argv[++i];
    };
    auto number = [&](int lo) {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < lo) {
        throw std::invalid_argument(a + ": expected a whole number >= " + std::to_string(lo) + ", got '" + v + "'");
      }
      return static_cast<int>(n);
    };
    if (a == "--workers") o.workers = number(1);
    else if (a == "--batch") o.batch = number(1);
    else if (a == "--size") o.size = number(8);
    else if (a == "--images") o.images = number(4);
    else if (a == "--rounds") o.rounds = number(1);
    else if (a == "--sizes") o.sizes = value();
    else if (a == "--formats") {
      o.formats = value();
      if (o.formats != "jpeg" && o.formats != "all") {
        throw std::invalid_argument("--formats: expected jpeg or all, got '" + o.formats + "'");
      }
    } else if (a == "--folder") o.folder = value();
    else if (a == "--help" || a == "-h") {
      std::puts("usage: imagefolder_throughput [--workers 1] [--batch 32] [--size 224] [--images 256] [--rounds 3] "
                "[--sizes 300:500] [--formats jpeg|all] [--folder DIR]");
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "' (see --help)");
    }
  }
  return o;
}

int run_command(const std::string& cmd) { return std::system(cmd.c_str()); }

// Per-stage seconds of our workers (read, decode, resize, ...), summed over samples.
struct StageTimes : wb::data::Observer {
  std::mutex mutex;
  double seconds[wb::data::kTransformCount] = {};
  int64_t samples = 0;
  void on_transform(int, int id, int64_t begin_ns, int64_t end_ns) override {
    std::lock_guard lock(mutex);
    seconds[id] += 1e-9 * static_cast<double>(end_ns - begin_ns);
    samples += id == wb::data::kNormalize;
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    fs::path folder = o.folder;
    if (folder.empty()) {
      folder = fs::temp_directory_path() / ("wb-bench-imagefolder-" + std::to_string(o.images) + "-" + o.sizes + "-" + o.formats);
      if (!fs::exists(folder)) {
        const int classes = 4;
        const std::string cmd = std::string(WB_PYTHON) + " " + WB_SOURCE_DIR + "/scripts/make_imagefolder.py '" +
                                folder.string() + "' --classes " + std::to_string(classes) + " --per-class " +
                                std::to_string((o.images + classes - 1) / classes) + " --size " + o.sizes +
                                " --formats " + o.formats + " >/dev/null";
        std::printf("imagefolder_throughput: writing %d images to %s\n", o.images, folder.c_str());
        std::fflush(stdout);
        if (run_command(cmd) != 0) throw std::runtime_error("make_imagefolder.py failed");
      }
    }
    wb::data::Dataset set;
    wb::data::scan_image_folder(folder, set);
    const int64_t steps = set.size() / o.batch;
    if (steps < 1) throw std::runtime_error(folder.string() + ": fewer images than one batch");

    wb::data::PipelineConfig pc;
    pc.batch_size = o.batch;
    pc.workers = o.workers;
    pc.prefetch = 2;
    pc.shuffle = false;
    pc.total_steps = steps;
    pc.transform.image_size = o.size;
    pc.image.recipe = wb::data::ImageRecipe::kTorchvisionEval;
    pc.image.image_size = o.size;
    pc.image.resize_size = wb::data::resize_side_for(o.size);
    StageTimes stages;
    bool observe = false;
    auto ours_pass = [&] {
      const auto t0 = Clock::now();
      wb::data::Pipeline pipe(set, pc, observe ? &stages : nullptr);
      int64_t n = 0;
      while (wb::data::BatchRef b = pipe.pop()) n += static_cast<int64_t>(b->labels.size());
      if (n != steps * o.batch) throw std::runtime_error("our pipeline ended early");
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };

    wb::bench::TorchChild torch({WB_PYTHON, std::string(WB_SOURCE_DIR) + "/bench/imagefolder_throughput.py",
                                 folder.string(), std::to_string(o.workers), std::to_string(o.batch),
                                 std::to_string(o.size), std::to_string(pc.image.resize_size)},
                                "imagefolder_throughput");
    observe = true;
    ours_pass();  // warm-up (page cache, allocations), with the per-stage costs measured
    observe = false;
    const double images = static_cast<double>(steps * o.batch);
    const std::string files = !o.folder.empty() ? o.folder
                              : (o.formats == "jpeg" ? "JPEG, " : "JPEG and PNG, ") + o.sizes + " pixels";
    std::printf("imagefolder_throughput: %lld images (%s), eval transforms Resize(%d) + CenterCrop(%d), batch %d, "
                "%d worker(s) each, %d rounds\n",
                static_cast<long long>(set.size()), files.c_str(), pc.image.resize_size, o.size, o.batch, o.workers,
                o.rounds);
    std::printf("torchvision side: %s\n", torch.banner().c_str());
    std::printf("our per-image costs (warm-up pass, one worker's time):");
    for (int id = 0; id < wb::data::kTransformCount; ++id) {
      if (stages.seconds[id] > 0) {
        std::printf(" %s %.3f ms", std::string(wb::data::transform_names()[static_cast<size_t>(id)]).c_str(),
                    1e3 * stages.seconds[id] / static_cast<double>(stages.samples));
      }
    }
    std::printf("\n");
    double ours_total = 0, torch_total = 0;
    for (int r = 0; r < o.rounds; ++r) {
      const double a = ours_pass();
      const double b = torch.run(1);
      ours_total += a;
      torch_total += b;
      std::printf("round %d: ours %.1f img/s, torchvision %.1f img/s\n", r + 1, images / a, images / b);
      std::fflush(stdout);
    }
    std::printf("ours %.1f img/s (%.1f per worker), torchvision %.1f img/s (%.1f per worker)\n",
                images * o.rounds / ours_total, images * o.rounds / ours_total / o.workers,
                images * o.rounds / torch_total, images * o.rounds / torch_total / o.workers);
    std::printf("ratio ours/torchvision per worker: %.3f\n", torch_total / ours_total);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "imagefolder_throughput: %s\n", e.what());
    return 2;
  }
}
