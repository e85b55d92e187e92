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
  } catch (const trainer::ConfigError& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return 2;
  } catch (const data::DataError& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return 2;
  } catch (const model::ModelError& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return 2;
  } catch (const store::StoreError& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "wb-train: " << e.what() << "\n";
    return 1;
  }
}
