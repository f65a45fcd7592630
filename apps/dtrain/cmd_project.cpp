// dtrain project: a 1-replica run's measured step, projected to N GPUs over a link with the
// ring all-reduce model of train/project.hpp. Projections, not measurements.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/comm/bench_comm.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/train/project.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What the projection needs from a run folder.
struct RunInput {
  std::string dir;
  std::string subject;    // "the 1-replica run DIR", or the config and the GPU assumed
  std::string step_line;  // where the 1-replica step comes from, and its parts
  bool estimated = false;
  json estimate;  // with `estimated`: what the step was estimated from
  ProjectionInput in;
  int64_t params = 0;
  double bucket_mb = 25;
  int64_t steps_per_epoch = 0;
  int epochs = 0;  // metrics.csv rows the medians come from
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// One time (seconds) or sample count of metrics.csv: a number (metrics_value), finite, from 0
// to 1e15 (a year of seconds is 3e7); anything else is a damaged file, named with its row.
double measured_value(const std::string& text, const std::string& path, const std::string& col,
                      int row) {
  const auto v = metrics_value(text);
  if (!v || !std::isfinite(*v) || *v < 0 || *v > 1e15)
    throw UserError(fmt::format("{}: '{}' is '{}' in epoch row {}; expected a time or count "
                                "from 0 to 1e15 (a damaged file?)",
                                path, col, text, row));
  return *v;
}

// metrics.csv's epochs are 1, 2, ... in order, one row each for the `epochs` summary.json
// counts: a row cut, renumbered or written twice is a damaged file, named, as report and
// explain-time name it, not a projection from fewer epochs.
void check_epoch_rows(const MetricsCsv& csv, int epochs) {
  const auto at = csv.find("epoch");
  for (size_t r = 0; at && r < csv.rows.size(); ++r) {
    const auto e = metrics_value(csv.rows[r][*at]);
    if (!e || *e != static_cast<double>(r + 1))
      throw UserError(fmt::format("{}:{}: epoch '{}' where epoch {} should be (a damaged file?)",
                                  csv.path, csv.lines[r], csv.rows[r][*at], r + 1));
  }
  if (epochs > 0 && static_cast<int64_t>(csv.rows.size()) != epochs)
    throw UserError(
        fmt::format("{}: {} epoch rows, but summary.json counts {} finished epochs "
                    "(a damaged file?)",
                    csv.path, csv.rows.size(), epochs));
}

// Per-epoch medians of the named metrics.csv columns (totals over the epoch's steps), from a
// file whose rows are whole and numbered (check_epoch_rows).
std::vector<double> metric_medians(const std::string& dir, const std::vector<std::string>& cols,
                                   int epochs_completed, int& rows) {
  const MetricsCsv csv = read_metrics_csv(dir, RaggedRows::refuse);
  check_epoch_rows(csv, epochs_completed);
  std::vector<size_t> at;
  for (const auto& c : cols) {
    const std::string_view name = metrics_column(c).name;  // one of the table's columns
    csv.require({name}, " (written by an older dtrain?); rerun the 1-replica run");
    at.push_back(*csv.find(name));
  }
  std::vector<std::vector<double>> values(cols.size());
  rows = static_cast<int>(csv.rows.size());
  for (int r = 0; r < rows; ++r)
    for (size_t k = 0; k < at.size(); ++k)
      values[k].push_back(measured_value(csv.rows[static_cast<size_t>(r)][at[k]], csv.path,
                                         cols[k], r + 1));
  std::vector<double> out;
  for (size_t k = 0; k < cols.size(); ++k) {
    if (values[k].empty())
      throw UserError(
          fmt::format("{}: no finished epoch with a value of '{}'; the projection "
                      "needs at least one",
                      csv.path, cols[k]));
    out.push_back(median_of(values[k]));
  }
  return out;
}

void check_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec))
    throw UserError(fmt::format(
        "{}: this is a config, not a run folder; run it first at one replica (dtrain run {} "
        "gpus=1) and give its folder, results/<name>/<run-id>/, or estimate its step for a GPU "
        "with --gpu {}",
        path, path, fmt::join(gpu_preset_names(), "|")));
  if (!fs::is_directory(path, ec)) throw UserError(fmt::format("{}: no such run folder", path));
  if (!fs::exists(fs::path(path) / "summary.json", ec))
    throw UserError(
        fmt::format("{}: no summary.json; give the folder of a finished 1-replica "
                    "run (results/<name>/<run-id>/)",
                    path));
}

