// wb: the headless command-line front-end over run files. Each subcommand lives in cmd_<name>.cpp and
// is registered by one line in WB_CLI_COMMANDS below.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

#include "app/cli/cli.hpp"
#include "store/db.hpp"

// One line per subcommand: X("name", handler, "one-line help"). The handler is
// `int wb::cli::cmd_<handler>(int argc, char** argv)`, defined in cmd_<handler>.cpp; argv[0] is the name.
#define WB_CLI_COMMANDS(X)                                                                      \
  X("info", info, "show a run file's metadata, ranks, row counts, completeness and dropped events") \
  X("merge", merge, "merge RUNDIR/rank-<r>.sqlite files into one run file")                        \
  X("export", export, "write a run's dumped tensors as .safetensors or a directory of .npy files")   \
  X("compare", compare, "compare tensors of A against reference B; name the first divergence") \
  X("estimate-noise", estimate_noise, "our own step's float32 noise, from a replay in another summation order") \
  X("diff", diff, "per-layer time of two runs side by side (ours against an imported PyTorch trace)") \
  X("import", import, "read a torch.profiler trace (Kineto or legacy JSON) into a run file")          \
  X("report", report, "profile tables and warnings: ops, steps, input starvation, allreduce overlap") \
  X("suggest-split", suggest_split, "predicted allreduce split points (DP, MG-WFBP, DDP 25 MB, MindSpore)") \
  X("tune-split", tune_split, "measure the model's best splits in short alternated trial runs; keep the fastest") \
  X("whatif", whatif, "predict the step time and critical path with ops, collectives or input made slower or faster")

namespace wb::cli {
#define WB_DECLARE(name, handler, help) int cmd_##handler(int argc, char** argv);
WB_CLI_COMMANDS(WB_DECLARE)
#undef WB_DECLARE
}  // namespace wb::cli

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

constexpr Command kCommands[] = {
#define WB_ENTRY(name, handler, help) {name, &wb::cli::cmd_##handler, help},
    WB_CLI_COMMANDS(WB_ENTRY)
#undef WB_ENTRY
};

void print_overview(std::FILE* to) {
  std::fprintf(to,
               "usage: wb <command> [args] [--help]\n\n"
               "The ResNet-50 workbench's command-line tool: inspect, merge, export and compare run files.\n\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(to, "  %-14s %s\n", c.name, c.help);
  std::fprintf(to, "\nExit status: 0 success, 1 a comparison failed, 2 bad input.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_overview(stderr);
    return 2;
  }
  std::string_view first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    print_overview(stdout);
    return 0;
  }
  const Command* command = nullptr;
  for (const Command& c : kCommands)
    if (first == c.name) command = &c;
  if (command == nullptr) {
    std::fprintf(stderr, "wb: unknown command '%s' (run 'wb --help' for the list)\n", argv[1]);
    return 2;
  }
  try {
    return command->run(argc - 1, argv + 1);
  } catch (const wb::cli::HelpRequested& help) {
    std::fputs(help.what(), stdout);
    std::size_t n = std::strlen(help.what());
    if (n == 0 || help.what()[n - 1] != '\n') std::fputc('\n', stdout);
    return 0;
  } catch (const wb::cli::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // StoreError, TensorFileError, ...: their messages already name the file and what was expected.
    std::fprintf(stderr, "wb %s: %s\n", command->name, e.what());
    return 2;
  }
}
