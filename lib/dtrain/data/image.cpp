// JPEG and PNG decoding and the training and evaluation crops (image.hpp). Every size a file
// claims is checked against kMaxImagePixels before a byte is allocated for its pixels, and
// every decoder complaint, warnings included, refuses the file: a damaged image must not
// become a half-grey training sample that nobody notices.
#include "dtrain/data/image.hpp"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <limits>

// After <cstdio>: jpeglib.h uses FILE and size_t without including what declares them.
#include <jpeglib.h>

#include "dtrain/base/error.hpp"
#include "dtrain/base/hash.hpp"

namespace dtrain {

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

enum class Format { jpeg, png };

// The format from the first bytes; anything else is refused, showing them (a GIF, a WebP or an
// HTML error page saved as .jpg are recognisable from their first bytes).
Format detect_format(const uint8_t* data, size_t size, const std::string& what) {
  if (size == 0) throw UserError(what + ": empty file");
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return Format::jpeg;
  if (size >= sizeof kPngSignature && std::memcmp(data, kPngSignature, sizeof kPngSignature) == 0)
    return Format::png;
  std::string first;
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i)
    first += fmt::format("{}{:02X}", i ? " " : "", data[i]);
  throw UserError(fmt::format("{}: not a JPEG or PNG file (first bytes {})", what, first));
}

// A size claimed by a header, checked before anything is allocated for it (the division: no
// product of two claims can overflow).
void check_pixels(int64_t width, int64_t height, const std::string& what) {
  if (width <= 0 || height <= 0)
    throw UserError(fmt::format("{}: claims {} x {} pixels, an empty image", what, width, height));
  if (width > kMaxImagePixels / height)
    throw UserError(
        fmt::format("{}: claims {} x {} pixels, more than the {} (8192 x 8192) "
                    "dtrain decodes",
                    what, width, height, kMaxImagePixels));
}

// One TurboJPEG decompressor per call: creating one costs microseconds against the
// milliseconds of a decode, and no handle is shared between decode threads.
class TjDecompressor {
 public:
  TjDecompressor() : h_(tjInitDecompress()) {
    if (!h_) DTRAIN_THROW_SYSTEM(fmt::format("tjInitDecompress: {}", tjGetErrorStr2(nullptr)));
  }
  ~TjDecompressor() { tjDestroy(h_); }
  TjDecompressor(const TjDecompressor&) = delete;
  TjDecompressor& operator=(const TjDecompressor&) = delete;
  tjhandle get() const { return h_; }
  std::string error() const { return tjGetErrorStr2(h_); }

 private:
  tjhandle h_;
};

// Whether a JPEG's frame header (the first SOF marker, found by walking the segments from
// the start) is progressive; true where the walk cannot tell, the costlier case.
bool jpeg_progressive(const uint8_t* data, size_t size) {
  size_t i = 2;  // past SOI
  while (i + 4 <= size && data[i] == 0xFF) {
    const uint8_t m = data[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)
      return m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE;
    i += 2 + (size_t{data[i + 2]} << 8 | data[i + 3]);
  }
  return true;
}

// libjpeg-turbo's 8-bit API reads 8-bit samples only: a 12-bit JPEG (medical scanners, some
// cameras) is no damaged file, and is named as what it is.
std::string jpeg_refusal(const std::string& what, const char* part, const std::string& message) {
  if (message.find("Unsupported JPEG data precision") != std::string::npos)
    return fmt::format(
        "{}: a JPEG of more than 8 bits a sample, which dtrain does not decode "
        "(convert it to 8 bits; libjpeg-turbo: {})",
        what, message);
  return fmt::format("{}: JPEG {} cut short or corrupt (libjpeg-turbo: {})", what, part, message);
}

ImageHeader jpeg_header(const uint8_t* data, size_t size, const std::string& what) {
  TjDecompressor tj;
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), data, static_cast<unsigned long>(size), &width, &height,
                          &subsamp, &colorspace) != 0)
    throw UserError(jpeg_refusal(what, "header", tj.error()));
  // TurboJPEG reports a stream that ends before its frame header (tables only, or cut short)
  // as a success of size 0 x 0.
  if (width <= 0 || height <= 0)
    throw UserError(what + ": JPEG header cut short or corrupt (it ends before the image size)");
  check_pixels(width, height, what);
  ImageHeader h{width, height, "JPEG"};
  if (jpeg_progressive(data, size)) {
    // Full-resolution components: 1 grey, 3 at 4:4:4, 2 counting subsampled chroma otherwise
    // (4:2:0 is 1.5; 4:2:2 and 4:4:0 are 2); 4 for CMYK, which is refused later anyway.
    const double full = colorspace == TJCS_GRAY                              ? 1
                        : colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? 4
                        : subsamp == TJSAMP_444                              ? 3
                                                                             : 2;
    h.coefficient_bytes = 2 * full;
  }
  return h;
}

