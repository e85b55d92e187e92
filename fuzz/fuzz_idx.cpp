// Fashion-MNIST IDX (gzip or plain): the images reader and the labels reader on the same bytes.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "trainer/data/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("input-idx-ubyte.gz", data, size);
  WB_FUZZ_GUARD("idx", wb::data::DataError, path, {
    wb::data::IdxImages images = wb::data::read_idx_images(path);
    if (images.pixels.size() != static_cast<std::size_t>(images.count * images.rows * images.cols)) std::abort();
  });
  WB_FUZZ_GUARD("idx", wb::data::DataError, path, {
    for (std::int32_t label : wb::data::read_idx_labels(path)) {
      if (label < 0 || label > 9) std::abort();
    }
  });
  return 0;
}
