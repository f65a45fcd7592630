#include "dtrain/data/data.hpp"
#include "dtrain/data/text.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtrain/data/cifar.hpp"
#include "dtrain/data/image_folder.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/hash.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/config/schema.hpp"

namespace dtrain {

namespace fs = std::filesystem;

int64_t Dataset::features() const {
  int64_t f = 1;
  for (auto s : shape) f *= s;
  return f;
}

namespace {

// A data file, raw or gzip-compressed (told apart by the gzip magic, as gzread does). gzip is
// inflated here rather than through gzread, which skips whatever follows the last gzip member
// without a word: concatenated members are read on, anything else after one is refused.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    const std::string kind = not_regular_file(path);
    if (kind == "missing") throw UserError(fmt::format("{}: file not found", path));
    if (!kind.empty())
      throw UserError(fmt::format("{}: {} (a data file must be a regular file)", path, kind));
    // O_NONBLOCK: a FIFO or a device would block or never end; only regular files are data,
    // checked on the file opened, not the name.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw UserError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw UserError(fmt::format("{}: not a regular file (a data file must be one)", path));
    }
    file_size_ = static_cast<int64_t>(st.st_size);
    // A buffer of up to 1 MiB (a small file, as the fuzzer feeds, needs no more).
    in_.resize(static_cast<size_t>(std::clamp<int64_t>(file_size_, 64, 1 << 20)));
    try {
      fill_to(2);
    } catch (const UserError&) {
      ::close(fd_);
      throw;
    }
    gz_ = have_ >= 2 && in_[at_] == 0x1f && in_[at_ + 1] == 0x8b;
    // Uncompressed files tell their size; compressed ones are read in growing chunks instead.
    if (!gz_) raw_size_ = file_size_;
    if (gz_ && inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      ::close(fd_);
      throw UserError(fmt::format("{}: cannot start decompressing", path));
    }
  }
  ~GzFile() {
    if (gz_) inflateEnd(&zs_);
    ::close(fd_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // `before`: bytes of the same item read by earlier calls, for the message.
  void read(void* dst, size_t n, const char* what, size_t before = 0) {
    auto* p = static_cast<uint8_t*>(dst);
    size_t done = 0;
    while (done < n) {
      const size_t got = pull(p + done, n - done, what);
      if (got == 0)
        throw UserError(fmt::format("{}: truncated: {} ended after {} bytes{}", path_, what,
                                    before + done,
                                    cut_ ? " (the gzip stream is cut short)" : ""));
      done += got;
    }
  }
  // Reads n claimed bytes into a vector that grows only as data arrives, so a header that
  // claims more than the file holds costs no more memory than the file's real content.
  // (check_claim first: an uncompressed file that cannot hold them is refused before reading.)
  std::vector<uint8_t> read_claimed(uint64_t n, const std::string& what) {
    constexpr uint64_t kChunk = 64u << 20;
    std::vector<uint8_t> out;
    out.reserve(static_cast<size_t>(std::min(n, kChunk)));
    while (out.size() < n) {
      const size_t done = out.size();
      const auto step = static_cast<size_t>(std::min<uint64_t>(n - done, kChunk));
      if (out.capacity() < done + step) out.reserve(std::max(done + step, 2 * done));
      out.resize(done + step);
      read(out.data() + done, step, what.c_str(), done);
    }
    return out;
  }
  // An uncompressed file must hold the n bytes after its header that it claims.
  void check_claim(uint64_t n, int64_t header_bytes, const std::string& what) const {
    if (raw_size_ >= 0 && static_cast<uint64_t>(raw_size_ - header_bytes) < n)
      throw UserError(fmt::format("{}: truncated: expected {} bytes of {} (as the header "
                                  "claims), the file holds {}",
                                  path_, n, what, raw_size_ - header_bytes));
  }
  uint32_t read_be32(const char* what) {
    uint8_t b[4];
    read(b, 4, what);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  }
  // After the whole payload the header claims: nothing may follow it (more data, or for gzip
  // bytes after the last member that are not a gzip member).
  void expect_end(const std::string& what) {
    uint8_t b = 0;
    if (pull(&b, 1, what.c_str()) != 0)
      throw UserError(fmt::format("{}: more data than its header claims: bytes follow the {}; "
                                  "the file is damaged or not what its header says",
                                  path_, what));
    // The content is whole, but the gzip member's end (and its CRC and size) never came.
    if (cut_)
      throw UserError(fmt::format("{}: the gzip stream ends without its trailer (CRC and size): "
                                  "the file is truncated",
                                  path_));
  }

 private:
  // Up to n bytes of content (inflated where gzip), 0 at its end.
  size_t pull(uint8_t* dst, size_t n, const char* what) {
    if (!gz_) {
      if (have_ == 0) fill_to(1);
      const size_t k = std::min(n, have_);
      if (k) std::memcpy(dst, in_.data() + at_, k);
      at_ += k, have_ -= k;
      return k;
    }
    zs_.next_out = dst;
    zs_.avail_out = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    const uInt want = zs_.avail_out;
    while (zs_.avail_out > 0) {
      if (member_done_ && !next_member()) break;
      if (have_ == 0 && fill_to(1) == 0) {
        cut_ = true;  // the file ends inside a gzip member
        break;
      }
      zs_.next_in = in_.data() + at_;
      zs_.avail_in = static_cast<uInt>(have_);
      const int r = inflate(&zs_, Z_NO_FLUSH);
      at_ += have_ - zs_.avail_in, have_ = zs_.avail_in;
      if (r == Z_STREAM_END) {
        member_done_ = true;
      } else if (r != Z_OK && r != Z_BUF_ERROR) {
        throw UserError(fmt::format("{}: corrupt or unreadable while reading {}: {}", path_, what,
                                    zs_.msg ? zs_.msg : "not valid gzip data"));
      }
    }
    return want - zs_.avail_out;
  }
  // After a gzip member: the next one, false at the end of the file; anything else is refused.
  bool next_member() {
    if (fill_to(2) == 0) return false;
    if (have_ < 2 || in_[at_] != 0x1f || in_[at_ + 1] != 0x8b)
      throw UserError(fmt::format("{}: {} bytes of trailing garbage after the gzip stream ends "
                                  "(at byte {}): not a gzip member; the file is damaged",
                                  path_, file_size_ - consumed(), consumed()));
    inflateReset(&zs_);
    member_done_ = false;
    return true;
  }
  // Buffers at least `want` unread bytes where the file has them; returns how many it holds.
  size_t fill_to(size_t want) {
    if (have_ >= want) return have_;
    if (have_) std::memmove(in_.data(), in_.data() + at_, have_);
    at_ = 0;
    while (have_ < want) {
      const ssize_t got = ::read(fd_, in_.data() + have_, in_.size() - have_);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        throw UserError(fmt::format("{}: cannot read: {}", path_, std::strerror(errno)));
      if (got == 0) break;
      have_ += static_cast<size_t>(got), read_ += static_cast<int64_t>(got);
    }
    return have_;
  }
  int64_t consumed() const { return read_ - static_cast<int64_t>(have_); }

  std::string path_;
  int fd_ = -1;
  bool gz_ = false, member_done_ = false, cut_ = false;
  z_stream zs_{};
  std::vector<uint8_t> in_;
  size_t at_ = 0, have_ = 0;  // unread bytes in in_: [at_, at_ + have_)
  int64_t read_ = 0;          // bytes read from the file so far
  int64_t file_size_ = 0;
  int64_t raw_size_ = -1;  // file size where it is not compressed
};

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension

// Finds NAME or NAME.gz in dir.
std::string find_idx(const std::string& dir, const std::string& name) {
  for (const auto& cand : {name, name + ".gz"}) {
    const auto p = fs::path(dir) / cand;
    if (fs::exists(p)) return p.string();
  }
  throw UserError(
      fmt::format("{}: missing {} (or {}.gz); data.path must hold the four IDX files "
                  "train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                  "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte",
                  dir, name, name));
}

// `limit` > 0: the first `limit` samples (train_limit, test_limit); the classes are counted
// over every label, so that a limit never changes the model's outputs.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      int64_t limit, const char* limit_key) {
  const IdxImages img = read_idx_images(images_path, limit, limit_key);
  auto lab = read_idx_labels(labels_path);
  const auto all = static_cast<int64_t>(lab.size());
  if (all == 0 && img.count == 0)
    throw UserError(fmt::format("{}: holds no images (0 samples); the training and the test set "
                                "each need at least one",
                                images_path));
  if (img.count != all)
    throw UserError(fmt::format("{} has {} images but {} has {} labels; they must match",
                                images_path, img.count, labels_path, all));
  int max_label = 0;
  for (auto v : lab) max_label = std::max<int>(max_label, v);
  if (limit > 0 && limit < all) lab.resize(static_cast<size_t>(limit));
  Dataset d;
  d.shape = {1, img.rows, img.cols};
  d.x.resize(img.pixels.size());
  for (size_t i = 0; i < img.pixels.size(); ++i) d.x[i] = static_cast<float>(img.pixels[i]) / 255.f;
  d.y.assign(lab.begin(), lab.end());
  d.classes = max_label + 1;
  return d;
}

