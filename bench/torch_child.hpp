// The PyTorch side of a benchmark as a child process: a Python script started with stdin/stdout pipes,
// driven one command line and one answer line at a time, so its start-up is never timed. The script
// prints a first line starting with "ready" (the rest is a banner), answers "step N" with the seconds
// N steps took, and ends on "quit". Shared by bench/cpu_vs_torch and bench/gpu_vs_torch.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace wb::bench {

class TorchChild {
 public:
  // argv[0] is the interpreter; `who` prefixes error messages (the benchmark's name).
  TorchChild(const std::vector<std::string>& argv, std::string who) : who_(std::move(who)) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error(who_ + ": pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error(who_ + ": fork failed");
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      std::perror((who_ + ": exec " + argv[0]).c_str());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    banner_ = read_line();
    if (banner_.rfind("ready", 0) != 0)
      throw std::runtime_error(who_ + ": the PyTorch child (" + argv[0] + ") did not start: " + banner_);
  }
  TorchChild(const TorchChild&) = delete;
  TorchChild& operator=(const TorchChild&) = delete;
  ~TorchChild() {
    if (in_) {
      std::fputs("quit\n", in_);
      std::fclose(in_);
    }
    if (out_) std::fclose(out_);
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
  }

  // The first line, after "ready".
  const std::string& banner() const { return banner_; }
  // Sends one command line and returns the answer line.
  std::string ask(const std::string& command) {
    std::fprintf(in_, "%s\n", command.c_str());
    std::fflush(in_);
    return read_line();
  }
  // Seconds the child took for `steps` training steps.
  double run(int steps) { return std::stod(ask("step " + std::to_string(steps))); }

 private:
  std::string read_line() {
    char buf[512];
    if (!std::fgets(buf, sizeof buf, out_)) throw std::runtime_error(who_ + ": the PyTorch child exited");
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }
  std::string who_;
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string banner_;
};

}  // namespace wb::bench
