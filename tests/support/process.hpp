#pragma once
// Running shell commands from tests: quoting for /bin/sh, and a command's exit code and output.

#include <string>

namespace wb::test {

// `s` single-quoted for /bin/sh (a ' inside becomes '\'').
std::string shell_quote(const std::string& s);

struct ProcessResult {
  int exit_code = -1;  // the exit status, 128 + signal when killed, -1 when it could not be started
  std::string output;  // stdout and stderr together, in the order they arrived
  std::string out;     // stdout alone
  std::string err;     // stderr alone
};

// Runs `command` with /bin/sh -c in the current directory and waits for it; its stdout and stderr are
// captured (until every process holding them has closed them).
ProcessResult run_command(const std::string& command);

}  // namespace wb::test
