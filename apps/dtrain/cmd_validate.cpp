#include <fmt/format.h>

#include "commands.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::cli {

void setup_validate(CLI::App& app, ValidateOptions& opt) {
  app.add_option("config", opt.config, "Experiment YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("overrides", opt.overrides, "key=value overrides, as for `dtrain run`");
  app.add_flag("--no-data", opt.skip_data, "Check the config only, not the data files");
  app.add_flag("--print", opt.print, "Print each run's resolved config");
}

int run_validate(const ValidateOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  std::string data_key;
  DataSplit data;
  for (const auto& r : runs) {
    if (!opt.skip_data) {
      const std::string key = data_identity(r.config.data, r.config.train.seed);
      if (key != data_key) {
        data = load_data(r.config.data, r.config.train.seed);
        data_key = key;
      }
      check_plan(r.config, data);
    }
    if (opt.print) fmt::print("# {}\n{}\n", run_id("TAG", r), to_yaml(r.config));
  }
  fmt::print("{}: valid ({} run{}{})\n", opt.config, runs.size(), runs.size() == 1 ? "" : "s",
             opt.skip_data ? ", data not checked" : fmt::format("; data: {}", data.description));
  return 0;
}

}  // namespace dtrain::cli