// libjpeg's error manager, made to stop on warnings as on errors: libjpeg fills what a
// truncated or damaged file lacks with grey and calls it a warning (TurboJPEG's
// TJFLAG_STOPONWARNING). And a progressive file of more than 500 scans is an attack, not a photo
// (TurboJPEG's TJFLAG_LIMITSCANS).
struct JpegErrors {
  jpeg_error_mgr mgr;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = "";
  bool cmyk = false;     // a CMYK or YCCK file, refused before decoding
  bool resized = false;  // libjpeg's size is not the header's
};

// The smallest scaled DCT block of any component: one iMCU is max_h_samp_factor of them.
#if JPEG_LIB_VERSION >= 70
int min_dct_size(const jpeg_decompress_struct& c) { return c.min_DCT_h_scaled_size; }
#else
int min_dct_size(const jpeg_decompress_struct& c) { return c.min_DCT_scaled_size; }
#endif

[[noreturn]] void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_fail(c);  // a warning; higher levels are trace messages
}

void jpeg_limit_scans(j_common_ptr c) {
  if (!c->is_decompressor) return;
  if (reinterpret_cast<j_decompress_ptr>(c)->input_scan_number > 500) {
    auto* e = reinterpret_cast<JpegErrors*>(c->err);
    std::snprintf(e->message, sizeof e->message, "a progressive file of more than 500 scans");
    std::longjmp(e->jump, 1);
  }
}

// Decodes rows [want.y0, want.y0 + want.height) and at least columns [want.x0, want.x0 +
// want.width) into `pixels` (`capacity` bytes, full-width rows' worth), setting `got` to the
// columns kept. Only those rows and columns (and the margins dropped, below) go through the
// inverse DCT, upsampling and colour conversion; the rows above are entropy-decoded and
// dropped, and where `to_end` so are the rows below and the file is read to its end, so that
// damage anywhere stops the decode. False with `errors` saying why on any complaint. Nothing
// with a destructor lives in this frame, which a longjmp leaves.
bool jpeg_decode_rows(const uint8_t* data, size_t size, int channels, const PixelRect& want,
                      bool to_end, int shrink, uint8_t* pixels, size_t capacity,
                      PixelRect& got, JpegErrors& errors) {
  jpeg_decompress_struct cinfo{};  // zeroed: a failed create must leave nothing to free
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_fail;
  errors.mgr.emit_message = jpeg_message;
  errors.progress.progress_monitor = jpeg_limit_scans;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &errors.progress;
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    errors.cmyk = true;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(shrink);
  jpeg_start_decompress(&cinfo);
  // Fancy upsampling makes the outer columns of a cropped decode differ from a whole decode's
  // (the chroma samples past the crop are missing), and so does the block smoothing of a
  // progressive file whose scans stop early (a block reads two blocks to each side, and
  // upsampling one sample past those): an iMCU (one block of every component) more is decoded
  // on each side, three for a progressive file, and only columns at least that far inside the
  // crop's edges (or at the image's) are kept.
  const JDIMENSION imcu = static_cast<JDIMENSION>(cinfo.max_h_samp_factor * min_dct_size(cinfo)) *
                          (cinfo.progressive_mode ? 3 : 1);
  const JDIMENSION full = cinfo.output_width;
  const auto want0 = static_cast<JDIMENSION>(want.x0);
  const auto want1 = static_cast<JDIMENSION>(want.x0 + want.width);
  JDIMENSION x0 = want0 > imcu ? want0 - imcu : 0;
  JDIMENSION width = std::min(want1 + imcu, full) - x0;
  if (width < full) jpeg_crop_scanline(&cinfo, &x0, &width);
  const JDIMENSION keep0 = x0 == 0 ? 0 : x0 + imcu;
  const JDIMENSION keep1 = x0 + width >= full ? full : x0 + width - imcu;
  const auto y0 = static_cast<JDIMENSION>(want.y0);
  const auto y1 = static_cast<JDIMENSION>(want.y0 + want.height);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
  const size_t stride = static_cast<size_t>(width) * static_cast<size_t>(channels);
  if (y1 > cinfo.output_height || stride * (y1 - y0) > capacity) {
    errors.resized = true;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const size_t kept = static_cast<size_t>(keep1 - keep0) * static_cast<size_t>(channels);
  const size_t skip = static_cast<size_t>(keep0 - x0) * static_cast<size_t>(channels);
  while (cinfo.output_scanline < y1) {
    const size_t r = cinfo.output_scanline - y0;
    JSAMPROW row = pixels + r * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
    std::memmove(pixels + r * kept, row + skip, kept);  // to its place in the kept rows
  }
  got = {keep0, want.y0, keep1 - keep0, want.height};
  if (!to_end) {
    // What is left unread is not looked at (jpeg_skip_scanlines to the last row would not
    // look either: it only marks the rows done).
    jpeg_abort_decompress(&cinfo);
  } else {
    // Skipping short of the last row entropy-decodes what it skips; the last row is read. The
    // skip starts at a row group's first row (libjpeg-turbo's skip from inside one has been
    // known to leave stale state where no context rows are kept).
    JSAMPARRAY scratch = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo),
                                                    JPOOL_IMAGE, width * channels, 1);
    const auto group = static_cast<JDIMENSION>(cinfo.max_v_samp_factor * min_dct_size(cinfo));
    while (cinfo.output_scanline % group != 0 && cinfo.output_scanline < cinfo.output_height)
      jpeg_read_scanlines(&cinfo, scratch, 1);
    if (cinfo.output_scanline + 1 < cinfo.output_height)
      jpeg_skip_scanlines(&cinfo, cinfo.output_height - 1 - cinfo.output_scanline);
    if (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, scratch, 1);
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return true;
}

