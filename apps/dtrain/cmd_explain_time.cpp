// dtrain explain-time: why an N-replica run's epoch is not 1/N of a 1-replica run's, as a
// waterfall of measured terms (lib/dtrain/results/time_gap.hpp).
#include <fmt/format.h>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/results/time_gap.hpp"

namespace dtrain::cli {

void setup_explain_time(CLI::App& app, ExplainTimeOptions& opt) {
  app.add_option("small", opt.small, "Run folder of the run with fewer replicas (e.g. 1)")
      ->required();
  app.add_option("large", opt.large, "Run folder of the run with more replicas")->required();
  app.add_option("--json", opt.json, "Also write the waterfall as JSON to this file");
}

int run_explain_time(const ExplainTimeOptions& opt) {
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
  const std::vector<std::string_view> cols = {"epoch_time_s", "data_s", "compute_s",
                                              "optimizer_s", "exchange_exposed_s",
                                              "rank_busy_max_s"};
  auto epochs = [&](const std::string& dir) {
    const MetricsCsv csv = read_metrics_csv(dir);
    csv.require(cols, " (written by an older dtrain)");
    return read_epochs(csv, cols);
  };
  const TimeGap g = time_gap(epochs(opt.small), small.gpus, epochs(opt.large), large.gpus);
  fmt::print("{}", to_markdown(g));
  if (!opt.json.empty()) write_file_atomic(opt.json, to_json(g));
  return 0;
}

}  // namespace dtrain::cli
