// Image files (ImageFolder data sets): ImageDecoder::decode on arbitrary bytes, JPEG through
// libjpeg-turbo and PNG through libspng. A decoded image must hold exactly width x height RGB pixels,
// and no input, decoded or refused, may have made the decoder allocate more than PIL's
// decompression-bomb limit of pixels.
// The libraries are Debian's (not instrumented): the fuzzer's coverage guidance sees this project's
// code, and AddressSanitizer catches a library write past the buffers handed to it.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "trainer/data/image_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static wb::data::ImageDecoder decoder;  // reused across inputs, as a data worker reuses it
  const std::string name = "input.jpg";
  wb::data::RgbImage image;
  WB_FUZZ_GUARD("image", wb::data::DataError, name, {
    decoder.decode(data, size, name, image);
    if (image.width < 1 || image.height < 1 ||
        image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3) {
      std::abort();
    }
  });
  if (image.pixels.capacity() > 3 * wb::data::kMaxImagePixels) std::abort();
  return 0;
}
