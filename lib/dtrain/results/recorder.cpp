#include "dtrain/results/recorder.hpp"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/metrics.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/results/summary.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/straggler.hpp"
#include "dtrain/train/telemetry.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {
// The process's peak resident memory so far, in MiB (Linux reports KiB).
double peak_rss_mib() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}
}  // namespace

namespace {
std::string lock_path(const std::string& run_dir) {
  const fs::path p(run_dir);
  return (p.parent_path() / ("." + p.filename().string() + ".lock")).string();
}
// Opens the lock file of `run_dir` (created if needed, never through a link).
int open_lock(const std::string& run_dir) {
  ensure_dir(fs::path(run_dir).parent_path().string(), "--results");
  const auto path = lock_path(run_dir);
  // O_NONBLOCK: a FIFO planted there opens at once, to be refused, instead of waiting for a
  // writer.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0)
    throw UserError(fmt::format("{}: cannot open the run's lock file: {}", path,
                                std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(
        fmt::format("{}: the run's lock file is not a regular file (dtrain makes an "
                    "empty one); remove it to run",
                    path));
  }
  return fd;
}
long read_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::strtol(buf, nullptr, 10) : 0;
}
}  // namespace

RunLock::RunLock(const std::string& run_dir) : fd_(open_lock(run_dir)) {
  // A few tries: holder() takes the lock shared for an instant to look (report, a resume).
  int rc = -1;
  for (int attempt = 0; attempt < 10; ++attempt) {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
    if (rc == 0 || errno != EWOULDBLOCK) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (rc != 0) {
    const int err = errno;
    const long pid = read_pid(fd_);
    ::close(fd_);
    if (err != EWOULDBLOCK)  // ENOLCK on some network file systems, say
      throw UserError(fmt::format("{}: cannot lock the run ({}); dtrain needs flock() on the "
                                  "results folder's file system",
                                  run_dir, std::strerror(err)));
    throw UserError(fmt::format(
        "{}: another dtrain process{} is writing this run; wait for it to finish, or pick "
        "another --tag",
        run_dir, pid > 0 ? fmt::format(" (pid {})", pid) : ""));
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0)
    log().warn("{}: could not record this process in the lock file", lock_path(run_dir));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

FileLock::FileLock(const std::string& path, double wait_s) : fd_(open_lock(path)) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (!(held_ = ::flock(fd_, LOCK_EX | LOCK_NB) == 0) && errno == EWOULDBLOCK &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

long RunLock::holder(const std::string& run_dir) {
  const int fd = ::open(lock_path(run_dir).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // a FIFO holds no lock
    ::close(fd);
    return 0;
  }
  long pid = 0;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    pid = read_pid(fd);
    if (pid <= 0) pid = -1;  // held, by a process that has not written its pid yet
  }
  ::close(fd);
  return pid;
}

std::string read_run_status(const std::string& dir, bool held_here) {
  // summary.json is written before status, so a final status there wins over a `status` file
  // that a crash or a full disk kept from being updated.
  if (const auto text = try_read_own_file((fs::path(dir) / "summary.json").string(),
                                          kMaxSummaryBytes)) {
    // As deep as load_run reads (the config nests in it as deep as its blocks do).
    const auto j = parse_json_bounded(*text, kMaxSummaryDepth);
    if (j.is_object() && j.contains(summary_key::status) && j[summary_key::status].is_string()) {
      const auto st = j[summary_key::status].get<std::string>();
      if (st == "done" || st == "diverged" || st == "failed" || st == "interrupted") return st;
    }
  }
  const auto status = try_read_own_file((fs::path(dir) / "status").string(), kMaxStatusBytes);
  std::string line;
  if (!status) return "";
  std::istringstream in(*status);
  if (!std::getline(in, line)) return "";
  // A run nobody holds is not running any more: its process died or was stopped.
  if (line == "running" && (held_here || RunLock::holder(dir) == 0)) return "interrupted";
  // Only the words dtrain writes: anything else (control characters that would reach a
  // terminal, a '|' that would add cells to a table) was not written by dtrain.
  for (const char* known : {"running", "done", "diverged", "failed", "interrupted"})
    if (line == known) return line;
  return "";
}

void repair_status_file(const std::string& dir, const std::string& status) {
  const std::string path = (fs::path(dir) / "status").string();
  const auto text = try_read_own_file(path, kMaxStatusBytes);
  if (text && *text == status + "\n") return;
  try {
    write_file_atomic(path, status + "\n");
    log().info("{}: said '{}' again, as summary.json does", path, status);
  } catch (const std::exception& e) {
    log().warn("{}: could not be brought in line with summary.json: {}", path, e.what());
  }
}

RunRecorder::RunRecorder(std::string dir, std::string run_id, std::string group, const Config& cfg,
                         const std::vector<Override>& overrides)
    : dir_(std::move(dir)), run_id_(std::move(run_id)), group_(std::move(group)), cfg_(cfg) {
  ensure_dir(fs::path(dir_).parent_path().string(), "--results");
  std::error_code ec;
  if (!fs::create_directory(dir_, ec)) {
    if (ec) throw UserError(fmt::format("{}: cannot create run folder: {}", dir_, ec.message()));
    throw UserError(
        fmt::format("{}: run folder already exists; runs are never overwritten "
                    "(pick another --tag or --results folder, or remove it)",
                    dir_));
  }
  started_at_ = utc_now();
  t_start_ = std::chrono::steady_clock::now();
  try {
    write_file_atomic(dir_ + "/status", "running\n");
    write_file_atomic(dir_ + "/config.resolved.yaml", to_yaml(cfg_));
    std::string ov;
    for (const auto& o : overrides) ov += o.text() + "\n";
    write_file_atomic(dir_ + "/overrides.txt", ov);
    csv_ = metrics_csv_header();
    write_file_atomic(dir_ + "/metrics.csv", csv_);
    log_file_ = std::make_unique<RunLogFile>(dir_ + "/log");
  } catch (...) {
    // A folder that cannot be written whole (a full disk) is no run under way: marked failed
    // where the disk still takes that much, as fail() would (no recorder is left to call it).
    try {
      write_file_atomic(dir_ + "/status", "failed\n");
    } catch (const std::exception&) {
    }
    throw;
  }
}

RunRecorder::~RunRecorder() = default;

namespace {
// One entry per line, where there are any; a control character or invalid UTF-8 in a file
// name (a newline would split an entry) is written as \xNN, and a backslash as \\, so that no
// two names are written alike (a name holding the four characters \x0a included).
void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  std::string text;
  for (const std::string& l : lines) {
    std::string escaped;
    for (const char c : l) escaped += c == '\\' ? std::string("\\\\") : std::string(1, c);
    text += printable(escaped, true) + '\n';
  }
  write_file_atomic(path, text);
}
}  // namespace

void RunRecorder::on_start(const RunInfo& info) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  info_ = info;
  log().info("run {}: {}", run_id_, dir_);
  log().info("  data    {}", info.data);
  log().info("  model   {}", info.model);
  log().info("  devices {}", info.devices);
  if (!info.placement.empty()) log().info("  ranks   {}", info.placement);
  log().info("  batch   {} per replica x {} replicas x {} accumulation = {} global; {} steps/epoch",
             info.micro_batch, cfg_.gpus, cfg_.train.accumulation_steps, info.global_batch,
             info.steps_per_epoch);
  log().info("  lr      {} at batch {}, {} scaling -> peak {:.6g}, warmup {} epochs, {} schedule",
             cfg_.optimizer.lr, cfg_.optimizer.base_batch, to_string(cfg_.optimizer.lr_scaling),
             info.peak_lr, cfg_.optimizer.warmup_epochs, to_string(cfg_.optimizer.schedule));
  write_lines(dir_ + "/classes.txt", info.class_names);
  write_lines(dir_ + "/skipped-files.txt", info.skipped_files);
  if (!info.skipped_files.empty())
    log().warn("  data    {} files skipped (data.on_bad_file: skip), listed in {}/skipped-files.txt",
               info.skipped_files.size(), dir_);
}

