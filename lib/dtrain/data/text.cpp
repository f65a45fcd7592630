#include "dtrain/data/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

int64_t total_size(const std::vector<std::string>& files) {
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    if (ec) throw UserError(fmt::format("{}: cannot read its size ({})", f, ec.message()));
    total += static_cast<int64_t>(n);
    if (total > kMaxCorpusBytes)
      throw UserError(fmt::format(
          "data.path: the corpus passes {} bytes at {}; dataset: bytes reads at most that much",
          kMaxCorpusBytes, f));
  }
  return total;
}

std::vector<std::string> folder_files(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  // Links to folders are not followed (a loop would never end); links to files are read.
  fs::recursive_directory_iterator it(path, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  if (ec) throw UserError(fmt::format("data.path: cannot list '{}' ({})", path, ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

// Appends the bytes of `path` to `out`, which has room reserved.
void read_file(const std::string& path, std::vector<uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot be opened for reading", path));
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.insert(out.end(), buf, buf + in.gcount());
  }
  if (in.bad()) throw UserError(fmt::format("{}: read error", path));
}

// The windows of bytes [lo, lo + n) of the corpus, at most `limit` (0: all).
Dataset windows(const std::vector<uint8_t>& all, int64_t lo, int64_t n, int64_t block,
                int64_t limit) {
  Dataset d;
  int64_t count = byte_windows(n, block);
  if (limit > 0) count = std::min(count, limit);
  d.shape = {block + 1};
  d.classes = kByteVocab;
  d.x.resize(static_cast<size_t>(count * (block + 1)));
  d.y.resize(static_cast<size_t>(count));
  for (int64_t w = 0; w < count; ++w) {
    const uint8_t* src = all.data() + lo + w * block;
    float* dst = d.x.data() + w * (block + 1);
    for (int64_t i = 0; i <= block; ++i) dst[i] = static_cast<float>(src[i]);
    d.y[static_cast<size_t>(w)] = src[block];  // the window's last target, for summaries
  }
  return d;
}

}  // namespace

std::vector<std::string> corpus_files(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw UserError(fmt::format("data.path: '{}' does not exist (dataset: bytes reads a file or "
                                "a folder of files)",
                                path));
  std::vector<std::string> files;
  if (fs::is_regular_file(st))
    files.push_back(path);
  else if (fs::is_directory(st))
    files = folder_files(path);
  else
    throw UserError(fmt::format("data.path: '{}' is neither a file nor a folder", path));
  if (files.empty())
    throw UserError(fmt::format("data.path: '{}' holds no files to read as bytes", path));
  total_size(files);
  return files;
}

CorpusSplit split_bytes(int64_t total, double validation) {
  const auto test = static_cast<int64_t>(std::floor(static_cast<double>(total) * validation));
  return {total - test, test};
}

int64_t byte_windows(int64_t bytes, int64_t block) {
  return bytes > block ? (bytes - 1) / block : 0;
}

namespace {

// Both splits must hold a window; the message says how large the corpus would need to be.
void check_windows(const DataConfig& cfg, int64_t total, const CorpusSplit& sp) {
  const int64_t need = cfg.block_size + 1;
  if (byte_windows(sp.train, cfg.block_size) == 0)
    throw UserError(fmt::format("data.path: '{}' has {} bytes; its training share ({} bytes) "
                                "holds no window of data.block_size + 1 = {} bytes; lower "
                                "data.block_size or bring more text",
                                cfg.path, total, sp.train, need));
  if (byte_windows(sp.test, cfg.block_size) == 0)
    throw UserError(fmt::format("data.validation: {} of '{}' ({} bytes) holds no window of "
                                "data.block_size + 1 = {} bytes; raise data.validation or lower "
                                "data.block_size",
                                cfg.validation, cfg.path, sp.test, need));
}

}  // namespace

void load_bytes(const DataConfig& cfg, DataSplit& s) {
  const std::vector<std::string> files = corpus_files(cfg.path);
  std::vector<uint8_t> all;
  all.reserve(static_cast<size_t>(total_size(files)));
  for (const auto& f : files) read_file(f, all);
  const auto total = static_cast<int64_t>(all.size());
  const CorpusSplit sp = split_bytes(total, cfg.validation);
  check_windows(cfg, total, sp);
  s.train = windows(all, 0, sp.train, cfg.block_size, cfg.train_limit);
  s.test = windows(all, sp.train, sp.test, cfg.block_size, cfg.test_limit);
}

DataShape peek_bytes(const DataConfig& cfg) {
  const int64_t total = total_size(corpus_files(cfg.path));
  const CorpusSplit sp = split_bytes(total, cfg.validation);
  check_windows(cfg, total, sp);
  DataShape d;
  d.shape = {cfg.block_size + 1};
  d.classes = kByteVocab;
  const int64_t n = byte_windows(sp.train, cfg.block_size);
  d.train_size = cfg.train_limit > 0 ? std::min(n, cfg.train_limit) : n;
  return d;
}

}  // namespace dtrain
