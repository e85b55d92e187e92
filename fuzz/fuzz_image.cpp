// Image files (ImageFolder data sets): ImageDecoder::decode on arbitrary bytes, JPEG through
// libjpeg-turbo and PNG through libspng. A decoded image must hold exactly width x height RGB pixels,
// and no input, decoded or refused, may have made the decoder allocate more than PIL's
// decompression-bomb limit of pixels.
// The libraries are Debian's (not instrumented): the fuzzer's coverage guidance sees this project's
// code, and AddressSanitizer catches a library write past the buffers handed to it.
#include <algorithm>
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "trainer/data/image_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static wb::data::ImageDecoder decoder;  // reused across inputs, as a data worker reuses it
  const std::string name = "input.jpg";
  wb::data::RgbImage image;
  bool whole_ok = false;
  WB_FUZZ_GUARD("image", wb::data::DataError, name, {
    decoder.decode(data, size, name, image);
    whole_ok = true;
    if (image.width < 1 || image.height < 1 ||
        image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3) {
      std::abort();
    }
  });
  if (image.pixels.capacity() > 3 * wb::data::kMaxImagePixels) std::abort();
  // The partial decode a crop asks for (libjpeg's crop and skip): the central half of the image, whose
  // pixels must be those of the whole decode above.
  const wb::data::RgbImage whole = image;
  wb::data::RgbImage part;
  wb::data::SourceRect r;
  WB_FUZZ_GUARD("image", wb::data::DataError, name, {
    decoder.decode(data, size, name, part, [&r](int w, int h) {
      r = {w / 4, h / 4, w / 4 + std::max(1, w / 2), h / 4 + std::max(1, h / 2)};
      return r;
    });
    if (whole_ok && (part.width != whole.width || part.height != whole.height)) std::abort();
    for (int y = r.y0; whole_ok && y < r.y1; ++y)
      for (int x = r.x0; x < r.x1; ++x)
        for (int c = 0; c < 3; ++c) {
          const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(whole.width) +
                                 static_cast<std::size_t>(x)) * 3 + static_cast<std::size_t>(c);
          if (part.pixels[i] != whole.pixels[i]) std::abort();
        }
  });
  return 0;
}
