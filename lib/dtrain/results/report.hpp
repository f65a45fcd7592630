#pragma once
// Comparison tables of runs, always built from run folders (summary.json), never from memory.
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/results/stats.hpp"

namespace dtrain {

struct RunRecord {
  std::string dir, run_id, experiment, status, error;
  int schema_version = 1;  // summary.json's layout (run_schema.hpp); 1 where it says none
  // Runs of one experiment that differ only in replica count share a group (the swept
  // settings other than gpus, e.g. "lr_scalingsqrt"); each group has its own baseline.
  std::string group;
  int gpus = 0;
  // Known only from its folder's config or the tag's index (no summary: killed, unreadable):
  // its group may be unknown (any group, then), and it counts for its group's baseline (a run of
  // fewer replicas that did not finish) without a row of its own where `in_table` is false.
  bool group_unknown = false, in_table = true;
  // Its replicas shared one machine's CPU cores (in-process threads) or one GPU (colocated): a
  // simulation of N devices, whose speedup is not N devices' speedup.
  bool simulated = false;
  long long per_replica_batch = 0, global_batch = 0;
  int accumulation_steps = 1;
  std::string lr_scaling, reduction, shuffle, sharding;
  double peak_lr = 0, lr = 0;
  std::optional<double> final_test_acc, best_test_acc, final_train_loss, final_test_loss,
      median_epoch_time_s, samples_per_s, time_to_target_s, epochs_to_target;
  // Optimizer steps and samples until the targets were first reached, and the steps that is
  // known to within (summary.json; folders written before they were there have none).
  std::optional<double> steps_to_target, samples_to_target, target_resolution_steps;
  std::optional<double> noise_b_simple;  // the gradient noise scale at the end (2+ replicas)
  std::optional<double> mfu;  // model FLOPs utilisation (summary.json's utilisation.mfu)
  // The straggler named most often ("rank 2, backward, 3 of 4 epochs"), "none" where stragglers
  // were looked for and none was named, "" where they were not looked for.
  std::string straggler;
  // Medians over the epochs.
  std::optional<double> busbw_gbps, exposed_exchange_share, exposed_input_share;
  std::optional<double> other_cores_max;  // the most cores other work took in an epoch
  double target_accuracy = 0;
  double target_loss = 0;
  int epochs_completed = 0;
  int64_t steps_per_epoch = 0;
  // summary.json's "param_count", or for older folders the end of its model description
  // ("... (421834 parameters)"); 0 where neither says.
  int64_t param_count = 0;
  // The resolved config by dotted key, from summary.json's "config"; empty for run folders
  // written before summary.json carried it (run_config_values reads those).
  std::map<std::string, std::string> config;
};

// Reads DIR/summary.json; throws UserError naming the file when it is missing or corrupt.
RunRecord load_run(const std::string& dir);
// A run folder's name, its run id in tables, also for "runs/x/" and ".".
std::string folder_name(const std::string& dir);

// Run folders (folders holding a `status` file) at or below each path, sorted, skipping hidden
// folders such as .attempts/. Throws UserError for a path that does not exist. Links to
// folders below a path are not followed (a loop cannot trap the walk): `linked`, where given,
// gets each one, for the caller to name.
std::vector<std::string> find_run_dirs(const std::vector<std::string>& paths,
                                       std::vector<std::string>* linked = nullptr);

// Refuses (UserError naming `option`) to write where a run's own files would be replaced: a
// file `path` named as one of them (summary.json, metrics.csv, log, status, ...) inside a run
// folder, or with `folder`, an output folder that is itself a run folder.
void refuse_run_folder_output(const std::string& path, const std::string& option, bool folder);

struct EpochRow {
  int epoch = 0;
  double lr = 0, train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0, epoch_time_s = 0;
};
// Reads DIR/metrics.csv by column name (read_metrics_csv, run_schema.hpp): the columns above,
// which every metrics.csv has; non-finite values come back as NaN.
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
// One CSV field (RFC 4180): quoted, with quotes doubled, where it holds a comma, a quote or a
// line break.
std::string csv_escape(const std::string& s);
// Records of RFC 4180 CSV text (quoted fields may hold commas, quotes and newlines), as
// csv_escape writes them; blank lines are skipped, and fields past the 64th of a record dropped.
std::vector<std::vector<std::string>> parse_csv(const std::string& text);
std::string to_json(const Comparison& c);

// `report --by`: runs aggregated over config keys.

// Throws UserError for a `--by` key that is not a config key, naming it and the valid keys.
void check_by_keys(const std::vector<std::string>& keys);

// The run's resolved config by dotted key: summary.json's "config", or for older run folders
// config.resolved.yaml read through the config schema; a key dtrain gained since the run was
// written takes its default. Throws UserError naming the file.
std::map<std::string, std::string> run_config_values(const RunRecord& r);

// Mean and sample standard deviation of the finite values among a row's runs.
struct Stat {
  int n = 0;
  std::optional<double> mean, sd;  // sd needs two values
};
Stat stat_of(const std::vector<double>& values);

// Welch's t-test of `other` against `base` (the difference other - base), both scaled by
// `scale` (100: accuracies in points).
WelchTest test_of(const Stat& base, const Stat& other, double scale = 1);
// The difference with its 95% confidence interval, "+1.23 [-0.40, +2.90]"; the difference alone
// where there is no interval (a side with one value, or sds of 0), "-" where there is none.
std::string difference_text(const WelchTest& w, int digits);
// What the test says: "p=0.012"; "p=0.24, not distinguishable at 3 seeds (25 would resolve
// it)", or "(more than 1000 needed)"; "exact (sd 0), no difference"; "-" without a test. `unit`
// is what a side counts ("seeds", "runs").
std::string verdict_text(const WelchTest& w, const char* unit);
// The test as JSON: "test" (welch, exact, too_few or invalid), "n" ([a, b]), "distinguishable"
// (null without a test), "p", "ci_low", "ci_high", "se", "df", "mdd" (null where they do not
// exist), "seeds_needed" (null where it does not apply or is over the cap) and
// "seeds_needed_over_cap".
nlohmann::json test_json(const WelchTest& w);

// A number as JSON, or null where it is not finite (JSON has no NaN or infinity).
nlohmann::json number_or_null(double v);

struct AggregateRow {
  std::vector<std::string> settings;  // this row's value of each Aggregate::settings key
  std::vector<std::string> run_ids;
  std::vector<std::vector<std::string>> by_values;  // per --by key, each run's value
  Stat final_test_acc, best_test_acc, final_train_loss, median_epoch_time_s;
  // Against the first row (Welch's t-test; accuracy in points); untested in the first row.
  WelchTest final_test_acc_test, final_train_loss_test;
};

struct Aggregate {
  std::string experiment;
  std::vector<std::string> by;
  std::vector<std::string> settings;  // the keys whose values tell the rows apart
  std::vector<AggregateRow> rows;
  std::vector<std::string> left_out;  // runs not aggregated, each with the reason
};

// Finished runs (done or diverged) that differ only in the `by` keys form one row. Each row
// after the first is tested against the first in final test accuracy and final train loss.
Aggregate aggregate(const std::vector<RunRecord>& runs, const std::vector<std::string>& by);

std::string to_markdown(const Aggregate& a);
std::string to_csv(const Aggregate& a);
std::string to_json(const Aggregate& a);

}  // namespace dtrain
