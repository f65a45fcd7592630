// JPEG and PNG decoding, crops and resampling (image.hpp). The files are written here, in
// memory, from synthetic pixels (no data can be downloaded): PNG round trips are exact, JPEG
// ones close; damaged, hostile and foreign files are refused with their reason; the crops
// follow torchvision's procedure and depend on the sample's key alone; the resampler keeps
// constants constant, averages what it shrinks and mirrors exactly.
#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/data/image.hpp"
#include "helpers.hpp"

using namespace dtrain;
using namespace dtrain::test;
using Bytes = std::vector<uint8_t>;

namespace {

// Smooth colours (JPEG's favourite) that differ in every channel and position.
Image synthetic(int64_t w, int64_t h, int channels) {
  Image img{w, h, channels, {}};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        const double fx = double(x) / double(w - 1), fy = double(y) / double(h - 1);
        const double v = c == 0 ? 255 * fx : c == 1 ? 255 * fy : 128 + 60 * std::sin(double(x) / 7);
        img.pixels.push_back(static_cast<uint8_t>(v));
      }
  return img;
}

Bytes to_jpeg(const Image& img, int pixel_format, int subsamp, int quality = 95, int flags = 0) {
  tjhandle h = tjInitCompress();
  REQUIRE(h);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, img.pixels.data(), static_cast<int>(img.width), 0,
                             static_cast<int>(img.height), pixel_format, &buf, &size, subsamp,
                             quality, TJFLAG_ACCURATEDCT | flags);
  INFO(tjGetErrorStr2(h));
  REQUIRE(rc == 0);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  return out;
}

Bytes to_jpeg(const Image& img) {
  return img.channels == 1 ? to_jpeg(img, TJPF_GRAY, TJSAMP_GRAY)
                           : to_jpeg(img, TJPF_RGB, TJSAMP_444);
}

// `format`: PNG_FORMAT_GRAY, PNG_FORMAT_RGB, PNG_FORMAT_RGBA...; pixels of as many channels.
Bytes to_png(int64_t w, int64_t h, uint32_t format, const Bytes& pixels) {
  png_image im{};
  im.version = PNG_IMAGE_VERSION;
  im.width = static_cast<png_uint_32>(w);
  im.height = static_cast<png_uint_32>(h);
  im.format = format;
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&im, nullptr, &size, 0, pixels.data(), 0, nullptr));
  Bytes out(size);
  REQUIRE(png_image_write_to_memory(&im, out.data(), &size, 0, pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

Bytes to_png(const Image& img) {
  return to_png(img.width, img.height, img.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB,
                img.pixels);
}

Image decode(const Bytes& b, int channels) {
  return decode_image(b.data(), b.size(), channels, "train/cat/1.jpg");
}

std::string refusal(const Bytes& b, int channels = 3) {
  return error_of([&] { decode(b, channels); });
}

std::string header_refusal(const Bytes& b) {
  return error_of([&] { read_image_header(b.data(), b.size(), "train/cat/1.jpg"); });
}

double mean_abs_diff(const Bytes& a, const Bytes& b) {
  REQUIRE(a.size() == b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(double(a[i]) - double(b[i]));
  return sum / static_cast<double>(a.size());
}

// Resampled to out_h x out_w with mean 0 and inv_std 1: v / 255 for every channel.
std::vector<float> resampled(const Image& img, const CropBox& box, int64_t out_h, int64_t out_w) {
  const float mean[3] = {0, 0, 0}, inv_std[3] = {1, 1, 1};
  std::vector<float> out(static_cast<size_t>(img.channels * out_h * out_w), -1.f);
  resample(img, box, out_h, out_w, mean, inv_std, out.data());
  return out;
}

}  // namespace

TEST_CASE("PNG round trips are exact, grey and RGB, and convert between them", "[image]") {
  const Image rgb = synthetic(37, 23, 3), grey = synthetic(37, 23, 1);
  const Image a = decode(to_png(rgb), 3), b = decode(to_png(grey), 1);
  CHECK((a.width == 37 && a.height == 23 && a.channels == 3 && a.pixels == rgb.pixels));
  CHECK((b.width == 37 && b.height == 23 && b.channels == 1 && b.pixels == grey.pixels));
  // Grey to RGB repeats the grey; RGB to grey weighs like PIL's convert("L") (ITU-R 601-2).
  const Image g3 = decode(to_png(grey), 3);
  for (size_t i = 0; i < grey.pixels.size(); ++i)
    REQUIRE((g3.pixels[3 * i] == grey.pixels[i] && g3.pixels[3 * i + 1] == grey.pixels[i] &&
             g3.pixels[3 * i + 2] == grey.pixels[i]));
  const Bytes colours = {255, 0, 0, 0, 255, 0, 0, 0, 255, 90, 90, 90, 10, 200, 30, 255, 255, 255};
  const Image l = decode(to_png(6, 1, PNG_FORMAT_RGB, colours), 1);
  CHECK(l.pixels == Bytes{76, 150, 29, 90, 124, 255});
}

TEST_CASE("PNG alpha is dropped, not composited", "[image]") {
  // Colours under alpha 0 and 128 come out as they are, as PIL's convert("RGB") gives them.
  const Bytes rgba = {200, 100, 50, 0, 10, 20, 30, 128, 255, 255, 255, 255};
  CHECK(decode(to_png(3, 1, PNG_FORMAT_RGBA, rgba), 3).pixels ==
        Bytes{200, 100, 50, 10, 20, 30, 255, 255, 255});
  const Bytes ga = {70, 0, 140, 128};
  CHECK(decode(to_png(2, 1, PNG_FORMAT_GA, ga), 1).pixels == Bytes{70, 140});
}

TEST_CASE("Palette PNGs decode to their colours", "[image]") {
  png_image im{};
  im.version = PNG_IMAGE_VERSION;
  im.width = 4;
  im.height = 1;
  im.format = PNG_FORMAT_RGB_COLORMAP;
  im.colormap_entries = 3;
  const Bytes map = {255, 0, 0, 0, 255, 0, 10, 20, 30}, index = {2, 0, 1, 2};
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&im, nullptr, &size, 0, index.data(), 0, map.data()));
  Bytes png(size);
  REQUIRE(png_image_write_to_memory(&im, png.data(), &size, 0, index.data(), 0, map.data()));
  png.resize(size);
  CHECK(decode(png, 3).pixels == Bytes{10, 20, 30, 255, 0, 0, 0, 255, 0, 10, 20, 30});
}

