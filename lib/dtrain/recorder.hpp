#pragma once
// Writes one run folder: results/<experiment>/<run-id>/ with config.resolved.yaml,
// overrides.txt, metrics.csv, summary.json, status and log. Files are replaced atomically
// (temp file, then rename); an existing run folder is never reused.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/config.hpp"
#include "dtrain/trainer.hpp"

namespace dtrain {

void write_file_atomic(const std::string& path, const std::string& content);
// Creates `dir` and its parents; a failure is a UserError naming the folder and `what` it is for.
void ensure_dir(const std::string& dir, const std::string& what);
// The first line of DIR/status ("running", "done", "failed", "diverged"), or "" if absent.
std::string read_run_status(const std::string& dir);

// The metrics.csv header; one row per epoch follows.
std::string metrics_csv_header();
std::string metrics_csv_row(const EpochMetrics& m);

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

  void finish(const TrainResult& r);
  void fail(const std::string& error);

 private:
  void write_summary(const std::string& status, const std::string& error);

  std::string dir_, run_id_, group_;
  Config cfg_;
  RunInfo info_;
  std::vector<EpochMetrics> epochs_;
  std::string csv_;
  std::string started_at_;
  std::chrono::steady_clock::time_point t_start_, t_last_progress_;
  std::unique_ptr<RunLogFile> log_file_;
};

}  // namespace dtrain
