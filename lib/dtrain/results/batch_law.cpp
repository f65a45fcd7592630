#include "dtrain/results/batch_law.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/results/metrics.hpp"

namespace dtrain {

namespace {

// One LR's runs at one batch.
BatchLawRow summarize_lr(long long batch, double lr, const std::vector<const RunRecord*>& rs) {
  BatchLawRow row;
  row.global_batch = batch;
  row.lr = lr;
  row.runs = static_cast<int>(rs.size());
  double sum = 0;
  for (const RunRecord* r : rs) {
    row.diverged += r->status == "diverged" ? 1 : 0;
    if (const auto steps = steps_to_target(*r)) {
      ++row.reached;
      sum += *steps;
      row.resolution = std::max(row.resolution, resolution_steps(*r));
    }
  }
  row.steps = row.reached > 0 ? sum / row.reached : 0;
  row.samples = row.steps * static_cast<double>(batch);
  return row;
}

// Better: all runs reached the target, and then fewer mean steps; among learning rates where
// some run missed it, a larger share of runs that reached it, then fewer steps. (How many
// seeds an LR had says nothing of how well it trains: an LR run at more seeds is not preferred.)
bool better(const BatchLawRow& a, const BatchLawRow& b) {
  const bool all_a = a.reached == a.runs, all_b = b.reached == b.runs;
  if (all_a != all_b) return all_a;
  const int64_t share_a = int64_t{a.reached} * b.runs, share_b = int64_t{b.reached} * a.runs;
  if (!all_a && share_a != share_b) return share_a > share_b;
  return a.steps < b.steps;
}

std::optional<double> median_b_simple(const std::vector<RunRecord>& runs) {
  std::vector<double> v;
  for (const RunRecord& r : runs)
    if (finished(r) && r.noise_b_simple && std::isfinite(*r.noise_b_simple) &&
        *r.noise_b_simple > 0)
      v.push_back(*r.noise_b_simple);
  if (v.empty()) return std::nullopt;
  return median(std::move(v));
}

}  // namespace

bool finished(const RunRecord& r) { return r.status == "done" || r.status == "diverged"; }

std::optional<double> steps_to_target(const RunRecord& r) {
  const auto count = [&](const char* key, double v) {
    if (!(std::isfinite(v) && v >= 0))
      throw UserError(fmt::format("{}: {} {} is not a count (a damaged summary.json?)", r.dir,
                                  key, v));
    return v;
  };
  if (r.steps_to_target) return count("steps_to_target", *r.steps_to_target);
  if (!r.epochs_to_target || r.steps_per_epoch <= 0) return std::nullopt;
  return count("epochs_to_target", *r.epochs_to_target) * static_cast<double>(r.steps_per_epoch);
}

double resolution_steps(const RunRecord& r) {
  return r.target_resolution_steps && *r.target_resolution_steps > 0
             ? *r.target_resolution_steps
             : static_cast<double>(r.steps_per_epoch);
}

KeptLrs kept_runs(const std::vector<RunRecord>& runs) {
  KeptLrs kept;
  std::map<long long, std::map<double, std::vector<const RunRecord*>>> by_batch;
  const RunRecord* first = nullptr;
  for (const RunRecord& r : runs) {
    if (!finished(r)) continue;
    if (!first) first = &r;
    if (r.target_accuracy != first->target_accuracy || r.target_loss != first->target_loss)
      throw UserError(fmt::format(
          "{} and {} have different targets (accuracy {} and {}, loss {} and {}); steps to one "
          "target are compared",
          first->dir, r.dir, first->target_accuracy, r.target_accuracy, first->target_loss,
          r.target_loss));
    by_batch[r.global_batch][r.peak_lr].push_back(&r);
  }
  if (first) {
    kept.target_accuracy = first->target_accuracy;
    kept.target_loss = first->target_loss;
  }
  for (const auto& [batch, lrs] : by_batch) {
    std::optional<KeptRuns> best;
    const size_t from = kept.tried.size();
    for (const auto& [lr, rs] : lrs) {
      KeptRuns k{summarize_lr(batch, lr, rs), rs};
      k.row.lrs_tried = static_cast<int>(lrs.size());
      kept.tried.push_back(k.row);
      if (!best || better(k.row, best->row)) best = std::move(k);
    }
    best->row.kept = true;
    for (size_t i = from; i < kept.tried.size(); ++i)
      kept.tried[i].kept = kept.tried[i].lr == best->row.lr;
    kept.batches.push_back(std::move(*best));
  }
  return kept;
}

BatchLaw batch_law(const std::vector<RunRecord>& runs) {
  BatchLaw law;
  const KeptLrs kept = kept_runs(runs);
  law.target_accuracy = kept.target_accuracy;
  law.target_loss = kept.target_loss;
  law.tried = kept.tried;
  std::vector<double> b, s;
  for (const KeptRuns& k : kept.batches) {
    if (k.row.reached == 0) {
      law.never_reached.push_back(k.row.global_batch);
      continue;
    }
    law.rows.push_back(k.row);
    b.push_back(static_cast<double>(k.row.global_batch));
    s.push_back(k.row.steps);
  }
  law.fit = fit_batch_law(b, s);
  law.b_simple = median_b_simple(runs);
  return law;
}

std::string target_text(double accuracy, double loss) {
  return loss > 0 && accuracy > 0 ? fmt::format("test accuracy {}, test loss {}", accuracy, loss)
         : loss > 0               ? fmt::format("test loss {}", loss)
                                  : fmt::format("test accuracy {}", accuracy);
}

std::string to_markdown(const BatchLaw& law) {
  if (law.target_accuracy <= 0 && law.target_loss <= 0 && law.rows.empty())
    return "No batch-size law: these runs set no target (train.target_accuracy or "
           "train.target_loss), so no run has steps to one; sweep with a target.\n";
  std::string md = fmt::format(
      "Steps to the target ({}) at each global batch, with the learning rate "
      "that took the fewest (of those whose runs all reached it), mean over the seeds that "
      "reached it; each known to within the steps between two scorings of the test set "
      "(resolution: train.eval_steps, else an epoch's).\n\n"
      "| global batch | LRs tried | best peak LR | runs | reached | steps to target | samples "
      "to target | resolution (steps) |\n|---|---|---|---|---|---|---|---|\n",
      target_text(law.target_accuracy, law.target_loss));
  for (const BatchLawRow& r : law.rows)
    md += fmt::format("| {} | {} | {:.6g} | {} | {} | {:.1f} | {:.0f} | {:.0f} |\n",
                      r.global_batch, r.lrs_tried, r.lr, r.runs, r.reached, r.steps,
                      r.samples, r.resolution);
  if (!law.never_reached.empty())
    md += fmt::format("\nNo run reached the target at global batch {}.\n",
                      fmt::join(law.never_reached, ", "));
  const BatchLawFit& f = law.fit;
  md += f.ok ? fmt::format(
                   "\nFit S = S_min (1 + B_noise / B) over {} batches: S_min = {:.1f} ± {:.1f} "
                   "steps, B_noise (the critical batch) = {:.0f} ± {:.0f} samples; rms relative "
                   "misfit {:.1f}%.\n",
                   f.points, f.s_min, f.s_min_se, f.b_noise, f.b_noise_se, 100 * f.rms_relative)
             : fmt::format("\nNo fit: {}.\n", f.why);
  md += law.b_simple ? fmt::format("Gradient noise scale B_simple measured in these runs "
                                   "(median): {:.0f} samples{}.\n",
                                   *law.b_simple,
                                   f.ok ? fmt::format(", {:.2g}x the fitted B_noise",
                                                      *law.b_simple / f.b_noise)
                                        : std::string())
                     : std::string("No run measured the gradient noise scale (it needs 2+ "
                                   "replicas or accumulation).\n");
  return md;
}

std::string tried_markdown(const BatchLaw& law) {
  std::string md = fmt::format(
      "Every learning rate tried at each global batch: its runs, how many reached the target "
      "({}) and how many diverged, and the mean steps to the target of those that reached it. "
      "The LR kept at each batch (of those whose runs all reached the target, the fewest steps; "
      "else the largest share of runs that reached it) is in bold.\n\n"
      "| global batch | peak LR | runs | reached | diverged | steps to target |\n"
      "|---|---|---|---|---|---|\n",
      target_text(law.target_accuracy, law.target_loss));
  for (const BatchLawRow& r : law.tried) {
    const std::string lr = r.kept ? fmt::format("**{:.6g}**", r.lr) : fmt::format("{:.6g}", r.lr);
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.global_batch, lr, r.runs,
                      r.reached, r.diverged,
                      r.reached > 0 ? fmt::format("{:.1f}", r.steps) : std::string("never"));
  }
  return md;
}