TEST_CASE("JPEG decodes close to its source, grey JPEG to RGB too", "[image]") {
  const Image rgb = synthetic(64, 48, 3), grey = synthetic(64, 48, 1);
  const Image a = decode(to_jpeg(rgb), 3);
  CHECK((a.width == 64 && a.height == 48 && a.channels == 3));
  CHECK(mean_abs_diff(a.pixels, rgb.pixels) < 2.0);
  const Image g = decode(to_jpeg(grey), 3);
  REQUIRE(g.pixels.size() == 64 * 48 * 3);
  Bytes first;
  for (size_t i = 0; i < g.pixels.size(); i += 3) {
    REQUIRE((g.pixels[i] == g.pixels[i + 1] && g.pixels[i] == g.pixels[i + 2]));
    first.push_back(g.pixels[i]);
  }
  CHECK(mean_abs_diff(first, grey.pixels) < 2.0);
  // A colour JPEG to grey: its luma, close to PIL's weights of the source.
  const Image l = decode(to_jpeg(rgb), 1);
  Bytes luma;
  for (size_t i = 0; i < rgb.pixels.size(); i += 3)
    luma.push_back(static_cast<uint8_t>(
        (rgb.pixels[i] * 19595 + rgb.pixels[i + 1] * 38470 + rgb.pixels[i + 2] * 7471 + 0x8000) >>
        16));
  CHECK(mean_abs_diff(l.pixels, luma) < 2.0);
}

TEST_CASE("Decode threads share nothing and agree", "[image]") {
  const Bytes jpeg = to_jpeg(synthetic(64, 48, 3));
  const Image want = decode(jpeg, 3);
  std::vector<int> same(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) same[t] += decode(jpeg, 3).pixels == want.pixels;
    });
  for (auto& th : threads) th.join();
  CHECK(same == std::vector<int>(4, 20));
}

