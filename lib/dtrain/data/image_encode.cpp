// PNG and JPEG writers (libpng's simplified API, TurboJPEG), the inverse of image.cpp's
// decoders: what test trees and exported datasets are made of.
#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include "dtrain/base/error.hpp"
#include "dtrain/data/image.hpp"

namespace dtrain {

namespace {
void check_image(const Image& img) {
  if ((img.channels != 1 && img.channels != 3) || img.width <= 0 || img.height <= 0 ||
      img.width * img.height > kMaxImagePixels ||
      img.pixels.size() != static_cast<size_t>(img.width * img.height * img.channels))
    DTRAIN_THROW_SYSTEM(fmt::format("encode: an image of {} x {} x {} with {} bytes", img.width,
                                    img.height, img.channels, img.pixels.size()));
}
}  // namespace

std::vector<uint8_t> encode_png(const Image& img) {
  check_image(img);
  png_image p{};
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(img.width);
  p.height = static_cast<png_uint_32>(img.height);
  p.format = img.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  // The first call measures, the second writes.
  if (!png_image_write_to_memory(&p, nullptr, &size, 0, img.pixels.data(), 0, nullptr))
    DTRAIN_THROW_SYSTEM(fmt::format("libpng: {}", p.message));
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&p, out.data(), &size, 0, img.pixels.data(), 0, nullptr))
    DTRAIN_THROW_SYSTEM(fmt::format("libpng: {}", p.message));
  out.resize(size);
  return out;
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality) {
  check_image(img);
  tjhandle h = tjInitCompress();
  if (!h) DTRAIN_THROW_SYSTEM("TurboJPEG: cannot make a compressor");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int grey = img.channels == 1;
  const int rc = tjCompress2(h, img.pixels.data(), static_cast<int>(img.width), 0,
                             static_cast<int>(img.height), grey ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                             grey ? TJSAMP_GRAY : TJSAMP_444, quality, TJFLAG_ACCURATEDCT);
  std::string why = rc == 0 ? "" : tjGetErrorStr2(h);
  tjDestroy(h);
  std::vector<uint8_t> out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  if (rc != 0) DTRAIN_THROW_SYSTEM(fmt::format("TurboJPEG: {}", why));
  return out;
}

}  // namespace dtrain