// The samples a limit (train_limit, test_limit; 0: none) keeps of n.
int64_t kept(int64_t limit, int64_t n) { return limit > 0 ? std::min(limit, n) : n; }

void truncate(Dataset& d, int64_t limit) {
  if (limit <= 0 || limit >= d.size()) return;
  d.y.resize(static_cast<size_t>(limit));
  d.x.resize(static_cast<size_t>(limit * d.features()));
}

}  // namespace

namespace {
// An image file's header: the count and the size of its images (no pixels yet).
IdxImages read_images_header(GzFile& f, const std::string& path) {
  const uint32_t magic = f.read_be32("the header");
  if (magic != kImagesMagic)
    throw UserError(fmt::format(
        "{}: not an IDX image file (magic 0x{:08x}, expected 0x{:08x} for 3-D unsigned bytes)",
        path, magic, kImagesMagic));
  IdxImages out;
  out.count = f.read_be32("the header");
  out.rows = f.read_be32("the header");
  out.cols = f.read_be32("the header");
  // Each factor is checked before the product, so it cannot overflow.
  if (out.rows <= 0 || out.cols <= 0 || out.rows > (1 << 12) || out.cols > (1 << 12))
    throw UserError(fmt::format("{}: implausible image size {}x{} (at most 4096x4096)", path,
                                out.rows, out.cols));
  return out;
}
}  // namespace

