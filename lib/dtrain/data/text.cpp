#include "dtrain/data/text.hpp"

#include <fmt/format.h>
#include <fnmatch.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// Why a data.path that names nothing readable is refused: absent, or a link to nothing.
std::string absent(const std::string& path) {
  const std::string kind = not_regular_file(path);
  return kind == "missing" ? "does not exist" : "is " + kind;
}

int64_t total_size(const std::vector<std::string>& files, std::vector<uintmax_t>* sizes) {
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    if (ec) throw UserError(fmt::format("{}: cannot read its size ({})", f, ec.message()));
    if (sizes) sizes->push_back(n);
    total += static_cast<int64_t>(n);
    if (total > kMaxCorpusBytes)
      throw UserError(fmt::format(
          "data.path: the corpus passes {} bytes at {}; dataset: bytes reads at most that much",
          kMaxCorpusBytes, f));
  }
  return total;
}

// Whether a pattern of data.exclude matches the file's name or its path below the folder (where
// '*' and '?' do not cross a '/': "sub/*.txt" is not "sub/deep/a.txt").
// `used[k]` is set where pattern k matches.
bool excluded(const fs::path& file, const std::string& root,
              const std::vector<std::string>& exclude, std::vector<bool>& used) {
  const std::string name = file.filename().string();
  const std::string below = file.lexically_relative(root).generic_string();
  bool out = false;
  for (size_t k = 0; k < exclude.size(); ++k) {
    const std::string& g = exclude[k];
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0 ||
        fnmatch(g.c_str(), below.c_str(), FNM_PATHNAME) == 0)
      out = used[k] = true;
  }
  return out;
}

