#pragma once
// Images from files: JPEG (libjpeg-turbo: its libjpeg API decodes, TurboJPEG reads headers and
// encodes) and PNG (libpng's simplified API) decoded to 8-bit pixels, and the crops that turn
// one into a C x H x W training sample.
// Nothing a file's header claims is trusted past kMaxImagePixels: a PNG that says it is
// 100000 x 100000 is refused before anything is allocated for it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

// Interleaved 8-bit pixels, row by row: pixels[(y * width + x) * channels + c].
struct Image {
  int64_t width = 0, height = 0;
  int channels = 0;  // 1 (grey) or 3 (RGB)
  std::vector<uint8_t> pixels;
};

// The most pixels (width x height) an image may claim: 64 Mpixel, 192 MiB as RGB.
constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

struct ImageHeader {
  int64_t width = 0, height = 0;
  const char* format = "";  // "JPEG" or "PNG"
  // A JPEG's DCT coefficients held for the whole image while it decodes (a progressive file),
  // in bytes per pixel: 2 per component at full resolution, less for subsampled chroma. 0 for
  // a baseline JPEG, which decodes row by row, and for a PNG.
  double coefficient_bytes = 0;
};

// The format (from the first bytes) and size a file's header claims, checked against
// kMaxImagePixels. UserError "<what>: <reason>" for anything else: empty, not a JPEG or PNG,
// a header cut short, zero or too many pixels.
ImageHeader read_image_header(const uint8_t* data, size_t size, const std::string& what);

// Decodes a whole JPEG or PNG to `channels` (1: grey, 3: RGB; the decoder converts, alpha is
// dropped). A file cut short or corrupt anywhere is refused (UserError naming `what` and the
// decoder's reason), never returned half grey.
Image decode_image(const uint8_t* data, size_t size, int channels, const std::string& what);

// Columns [x0, x0 + width) and rows [y0, y0 + height) of an image.
struct PixelRect {
  int64_t x0 = 0, y0 = 0, width = 0, height = 0;
};

// Part of an image, decoded: `image` holds the pixels of `rect` of an image of full_width x
// full_height.
struct ImagePart {
  Image image;
  PixelRect rect;
  int64_t full_width = 0, full_height = 0;
};

// Decodes at least `want` (clipped to the image; at least one pixel) of a JPEG or PNG, refusing
// what decode_image refuses. A JPEG sends only the iMCU rows and columns that cover `want`
// through the inverse DCT, upsampling and colour conversion (libjpeg's jpeg_crop_scanline and
// jpeg_skip_scanlines); the rows above are entropy-decoded and dropped, and so are those below
// where `to_end`, so that damage anywhere is refused (else decoding stops at want's last row).
// The pixels decoded are those a whole decode gives there. A PNG is decoded whole.
//
// A JPEG may be decoded at 1 / shrink of its size (2, 4 or 8: libjpeg's DCT scaling, what PIL's
// draft mode does), `want` and the part then in the shrunk image's pixels (each covers shrink x
// shrink pixels of the whole, the size rounded up). 1 for a PNG.
ImagePart decode_image_part(const uint8_t* data, size_t size, int channels, const PixelRect& want,
                            const std::string& what, bool to_end = true, int shrink = 1);

// The same with the file's header as read_image_header gave it (a sample's crop is drawn from
// it first; parsed once, not again).
ImagePart decode_image_part(const uint8_t* data, size_t size, int channels,
                            const ImageHeader& header, const PixelRect& want,
                            const std::string& what, bool to_end = true, int shrink = 1);

// A width or height at 1 / shrink, as libjpeg's DCT scaling gives it (rounded up).
int64_t shrunk_size(int64_t size, int shrink);

// The most bytes a decode holds at once: `rows` rows of the (shrunk) width in `channels`
// channels out, with what the decoder keeps besides: a PNG's whole image in the file's own
// channels (up to 4, converted after), a progressive JPEG's coefficients. The decode budget
// (image_folder.hpp) counts this, not the output alone.
int64_t decode_bytes(const ImageHeader& h, int channels, int64_t rows, int shrink);

// An image as a PNG file's bytes (lossless), or a JPEG file's at `quality` (1..100; 4:4:4
// chroma, so that colours are not averaged over pixel pairs). For the trees tests and
// benchmarks write, and `dtrain export-images`.
std::vector<uint8_t> encode_png(const Image& img);
std::vector<uint8_t> encode_jpeg(const Image& img, int quality);

// A region of the source image, in source pixels (x0, y0: its top-left corner), to be resampled
// to the sample's H x W, and whether the result is mirrored left to right.
struct CropBox {
  double x0 = 0, y0 = 0, width = 0, height = 0;
  bool flip = false;
};

// Training crops as torchvision's RandomResizedCrop draws them: an area fraction uniform in
// [scale_lo, scale_hi] of the image and an aspect ratio log-uniform in [ratio_lo, ratio_hi],
// up to 10 tries for a box that fits, else the whole image cropped centrally to the nearest
// ratio in range; then a mirror with probability 1/2 where `flip`. Every number drawn depends
// on `key` alone (the sample's (seed, epoch, index), see sample_key), so any number of decode
// workers, in any order, makes the same crops.
CropBox random_resized_crop(int64_t width, int64_t height, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, bool flip, uint64_t key);

// Evaluation crops: the shorter side scaled to out / 0.875 (256 for 224, as the ImageNet
// recipes do), then the centre out_h x out_w.
CropBox centre_crop(int64_t width, int64_t height, int64_t out_h, int64_t out_w);

// The key of sample `index` in epoch `epoch` of a run seeded `seed`.
uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t index);

// Resamples `box` of `img` to a channel-planar channels x out_h x out_w sample (channels is
// img.channels), with a separable triangle (bilinear) filter widened by the scale factor when
// shrinking, as PIL's antialiased resize does; then (v / 255 - mean[c]) * inv_std[c].
void resample(const Image& img, const CropBox& box, int64_t out_h, int64_t out_w,
              const float* mean, const float* inv_std, float* out);

// The same from part of an image: `box` is in the whole image's pixels, and must read only
// pixels of the part (what resample_reads says of it).
void resample(const ImagePart& part, const CropBox& box, int64_t out_h, int64_t out_w,
              const float* mean, const float* inv_std, float* out);

// data.jpeg_draft: the largest shrink (8, 4 or 2, else 1) at which `box` still holds at least
// out_h x out_w pixels, so that the resampler never enlarges what DCT scaling shrank.
int draft_shrink(const CropBox& box, int64_t out_h, int64_t out_w);

// `box` in the pixels of the image decoded at 1 / shrink.
CropBox shrink_box(const CropBox& box, int shrink);

// The source pixels resample reads of a width x height image for `box` at out_h x out_w:
// decode_image_part's `want`.
PixelRect resample_reads(int64_t width, int64_t height, const CropBox& box, int64_t out_h,
                         int64_t out_w);

}  // namespace dtrain
