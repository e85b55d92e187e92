// .npz (zip of .npy entries, stored or deflated): read_npz on arbitrary bytes.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "store/tensor_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("input.npz", data, size);
  WB_FUZZ_GUARD("npz", wb::store::TensorFileError, path, {
    for (const auto& t : wb::store::read_npz(path)) {
      if (t.data.size() != static_cast<std::size_t>(t.numel()) * wb::store::dtype_size(t.dtype)) std::abort();
    }
  });
  return 0;
}