void RunRecorder::on_step(int epoch, int64_t step, int64_t steps) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (!stderr_is_terminal()) {
    // A long epoch in a log file still shows it is moving, and about when it ends: every 30 s,
    // or every DTRAIN_PROGRESS_S seconds (a test facility).
    static const auto kEvery = std::chrono::duration<double>([] {
      const char* s = std::getenv("DTRAIN_PROGRESS_S");
      const double v = s ? std::atof(s) : 0.0;
      return v > 0 ? v : 30.0;
    }());
    if (epoch != line_epoch_) {
      line_epoch_ = epoch;
      line_step0_ = step;
      t_epoch_ = t_last_line_ = now;
    }
    if (step == steps || step == line_step0_ || now - t_last_line_ < kEvery) return;
    t_last_line_ = now;
    const double in_epoch = std::chrono::duration<double>(now - t_epoch_).count();
    const double left =
        in_epoch / static_cast<double>(step - line_step0_) * static_cast<double>(steps - step);
    log().info("  epoch {}/{}: step {}/{} ({:.0f}%), about {} to go", epoch, cfg_.train.epochs,
               step, steps, 100.0 * static_cast<double>(step) / static_cast<double>(steps),
               left < 10    ? fmt::format("{:.1f}s", left)
               : left < 120 ? fmt::format("{:.0f}s", left)
                            : fmt::format("{:.1f} min", left / 60));
    return;
  }
  if (step != steps && now - t_last_progress_ < std::chrono::milliseconds(200)) return;
  t_last_progress_ = now;
  const int width = 30;
  const auto filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
  const double elapsed = std::chrono::duration<double>(now - t_start_).count();
  show_progress(fmt::format("  epoch {}/{} [{}{}] step {}/{}  {:.1f}s", epoch, cfg_.train.epochs,
                            std::string(static_cast<size_t>(filled), '#'),
                            std::string(static_cast<size_t>(width - filled), '.'), step, steps,
                            elapsed));
}

