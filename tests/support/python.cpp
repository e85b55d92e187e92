#include "support/python.hpp"

#include <catch2/catch.hpp>

#include "support/files.hpp"
#include "support/peers.hpp"

namespace wb::test {

ProcessResult run_python(const std::string& args) { return run_command(shell_quote(WB_PYTHON) + " " + args); }

ProcessResult run_python_script(const TempDir& dir, const std::string& name, const std::string& source,
                                const std::string& args) {
  const std::string script = dir.file(name);
  write_text(script, source);
  return run_command("cd " + shell_quote(dir.path().string()) + " && " + shell_quote(WB_PYTHON) + " " +
                     shell_quote(script) + (args.empty() ? "" : " " + args));
}

void run_torch_script(const TempDir& dir, const std::string& name, const std::string& body) {
  static const char* const kPrelude =
      "import os, sys, json, math\n"
      "import numpy as np\n"
      "import torch\n"
      "import torch.nn.functional as F\n"
      "torch.set_num_threads(2)\n"
      "torch.backends.cudnn.deterministic = True\n"
      "def load(name, *shape, dtype=np.float32):\n"
      "    return torch.from_numpy(np.fromfile(name, dtype=dtype).reshape(shape).copy())\n"
      "def save(name, t):\n"
      "    np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32)).tofile(name)\n";
  const ProcessResult r = run_python_script(dir, name + ".py", kPrelude + body);
  INFO("python output:\n" << r.output);
  REQUIRE(r.exit_code == 0);
}

}  // namespace wb::test
