// .npy: read_npy on arbitrary bytes; a tensor it returns must hold exactly its shape's bytes.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "store/tensor_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("input.npy", data, size);
  WB_FUZZ_GUARD("npy", wb::store::TensorFileError, path, {
    wb::store::HostTensor t = wb::store::read_npy(path);
    if (t.data.size() != static_cast<std::size_t>(t.numel()) * wb::store::dtype_size(t.dtype)) std::abort();
  });
  return 0;
}
