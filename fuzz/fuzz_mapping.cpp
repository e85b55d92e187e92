// wb compare's mapping file: load_mapping, then its rules applied to a few real dump keys.
#include <cstdlib>

#include "compare/match.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("mapping.json", data, size);
  WB_FUZZ_GUARD("mapping", wb::compare::CompareError, path, {
    wb::compare::MappingFile mapping = wb::compare::load_mapping(path);
    for (const char* key : {"param.layer1.0.conv1.weight", "act.layer4.2.bn3", "grad.fc.bias", "input"}) {
      (void)mapping.rewrite(key);
    }
  });
  return 0;
}
