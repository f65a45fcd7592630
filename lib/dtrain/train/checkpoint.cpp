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
#include "dtrain/nn/model.hpp"
#include "dtrain/train/straggler.hpp"

namespace dtrain {

namespace {

// Version 2 adds the input pipeline's two columns to each finished epoch, version 3 the
// straggler's three, version 4 the synchronised-BatchNorm time and, after the epochs, the
// scorings of the test set (train.eval_steps); older files still read (the columns they lack as
// for a run that measured none: NaN, no straggler, 0, no scorings). Version 5 adds the data's
// fingerprint after the scorings (0 in an older file: not checked). Version 6 has version 5's
// fields; its epochs may name a straggler in every phase (kEveryPhase), which a dtrain that
// reads up to version 5 would take for damage (version 5 files of the last builds before 6 may
// hold it too, and are read). Version 7 adds to each epoch the cores other work kept busy
// (NaN in an older file: unknown).
constexpr int kVersion = 7;
constexpr char kMagic[] = "dtrain checkpoint 7\n";
constexpr char kMagicPrefix[] = "dtrain checkpoint ";
constexpr size_t kMagicLen = sizeof(kMagic) - 1;

// Every field of EpochMetrics, in file order: doubles and int64s as they are in memory.
template <class M, class F>
void epoch_fields(M& m, F&& f, int version = kVersion) {
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
  if (version >= 2)
    for (auto* d : {&m.input_images_per_s, &m.input_busy}) f(*d);
  if (version >= 3) {
    f(m.straggler_rank);
    f(m.straggler_phase);
    f(m.straggler_excess);
  }
  if (version >= 4) f(m.bn_sync_s);
  if (version >= 7) f(m.other_cores);
}

// Every field of EvalPoint, in file order.
template <class P, class F>
void eval_fields(P& p, F&& f) {
  f(p.epoch);
  f(p.step);
  f(p.global_step);
  f(p.samples);
  for (auto* d : {&p.train_time_s, &p.test_loss, &p.test_acc}) f(*d);
}

size_t eval_bytes() {
  size_t n = 0;
  EvalPoint probe;
  eval_fields(probe, [&](const auto& v) { n += sizeof v; });
  return n;
}

// The version digit of a checkpoint header line ("dtrain checkpoint N\n"), any N from 1 to 9;
// 0 where the bytes start with no such line.
int header_digit(const std::string& bytes) {
  const size_t n = sizeof(kMagicPrefix) - 1;
  if (bytes.size() < kMagicLen || bytes.compare(0, n, kMagicPrefix) != 0 ||
      bytes[kMagicLen - 1] != '\n' || bytes[n] < '1' || bytes[n] > '9')
    return 0;
  return bytes[n] - '0';
}

// The version of a checkpoint's header line, or 0 where it is none dtrain reads.
int header_version(const std::string& bytes) {
  const int v = header_digit(bytes);
  return v <= kVersion ? v : 0;
}

// The version of a header line of a later dtrain's checkpoint (above kVersion), else 0.
int newer_version(const std::string& bytes) {
  const int v = header_digit(bytes);
  return v > kVersion ? v : 0;
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

// The range checks of a decoded checkpoint: each refusal names the field and its value.
class Check {
 public:
  // `of_run`: the checks against a run (its data and config as they are now), whose failure
  // may be the data's change, not the file's damage.
  Check(const std::string& what, bool of_run) : what_(what), of_run_(of_run) {}
  [[noreturn]] void fail(const std::string& why) const {
    if (of_run_)
      throw UserError(fmt::format(
          "{}: not a checkpoint of this run as its data and config are now ({}): if the data "
          "changed since the run started, restore it to continue the run; to start it over, "
          "delete the checkpoint",
          what_, why));
    throw UserError(fmt::format(
        "{}: not a usable checkpoint ({}); delete it to start the run over", what_, why));
  }
  // `at` >= 0: the field's index (a step, an epoch), for the message.
  void finite(double v, const char* field, int64_t at = -1, double lo = 0) const {
    if (!(std::isfinite(v) && v >= lo)) bad(field, at, v, fmt::format("a finite value >= {}", lo));
  }
  void whole(double v, double hi, const char* field, int64_t at = -1) const {
    if (!(v >= 0 && v <= hi && v == std::floor(v)))
      bad(field, at, v, fmt::format("a whole number from 0 to {}", hi));
  }
  void within(double v, double lo, double hi, const char* field, int64_t at = -1) const {
    if (!(v >= lo && v <= hi)) bad(field, at, v, fmt::format("from {} to {}", lo, hi));
  }
  // NaN where not measured, else finite.
  void nan_or_finite(double v, const char* field, int64_t at = -1) const {
    if (std::isinf(v)) bad(field, at, v, "finite, or NaN where not measured");
  }

 private:
  [[noreturn]] void bad(const char* field, int64_t at, double v, const std::string& valid) const {
    fail(fmt::format("{}{} is {}, not {}", field, at >= 0 ? fmt::format(" {}", at) : "", v,
                     valid));
  }
  const std::string& what_;
  bool of_run_;
};

// The partial epoch: per finished step [loss, correct, local norm, reduced norm, rows]. A
// non-finite loss is what a diverging run writes (its epoch then ends `diverged`, as the run
// that was never stopped did); the norms may then be non-finite too, the counts never.
void check_partial(const Checkpoint& c, const Check& k, double max_rows) {
  bool diverging = false;
  for (size_t s = 0; s < c.partial_stats.size(); s += 5)
    diverging |= !std::isfinite(c.partial_stats[s]);
  for (size_t s = 0; s + 4 < c.partial_stats.size(); s += 5) {
    const double* st = c.partial_stats.data() + s;
    const auto step = static_cast<int64_t>(s / 5) + 1;
    k.whole(st[4], max_rows, "the row count of partial-epoch step", step);
    // A language model counts each sample's share of correct positions: not whole.
    k.within(st[1], 0, st[4] * (1 + 1e-9), "the correct count of partial-epoch step", step);
    if (st[0] < 0) k.finite(st[0], "the loss sum of partial-epoch step", step);  // refused
    for (int n : {2, 3})
      if (!diverging || std::isfinite(st[n]))
        k.finite(st[n], "a squared gradient norm of partial-epoch step", step);
  }
  k.finite(c.partial_lr_first, "the partial epoch's first learning rate");
  static const char* const kTimes[] = {"data", "compute", "exchange", "exposed exchange",
                                       "optimizer", "total"};
  for (size_t i = 0; i < c.partial_times.size(); ++i)
    k.finite(c.partial_times[i], fmt::format("the partial epoch's {} time", kTimes[i]).c_str());
}

// The finished epochs' metrics (none of them diverged: a run stops at a diverged epoch).
void check_epochs(const Checkpoint& c, const Check& k, double max_samples) {
  for (size_t i = 0; i < c.epochs.size(); ++i) {
    const EpochMetrics& m = c.epochs[i];
    const auto e = static_cast<int64_t>(i) + 1;
    if (m.epoch != e) k.fail(fmt::format("finished epoch {} is numbered {}", e, m.epoch));
    for (double v : {m.lr, m.lr_end, m.train_loss, m.test_loss, m.epoch_time_s, m.data_s,
                     m.compute_s, m.exchange_s, m.optimizer_s, m.exchange_exposed_s, m.eval_s,
                     m.rank_busy_min_s, m.rank_busy_max_s, m.bn_sync_s})
      k.finite(v, "a learning rate, loss or time of finished epoch", e);
    // Rates: over a time that may round to 0 (then inf), NaN where not measured.
    for (double v : {m.samples_per_s, m.busbw_gbps})
      if (v < 0) k.finite(v, "a rate of finished epoch", e);  // refused
    if (!std::isnan(m.other_cores))                           // NaN: not measured
      k.within(m.other_cores, 0, 1 << 20, "the cores other work kept busy in finished epoch", e);
    k.within(m.train_acc, 0, 1, "the training accuracy of finished epoch", e);
    k.within(m.test_acc, 0, 1, "the test accuracy of finished epoch", e);
    k.whole(static_cast<double>(m.samples), max_samples, "the samples of finished epoch", e);
    k.whole(m.slowest_rank, c.replicas - 1, "the slowest rank of finished epoch", e);
    k.within(m.straggler_rank, -1, c.replicas - 1, "the straggler rank of finished epoch", e);
    k.within(m.straggler_phase, -1, kEveryPhase, "the straggler phase of finished epoch", e);
    k.nan_or_finite(m.straggler_excess, "the straggler excess of finished epoch", e);
    k.whole(static_cast<double>(m.exchange_bytes_per_step), 0x1p62,
            "the exchange bytes per step of finished epoch", e);
    for (double v : {m.noise_g2, m.noise_trace})  // b_simple, their ratio, may be anything
      k.nan_or_finite(v, "a noise-scale average of finished epoch", e);
  }
  for (size_t i = 0; i < c.step_losses.size(); ++i)
    k.finite(c.step_losses[i], "the loss of finished step", static_cast<int64_t>(i) + 1);
}

// The scorings of the test set so far, in the order they were made, none after the checkpoint's
// step; a mid-epoch loss may be NaN or infinite (the run then ends diverged at the epoch's end).
// With the run known (`steps` per epoch > 0), each one's step is a step of its epoch and its
// global step follows from the two.
void check_evals(const Checkpoint& c, const Check& k, double max_samples, int64_t steps) {
  int64_t last = 0;
  for (size_t i = 0; i < c.evals.size(); ++i) {
    const EvalPoint& p = c.evals[i];
    const auto n = static_cast<int64_t>(i) + 1;
    k.within(p.epoch, 1, c.epoch + 1, "the epoch of test scoring", n);
    k.whole(static_cast<double>(p.step), steps > 0 ? static_cast<double>(steps) : 0x1p53,
            "the step of test scoring", n);
    if (steps > 0 && p.global_step != (p.epoch - 1) * steps + p.step)
      k.fail(fmt::format("test scoring {} at step {} of epoch {} says global step {}, not {}", n,
                         p.step, p.epoch, p.global_step, (p.epoch - 1) * steps + p.step));
    k.within(static_cast<double>(p.global_step), static_cast<double>(last) + (i > 0),
             static_cast<double>(c.global_step), "the global step of test scoring", n);
    last = p.global_step;
    k.whole(static_cast<double>(p.samples), max_samples, "the samples of test scoring", n);
    k.finite(p.train_time_s, "the training time of test scoring", n);
    k.within(p.test_acc, 0, 1, "the test accuracy of test scoring", n);
    if (p.test_loss < 0) k.finite(p.test_loss, "the test loss of test scoring", n);  // refused
  }
}

}  // namespace

void check_checkpoint(const Checkpoint& c, const std::string& what, const CheckpointRun* run) {
  // A file consistent in itself that does not fit the run is not damaged: the run's data (or
  // config) may have changed since it was written, which the refusal says.
  bool intact = false;
  if (run) {
    try {
      check_checkpoint(c, what, nullptr);
      intact = true;
    } catch (const UserError&) {
    }
  }
  const Check k(what, intact);
  if (c.replicas < 1 || c.rng.size() != 4 * static_cast<size_t>(c.replicas))
    k.fail(fmt::format("{} replicas with {} random-stream words (4 each)", c.replicas,
                       c.rng.size()));
  if (c.epoch < 0 || c.step < 0 || c.global_step < c.step ||
      c.epochs.size() != static_cast<size_t>(c.epoch) ||
      c.partial_stats.size() != 5 * static_cast<size_t>(c.step))
    k.fail(fmt::format("inconsistent fields: epoch {} with {} finished, step {} with {} step "
                       "sums, global step {}",
                       c.epoch, c.epochs.size(), c.step, c.partial_stats.size() / 5,
                       c.global_step));
  const size_t n = c.params.size();
  if ((!c.opt_m.empty() && c.opt_m.size() != n) || (!c.opt_v.empty() && c.opt_v.size() != n) ||
      c.bn_state.size() % static_cast<size_t>(c.replicas) != 0)
    k.fail("inconsistent fields: optimizer or BatchNorm state of another size");
  for (size_t i = 0; i < c.opt_v.size(); ++i)
    if (c.opt_v[i] < 0) k.fail(fmt::format("a negative second moment at parameter {}", i));
  for (int i = 0; i < 3; ++i) k.nan_or_finite(c.noise[i], "the noise-scale averages");
  k.within(c.noise[2], 0, 1, "the noise-scale weight");
  k.whole(c.noise[3], 0x1p53, "the noise-scale step count");
  k.whole(static_cast<double>(c.launches_per_step), 0x1p53, "the launches per step");
  if (run) {
    if (c.replicas != run->replicas || c.epoch >= run->epochs || c.step > run->steps)
      k.fail(fmt::format("epoch {}, step {} of {} replicas is not a step of this run ({} epochs "
                         "of {} steps, {} replicas)",
                         c.epoch, c.step, c.replicas, run->epochs, run->steps, run->replicas));
    if (c.params.size() > static_cast<size_t>(run->max_params))
      k.fail(fmt::format("{} parameters, more than this run's model has ({})", c.params.size(),
                         run->max_params));
    // What the replicas check again when they restore it, checked here, where the refusal can
    // name the file and nothing has been moved yet.
    if (c.global_step != static_cast<int64_t>(c.epoch) * run->steps + c.step)
      k.fail(fmt::format("global step {} is not epoch {} x {} steps + step {}", c.global_step,
                         c.epoch, run->steps, c.step));
    if (c.opt_m.size() != c.params.size() || c.opt_v.empty() == run->second_moment)
      k.fail(
          fmt::format("optimizer state of another optimizer ({} first and {} second moments "
                      "for {} parameters; this run's optimizer keeps {})",
                      c.opt_m.size(), c.opt_v.size(), c.params.size(),
                      run->second_moment ? "both" : "the first alone"));
  }
  const double big = 0x1p53;  // without a run: whole numbers a double holds exactly
  check_partial(c, k, run ? static_cast<double>(run->global_batch) : big);
  check_epochs(c, k, run ? static_cast<double>(run->train_size) : big);
  check_evals(c, k, run ? static_cast<double>(run->train_size) * run->epochs : big,
              run ? run->steps : 0);
}

std::string encode_checkpoint(const Checkpoint& c) {
  Writer w;
  fields(w, c);
  w.pod(static_cast<uint64_t>(c.epochs.size()));
  for (const auto& m : c.epochs) epoch_fields(m, [&](const auto& v) { w.pod(v); });
  w.pod(static_cast<uint64_t>(c.evals.size()));
  for (const auto& p : c.evals) eval_fields(p, [&](const auto& v) { w.pod(v); });
  w.pod(c.data_fingerprint);
  w.pod(crc_of(w.out, w.out.size()));
  return std::move(w.out);
}

namespace {
// The fields, checked for length and CRC but not yet for range.
Checkpoint decode_fields(const std::string& bytes, const std::string& what) {
  Reader r(bytes, what);
  const int version = header_version(bytes);
  if (const int newer = newer_version(bytes))
    r.bad(fmt::format("it is of version {}, from a newer dtrain: this one reads versions 1 to {}",
                      newer, kVersion));
  if (bytes.size() < kMagicLen + sizeof(uint32_t) || version == 0) r.bad("no checkpoint header");
  const size_t body = bytes.size() - sizeof(uint32_t);
  uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, sizeof stored);
  if (stored != crc_of(bytes, body)) r.bad("its checksum does not match: damaged or cut short");
  r.skip_magic();
  Checkpoint c;
  fields(r, c);
  size_t epoch_bytes = 0;
  EpochMetrics probe;
  epoch_fields(probe, [&](const auto& v) { epoch_bytes += sizeof v; }, version);
  c.epochs.resize(r.count(epoch_bytes));
  for (auto& m : c.epochs) epoch_fields(m, [&](auto& v) { r.pod(v); }, version);
  if (version >= 4) {
    c.evals.resize(r.count(eval_bytes()));
    for (auto& p : c.evals) eval_fields(p, [&](auto& v) { r.pod(v); });
  }
  if (version >= 5) r.pod(c.data_fingerprint);
  if (r.at() != body) r.bad("unexpected bytes after its fields");
  return c;
}
}  // namespace

Checkpoint decode_checkpoint(const std::string& bytes, const std::string& what) {
  Checkpoint c = decode_fields(bytes, what);
  check_checkpoint(c, what, nullptr);
  return c;
}

CheckpointRun checkpoint_run(const Config& cfg, const DataShape& data) {
  CheckpointRun run;
  run.replicas = cfg.gpus;
  run.epochs = cfg.train.epochs;
  run.second_moment = cfg.optimizer.type != OptimizerType::sgd;
  run.global_batch = cfg.global_batch();
  run.train_size = data.train_size;
  const int64_t n = data.train_size, g = run.global_batch;
  run.steps = cfg.data.drop_remainder ? n / g : n / g + (n % g != 0);
  // The layers' own counts: the parameters, and the BatchNorm state each replica keeps (its
  // running mean and variance), those inside residual blocks included.
  double params = 0, bn = 0;
  for (const auto& l : build_layers(cfg.model, data.shape, data.classes)) {
    params += static_cast<double>(l->param_count());
    bn += static_cast<double>(l->state_floats());
  }
  run.max_params = static_cast<int64_t>(std::min(params, 0x1p62));
  // The file, field by field (see fields()), in doubles: the products cannot overflow. The
  // config text is the run's (to_yaml), give or take the replicas key; 4 KiB of slack.
  size_t epoch_bytes = 0;
  EpochMetrics probe;
  epoch_fields(probe, [&](const auto& v) { epoch_bytes += sizeof v; });
  const double r = run.replicas, e = run.epochs, steps = static_cast<double>(run.steps);
  const double arrays = cfg.optimizer.type == OptimizerType::sgd ? 2 : 3;  // sgd has no v
  const double bytes = kMagicLen + 8.0 + static_cast<double>(to_yaml(cfg).size()) + 4096 +
                       (4 + 4 + 8 + 8) +        // replicas, epoch, step, global step
                       arrays * (8 + 4 * params) + 8 * (3 - arrays) +  // w, m (momentum), v
                       8 + 4 * r * bn +         // BatchNorm state, per replica
                       8 + 32 * r +             // the random streams
                       32 + 8 + 40 * steps +    // noise scale; the partial epoch's sums
                       8 + 48 +                 // its first LR and phase times
                       8 + 8 * e * steps +      // the finished steps' losses
                       8 +                      // launches per step
                       8 + e * static_cast<double>(epoch_bytes) +  // epochs
                       8 + e * (steps + 1) * static_cast<double>(eval_bytes()) +  // evals
                       8 + 4;                   // the data's fingerprint, the CRC
  run.max_bytes = bytes >= 0x1p63 ? UINT64_MAX : static_cast<uint64_t>(bytes);
  return run;
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

std::optional<Checkpoint> load_checkpoint(const std::string& run_dir, const Config& cfg,
                                          const DataShape* data) {
  const std::string path = checkpoint_path(run_dir);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  const CheckpointRun run = checkpoint_run(cfg, data ? *data : peek_data_shape(cfg.data));
  std::string bytes;
  try {  // refused before it is read where it is larger than this run's checkpoint can be
    bytes = read_own_file(path, "checkpoint of this run (its model, replicas and config)",
                          static_cast<size_t>(std::min<uint64_t>(run.max_bytes, SIZE_MAX)));
  } catch (const UserError& e) {
    throw UserError(fmt::format("{}; delete it to start the run over", e.what()));
  }
  Checkpoint c = decode_fields(bytes, path);
  check_checkpoint(c, path, &run);
  return c;
}

std::optional<Checkpoint> load_checkpoint(const std::string& run_dir) {
  const std::string path = checkpoint_path(run_dir);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  // The run's config, as it was written when the run started.
  const std::string resolved = (std::filesystem::path(run_dir) / "config.resolved.yaml").string();
  if (!std::filesystem::exists(std::filesystem::symlink_status(resolved, ec)))
    throw UserError(fmt::format("{}: no config.resolved.yaml beside it to check it against; "
                                "delete it to start the run over",
                                path));
  const std::string yaml = read_own_file(resolved, "resolved config", kMaxResolvedConfigBytes);
  return load_checkpoint(run_dir, parse_config(yaml, resolved));
}

void check_data_unchanged(const Checkpoint& c, uint64_t fingerprint) {
  if (c.data_fingerprint && fingerprint && c.data_fingerprint != fingerprint)
    throw UserError(fmt::format(
        "checkpoint: the data has changed since the run started (fingerprint {:016x}, now "
        "{:016x}): restore the data it trained on to continue it, or start a new run under "
        "another --tag; checkpoint.bin is kept",
        c.data_fingerprint, fingerprint));
}

}  // namespace dtrain