std::string tried_csv(const BatchLaw& law) {
  std::string csv = "global_batch,peak_lr,runs,reached,diverged,steps_to_target,kept\n";
  for (const BatchLawRow& r : law.tried)
    csv += fmt::format("{},{:.9g},{},{},{},{},{}\n", r.global_batch, r.lr, r.runs, r.reached,
                       r.diverged, r.reached > 0 ? fmt::format("{:.6g}", r.steps) : "",
                       r.kept ? 1 : 0);
  return csv;
}

std::string tried_json(const BatchLaw& law) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BatchLawRow& r : law.tried)
    rows.push_back({{"global_batch", r.global_batch},
                    {"peak_lr", r.lr},
                    {"runs", r.runs},
                    {"reached", r.reached},
                    {"diverged", r.diverged},
                    {"steps_to_target",
                     r.reached > 0 ? nlohmann::json(r.steps) : nlohmann::json(nullptr)},
                    {"kept", r.kept}});
  return json_text(rows, 2) + "\n";
}

std::string to_csv(const BatchLaw& law) {
  std::string csv = "global_batch,lrs_tried,best_peak_lr,runs,reached,steps_to_target,"
                    "samples_to_target,resolution_steps\n";
  for (const BatchLawRow& r : law.rows)
    csv += fmt::format("{},{},{:.9g},{},{},{:.6g},{:.6g},{:.6g}\n", r.global_batch, r.lrs_tried,
                       r.lr, r.runs, r.reached, r.steps, r.samples, r.resolution);
  return csv;
}

std::string to_json(const BatchLaw& law) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BatchLawRow& r : law.rows)
    rows.push_back({{"global_batch", r.global_batch}, {"lrs_tried", r.lrs_tried},
                    {"best_peak_lr", r.lr}, {"runs", r.runs}, {"reached", r.reached},
                    {"steps_to_target", r.steps}, {"samples_to_target", r.samples},
                    {"resolution_steps", r.resolution}});
  const BatchLawFit& f = law.fit;
  nlohmann::json fit = f.ok ? nlohmann::json{{"s_min", f.s_min},
                                             {"s_min_se", f.s_min_se},
                                             {"b_noise", f.b_noise},
                                             {"b_noise_se", f.b_noise_se},
                                             {"points", f.points},
                                             {"rms_relative", f.rms_relative}}
                            : nlohmann::json{{"error", f.why}};
  return json_text(nlohmann::json{{"target_accuracy", law.target_accuracy},
                                  {"target_loss", law.target_loss},
                                  {"rows", rows},
                                  {"never_reached", law.never_reached},
                                  {"fit", fit},
                                  {"b_simple", law.b_simple ? nlohmann::json(*law.b_simple)
                                                            : nlohmann::json(nullptr)}},
                   2) +
         "\n";
}

}  // namespace dtrain
