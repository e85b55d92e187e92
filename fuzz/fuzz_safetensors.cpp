// .safetensors: read_safetensors (with its metadata) on arbitrary bytes.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "store/tensor_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("input.safetensors", data, size);
  WB_FUZZ_GUARD("safetensors", wb::store::TensorFileError, path, {
    std::map<std::string, std::string> metadata;
    for (const auto& t : wb::store::read_safetensors(path, &metadata)) {
      if (t.data.size() != static_cast<std::size_t>(t.numel()) * wb::store::dtype_size(t.dtype)) std::abort();
    }
  });
  return 0;
}