TEST_CASE("Image headers give format and size without decoding", "[image]") {
  const Bytes png = to_png(synthetic(37, 23, 3)), jpeg = to_jpeg(synthetic(64, 48, 1));
  const ImageHeader p = read_image_header(png.data(), png.size(), "a.png");
  CHECK((p.width == 37 && p.height == 23 && std::string(p.format) == "PNG"));
  const ImageHeader j = read_image_header(jpeg.data(), jpeg.size(), "a.jpg");
  CHECK((j.width == 64 && j.height == 48 && std::string(j.format) == "JPEG"));
  // The header alone: a file cut after it still tells its size.
  const Bytes head(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  CHECK(read_image_header(head.data(), head.size(), "a.jpg").width == 64);
  CHECK_THAT(header_refusal(Bytes(png.begin(), png.begin() + 20)),
             Catch::Contains("train/cat/1.jpg: PNG header cut short or corrupt"));
  CHECK(header_refusal(Bytes(jpeg.begin(), jpeg.begin() + 4)) ==
        "train/cat/1.jpg: JPEG header cut short or corrupt (it ends before the image size)");
  // Damage inside the header (the SOF marker's length) is libjpeg-turbo's to name.
  Bytes bad_sof = jpeg;
  for (size_t i = 2; i + 3 < bad_sof.size(); ++i)
    if (bad_sof[i] == 0xFF && bad_sof[i + 1] == 0xC0) {
      bad_sof[i + 2] = bad_sof[i + 3] = 0;
      break;
    }
  CHECK_THAT(
      header_refusal(bad_sof),
      Catch::StartsWith("train/cat/1.jpg: JPEG header cut short or corrupt (libjpeg-turbo: "));
}

// The decode budget counts what a decoder holds besides the pixels out: libpng's whole image
// in the file's channels, a progressive JPEG's coefficients (2 bytes per pixel per
// full-resolution component); a baseline JPEG decodes the rows asked for alone.
TEST_CASE("Decode memory counts the decoder's own buffers", "[image]") {
  const auto header = [](const Bytes& b) { return read_image_header(b.data(), b.size(), "f"); };
  const Image rgb = synthetic(64, 48, 3), grey = synthetic(64, 48, 1);
  const int64_t px = 64 * 48;
  const ImageHeader png = header(to_png(rgb));
  CHECK(decode_bytes(png, 1, 48, 1) == px + 4 * px);
  CHECK(decode_bytes(png, 3, 48, 1) == 3 * px + 4 * px);
  const ImageHeader base = header(to_jpeg(rgb));
  CHECK(base.coefficient_bytes == 0);
  CHECK(decode_bytes(base, 3, 10, 1) == 64 * 10 * 3);
  CHECK(decode_bytes(base, 3, 10, 2) == 32 * 10 * 3);
  const auto progressive = [&](const Image& img, int pf, int sub) {
    return header(to_jpeg(img, pf, sub, 90, TJFLAG_PROGRESSIVE)).coefficient_bytes;
  };
  CHECK(progressive(rgb, TJPF_RGB, TJSAMP_444) == 6);
  CHECK(progressive(rgb, TJPF_RGB, TJSAMP_420) == 4);
  CHECK(progressive(grey, TJPF_GRAY, TJSAMP_GRAY) == 2);
  const ImageHeader p444 = header(to_jpeg(rgb, TJPF_RGB, TJSAMP_444, 90, TJFLAG_PROGRESSIVE));
  CHECK(decode_bytes(p444, 3, 10, 4) == 16 * 10 * 3 + 6 * px);  // shrunk out, full coefficients
}

TEST_CASE("Empty and foreign files are refused naming what they are", "[image]") {
  CHECK(refusal({}) == "train/cat/1.jpg: empty file");
  CHECK(header_refusal({}) == "train/cat/1.jpg: empty file");
  const Bytes gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
  CHECK(refusal(gif) == "train/cat/1.jpg: not a JPEG or PNG file (first bytes 47 49 46 38)");
  CHECK(header_refusal(gif) == refusal(gif));
  CHECK(refusal({0xFF, 0xD8}) == "train/cat/1.jpg: not a JPEG or PNG file (first bytes FF D8)");
}

TEST_CASE("A PNG claiming 100000 x 100000 pixels is refused before allocating them", "[image]") {
  Bytes png = to_png(1, 1, PNG_FORMAT_GRAY, {7});
  REQUIRE(std::string(png.begin() + 12, png.begin() + 16) == "IHDR");
  for (size_t at : {16, 20}) {  // width, height: 100000 big-endian
    png[at] = 0;
    png[at + 1] = 0x01;
    png[at + 2] = 0x86;
    png[at + 3] = 0xA0;
  }
  const uLong crc = crc32(0, png.data() + 12, 17);  // over the type and the data
  for (int k = 0; k < 4; ++k) png[29 + static_cast<size_t>(k)] = uint8_t(crc >> (24 - 8 * k));
  const std::string want =
      "train/cat/1.jpg: claims 100000 x 100000 pixels, more than the 67108864 (8192 x 8192) "
      "dtrain decodes";
  CHECK(header_refusal(png) == want);
  // Through libpng: it accepts the header (CRC right, under its own limits), dtrain does not.
  CHECK(refusal(png, 3) == want);
  CHECK(refusal(png, 1) == want);
}

namespace {
// `png` with a chunk of `type` and `body` put after its IHDR chunk (which ends at byte 33), its
// length field `length` where given (a claim the file does not hold), its CRC right.
Bytes with_chunk(Bytes png, const std::string& type, const Bytes& body,
                 std::optional<uint32_t> length = std::nullopt) {
  Bytes chunk(4);
  const uint32_t len = length.value_or(static_cast<uint32_t>(body.size()));
  for (int k = 0; k < 4; ++k) chunk[static_cast<size_t>(k)] = uint8_t(len >> (24 - 8 * k));
  chunk.insert(chunk.end(), type.begin(), type.end());
  chunk.insert(chunk.end(), body.begin(), body.end());
  const uLong crc = crc32(0, chunk.data() + 4, static_cast<uInt>(4 + body.size()));
  for (int k = 0; k < 4; ++k) chunk.push_back(uint8_t(crc >> (24 - 8 * k)));
  png.insert(png.begin() + 33, chunk.begin(), chunk.end());
  return png;
}
}  // namespace

TEST_CASE("A PNG chunk claiming more than the file holds is refused before libpng reads it",
          "[image]") {
  // libpng allocates a text chunk's claimed length first: 44 bytes claiming 2 GiB took 2 GiB.
  const Bytes png = to_png(4, 4, PNG_FORMAT_GRAY, Bytes(16, 9));
  const Bytes bomb = with_chunk(png, "tEXt", {'a', 'b', 'c'}, 0x7ffffff0u);
  CHECK(refusal(bomb, 1) ==
        "train/cat/1.jpg: PNG data cut short or corrupt (a chunk 'tEXt' at byte 33 claims "
        "2147483632 bytes, past the file's end at " +
            std::to_string(bomb.size()) + ")");
  // A header claiming 8192 x 8192 RGBA at 16 bits (512 MiB) over a few bytes of image data:
  // refused before libpng allocates the image.
  Bytes big = to_png(1, 1, PNG_FORMAT_RGBA, {1, 2, 3, 4});
  for (size_t at : {16, 20}) {  // width, height: 8192
    big[at + 2] = 0x20;
    big[at + 3] = 0;
  }
  big[24] = 16;  // bits per sample
  const uLong crc = crc32(0, big.data() + 12, 17);
  for (int k = 0; k < 4; ++k) big[29 + static_cast<size_t>(k)] = uint8_t(crc >> (24 - 8 * k));
  CHECK_THAT(refusal(big, 3), Catch::Contains("bytes of image data cannot hold the 8192 x 8192 "
                                              "pixels its header claims"));
  // Chunks that fit pass, whatever they are.
  CHECK(decode(with_chunk(png, "tEXt", {'k', 0, 'v'}), 1).pixels == Bytes(16, 9));
}

TEST_CASE("A PNG's gamma does not change its pixels, as PIL reads them", "[image]") {
  // gAMA 1.0 (100000) would have libpng's reader convert the pixels to sRGB; PIL, and so
  // torchvision, take the bytes as stored.
  const Image rgb = synthetic(9, 7, 3);
  const Bytes png = to_png(rgb);
  for (const uint32_t gamma : {100000u, 45455u, 220000u}) {
    Bytes g(4);
    for (int k = 0; k < 4; ++k) g[static_cast<size_t>(k)] = uint8_t(gamma >> (24 - 8 * k));
    const Bytes with_gamma = with_chunk(png, "gAMA", g);
    INFO(gamma);
    CHECK(decode(with_gamma, 3).pixels == rgb.pixels);
    CHECK(decode(with_gamma, 1).pixels == decode(png, 1).pixels);
  }
  // Bytes after IEND that would read as a chunk past the file's end (found by fuzzing: the
  // copy without gAMA walked on past IEND and read beyond the buffer) are left as they are.
  Bytes g = with_chunk(png, "gAMA", {0, 1, 0x86, 0xA0});
  const Bytes junk = {0x7F, 0xFF, 0xFF, 0xFF, 'j', 'u', 'n', 'k', 0, 0, 0, 0};
  g.insert(g.end(), junk.begin(), junk.end());
  CHECK(decode(g, 3).pixels == rgb.pixels);
}

TEST_CASE("Truncated and CMYK files are refused, never returned half grey", "[image]") {
  const Bytes jpeg = to_jpeg(synthetic(64, 48, 3)), png = to_png(synthetic(64, 48, 3));
  for (int channels : {1, 3}) {
    CHECK_THAT(
        refusal(Bytes(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2)), channels),
        Catch::StartsWith("train/cat/1.jpg: JPEG data cut short or corrupt (libjpeg-turbo: "));
    CHECK_THAT(
        refusal(Bytes(png.begin(), png.begin() + static_cast<long>(png.size() / 2)), channels),
        Catch::StartsWith("train/cat/1.jpg: PNG data cut short or corrupt ("));
  }
  Bytes damaged = png;
  damaged[png.size() / 2] ^= 0x55;  // inside IDAT: its CRC no longer matches
  CHECK_THAT(refusal(damaged), Catch::StartsWith("train/cat/1.jpg: PNG data cut short or corrupt"));
  // A 12-bit JPEG: the same stream with its frame header's sample precision set to 12.
  Bytes deep = jpeg;
  for (size_t i = 2; i + 4 < deep.size(); i += 2 + (size_t{deep[i + 2]} << 8 | deep[i + 3])) {
    REQUIRE(deep[i] == 0xFF);
    if (deep[i + 1] != 0xC0) continue;  // baseline SOF0, as to_jpeg writes
    deep[i + 4] = 12;
    break;
  }
  CHECK_THAT(refusal(deep), Catch::StartsWith("train/cat/1.jpg: a JPEG of more than 8 bits a "
                                              "sample, which dtrain does not decode"));
  const Bytes cmyk = to_jpeg(synthetic(16, 16, 4), TJPF_CMYK, TJSAMP_444);
  CHECK(refusal(cmyk) ==
        "train/cat/1.jpg: a CMYK JPEG, which dtrain does not decode (convert it to RGB)");
}

