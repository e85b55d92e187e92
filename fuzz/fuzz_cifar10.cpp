// CIFAR-10 binary batch: read_cifar10_file on arbitrary bytes.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "trainer/data/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("data_batch_1.bin", data, size);
  wb::data::Dataset set;
  WB_FUZZ_GUARD("cifar10", wb::data::DataError, path, {
    wb::data::read_cifar10_file(path, set);
    if (set.images.size() != set.labels.size() * 3 * wb::data::kCifarSide * wb::data::kCifarSide) std::abort();
    for (std::int32_t label : set.labels) {
      if (label < 0 || label > 9) std::abort();
    }
  });
  return 0;
}
