// Running wb-train from the app: the child process with its output captured line by line (progress
// lines end in '\r'), and the launch of a re-run with the recorded run's own settings and new split
// points. The app never links the trainer; it starts the wb-train that sits next to its own binary.
#pragma once

#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace wb::app_model {

class ChildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A child process whose stdout and stderr are read by a background thread.
class ChildProcess {
 public:
  // Throws ChildError naming the executable when it cannot be started.
  ChildProcess(const std::filesystem::path& exe, const std::vector<std::string>& args);
  ~ChildProcess();  // terminates a child still running, then reaps it
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool running() const;
  // The exit status once finished (128 + signal for a killed child).
  std::optional<int> exit_code() const;
  // Every complete output line so far, plus the line being written.
  std::vector<std::string> lines() const;
  std::string last_line() const;
  void terminate();  // SIGTERM
  // Blocks until the child has exited and its output is read; returns the exit status.
  int wait();

 private:
  void read_loop(int fd);
  int pid_ = -1;
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
  std::string partial_;
  std::optional<int> exit_code_;
  std::thread reader_;
};

// The executable `name` in the directory of the running binary (/proc/self/exe).
std::filesystem::path sibling_executable(std::string_view name);
// The wb-train the tuner starts: $WB_TRAIN_BIN when set, else the one next to the running binary.
// Throws ChildError naming the path (and the variable) when it is not an executable file.
std::filesystem::path train_executable();

// A wb-train re-run: settings written to config_path as JSON, and the arguments that point at it.
struct TrainLaunch {
  std::filesystem::path config_path;
  std::filesystem::path run_path;
  std::vector<std::string> args;
  nlohmann::json config;
};

// The recorded config (meta.config_json) with run, config_file and the split settings replaced: the
// new split in allreduce_split (its points, or "none" for an empty split: one bucket) with bucket_mb 0,
// nproc = world_size for multi-rank runs, the run file in `dir`. Writes the config file, the only place
// the split goes (args are --config and --run); throws ChildError when it cannot write it, and
// allreduce::SplitError when the split is not ascending.
TrainLaunch make_train_launch(const nlohmann::json& config, int world_size, const std::vector<int>& split,
                              const std::filesystem::path& dir, std::string_view stem);

// "step 2 [3/6]" in a wb-train progress line (step 2, counted from 0, is the third of six); nullopt
// when the line has none.
struct TrainProgress {
  int step = 0;   // the step just finished, from 0
  int done = 0;   // steps finished
  int steps = 0;  // steps in the run
};
std::optional<TrainProgress> parse_progress(std::string_view line);

}  // namespace wb::app_model