ImagePart decode_jpeg(const uint8_t* data, size_t size, int channels, const ImageHeader& h,
                      const PixelRect& want, bool to_end, int shrink, const std::string& what) {
  ImagePart part;
  part.full_width = shrunk_size(h.width, shrink);
  part.full_height = shrunk_size(h.height, shrink);
  // Rows of the whole width: libjpeg's widened columns never need more.
  part.image.pixels.resize(static_cast<size_t>(part.full_width * want.height * channels));
  JpegErrors errors;
  if (!jpeg_decode_rows(data, size, channels, want, to_end, shrink, part.image.pixels.data(),
                        part.image.pixels.size(), part.rect, errors)) {
    // libjpeg decodes CMYK and YCCK only to CMYK pixels, and turning those into RGB needs a
    // colour profile, which is no job for a training pipeline.
    if (errors.cmyk)
      throw UserError(what + ": a CMYK JPEG, which dtrain does not decode (convert it to RGB)");
    if (errors.resized)
      throw UserError(what + ": JPEG data corrupt (its frame's size is not its header's)");
    throw UserError(jpeg_refusal(what, "data", errors.message));
  }
  part.image.width = part.rect.width;
  part.image.height = part.rect.height;
  part.image.channels = channels;
  part.image.pixels.resize(static_cast<size_t>(part.rect.width * part.rect.height * channels));
  return part;
}

// The PNG header read without libpng: the signature, then the IHDR chunk's width and height.
ImageHeader png_header(const uint8_t* data, size_t size, const std::string& what) {
  constexpr size_t kIhdrEnd = 8 + 8 + 13;  // signature, length and type, IHDR data
  if (size < kIhdrEnd || std::memcmp(data + 12, "IHDR", 4) != 0)
    throw UserError(
        fmt::format("{}: PNG header cut short or corrupt (no IHDR chunk in its first {} bytes)",
                    what, kIhdrEnd));
  auto be32 = [&](size_t at) {
    return int64_t{data[at]} << 24 | int64_t{data[at + 1]} << 16 | int64_t{data[at + 2]} << 8 |
           int64_t{data[at + 3]};
  };
  ImageHeader h{be32(16), be32(20), "PNG"};
  check_pixels(h.width, h.height, what);
  return h;
}

