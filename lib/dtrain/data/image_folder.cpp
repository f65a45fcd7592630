#include "dtrain/data/image_folder.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/data/data.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxClasses = 100000;

// fn(0) .. fn(n - 1) on `workers` threads (this one among them); the first exception is
// rethrown once every thread has stopped.
template <class F>
void parallel_for(size_t n, int workers, F&& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex m;
  auto work = [&] {
    try {
      for (size_t i; (i = next++) < n;) fn(i);
    } catch (...) {
      const std::lock_guard lock(m);
      if (!error) error = std::current_exception();
      next = n;  // the others stop after their current item
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // Out of threads: the ones started and this one share the work instead.
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// Why a class folder's entry cannot be a sample, or "" when it can: a regular file (a link to
// one is followed) of at least one byte that this process may read.
std::string entry_problem(const fs::directory_entry& e) {
  std::error_code ec;
  const fs::file_status st = e.status(ec);  // follows a link; a loop or dangling link fails
  if (ec) return fmt::format("cannot be read ({})", ec.message());
  if (!fs::is_regular_file(st)) return "not a regular file";
  const auto size = e.file_size(ec);
  if (ec) return fmt::format("cannot be read ({})", ec.message());
  if (size == 0) return "empty file (0 bytes)";
  if (::access(e.path().c_str(), R_OK) != 0)
    return fmt::format("cannot be read ({})", std::strerror(errno));
  return "";
}

// Whether a file's name may be an image's: no extension, or an image format's (JPEG and PNG,
// and those dtrain refuses by name when it meets them: a BMP or WebP file is a mistake to
// report, not to pass over). Other files in a class folder (notes.txt, Thumbs.db, labels.csv)
// are not samples, as torchvision's ImageFolder takes image extensions alone.
bool image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  if (ext.empty()) return true;
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::set<std::string> kImage = {
      ".jpg", ".jpeg", ".jpe", ".jfif", ".png",  ".bmp",  ".gif",  ".tif", ".tiff", ".webp",
      ".ppm", ".pgm",  ".pbm", ".pnm",  ".heic", ".heif", ".avif", ".jxl", ".jp2"};
  return kImage.count(ext) > 0;
}

// The files of one class folder, relative to `root`, sorted. Subfolders belong to the class;
// links to folders are not followed (no loops).
std::vector<std::string> class_files(const fs::path& root, const fs::path& dir, BadFile policy,
                                     std::vector<std::string>& skipped, int64_t& other_files) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) throw UserError(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) throw UserError(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
    const fs::directory_entry& e = *it;
    if (is_hidden(e.path())) {
      if (e.is_directory(ec) && !e.is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (e.is_directory(ec)) {  // walked into next, or a link to a folder: left out
      if (it.depth() >= kMaxFolderDepth) refuse_deep_folder(e.path(), root.string());
      continue;
    }
    if (!image_name(e.path())) {
      ++other_files;
      continue;
    }
    const std::string rel = e.path().lexically_relative(root).string();
    const std::string problem = entry_problem(e);
    if (problem.empty()) {
      out.push_back(rel);
    } else if (policy == BadFile::fail) {
      throw UserError(fmt::format("{}: {} (data.on_bad_file: skip leaves such files out)",
                                  e.path().string(), problem));
    } else {
      skipped.push_back(fmt::format("{}: {}", e.path().string(), problem));
    }
  }
  if (ec) throw UserError(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

// The class folders of root/split, sorted by name.
std::vector<std::string> class_folders(const fs::path& split_dir) {
  std::error_code ec;
  if (!fs::is_directory(split_dir, ec))
    throw UserError(fmt::format(
        "{}: {} (dataset: folder needs train/<class>/ and test/<class>/ folders of "
        "images in data.path)",
        split_dir.string(), fs::exists(split_dir, ec) ? "not a folder" : "no such folder"));
  std::vector<std::string> names;
  fs::directory_iterator it(split_dir, ec), end;
  if (ec) throw UserError(fmt::format("{}: cannot list: {}", split_dir.string(), ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    // A link to a folder is not a class (train/all -> train would hold every image).
    if (!is_hidden(it->path()) && !it->is_symlink(ec) && it->is_directory(ec))
      names.push_back(it->path().filename());
    if (names.size() > kMaxClasses)
      throw UserError(
          fmt::format("{}: more than {} class folders", split_dir.string(), kMaxClasses));
  }
  if (ec) throw UserError(fmt::format("{}: cannot list: {}", split_dir.string(), ec.message()));
  std::sort(names.begin(), names.end());
  if (names.empty())
    throw UserError(fmt::format("{}: holds no class folders (images go in {}/<class>/)",
                                split_dir.string(), split_dir.string()));
  return names;
}

void list_split(const fs::path& root, const char* split, const std::vector<std::string>& classes,
                BadFile policy, FolderListing& l, bool train) {
  std::vector<std::string>& files = train ? l.train : l.test;
  std::vector<int32_t>& labels = train ? l.train_y : l.test_y;
  std::map<std::string, int32_t> label;
  for (size_t i = 0; i < classes.size(); ++i) label[classes[i]] = static_cast<int32_t>(i);
  for (const std::string& c : class_folders(root / split)) {
    const auto it = label.find(c);
    if (it == label.end())
      throw UserError(
          fmt::format("{}: class '{}' is not among the training classes (train/ "
                      "has {} class folders; the test set's must be among them)",
                      (root / split / c).string(), c, classes.size()));
    auto found = class_files(root, root / split / c, policy, l.skipped, l.other_files);
    if (found.empty() && policy == BadFile::fail && std::string(split) == "train")
      throw UserError(
          fmt::format("{}: holds no image files (a class needs training images; "
                      "data.on_bad_file: skip keeps the class without them)",
                      (root / split / c).string()));
    labels.insert(labels.end(), found.size(), it->second);
    files.insert(files.end(), std::make_move_iterator(found.begin()),
                 std::make_move_iterator(found.end()));
  }
}

}  // namespace

namespace {
// A split with no sample left: none there, or every one skipped (data.on_bad_file: skip), then
// with how many and the first reason, so the user sees why without a run folder to look in.
[[noreturn]] void throw_nothing_left(const FolderListing& l, const std::string& root,
                                     const char* split) {
  const std::string prefix = (fs::path(root) / split).string() + "/";
  std::vector<const std::string*> mine;  // the split's own: skipped lists both
  const std::string joined = root + "/" + split + "/";  // as the decoder names files
  for (const auto& s : l.skipped)
    if (s.rfind(prefix, 0) == 0 || s.rfind(joined, 0) == 0) mine.push_back(&s);
  if (mine.empty()) throw UserError(fmt::format("{}/{}: holds no image files", root, split));
  throw UserError(fmt::format("{}/{}: no usable image file ({} left out by data.on_bad_file: "
                              "skip; the first: {})",
                              root, split, mine.size(), *mine.front()));
}
}  // namespace

FolderListing list_image_folder(const std::string& root, BadFile on_bad_file) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw UserError(
        fmt::format("data.path: '{}' is not a folder (dataset: folder needs "
                    "train/<class>/ and test/<class>/ folders of images in it)",
                    root));
  FolderListing l;
  l.classes = class_folders(fs::path(root) / "train");
  list_split(root, "train", l.classes, on_bad_file, l, true);
  list_split(root, "test", l.classes, on_bad_file, l, false);
  for (const auto* split : {&l.train, &l.test})
    if (split->empty()) throw_nothing_left(l, root, split == &l.train ? "train" : "test");
  return l;
}

std::vector<uint8_t> read_image_bytes(const std::string& full_path, size_t limit,
                                      int64_t* file_size) {
  // O_NONBLOCK: a FIFO put in place of a file after listing must not block a worker.
  const int fd = ::open(full_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UserError(fmt::format("{}: cannot open: {}", full_path, std::strerror(errno)));
  struct stat st {};
  std::vector<uint8_t> bytes;
  std::string problem;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    problem = "not a regular file";
  else if (st.st_size > kMaxImageFileBytes)
    problem = fmt::format("{} bytes, more than the {} dtrain reads for one image", st.st_size,
                          kMaxImageFileBytes);
  if (file_size) *file_size = st.st_size;
  if (problem.empty()) {
    bytes.resize(std::min(static_cast<size_t>(st.st_size), limit));
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + at, bytes.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        problem = n < 0 ? fmt::format("read failed: {}", std::strerror(errno)) : "";
        bytes.resize(at);  // shorter than when listed: decoded as it is now
        break;
      }
      at += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!problem.empty()) throw UserError(fmt::format("{}: {}", full_path, problem));
  return bytes;
}

namespace {
// What a file's bytes count in the decode budget: the file, and for a PNG room for a second
// copy (decode_png copies a file with gamma chunks without them).
int64_t file_bytes(const ImageHeader& h, size_t size) {
  return static_cast<int64_t>(size) * (std::strcmp(h.format, "PNG") == 0 ? 2 : 1);
}
}  // namespace

Image read_image_file(const std::string& full_path, int channels) {
  const std::vector<uint8_t> bytes = read_image_bytes(full_path);
  const ImageHeader h = read_image_header(bytes.data(), bytes.size(), full_path);
  const DecodeBudget::Hold held(
      DecodeBudget::process(),
      file_bytes(h, bytes.size()) + decode_bytes(h, channels, h.height, 1));
  return decode_image(bytes.data(), bytes.size(), channels, full_path);
}

namespace {

// Sample i of in-memory image data as 8-bit interleaved pixels, resampled to side x side where
// `side` is not 0.
Image sample_image(const Dataset& d, int64_t i, int64_t side) {
  const int64_t c = d.shape[0], plane = d.shape[1] * d.shape[2];
  Image img{d.shape[2], d.shape[1], static_cast<int>(c), std::vector<uint8_t>()};
  img.pixels.resize(static_cast<size_t>(c * plane));
  auto to_byte = [](float v) {
    return static_cast<uint8_t>(std::lround(std::clamp(v, 0.f, 1.f) * 255.f));
  };
  const float* x = d.x.data() + i * c * plane;
  for (int64_t p = 0; p < plane; ++p)  // planar floats to interleaved bytes
    for (int64_t ch = 0; ch < c; ++ch)
      img.pixels[static_cast<size_t>(p * c + ch)] = to_byte(x[ch * plane + p]);
  if (side <= 0 || (side == img.width && side == img.height)) return img;
  std::vector<float> big(static_cast<size_t>(c * side * side));
  const std::vector<float> zero(static_cast<size_t>(c), 0.f), one(zero.size(), 1.f);
  resample(img, CropBox{0, 0, static_cast<double>(img.width), static_cast<double>(img.height)},
           side, side, zero.data(), one.data(), big.data());
  Image out{side, side, img.channels, std::vector<uint8_t>(big.size())};
  for (int64_t p = 0; p < side * side; ++p)
    for (int64_t ch = 0; ch < c; ++ch)
      out.pixels[static_cast<size_t>(p * c + ch)] =
          to_byte(big[static_cast<size_t>(ch * side * side + p)]);
  return out;
}

void write_split(const Dataset& d, const fs::path& dir, int classes, int quality, int64_t side) {
  const int width = static_cast<int>(fmt::format("{}", std::max(0, classes - 1)).size());
  const int digits = static_cast<int>(fmt::format("{}", d.size()).size());
  // Progress every 1,024 images, or every second where they are slow (a large --side).
  auto shown = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < d.size(); ++i) {
    const Image img = sample_image(d, i, side);
    const fs::path cls = dir / fmt::format("{:0{}}", d.y[static_cast<size_t>(i)], width);
    ensure_dir(cls.string(), "exported class");
    const auto bytes = quality > 0 ? encode_jpeg(img, quality) : encode_png(img);
    const fs::path file = cls / fmt::format("{:0{}}.{}", i, digits, quality > 0 ? "jpg" : "png");
    write_new_file(file.string(), bytes.data(), bytes.size());
    if (stop_requested()) throw Interrupted("interrupted by the user");
    if (const auto now = std::chrono::steady_clock::now();
        i % 1024 == 1023 || now - shown >= std::chrono::seconds(1)) {
      show_progress(fmt::format("export: {} {} of {}", dir.filename().string(), i + 1, d.size()));
      shown = now;
    }
  }
  clear_progress();
}

}  // namespace

int64_t write_image_tree(const Dataset& train, const Dataset& test, const std::string& dir,
                         int jpeg_quality, int64_t side) {
  for (const Dataset* d : {&train, &test})
    if (d->files || d->shape.size() != 3 || (d->shape[0] != 1 && d->shape[0] != 3))
      throw UserError(
          fmt::format("export: needs in-memory images of 1 or 3 channels, this data "
                      "is [{}]",
                      fmt::join(d->shape, ", ")));
  const int classes = std::max(train.classes, test.classes);
  // A folder dataset's classes are its training folders: each label needs a training sample.
  std::vector<bool> seen(static_cast<size_t>(std::max(classes, 0)), false);
  for (int32_t y : train.y)
    if (y >= 0 && y < classes) seen[static_cast<size_t>(y)] = true;
  for (int c = 0; c < classes; ++c)
    if (!seen[static_cast<size_t>(c)])
      throw UserError(fmt::format("export: the training set has no sample of label {} (of {}), "
                                  "and a folder dataset's classes are its training folders; "
                                  "keep more training samples (data.train_limit)",
                                  c, classes));
  write_split(train, fs::path(dir) / "train", classes, jpeg_quality, side);
  write_split(test, fs::path(dir) / "test", classes, jpeg_quality, side);
  return train.size() + test.size();
}

void DecodeBudget::acquire(int64_t bytes, const std::atomic<bool>* cancel) {
  std::unique_lock lk(mu_);
  const auto fits = [&] { return held_ == 0 || held_ + bytes <= cap_; };
  // The cancel flag is set without the lock: looked at every 20 ms while waiting.
  while (!fits()) {
    if (cancel && cancel->load()) throw DecodeCancelled();
    freed_.wait_for(lk, std::chrono::milliseconds(20));
  }
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

void DecodeBudget::release(int64_t bytes) {
  {
    std::lock_guard lk(mu_);
    held_ -= bytes;
  }
  freed_.notify_all();
}

int64_t DecodeBudget::peak() const {
  std::lock_guard lk(mu_);
  return peak_;
}

DecodeBudget& DecodeBudget::process() {
  static DecodeBudget budget(kDecodeBudgetBytes);
  return budget;
}

void make_sample(const ImageFiles& f, int64_t index, int64_t epoch, uint64_t seed, float* out,
                 const std::atomic<bool>* cancel) {
  if (index < 0 || index >= static_cast<int64_t>(f.paths.size()))
    DTRAIN_THROW_SYSTEM(fmt::format("input: sample {} of {}", index, f.paths.size()));
  const std::string path = f.full_path(index);
  const std::vector<uint8_t> bytes = read_image_bytes(path);
  // The crop from the header's size, then only the pixels it reads decoded.
  const ImageHeader h = read_image_header(bytes.data(), bytes.size(), path);
  const int64_t out_h = f.shape[1], out_w = f.shape[2];
  const CropBox full = f.train ? random_resized_crop(h.width, h.height, f.crop_scale[0],
                                                     f.crop_scale[1], f.crop_ratio[0],
                                                     f.crop_ratio[1], f.flip,
                                                     sample_key(seed, epoch, index))
                               : centre_crop(h.width, h.height, out_h, out_w);
  // data.jpeg_draft: the crop in the pixels of the image decoded smaller.
  const int shrink =
      f.jpeg_draft && std::strcmp(h.format, "JPEG") == 0 ? draft_shrink(full, out_h, out_w) : 1;
  const CropBox box = shrink_box(full, shrink);
  const PixelRect reads = resample_reads(shrunk_size(h.width, shrink),
                                         shrunk_size(h.height, shrink), box, out_h, out_w);
  const bool seen_whole = f.whole_reads && f.whole_reads->contains(path);
  // A PNG decodes whole; a JPEG the rows it reads, each of the image's (shrunk) width.
  const int64_t rows = std::strcmp(h.format, "PNG") == 0 ? h.height : reads.height;
  const DecodeBudget::Hold held(
      DecodeBudget::process(),
      file_bytes(h, bytes.size()) + decode_bytes(h, static_cast<int>(f.shape[0]), rows, shrink),
      cancel);
  const ImagePart part = decode_image_part(bytes.data(), bytes.size(), static_cast<int>(f.shape[0]),
                                           h, reads, path, !seen_whole, shrink);
  if (!seen_whole && f.whole_reads) f.whole_reads->add(path);
  resample(part, box, out_h, out_w, f.mean.data(), f.inv_std.data(), out);
}

std::shared_ptr<const ImageFiles> with_transform(const std::shared_ptr<const ImageFiles>& files,
                                                 const DataConfig& d) {
  const AugmentConfig& a = d.augment;
  if (!files || (files->crop_scale == a.crop_scale && files->crop_ratio == a.crop_ratio &&
                 files->flip == a.flip && files->jpeg_draft == d.jpeg_draft))
    return files;
  auto f = std::make_shared<ImageFiles>(*files);  // whole_reads stays shared
  f->crop_scale = a.crop_scale;
  f->crop_ratio = a.crop_ratio;
  f->flip = a.flip;
  f->jpeg_draft = d.jpeg_draft;
  return f;
}

namespace {

// Why each of `files` fails (UserError's text), "" where it does not: decoded whole where
// `whole`, else its header read. A stop (Ctrl-C, SIGTERM) lets only the decodes under way
// finish: a check of a large tree takes minutes.
std::vector<std::string> undecodable(const std::vector<std::string>& files, const std::string& root,
                                     int channels, int workers, bool whole) {
  std::vector<std::string> why(files.size());
  parallel_for(files.size(), workers, [&](size_t i) {
    if (stop_requested()) return;
    const std::string path = root + "/" + files[i];
    try {
      if (whole) {
        read_image_file(path, channels);
        return;
      }
      // The header lies in the first bytes of nearly every file; a JPEG with large metadata
      // segments before its frame header is read whole before it is refused.
      int64_t size = 0;
      std::vector<uint8_t> head = read_image_bytes(path, size_t{16} << 10, &size);
      try {
        read_image_header(head.data(), head.size(), path);
      } catch (const UserError&) {
        if (static_cast<int64_t>(head.size()) >= size) throw;
        head = read_image_bytes(path);
        read_image_header(head.data(), head.size(), path);
      }
    } catch (const UserError& e) {
      why[i] = e.what();
    }
  });
  if (stop_requested()) throw Interrupted("interrupted by the user");
  return why;
}

}  // namespace

void check_decodable(const FolderListing& l, const std::string& root, int channels, int workers) {
  for (const bool train : {true, false}) {
    const auto& files = train ? l.train : l.test;
    for (const std::string& why : undecodable(files, root, channels, workers, !train))
      if (!why.empty())
        throw UserError(
            fmt::format("{} (found before training; data.on_bad_file: skip leaves "
                        "such files out)",
                        why));
  }
}

void drop_undecodable(FolderListing& l, const std::string& root, int channels, int workers) {
  for (const auto& split : {std::pair{&l.train, &l.train_y}, std::pair{&l.test, &l.test_y}}) {
    auto* files = split.first;
    auto* labels = split.second;
    const std::vector<std::string> why = undecodable(*files, root, channels, workers, true);
    size_t kept = 0;
    for (size_t i = 0; i < files->size(); ++i) {
      if (!why[i].empty()) {
        l.skipped.push_back(why[i]);
        continue;
      }
      if (kept != i) (*files)[kept] = std::move((*files)[i]);  // a self-move would empty it
      (*labels)[kept++] = (*labels)[i];
    }
    files->resize(kept);
    labels->resize(kept);
  }
}

namespace {

// Indices of `keep` samples spread evenly over n (all of them where keep is 0 or at least n):
// a limit on a class-sorted list must keep every class's share, not the first classes.
std::vector<size_t> spread(size_t n, int64_t keep) {
  const size_t k = keep > 0 ? std::min(n, static_cast<size_t>(keep)) : n;
  std::vector<size_t> idx(k);
  for (size_t i = 0; i < k; ++i) idx[i] = i * n / k;  // i < k <= n: no overflow below 2^32 files
  return idx;
}

Dataset split_dataset(const DataConfig& cfg, const FolderListing& l, bool train, int64_t limit) {
  const auto& paths = train ? l.train : l.test;
  const auto& labels = train ? l.train_y : l.test_y;
  auto f = std::make_shared<ImageFiles>();
  f->root = cfg.path;
  f->shape = cfg.shape;
  f->train = train;
  f->crop_scale = cfg.augment.crop_scale;
  f->crop_ratio = cfg.augment.crop_ratio;
  f->flip = cfg.augment.flip;
  f->jpeg_draft = cfg.jpeg_draft;
  f->mean.assign(static_cast<size_t>(cfg.shape[0]), 0.f);
  f->inv_std.assign(f->mean.size(), 1.f);
  Dataset d;
  for (size_t i : spread(paths.size(), limit)) {
    f->paths.push_back(paths[i]);
    d.y.push_back(labels[i]);
  }
  d.shape = cfg.shape;
  d.classes = static_cast<int>(l.classes.size());
  d.files = std::move(f);
  return d;
}

// Per-channel (or global) mean and std of pixel values in [0, 1], over up to 256 training
// images spread over the set (fewer past 1024 x 1024 pixels: at most 2^28 pixels a channel in
// all, so that a huge data.shape costs seconds, not minutes, before the memory check refuses
// it), each through the evaluation transform (decoded on `workers`).
std::pair<std::vector<double>, std::vector<double>> measure_stats(const DataConfig& cfg,
                                                                  const Dataset& train) {
  ImageFiles probe = *train.files;
  probe.train = false;
  probe.jpeg_draft = false;  // a key that acts after the load must not change what it loads
  const int64_t c = cfg.shape[0], plane = cfg.shape[1] * cfg.shape[2];
  const auto picks =
      spread(probe.paths.size(), std::clamp<int64_t>((int64_t{1} << 28) / plane, 1, 256));
  const auto image = static_cast<size_t>(c * plane);
  // A few images per worker at a time, not all 256 at once, and at most 256 MiB of them (one
  // 3 x 8192 x 8192 image is 768 MiB), summed in the same order either way.
  const size_t fit = std::max<size_t>(1, (size_t{256} << 20) / (image * sizeof(float)));
  const size_t chunk = std::min(fit, 4 * static_cast<size_t>(std::max(1, cfg.workers)));
  std::vector<float> px(std::min(chunk, picks.size()) * image);
  std::vector<double> sum(static_cast<size_t>(c)), sq(sum.size());
  for (size_t first = 0; first < picks.size(); first += chunk) {
    if (stop_requested()) throw Interrupted("interrupted by the user");
    const size_t count = std::min(chunk, picks.size() - first);
    parallel_for(count, cfg.workers, [&](size_t i) {
      make_sample(probe, static_cast<int64_t>(picks[first + i]), 0, 0, px.data() + i * image);
    });
    for (size_t i = 0; i < count * image; ++i) {
      const auto ch = static_cast<size_t>(static_cast<int64_t>(i) / plane % c);
      sum[ch] += px[i];
      sq[ch] += static_cast<double>(px[i]) * px[i];
    }
  }
  const bool per_channel = cfg.normalize == Normalize::channel;
  if (!per_channel) {
    for (size_t ch = 1; ch < sum.size(); ++ch) sum[0] += sum[ch], sq[0] += sq[ch];
    sum.assign(sum.size(), sum[0]);
    sq.assign(sq.size(), sq[0]);
  }
  const double n =
      static_cast<double>(picks.size() * plane) * (per_channel ? 1.0 : static_cast<double>(c));
  std::vector<double> mean(sum.size()), sd(sum.size());
  for (size_t ch = 0; ch < sum.size(); ++ch) {
    mean[ch] = sum[ch] / n;
    sd[ch] = std::sqrt(std::max(1e-12, sq[ch] / n - mean[ch] * mean[ch]));
  }
  return {mean, sd};
}

// data.normalize on both splits: the given statistics (one, or one per channel), else measured.
void set_stats(const DataConfig& cfg, DataSplit& s) {
  if (cfg.normalize == Normalize::off) return;
  const auto channels = static_cast<size_t>(cfg.shape[0]);
  std::vector<double> mean(channels), sd(channels, 1.0);
  if (cfg.mean.empty() || cfg.stddev.empty()) std::tie(mean, sd) = measure_stats(cfg, s.train);
  for (size_t ch = 0; ch < channels; ++ch) {
    if (!cfg.mean.empty()) mean[ch] = cfg.mean[cfg.mean.size() == 1 ? 0 : ch];
    if (!cfg.stddev.empty()) sd[ch] = cfg.stddev[cfg.stddev.size() == 1 ? 0 : ch];
  }
  for (Dataset* d : {&s.train, &s.test}) {
    auto f = std::make_shared<ImageFiles>(*d->files);
    for (size_t ch = 0; ch < channels; ++ch) {
      f->mean[ch] = static_cast<float>(mean[ch]);
      f->inv_std[ch] = static_cast<float>(1.0 / sd[ch]);
    }
    d->files = std::move(f);
  }
}

}  // namespace

void load_folder(const DataConfig& cfg, DataSplit& s) {
  FolderListing l = list_image_folder(cfg.path, cfg.on_bad_file);
  if (cfg.on_bad_file == BadFile::skip)
    drop_undecodable(l, cfg.path, static_cast<int>(cfg.shape[0]), cfg.workers);
  else
    check_decodable(l, cfg.path, static_cast<int>(cfg.shape[0]), cfg.workers);
  for (const auto* split : {&l.train, &l.test})
    if (split->empty()) throw_nothing_left(l, cfg.path, split == &l.train ? "train" : "test");
  s.train = split_dataset(cfg, l, true, cfg.train_limit);
  s.test = split_dataset(cfg, l, false, cfg.test_limit);
  set_stats(cfg, s);
  s.class_names = std::move(l.classes);
  s.skipped = std::move(l.skipped);
  s.other_files = l.other_files;
}

}  // namespace dtrain
