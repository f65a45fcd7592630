// dtrain explain-time: why an N-replica run's epoch is not 1/N of a 1-replica run's, as a
// waterfall of measured terms (lib/dtrain/results/time_gap.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/results/time_gap.hpp"

namespace dtrain::cli {

namespace {

// The projections `dtrain project` left in the smaller run's folder (projection-*.json, sorted
// by name) that have a row for the larger run's replicas, beside the measured terms. A file that
// is not such a projection is named in a warning and passed over.
void add_projections(TimeGap& g, const std::string& small_dir, const RunRecord& large) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(small_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("projection-", 0) == 0 && e.path().extension() == ".json")
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    try {
      const std::string text = read_own_file(f.string(), "projection", 4 << 20);
      auto p = projected_epoch(text, f.string(), large.gpus);
      if (!p) continue;
      // project keeps the per-replica batch: a larger run that kept the global batch instead
      // has other steps per epoch, and the projection does not describe it.
      if (p->steps_per_epoch != large.steps_per_epoch) {
        std::fprintf(stderr,
                     "dtrain: warning: %s projects %lld steps per epoch at %d replicas, but %s "
                     "has %lld; left out\n",
                     printable(f.string()).c_str(), static_cast<long long>(p->steps_per_epoch),
                     large.gpus, printable(large.dir).c_str(),
                     static_cast<long long>(large.steps_per_epoch));
        continue;
      }
      // Named by the file (projection-NAME.json), which is unique, not by its link's name.
      // Control characters or a '|' in a file name would break the table.
      p->link = printable(f.stem().string().substr(std::string("projection-").size()));
      std::replace(p->link.begin(), p->link.end(), '|', '/');
      add_projection(g, *p);
    } catch (const UserError& e) {
      std::fprintf(stderr, "dtrain: warning: %s\n", printable(e.what()).c_str());
    }
  }
}

// Throws where the two runs train another model, or on other data, by a key both runs' configs
// hold (a folder from an older dtrain lacks newer keys). What may differ is what is compared, or
// how the same data reaches the model: the replicas, batch and LR, model.batchnorm, threads,
// the seed, data.path, data.workers and data.prefetch, and the data order (data.shuffle and
// data.sharding, which `dtrain explain` varies).
void require_same_workload(const RunRecord& small, const RunRecord& large) {
  static const std::set<std::string> free = {"model.batchnorm", "data.path",    "data.workers",
                                             "data.prefetch",   "data.shuffle", "data.sharding"};
  for (const auto& [key, value] : small.config) {
    const bool compared =
        key.rfind("model.", 0) == 0 || key.rfind("data.", 0) == 0 || key == "precision";
    const auto other = large.config.find(key);
    if (!compared || free.count(key) || other == large.config.end() || other->second == value)
      continue;
    throw UserError(fmt::format(
        "explain-time: {} has {}={} and {} has {}: the two runs must train one model on one "
        "data set (the replicas, batch, LR, model.batchnorm, threads, seed, data order and "
        "data.path, workers and prefetch may differ)",
        small.dir, key, printable(value), large.dir, printable(other->second)));
  }
}

}  // namespace

void setup_explain_time(CLI::App& app, ExplainTimeOptions& opt) {
  // Not CLI11's required(): its "large is required" names no folder a user would recognise.
  app.add_option("small", opt.small, "Run folder of the run with fewer replicas (e.g. 1)");
  app.add_option("large", opt.large, "Run folder of the run with more replicas");
  app.add_option("--json", opt.json, "Also write the waterfall as JSON to this file")
      ->check(non_empty());
}

int run_explain_time(const ExplainTimeOptions& opt) {
  if (opt.small.empty() || opt.large.empty())
    throw UserError(
        fmt::format("explain-time: give two run folders, the run of fewer replicas and the run "
                    "of more (dtrain explain-time RESULTS/<name>/<run>-g1 "
                    "RESULTS/<name>/<run>-g4); {} given",
                    opt.small.empty() ? "none was" : "one was"));
  if (!opt.json.empty()) refuse_run_folder_output(opt.json, "--json", /*folder=*/false);
  for (const std::string& dir : {opt.small, opt.large})
    if (!std::filesystem::is_directory(dir))
      throw UserError(fmt::format("explain-time: {} is not a run folder (give two run folders, "
                                  "RESULTS/<name>/<run-id>, of 1 and of N replicas)",
                                  dir));
  const RunRecord small = load_run(opt.small), large = load_run(opt.large);
  for (const RunRecord* r : {&small, &large})
    if (r->status != "done")
      throw UserError(fmt::format("explain-time: {} is {}, not done: its epochs are not a whole "
                                  "run's",
                                  r->dir, r->status));
  if (small.experiment != large.experiment)
    throw UserError(fmt::format("explain-time: {} is experiment '{}' and {} is '{}': the two "
                                "runs must be of one experiment",
                                small.dir, small.experiment, large.dir, large.experiment));
  if (!small.config.empty() && !large.config.empty()) require_same_workload(small, large);
  const std::vector<std::string_view> cols = {
      "epoch",       "epoch_time_s",       "data_s",         "compute_s",
      "optimizer_s", "exchange_exposed_s", "rank_busy_max_s"};
  auto epochs = [&](const std::string& dir) {
    const MetricsCsv csv = read_metrics_csv(dir);
    csv.require(cols, " (written by an older dtrain)");
    std::vector<std::string_view> with = cols;
    if (csv.find("bn_sync_s")) with.push_back("bn_sync_s");  // older folders have none
    return read_epochs(csv, with);
  };
  TimeGap g = time_gap(epochs(opt.small), small.gpus, epochs(opt.large), large.gpus);
  add_projections(g, opt.small, large);
  fmt::print("{}", to_markdown(g));
  if (!opt.json.empty()) write_file_atomic(opt.json, to_json(g));
  return 0;
}

}  // namespace dtrain::cli