IdxImages read_idx_images(const std::string& path, int64_t limit, const char* limit_key) {
  GzFile f(path);
  IdxImages out = read_images_header(f, path);
  const int64_t used = limit > 0 ? std::min<int64_t>(limit, out.count) : out.count;
  const auto bytes = static_cast<uint64_t>(used) * static_cast<uint64_t>(out.rows * out.cols);
  // A gzip file does not say how large it is uncompressed: a small one may claim (and hold)
  // more images than fit in memory. They are refused before any is read: a byte each as read,
  // and 4 as floats.
  const std::string what = fmt::format("{} images of {}x{}", used, out.rows, out.cols);
  f.check_claim(bytes, 16, what);
  const double need = 5.0 * static_cast<double>(bytes);
  const double have = available_host_memory();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (have > 0 && need > have)
    throw UserError(fmt::format("{}: {} need about {:.1f} GiB in memory, and {:.1f} GiB are "
                                "available; read fewer with {}",
                                path, what, need / kGiB, have / kGiB, limit_key));
  out.pixels = f.read_claimed(bytes, what);
  if (used == out.count) f.expect_end(what);  // with a limit, the rest is not read
  return out;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  GzFile f(path);
  const uint32_t magic = f.read_be32("the header");
  if (magic != kLabelsMagic)
    throw UserError(fmt::format(
        "{}: not an IDX label file (magic 0x{:08x}, expected 0x{:08x} for 1-D unsigned bytes)",
        path, magic, kLabelsMagic));
  const uint32_t count = f.read_be32("the header");
  const std::string what = fmt::format("{} labels", count);
  f.check_claim(count, 8, what);
  auto out = f.read_claimed(count, what);
  f.expect_end(what);
  return out;
}

