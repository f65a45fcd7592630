#pragma once
// dataset: folder: image files in train/<class>/... and test/<class>/... (the layout of
// torchvision's ImageFolder, in which users keep their own data), listed once and decoded as
// batches use them (pipeline.hpp). Class names are the training folder's subfolders, sorted;
// a label is the class's position in that list.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/image.hpp"

namespace dtrain {

struct Dataset;
struct DataSplit;

// The files decoded to their end once, by any thread: a later crop of a JPEG may stop
// decoding at its last row, since damage past it would have been refused the first time. The
// pixels are the same either way; what changes is that a damaged file is named the first time
// it is read, whatever that read's crop. Kept as 64-bit hashes of the paths (a million files:
// tens of MB, not the paths again).
class WholeReads {
 public:
  bool contains(const std::string& path) const {
    const uint64_t h = std::hash<std::string>{}(path);
    std::lock_guard<std::mutex> lock(m_);
    return seen_.count(h) > 0;
  }
  void add(const std::string& path) {
    const uint64_t h = std::hash<std::string>{}(path);
    std::lock_guard<std::mutex> lock(m_);
    seen_.insert(h);
  }

 private:
  mutable std::mutex m_;
  std::unordered_set<uint64_t> seen_;
};

// How the files of one split become samples: the files, in sample order (their labels are the
// Dataset's y), and the transform.
struct ImageFiles {
  std::string root;                  // data.path
  std::vector<std::string> paths;    // relative to root: "train/cat/001.jpg"
  std::vector<int64_t> shape;        // [C, H, W] of a sample
  std::vector<float> mean, inv_std;  // per channel: (v / 255 - mean) * inv_std
  bool train = true;  // a random-resized crop (and a flip), else resize and centre crop
  std::vector<double> crop_scale, crop_ratio;
  bool flip = false;
  bool jpeg_draft = false;  // data.jpeg_draft
  std::shared_ptr<WholeReads> whole_reads = std::make_shared<WholeReads>();  // shared by copies
  std::string full_path(int64_t i) const { return root + "/" + paths[static_cast<size_t>(i)]; }
};

// `files` with the transform `d` asks for (data.augment's crops and flips, data.jpeg_draft):
// keys that act after the data is loaded, so data loaded for one run may serve another that
// differs in them. `files` itself where nothing differs.
std::shared_ptr<const ImageFiles> with_transform(const std::shared_ptr<const ImageFiles>& files,
                                                 const DataConfig& d);

// What listing a folder found, before anything is decoded.
struct FolderListing {
  std::vector<std::string> classes;
  std::vector<std::string> train, test;  // relative to the root, sorted within each class
  std::vector<int32_t> train_y, test_y;
  std::vector<std::string> skipped;  // "<path>: <reason>", for data.on_bad_file: skip
  int64_t other_files = 0;           // left out by their names: not images (notes.txt, Thumbs.db)
};

// Lists root/train and root/test (hidden names skipped, and files whose extension is no image
// format's, counted in other_files; subfolders of a class folder belong to
// it; a symbolic link to a file is followed, one to a folder is not, so a link loop cannot
// trap the listing). UserError, naming the path, for: no such folder, no class folders, more
// than 100000 classes, a test class the training set does not have, and (on_bad_file: fail) an
// empty class folder or an entry that is not a readable regular file of at least one byte;
// with skip, such entries go to `skipped` instead.
FolderListing list_image_folder(const std::string& root, BadFile on_bad_file);

// data.on_bad_file: skip: decodes every listed file once (on `workers` threads) and moves each
// one that does not decode to `skipped`, so that training never meets it.
void drop_undecodable(FolderListing& l, const std::string& root, int channels, int workers);

// data.on_bad_file: fail: what can be found before training, so that a run never trains an
// epoch to fail at its evaluation: every training file's header is read (its first bytes, the
// whole file where its header lies further in) and every test file is decoded once. Throws
// UserError naming the first file, in listing order, that is not an image dtrain can decode.
// A training file damaged past its header is still named when a batch first meets it.
void check_decodable(const FolderListing& l, const std::string& root, int channels, int workers);

// The largest image file dtrain reads: 256 MiB.
constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;

// The bytes of an image file (a regular file of at most kMaxImageFileBytes), its first `limit`
// where it is longer; its size in `file_size` where given. UserError naming the file for what
// cannot be read.
std::vector<uint8_t> read_image_bytes(const std::string& full_path, size_t limit = SIZE_MAX,
                                      int64_t* file_size = nullptr);

// Bytes that a process holds at once for decoding (each image's file bytes and decode_bytes:
// its pixels out and what the decoder keeps besides): a worker about to decode waits while the
// others hold so much that its image would pass the cap, except that one image alone always
// goes ahead (at most kMaxImagePixels). Sixteen workers on 64-Mpixel PNGs held 3 GiB before.
// A worker reads its file before it waits: at most kMaxImageFileBytes each outside the cap.
// A wait that `cancel` (where given) ends early throws DecodeCancelled: a pipeline that stops
// does not wait for images nobody will use to take their turn and decode.
class DecodeBudget {
 public:
  explicit DecodeBudget(int64_t cap) : cap_(cap) {}
  void acquire(int64_t bytes, const std::atomic<bool>* cancel = nullptr);
  void release(int64_t bytes);
  int64_t peak() const;  // the most held at once
  // `bytes` acquired for as long as it lives.
  class Hold {
   public:
    Hold(DecodeBudget& b, int64_t bytes, const std::atomic<bool>* cancel = nullptr)
        : b_(b), bytes_(bytes) {
      b_.acquire(bytes_, cancel);
    }
    ~Hold() { b_.release(bytes_); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    DecodeBudget& b_;
    const int64_t bytes_;
  };
  // The one that make_sample draws on: kDecodeBudgetBytes.
  static DecodeBudget& process();

