#include <fmt/format.h>

#include "commands.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::cli {

void setup_validate(CLI::App& app, ValidateOptions& opt) {
  add_config_arguments(app, opt.config, opt.overrides);
  app.add_flag("--no-data", opt.skip_data, "Check the config only, not the data files");
  app.add_flag("--print", opt.print, "Print each run's resolved config");
}

int run_validate(const ValidateOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  DataCache cache;
  std::string description, warned;
  for (const auto& r : runs) {
    std::string size;  // the model's parameter count, where the data gives its input shape
    if (!opt.skip_data) {
      const DataSplit& data = cache.get(r.config);
      check_plan(r.config, data);
      description = data.description;
      // Not an error (the run can train), but outputs no sample trains: once per data set.
      const std::string key = data_identity(r.config.data, r.config.train.seed);
      if (const std::string w = key != warned ? label_warning(data) : ""; !w.empty())
        log().warn("[sparse-labels] {}", w);
      warned = key;
      const ModelSize m = model_size(r.config.model, data.train.shape, data.train.classes);
      size = fmt::format(
          "# model: {} parameters; per sample {:.4g} GFLOP forward, {:.4g} GFLOP backward, "
          "{:.1f} MiB of activations (fp32)\n",
          m.params, m.forward_flops * 1e-9, m.backward_flops * 1e-9,
          4.0 * static_cast<double>(m.activations_per_sample) / (1 << 20));
    }
    if (opt.print) fmt::print("# {}\n{}{}\n", run_id("TAG", r), size, to_yaml(r.config));
  }
  fmt::print("{}: valid ({} run{}{})\n", opt.config, runs.size(), runs.size() == 1 ? "" : "s",
             opt.skip_data ? ", data not checked" : fmt::format("; data: {}", description));
  return 0;
}

}  // namespace dtrain::cli