RunInput read_run(const std::string& path) {
  check_path(path);
  const RunRecord rec = load_run(path);
  if (rec.gpus != 1)
    throw UserError(
        fmt::format("{}: this run has gpus={}; the projection starts from a "
                    "1-replica run (dtrain run CONFIG gpus=1)",
                    path, rec.gpus));
  RunInput r;
  r.dir = path;
  r.steps_per_epoch = rec.steps_per_epoch;
  if (r.steps_per_epoch <= 0)
    throw UserError(fmt::format("{}/summary.json: no steps_per_epoch", path));
  r.params = rec.param_count;
  const auto m = metric_medians(path, {"data_s", "compute_s", "optimizer_s", "samples"},
                                rec.epochs_completed, r.epochs);
  const auto per_step = [&](double v) { return v / static_cast<double>(r.steps_per_epoch); };
  r.in.split = {per_step(m[0]), per_step(m[1]), per_step(m[2])};
  r.in.samples_per_epoch = static_cast<int64_t>(std::llround(m[3]));
  r.in.global_batch = rec.global_batch;
  if (r.in.global_batch <= 0)
    throw UserError(fmt::format("{}/summary.json: no global_batch", path));
  r.in.accumulation_steps = rec.accumulation_steps;
  r.subject = "the 1-replica run " + printable(path, true);
  const auto& s = r.in.split;
  r.step_line = fmt::format(
      "Measured step at 1 replica ({}): data {:.4g} ms + compute {:.4g} ms + optimizer {:.4g} ms.",
      r.epochs == 1 ? "one epoch" : fmt::format("medians of {} epochs", r.epochs), s.data_s * 1e3,
      s.compute_s * 1e3, s.optimizer_s * 1e3);
  if (r.epochs == 1)
    r.step_line +=
        " One epoch only: its time includes the run's start (memory touched for the first "
        "time, kernels compiled), which more epochs spread out.";
  else if (r.epochs == 2)
    r.step_line += " The median of two epochs is their mean: half the first one's start is in it.";
  // A run that did not finish still timed its epochs; said, since its numbers may not be those
  // of the run the user means (a diverged one computed on infinities and NaNs).
  if (rec.status != "done")
    r.step_line += fmt::format(
        " The run's status is {}: {}.", printable(rec.status, true),
        rec.status == "diverged"
            ? "its loss went non-finite, and steps on infinities and NaNs may time differently"
            : "its times are of the epochs it finished");
  const auto cfg = run_config_values(rec);
  if (const auto it = cfg.find("train.bucket_mb"); it != cfg.end())
    r.bucket_mb = measured_value(it->second, path + "/summary.json", "train.bucket_mb", 0);
  if (const auto it = cfg.find("data.drop_remainder"); it != cfg.end())
    r.in.drop_remainder = it->second != "false";
  return r;
}

// The data's shape, classes and training samples from the files' headers where they are here,
// else the config's nominal shape and no epoch (`why` says what was missing).
DataShape data_shape_of(const Config& cfg, std::string& why) {
  try {
    return peek_data_shape(cfg.data);
  } catch (const UserError& e) {
    why = e.what();
    // The classifier's width, which the parameter count and FLOPs need: 10 where only the
    // files would say.
    const int classes = nominal_classes(cfg.data);
    return {nominal_shape(cfg.data), classes > 0 ? classes : 10, 0};
  }
}

