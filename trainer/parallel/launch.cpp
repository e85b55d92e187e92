#include "trainer/parallel/launch.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "trainer/parallel/error.hpp"

extern char** environ;

namespace wb::parallel {

namespace {

const std::string* find(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int parse_int(const Environment& env, const char* name, int min_value) {
  const std::string& text = *find(env, name);
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < min_value) {
    throw DistError(std::string("launcher environment: ") + name + "='" + text + "'; expected an integer >= " +
                    std::to_string(min_value));
  }
  return value;
}

int parse_or(const Environment& env, const char* name, int min_value, int fallback) {
  return find(env, name) ? parse_int(env, name, min_value) : fallback;
}

void check_rank(const char* what, int value, const char* size_name, int size) {
  if (value >= size) {
    throw DistError(std::string("launcher environment: ") + what + " " + std::to_string(value) +
                    " is not below " + size_name + " " + std::to_string(size));
  }
}

bool forwarded(const std::string& name) {
  static const char* const exact[] = {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH"};
  static const char* const prefixes[] = {"WB_", "OMP_", "NCCL_", "DNNL_", "ONEDNN_", "CUDA_"};
  for (const char* e : exact) {
    if (name == e) return true;
  }
  for (const char* p : prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

}  // namespace

LaunchInfo launch_info_from(const Environment& env) {
  LaunchInfo info;
  if (find(env, "OMPI_COMM_WORLD_SIZE") || find(env, "OMPI_COMM_WORLD_RANK")) {
    info.launcher = "openmpi";
    info.world_size = parse_or(env, "OMPI_COMM_WORLD_SIZE", 1, 1);
    info.rank = parse_or(env, "OMPI_COMM_WORLD_RANK", 0, 0);
    check_rank("OMPI_COMM_WORLD_RANK", info.rank, "OMPI_COMM_WORLD_SIZE", info.world_size);
    info.local_rank = parse_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, info.rank);
    info.local_size = parse_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, info.world_size);
    check_rank("OMPI_COMM_WORLD_LOCAL_RANK", info.local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE", info.local_size);
  } else if (find(env, "PMI_SIZE") || find(env, "PMI_RANK")) {
    info.launcher = "pmi";
    info.world_size = parse_or(env, "PMI_SIZE", 1, 1);
    info.rank = parse_or(env, "PMI_RANK", 0, 0);
    check_rank("PMI_RANK", info.rank, "PMI_SIZE", info.world_size);
    info.local_rank = parse_or(env, "MPI_LOCALRANKID", 0, info.rank);
    info.local_size = parse_or(env, "MPI_LOCALNRANKS", 1, info.world_size);
    check_rank("MPI_LOCALRANKID", info.local_rank, "MPI_LOCALNRANKS", info.local_size);
  }
  return info;
}

LaunchInfo launch_info() { return launch_info_from(process_environment()); }

int default_threads(const LaunchInfo& info, unsigned hardware_threads) {
  const int per_rank = static_cast<int>(hardware_threads) / std::max(1, info.local_size);
  return std::max(1, per_rank);
}

std::vector<std::string> strip_nproc(std::span<const std::string> args) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

std::vector<std::string> mpirun_command(int nproc, const std::string& self_exe, std::span<const std::string> args,
                                        bool as_root, const Environment& env) {
  const std::string* mpirun = find(env, "WB_MPIRUN");
  std::vector<std::string> cmd = {mpirun && !mpirun->empty() ? *mpirun : "mpirun",
                                  "-np", std::to_string(nproc), "--oversubscribe", "--bind-to", "none"};
  if (as_root) cmd.push_back("--allow-run-as-root");
  for (const auto& [name, value] : env) {
    if (forwarded(name)) {
      cmd.push_back("-x");
      cmd.push_back(name);
    }
  }
  cmd.push_back(self_exe);
  const auto rest = strip_nproc(args);
  cmd.insert(cmd.end(), rest.begin(), rest.end());
  return cmd;
}

void relaunch_under_mpirun(int nproc, int argc, char** argv) {
  if (nproc < 1) throw DistError("--nproc " + std::to_string(nproc) + ": expected a number of ranks >= 1");
  const LaunchInfo info = launch_info();
  if (info.launcher != "none") {
    throw DistError("--nproc " + std::to_string(nproc) + ": this process was already started by a launcher (" +
                    info.launcher + ", world size " + std::to_string(info.world_size) +
                    "); drop --nproc or do not use mpirun");
  }
  char self[PATH_MAX + 1] = {};
  const ssize_t n = readlink("/proc/self/exe", self, PATH_MAX);
  if (n <= 0) {
    throw DistError(std::string("--nproc: cannot read /proc/self/exe to relaunch this program: ") + std::strerror(errno));
  }
  const bool as_root = geteuid() == 0;
  if (as_root) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  const auto cmd = mpirun_command(nproc, std::string(self, static_cast<std::size_t>(n)), args, as_root,
                                  process_environment());
  std::vector<char*> c_args;
  for (const auto& a : cmd) c_args.push_back(const_cast<char*>(a.c_str()));
  c_args.push_back(nullptr);
  execvp(c_args[0], c_args.data());
  throw DistError("--nproc " + std::to_string(nproc) + ": cannot run " + cmd[0] + " (" + std::strerror(errno) +
                  "); install OpenMPI (Debian: openmpi-bin) or set WB_MPIRUN to mpirun's path");
}

}  // namespace wb::parallel