int64_t synthetic_features(const SyntheticConfig& cfg) {
  // Each factor is checked before the product, so it cannot overflow.
  constexpr int64_t kMax = int64_t{1} << 40;
  int64_t f = 1;
  for (int64_t v : cfg.shape) {
    if (v < 1 || f > kMax / v)
      throw UserError(fmt::format("data.synthetic.shape: [{}] is not a sample shape of at "
                                  "most 2^40 features (every dimension at least 1)",
                                  fmt::join(cfg.shape, ", ")));
    f *= v;
  }
  return f;
}

void check_synthetic_fits(const DataConfig& cfg) {
  const SyntheticConfig& s = cfg.synthetic;
  const auto f = static_cast<double>(synthetic_features(s));
  const int64_t train = kept(cfg.train_limit, s.train_size);
  const int64_t test = kept(cfg.test_limit, s.test_size);
  // In doubles: the products of the keys' values cannot overflow. 4 bytes a feature and a
  // label per sample, and the classes' prototypes.
  const double need = (static_cast<double>(train) + static_cast<double>(test)) * (4 * f + 4) +
                      4 * f * s.classes;
  const double have = available_host_memory();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  // Where the available memory is unknown, what no machine here has (16 TiB).
  const double limit = have > 0 ? have : 16 * 1024 * kGiB;
  if (need <= limit) return;
  throw UserError(fmt::format(
      "data.synthetic: {} training and {} test samples of {} features need about {:.1f} GiB in "
      "memory (4 bytes a feature and a label), and {:.1f} GiB are available; lower "
      "data.synthetic.train_size, test_size or shape, or data.train_limit",
      train, test, static_cast<int64_t>(f), need / kGiB, limit / kGiB));
}

DataSplit synthetic_outline(const DataConfig& cfg) {
  check_synthetic_fits(cfg);
  const SyntheticConfig& sy = cfg.synthetic;
  DataSplit s;
  for (Dataset* d : {&s.train, &s.test}) {
    d->shape = sy.shape;
    d->classes = sy.classes;
  }
  s.train.y.assign(static_cast<size_t>(kept(cfg.train_limit, sy.train_size)), 0);
  s.test.y.assign(static_cast<size_t>(kept(cfg.test_limit, sy.test_size)), 0);
  return s;
}

Dataset make_synthetic(const SyntheticConfig& cfg, int64_t n, uint64_t seed, uint64_t stream) {
  Dataset d;
  d.shape = cfg.shape;
  d.classes = cfg.classes;
  const int64_t f = synthetic_features(cfg);
  // Prototypes depend on the seed only, so train and test share them.
  Rng proto_rng(stream_key(seed, 0x5157, 0));
  std::vector<float> protos(static_cast<size_t>(cfg.classes * f));
  for (auto& p : protos) p = static_cast<float>(proto_rng.normal());
  Rng rng(stream_key(seed, 0x5157, stream));
  d.x.resize(static_cast<size_t>(n * f));
  d.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.classes)));
    d.y[static_cast<size_t>(i)] = label;
    const float* p = protos.data() + label * f;
    float* x = d.x.data() + i * f;
    for (int64_t j = 0; j < f; ++j) x[j] = p[j] + static_cast<float>(cfg.noise * rng.normal());
  }
  return d;
}