// Bytes of fp32 state an update reads and writes per parameter (see StepEstimateInput).
double update_bytes(const OptimizerConfig& o) {
  if (o.type != OptimizerType::sgd) return 28;
  return o.momentum > 0 ? 20 : 12;
}

const GpuPreset& gpu_preset(const ProjectOptions& opt) {
  const GpuPreset* gpu = find_gpu_preset(opt.gpu);
  if (!gpu)
    throw UserError(fmt::format("--gpu '{}': give one of {}", opt.gpu,
                                fmt::join(gpu_preset_names(), ", ")));
  if (!(opt.mfu >= 1e-4 && opt.mfu <= 1))
    throw UserError(fmt::format(
        "--mfu {}: give the share of the peak a step reaches, from 0.0001 to 1", opt.mfu));
  return *gpu;
}

// A replica's memory on the GPU (fp32 weights, gradients and optimizer state; each layer's
// output and its gradient for a micro-batch: the trainer's check counts the evaluation chunk's
// outputs and the batch buffers besides, so this is a floor), and where it passes the GPU's, a
// note saying the projected step cannot run there. Empty where it fits.
std::string memory_note(const Config& cfg, const ModelSize& m, const GpuPreset& gpu, double& need) {
  const double weights = state_bytes(cfg.optimizer, m.params);
  const double acts = 4.0 * static_cast<double>(m.activations_per_sample) * 2.0 *
                      static_cast<double>(cfg.micro_batch());
  need = weights + acts;
  if (need <= gpu.memory_bytes) return "";
  return fmt::format(
      "\nDoes not fit: one replica needs at least {:.1f} GB ({:.1f} GB of weights, gradients and "
      "optimizer state, {:.1f} GB of activations at {} samples), more than the {}'s {:.0f} GB; "
      "dtrain shards neither weights nor optimizer state, so the steps below cannot run there.",
      need / 1e9, weights / 1e9, acts / 1e9, cfg.micro_batch(), gpu.name, gpu.memory_bytes / 1e9);
}

// The config with its overrides: one run (a comma list would be several).
Config config_of(const ProjectOptions& opt) {
  std::vector<PlannedRun> runs = plan_runs(opt.path, opt.overrides);
  if (runs.size() != 1)
    throw UserError(fmt::format("{} overrides make {} runs; project estimates one: give single "
                                "values",
                                opt.path, runs.size()));
  return std::move(runs[0].config);
}

