#pragma once
// Datasets in memory: float features (row-major, one row per sample) and int labels.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

struct ImageFiles;

struct Dataset {
  std::vector<float> x;        // size() * features(); empty where `files` is set
  std::vector<int32_t> y;      // size()
  std::vector<int64_t> shape;  // per-sample shape, e.g. {1, 28, 28}
  int classes = 0;
  // dataset: folder: the samples are image files, decoded as batches use them (pipeline.hpp).
  std::shared_ptr<const ImageFiles> files;
  int64_t size() const { return static_cast<int64_t>(y.size()); }
  int64_t features() const;
};

struct DataSplit {
  Dataset train;
  Dataset test;
  std::string description;  // for logs: "fashion-mnist 60000/10000 from /usr/share/..."
  std::vector<std::string> class_names;  // dataset: folder: the class folders, by label
  std::vector<std::string> skipped;      // data.on_bad_file: skip: "<file>: <reason>"
  int64_t other_files = 0;  // dataset: folder: files left out by name (not images: notes.txt)
  // dataset: bytes and tokens: samples are windows of token ids, whose targets are their next
  // tokens; y holds each window's last token, not a label.
  bool token_windows = false;
  std::string sha256;  // dataset: bytes: the SHA-256 of the stream read (data.sha256 pins it)
  // A hash of what was loaded (data_fingerprint), which a checkpoint keeps so that a run is
  // never continued on other data.
  uint64_t fingerprint = 0;
};

// A 64-bit hash of the samples as loaded, labels and shapes included (never 0). For dataset:
// folder, the files' paths and labels: a file whose bytes change under the same name is not
// seen.
uint64_t data_fingerprint(const DataSplit& s);

// IDX files (LeCun's MNIST format), raw or gzip-compressed; errors name the file.
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
};
// `limit` > 0: the first `limit` images only (the rest of the file is not read). Images that
// would not fit in the memory available are refused, naming `limit_key` as the way to read fewer.
IdxImages read_idx_images(const std::string& path, int64_t limit = 0,
                          const char* limit_key = "data.train_limit");
std::vector<uint8_t> read_idx_labels(const std::string& path);

// A key that is equal exactly when two configurations load the same data (the data section's
// keys but those schema.hpp marks as acting after the load, and the seed for synthetic data),
// so a multi-run command loads each dataset once.
std::string data_identity(const DataConfig& cfg, uint64_t seed);

// What load_data would give, without loading it (for bounds on what depends on the data):
// the sample shape and the training samples kept (after data.train_limit), from the config
// (synthetic) or the training images' header, and the classes: exact for synthetic data, an
// upper bound for files (10 for the named datasets, 256 for idx: labels are bytes).
struct DataShape {
  std::vector<int64_t> shape;
  int classes = 0;
  int64_t train_size = 0;
};
DataShape peek_data_shape(const DataConfig& cfg);
// The per-sample shape a data set will have, from its config alone (no file is read).
std::vector<int64_t> nominal_shape(const DataConfig& cfg);
// Its classes (the vocabulary for text), from its config alone; 0 where only the files say
// (a folder's class folders, idx labels).
int nominal_classes(const DataConfig& cfg);

// Loads the configured dataset: files or synthetic, limits, normalisation, label sorting.
DataSplit load_data(const DataConfig& cfg, uint64_t seed);

// The features per sample of data.synthetic.shape; throws UserError past 2^40 (never wraps).
int64_t synthetic_features(const SyntheticConfig& cfg);
// Throws UserError (naming the keys, the GiB needed and available) when the synthetic data set
// would not fit in the memory available: checked before anything is allocated.
void check_synthetic_fits(const DataConfig& cfg);

// The synthetic data set's sizes, shape and classes without its samples (every label 0, no
// features), for the checks of a plan before seconds and gigabytes go into drawing them.
// Throws as check_synthetic_fits does.
DataSplit synthetic_outline(const DataConfig& cfg);

// A learnable synthetic task: Gaussian clusters around per-class prototypes.
Dataset make_synthetic(const SyntheticConfig& cfg, int64_t n, uint64_t seed, uint64_t stream);

// The labels that occur and how often, compactly: "0-9 (6000 each) and 200 (1)".
std::string describe_labels(const Dataset& d);
// Labels that leave the model's outputs untrained, or ask for what it cannot learn: classes
// (outputs) that no training sample has, and test labels absent from the training set. One
// line naming them (the doctor's `sparse-labels`, a warning of validate), or "" when none.
std::string label_warning(const DataSplit& d);

// Standardises both sets in place as data.normalize says: (x - mean) / std, one statistic for
// all features (global) or one per channel (channel), taken from data.mean and data.std where
// given, else from the training set.
void normalize(const DataConfig& cfg, DataSplit& s);

// Stable reorder of samples by label (0s first), the worst case for contiguous sharding.
void sort_by_label(Dataset& d);

}  // namespace dtrain