void RunRecorder::on_eval(const EvalPoint& p) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  // Written whole at each epoch's end and with the summary (write_evals), not at every scoring:
  // one row each time would rewrite the file quadratically often. A stop keeps them in the
  // checkpoint.
  if (evals_.empty()) evals_csv_ = evals_csv_header();
  evals_.push_back(p);
  evals_csv_ += evals_csv_row(p);
  // The rows are in evals.csv; the log names the first that reached the targets.
  const Targets targets{cfg_.train.target_accuracy, cfg_.train.target_loss};
  const bool first = targets.reached(p) &&
                     std::none_of(evals_.begin(), evals_.end() - 1,
                                  [&](const EvalPoint& e) { return targets.reached(e); });
  if (first) {
    clear_progress();
    log().info("  target reached at step {} of epoch {} (global step {}, {} samples): test loss "
               "{:.4f} acc {:.2f}%",
               p.step, p.epoch, p.global_step, p.samples, p.test_loss, 100 * p.test_acc);
  }
}

void RunRecorder::write_evals() {
  if (!evals_.empty()) write_file_atomic(dir_ + "/evals.csv", evals_csv_);
}

void RunRecorder::on_epoch(const EpochMetrics& m) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  clear_progress();
  epochs_.push_back(m);
  csv_ += metrics_csv_row(m);
  write_file_atomic(dir_ + "/metrics.csv", csv_);
  write_evals();
  log().info(
      "epoch {:>3}/{}  lr {:.5f}  train loss {:.4f} acc {:6.2f}%  test loss {:.4f} acc "
      "{:6.2f}%  {:.2f}s ({:.0f} samples/s; compute {:.2f} exchange {:.2f} opt {:.2f} "
      "data {:.2f})",
      m.epoch, cfg_.train.epochs, m.lr, m.train_loss, 100 * m.train_acc, m.test_loss,
      100 * m.test_acc, m.epoch_time_s, m.samples_per_s, m.compute_s, m.exchange_s, m.optimizer_s,
      m.data_s);
  if (cfg_.data.dataset == DatasetKind::bytes)
    log().info("           bits per byte: train {:.4f}, test {:.4f}", m.train_loss / std::log(2.0),
               m.test_loss / std::log(2.0));
  if (cfg_.gpus > 1)
    log().info("           replicas busy {:.2f}-{:.2f}s, slowest rank {}", m.rank_busy_min_s,
               m.rank_busy_max_s, m.slowest_rank);
  if (m.straggler_rank >= 0)
    log().warn("straggler: {}", describe(Straggler{m.straggler_rank, m.straggler_phase,
                                                     m.straggler_excess, 0.0}));
  if (m.other_cores >= kOtherCoresWarn)
    log().warn(
        "other work kept {:.1f} cores busy on the CPUs this run may use in epoch {}: "
        "where the run needed them, its times are slower than on an idle machine "
        "(other_cores in metrics.csv)",
        m.other_cores, m.epoch);
}

