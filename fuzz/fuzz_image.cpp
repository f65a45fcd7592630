// libFuzzer target: the JPEG and PNG decoders and the resampler on the bytes of one file. Any
// outcome but an image or a UserError is a bug, and so is an image that does not match its
// header (size) or its pixel count, or a resampled crop of it that is not finite, or a decode
// of the part a crop reads whose pixels or resampled crop differ from the whole decode's.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/data/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dtrain::ImageHeader header;
  try {
    header = dtrain::read_image_header(data, size, "fuzz.img");
  } catch (const dtrain::UserError&) {
    // A header refused may still be a file the decoder refuses: it must, not crash.
  }
  for (int channels : {1, 3}) {
    dtrain::Image img;
    try {
      img = dtrain::decode_image(data, size, channels, "fuzz.img");
    } catch (const dtrain::UserError&) {
      continue;
    }
    if (img.channels != channels || img.width != header.width || img.height != header.height ||
        img.pixels.size() != static_cast<size_t>(img.width * img.height * channels))
      __builtin_trap();
    const dtrain::CropBox box = dtrain::random_resized_crop(
        img.width, img.height, 0.08, 1.0, 3.0 / 4, 4.0 / 3, true, size * 31 + channels);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, inv_std[3] = {4.4f, 4.5f, 4.4f};
    std::vector<float> out(static_cast<size_t>(channels) * 8 * 8, NAN);
    dtrain::resample(img, box, 8, 8, mean, inv_std, out.data());
    for (float v : out)
      if (!std::isfinite(v)) __builtin_trap();
    // The part the crop reads, decoded alone, stopping at its last row or not.
    const dtrain::PixelRect reads = dtrain::resample_reads(img.width, img.height, box, 8, 8);
    const dtrain::ImagePart part =
        dtrain::decode_image_part(data, size, channels, reads, "fuzz.img", size % 2 == 0);
    const dtrain::PixelRect& r = part.rect;
    if (r.x0 > reads.x0 || r.y0 > reads.y0 || r.x0 + r.width < reads.x0 + reads.width ||
        r.y0 + r.height < reads.y0 + reads.height || r.x0 + r.width > img.width ||
        r.y0 + r.height > img.height)
      __builtin_trap();
    for (int64_t y = 0; y < r.height; ++y)
      for (int64_t i = 0; i < r.width * channels; ++i)
        if (part.image.pixels[static_cast<size_t>(y * r.width * channels + i)] !=
            img.pixels[static_cast<size_t>(((r.y0 + y) * img.width + r.x0) * channels + i)])
          __builtin_trap();
    std::vector<float> from_part(out.size(), NAN);
    dtrain::resample(part, box, 8, 8, mean, inv_std, from_part.data());
    if (from_part != out) __builtin_trap();
  }
  // A JPEG decoded smaller (1/2, 1/4 or 1/8): a part must be the whole's pixels there (up to a
  // megapixel, so that the inputs that claim the most pixels do not slow every run down).
  if (header.width > 0 && header.width * header.height <= (1 << 20) &&
      std::string(header.format) == "JPEG") {
    const int shrink = 2 << (size % 3);
    const int64_t w = (header.width + shrink - 1) / shrink, h = (header.height + shrink - 1) / shrink;
    try {
      const dtrain::ImagePart whole =
          dtrain::decode_image_part(data, size, 3, {0, 0, w, h}, "fuzz.img", true, shrink);
      const dtrain::PixelRect want{w / 3, h / 4, std::max<int64_t>(1, w / 3), std::max<int64_t>(1, h / 2)};
      const dtrain::ImagePart part =
          dtrain::decode_image_part(data, size, 3, want, "fuzz.img", size % 2 == 0, shrink);
      const dtrain::PixelRect& r = part.rect;
      if (whole.full_width != w || whole.full_height != h || r.x0 > want.x0 ||
          r.x0 + r.width < want.x0 + want.width || r.x0 + r.width > w)
        __builtin_trap();
      for (int64_t y = 0; y < r.height; ++y)
        for (int64_t i = 0; i < r.width * 3; ++i)
          if (part.image.pixels[static_cast<size_t>(y * r.width * 3 + i)] !=
              whole.image.pixels[static_cast<size_t>(((r.y0 + y) * w + r.x0) * 3 + i)])
            __builtin_trap();
    } catch (const dtrain::UserError&) {
    }
  }
  // A part of a file whose whole decode fails may decode (its damage lies below), or be
  // refused: never anything else.
  try {
    dtrain::decode_image_part(data, size, 3, {0, 0, 8, 8}, "fuzz.img", false);
  } catch (const dtrain::UserError&) {
  }
  return 0;
}
