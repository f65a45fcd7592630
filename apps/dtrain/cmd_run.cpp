#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <memory>

#include "commands.hpp"
#include "dtrain/data.hpp"
#include "dtrain/error.hpp"
#include "dtrain/log.hpp"
#include "dtrain/plan.hpp"
#include "dtrain/recorder.hpp"
#include "dtrain/report.hpp"
#include "dtrain/trainer.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;

namespace {
std::string default_tag() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y%m%d-%H%M%S}", tm);
}

// Data depends on the data section and, for synthetic data, the seed.
std::string data_key(const Config& c) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", to_string(c.data.dataset), c.data.path,
                     c.data.normalize, c.data.sort_by_label, c.data.train_limit, c.data.test_limit,
                     c.data.synthetic.train_size, c.data.synthetic.test_size,
                     fmt::join(c.data.synthetic.shape, "x"), c.data.synthetic.noise,
                     c.data.dataset == DatasetKind::synthetic ? c.train.seed : 0);
}
}  // namespace

void setup_run(CLI::App& app, RunOptions& opt) {
  app.add_option("config", opt.config, "Experiment YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("overrides", opt.overrides,
                 "key=value overrides of the YAML (dotted keys, e.g. gpus=4 optimizer.lr=0.1); "
                 "a comma list (gpus=1,2,4) runs each value");
  app.add_option("--results", opt.results, "Results root; runs go to RESULTS/<name>/<run-id>/")
      ->capture_default_str();
  app.add_option("--tag", opt.tag,
                 "Run-id prefix shared by this command's runs (default: UTC date-time)");
  app.add_flag("-q,--quiet", opt.quiet, "Only warnings, errors and the final table");
}

int run_run(const RunOptions& opt) {
  set_verbosity(opt.quiet);
  const std::string tag = opt.tag.empty() ? default_tag() : slug(opt.tag);
  const auto runs = plan_runs(opt.config, opt.overrides);

  // Everything that can be checked is checked before the first step of the first run.
  std::vector<std::string> dirs;
  for (const auto& r : runs) {
    const auto dir = (fs::path(opt.results) / r.config.name / run_id(tag, r)).string();
    if (fs::exists(dir))
      throw UserError(
          fmt::format("{}: run folder already exists; runs are never overwritten "
                      "(pick another --tag or --results folder, or remove it)",
                      dir));
    for (const auto& d : dirs)
      if (d == dir) throw UserError(fmt::format("two runs of this command map to {}", dir));
    dirs.push_back(dir);
  }
  std::map<std::string, std::shared_ptr<DataSplit>> data_cache;
  for (const auto& r : runs) {
    auto& slot = data_cache[data_key(r.config)];
    if (!slot) {
      log().info("loading data ({})", to_string(r.config.data.dataset));
      slot = std::make_shared<DataSplit>(load_data(r.config.data, r.config.train.seed));
    }
    check_plan(r.config, *slot);
  }

  int failed = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    if (stop_requested()) break;
    if (runs.size() > 1) log().info("=== run {}/{} ===", i + 1, runs.size());
    RunRecorder rec(dirs[i], run_id(tag, r), r.label, r.config, r.overrides);
    try {
      const auto result = train(r.config, *data_cache[data_key(r.config)], &rec);
      rec.finish(result);
    } catch (const std::exception& e) {
      rec.fail(e.what());
      log().error("run {} failed: {}", run_id(tag, r), e.what());
      ++failed;
      if (dynamic_cast<const UserError*>(&e)) throw;
    }
  }

  // The table is regenerated from the run folders, grouped by experiment.
  std::map<std::string, std::vector<RunRecord>> by_experiment;
  for (const auto& d : dirs) {
    if (!fs::exists(fs::path(d) / "summary.json")) continue;
    auto rec = load_run(d);
    by_experiment[rec.experiment].push_back(std::move(rec));
  }
  for (const auto& [name, records] : by_experiment) {
    const auto cmp = compare(records);
    const std::string base = (fs::path(opt.results) / name / ("comparison-" + tag)).string();
    write_file_atomic(base + ".md", to_markdown(cmp));
    write_file_atomic(base + ".csv", to_csv(cmp));
    fmt::print("\n## {}\n\n{}\n(written to {}.md and .csv)\n", name, to_markdown(cmp), base);
  }
  if (stop_requested()) {
    log().warn("interrupted");
    return 130;
  }
  return failed ? 1 : 0;
}

}  // namespace dtrain::cli