TEST_CASE("Random resized crops depend on the key alone and stay in range", "[image]") {
  const double ratio_lo = 3.0 / 4, ratio_hi = 4.0 / 3;
  auto crop = [&](uint64_t key) {
    return random_resized_crop(500, 375, 0.08, 1.0, ratio_lo, ratio_hi, true, key);
  };
  int flips = 0;
  std::set<std::tuple<double, double, double, double>> boxes;
  for (int64_t i = 0; i < 1000; ++i) {
    const uint64_t key = sample_key(42, 3, i);
    const CropBox b = crop(key), again = crop(key);
    REQUIRE((b.x0 == again.x0 && b.y0 == again.y0 && b.width == again.width &&
             b.height == again.height && b.flip == again.flip));
    // Whole pixels inside the image, area and ratio in range up to the rounding to pixels.
    REQUIRE((b.x0 >= 0 && b.y0 >= 0 && b.x0 + b.width <= 500 && b.y0 + b.height <= 375));
    REQUIRE((b.x0 == std::floor(b.x0) && b.width == std::floor(b.width)));
    const double area = b.width * b.height / (500.0 * 375), ratio = b.width / b.height;
    REQUIRE((area > 0.08 * 0.97 && area <= 1.0));
    REQUIRE((ratio > ratio_lo * 0.98 && ratio < ratio_hi * 1.02));
    flips += b.flip;
    boxes.insert({b.x0, b.y0, b.width, b.height});
  }
  CHECK((flips > 430 && flips < 570));
  CHECK(boxes.size() > 950);
  CHECK_FALSE(random_resized_crop(500, 375, 0.08, 1, ratio_lo, ratio_hi, false, 7).flip);
  CHECK(sample_key(42, 3, 5) != sample_key(42, 3, 6));
  CHECK(sample_key(42, 3, 5) != sample_key(42, 4, 5));
  CHECK(sample_key(42, 3, 5) != sample_key(43, 3, 5));
}

