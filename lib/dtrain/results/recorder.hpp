#pragma once
// Writes one run folder: results/<experiment>/<run-id>/ with config.resolved.yaml,
// overrides.txt, metrics.csv, summary.json, status and log. Files are replaced atomically
// (temp file, then rename); an existing run folder is never reused.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/base/files.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/train/run_types.hpp"

namespace dtrain {

// The run's status: "done", "diverged" or "failed" from summary.json, else DIR/status's first
// line ("running"; "interrupted" when no process holds the run), or "" if neither exists or
// the line is no status dtrain writes.
// `held_here`: this process holds the run's lock, so a `running` left in the folder is an
// earlier process's that died or was stopped (interrupted). Neither file is read through a link.
std::string read_run_status(const std::string& dir, bool held_here = false);

// Writes `status`, a finished run's status from its summary.json, to DIR/status where that
// file says otherwise: a full disk can keep it from following the summary. Readers trust the
// summary, people and scripts the file. Best effort: a file that cannot be written is left.
void repair_status_file(const std::string& dir, const std::string& status);

// Ownership of one run folder: an exclusive flock on <parent>/.<run-id>.lock, held while the
// object lives. Two commands never write, move or resume the same run at once; a process that
// dies releases its lock with it, so a `running` folder without a holder was interrupted.
class RunLock {
 public:
  // Throws UserError naming the folder (and the holder's pid) if another process holds it.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // The pid of the process holding `run_dir`, -1 if it is held by a process not yet known, or 0
  // if none holds it.
  static long holder(const std::string& run_dir);

 private:
  int fd_ = -1;
};

// A short exclusive flock on <parent>/.<name>.lock for a read-merge-write of a shared file (a
// tag's index, which two commands of one tag may save at once). It waits up to `wait_s` for a
// holder; past that (a holder stopped midway, by Ctrl-Z say) held() is false and the caller
// goes on without it, rather than hang.
class FileLock {
 public:
  FileLock(const std::string& path, double wait_s);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

class RunLogFile;

class RunRecorder : public TrainObserver {
 public:
  // Creates `dir`; throws UserError if it exists already.
  // `group` names the settings this run shares with its baseline (see report.hpp).
  RunRecorder(std::string dir, std::string run_id, std::string group, const Config& cfg,
              const std::vector<Override>& overrides);
  ~RunRecorder() override;
  const std::string& dir() const { return dir_; }

  void on_start(const RunInfo& info) override;
  void on_step(int epoch, int64_t step, int64_t steps) override;
  void on_epoch(const EpochMetrics& m) override;
  // train.eval_steps: a row of evals.csv.
  void on_eval(const EvalPoint& p) override;
  // Saves the checkpoint in the run folder (checkpoint.bin).
  void on_checkpoint(const Checkpoint& c) override;
  // Writes trace.json (replaced whole, atomically, each time the trace grows).
  void on_trace(const std::string& json) override;
  // Appends the rows to devices.csv (its header first where the file is new, even with no row).
  void on_devices(const std::vector<DeviceRow>& rows) override;
  // Copies file `name` of an earlier attempt's folder into this run's, where it is a regular
  // file there (never through a link): what the attempt wrote that its checkpoint does not
  // hold (trace.json). Nothing where it has none.
  void carry(const std::string& attempt_dir, const std::string& name);

  // A run continued from `c`: its finished epochs go to metrics.csv, and the checkpoint is
  // saved here at once, so that the folder can be resumed again before its next one.
  void resume(const Checkpoint& c);
  // The run is complete: the summary, then the checkpoint is removed.
  void finish(const TrainResult& r);
  void fail(const std::string& error);
  // An error line in the run's log file alone (the terminal has it from elsewhere).
  void log_error(const std::string& text);
  // fail() from another thread, unless the run has already ended (finish, fail, interrupt):
  // for rank 0 when the launcher is ending the job while the main thread is held in MPI.
  // Returns whether it recorded the failure.
  bool fail_if_running(const std::string& error);
  // Stopped on request with its checkpoint saved: status `interrupted`; --resume continues it.
  void interrupt(const std::string& why);

 private:
  void write_summary(const std::string& status, const std::string& error);
  void write_evals();  // evals.csv, where the run has scorings

  std::string dir_, run_id_, group_;
  Config cfg_;
  RunInfo info_;
  std::vector<EpochMetrics> epochs_;
  std::vector<EvalPoint> evals_;
  std::string csv_, evals_csv_;
  std::string started_at_;
  std::chrono::steady_clock::time_point t_start_, t_last_progress_;
  // Output that is no terminal (a log file, a batch job): a progress line every 30 s of an
  // epoch (the epoch, its first step seen here and when it ended, and the last line's time).
  int line_epoch_ = 0;
  int64_t line_step0_ = 0;
  std::chrono::steady_clock::time_point t_epoch_, t_last_line_;
  std::unique_ptr<RunLogFile> log_file_;
  // Every public method holds it: fail_if_running may come from another thread.
  std::recursive_mutex mu_;
  bool ended_ = false;
};

}  // namespace dtrain