uint32_t be32_at(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// What libpng would trust, checked first by walking the chunks: libpng allocates a text
// chunk's claimed length before reading it (a 44-byte file claiming a 2 GiB tEXt chunk cost
// 2 GiB), and the whole image before inflating its data. So no chunk may run past the file's
// end, and the image data (IDAT) must be able to hold the pixels the header claims: deflate
// expands at most 1032 times (a 258-byte match in 2 bits), so fewer compressed bytes than a
// 1032th of the pixels' bytes cannot be a whole image. Also finds the chunks that would make
// libpng change the pixels as read (gamma, chromaticities), which PIL ignores.
struct PngChunks {
  bool colour_managed = false;  // a gAMA or cHRM chunk
  size_t walked = 0;            // where the walk stopped: after IEND, or where too few bytes were
};

PngChunks walk_png_chunks(const uint8_t* data, size_t size, const std::string& what) {
  PngChunks c;
  uint64_t idat = 0, bits_per_pixel = 0, width = 0, height = 0;
  size_t at = sizeof kPngSignature;
  while (at + 12 <= size) {  // length, type, then data and a CRC
    const uint64_t len = be32_at(data + at);
    const std::string type(reinterpret_cast<const char*>(data + at + 4), 4);
    const bool named = std::all_of(type.begin(), type.end(), [](char ch) {
      return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
    });
    if (!named || len > size - at - 12)
      throw UserError(fmt::format(
          "{}: PNG data cut short or corrupt (a chunk{} at byte {} claims {} bytes, past the "
          "file's end at {})",
          what, named ? " '" + type + "'" : "", at, len, size));
    const uint8_t* body = data + at + 8;
    if (type == "IHDR" && len >= 13) {
      width = be32_at(body);
      height = be32_at(body + 4);
      check_pixels(static_cast<int64_t>(width), static_cast<int64_t>(height), what);
      static constexpr int kSamples[7] = {1, 0, 3, 1, 2, 0, 4};  // per colour type 0..6
      bits_per_pixel = uint64_t{body[8]} * (body[9] < 7 ? kSamples[body[9]] : 0);
    }
    if (type == "IDAT") idat += len;
    if (type == "gAMA" || type == "cHRM") c.colour_managed = true;
    at += 12 + len;
    if (type == "IEND") break;
  }
  c.walked = at;
  // The header's claim was checked against kMaxImagePixels (2^26), at most 64 bits a pixel.
  const uint64_t pixel_bytes = width * height * bits_per_pixel / 8;
  if (idat * 1032 + 64 < pixel_bytes)
    throw UserError(
        fmt::format("{}: PNG data cut short or corrupt ({} bytes of image data cannot hold the "
                    "{} x {} pixels its header claims)",
                    what, idat, width, height));
  return c;
}

// The file without its gAMA and cHRM chunks: libpng's simplified reader would convert the
// pixels by them, where PIL (and so torchvision) reads the bytes as stored. Only the chunks
// walk_png_chunks checked, up to `walked`, are walked again; what follows is copied as it is.
std::vector<uint8_t> without_colour_chunks(const uint8_t* data, size_t size, size_t walked) {
  std::vector<uint8_t> out(data, data + sizeof kPngSignature);
  out.reserve(size);
  size_t at = sizeof kPngSignature;
  while (at < walked) {
    const size_t len = be32_at(data + at);
    const bool drop =
        std::memcmp(data + at + 4, "gAMA", 4) == 0 || std::memcmp(data + at + 4, "cHRM", 4) == 0;
    if (!drop) out.insert(out.end(), data + at, data + at + 12 + len);
    at += 12 + len;
  }
  out.insert(out.end(), data + at, data + size);
  return out;
}

// png_image_free on every way out, including the throws (libpng frees on its own errors too;
// a second free is a no-op).
struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
};

// Pixels of `n` channels (1 to 4, alpha last where 2 or 4) to `channels`: alpha dropped, as
// PIL's convert does, and colour to grey with PIL's ITU-R 601-2 luma, the same weights as a
// JPEG's Y channel, so that a grey dataset is the same whichever format its files are.
void convert_pixels(const std::vector<uint8_t>& src, int n, Image& img) {
  const auto count = static_cast<size_t>(img.width * img.height);
  const bool colour = n >= 3;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* s = &src[i * static_cast<size_t>(n)];
    uint8_t* d = &img.pixels[i * static_cast<size_t>(img.channels)];
    if (img.channels == 3) {
      for (int c = 0; c < 3; ++c) d[c] = colour ? s[c] : s[0];
    } else {
      d[0] = colour
                 ? static_cast<uint8_t>((s[0] * 19595 + s[1] * 38470 + s[2] * 7471 + 0x8000) >> 16)
                 : s[0];
    }
  }
}