TEST_CASE("Random resized crops of a thin image fall back to its centre", "[image]") {
  // 1000 x 10: no box of ratio <= 4/3 and 8% of the area fits, so the centre 13 x 10.
  const CropBox b = random_resized_crop(1000, 10, 0.08, 1.0, 3.0 / 4, 4.0 / 3, false, 1);
  CHECK((b.width == 13 && b.height == 10 && b.x0 == 493 && b.y0 == 0));
  const CropBox t = random_resized_crop(10, 1000, 0.08, 1.0, 3.0 / 4, 4.0 / 3, false, 1);
  CHECK((t.width == 10 && t.height == 13 && t.x0 == 0 && t.y0 == 493));
}

TEST_CASE("Centre crops scale the shorter side to 256 for 224", "[image]") {
  const CropBox b = centre_crop(500, 375, 224, 224);  // scale 256 / 375
  CHECK(b.width == Approx(224 * 375 / 256.0));
  CHECK(b.height == Approx(224 * 375 / 256.0));
  CHECK(b.x0 == Approx((500 - 224 * 375 / 256.0) / 2));
  CHECK(b.y0 == Approx((375 - 224 * 375 / 256.0) / 2));
  CHECK_FALSE(b.flip);
  // Portrait: the same numbers across.
  const CropBox p = centre_crop(375, 500, 224, 224);
  CHECK((p.x0 == Approx(b.y0) && p.y0 == Approx(b.x0) && p.width == Approx(b.width)));
}

TEST_CASE("Resampling the whole image at its size gives its pixels", "[image]") {
  const Image img = synthetic(13, 9, 3);
  const std::vector<float> out = resampled(img, {0, 0, 13, 9, false}, 9, 13);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 9; ++y)
      for (int x = 0; x < 13; ++x)
        REQUIRE(out[static_cast<size_t>((c * 9 + y) * 13 + x)] ==
                Approx(img.pixels[static_cast<size_t>((y * 13 + x) * 3 + c)] / 255.0).margin(1e-6));
  // Normalised per channel: (v / 255 - mean[c]) * inv_std[c].
  const float mean[3] = {0.5f, 0.25f, 0.f}, inv_std[3] = {2.f, 4.f, 1.f};
  std::vector<float> norm(out.size());
  resample(img, {0, 0, 13, 9, false}, 9, 13, mean, inv_std, norm.data());
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t c = i / (9 * 13);
    REQUIRE(norm[i] == Approx((out[i] - mean[c]) * inv_std[c]).margin(1e-5));
  }
}

TEST_CASE("Resampling keeps a constant constant at any box and scale", "[image]") {
  Image img{40, 30, 1, Bytes(40 * 30, 153)};
  const std::vector<CropBox> boxes = {{0, 0, 40, 30, false},
                                      {3.3, 1.7, 20.2, 11.9, true},
                                      {10, 10, 1, 1, false},
                                      {0, 0, 40, 30, true},
                                      {35.5, 25.5, 4.5, 4.5, false}};
  for (const CropBox& b : boxes)
    for (auto [h, w] : {std::pair{7, 5}, std::pair{30, 40}, std::pair{64, 3}, std::pair{1, 1}})
      for (float v : resampled(img, b, h, w)) REQUIRE(v == Approx(153 / 255.0).margin(1e-6));
}

