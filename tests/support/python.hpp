#pragma once
// Running Python from tests with the interpreter the build was configured with (WB_PYTHON, which has
// torch, torchvision and numpy).

#include <string>

#include "support/process.hpp"
#include "support/temp_dir.hpp"

namespace wb::test {

// WB_PYTHON followed by `args`, which reach /bin/sh as they are (quote them with shell_quote); stdout
// and stderr together.
ProcessResult run_python(const std::string& args);

// Writes `source` to dir/name and runs it with WB_PYTHON inside dir, `args` appended as they are.
ProcessResult run_python_script(const TempDir& dir, const std::string& name, const std::string& source,
                                const std::string& args = "");

// Writes `body` to dir/<name>.py after a prelude (os, sys, json, math, numpy as np, torch, F; 2 threads;
// deterministic cuDNN; load(name, *shape, dtype) and save(name, t) for raw float32 files) and runs it
// inside dir. Fails the test, with the script's output, when it exits non-zero.
void run_torch_script(const TempDir& dir, const std::string& name, const std::string& body);

}  // namespace wb::test
