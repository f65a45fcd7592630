#pragma once
// Comparison tables of runs, always built from run folders (summary.json), never from memory.
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

struct RunRecord {
  std::string dir, run_id, experiment, status, error;
  // Runs of one experiment that differ only in replica count share a group (the swept
  // settings other than gpus, e.g. "lr_scalingsqrt"); each group has its own baseline.
  std::string group;
  int gpus = 0;
  long long per_replica_batch = 0, global_batch = 0;
  int accumulation_steps = 1;
  std::string lr_scaling, reduction, shuffle, sharding;
  double peak_lr = 0, lr = 0;
  std::optional<double> final_test_acc, best_test_acc, final_train_loss, median_epoch_time_s,
      samples_per_s, time_to_target_s;
  double target_accuracy = 0;
  int epochs_completed = 0;
};

// Reads DIR/summary.json; throws UserError naming the file when it is missing or corrupt.
RunRecord load_run(const std::string& dir);

// Run folders (folders holding a `status` file) at or below each path, sorted, skipping hidden
// folders such as .attempts/. Throws UserError for a path that does not exist.
std::vector<std::string> find_run_dirs(const std::vector<std::string>& paths);

struct EpochRow {
  int epoch = 0;
  double lr = 0, train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0, epoch_time_s = 0;
};
// Reads DIR/metrics.csv by column name; non-finite values come back as NaN.
std::vector<EpochRow> load_metrics(const std::string& dir);

struct ComparisonRow {
  RunRecord run;
  std::string baseline;  // run id of this row's baseline, "" if its group has none
  std::optional<double> speedup, efficiency, acc_delta_points;
};

struct Comparison {
  std::string experiment;
  std::vector<ComparisonRow> rows;
};

// Baseline of a run: the finished run of its group with the fewest replicas (the 1-replica run
// when there is one). Speedup is the ratio of samples/s, efficiency = speedup / (gpus /
// baseline gpus), accuracy delta = final test accuracy minus the baseline's, in points.
// A non-empty `baseline` names the run every row is compared with instead.
Comparison compare(const std::vector<RunRecord>& runs, const std::string& baseline = "");

std::string to_markdown(const Comparison& c);
std::string to_csv(const Comparison& c);
std::string to_json(const Comparison& c);

}  // namespace dtrain