TEST_CASE("Shrinking 2x averages what it shrinks", "[image]") {
  Image board{32, 32, 1, {}}, stripes{32, 32, 1, {}};
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x) {
      board.pixels.push_back(static_cast<uint8_t>((x + y) % 2 ? 255 : 0));
      stripes.pixels.push_back(static_cast<uint8_t>(x % 4 < 2 ? 255 : 0));  // columns 1100...
    }
  const std::vector<float> grey = resampled(board, {0, 0, 32, 32, false}, 16, 16);
  const std::vector<float> soft = resampled(stripes, {0, 0, 32, 32, false}, 16, 16);
  // The edges see a lopsided window (taps past the image are dropped); the rest is exact.
  for (int y = 1; y < 15; ++y)
    for (int x = 1; x < 15; ++x) {
      REQUIRE(grey[static_cast<size_t>(y * 16 + x)] == Approx(0.5));
      // The triangle widened to 4 taps (1/8, 3/8, 3/8, 1/8): 3/4 and 1/4, where a 2-tap
      // bilinear (no antialiasing) would give the stripes back as 1 and 0.
      REQUIRE(soft[static_cast<size_t>(y * 16 + x)] == Approx(x % 2 ? 0.25 : 0.75));
    }
}

TEST_CASE("Flipped crops mirror the unflipped ones exactly", "[image]") {
  const Image img = synthetic(50, 40, 3);
  CropBox b{4.5, 3.25, 33, 27, false};
  const std::vector<float> plain = resampled(img, b, 11, 17);
  b.flip = true;
  const std::vector<float> mirrored = resampled(img, b, 11, 17);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 11; ++y)
      for (int x = 0; x < 17; ++x)
        REQUIRE(mirrored[static_cast<size_t>((c * 11 + y) * 17 + x)] ==
                plain[static_cast<size_t>((c * 11 + y) * 17 + 16 - x)]);
}

namespace {

// Colour that changes at every pixel (noise on smooth gradients): a window's edges and the
// chroma upsampling across them show in every value.
Image textured(int64_t w, int64_t h) {
  Image img = synthetic(w, h, 3);
  uint32_t state = 12345;
  for (uint8_t& v : img.pixels) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(std::clamp(int(v) + int(state >> 28) - 8, 0, 255));
  }
  return img;
}

// The pixels of `rect` of `whole`.
Bytes window_of(const Image& whole, const PixelRect& rect) {
  Bytes out;
  for (int64_t y = rect.y0; y < rect.y0 + rect.height; ++y)
    for (int64_t x = rect.x0; x < rect.x0 + rect.width; ++x)
      for (int c = 0; c < whole.channels; ++c)
        out.push_back(whole.pixels[static_cast<size_t>((y * whole.width + x) * whole.channels + c)]);
  return out;
}

// A progressive JPEG cut after its first scan (the DC coefficients) and ended there: a valid
// file whose missing coefficients libjpeg estimates from neighbouring blocks (block smoothing),
// which reaches past a window's edge.
Bytes dc_scans_only(const Image& img) {
  Bytes jpeg = to_jpeg(img, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE);
  int scans = 0;
  for (size_t i = 0; i + 1 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA && ++scans == 2) {
      jpeg.resize(i);
      jpeg.push_back(0xFF);
      jpeg.push_back(0xD9);
      return jpeg;
    }
  FAIL("no second scan");
  return jpeg;
}

}  // namespace

TEST_CASE("A JPEG window decodes to the pixels a whole decode gives there", "[image]") {
  const Image src = textured(97, 75);  // not a multiple of any iMCU
  Image grey{src.width, src.height, 1, {}};
  for (size_t i = 0; i < src.pixels.size(); i += 3) grey.pixels.push_back(src.pixels[i]);
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"4:4:4", to_jpeg(src, TJPF_RGB, TJSAMP_444)},
      {"4:2:2", to_jpeg(src, TJPF_RGB, TJSAMP_422)},
      {"4:2:0", to_jpeg(src, TJPF_RGB, TJSAMP_420)},
      {"4:4:0", to_jpeg(src, TJPF_RGB, TJSAMP_440)},
      {"4:2:0 progressive", to_jpeg(src, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE)},
      {"4:2:0 progressive, DC scans only", dc_scans_only(src)},
      {"grey", to_jpeg(grey, TJPF_GRAY, TJSAMP_GRAY)}};
  const std::vector<PixelRect> wants = {{0, 0, 97, 75},  {0, 0, 1, 1},    {96, 74, 1, 1},
                                        {13, 9, 40, 30}, {50, 0, 47, 75}, {0, 40, 97, 35},
                                        {31, 17, 3, 50}, {-5, -5, 20, 20}, {90, 70, 50, 50}};
  for (const auto& [name, bytes] : files)
    for (int channels : {1, 3}) {
      const Image whole = decode(bytes, channels);
      for (const PixelRect& want : wants)
        for (bool to_end : {true, false}) {
          INFO(name << ", " << channels << " channels, want (" << want.x0 << ", " << want.y0
                    << ") " << want.width << " x " << want.height << ", to_end " << to_end);
          const ImagePart part =
              decode_image_part(bytes.data(), bytes.size(), channels, want, "a.jpg", to_end);
          const PixelRect& r = part.rect;
          CHECK((part.full_width == 97 && part.full_height == 75));
          CHECK((part.image.width == r.width && part.image.height == r.height &&
                 part.image.channels == channels));
          // It covers the wanted pixels that lie in the image, and no more rows than those.
          const int64_t x0 = std::max<int64_t>(want.x0, 0), y0 = std::max<int64_t>(want.y0, 0);
          CHECK((r.x0 <= x0 && r.x0 + r.width >= std::min<int64_t>(want.x0 + want.width, 97)));
          CHECK((r.y0 == y0 && r.y0 + r.height == std::min<int64_t>(want.y0 + want.height, 75)));
          CHECK(r.x0 + r.width <= 97);
          REQUIRE(part.image.pixels == window_of(whole, r));
        }
    }
}