Image decode_png(const uint8_t* data, size_t size, int channels, const std::string& what) {
  std::vector<uint8_t> plain;  // the file without gamma, where it has one
  if (const PngChunks chunks = walk_png_chunks(data, size, what); chunks.colour_managed) {
    plain = without_colour_chunks(data, size, chunks.walked);
    data = plain.data();
    size = plain.size();
  }
  PngImage png;
  png_image& im = png.image;
  if (!png_image_begin_read_from_memory(&im, data, size))
    throw UserError(
        fmt::format("{}: PNG header cut short or corrupt (libpng: {})", what, im.message));
  check_pixels(im.width, im.height, what);
  // Read as the file is (colour or grey, alpha or not) and convert here: libpng would
  // composite alpha onto a background and weigh colours for grey in linear light, neither of
  // which PIL (and so torchvision) does.
  const bool colour = channels == 3 || (im.format & PNG_FORMAT_FLAG_COLOR);
  const bool alpha = im.format & PNG_FORMAT_FLAG_ALPHA;
  im.format = (colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
  // 16-bit files without gAMA are sRGB, as PIL takes them, not linear light as libpng would.
  im.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  const int n = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(im.format));
  Image img;
  img.width = im.width;
  img.height = im.height;
  img.channels = channels;
  std::vector<uint8_t> read(static_cast<size_t>(img.width * img.height * n));
  if (!png_image_finish_read(&im, nullptr, read.data(), 0, nullptr))
    throw UserError(
        fmt::format("{}: PNG data cut short or corrupt (libpng: {})", what, im.message));
  if (n == channels) {
    img.pixels = std::move(read);
  } else {
    img.pixels.resize(static_cast<size_t>(img.width * img.height * channels));
    convert_pixels(read, n, img);
  }
  return img;
}

// The source pixels and weights that make each output pixel along one axis (PIL's
// precompute_coeffs): output o of `out` covers [x0 + o * scale, x0 + (o + 1) * scale), scale =
// len / out, and reads the source pixels whose centres lie within `support` of its centre, with
// a triangle filter stretched over the support when shrinking (antialiasing), normalised.
struct AxisTaps {
  int64_t ksize = 0;
  std::vector<int64_t> first;  // first source pixel of output o
  std::vector<int64_t> count;  // how many
  std::vector<float> weight;   // [o * ksize + k]
};

AxisTaps axis_taps(double x0, double len, int64_t in, int64_t out) {
  const double scale = len / static_cast<double>(out);
  const double support = std::max(scale, 1.0);  // the triangle's support, 1, widened
  AxisTaps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.weight.assign(static_cast<size_t>(out * t.ksize), 0.f);
  for (int64_t o = 0; o < out; ++o) {
    const double centre = x0 + (static_cast<double>(o) + 0.5) * scale;
    int64_t lo = std::max<int64_t>(static_cast<int64_t>(std::floor(centre - support + 0.5)), 0);
    int64_t hi = std::min<int64_t>(static_cast<int64_t>(std::floor(centre + support + 0.5)), in);
    hi = std::min(hi, lo + t.ksize);
    float* w = &t.weight[static_cast<size_t>(o * t.ksize)];
    double total = 0;
    for (int64_t s = lo; s < hi; ++s) {
      const double d = std::abs((static_cast<double>(s) + 0.5 - centre) / support);
      const double v = d < 1 ? 1 - d : 0;
      w[s - lo] = static_cast<float>(v);
      total += v;
    }
    if (total <= 0) {  // a centre outside the image: its nearest pixel
      lo = std::clamp<int64_t>(static_cast<int64_t>(std::floor(centre)), 0, in - 1);
      hi = lo + 1;
      w[0] = 1.f;
      total = 1;
    }
    for (int64_t k = 0; k < hi - lo; ++k) w[k] = static_cast<float>(w[k] / total);
    t.first[static_cast<size_t>(o)] = lo;
    t.count[static_cast<size_t>(o)] = hi - lo;
  }
  return t;
}

// What resampling reads: `rect` of an image of full_width x full_height, its pixels
// interleaved, row by row (rect.width x channels bytes a row).
struct PixelView {
  const uint8_t* pixels = nullptr;
  int channels = 0;
  PixelRect rect;
  int64_t full_width = 0, full_height = 0;
};

