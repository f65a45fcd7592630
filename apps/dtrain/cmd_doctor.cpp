#include <fmt/format.h>

#include "commands.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/train/doctor.hpp"

namespace dtrain::cli {

void setup_doctor(CLI::App& app, DoctorOptions& opt) {
  app.add_option("config", opt.config, "Experiment YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("overrides", opt.overrides, "key=value overrides, as for `dtrain run`");
  app.add_flag("--no-data", opt.skip_data,
               "Read the config only (the data rules, dropped samples and label order, need "
               "the data)");
}

int run_doctor(const DoctorOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  std::string data_key;
  DataSplit data;
  size_t findings = 0;
  for (const auto& r : runs) {
    if (!opt.skip_data) {
      const std::string key = data_identity(r.config.data, r.config.train.seed);
      if (key != data_key) {
        data = load_data(r.config.data, r.config.train.seed);
        data_key = key;
      }
    }
    const std::string who =
        runs.size() > 1
            ? fmt::format("gpus={}{}: ", r.config.gpus, r.label.empty() ? "" : " " + r.label)
            : "";
    for (const auto& f : diagnose(r.config, opt.skip_data ? nullptr : &data)) {
      fmt::print("doctor: {}[{}] {}\n", who, f.rule, f.message);
      ++findings;
    }
  }
  if (findings == 0)
    fmt::print("doctor: {}: none of the {} known pitfalls ({} run{})\n", opt.config,
               doctor_rules().size(), runs.size(), runs.size() == 1 ? "" : "s");
  else
    fmt::print("doctor: {}: {} finding{} in {} run{}\n", opt.config, findings,
               findings == 1 ? "" : "s", runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace dtrain::cli
