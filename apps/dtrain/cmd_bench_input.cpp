// dtrain bench-input: how many images per second the input pipeline of a dataset: folder config
// decodes and augments on this machine, at each worker count; the number `doctor` compares with
// what a step consumes.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/data/pipeline.hpp"

namespace dtrain::cli {

void setup_bench_input(CLI::App& app, BenchInputOptions& opt) {
  add_config_arguments(app, opt.config, opt.overrides);
  app.add_option("--workers", opt.workers, "Decode thread counts to time, e.g. 1,2,4")
      ->delimiter(',')
      ->allow_extra_args(false)  // `--workers 1 data.shape=...`: the override stays one
      ->check(CLI::Range(1, 256));
  app.add_option("--images", opt.images, "Images decoded per measurement")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--repeats", opt.repeats, "Measurements per worker count (the median is shown)")
      ->check(CLI::Range(1, 100));
}

namespace {
// One row of the table: the same for the header (values empty) and each measurement.
std::string row(const std::string& workers, const std::string& rate, const std::string& each,
                const std::string& all) {
  return fmt::format("| {:>7} | {:>10} | {:>10} | {} |\n", workers, rate, each, all);
}
}  // namespace

int run_bench_input(const BenchInputOptions& opt) {
  for (size_t i = 0; i < opt.workers.size(); ++i)
    if (std::count(opt.workers.begin(), opt.workers.begin() + static_cast<std::ptrdiff_t>(i),
                   opt.workers[i]))
      throw UserError(
          fmt::format("--workers: {} is given twice; give each count once", opt.workers[i]));
  const auto runs = plan_runs(opt.config, opt.overrides);
  const Config& cfg = runs.front().config;
  if (cfg.data.dataset != DatasetKind::folder)
    throw UserError(
        fmt::format("{}: bench-input times image files (data.dataset: folder); "
                    "this config's data is {} and is held in memory",
                    opt.config, to_string(cfg.data.dataset)));
  // The pipeline's prefetch + 1 batch buffers, refused where they cannot fit, as run refuses a
  // batch too large for the machine.
  double features = 1;
  for (const int64_t d : cfg.data.shape) features *= static_cast<double>(d);
  const double need =
      4.0 * features * static_cast<double>(cfg.micro_batch()) * (cfg.data.prefetch + 1);
  const double have = available_host_memory();
  if (have > 0 && need > have)
    throw UserError(fmt::format(
        "{}: batches of {} images of {:.0f} floats at data.prefetch {} need {:.1f} GiB of "
        "buffers; this machine has {:.1f} GiB available (fix: a smaller data.shape, batch or "
        "prefetch)",
        opt.config, cfg.micro_batch(), features, cfg.data.prefetch,
        need / (1024.0 * 1024 * 1024), have / (1024.0 * 1024 * 1024)));
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  fmt::print("# {}: {}\n# batches of {} at prefetch {}, {} images a measurement, median of {}\n",
             one_line(opt.config.c_str()), data.description, cfg.micro_batch(), cfg.data.prefetch,
             opt.images, opt.repeats);
  fmt::print("{}|---:|---:|---:|---|\n", row("workers", "images/s", "per worker", "all runs"));
  for (int w : opt.workers) {
    std::vector<double> rates;
    for (int r = 0; r < opt.repeats; ++r)
      rates.push_back(
          measure_input_rate(data.train, cfg.data, w, cfg.data.prefetch, cfg.micro_batch(),
                             opt.images));
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::string all;
    for (double v : rates) all += fmt::format("{}{:.0f}", all.empty() ? "" : " ", v);
    fmt::print("{}", row(fmt::format("{}", w), fmt::format("{:.0f}", median),
                         fmt::format("{:.0f}", median / w), all));
  }
  return 0;
}

}  // namespace dtrain::cli