 private:
  const int64_t cap_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  int64_t held_ = 0, peak_ = 0;
};
constexpr int64_t kDecodeBudgetBytes = int64_t{1} << 30;
struct DecodeCancelled : std::exception {
  const char* what() const noexcept override { return "decode cancelled: the input stopped"; }
};

// The contents of root/path decoded to `channels` channels. UserError naming the file for
// what cannot be read or decoded (see decode_image).
Image read_image_file(const std::string& full_path, int channels);

// Sample `index` of `files` as its transform makes it, in epoch `epoch` of a run seeded `seed`
// (the evaluation transform draws nothing): features() floats into `out`. Throws
// DecodeCancelled where `cancel` is set while it waits for the decode budget.
void make_sample(const ImageFiles& files, int64_t index, int64_t epoch, uint64_t seed, float* out,
                 const std::atomic<bool>* cancel = nullptr);

// The whole of dataset: folder: both splits as lists with their transforms (the per-channel
// statistics given in data.mean and data.std, else measured on up to 256 training images
// spread over the set, through the evaluation transform), data.train_limit and test_limit as
// samples spread evenly over each split, and what was skipped in s.skipped.
void load_folder(const DataConfig& cfg, DataSplit& s);

// Writes in-memory image data (C x H x W samples of 1 or 3 channels, values in [0, 1] as
// data.normalize: false loads them) as a folder dataset: dir/train/<class>/<n>.<ext> and
// dir/test/..., one file per sample, PNG (`jpeg_quality` 0) or JPEG. Class folders are the
// labels zero-padded to one width, so that their sorted order is the labels' order; files are
// numbered in sample order. `side` > 0: each image resampled to side x side first (photo-sized
// files of small images, to study decoding). Returns the files written.
int64_t write_image_tree(const Dataset& train, const Dataset& test, const std::string& dir,
                         int jpeg_quality, int64_t side = 0);

}  // namespace dtrain