// A config's 1-replica step on a GPU the user may not have, from the shape engine's FLOPs.
RunInput estimate_config(const ProjectOptions& opt) {
  const GpuPreset& gpu = gpu_preset(opt);
  if (opt.params > 0)
    throw UserError("--params: with --gpu the parameters are the config's model's (change the "
                    "model to change them)");
  const Config cfg = config_of(opt);
  std::string no_data;
  const DataShape d = data_shape_of(cfg, no_data);
  if (!no_data.empty())
    no_data += fmt::format("; the model is sized for its nominal input [{}] and {} classes",
                           fmt::join(d.shape, ", "), d.classes);
  const ModelSize m = model_size(cfg.model, d.shape, d.classes);
  const DocumentedPeak peak = documented_peak(gpu.driver_name, cfg.precision);
  RunInput r;
  r.dir = opt.path;
  r.estimated = true;
  r.params = m.params;
  r.bucket_mb = cfg.train.bucket_mb;
  r.in.accumulation_steps = cfg.train.accumulation_steps;
  r.in.global_batch = cfg.micro_batch() * cfg.train.accumulation_steps;
  r.in.samples_per_epoch = d.train_size;  // 0 where the data is not here: no epoch column
  r.in.drop_remainder = cfg.data.drop_remainder;
  if (steps_per_epoch(r.in, 1) == 0 && d.train_size > 0)
    throw UserError(fmt::format(
        "{}: train: the batch of one replica, {} (per_replica_batch x accumulation_steps), is "
        "larger than the {} training samples, so drop_remainder leaves no step at any GPU count "
        "(`dtrain run` refuses it too); use a smaller batch or data.drop_remainder: false",
        opt.path, r.in.global_batch, d.train_size));
  const StepEstimateInput e{m.forward_flops + m.backward_flops, r.in.global_batch,
                            peak.tflops * 1e12, opt.mfu, m.params, update_bytes(cfg.optimizer),
                            gpu.memory_Bps};
  r.in.split = estimate_step(e);
  // The model's own share of backward in its FLOPs, unless --backward-fraction says otherwise.
  r.in.backward_fraction = opt.backward_fraction > 0 ? opt.backward_fraction
                                                     : m.backward_flops / e.flops_per_sample;
  const std::string precision = to_string(cfg.precision);
  const std::string given = fmt::format("{}{}{}", opt.path, opt.overrides.empty() ? "" : " ",
                                        fmt::join(opt.overrides, " "));
  double need = 0;
  const std::string fit = memory_note(cfg, m, gpu, need);
  r.subject = fmt::format("{} (its step estimated for one {}, {})", given, gpu.name, precision);
  r.step_line =
      fmt::format(
          "Estimated step at 1 replica (from the shape engine's FLOPs, not measured): compute "
          "{:.4g} ms = {:.4g} GFLOP a sample (forward + backward) x {} samples at MFU {:.2f} (an "
          "assumption, --mfu) of {:.1f} TFLOP/s ({}); optimizer {:.4g} ms = {} parameters x {:g} "
          "bytes at {}; data 0 (not modelled).{}",
          r.in.split.compute_s * 1e3, e.flops_per_sample * 1e-9, e.samples_per_step, opt.mfu,
          peak.tflops, peak.source, r.in.split.optimizer_s * 1e3, m.params,
          e.optimizer_bytes_per_param, gpu.memory_source,
          no_data.empty() ? "" : "\nNo epoch time: the data is not here (" + no_data + ").") +
      fit;
  r.estimate = {{"config", given},
                {"gpu", gpu.name},
                {"precision", precision},
                {"peak_tflops", peak.tflops},
                {"peak_source", peak.source},
                {"mfu", opt.mfu},
                {"flops_per_sample", e.flops_per_sample},
                {"optimizer_bytes_per_param", e.optimizer_bytes_per_param},
                {"memory_Bps", gpu.memory_Bps},
                {"memory_source", gpu.memory_source},
                {"replica_memory_bytes", need},
                {"gpu_memory_bytes", gpu.memory_bytes},
                {"fits", fit.empty()}};
  return r;
}

Link parse_link(const std::string& spec) {
  if (const Link* l = find_link_preset(spec)) return *l;
  const std::string prefix = "measured:";
  if (spec.rfind(prefix, 0) == 0 && spec.size() > prefix.size()) {
    const std::string file = spec.substr(prefix.size());
    const LinkFit f = load_bench_fit(file);
    return {"measured", f.alpha_s, f.busbw, "dtrain bench-comm fit from " + file};
  }
  throw UserError(
      fmt::format("--link '{}': give one of {}, or measured:FILE (a dtrain "
                  "bench-comm JSON)",
                  spec, fmt::join(link_preset_names(), ", ")));
}

std::string fmt_or_na(double v, const char* spec_fmt, double scale = 1) {
  return std::isfinite(v) ? fmt::format(fmt::runtime(spec_fmt), v * scale) : "n/a";
}

