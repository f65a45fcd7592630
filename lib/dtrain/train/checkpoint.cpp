#include "dtrain/train/checkpoint.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"

namespace dtrain {

namespace {

constexpr char kMagic[] = "dtrain checkpoint 1\n";
constexpr size_t kMagicLen = sizeof(kMagic) - 1;

// Every field of EpochMetrics, in file order: doubles and int64s as they are in memory.
template <class M, class F>
void epoch_fields(M& m, F&& f) {
  f(m.epoch);
  for (auto* d : {&m.lr, &m.lr_end, &m.train_loss, &m.train_acc, &m.test_loss, &m.test_acc,
                  &m.epoch_time_s, &m.samples_per_s})
    f(*d);
  f(m.samples);
  for (auto* d : {&m.data_s, &m.compute_s, &m.exchange_s, &m.optimizer_s, &m.exchange_exposed_s,
                  &m.eval_s, &m.rank_busy_min_s, &m.rank_busy_max_s})
    f(*d);
  f(m.slowest_rank);
  f(m.exchange_bytes_per_step);
  for (auto* d : {&m.busbw_gbps, &m.noise_g2, &m.noise_trace, &m.noise_b_simple}) f(*d);
}

class Writer {
 public:
  std::string out{kMagic, kMagicLen};
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod(static_cast<uint64_t>(v.size()));
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    out += s;
  }
};

class Reader {
 public:
  Reader(const std::string& b, std::string what) : b_(b), what_(std::move(what)) {}
  template <class T>
  void pod(T& v) {
    take(&v, sizeof v);
  }
  template <class T>
  void vec(std::vector<T>& v) {
    v.resize(count(sizeof(T)));
    take(v.data(), v.size() * sizeof(T));
  }
  void str(std::string& s) {
    s.resize(count(1));
    take(s.data(), s.size());
  }
  // A length, checked against the bytes left before anything is allocated.
  size_t count(size_t elem) {
    uint64_t n = 0;
    pod(n);
    if (n > (b_.size() - at_) / elem) bad("a length runs past the end of the file");
    return static_cast<size_t>(n);
  }
  void skip_magic() { at_ = kMagicLen; }
  size_t at() const { return at_; }
  [[noreturn]] void bad(const std::string& why) const {
    throw UserError(fmt::format(
        "{}: not a usable checkpoint ({}); delete it to start the run over", what_, why));
  }

 private:
  void take(void* p, size_t n) {
    if (n > b_.size() - at_) bad("it ends too soon");
    if (n) std::memcpy(p, b_.data() + at_, n);
    at_ += n;
  }
  const std::string& b_;
  std::string what_;
  size_t at_ = 0;
};

// The fields in file order, for writing and reading alike.
template <class IO, class C>
void fields(IO& io, C& c) {
  io.str(c.config_yaml);
  io.pod(c.replicas);
  io.pod(c.epoch);
  io.pod(c.step);
  io.pod(c.global_step);
  io.vec(c.params);
  io.vec(c.opt_m);
  io.vec(c.opt_v);
  io.vec(c.bn_state);
  io.vec(c.rng);
  io.pod(c.noise);
  io.vec(c.partial_stats);
  io.pod(c.partial_lr_first);
  io.pod(c.partial_times);
  io.vec(c.step_losses);
  io.pod(c.launches_per_step);
}

uint32_t crc_of(const std::string& b, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t at = 0;
  while (at < n) {  // zlib takes lengths as uInt
    const auto chunk = static_cast<uInt>(std::min<size_t>(n - at, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(b.data() + at), chunk);
    at += chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

std::string encode_checkpoint(const Checkpoint& c) {
  Writer w;
  fields(w, c);
  w.pod(static_cast<uint64_t>(c.epochs.size()));
  for (const auto& m : c.epochs) epoch_fields(m, [&](const auto& v) { w.pod(v); });
  w.pod(crc_of(w.out, w.out.size()));
  return std::move(w.out);
}

Checkpoint decode_checkpoint(const std::string& bytes, const std::string& what) {
  Reader r(bytes, what);
  if (bytes.size() < kMagicLen + sizeof(uint32_t) || bytes.compare(0, kMagicLen, kMagic) != 0)
    r.bad("no checkpoint header");
  const size_t body = bytes.size() - sizeof(uint32_t);
  uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, sizeof stored);
  if (stored != crc_of(bytes, body)) r.bad("its checksum does not match: damaged or cut short");
  r.skip_magic();
  Checkpoint c;
  fields(r, c);
  size_t epoch_bytes = 0;
  EpochMetrics probe;
  epoch_fields(probe, [&](const auto& v) { epoch_bytes += sizeof v; });
  c.epochs.resize(r.count(epoch_bytes));
  for (auto& m : c.epochs) epoch_fields(m, [&](auto& v) { r.pod(v); });
  if (r.at() != body) r.bad("unexpected bytes after its fields");
  const double noise_steps = c.noise[3];
  if (c.replicas < 1 || c.rng.size() != 4 * static_cast<size_t>(c.replicas) || c.epoch < 0 ||
      c.step < 0 || c.global_step < 0 || c.partial_stats.size() % 5 != 0 ||
      c.epochs.size() != static_cast<size_t>(c.epoch) || !(noise_steps >= 0) ||
      noise_steps > 0x1p53 || noise_steps != std::floor(noise_steps))
    r.bad("inconsistent fields");
  return c;
}

std::string checkpoint_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoint.bin").string();
}

namespace {

// For the tests of crash safety: DTRAIN_CRASH_IN_CHECKPOINT=N kills the process with SIGKILL
// halfway through writing its N-th checkpoint (the temporary file half written, as a crash
// would leave it).
void crash_if_asked(const std::string& path, const std::string& bytes) {
  static int saves = 0;
  const char* n = std::getenv("DTRAIN_CRASH_IN_CHECKPOINT");
  if (!n || std::atoi(n) != ++saves) return;
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size() / 2, f);
    std::fflush(f);
  }
  ::raise(SIGKILL);
}

}  // namespace

void save_checkpoint(const std::string& run_dir, const Checkpoint& c) {
  const std::string path = checkpoint_path(run_dir), bytes = encode_checkpoint(c);
  crash_if_asked(path, bytes);
  write_file_atomic(path, bytes);
}

std::optional<Checkpoint> load_checkpoint(const std::string& run_dir) {
  const std::string path = checkpoint_path(run_dir);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return decode_checkpoint(read_text_file(path, "checkpoint", size_t{1} << 40), path);
}

}  // namespace dtrain
