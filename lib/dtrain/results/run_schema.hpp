#pragma once
// The layout of a run folder's two result files, declared once: metrics.csv's columns (the
// writer, the readers and docs/run.md's list all follow the table) and summary.json's field
// names (the writer and the readers use the constants). Older folders stay readable: a reader
// asks only for the columns and fields it needs, by name.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dtrain/train/run_types.hpp"

namespace dtrain {

// One column of metrics.csv: where its value lives in EpochMetrics (whole numbers are written
// as integers, the rest through `format`), and what it means.
struct MetricsColumn {
  using Field = std::variant<int EpochMetrics::*, int64_t EpochMetrics::*, double EpochMetrics::*>;
  const char* name;
  Field field;
  const char* format;  // fmt replacement field of the value, e.g. "{:.6f}"
  const char* unit;    // "" for pure numbers
  const char* meaning;
};

// metrics.csv's columns in file order: one row per epoch. The first nine (epoch to
// samples_per_s) are in every metrics.csv dtrain has written; folders of older versions may
// lack the ones after them, and only the readers that need such a column refuse them.
const std::vector<MetricsColumn>& metrics_columns();
// The column named `name`; throws std::logic_error for a name the table does not have (a
// reader asking for it is wrong, not the file).
const MetricsColumn& metrics_column(std::string_view name);

// The metrics.csv header; one row per epoch follows. Both end with a newline.
std::string metrics_csv_header();
std::string metrics_csv_row(const EpochMetrics& m);

// evals.csv (train.eval_steps): one row per scoring of the test set, between steps and at each
// epoch's end, in the order they were made.
struct EvalColumn {
  using Field = std::variant<int EvalPoint::*, int64_t EvalPoint::*, double EvalPoint::*>;
  const char* name;
  Field field;
  const char* format;
  const char* unit;
  const char* meaning;
};
const std::vector<EvalColumn>& eval_columns();
std::string evals_csv_header();
std::string evals_csv_row(const EvalPoint& p);

// One cell of metrics.csv as a number: the whole text must be one. Non-finite values ("nan",
// "-nan", "inf", as fmt writes them) come back as NaN; nullopt where it is not a number.
std::optional<double> metrics_value(const std::string& cell);

// metrics.csv read back as text, by column name.
struct MetricsCsv {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each with as many cells as the header
  std::vector<int> lines;                      // each row's line in the file (the header is 1)
  // Where the column is, or nullopt for a column this file lacks (written by an older dtrain).
  std::optional<size_t> find(std::string_view name) const;
  // Throws UserError "PATH: no column 'NAME'" followed by `advice` for the first it lacks.
  void require(const std::vector<std::string_view>& names, std::string_view advice = "") const;
};

// What to do with a row whose cell count differs from the header's.
enum class RaggedRows { refuse, skip };
// Reads DIR/metrics.csv (never through a link); blank lines are skipped. Throws UserError
// naming the file when it is missing or empty, or (RaggedRows::refuse) has a ragged row.
MetricsCsv read_metrics_csv(const std::string& dir, RaggedRows ragged = RaggedRows::refuse);

// The rows as EpochMetrics: the named columns (every column of the table the file has, when
// `names` is empty) set from the file, the others left at EpochMetrics' defaults. Throws
// UserError "PATH:LINE: 'CELL' is not a number" for a cell metrics_value refuses, and one naming
// the line where the epoch column, when read, is not 1, 2, 3, ...
std::vector<EpochMetrics> read_epochs(const MetricsCsv& csv,
                                      const std::vector<std::string_view>& names = {});

// summary.json: one JSON object, written whole when a run ends (or fails, or is stopped).
// Version 1 is the layout every dtrain so far has written. It carries no version field: adding
// one would change the bytes of every summary. A later layout adds "schema_version"; readers
// take a summary without it as version 1.
inline constexpr int kSummaryVersion = 1;

// The top-level field names of summary.json, shared by the writer and the readers.
namespace summary_key {
inline constexpr const char* schema_version = "schema_version";
inline constexpr const char* run_id = "run_id";
inline constexpr const char* experiment = "experiment";
inline constexpr const char* group = "group";
inline constexpr const char* status = "status";
inline constexpr const char* error = "error";
inline constexpr const char* final_test_accuracy = "final_test_accuracy";
inline constexpr const char* best_test_accuracy = "best_test_accuracy";
inline constexpr const char* final_train_loss = "final_train_loss";
inline constexpr const char* final_test_loss = "final_test_loss";
inline constexpr const char* final_train_bits_per_byte = "final_train_bits_per_byte";
inline constexpr const char* final_test_bits_per_byte = "final_test_bits_per_byte";
inline constexpr const char* median_epoch_time_s = "median_epoch_time_s";
inline constexpr const char* samples_per_s = "samples_per_s";
inline constexpr const char* total_train_time_s = "total_train_time_s";
inline constexpr const char* exchange_bytes_per_step = "exchange_bytes_per_step";
inline constexpr const char* busbw_gbps = "busbw_gbps";
inline constexpr const char* exposed_exchange_share = "exposed_exchange_share";
inline constexpr const char* exposed_input_share = "exposed_input_share";
inline constexpr const char* other_cores_max = "other_cores_max";
inline constexpr const char* target_accuracy = "target_accuracy";
inline constexpr const char* target_loss = "target_loss";
inline constexpr const char* time_to_target_s = "time_to_target_s";
inline constexpr const char* epochs_to_target = "epochs_to_target";
inline constexpr const char* steps_to_target = "steps_to_target";
inline constexpr const char* samples_to_target = "samples_to_target";
inline constexpr const char* target_resolution_steps = "target_resolution_steps";
inline constexpr const char* epochs_completed = "epochs_completed";
inline constexpr const char* epochs_planned = "epochs_planned";
inline constexpr const char* gpus = "gpus";
inline constexpr const char* per_replica_batch = "per_replica_batch";
inline constexpr const char* accumulation_steps = "accumulation_steps";
inline constexpr const char* global_batch = "global_batch";
inline constexpr const char* lr = "lr";
inline constexpr const char* base_batch = "base_batch";
inline constexpr const char* lr_scaling = "lr_scaling";
inline constexpr const char* peak_lr = "peak_lr";
inline constexpr const char* warmup_epochs = "warmup_epochs";
inline constexpr const char* schedule = "schedule";
inline constexpr const char* optimizer = "optimizer";
inline constexpr const char* reduction = "reduction";
inline constexpr const char* shuffle = "shuffle";
inline constexpr const char* sharding = "sharding";
inline constexpr const char* sort_by_label = "sort_by_label";
inline constexpr const char* seed = "seed";
inline constexpr const char* backend = "backend";
inline constexpr const char* precision = "precision";
inline constexpr const char* launches_per_step = "launches_per_step";
inline constexpr const char* cuda_graph = "cuda_graph";
inline constexpr const char* cuda_graph_steps = "cuda_graph_steps";
inline constexpr const char* devices = "devices";
inline constexpr const char* replica_mode = "replica_mode";
inline constexpr const char* placement = "placement";
inline constexpr const char* peak_rss_mib = "peak_rss_mib";
inline constexpr const char* peak_device_mib = "peak_device_mib";
inline constexpr const char* blas = "blas";
inline constexpr const char* model = "model";
inline constexpr const char* param_count = "param_count";
inline constexpr const char* data = "data";
inline constexpr const char* steps_per_epoch = "steps_per_epoch";
inline constexpr const char* noise_scale = "noise_scale";
inline constexpr const char* stragglers = "stragglers";
inline constexpr const char* utilisation = "utilisation";
inline constexpr const char* config = "config";
inline constexpr const char* git_sha = "git_sha";
inline constexpr const char* dtrain_version = "dtrain_version";
inline constexpr const char* started_at = "started_at";
inline constexpr const char* finished_at = "finished_at";
inline constexpr const char* wall_time_s = "wall_time_s";
}  // namespace summary_key

}  // namespace dtrain