std::string intro(const RunInput& r, const Link& link, double backward_fraction) {
  const size_t k = r.in.buckets.size();
  const std::string buckets = r.bucket_mb > 0 ? fmt::format("{} bucket{} of at most {:g} MiB", k,
                                                            k == 1 ? "" : "s", r.bucket_mb)
                                              : std::string("one all-reduce after backward");
  return fmt::format(
      "Projection (a model, not a measurement) of {} to N GPUs.\n"
      "Link {}: alpha {:.2f} us per ring step, busbw {:.1f} GB/s ({}).\n"
      "{}\n"
      "Gradients: {} parameters ({:.3g} MB) in {}; backward = {:.3g} of compute; per-replica "
      "batch fixed (global batch {} x N).\n",
      r.subject, link.name, link.alpha_s * 1e6, link.busbw / 1e9, link.source, r.step_line,
      r.params, 4e-6 * static_cast<double>(r.params), buckets, backward_fraction,
      r.in.global_batch);
}

std::string to_markdown(const std::vector<ProjectionRow>& rows, const ProjectionInput& in) {
  std::string s =
      "| gpus | step (ms) | epoch (s) | speedup | efficiency | all-reduce (ms) | exposed (ms) | "
      "exposed share | dominant term |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    s += fmt::format("| {} | {:.4g} | {} | {:.2f}x | {:.3g}% | {:.4g} | {:.4g} | {:.1f}% | {} |\n",
                     r.gpus, r.step_s * 1e3, fmt_or_na(r.epoch_s, "{:.4g}"), r.speedup,
                     100 * r.efficiency, r.exchange_s * 1e3, r.exchange.exposed_s * 1e3,
                     100 * r.exposed_share, to_string(r.bound));
  int none = 0;  // the fewest GPUs whose epoch has no step, whatever the order of --gpus
  for (const auto& r : rows)
    if (r.steps_per_epoch == 0 && (none == 0 || r.gpus < none)) none = r.gpus;
  if (in.samples_per_epoch > 0 && none > 0)
    s += fmt::format(
        "\nEpoch n/a: from {} GPUs on, the global batch ({} x N) is larger than the {} "
        "training samples; with data.drop_remainder no step is left, and `dtrain run` refuses "
        "such a run.\n",
        none, in.global_batch, in.samples_per_epoch);
  return s;
}