// The horizontal pass over rows [reads.y0, +height) and columns [reads.x0, +width) of `v`:
// out_w x C floats a row, 0 to 255, into `rows`. The taps are in the whole image's columns.
// Each source row is first made floats (a loop that vectorises); then a tap of an RGB pixel is
// one 4-float multiply-add (the fourth lane, the next pixel's red or the row's padding, is
// dropped), the same sums in the same order as three scalar ones. C is a constant so that the
// channel loops unroll (a copy loop of a run-time count, GCC makes a memcpy call).
template <int C>
void resample_rows(const PixelView& v, const AxisTaps& tx, const PixelRect& reads, int64_t out_w,
                   float* rows) {
  using Float4 = float __attribute__((vector_size(16)));
  std::vector<float> line(static_cast<size_t>(reads.width * C + 4), 0.f);
  for (int64_t r = reads.y0; r < reads.y0 + reads.height; ++r) {
    const uint8_t* src = v.pixels + ((r - v.rect.y0) * v.rect.width + reads.x0 - v.rect.x0) * C;
    for (int64_t i = 0; i < reads.width * C; ++i) line[static_cast<size_t>(i)] = src[i];
    float* dst = rows + (r - reads.y0) * out_w * C;
    for (int64_t x = 0; x < out_w; ++x) {
      const float* w = &tx.weight[static_cast<size_t>(x * tx.ksize)];
      const float* s = line.data() + (tx.first[static_cast<size_t>(x)] - reads.x0) * C;
      const int64_t n = tx.count[static_cast<size_t>(x)];
      if constexpr (C == 3) {
        Float4 acc = {0, 0, 0, 0};
        for (int64_t k = 0; k < n; ++k) {
          Float4 px;
          std::memcpy(&px, s + k * 3, sizeof px);
          acc += w[k] * px;
        }
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = acc[c];
      } else {
        float acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += w[k] * s[k];
        dst[x] = acc;
      }
    }
  }
}

// The source pixels a resample with these taps reads.
PixelRect taps_extent(const AxisTaps& tx, const AxisTaps& ty) {
  auto extent = [](const AxisTaps& t, int64_t& lo, int64_t& len) {
    int64_t hi = 0;
    lo = std::numeric_limits<int64_t>::max();
    for (size_t o = 0; o < t.first.size(); ++o) {
      lo = std::min(lo, t.first[o]);
      hi = std::max(hi, t.first[o] + t.count[o]);
    }
    len = hi - lo;
  };
  PixelRect r;
  extent(tx, r.x0, r.width);
  extent(ty, r.y0, r.height);
  return r;
}

bool valid_box(const CropBox& box) {
  return std::isfinite(box.x0) && std::isfinite(box.y0) && box.width > 0 && box.height > 0 &&
         std::isfinite(box.width) && std::isfinite(box.height);
}

}  // namespace

ImageHeader read_image_header(const uint8_t* data, size_t size, const std::string& what) {
  if (detect_format(data, size, what) == Format::png) return png_header(data, size, what);
  return jpeg_header(data, size, what);
}

int64_t shrunk_size(int64_t size, int shrink) { return (size + shrink - 1) / shrink; }

int64_t decode_bytes(const ImageHeader& h, int channels, int64_t rows, int shrink) {
  const bool png = std::strcmp(h.format, "PNG") == 0;
  const int64_t out = shrunk_size(h.width, shrink) * rows * channels;
  const double pixels = static_cast<double>(h.width) * static_cast<double>(h.height);
  return out + static_cast<int64_t>(png ? 4 * pixels : h.coefficient_bytes * pixels);
}

ImagePart decode_image_part(const uint8_t* data, size_t size, int channels,
                            const ImageHeader& header, const PixelRect& want,
                            const std::string& what, bool to_end, int shrink) {
  const bool png = std::strcmp(header.format, "PNG") == 0;
  if ((channels != 1 && channels != 3) || (shrink != 1 && shrink != 2 && shrink != 4 && shrink != 8))
    DTRAIN_THROW_SYSTEM(
        fmt::format("decode_image_part: {} channels (1 or 3), shrink {} (1, 2, 4 or 8)", channels,
                    shrink));
  if (png && shrink != 1)
    DTRAIN_THROW_SYSTEM(fmt::format("decode_image_part: a PNG at 1/{}", shrink));
  const int64_t width = shrunk_size(header.width, shrink);
  const int64_t height = shrunk_size(header.height, shrink);
  const int64_t x0 = std::clamp<int64_t>(want.x0, 0, width - 1);
  const int64_t y0 = std::clamp<int64_t>(want.y0, 0, height - 1);
  const PixelRect rect{x0, y0, std::clamp<int64_t>(want.x0 + want.width, x0 + 1, width) - x0,
                       std::clamp<int64_t>(want.y0 + want.height, y0 + 1, height) - y0};
  if (!png) return decode_jpeg(data, size, channels, header, rect, to_end, shrink, what);
  ImagePart part;
  part.image = decode_png(data, size, channels, what);
  part.rect = {0, 0, part.image.width, part.image.height};
  part.full_width = part.image.width;
  part.full_height = part.image.height;
  return part;
}