TEST_CASE("A JPEG damaged below a window is refused, unless its decode stops there", "[image]") {
  const Image src = textured(64, 64);
  const Bytes jpeg = to_jpeg(src, TJPF_RGB, TJSAMP_420);
  const Bytes cut(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() * 3 / 4));
  const PixelRect top{8, 0, 32, 8};
  const std::string why = error_of(
      [&] { decode_image_part(cut.data(), cut.size(), 3, top, "train/cat/1.jpg", true); });
  CHECK_THAT(why, Catch::StartsWith("train/cat/1.jpg: JPEG data cut short or corrupt"));
  // Stopping at the window's last row never meets the damage; its pixels are the intact file's.
  const ImagePart part = decode_image_part(cut.data(), cut.size(), 3, top, "a.jpg", false);
  CHECK(part.image.pixels == window_of(decode(jpeg, 3), part.rect));
  // A window that reaches the damage is refused either way.
  CHECK_THAT(error_of([&] {
               decode_image_part(cut.data(), cut.size(), 3, {0, 56, 64, 8}, "a.jpg", false);
             }),
             Catch::StartsWith("a.jpg: JPEG data cut short or corrupt"));
}

TEST_CASE("Resampling the part of an image a crop reads gives the bits of the whole", "[image]") {
  const Image src = textured(120, 90);
  const Bytes jpeg = to_jpeg(src, TJPF_RGB, TJSAMP_420), png = to_png(src);
  const Bytes dc_only = dc_scans_only(src);
  for (const Bytes* file : {&jpeg, &png, &dc_only})
    for (int channels : {1, 3}) {
      const Image whole = decode(*file, channels);
      for (uint64_t key = 0; key < 40; ++key) {
        const auto [h, w] = key % 3 == 0 ? std::pair{32, 32} : std::pair{17, 29};
        const CropBox box = key % 5 == 4
                                ? centre_crop(120, 90, h, w)
                                : random_resized_crop(120, 90, 0.08, 1.0, 0.75, 4.0 / 3, true, key);
        const PixelRect reads = resample_reads(120, 90, box, h, w);
        const ImagePart part =
            decode_image_part(file->data(), file->size(), channels, reads, "a", key % 2 == 0);
        std::vector<float> from_part(static_cast<size_t>(channels * h * w));
        const float mean[3] = {0.1f, 0.2f, 0.3f}, inv_std[3] = {2.f, 3.f, 4.f};
        resample(part, box, h, w, mean, inv_std, from_part.data());
        std::vector<float> from_whole(from_part.size());
        resample(whole, box, h, w, mean, inv_std, from_whole.data());
        INFO("key " << key << ", " << channels << " channels");
        REQUIRE(from_part == from_whole);
      }
      // A part that lacks pixels the crop reads is a caller's bug, not a guess (a PNG's part
      // is all of it).
      if (file != &jpeg) continue;
      const CropBox all{0, 0, 120, 90, false};
      const ImagePart corner =
          decode_image_part(file->data(), file->size(), channels, {0, 0, 8, 8}, "a");
      std::vector<float> out(static_cast<size_t>(channels * 16 * 16));
      const float zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
      CHECK_THROWS_AS(resample(corner, all, 16, 16, zero, one, out.data()), SystemError);
    }
}