void RunRecorder::write_summary(const std::string& status, const std::string& error) {
  const RunStats st =
      summarize(epochs_, Targets{cfg_.train.target_accuracy, cfg_.train.target_loss});
  SummarySource src{cfg_, info_, epochs_, st};
  src.evals = evals_;
  src.run_id = run_id_;
  src.group = group_;
  src.status = status;
  src.error = error;
  src.started_at = started_at_;
  src.finished_at = utc_now();
  src.wall_time_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
  src.peak_rss_mib = peak_rss_mib();
  const nlohmann::json j = summary_json(src);  // its fields: summary.cpp
  write_evals();
  // The summary first: readers trust its status over the `status` file (read_run_status).
  write_file_atomic(dir_ + "/summary.json", json_text(j, 2) + "\n");
  write_file_atomic(dir_ + "/status", status + "\n");
}

void RunRecorder::on_checkpoint(const Checkpoint& c) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  save_checkpoint(dir_, c);
}

void RunRecorder::on_trace(const std::string& json) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  write_file_atomic(dir_ + "/trace.json", json);
}

void RunRecorder::on_devices(const std::vector<DeviceRow>& rows) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  // Appended, not rewritten: an hour at 100 ms is 36,000 rows a device. A run shorter than a
  // sampling period (a CPU share needs two samples) has the header alone.
  const std::string path = dir_ + "/devices.csv";
  std::error_code ec;
  const bool fresh = !fs::exists(path, ec);
  if (rows.empty() && !fresh) return;
  std::ofstream out(path, std::ios::app);
  if (fresh) out << devices_csv_header();
  for (const auto& r : rows) out << devices_csv_row(r);
  if (!out) log().warn("{}: device samples could not be written", path);
}

void RunRecorder::carry(const std::string& attempt_dir, const std::string& name) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  std::error_code ec;
  const fs::path from = fs::path(attempt_dir) / name;
  if (attempt_dir.empty() || !fs::is_regular_file(fs::symlink_status(from, ec))) return;
  fs::copy_file(from, fs::path(dir_) / name, fs::copy_options::overwrite_existing, ec);
  if (ec) log().warn("resume: {} not carried over from {}: {}", name, attempt_dir, ec.message());
}

void RunRecorder::resume(const Checkpoint& c) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  epochs_ = c.epochs;
  csv_ = metrics_csv_header();
  for (const auto& m : epochs_) csv_ += metrics_csv_row(m);
  write_file_atomic(dir_ + "/metrics.csv", csv_);
  evals_ = c.evals;
  evals_csv_ = evals_csv_header();
  for (const auto& p : evals_) evals_csv_ += evals_csv_row(p);
  write_evals();
  save_checkpoint(dir_, c);
  log().info("resume: continuing at epoch {}, step {} ({} epochs finished before)", c.epoch + 1,
             c.step, c.epochs.size());
}

void RunRecorder::interrupt(const std::string& why) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  clear_progress();
  write_summary("interrupted", why);
  ended_ = true;
  log().warn("run {} interrupted; its checkpoint is saved in {}", run_id_, dir_);
}

void RunRecorder::finish(const TrainResult& r) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  info_ = r.info;
  const std::string status = r.status == RunStatus::diverged ? "diverged" : "done";
  write_summary(status, "");
  ended_ = true;
  std::error_code ec;  // nothing is left to resume
  fs::remove(checkpoint_path(dir_), ec);
  if (r.status == RunStatus::diverged)
    log().warn("run {} diverged (non-finite loss) after {} epochs", run_id_, r.epochs.size());
}

bool RunRecorder::fail_if_running(const std::string& error) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  if (ended_) return false;
  fail(error);
  return true;
}

void RunRecorder::log_error(const std::string& text) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  if (log_file_) log_file_->error(text);
}

void RunRecorder::fail(const std::string& error) {
  const std::lock_guard<std::recursive_mutex> hold(mu_);
  ended_ = true;
  clear_progress();
  try {
    write_summary("failed", error);
  } catch (const std::exception& e) {
    log().error("could not record the failure in {}: {}", dir_, e.what());
    // With a full disk the summary may not fit, but a one-word status usually does, and
    // it keeps the folder from saying `running` forever.
    try {
      write_file_atomic(dir_ + "/status", "failed\n");
    } catch (const std::exception&) {
      // Not even a temporary file fits: overwrite the status in place, where the block the
      // old word holds is freed and taken again.
      // Never through a symbolic link planted at the name.
      const std::string path = dir_ + "/status";
      const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        const ssize_t wrote = ::write(fd, "failed\n", 7);
        (void)wrote;  // nothing more to try
        ::close(fd);
      }
    }
  }
}

}  // namespace dtrain