std::string describe_labels(const Dataset& d) {
  std::map<int32_t, int64_t> count;
  for (int32_t y : d.y) ++count[y];
  // Runs of consecutive labels, each with its count (or the range of its counts, within a
  // factor of 2: a rare label beside common ones gets its own entry).
  std::vector<std::string> runs;
  for (auto it = count.begin(); it != count.end();) {
    const int32_t first = it->first;
    int32_t last = first;
    int64_t lo = it->second, hi = it->second;
    for (++it; it != count.end() && it->first == last + 1; ++it) {
      const int64_t l = std::min(lo, it->second), h = std::max(hi, it->second);
      if (h > 2 * l) break;
      last = it->first, lo = l, hi = h;
    }
    const std::string n = lo == hi ? fmt::format("{}", lo) : fmt::format("{} to {}", lo, hi);
    runs.push_back(first == last ? fmt::format("{} ({})", first, n)
                                 : fmt::format("{}-{} ({} each)", first, last, n));
  }
  if (runs.empty()) return "none";
  const std::string tail = runs.back();
  runs.pop_back();
  // A line, not a page: the first runs, how many are left out, the last.
  constexpr size_t kShown = 8;
  if (runs.size() > kShown) {
    const size_t more = runs.size() - kShown;
    runs.resize(kShown);
    runs.push_back(fmt::format("{} more run{}", more, more == 1 ? "" : "s"));
  }
  return runs.empty() ? tail : fmt::format("{} and {}", fmt::join(runs, ", "), tail);
}

std::string label_warning(const DataSplit& d) {
  if (d.token_windows) return "";  // the model predicts every token of a window, not y
  std::set<int32_t> trained(d.train.y.begin(), d.train.y.end());
  int64_t untrained = 0;
  for (int32_t c = 0; c < d.train.classes; ++c) untrained += trained.count(c) == 0;
  Dataset unseen;  // the test samples whose label no training sample has
  for (int32_t y : d.test.y)
    if (trained.count(y) == 0) unseen.y.push_back(y);
  if (untrained == 0 && unseen.y.empty()) return "";
  std::string out = fmt::format("the training labels are {}", describe_labels(d.train));
  if (untrained > 0)
    out += fmt::format("; of the model's {} outputs (labels 0 to {}), {} belong to no training "
                       "sample and are never trained",
                       d.train.classes, d.train.classes - 1, untrained);
  if (!unseen.y.empty())
    out += fmt::format("; the test set has labels the training set lacks, {}, which the model "
                       "can never predict",
                       describe_labels(unseen));
  return out + "; fix: labels numbered 0 to K-1 without gaps, every one in the training set";
}

void sort_by_label(Dataset& d) {
  std::vector<int64_t> idx(static_cast<size_t>(d.size()));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return d.y[static_cast<size_t>(a)] < d.y[static_cast<size_t>(b)];
  });
  const int64_t f = d.features();
  std::vector<float> x(d.x.size());
  std::vector<int32_t> y(d.y.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    y[i] = d.y[static_cast<size_t>(idx[i])];
    if (!d.files) std::copy_n(d.x.begin() + idx[i] * f, f, x.begin() + static_cast<int64_t>(i) * f);
  }
  if (d.files) {
    auto files = std::make_shared<ImageFiles>(*d.files);
    for (size_t i = 0; i < idx.size(); ++i)
      files->paths[i] = d.files->paths[static_cast<size_t>(idx[i])];
    d.files = std::move(files);
  }
  d.x = std::move(x);
  d.y = std::move(y);
}

namespace {
// Writes the data section's keys as `name=value;`, skipping the keys marked as acting after
// the load. A key added to the schema joins the identity unless marked: forgetting the mark
// costs a needless reload, never two configs sharing data they should not.
class IdentityWriter {
 public:
  std::string key;

