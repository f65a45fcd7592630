#include "dtrain/results/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/base/version.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/train/straggler.hpp"

namespace dtrain {

using nlohmann::json;
using S = SummarySource;
using T = SummaryType;

namespace {

json absent() { return json(json::value_t::discarded); }

// Model FLOPs utilisation: the shape engine's FLOPs per sample times the median epoch's samples
// per second, per replica, against a replica's peak (RunInfo).
json utilisation_json(const S& s) {
  const RunInfo& info = s.info;
  const double flops = info.forward_flops + info.backward_flops;
  const double samples_per_s = s.stats.median_samples_per_s;
  const double achieved = std::isfinite(samples_per_s) && flops > 0
                              ? samples_per_s * flops / std::max(1, s.cfg.gpus) / 1e12
                              : std::nan("");
  const double peak = info.peak_tflops > 0 ? info.peak_tflops : std::nan("");
  return {{"flops_per_sample", {{"forward", info.forward_flops}, {"backward", info.backward_flops}}},
          {"achieved_tflops_per_replica", number_or_null(achieved)},
          {"peak_tflops_per_replica", number_or_null(peak)},
          {"peak_source", info.peak_source.empty() ? json(nullptr) : json(info.peak_source)},
          {"mfu", number_or_null(achieved / peak)}};
}

// The epochs that named a straggler (straggler.hpp): CPU runs of several replicas only, where
// stragglers are looked for.
json stragglers_json(const S& s) {
  if (s.cfg.gpus <= 1 || s.info.backend != "cpu") return absent();
  json out = json::array();
  for (const EpochMetrics& m : s.epochs)
    if (m.straggler_rank >= 0)
      out.push_back({{"epoch", m.epoch},
                     {"rank", m.straggler_rank},
                     {"phase", straggler_phase_name(m.straggler_phase)},
                     {"excess", number_or_null(m.straggler_excess)}});
  return out;
}

// The last epoch's gradient noise scale and what it says about more replicas: to first order
// (McCandlish et al. 2018), steps shrink in proportion to the global batch below B_simple and
// stop shrinking well above it. Null where it was not measured.
json noise_scale_json(const S& s) {
  // Early in training, or on a noisy run, the averaged trace can still be negative: no advice.
  if (s.epochs.empty() || !std::isfinite(s.epochs.back().noise_b_simple) ||
      s.epochs.back().noise_b_simple <= 0)
    return nullptr;
  const EpochMetrics& m = s.epochs.back();
  const double per_replica = static_cast<double>(s.cfg.global_batch()) / s.cfg.gpus;
  const double replicas = m.noise_b_simple / per_replica;
  json j;
  j["b_simple"] = m.noise_b_simple;
  j["gradient_sq_norm"] = number_or_null(m.noise_g2);
  j["trace_covariance"] = number_or_null(m.noise_trace);
  j["critical_replicas"] = number_or_null(replicas);
  j["advice"] = fmt::format(
      "B_simple {:.0f}: up to a global batch of about {:.0f} ({:.1f} replicas of {:g}), more "
      "replicas cut the steps to a given loss nearly in proportion; well beyond it they stop "
      "paying (the estimate grows as training goes on)",
      m.noise_b_simple, m.noise_b_simple, replicas, per_replica);
  return j;
}

// GPU runs: what the CUDA backend held at most on each of this process's GPUs.
json peak_device_json(const S& s) {
  if (s.info.peak_device_mib.empty()) return absent();
  json dev = json::object();
  for (const auto& [gpu, mib] : s.info.peak_device_mib) dev[fmt::format("cuda:{}", gpu)] = mib;
  return dev;
}

json text_or_absent(const std::string& v) { return v.empty() ? absent() : json(v); }

// A language model on bytes: its loss in nats per byte as bits per byte (the yardstick of
// byte-level models); other data has none.
json bits_per_byte(const S& s, double nats) {
  if (s.cfg.data.dataset != DatasetKind::bytes) return absent();
  return number_or_null(nats / std::log(2.0));
}

// Where the targets were first reached: a scoring between steps (train.eval_steps), else the end
// of the first epoch that reached them; none where they were not (or none is set).
// Every "to target" field comes from the same point, so that they agree.
struct TargetPoint {
  int64_t steps = 0, samples = 0;
  int epoch = 0;        // the epoch in which it was reached (at its end, without eval_steps)
  double time_s = 0;    // training time until then
};
std::optional<TargetPoint> target_point(const S& s) {
  const Targets targets{s.cfg.train.target_accuracy, s.cfg.train.target_loss};
  for (const EvalPoint& p : s.evals)
    if (targets.reached(p)) return TargetPoint{p.global_step, p.samples, p.epoch, p.train_time_s};
  if (!s.stats.epochs_to_target || !s.stats.time_to_target_s) return std::nullopt;
  TargetPoint t;
  for (int e = 0; e < *s.stats.epochs_to_target && e < static_cast<int>(s.epochs.size()); ++e)
    t.samples += s.epochs[static_cast<size_t>(e)].samples;
  t.steps = *s.stats.epochs_to_target * s.info.steps_per_epoch;
  t.epoch = *s.stats.epochs_to_target;
  t.time_s = *s.stats.time_to_target_s;
  return t;
}

// The steps between two scorings of the test set, at most: what steps_to_target is known to.
int64_t target_resolution(const S& s) {
  const int64_t epoch = s.info.steps_per_epoch;
  const int64_t every = s.cfg.train.eval_steps;
  return every > 0 && (every < epoch || epoch <= 0) ? every : epoch;
}

// What the run reached, and how long it took.
std::vector<SummaryField> outcome_fields() {
  namespace k = summary_key;
  return {
      {k::run_id, T::string, false, "", "the run's id, its folder's name", "", true,
       [](const S& s) -> json { return s.run_id; }},
      {k::experiment, T::string, false, "", "the config's name", "name", true,
       [](const S& s) -> json { return s.cfg.name; }},
      {k::group, T::string, false, "",
       "every override but gpus, in key order (`lr0.1-epochs2` for `train.epochs=2 "
       "optimizer.lr=0.1`): runs of a group share a baseline",
       "", true, [](const S& s) -> json { return s.group; }},
      {k::status, T::string, false, "", "done, diverged, failed or interrupted", "", true,
       [](const S& s) -> json { return s.status; }},
      {k::error, T::string, false, "", "why the run failed or was stopped", "", false,
       [](const S& s) { return text_or_absent(s.error); }},
      {k::final_test_accuracy, T::number, true, "", "test accuracy after the last epoch (0 to 1)",
       "", true, [](const S& s) { return number_or_null(s.stats.final_test_acc); }},
      {k::best_test_accuracy, T::number, true, "", "best test accuracy of any epoch", "", true,
       [](const S& s) { return number_or_null(s.stats.best_test_acc); }},
      {k::final_train_loss, T::number, true, "", "training loss of the last epoch", "", true,
       [](const S& s) { return number_or_null(s.stats.final_train_loss); }},
      {k::final_test_loss, T::number, true, "", "test loss after the last epoch", "", true,
       [](const S& s) { return number_or_null(s.stats.final_test_loss); }},
      {k::final_train_bits_per_byte, T::number, true, "bit",
       "dataset: bytes: final_train_loss (nats per byte) over ln 2", "", false,
       [](const S& s) { return bits_per_byte(s, s.stats.final_train_loss); }},
      {k::final_test_bits_per_byte, T::number, true, "bit",
       "dataset: bytes: final_test_loss (nats per byte) over ln 2", "", false,
       [](const S& s) { return bits_per_byte(s, s.stats.final_test_loss); }},
      {k::median_epoch_time_s, T::number, true, "s", "median of metrics.csv's epoch_time_s", "",
       true, [](const S& s) { return number_or_null(s.stats.median_epoch_time_s); }},
      {k::samples_per_s, T::number, true, "1/s", "median of metrics.csv's samples_per_s", "", true,
       [](const S& s) { return number_or_null(s.stats.median_samples_per_s); }},
      {k::total_train_time_s, T::number, true, "s", "sum of epoch_time_s", "", true,
       [](const S& s) { return number_or_null(s.stats.total_train_time_s); }},
      {k::exchange_bytes_per_step, T::integer, false, "B", "bytes all-reduced per optimizer step",
       "", true,
       [](const S& s) -> json { return s.info.param_count * static_cast<int64_t>(sizeof(float)); }},
      {k::busbw_gbps, T::number, true, "GB/s", "median busbw over the epochs (null at one replica)",
       "", true, [](const S& s) { return number_or_null(s.stats.median_busbw_gbps); }},
      {k::other_cores_max, T::number, true, "cores",
       "the most cores other work kept busy in an epoch (metrics.csv's other_cores)", "", true,
       [](const S& s) { return number_or_null(s.stats.max_other_cores); }},
      {k::exposed_exchange_share, T::number, true, "",
       "median share of the epoch the exchange was exposed", "", true,
       [](const S& s) { return number_or_null(s.stats.median_exposed_share); }},
      {k::exposed_input_share, T::number, true, "",
       "median share of the epoch steps waited for input (dataset: folder; else null)", "", true,
       [](const S& s) { return number_or_null(s.stats.median_input_share); }},
  };
}

// Targets and epochs.
std::vector<SummaryField> target_fields() {
  namespace k = summary_key;
  return {
      {k::target_accuracy, T::number, false, "", "the accuracy time_to_target_s is measured to",
       "train.target_accuracy", true,
       [](const S& s) -> json { return s.cfg.train.target_accuracy; }},
      {k::target_loss, T::number, false, "",
       "the test loss time_to_target_s is measured to (0: none)", "train.target_loss", true,
       [](const S& s) -> json { return s.cfg.train.target_loss; }},
      {k::time_to_target_s, T::number, true, "s",
       "training time until the targets were first reached, at a scoring between steps "
       "(train.eval_steps) or an epoch's end (null: not reached, or no target)",
       "", true, [](const S& s) -> json {
         const auto t = target_point(s);
         return t ? json(t->time_s) : json(nullptr);
       }},
      {k::epochs_to_target, T::integer, true, "", "the epoch in which that was", "", true,
       [](const S& s) -> json {
         const auto t = target_point(s);
         return t ? json(t->epoch) : json(nullptr);
       }},
      {k::steps_to_target, T::integer, true, "", "optimizer steps until then", "", true,
       [](const S& s) -> json {
         const auto t = target_point(s);
         return t ? json(t->steps) : json(nullptr);
       }},
      {k::samples_to_target, T::integer, true, "", "training samples seen until then", "", true,
       [](const S& s) -> json {
         const auto t = target_point(s);
         return t ? json(t->samples) : json(nullptr);
       }},
      {k::target_resolution_steps, T::integer, false, "",
       "steps_to_target is known to within this many steps: train.eval_steps, or an epoch's",
       "", true, [](const S& s) -> json { return target_resolution(s); }},
      {k::epochs_completed, T::integer, false, "", "epochs finished", "", true,
       [](const S& s) -> json { return s.epochs.size(); }},
      {k::epochs_planned, T::integer, false, "", "epochs asked for", "train.epochs", true,
       [](const S& s) -> json { return s.cfg.train.epochs; }},
  };
}

// The batch and the learning rate: most repeat a config value.
std::vector<SummaryField> batch_fields() {
  namespace k = summary_key;
  return {
      {k::gpus, T::integer, false, "", "replicas", "gpus", true,
       [](const S& s) -> json { return s.cfg.gpus; }},
      {k::per_replica_batch, T::integer, false, "",
       "samples per replica per micro-step (train.per_replica_batch, or train.global_batch over "
       "replicas and micro-steps)",
       "", true, [](const S& s) -> json { return s.cfg.micro_batch(); }},
      {k::accumulation_steps, T::integer, false, "", "micro-steps per optimizer step",
       "train.accumulation_steps", true,
       [](const S& s) -> json { return s.cfg.train.accumulation_steps; }},
      {k::global_batch, T::integer, false, "", "samples per optimizer step, all replicas", "", true,
       [](const S& s) -> json { return s.cfg.global_batch(); }},
      {k::lr, T::number, false, "", "the learning rate at base_batch", "optimizer.lr", true,
       [](const S& s) -> json { return s.cfg.optimizer.lr; }},
      {k::base_batch, T::integer, false, "", "the batch lr is given for", "optimizer.base_batch",
       true, [](const S& s) -> json { return s.cfg.optimizer.base_batch; }},
      {k::lr_scaling, T::string, false, "", "how lr scales with the global batch",
       "optimizer.lr_scaling", true,
       [](const S& s) -> json { return to_string(s.cfg.optimizer.lr_scaling); }},
      {k::peak_lr, T::number, false, "", "the learning rate after scaling and warmup", "", true,
       // A run that failed before its first step never set it: the config's, as it would.
       [](const S& s) -> json {
         return s.info.peak_lr > 0 ? s.info.peak_lr
                                   : scaled_lr(s.cfg.optimizer, s.cfg.global_batch());
       }},
      {k::warmup_epochs, T::number, false, "", "epochs of learning rate warmup",
       "optimizer.warmup_epochs", true,
       [](const S& s) -> json { return s.cfg.optimizer.warmup_epochs; }},
      {k::schedule, T::string, false, "", "the learning rate schedule", "optimizer.schedule", true,
       [](const S& s) -> json { return to_string(s.cfg.optimizer.schedule); }},
      {k::optimizer, T::string, false, "", "the optimizer", "optimizer.type", true,
       [](const S& s) -> json { return to_string(s.cfg.optimizer.type); }},
  };
}

// The data order and the seed: each repeats a config value.
std::vector<SummaryField> order_fields() {
  namespace k = summary_key;
  return {
      {k::reduction, T::string, false, "", "how gradients are combined", "train.reduction", true,
       [](const S& s) -> json { return to_string(s.cfg.train.reduction); }},
      {k::shuffle, T::string, false, "", "how the training set is shuffled", "data.shuffle", true,
       [](const S& s) -> json { return to_string(s.cfg.data.shuffle); }},
      {k::sharding, T::string, false, "", "how it is split among replicas", "data.sharding", true,
       [](const S& s) -> json { return to_string(s.cfg.data.sharding); }},
      {k::sort_by_label, T::boolean, false, "", "the training set sorted by label",
       "data.sort_by_label", true, [](const S& s) -> json { return s.cfg.data.sort_by_label; }},
      {k::seed, T::integer, false, "", "the run's seed", "train.seed", true,
       [](const S& s) -> json { return s.cfg.train.seed; }},
  };
}

// Where and how the replicas ran.
std::vector<SummaryField> machine_fields() {
  namespace k = summary_key;
  return {
      {k::backend, T::string, false, "", "where the replicas ran: cpu or cuda", "", true,
       [](const S& s) -> json { return s.info.backend; }},
      {k::precision, T::string, false, "", "the arithmetic: fp32, tf32 or bf16", "", true,
       [](const S& s) -> json { return s.info.precision; }},
      {k::launches_per_step, T::integer, false, "",
       "GPU kernels and library calls per training step", "", false,
       [](const S& s) -> json {
         return s.info.launches_per_step > 0 ? json(s.info.launches_per_step) : absent();
       }},
      {k::cuda_graph, T::string, false, "", "on, or off with the reason (GPU runs)", "", false,
       [](const S& s) { return text_or_absent(s.info.cuda_graph); }},
      {k::cuda_graph_steps, T::integer, false, "", "steps launched as CUDA graphs", "", false,
       [](const S& s) -> json {
         return s.info.cuda_graph.empty() ? absent() : json(s.info.cuda_graph_steps);
       }},
      {k::devices, T::string, false, "", "the devices, in words", "", true,
       [](const S& s) -> json { return s.info.devices; }},
      {k::replica_mode, T::string, false, "", "one replica, threads, shared or processes", "",
       false, [](const S& s) { return text_or_absent(s.info.replica_mode); }},
      {k::placement, T::string, false, "", "each rank's host and local rank, under a launcher", "",
       false, [](const S& s) { return text_or_absent(s.info.placement); }},
      {k::peak_rss_mib, T::number, false, "MiB", "the process's peak resident memory", "", true,
       [](const S& s) -> json { return s.peak_rss_mib; }},
      {k::peak_device_mib, T::object, false, "MiB",
       "per GPU (\"cuda:0\": ...), the most memory the backend held", "", false,
       [](const S& s) { return peak_device_json(s); }},
      {k::blas, T::string, false, "", "the OpenBLAS build and kernel family", "", true,
       [](const S& s) -> json { return s.info.blas; }},
  };
}

// The model and the data, and what the run says about them.
std::vector<SummaryField> model_fields() {
  namespace k = summary_key;
  return {
      {k::model, T::string, false, "", "the model, in words", "", true,
       [](const S& s) -> json { return s.info.model; }},
      {k::param_count, T::integer, false, "", "trainable parameters", "", true,
       [](const S& s) -> json { return s.info.param_count; }},
      {k::data, T::string, false, "", "the data set, in words", "", true,
       [](const S& s) -> json { return s.info.data; }},
      {k::steps_per_epoch, T::integer, false, "", "optimizer steps per epoch", "", true,
       [](const S& s) -> json { return s.info.steps_per_epoch; }},
      {k::noise_scale, T::object, true, "",
       "the last epoch's gradient noise scale and its advice (null: not measured)", "", true,
       [](const S& s) { return noise_scale_json(s); }},
      {k::utilisation, T::object, false, "",
       "FLOPs per sample (forward, backward), achieved TFLOP/s per replica (median epoch), a "
       "replica's peak and its source, and their ratio (model FLOPs utilisation)",
       "", true, [](const S& s) { return utilisation_json(s); }},
      {k::stragglers, T::array, false, "",
       "CPU runs of several replicas: each epoch that named a straggler, with its rank, phase "
       "and median excess (empty where none)",
       "", false, [](const S& s) { return stragglers_json(s); }},
  };
}

// Everything in force, and where and when the run was made.
std::vector<SummaryField> provenance_fields() {
  namespace k = summary_key;
  return {
      // Every value in force, through the same schema as config.resolved.yaml: `report --by`
      // reads any key from here.
      {k::config, T::object, false, "", "every config value in force, as config.resolved.yaml",
       "", true, [](const S& s) { return config_to_json(s.cfg); }},
      {k::git_sha, T::string, false, "",
       "the commit the binary was built from, with `-dirty` where tracked files had changed "
       "since it (`unknown`: built outside git)",
       "", true, [](const S&) -> json { return kGitSha; }},
      {k::dtrain_version, T::string, false, "", "the build's version", "", true,
       [](const S&) -> json { return kVersion; }},
      {k::started_at, T::string, false, "", "UTC start time", "", true,
       [](const S& s) -> json { return s.started_at; }},
      {k::finished_at, T::string, false, "", "UTC time the summary was written", "", true,
       [](const S& s) -> json { return s.finished_at; }},
      {k::wall_time_s, T::number, false, "s", "time from start to the summary", "", true,
       [](const S& s) -> json { return s.wall_time_s; }},
  };
}

}  // namespace

const char* to_string(SummaryType t) {
  switch (t) {
    case T::string: return "string";
    case T::number: return "number";
    case T::integer: return "integer";
    case T::boolean: return "boolean";
    case T::object: return "object";
    case T::array: return "array";
  }
  return "?";
}

const std::vector<SummaryField>& summary_fields() {
  static const std::vector<SummaryField> fields = [] {
    std::vector<SummaryField> all;
    for (auto group : {outcome_fields, target_fields, batch_fields, order_fields, machine_fields,
                       model_fields, provenance_fields}) {
      std::vector<SummaryField> part = group();
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return fields;
}

json summary_json(const SummarySource& s) {
  json j = json::object();
  for (const SummaryField& f : summary_fields()) {
    json v = f.value(s);
    if (!v.is_discarded()) j[f.name] = std::move(v);
  }
  return j;
}

bool has_declared_type(const SummaryField& f, const json& v) {
  if (v.is_null()) return f.nullable;
  switch (f.type) {
    case T::string: return v.is_string();
    case T::number: return v.is_number();
    case T::integer: return v.is_number_integer();
    case T::boolean: return v.is_boolean();
    case T::object: return v.is_object();
    case T::array: return v.is_array();
  }
  return false;
}

std::string summary_type_error(const json& summary) {
  if (!summary.is_object()) return "not a JSON object";
  for (const SummaryField& f : summary_fields()) {
    const auto it = summary.find(f.name);
    if (it == summary.end() || has_declared_type(f, *it)) continue;
    if (f.type == T::integer && it->is_number_float() &&
        std::floor(it->get<double>()) == it->get<double>())
      continue;  // a whole number written as 64.0, as a script's rewrite may
    std::string shown = it->dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    const bool vowel = f.type == T::integer || f.type == T::object || f.type == T::array;
    return fmt::format("'{}' is {}; dtrain writes {} {}{}", f.name, shown, vowel ? "an" : "a",
                       to_string(f.type), f.nullable ? " or null" : "");
  }
  return "";
}

}  // namespace dtrain