json num(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

std::string to_json(const RunInput& r, const Link& link, double backward_fraction,
                    const std::vector<ProjectionRow>& rows) {
  json out = json::array();
  for (const auto& p : rows)
    out.push_back({{"gpus", p.gpus},
                   {"step_s", p.step_s},
                   {"steps_per_epoch", p.steps_per_epoch},
                   {"epoch_s", num(p.epoch_s)},
                   {"speedup", p.speedup},
                   {"efficiency", p.efficiency},
                   {"allreduce_s", p.exchange_s},
                   {"exposed_s", p.exchange.exposed_s},
                   {"exposed_latency_s", p.exchange.exposed_latency_s},
                   {"exposed_bandwidth_s", p.exchange.exposed_bandwidth_s},
                   {"exposed_share", p.exposed_share},
                   {"dominant", to_string(p.bound)}});
  json j = {{"kind", "projection (a model, not a measurement)"},
                  {"run", r.dir},
                  {"step_basis", r.estimated ? "estimated from FLOPs (not measured)" : "measured"},
                  {"link",
                   {{"name", link.name},
                    {"alpha_s", link.alpha_s},
                    {"busbw_Bps", num(link.busbw)},
                    {"source", link.source}}},
                  {"step_1_replica_s",
                   {{"data", r.in.split.data_s},
                    {"compute", r.in.split.compute_s},
                    {"optimizer", r.in.split.optimizer_s}}},
                  {"params", r.params},
                  {"bucket_mb", r.bucket_mb},
                  {"bucket_bytes", r.in.buckets},
                  {"backward_fraction", backward_fraction},
                  {"global_batch_1", r.in.global_batch},
                  {"samples_per_epoch", r.in.samples_per_epoch},
                  {"rows", out}};
  if (r.estimated) j["estimate"] = r.estimate;
  return json_text(j, 2) + "\n";
}

void check_options(const ProjectOptions& opt) {
  if (opt.gpus.empty()) throw UserError("--gpus: give at least one GPU count, e.g. 1,2,4,8");
  for (size_t i = 0; i < opt.gpus.size(); ++i) {
    const int n = opt.gpus[i];
    if (n < 1 || n > (1 << 20))
      throw UserError(fmt::format("--gpus {}: each GPU count must be 1 to 1048576", n));
    if (std::find(opt.gpus.begin(), opt.gpus.begin() + static_cast<std::ptrdiff_t>(i), n) !=
        opt.gpus.begin() + static_cast<std::ptrdiff_t>(i))
      throw UserError(fmt::format("--gpus: {} is given twice; give each GPU count once", n));
  }
  // Checked as given (NaN: not given); the option's own check misses some values ("-1").
  if (!std::isnan(opt.backward_fraction) &&
      !(opt.backward_fraction > 0 && opt.backward_fraction <= 1))
    throw UserError(fmt::format("--backward-fraction {}: give a share of compute in (0, 1]",
                                opt.backward_fraction));
  if (!opt.overrides.empty() && opt.gpu.empty())
    throw UserError(fmt::format("{}: overrides change a config, with --gpu; a run folder's "
                                "step is what it measured",
                                opt.overrides.front()));
}

// Bounds that keep the model's bucket list small: at most 10^12 parameters and 10^6 buckets.
// (--params 0 and --bucket-mb -1 are the defaults: the run's own values.)
void check_sizes(const ProjectOptions& opt, int64_t params, double bucket_mb) {
  if (opt.params < 0 || opt.params > int64_t{1000000000000})
    throw UserError(fmt::format("--params {}: give 1 to 10^12 parameters", opt.params));
  if (opt.bucket_mb != -1 && !(opt.bucket_mb >= 0 && opt.bucket_mb <= 1e6))
    throw UserError(fmt::format("--bucket-mb {}: give 0 (one all-reduce) to 1e6 MiB", opt.bucket_mb));
  if (params > int64_t{1000000000000})
    throw UserError(fmt::format(
        "the {} parameter count {} is past 10^12, the largest model project takes; {}",
        opt.gpu.empty() ? "run's" : "config's", params,
        opt.gpu.empty() ? "give --params (at most 10^12)" : "make the model smaller"));
  if (bucket_mb > 0 && bucket_mb * 1024 * 1024 < 4)
    throw UserError(fmt::format("--bucket-mb {:g}: a bucket holds at least one 4-byte gradient; "
                                "give 0 (one all-reduce) or at least {:g} MiB",
                                bucket_mb, 4.0 / (1024 * 1024)));
  const double bucket_params = bucket_mb * 1024 * 1024 / 4;
  if (bucket_mb > 0 && static_cast<double>(params) / std::max(1.0, bucket_params) > 1e6)
    throw UserError(fmt::format(
        "--bucket-mb {}: {} parameters would make more than 10^6 buckets; give a larger size",
        bucket_mb, params));
}

}  // namespace