  template <class T>
  void operator()(const Key& k, const T& v) {
    if (k.after_load) return;
    key += k.name;
    key += '=';
    if constexpr (std::is_enum_v<T>)
      key += to_string(v);
    else if constexpr (std::is_same_v<T, std::string>)
      key += fmt::format("{}:{}", v.size(), v);  // length first: any byte may follow
    else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                       std::is_same_v<T, std::vector<double>>)
      key += fmt::format("[{}]", fmt::join(v, ","));
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      for (const auto& x : v) key += fmt::format("{}:{}", x.size(), x);
    else
      key += fmt::format("{}", v);
    key += ';';
  }

  template <class S>
  void section(const Key& k, const S& s) {
    if (k.after_load) return;
    key += fmt::format("{}{{", k.name);
    visit(s, *this);
    key += "};";
  }
};
}  // namespace

std::string data_identity(const DataConfig& c, uint64_t seed) {
  IdentityWriter w;
  visit(c, w);
  // Synthetic data is drawn from the seed; files are not.
  if (c.dataset == DatasetKind::synthetic) w.key += fmt::format("seed={};", seed);
  return w.key;
}

namespace {
bool is_cifar(DatasetKind k) {
  return k == DatasetKind::cifar10 || k == DatasetKind::cifar100;
}
}  // namespace

std::vector<int64_t> nominal_shape(const DataConfig& cfg) {
  if (cfg.dataset == DatasetKind::synthetic) return cfg.synthetic.shape;
  if (cfg.dataset == DatasetKind::folder) return cfg.shape;
  if (token_dataset(cfg.dataset)) return {cfg.block_size + 1};
  if (is_cifar(cfg.dataset)) return {3, 32, 32};
  return {1, 28, 28};  // Fashion-MNIST and MNIST; IDX files of other sizes say so when read
}

int nominal_classes(const DataConfig& cfg) {
  switch (cfg.dataset) {
    case DatasetKind::synthetic:
      return cfg.synthetic.classes;
    case DatasetKind::tokens:
      return static_cast<int>(cfg.vocab_size);
    case DatasetKind::bytes:
      return 256;
    case DatasetKind::folder:
    case DatasetKind::idx:
      return 0;
    default:
      return is_cifar(cfg.dataset) ? cifar_format(cfg.dataset).classes : 10;
  }
}

DataShape peek_data_shape(const DataConfig& cfg) {
  DataShape d;
  if (cfg.dataset == DatasetKind::synthetic) {
    d.shape = cfg.synthetic.shape;
    d.classes = cfg.synthetic.classes;
    d.train_size = kept(cfg.train_limit, cfg.synthetic.train_size);
    return d;
  }
  if (cfg.dataset == DatasetKind::bytes) return peek_bytes(cfg);
  if (cfg.dataset == DatasetKind::tokens) return peek_tokens(cfg);  // from the headers
  if (is_cifar(cfg.dataset)) {
    const CifarFormat& f = cifar_format(cfg.dataset);
    d.shape = nominal_shape(cfg);
    d.classes = f.classes;
    d.train_size = kept(cfg.train_limit, cifar_train_size(cfg.path, f));
    return d;
  }
  if (cfg.dataset == DatasetKind::folder) {  // listed, not decoded
    const FolderListing l = list_image_folder(cfg.path, cfg.on_bad_file);
    d.shape = cfg.shape;
    d.classes = static_cast<int>(l.classes.size());
    d.train_size = kept(cfg.train_limit, static_cast<int64_t>(l.train.size()));
    return d;
  }
  if (!fs::is_directory(cfg.path))
    throw UserError(
        fmt::format("data.path: '{}' is not a folder (it must hold the IDX files)", cfg.path));
  const std::string path = find_idx(cfg.path, "train-images-idx3-ubyte");
  GzFile f(path);
  const IdxImages h = read_images_header(f, path);
  d.shape = {1, h.rows, h.cols};
  // Labels are bytes; the named datasets are refused past their ten classes.
  d.classes = cfg.dataset == DatasetKind::idx ? 256 : 10;
  d.train_size = kept(cfg.train_limit, h.count);
  return d;
}