ImagePart decode_image_part(const uint8_t* data, size_t size, int channels, const PixelRect& want,
                            const std::string& what, bool to_end, int shrink) {
  // The header's size claim first: a file that claims too many pixels is named for that, not
  // for whatever the decoder meets after it.
  return decode_image_part(data, size, channels, read_image_header(data, size, what), want, what,
                           to_end, shrink);
}

Image decode_image(const uint8_t* data, size_t size, int channels, const std::string& what) {
  const PixelRect all{0, 0, kMaxImagePixels, kMaxImagePixels};
  return decode_image_part(data, size, channels, all, what).image;
}

CropBox random_resized_crop(int64_t width, int64_t height, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, bool flip, uint64_t key) {
  // The config is checked where it is read; out-of-range numbers here are a caller's bug.
  if (width <= 0 || height <= 0 || !(scale_lo > 0 && scale_lo <= scale_hi) ||
      !(ratio_lo > 0 && ratio_lo <= ratio_hi))
    DTRAIN_THROW_SYSTEM(fmt::format("random_resized_crop: {} x {}, scale [{}, {}], ratio [{}, {}]",
                                    width, height, scale_lo, scale_hi, ratio_lo, ratio_hi));
  const auto W = static_cast<double>(width), H = static_cast<double>(height);
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  CropBox box;
  box.flip = flip && counter_uniform(key, 40) < 0.5;  // draws 0-39 are the ten tries'
  for (uint64_t t = 0; t < 10; ++t) {
    const double area = W * H * (scale_lo + (scale_hi - scale_lo) * counter_uniform(key, 4 * t));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * counter_uniform(key, 4 * t + 1));
    const double w = std::round(std::sqrt(area * aspect)), h = std::round(std::sqrt(area / aspect));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      box.y0 = std::floor(counter_uniform(key, 4 * t + 2) * (H - h + 1));
      box.x0 = std::floor(counter_uniform(key, 4 * t + 3) * (W - w + 1));
      box.width = w;
      box.height = h;
      return box;
    }
  }
  // No try fitted: the whole image, cut centrally to the nearest ratio in range.
  box.width = W;
  box.height = H;
  if (W / H < ratio_lo)
    box.height = std::clamp(std::round(W / ratio_lo), 1.0, H);
  else if (W / H > ratio_hi)
    box.width = std::clamp(std::round(H * ratio_hi), 1.0, W);
  box.y0 = std::floor((H - box.height) / 2);
  box.x0 = std::floor((W - box.width) / 2);
  return box;
}

CropBox centre_crop(int64_t width, int64_t height, int64_t out_h, int64_t out_w) {
  if (width <= 0 || height <= 0 || out_h <= 0 || out_w <= 0)
    DTRAIN_THROW_SYSTEM(
        fmt::format("centre_crop: {} x {} to {} x {}", width, height, out_w, out_h));
  const auto W = static_cast<double>(width), H = static_cast<double>(height);
  const auto oh = static_cast<double>(out_h), ow = static_cast<double>(out_w);
  const double shorter = std::round(std::min(oh, ow) / 0.875);
  // For a crop much wider than tall (or the reverse) the scaled image must still cover it.
  const double s = std::max({shorter / std::min(W, H), oh / H, ow / W});
  CropBox box;
  box.width = ow / s;
  box.height = oh / s;
  box.x0 = (W * s - ow) / 2 / s;
  box.y0 = (H * s - oh) / 2 / s;
  return box;
}

uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t index) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL +
                            mix64(static_cast<uint64_t>(index))));
}

int draft_shrink(const CropBox& box, int64_t out_h, int64_t out_w) {
  for (int shrink : {8, 4, 2})
    if (box.width / shrink >= static_cast<double>(out_w) &&
        box.height / shrink >= static_cast<double>(out_h))
      return shrink;
  return 1;
}

CropBox shrink_box(const CropBox& box, int shrink) {
  const double s = shrink;
  return CropBox{box.x0 / s, box.y0 / s, box.width / s, box.height / s, box.flip};
}

PixelRect resample_reads(int64_t width, int64_t height, const CropBox& box, int64_t out_h,
                         int64_t out_w) {
  if (width <= 0 || height <= 0 || out_h <= 0 || out_w <= 0 || !valid_box(box))
    DTRAIN_THROW_SYSTEM(fmt::format("resample_reads: {} x {}, box ({}, {}) {} x {}, to {} x {}",
                                    width, height, box.x0, box.y0, box.width, box.height, out_w,
                                    out_h));
  return taps_extent(axis_taps(box.x0, box.width, width, out_w),
                     axis_taps(box.y0, box.height, height, out_h));
}