void setup_project(CLI::App& app, ProjectOptions& opt) {
  app.add_option("run", opt.path,
                 "Folder of a finished 1-replica run (results/<name>/<run-id>), or a config "
                 "with --gpu")
      ->required();
  app.add_option("overrides", opt.overrides,
                 "With --gpu: key=value overrides of the config (e.g. precision=bf16)");
  auto* gpu = app.add_option(
      "--gpu", opt.gpu,
      fmt::format("With a config: estimate its 1-replica step on this GPU from the model's FLOPs "
                  "and the datasheet ({})",
                  fmt::join(gpu_preset_names(), ", ")));
  app.add_option("--mfu", opt.mfu,
                 "With --gpu: the share of the dense peak a step is assumed to reach")
      ->capture_default_str()
      ->needs(gpu);
  app.add_option("--gpus", opt.gpus, "GPU counts to project to")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--link", opt.link,
                 "nvlink-h100 (450 GB/s, 5 us), pcie4 (20 GB/s, 10 us), ib-ndr400 (45 GB/s, "
                 "10 us), or measured:FILE (alpha and busbw_fit of a dtrain bench-comm JSON)")
      ->capture_default_str();
  app.add_option("--backward-fraction", opt.backward_fraction,
                 "Share of the compute that is backward, which the exchange overlaps (default: "
                 "2/3 of a run's measured compute; with --gpu, the model's own share of FLOPs)")
      // "nan" would read as not given: refused here, as every value outside (0, 1].
      ->check(CLI::Validator(
          [](std::string& v) {
            char* end = nullptr;
            const double f = std::strtod(v.c_str(), &end);
            return *end == '\0' && f > 0 && f <= 1 ? std::string()
                                                    : "give a share of compute in (0, 1]";
          },
          "", "SHARE"));
  // Only given values are checked: the defaults (-1, 0) stand for the run's own.
  app.add_option("--bucket-mb", opt.bucket_mb,
                 "Gradient bucket size in MiB (default: the run's train.bucket_mb; 0: one "
                 "all-reduce after backward)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--params", opt.params,
                 "Parameter count (default: the one in the run's summary.json)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000000000}));
  app.add_option("--out", opt.out,
                 "Write OUT.md and OUT.json (default: RUN/projection-<link>; for a config, "
                 "results/projections/<config>-<gpu>-<link>)")
      ->check(non_empty());
  app.footer(
      "A model of the exchange on GPUs (ring all-reduce, see docs/project.md); nothing runs on a "
      "GPU.");
}

int run_project(const ProjectOptions& opt) {
  check_options(opt);
  check_sizes(opt, 0, 0);  // the options alone, before any file is read
  const Link link = parse_link(opt.link);
  std::error_code ec;
  if (!opt.gpu.empty() && fs::is_directory(opt.path, ec))
    throw UserError(fmt::format("{}: --gpu estimates a config's step; a run folder has its "
                                "measured step (leave out --gpu)",
                                opt.path));
  RunInput r = opt.gpu.empty() ? read_run(opt.path) : estimate_config(opt);
  if (opt.params > 0) r.params = opt.params;
  if (r.params <= 0)
    throw UserError(
        fmt::format("{}/summary.json: no parameter count in its model description; "
                    "give --params N",
                    opt.path));
  if (opt.bucket_mb >= 0) r.bucket_mb = opt.bucket_mb;
  check_sizes(opt, r.params, r.bucket_mb);
  r.in.buckets = bucket_bytes(r.params, r.bucket_mb);
  if (!r.estimated)
    r.in.backward_fraction = opt.backward_fraction > 0 ? opt.backward_fraction : 2.0 / 3.0;
  const auto rows = project(r.in, opt.gpus, link);

  const std::string head = intro(r, link, r.in.backward_fraction);
  const std::string md = to_markdown(rows, r.in);
  fs::path stem = opt.out;
  if (opt.out.empty())
    stem = r.estimated ? fs::path("results") / "projections" /
                             (slug(fs::path(r.dir).stem().string()) + "-" + opt.gpu + "-" +
                              slug(link.name))
                       : fs::path(r.dir) / ("projection-" + slug(link.name));
  if (stem.extension() == ".md" || stem.extension() == ".json") stem.replace_extension();
  require_file_stem(stem.string(), opt.out.empty() ? stem.string() : opt.out);
  for (const char* ext : {".md", ".json"})
    refuse_run_folder_output(stem.string() + ext, "--out", /*folder=*/false);
  ensure_dir(fs::absolute(stem).parent_path().string(), "projection");
  write_file_atomic(stem.string() + ".md",
                    "# Projection: " + link.name + "\n\n" + head + "\n" + md);
  write_file_atomic(stem.string() + ".json", to_json(r, link, r.in.backward_fraction, rows));
  fmt::print("{}\n{}\n(written to {}.md and .json)\n", head, md, printable(stem.string(), true));
  return 0;
}

}  // namespace dtrain::cli
