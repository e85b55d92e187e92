// wb-train's JSON config: parse_args(--config FILE) and validate. A config that is accepted must
// survive the trip through to_json (what the run file records) and back unchanged.
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "trainer/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("config.json", data, size);
  WB_FUZZ_GUARD("config", wb::trainer::ConfigError, path, {
    bool help = false;
    wb::trainer::TrainConfig cfg = wb::trainer::parse_args({"--config", path.string()}, &help);
    bool valid = true;
    try {
      wb::trainer::validate(cfg);
    } catch (const wb::trainer::ConfigError& e) {
      valid = false;
      if (std::string(e.what()).empty()) std::abort();
    }
    if (valid) {
      nlohmann::json recorded = cfg.to_json();
      recorded.erase("config_file");  // where it came from, not a setting
      wb::trainer::TrainConfig again;
      wb::trainer::apply_json(again, recorded, "recorded config");
      again.config_file = cfg.config_file;
      recorded["config_file"] = cfg.config_file;
      if (again.to_json() != recorded) {
        std::fprintf(stderr, "fuzz config: the recorded config does not read back the same:\n%s\n%s\n",
                     recorded.dump().c_str(), again.to_json().dump().c_str());
        std::abort();
      }
    }
  });
  return 0;
}