namespace {

void resample_view(const PixelView& v, const CropBox& box, int64_t out_h, int64_t out_w,
                   const float* mean, const float* inv_std, float* out) {
  const int64_t C = v.channels;
  const PixelRect& at = v.rect;
  if ((C != 1 && C != 3) || at.width <= 0 || at.height <= 0 || at.x0 < 0 || at.y0 < 0 ||
      at.x0 + at.width > v.full_width || at.y0 + at.height > v.full_height || out_h <= 0 ||
      out_w <= 0 || !valid_box(box))
    DTRAIN_THROW_SYSTEM(fmt::format(
        "resample: {} x {} x {} pixels at ({}, {}) of {} x {}, box ({}, {}) {} x {}, to {} x {}",
        at.width, at.height, C, at.x0, at.y0, v.full_width, v.full_height, box.x0, box.y0,
        box.width, box.height, out_w, out_h));
  const AxisTaps tx = axis_taps(box.x0, box.width, v.full_width, out_w);
  const AxisTaps ty = axis_taps(box.y0, box.height, v.full_height, out_h);
  // Only the source rows some output row reads go through the horizontal pass; every pixel
  // read must be there.
  const PixelRect reads = taps_extent(tx, ty);
  if (reads.x0 < at.x0 || reads.y0 < at.y0 || reads.x0 + reads.width > at.x0 + at.width ||
      reads.y0 + reads.height > at.y0 + at.height)
    DTRAIN_THROW_SYSTEM(fmt::format("resample: reads ({}, {}) {} x {}, has ({}, {}) {} x {}",
                                    reads.x0, reads.y0, reads.width, reads.height, at.x0, at.y0,
                                    at.width, at.height));
  const int64_t row0 = reads.y0, row1 = reads.y0 + reads.height;
  std::vector<float> rows(static_cast<size_t>((row1 - row0) * out_w * C));
  if (C == 1)
    resample_rows<1>(v, tx, reads, out_w, rows.data());
  else
    resample_rows<3>(v, tx, reads, out_w, rows.data());
  // The vertical pass over whole interleaved rows (contiguous, so it vectorises), then each
  // row split into its channel planes, normalised and mirrored where asked.
  const int64_t span = out_w * C;
  std::vector<float> acc(static_cast<size_t>(span));
  for (int64_t y = 0; y < out_h; ++y) {
    const float* w = &ty.weight[static_cast<size_t>(y * ty.ksize)];
    const float* src = rows.data() + (ty.first[static_cast<size_t>(y)] - row0) * span;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < ty.count[static_cast<size_t>(y)]; ++k)
      for (int64_t i = 0; i < span; ++i) acc[static_cast<size_t>(i)] += w[k] * src[k * span + i];
    for (int64_t c = 0; c < C; ++c) {
      const auto a = static_cast<float>(inv_std[c] / 255.0);  // (v / 255 - mean[c]) * inv_std
      const float b = -mean[c] * inv_std[c];
      float* dst = out + (c * out_h + y) * out_w;
      for (int64_t x = 0; x < out_w; ++x)
        dst[box.flip ? out_w - 1 - x : x] = acc[static_cast<size_t>(x * C + c)] * a + b;
    }
  }
}

// The view of `img`'s pixels, checked to be as many as it says.
PixelView view_of(const Image& img, const PixelRect& rect, int64_t full_width,
                  int64_t full_height) {
  if (img.width != rect.width || img.height != rect.height ||
      img.pixels.size() != static_cast<size_t>(img.width * img.height * img.channels))
    DTRAIN_THROW_SYSTEM(fmt::format("resample: {} x {} x {} image of {} bytes as {} x {}",
                                    img.width, img.height, img.channels, img.pixels.size(),
                                    rect.width, rect.height));
  return PixelView{img.pixels.data(), img.channels, rect, full_width, full_height};
}

}  // namespace

void resample(const ImagePart& part, const CropBox& box, int64_t out_h, int64_t out_w,
              const float* mean, const float* inv_std, float* out) {
  resample_view(view_of(part.image, part.rect, part.full_width, part.full_height), box, out_h,
                out_w, mean, inv_std, out);
}

void resample(const Image& img, const CropBox& box, int64_t out_h, int64_t out_w, const float* mean,
              const float* inv_std, float* out) {
  resample_view(view_of(img, {0, 0, img.width, img.height}, img.width, img.height), box, out_h,
                out_w, mean, inv_std, out);
}

}  // namespace dtrain
