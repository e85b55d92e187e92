// wb-train: the instrumented ResNet-50 data-parallel trainer. One process per device; `--nproc N`
// relaunches itself under mpirun. Bad input gets one line and exit code 2.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "store/db.hpp"
#include "trainer/config.hpp"
#include "trainer/data/error.hpp"
#include "trainer/parallel/launch.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/train.hpp"

namespace {

// Errors in what the user gave (flags, config, data, a run file) exit with 2; anything else with 1.
bool is_bad_input(const std::exception& e) {
  return dynamic_cast<const wb::trainer::ConfigError*>(&e) != nullptr ||
         dynamic_cast<const wb::data::DataError*>(&e) != nullptr ||
         dynamic_cast<const wb::model::ModelError*>(&e) != nullptr ||
         dynamic_cast<const wb::store::StoreError*>(&e) != nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace wb;
  std::vector<std::string> args(argv + 1, argv + argc);
  trainer::TrainConfig cfg;
  try {
    bool help = false;
    cfg = trainer::parse_args(args, &help);
    if (help) {
      std::cout << trainer::usage();
      return 0;
    }
    trainer::validate(cfg);
    trainer::check_save_path(cfg.save);
    if (cfg.nproc > 0 && parallel::launch_info().launcher == "none") {
      // mpirun hands the ranks a pseudo-terminal; tell them whether the user's stdout really is one.
      setenv("WB_STDOUT_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
      parallel::relaunch_under_mpirun(cfg.nproc, argc, argv);  // returns only by throwing
    }
    return trainer::run_training(cfg);
  } catch (const std::exception& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return is_bad_input(e) ? 2 : 1;
  }
}