TEST_CASE("A JPEG decoded at 1/2, 1/4 or 1/8 gives its windows as its whole", "[image]") {
  const Image src = textured(97, 75);
  for (const Bytes& jpeg : {to_jpeg(src, TJPF_RGB, TJSAMP_444), to_jpeg(src, TJPF_RGB, TJSAMP_420),
                            to_jpeg(src, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE)})
    for (int shrink : {2, 4, 8}) {
      const int64_t w = (97 + shrink - 1) / shrink, h = (75 + shrink - 1) / shrink;
      const ImagePart whole =
          decode_image_part(jpeg.data(), jpeg.size(), 3, {0, 0, w, h}, "a.jpg", true, shrink);
      REQUIRE((whole.full_width == w && whole.full_height == h && whole.rect.width == w &&
               whole.rect.height == h));
      for (const PixelRect& want : {PixelRect{1, 1, 3, 2}, PixelRect{w / 2, h / 3, w / 2, h / 2},
                                    PixelRect{w - 1, h - 1, 1, 1}})
        for (bool to_end : {true, false}) {
          INFO("shrink " << shrink << ", want (" << want.x0 << ", " << want.y0 << ")");
          const ImagePart part =
              decode_image_part(jpeg.data(), jpeg.size(), 3, want, "a.jpg", to_end, shrink);
          CHECK(part.rect.x0 <= want.x0);
          CHECK(part.rect.x0 + part.rect.width >= want.x0 + want.width);
          REQUIRE(part.image.pixels == window_of(whole.image, part.rect));
        }
    }
  // Only 1, 2, 4 and 8, and a PNG only whole: a caller's bug otherwise.
  const Bytes jpeg = to_jpeg(src), png = to_png(src);
  CHECK_THROWS_AS(decode_image_part(jpeg.data(), jpeg.size(), 3, {0, 0, 8, 8}, "a", true, 3),
                  SystemError);
  CHECK_THROWS_AS(decode_image_part(png.data(), png.size(), 3, {0, 0, 8, 8}, "a", true, 2),
                  SystemError);
}

TEST_CASE("Draft decoding shrinks as far as the crop stays the sample's size", "[image]") {
  CHECK(draft_shrink({0, 0, 500, 400, false}, 224, 224) == 1);   // 250 x 200 would be short
  CHECK(draft_shrink({0, 0, 448, 448, false}, 224, 224) == 2);
  CHECK(draft_shrink({0, 0, 2000, 1600, false}, 224, 224) == 4);  // 500 x 400; 250 x 200 short
  CHECK(draft_shrink({7, 9, 4000, 3000, false}, 224, 224) == 8);
  CHECK(draft_shrink({0, 0, 447.9, 4000, false}, 224, 224) == 1);
  CHECK(draft_shrink({0, 0, 448, 448, false}, 28, 28) == 8);
  const CropBox b = shrink_box({8, 12, 400, 200, true}, 4);
  CHECK((b.x0 == 2 && b.y0 == 3 && b.width == 100 && b.height == 50 && b.flip));
}

namespace {

// A JPEG written with TurboJPEG's environment switches set for the call (TJ_RESTART,
// TJ_ARITHMETIC: restart markers, arithmetic coding).
Bytes to_jpeg_with(const Image& img, int subsamp, const char* name, const char* value) {
  ::setenv(name, value, 1);
  Bytes out = to_jpeg(img, TJPF_RGB, subsamp);
  ::unsetenv(name);
  return out;
}

}  // namespace

TEST_CASE("JPEG windows cut on both sides equal the whole decode, whatever the coding",
          "[image]") {
  const Image src = textured(301, 120);
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"4:1:1", to_jpeg(src, TJPF_RGB, TJSAMP_411)},
      {"4:2:0 restart markers", to_jpeg_with(src, TJSAMP_420, "TJ_RESTART", "1")},
      {"4:2:0 arithmetic", to_jpeg_with(src, TJSAMP_420, "TJ_ARITHMETIC", "1")},
      {"4:2:0 progressive", to_jpeg(src, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE)},
      {"4:2:0 progressive, DC scans only", dc_scans_only(src)}};
  const std::vector<PixelRect> wants = {
      {100, 30, 60, 40}, {150, 60, 1, 1}, {49, 7, 203, 100}, {64, 64, 64, 16}, {250, 0, 20, 120}};
  for (const auto& [name, bytes] : files)
    for (int shrink : {1, 2}) {
      const int64_t w = (301 + shrink - 1) / shrink, h = (120 + shrink - 1) / shrink;
      bool cut_both = false;  // some window lost columns on its left and right
      const ImagePart whole =
          decode_image_part(bytes.data(), bytes.size(), 3, {0, 0, w, h}, "a.jpg", true, shrink);
      for (PixelRect want : wants) {
        want = {want.x0 / shrink, want.y0 / shrink, std::max<int64_t>(1, want.width / shrink),
                std::max<int64_t>(1, want.height / shrink)};
        INFO(name << ", shrink " << shrink << ", want (" << want.x0 << ", " << want.y0 << ") "
                  << want.width << " x " << want.height);
        const ImagePart part =
            decode_image_part(bytes.data(), bytes.size(), 3, want, "a.jpg", true, shrink);
        cut_both = cut_both || (part.rect.x0 > 0 && part.rect.x0 + part.rect.width < w);
        REQUIRE(part.image.pixels == window_of(whole.image, part.rect));
      }
      INFO(name << ", shrink " << shrink);
      CHECK(cut_both);
    }
}