namespace {
// The mean and std of each of `groups` equal runs of every sample's features (one group:
// over all features; c groups: per channel of c x h x w samples).
std::pair<std::vector<double>, std::vector<double>> feature_stats(const Dataset& d,
                                                                  int64_t groups) {
  const int64_t f = d.features(), run = f / groups;
  std::vector<double> sum(static_cast<size_t>(groups)), sq(sum.size());
  for (int64_t i = 0; i < d.size() * f; ++i) {
    const double v = d.x[static_cast<size_t>(i)];
    const auto g = static_cast<size_t>(i % f / run);
    sum[g] += v;
    sq[g] += v * v;
  }
  const double n = static_cast<double>(d.size() * run);
  std::vector<double> mean(sum.size()), sd(sum.size());
  for (size_t g = 0; g < sum.size(); ++g) {
    mean[g] = sum[g] / n;
    sd[g] = std::sqrt(std::max(1e-12, sq[g] / n - mean[g] * mean[g]));
  }
  return {mean, sd};
}
}  // namespace

void normalize(const DataConfig& cfg, DataSplit& s) {
  if (cfg.normalize == Normalize::off) return;
  int64_t groups = 1;
  if (cfg.normalize == Normalize::channel) {
    if (s.train.shape.size() != 3)
      throw UserError(fmt::format(
          "data.normalize: channel needs image data with a [c, h, w] shape, this data is [{}]",
          fmt::join(s.train.shape, ", ")));
    groups = s.train.shape[0];
  }
  auto [mean, sd] = feature_stats(s.train, groups);
  for (const auto& [key, given, out] :
       {std::tuple{"mean", &cfg.mean, &mean}, std::tuple{"std", &cfg.stddev, &sd}}) {
    if (given->empty()) continue;
    if (given->size() != static_cast<size_t>(groups))
      throw UserError(fmt::format("data.{}: needs {} entries (one per channel), got {}", key,
                                  groups, given->size()));
    *out = *given;
  }
  const int64_t run = s.train.features() / groups;
  for (auto* d : {&s.train, &s.test})
    for (size_t i = 0; i < d->x.size(); ++i) {
      const auto g = static_cast<size_t>(static_cast<int64_t>(i) % d->features() / run);
      d->x[i] = static_cast<float>((d->x[i] - mean[g]) / sd[g]);
    }
}

namespace {

// Bytes into a running hash: four lanes of splitmix64's finaliser over 8-byte words (the lanes
// keep the multiplier chains apart: about 1 GB/s), the tail byte by byte, the length last.
uint64_t hash_bytes(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (size_t k = 0; k < 4; ++k) {
      uint64_t w = 0;
      std::memcpy(&w, b + i + 8 * k, 8);
      lane[k] = mix64(lane[k] ^ w);
    }
  for (; i < n; ++i) lane[0] = mix64(lane[0] ^ (b[i] | static_cast<uint64_t>(i) << 8));
  return mix64(lane[0] ^ mix64(lane[1] ^ mix64(lane[2] ^ mix64(lane[3] ^ n))));
}

template <class T>
uint64_t hash_vec(uint64_t h, const std::vector<T>& v) {
  return hash_bytes(h, v.data(), v.size() * sizeof(T));
}

}  // namespace

uint64_t data_fingerprint(const DataSplit& s) {
  uint64_t h = 0x64747261696eULL;
  for (const Dataset* d : {&s.train, &s.test}) {
    h = hash_vec(hash_vec(hash_vec(h, d->shape), d->y), d->x) ^ static_cast<uint64_t>(d->classes);
    if (d->files)
      for (const std::string& f : d->files->paths) h = hash_bytes(h, f.data(), f.size());
  }
  return h ? h : 1;
}