std::vector<std::string> folder_files(const std::string& path,
                                      const std::vector<std::string>& exclude,
                                      std::vector<bool>& used) {
  std::vector<std::string> files;
  std::error_code ec;
  // Links to folders are not followed (a loop would never end); links to files are read.
  fs::recursive_directory_iterator it(path, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code entry;  // a dangling or looping link: named, not taken for the folder's
    if (is_hidden(it->path())) {
      if (it->is_directory(entry)) it.disable_recursion_pending();
      continue;
    }
    if (excluded(it->path(), path, exclude, used)) {
      if (it->is_directory(entry)) it.disable_recursion_pending();
      continue;
    }
    if (it.depth() >= kMaxFolderDepth && it->is_directory(entry))
      refuse_deep_folder(it->path(), path);
    const bool file = it->is_regular_file(entry);
    if (entry)
      throw UserError(fmt::format("{}: cannot be read ({})", it->path().string(), entry.message()));
    if (file) {
      files.push_back(it->path().string());
    } else if (!it->is_directory(entry)) {  // a FIFO, a device, a link to one: not text
      throw UserError(
          fmt::format("{}: {} in a text folder; move it out, or list it in "
                      "data.exclude",
                      printable(it->path().string(), true), not_regular_file(it->path().string())));
    }
  }
  if (ec) throw UserError(fmt::format("data.path: cannot list '{}' ({})", path, ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

// Appends the bytes of `path` to `out`, which has room reserved: exactly the `size` it had
// when the corpus was counted. One that holds more (a kernel file such as /proc/self/pagemap,
// whose size says 0, or a file growing meanwhile) would otherwise be read without bound, past
// the corpus cap and the memory estimate; one that holds less was cut while read.
void read_file(const std::string& path, uintmax_t size, std::vector<uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot be opened for reading", path));
  char buf[1 << 16];
  uintmax_t left = size;
  while (in && left > 0) {
    // A large corpus takes seconds: Ctrl-C or SIGTERM stops it between reads.
    if (stop_requested()) throw Interrupted("interrupted by the user");
    in.read(buf, static_cast<std::streamsize>(std::min<uintmax_t>(sizeof buf, left)));
    out.insert(out.end(), buf, buf + in.gcount());
    left -= static_cast<uintmax_t>(in.gcount());
  }
  if (in.bad()) throw UserError(fmt::format("{}: read error", path));
  if (left > 0)
    throw UserError(
        fmt::format("{}: cut short while read: {} of the {} bytes it held when "
                    "counted; dataset: bytes reads files of a fixed size",
                    path, size - left, size));
  if (in && in.get() != std::ifstream::traits_type::eof())
    throw UserError(
        fmt::format("{}: holds more bytes than its size says ({}): a file that grows "
                    "as it is read, or a kernel file; dataset: bytes reads files of a "
                    "fixed size",
                    path, size));
}

// The windows of tokens [lo, lo + n) of the stream, at most `limit` (0: all).
template <class Token>
Dataset windows(const std::vector<Token>& all, int64_t lo, int64_t n, int64_t block,
                int64_t limit, int64_t vocab) {
  Dataset d;
  int64_t count = byte_windows(n, block);
  if (limit > 0) count = std::min(count, limit);
  d.shape = {block + 1};
  d.classes = static_cast<int>(vocab);
  // Reserved, then filled window by window: gigabytes of windows are seconds of first touches,
  // which a stop (checked every 65536 windows) need not wait for.
  d.x.reserve(static_cast<size_t>(count * (block + 1)));
  d.y.resize(static_cast<size_t>(count));
  for (int64_t w = 0; w < count; ++w) {
    if (w % 65536 == 0 && stop_requested()) throw Interrupted("interrupted by the user");
    const Token* src = all.data() + lo + w * block;
    d.x.insert(d.x.end(), src, src + block + 1);  // each token converted to float
    d.y[static_cast<size_t>(w)] = src[block];  // the window's last target, for summaries
  }
  return d;
}

}  // namespace

std::vector<std::string> corpus_files(const std::string& path,
                                      const std::vector<std::string>& exclude,
                                      std::vector<std::string>* unmatched) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw UserError(fmt::format("data.path: '{}' {} (dataset: bytes reads a file or a folder "
                                "of files)",
                                path, absent(path)));
  std::vector<std::string> files;
  std::vector<bool> used(exclude.size(), false);
  if (fs::is_regular_file(st))
    files.push_back(path);
  else if (fs::is_directory(st))
    files = folder_files(path, exclude, used);
  else
    throw UserError(fmt::format("data.path: '{}' is {}, neither a file nor a folder",
                                printable(path, true), not_regular_file(path)));
  if (files.empty())
    throw UserError(fmt::format("data.path: '{}' holds no files to read as bytes{}", path,
                                exclude.empty() ? "" : " that data.exclude leaves in"));
  total_size(files, nullptr);
  if (unmatched)
    for (size_t k = 0; k < exclude.size(); ++k)
      if (!used[k]) unmatched->push_back(exclude[k]);
  return files;
}

std::string sha256_hex(const uint8_t* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    throw std::runtime_error("OpenSSL's SHA-256 failed");
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
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
// `unit`: what the stream counts ("bytes", "tokens").
void check_windows(const DataConfig& cfg, int64_t total, const CorpusSplit& sp,
                   const char* unit = "bytes") {
  const int64_t need = cfg.block_size + 1;
  if (byte_windows(sp.train, cfg.block_size) == 0)
    throw UserError(fmt::format("data.path: '{}' has {} {}; its training share ({} {}) "
                                "holds no window of data.block_size + 1 = {} {}; lower "
                                "data.block_size or bring more text",
                                cfg.path, total, unit, sp.train, unit, need, unit));
  if (byte_windows(sp.test, cfg.block_size) == 0)
    throw UserError(fmt::format("data.validation: {} of '{}' ({} {}) holds no window of "
                                "data.block_size + 1 = {} {}; raise data.validation or lower "
                                "data.block_size",
                                cfg.validation, cfg.path, sp.test, unit, need, unit));
}

}  // namespace

namespace {

// Refuses, before anything is read, a stream whose tokens and windows would not fit in the
// memory available: `per_token` bytes a token read (1 for bytes, 2 for uint16 tokens), 4
// (block + 1) a window kept.
void check_stream_fits(const DataConfig& cfg, const CorpusSplit& sp, double per_token,
                       const char* unit) {
  const auto kept = [&](int64_t n, int64_t limit) {
    const int64_t w = byte_windows(n, cfg.block_size);
    return static_cast<double>(limit > 0 ? std::min(w, limit) : w);
  };
  const double need = per_token * static_cast<double>(sp.train + sp.test) +
                      4.0 * static_cast<double>(cfg.block_size + 1) *
                          (kept(sp.train, cfg.train_limit) + kept(sp.test, cfg.test_limit));
  const double have = available_host_memory();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (have > 0 && need > have)
    throw UserError(fmt::format("data.path: the {} {} of '{}' need about {:.1f} GiB in "
                                "memory as windows, and {:.1f} GiB are available; read less "
                                "or lower data.train_limit",
                                sp.train + sp.test, unit, cfg.path, need / kGiB, have / kGiB));
}

}  // namespace

namespace {

// The stream's SHA-256, checked against data.sha256 where that is given.
std::string check_pin(const DataConfig& cfg, const std::vector<uint8_t>& all, size_t files) {
  const std::string got = sha256_hex(all.data(), all.size());
  if (cfg.sha256.empty()) return got;
  std::string want = cfg.sha256;
  std::transform(want.begin(), want.end(), want.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (got != want)
    throw UserError(fmt::format(
        "data.sha256: the {} bytes read from '{}' ({} file{}) have SHA-256 {}, and the config "
        "pins {}: these are not the files it was written for (another version of their "
        "package, files another package added to the folder, another data.path or "
        "data.exclude); set data.sha256 to the new sum to train on them, or to '' to check "
        "nothing",
        all.size(), cfg.path, files, files == 1 ? "" : "s", got, want));
  return got;
}

}  // namespace

void load_bytes(const DataConfig& cfg, DataSplit& s) {
  std::vector<std::string> unmatched;
  const std::vector<std::string> files = corpus_files(cfg.path, cfg.exclude, &unmatched);
  for (const auto& g : unmatched)
    log().warn("data.exclude: '{}' leaves nothing out: no file or folder under {} that would be "
               "read matches it, by name or by path below it",
               g, cfg.path);
  std::vector<uintmax_t> sizes;
  const int64_t size = total_size(files, &sizes);
  check_stream_fits(cfg, split_bytes(size, cfg.validation), 1.0, "bytes");
  std::vector<uint8_t> all;
  all.reserve(static_cast<size_t>(size));
  for (size_t i = 0; i < files.size(); ++i) read_file(files[i], sizes[i], all);
  s.sha256 = check_pin(cfg, all, files.size());
  const auto total = static_cast<int64_t>(all.size());
  const CorpusSplit sp = split_bytes(total, cfg.validation);
  check_windows(cfg, total, sp);
  s.train = windows(all, 0, sp.train, cfg.block_size, cfg.train_limit, kByteVocab);
  s.test = windows(all, sp.train, sp.test, cfg.block_size, cfg.test_limit, kByteVocab);
}

DataShape peek_bytes(const DataConfig& cfg) {
  const int64_t total = total_size(corpus_files(cfg.path, cfg.exclude), nullptr);
  const CorpusSplit sp = split_bytes(total, cfg.validation);
  check_windows(cfg, total, sp);
  DataShape d;
  d.shape = {cfg.block_size + 1};
  d.classes = kByteVocab;
  const int64_t n = byte_windows(sp.train, cfg.block_size);
  d.train_size = cfg.train_limit > 0 ? std::min(n, cfg.train_limit) : n;
  return d;
}

// ---- dataset: tokens (llm.c token shards)

namespace {

int64_t le32(const unsigned char* p) {
  const uint32_t u = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                     uint32_t{p[3]} << 24;
  return static_cast<int32_t>(u);
}

// Checks the header of the shard open in `in` against the file's size and leaves `in` at the
// first token; returns the token count.
int64_t read_shard_header(std::istream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  in.seekg(0);
  if (!in || size < 0) throw UserError(fmt::format("{}: cannot read its size", path));
  if (size < kShardHeaderBytes)
    throw UserError(fmt::format("{}: not an llm.c token shard: {} bytes, shorter than its header "
                                "of {} bytes",
                                path, size, kShardHeaderBytes));
  unsigned char h[12];
  if (!in.read(reinterpret_cast<char*>(h), sizeof h))
    throw UserError(fmt::format("{}: read error in the header", path));
  const int64_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
  if (magic != kShardMagic)
    throw UserError(fmt::format("{}: not an llm.c token shard (magic {}, expected {})", path,
                                magic, kShardMagic));
  if (version != 1)
    throw UserError(fmt::format("{}: llm.c token shard version {}; dtrain reads version 1 "
                                "(uint16 tokens){}",
                                path, version,
                                version == 2 ? ", not yet version 2 (uint32 tokens)" : ""));
  if (count <= 0)
    throw UserError(fmt::format("{}: the shard holds no tokens (its header says {})", path,
                                count));
  const int64_t want = kShardHeaderBytes + 2 * count;
  if (size < want)
    throw UserError(fmt::format("{}: cut short: its header claims {} tokens, {} bytes in all, "
                                "and the file has {}",
                                path, count, want, size));
  if (size > want)
    throw UserError(fmt::format(
        "{}: {} byte{} follow{} the {} tokens its header claims (a shard "
        "is 1024 + 2 x count = {} bytes)",
        path, size - want, size - want == 1 ? "" : "s", size - want == 1 ? "s" : "", count, want));
  in.seekg(kShardHeaderBytes);
  return count;
}

std::ifstream open_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot be opened for reading", path));
  return in;
}

// The regular *.bin files of a folder (links to files followed; hidden names skipped),
// sorted: those named *val* are test shards, the other *train* ones training shards.
TokenShards folder_shards(const std::string& path) {
  TokenShards sh;
  sh.folder = true;
  std::error_code ec;
  std::vector<std::string> left_out;  // *.bin (any case) files that no word names as a shard
  fs::directory_iterator it(path, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_hidden(it->path())) continue;
    if (it->path().extension() != ".bin") {
      std::string ext = it->path().extension().string();
      for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::error_code regular;
      if (ext == ".bin" && it->is_regular_file(regular)) left_out.push_back(name);
      continue;
    }
    std::error_code link;  // a link to nothing is named, not taken for a failed listing
    const bool file = it->is_regular_file(link);
    if (link)
      throw UserError(fmt::format("{}: cannot be read ({})", it->path().string(), link.message()));
    const bool val = name.find("val") != std::string::npos;
    const bool train = name.find("train") != std::string::npos;
    // Named as a shard but not a file (a FIFO, a folder): named, not passed over in silence.
    if (!file && (val || train))
      throw UserError(fmt::format("{}: is {}, where a token shard (a regular file) is named",
                                  it->path().string(), not_regular_file(it->path().string())));
    if (!file) continue;
    if (!val && !train) left_out.push_back(name);
    if (val && train)
      throw UserError(fmt::format("data.path: '{}': '{}' is named both train and val; rename "
                                  "it so that only one of the two words is in its name",
                                  path, name));
    if (val) sh.test.push_back(it->path().string());
    if (train) sh.train.push_back(it->path().string());
  }
  if (ec) throw UserError(fmt::format("data.path: cannot list '{}' ({})", path, ec.message()));
  if (!left_out.empty()) {
    std::sort(left_out.begin(), left_out.end());
    const size_t shown = std::min<size_t>(left_out.size(), 3);
    for (auto& n : left_out) n = printable(n, true);
    log().warn(
        "data.path: {} .bin file{} in '{}' left out, named neither *train*.bin nor "
        "*val*.bin (lower case): {}{}",
        left_out.size(), left_out.size() == 1 ? "" : "s", printable(path, true),
        fmt::join(left_out.begin(), left_out.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
        left_out.size() > shown ? ", ..." : "");
  }
  std::sort(sh.train.begin(), sh.train.end());
  std::sort(sh.test.begin(), sh.test.end());
  const auto none = [&](const char* what, const char* word, const char* example) {
    return UserError(fmt::format("data.path: '{}' holds no {} shards: llm.c token shards (*.bin) "
                                 "whose name contains '{}', such as {}",
                                 path, what, word, example));
  };
  if (sh.train.empty()) throw none("training", "train", "fineweb_train_000001.bin");
  if (sh.test.empty()) throw none("validation", "val", "fineweb_val_000000.bin");
  return sh;
}

// The tokens of `files`, from their headers, added to `total`: at most kMaxShardTokens.
int64_t shard_total(const std::string& path, const std::vector<std::string>& files,
                    int64_t total) {
  for (const auto& f : files) {
    total += shard_tokens(f);
    if (total > kMaxShardTokens)
      throw UserError(fmt::format("data.path: the shards of '{}' pass {} tokens (2^31) at {}; "
                                  "dataset: tokens reads at most that many",
                                  path, kMaxShardTokens, f));
  }
  return total;
}

// The tokens of the training and the test split, from the headers; both must hold a window.
CorpusSplit token_split(const DataConfig& cfg, const TokenShards& sh) {
  if (sh.folder && cfg.validation != DataConfig{}.validation)
    throw UserError(fmt::format("data.validation: {} splits a single shard file; '{}' is a "
                                "folder, whose val shards are the test set: leave "
                                "data.validation out",
                                cfg.validation, cfg.path));
  const int64_t train = shard_total(cfg.path, sh.train, 0);
  if (!sh.folder) {
    const CorpusSplit sp = split_bytes(train, cfg.validation);
    check_windows(cfg, train, sp, "tokens");
    return sp;
  }
  const CorpusSplit sp{train, shard_total(cfg.path, sh.test, train) - train};
  const int64_t need = cfg.block_size + 1;
  for (const auto& [what, n] : {std::pair{"training", sp.train}, std::pair{"val", sp.test}})
    if (byte_windows(n, cfg.block_size) == 0)
      throw UserError(fmt::format("data.path: the {} shards of '{}' hold {} tokens, no window "
                                  "of data.block_size + 1 = {} tokens; lower data.block_size",
                                  what, cfg.path, n, need));
  return sp;
}

}  // namespace

int64_t shard_tokens(const std::string& path) {
  std::ifstream in = open_shard(path);
  return read_shard_header(in, path);
}

int64_t read_shard(const std::string& path, int64_t vocab, std::vector<uint16_t>& out, int64_t skip,
                   int64_t take) {
  std::ifstream in = open_shard(path);
  const int64_t count = read_shard_header(in, path);  // the file holds them all
  skip = std::clamp<int64_t>(skip, 0, count);
  const int64_t end = skip + std::min(take, count - skip);
  out.reserve(out.size() + static_cast<size_t>(end - skip));
  in.seekg(kShardHeaderBytes + 2 * skip);
  unsigned char buf[1 << 16];
  for (int64_t at = skip; at < end;) {
    if (stop_requested()) throw Interrupted("interrupted by the user");
    const int64_t n = std::min<int64_t>(end - at, sizeof buf / 2);
    if (!in.read(reinterpret_cast<char*>(buf), 2 * n))
      throw UserError(fmt::format("{}: cut short after {} of {} tokens while read", path, at,
                                  count));
    for (int64_t i = 0; i < n; ++i, ++at) {
      const auto t = static_cast<uint16_t>(buf[2 * i] | buf[2 * i + 1] << 8);
      if (t >= vocab)
        throw UserError(fmt::format("{}: token {} at index {} is not below data.vocab_size ({}); "
                                    "set data.vocab_size to the tokenizer's vocabulary",
                                    path, t, at, vocab));
      out.push_back(t);
    }
  }
  return end - skip;
}

namespace {
// Tokens [skip, skip + take) of the stream `files` make, in order, appended to `out`.
void read_stream(const std::vector<std::string>& files, int64_t skip, int64_t take, int64_t vocab,
                 std::vector<uint16_t>& out) {
  for (const auto& f : files) {
    if (take <= 0) return;
    if (skip > 0) {  // only then is a shard's count needed before it is read
      const int64_t count = shard_tokens(f);
      if (skip >= count) {
        skip -= count;
        continue;
      }
    }
    take -= read_shard(f, vocab, out, skip, take);
    skip = 0;
  }
}
}  // namespace

TokenShards token_shards(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw UserError(fmt::format("data.path: '{}' {} (dataset: tokens reads an llm.c token "
                                "shard, or a folder of *train* and *val* shards)",
                                path, absent(path)));
  if (fs::is_directory(st)) return folder_shards(path);
  if (!fs::is_regular_file(st))
    throw UserError(fmt::format("data.path: '{}' is {}, neither a file nor a folder",
                                printable(path, true), not_regular_file(path)));
  TokenShards sh;
  sh.train.push_back(path);
  return sh;
}

void load_tokens(const DataConfig& cfg, DataSplit& s) {
  const TokenShards sh = token_shards(cfg.path);
  const CorpusSplit sp = token_split(cfg, sh);
  // The windows a limit keeps are the first ones: only their tokens are read.
  const auto needed = [&](int64_t n, int64_t limit) {
    return limit > 0 ? std::min(n, limit * cfg.block_size + 1) : n;
  };
  const CorpusSplit read{needed(sp.train, cfg.train_limit), needed(sp.test, cfg.test_limit)};
  check_stream_fits(cfg, read, 2.0, "tokens");
  // The test tokens follow the training ones in the stream (one file split by
  // data.validation), or are the val shards' own.
  std::vector<uint16_t> all;
  all.reserve(static_cast<size_t>(read.train + read.test));
  read_stream(sh.train, 0, read.train, cfg.vocab_size, all);
  if (sh.folder)
    read_stream(sh.test, 0, read.test, cfg.vocab_size, all);
  else
    read_stream(sh.train, sp.train, read.test, cfg.vocab_size, all);
  if (static_cast<int64_t>(all.size()) != read.train + read.test)
    throw UserError(fmt::format("data.path: the shards of '{}' changed while read", cfg.path));
  s.train = windows(all, 0, read.train, cfg.block_size, cfg.train_limit, cfg.vocab_size);
  s.test = windows(all, read.train, read.test, cfg.block_size, cfg.test_limit, cfg.vocab_size);
}

DataShape peek_tokens(const DataConfig& cfg) {
  const CorpusSplit sp = token_split(cfg, token_shards(cfg.path));
  DataShape d;
  d.shape = {cfg.block_size + 1};
  d.classes = static_cast<int>(cfg.vocab_size);
  const int64_t n = byte_windows(sp.train, cfg.block_size);
  d.train_size = cfg.train_limit > 0 ? std::min(n, cfg.train_limit) : n;
  return d;
}

}  // namespace dtrain
