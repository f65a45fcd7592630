#pragma once
// One file per subcommand: an options struct, a setup function that declares the options on the
// CLI11 app, and a run function that calls the library.
#include <CLI/CLI.hpp>
#include <limits>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"

namespace dtrain::cli {

// The positional config file and key=value overrides of every command that reads a config.
void add_config_arguments(CLI::App& app, std::string& config, std::vector<std::string>& overrides);

// A message as one line: a control character (a newline in a file's name) becomes '?'.
std::string one_line(const char* what);

// What a failure says: e.what(), except for an allocation failure (std::bad_alloc says only its
// type), which says "out of memory" and how to need less.
std::string failure_text(const std::exception& e);

// Refuses an --out that names no file of its own: a folder ("/", "out/") or a name such as "."
// (STEM.json and STEM.md would be hidden files beside it).
void require_file_stem(const std::string& stem, const std::string& given);

// Refuses an empty value for an option: a path (`--out ''` would write into the current folder),
// a tag, a run id; `what` says which.
CLI::Validator non_empty(const char* what = "a path");

// The run-folder prefix of a --tag: `fallback` (a date-time) when none is given; a tag with
// control characters or other characters than letters, digits and . _ - +, one starting with
// '.' or of more than 100 characters is refused.
std::string folder_tag(const std::string& given, const std::string& fallback);

// A config's data, loaded: an error about one of its data keys names the config file.
DataSplit load_config_data(const std::string& config_path, const Config& c);
// check_plan (the batch split against the data), its errors naming the config file.
void check_config_plan(const std::string& config_path, const Config& c, const DataSplit& d);

// The data of the runs of a sweep, loaded again only when a run's data identity changes (runs
// of one sweep usually share it).
class DataCache {
 public:
  explicit DataCache(std::string config_path) : config_(std::move(config_path)) {}
  const DataSplit& get(const Config& c);

 private:
  std::string config_;
  std::string key_;
  DataSplit data_;
};

struct RunOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string results = "results";
  std::string tag;
  bool resume = false;
  bool quiet = false;
  bool print_table = true;  // false: the comparison table is written, not printed (explain)
  std::string resume_tag;   // the --tag that continues an interrupted run (default: tag)
};
void setup_run(CLI::App& app, RunOptions& opt);
int run_run(const RunOptions& opt);

struct ValidateOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool skip_data = false;
  bool print = false;
};
void setup_validate(CLI::App& app, ValidateOptions& opt);
int run_validate(const ValidateOptions& opt);

struct ExportOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string out;
  std::string format = "png";
  int quality = 0;   // 0: not given (95 for JPEG)
  int64_t side = 0;  // 0: the images' own size
};
void setup_export(CLI::App& app, ExportOptions& opt);
int run_export(const ExportOptions& opt);

struct BenchInputOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<int> workers = {1, 2};
  int64_t images = 2048;
  int repeats = 3;
};
void setup_bench_input(CLI::App& app, BenchInputOptions& opt);
int run_bench_input(const BenchInputOptions& opt);

struct DoctorOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool skip_data = false;
};
void setup_doctor(CLI::App& app, DoctorOptions& opt);
int run_doctor(const DoctorOptions& opt);

}  // namespace dtrain::cli

namespace dtrain::cli {

struct ReportOptions {
  std::vector<std::string> paths;
  std::string out;
  std::string baseline;
  bool plots = false;
  std::vector<std::string> by;  // config keys to aggregate over (--by)
  bool batch_law = false;       // steps to target against the global batch (--batch-law)
  std::string reference;        // a batch-size study to judge each run against (--reference)
};
void setup_report(CLI::App& app, ReportOptions& opt);
int run_report(const ReportOptions& opt);

struct DevicesOptions {
  bool json = false;
  bool measure = false;
};
void setup_devices(CLI::App& app, DevicesOptions& opt);
int run_devices(const DevicesOptions& opt);

}  // namespace dtrain::cli

namespace dtrain::cli {

struct BenchCommOptions {
  std::string sizes = "4K:256M";
  int iters = 20;
  int warmup = 5;
  int replicas = 0;  // in-process, 2 when not given; under mpirun/srun the process count
  std::string out;   // OUT.json and OUT.md; default results/bench-comm/<UTC time>
  double timeout_s = 300;  // under mpirun/srun: the longest wait for another rank
};
void setup_bench_comm(CLI::App& app, BenchCommOptions& opt);
int run_bench_comm(const BenchCommOptions& opt);

struct ProjectOptions {
  std::string path;  // a 1-replica run folder, or a config with `gpu` (an estimated step)
  std::vector<std::string> overrides;  // key=value overrides of a config (with `gpu`)
  std::string gpu;   // a GPU preset: the step estimated from FLOPs instead of measured
  double mfu = 0.4;  // with `gpu`: the share of the dense peak the step is assumed to reach
  std::vector<int> gpus = {1, 2, 4, 8, 16, 64};
  std::string link = "nvlink-h100";  // a preset, or measured:FILE (a bench-comm JSON)
  // Not given (NaN): 2/3 for a run; the model's own share for an estimate.
  double backward_fraction = std::numeric_limits<double>::quiet_NaN();
  double bucket_mb = -1;  // < 0: the run's train.bucket_mb
  long long params = 0;   // 0: the run's parameter count
  std::string out;        // OUT.md and OUT.json; default RUN_DIR/projection-<link>
};
void setup_project(CLI::App& app, ProjectOptions& opt);
int run_project(const ProjectOptions& opt);

}  // namespace dtrain::cli

namespace dtrain::cli {

struct ExplainOptions {
  std::string config;
  std::vector<std::string> overrides;
  int seeds = 1;
  std::string order;  // comma list of setting names; "" = the default order
  std::string results = "results";
  std::string tag;
  bool resume = false;
  bool quiet = false;
};
void setup_explain(CLI::App& app, ExplainOptions& opt);
int run_explain(const ExplainOptions& opt);

struct ExplainTimeOptions {
  std::string small, large;  // run folders
  std::string json;          // --json FILE
};
void setup_explain_time(CLI::App& app, ExplainTimeOptions& opt);
int run_explain_time(const ExplainTimeOptions& opt);

}  // namespace dtrain::cli
