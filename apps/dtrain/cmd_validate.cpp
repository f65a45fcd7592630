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

namespace {

std::string mib(double bytes) {
  return fmt::format("{:.0f} MiB", bytes / (1 << 20));
}

// The shape engine's size and FLOPs for a model on samples of `shape` with `classes` outputs.
std::string model_line(const ModelConfig& model, const std::vector<int64_t>& shape, int classes) {
  const ModelSize m = model_size(model, shape, classes);
  return fmt::format(
      "# model: {} parameters; per sample {:.4g} GFLOP forward, {:.4g} GFLOP backward, "
      "{:.1f} MiB of activations (fp32)\n",
      m.params, m.forward_flops * 1e-9, m.backward_flops * 1e-9,
      4.0 * static_cast<double>(m.activations_per_sample) / (1 << 20));
}

// The shape engine's answers for one run: size, FLOPs and the memory a replica takes.
std::string model_lines(const Config& cfg, const DataSplit& data) {
  const ReplicaBytes b = replica_bytes(cfg, data);
  const double data_bytes =
      4.0 * static_cast<double>(data.train.x.size() + data.test.x.size() + data.train.size() +
                                data.test.size());
  return model_line(cfg.model, data.train.shape, data.train.classes) +
         fmt::format("# memory: about {} per replica ({} of weights, gradients and optimizer "
                     "state; {} of activations, their gradients and batch buffers for {} rows), "
                     "and {} for the data set\n",
                     mib(b.total()), mib(b.params), mib(b.activations), b.rows, mib(data_bytes));
}

// Without the data: the size and FLOPs where the config alone gives the sample's shape and the
// classes, else a line saying what is missing.
std::string model_line_without_data(const Config& cfg) {
  const int classes = nominal_classes(cfg.data);
  if (classes == 0)
    return fmt::format("# model: its size needs the data ({} classes are the files'); run "
                       "validate without --no-data\n",
                       to_string(cfg.data.dataset));
  return model_line(cfg.model, nominal_shape(cfg.data), classes) +
         "# memory: needs the data; run validate without --no-data\n";
}

}  // namespace

int run_validate(const ValidateOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  DataCache cache(opt.config);
  std::string description, warned;
  for (const auto& r : runs) {
    // The model's parameter count, from the data's input shape or the config's.
    std::string size = opt.skip_data ? model_line_without_data(r.config) : "";
    if (!opt.skip_data) {
      const DataSplit& data = cache.get(r.config);
      try {
        check_config_plan(opt.config, r.config, data);
      } catch (const UserError& e) {
        rethrow_for_run(r, runs.size(), e);
      }
      description = data.description;
      // Not an error (the run can train), but outputs no sample trains: once per data set.
      const std::string key = data_identity(r.config.data, r.config.train.seed);
      if (const std::string w = key != warned ? label_warning(data) : ""; !w.empty())
        log().warn("[sparse-labels] {}", w);
      warned = key;
      size = model_lines(r.config, data);
    }
    if (opt.print) fmt::print("# {}\n{}{}\n", run_id("TAG", r), size, to_yaml(r.config));
  }
  fmt::print("{}: valid ({} run{}{})\n", one_line(opt.config.c_str()), runs.size(),
             runs.size() == 1 ? "" : "s",
             opt.skip_data ? ", data not checked" : fmt::format("; data: {}", description));
  return 0;
}

}  // namespace dtrain::cli
