#pragma once
// dataset: bytes. Any file (or folder of files) read as bytes, a vocabulary of 256: the
// training set is the first 1 - data.validation of the bytes, the test set the rest. A sample
// is a window of data.block_size + 1 bytes stored as floats (the ids), the windows of a split
// starting every block_size bytes, so that each byte but the first is a target once an epoch.
// The model predicts every next byte of its window (model.type gpt).
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/data/data.hpp"

namespace dtrain {

inline constexpr int kByteVocab = 256;
// The largest corpus read: its windows take 4 (block + 1) / block bytes of memory per byte.
inline constexpr int64_t kMaxCorpusBytes = int64_t{1} << 30;

// The files a corpus at `path` reads, in order: the file itself, or a folder's regular files
// (sub-folders included, hidden entries skipped), sorted by path. Throws UserError for a
// missing path, an empty folder, a corpus over kMaxCorpusBytes, or a file that cannot be read.
std::vector<std::string> corpus_files(const std::string& path);

// The bytes of the training and the test split (sizes only, nothing read).
struct CorpusSplit {
  int64_t train = 0, test = 0;
};
CorpusSplit split_bytes(int64_t total, double validation);
// Windows of block + 1 bytes every `block` bytes in `bytes` bytes.
int64_t byte_windows(int64_t bytes, int64_t block);

// Loads the corpus of cfg.path into windows (limits applied); errors name the file or key.
void load_bytes(const DataConfig& cfg, DataSplit& s);
// The shape, classes and training windows load_bytes would give, from the files' sizes.
DataShape peek_bytes(const DataConfig& cfg);

}  // namespace dtrain
