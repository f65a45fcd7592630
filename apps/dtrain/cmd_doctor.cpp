#include <fmt/format.h>

#include <optional>

#include "commands.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/train/doctor.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::cli {

void setup_doctor(CLI::App& app, DoctorOptions& opt) {
  add_config_arguments(app, opt.config, opt.overrides);
  app.add_flag("--no-data", opt.skip_data,
               "Read the config only (the data rules, dropped samples and label order, need "
               "the data)");
}

int run_doctor(const DoctorOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  DataCache cache(opt.config);
  size_t findings = 0;
  for (const auto& r : runs) {
    const DataSplit* data = opt.skip_data ? nullptr : &cache.get(r.config);
    // What validate refuses is not a pitfall but an error: the same check, the same message.
    if (data) check_config_plan(opt.config, r.config, *data);
    const std::string who =
        runs.size() > 1
            ? fmt::format("gpus={}{}: ", r.config.gpus, r.label.empty() ? "" : " " + r.label)
            : "";
    // Image files: the input rule measures the pipeline and a step on this machine.
    std::optional<InputProbe> probe;
    if (data && data->train.files) {
      fmt::print("doctor: {}timing the input pipeline and a training step on this machine\n", who);
      try {
        probe = probe_input(r.config, *data);
      } catch (const std::exception& e) {  // e.g. a cuda config on a machine without a GPU
        fmt::print("doctor: {}input-bound not checked: timing a step failed: {}\n", who,
                   e.what());
      }
    }
    for (const auto& f : diagnose(r.config, data, probe ? &*probe : nullptr)) {
      fmt::print("doctor: {}[{}] {}\n", who, f.rule, f.message);
      ++findings;
    }
  }
  if (findings == 0)
    fmt::print("doctor: {}: none of the {} known pitfalls ({} run{})\n",
               one_line(opt.config.c_str()), doctor_rules().size(), runs.size(),
               runs.size() == 1 ? "" : "s");
  else
    fmt::print("doctor: {}: {} finding{} in {} run{}\n", one_line(opt.config.c_str()), findings,
               findings == 1 ? "" : "s", runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace dtrain::cli
