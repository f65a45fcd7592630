#pragma once
// dataset: bytes (llm.c token shards, dataset: tokens, below). Any file (or folder of files)
// read as bytes, a vocabulary of 256: the training set is the first 1 - data.validation of the
// bytes, the test set the rest. A sample is a window of data.block_size + 1 bytes stored as
// floats (the ids), the windows of a split starting every block_size bytes, so that each byte
// but the first is a target once an epoch. The model predicts every next byte of its window
// (model.type gpt).
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/data/data.hpp"

namespace dtrain {

inline constexpr int kByteVocab = 256;
// The largest corpus read: its windows take 4 (block + 1) / block bytes of memory per byte.
inline constexpr int64_t kMaxCorpusBytes = int64_t{1} << 30;

// The files a corpus at `path` reads, in order: the file itself, or a folder's regular files
// (sub-folders included, hidden entries skipped, those an `exclude` glob matches by name or by
// path below `path` left out), sorted by path. Throws UserError for a missing path, an empty
// folder, a corpus over kMaxCorpusBytes, or a file that cannot be read. `unmatched` (if given)
// gets the patterns of `exclude` that left nothing out (a typo, most likely).
std::vector<std::string> corpus_files(const std::string& path,
                                      const std::vector<std::string>& exclude = {},
                                      std::vector<std::string>* unmatched = nullptr);

// The SHA-256 of `n` bytes as 64 lower-case hex digits (OpenSSL's), what sha256sum prints.
std::string sha256_hex(const uint8_t* data, size_t n);

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

// dataset: tokens. llm.c's token shards (dev/data/data_common.py, write_datafile): a header of
// 256 little-endian int32 (kShardMagic, version 1, the token count), then the tokens as
// little-endian uint16, exactly 1024 + 2 x count bytes. data.path is one shard, split like
// bytes (the last data.validation share is the test set), or a folder whose *.bin files named
// *train* are the training set and those named *val* the test set, each list in name order.
// The shards of a list are concatenated and the stream windowed as bytes are: a window may
// cross from one shard into the next, as llm.c's writers split the token stream (a document
// too) at shard boundaries. The vocabulary is data.vocab_size; every token must lie below it.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int64_t kShardHeaderBytes = 1024;
// The most tokens read: as windows they take 4 (block + 1) / block bytes of memory each, and
// 2 more while read.
inline constexpr int64_t kMaxShardTokens = int64_t{1} << 31;

// The tokens of the shard at `path`, from its header checked against the file's size (nothing
// else is read). Throws UserError naming the file for a header cut short, another magic or
// version, no tokens, or a size other than 1024 + 2 x count bytes.
int64_t shard_tokens(const std::string& path);
// Appends the shard's tokens [skip, skip + take) (at most to its end) to `out`, checked as
// shard_tokens does before anything is allocated; a token not below `vocab` is refused, naming
// its value and index. Returns the tokens appended.
int64_t read_shard(const std::string& path, int64_t vocab, std::vector<uint16_t>& out,
                   int64_t skip = 0, int64_t take = INT64_MAX);

// The shards data.path names: one file (folder false: split by data.validation) or a
// folder's train and val shards (hidden names skipped, sub-folders not read), sorted by name.
struct TokenShards {
  std::vector<std::string> train, test;
  bool folder = false;
};
TokenShards token_shards(const std::string& path);

// Loads the shards of cfg.path into windows (limits applied); errors name the file or key.
void load_tokens(const DataConfig& cfg, DataSplit& s);
// The shape, classes and training windows load_tokens would give, from the shards' headers.
DataShape peek_tokens(const DataConfig& cfg);

}  // namespace dtrain