DataSplit load_data(const DataConfig& cfg, uint64_t seed) {
  DataSplit s;
  if (cfg.dataset == DatasetKind::synthetic) {
    // Refused before anything is allocated. Samples are drawn in order from their stream, so
    // drawing only the first train_limit (test_limit) gives the samples a limit keeps.
    check_synthetic_fits(cfg);
    const SyntheticConfig& sy = cfg.synthetic;
    s.train = make_synthetic(sy, kept(cfg.train_limit, sy.train_size), seed, 1);
    s.test = make_synthetic(sy, kept(cfg.test_limit, sy.test_size), seed, 2);
  } else if (is_cifar(cfg.dataset)) {
    load_cifar(cfg.path, cifar_format(cfg.dataset), cfg.train_limit, cfg.test_limit, s.train,
               s.test);
  } else if (cfg.dataset == DatasetKind::folder) {
    load_folder(cfg, s);  // limits and statistics applied to the file lists
  } else if (cfg.dataset == DatasetKind::bytes) {
    load_bytes(cfg, s);  // limits applied to the windows; token ids are not normalised
    s.token_windows = true;
  } else if (cfg.dataset == DatasetKind::tokens) {
    load_tokens(cfg, s);  // the same
    s.token_windows = true;
  } else {
    if (!fs::is_directory(cfg.path))
      throw UserError(
          fmt::format("data.path: '{}' is not a folder (it must hold the IDX files)", cfg.path));
    // Looked up in a fixed order so the first missing file is the one named.
    const auto train_images = find_idx(cfg.path, "train-images-idx3-ubyte");
    const auto train_labels = find_idx(cfg.path, "train-labels-idx1-ubyte");
    const auto test_images = find_idx(cfg.path, "t10k-images-idx3-ubyte");
    const auto test_labels = find_idx(cfg.path, "t10k-labels-idx1-ubyte");
    s.train = load_idx_pair(train_images, train_labels, cfg.train_limit, "data.train_limit");
    s.test = load_idx_pair(test_images, test_labels, cfg.test_limit, "data.test_limit");
    if (s.train.shape != s.test.shape)
      throw UserError(fmt::format("{}: training and test images differ in size", cfg.path));
    s.test.classes = s.train.classes = std::max(s.train.classes, s.test.classes);
    // The named datasets have ten classes; a label past them is a corrupt or different file.
    if (cfg.dataset != DatasetKind::idx && s.train.classes > 10)
      throw UserError(fmt::format("{}: labels go up to {}, but {} has 10 classes (0 to 9); use "
                                  "data.dataset: idx for other label sets",
                                  cfg.path, s.train.classes - 1, to_string(cfg.dataset)));
  }
  if (cfg.dataset != DatasetKind::folder && !token_dataset(cfg.dataset)) {
    truncate(s.train, cfg.train_limit);
    truncate(s.test, cfg.test_limit);
    normalize(cfg, s);
  }
  if (cfg.sort_by_label) sort_by_label(s.train);
  s.description = fmt::format(
      "{} train={} test={} shape=[{}] classes={}{}", to_string(cfg.dataset), s.train.size(),
      s.test.size(), fmt::join(s.train.shape, ","), s.train.classes,
      cfg.dataset == DatasetKind::synthetic ? "" : " from " + printable(cfg.path, true));
  if (!s.skipped.empty())
    s.description += fmt::format(" ({} files skipped: data.on_bad_file: skip)", s.skipped.size());
  if (s.other_files > 0)
    s.description +=
        fmt::format(" ({} other files left out: not image names, as notes.txt)", s.other_files);
  if (!s.sha256.empty()) s.description += " sha256=" + s.sha256;
  s.fingerprint = data_fingerprint(s);
  return s;
}

}  // namespace dtrain
