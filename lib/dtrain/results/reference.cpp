#include "dtrain/results/reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "dtrain/base/json.hpp"
#include "dtrain/results/batch_law.hpp"
#include "dtrain/results/stats.hpp"

namespace dtrain {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kOlympicFrom = 5;  // runs at a batch from which the fastest and slowest are left out

// A run's epochs to the target (its steps to the target over its steps per epoch: a fraction
// where it was scored between steps); none where it never reached it.
std::optional<double> epochs_to(const RunRecord& r) {
  const auto steps = steps_to_target(r);
  if (!steps || r.steps_per_epoch <= 0) return std::nullopt;
  return *steps / static_cast<double>(r.steps_per_epoch);
}

double epochs_of(const RunRecord& r) { return epochs_to(r).value_or(kInf); }

// One batch's reference from the runs of its kept LR, or why there is none.
std::optional<ReferencePoint> point_of(const KeptRuns& k, std::string& why) {
  std::vector<double> epochs;
  for (const RunRecord* r : k.runs) epochs.push_back(epochs_of(*r));
  std::sort(epochs.begin(), epochs.end());
  const int n = static_cast<int>(epochs.size());
  const int drop = n >= kOlympicFrom ? 1 : 0;
  const std::vector<double> kept(epochs.begin() + drop, epochs.end() - drop);
  const auto unreached = std::count(kept.begin(), kept.end(), kInf);
  if (unreached > 0) {
    why = fmt::format("global batch {}: {} of {} runs at LR {:g} did not reach the target",
                      k.row.global_batch, std::count(epochs.begin(), epochs.end(), kInf), n,
                      k.row.lr);
    return std::nullopt;
  }
  if (kept.size() < 2) {
    why = fmt::format("global batch {}: one run at LR {:g}, and a reference needs a spread: two "
                      "runs or more",
                      k.row.global_batch, k.row.lr);
    return std::nullopt;
  }
  ReferencePoint p;
  p.global_batch = k.row.global_batch;
  p.peak_lr = k.row.lr;
  p.runs = n;
  p.kept = static_cast<int>(kept.size());
  double sum = 0, sq = 0;
  for (double e : kept) sum += e;
  p.mean_epochs = sum / p.kept;
  for (double e : kept) sq += (e - p.mean_epochs) * (e - p.mean_epochs);
  p.sd_epochs = p.kept > 1 ? std::sqrt(sq / (p.kept - 1)) : 0;
  return p;
}

double lerp(double a, double b, double w) { return a + (b - a) * w; }

std::string number_text(const std::optional<double>& v, const char* spec = "{:.2f}") {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

nlohmann::json point_json(const ReferencePoint& p) {
  return {{"global_batch", p.global_batch}, {"peak_lr", p.peak_lr},
          {"runs", p.runs},                 {"kept", p.kept},
          {"mean_epochs", p.mean_epochs},   {"sd_epochs", p.sd_epochs},
          {"interpolated", p.interpolated}};
}

}  // namespace

Reference reference_points(const std::vector<RunRecord>& runs) {
  Reference ref;
  const KeptLrs kept = kept_runs(runs);
  ref.target_accuracy = kept.target_accuracy;
  ref.target_loss = kept.target_loss;
  for (const KeptRuns& k : kept.batches) {
    std::string why;
    if (auto p = point_of(k, why)) {
      ref.points.push_back(*p);
    } else {
      ref.left_out.push_back(why);
      ref.left_out_batches.push_back(k.row.global_batch);
    }
  }
  return ref;
}

std::optional<ReferencePoint> reference_at(const Reference& ref, long long global_batch) {
  const auto& pts = ref.points;
  const auto above = std::lower_bound(
      pts.begin(), pts.end(), global_batch,
      [](const ReferencePoint& p, long long b) { return p.global_batch < b; });
  if (above == pts.end()) return std::nullopt;
  if (above->global_batch == global_batch) return *above;
  if (above == pts.begin()) return std::nullopt;
  const ReferencePoint& lo = *(above - 1);
  const ReferencePoint& hi = *above;
  for (long long b : ref.left_out_batches)
    if (b > lo.global_batch && b < hi.global_batch) return std::nullopt;
  const double w = static_cast<double>(global_batch - lo.global_batch) /
                   static_cast<double>(hi.global_batch - lo.global_batch);
  ReferencePoint p;
  p.global_batch = global_batch;
  p.runs = std::min(lo.runs, hi.runs);
  p.kept = std::min(lo.kept, hi.kept);
  p.mean_epochs = lerp(lo.mean_epochs, hi.mean_epochs, w);
  p.sd_epochs = lerp(lo.sd_epochs, hi.sd_epochs, w);
  p.interpolated = true;
  return p;
}

const char* to_string(Convergence c) {
  switch (c) {
    case Convergence::within: return "within the reference";
    case Convergence::slower: return "slower than the reference";
    case Convergence::faster: return "faster than the reference";
    case Convergence::not_reached: return "did not reach the target";
    case Convergence::other_target: return "another target";
    case Convergence::no_reference: return "no reference at this batch";
  }
  return "?";
}

std::vector<ReferenceCheck> check_against(const Reference& ref,
                                          const std::vector<RunRecord>& runs) {
  std::vector<ReferenceCheck> out;
  for (const RunRecord& r : runs) {
    if (!finished(r)) continue;
    ReferenceCheck c;
    c.run_id = r.run_id;
    c.dir = r.dir;
    c.gpus = r.gpus;
    c.global_batch = r.global_batch;
    c.epochs = epochs_to(r);
    c.at = reference_at(ref, r.global_batch);
    if (r.target_accuracy != ref.target_accuracy || r.target_loss != ref.target_loss) {
      c.verdict = Convergence::other_target;
    } else if (r.steps_per_epoch <= 0) {
      c.verdict = Convergence::no_reference;  // epochs to target cannot be counted
    } else if (!c.epochs) {
      c.verdict = Convergence::not_reached;
    } else if (c.at) {
      const double t = t_quantile(0.975, c.at->kept - 1);  // kept >= 2 (point_of)
      const double half = t * c.at->sd_epochs * std::sqrt(1.0 + 1.0 / c.at->kept);
      c.resolution = resolution_steps(r) / static_cast<double>(r.steps_per_epoch);
      c.low = std::max(0.0, c.at->mean_epochs - half - c.resolution);
      c.high = c.at->mean_epochs + half + c.resolution;
      c.verdict = *c.epochs > c.high  ? Convergence::slower
                  : *c.epochs < c.low ? Convergence::faster
                                      : Convergence::within;
    }
    out.push_back(c);
  }
  return out;
}

std::string to_markdown(const Reference& ref) {
  std::string md = fmt::format(
      "Reference convergence points (MLPerf's procedure): epochs to the target ({}) at each "
      "global batch, over the runs of its best learning rate; the fastest and the slowest left "
      "out where a batch has {} runs or more.\n\n"
      "| global batch | peak LR | runs | kept | mean epochs to target | sd |\n"
      "|---|---|---|---|---|---|\n",
      target_text(ref.target_accuracy, ref.target_loss), kOlympicFrom);
  for (const ReferencePoint& p : ref.points)
    md += fmt::format("| {} | {:.6g} | {} | {} | {:.2f} | {:.2f} |\n", p.global_batch, p.peak_lr,
                      p.runs, p.kept, p.mean_epochs, p.sd_epochs);
  if (ref.points.empty()) md += "\nNo batch has a reference.\n";
  for (const std::string& w : ref.left_out) md += fmt::format("\nLeft out: {}.\n", w);
  return md;
}

std::string to_csv(const Reference& ref) {
  std::string csv = "global_batch,peak_lr,runs,kept,mean_epochs,sd_epochs\n";
  for (const ReferencePoint& p : ref.points)
    csv += fmt::format("{},{:.9g},{},{},{:.6g},{:.6g}\n", p.global_batch, p.peak_lr, p.runs,
                       p.kept, p.mean_epochs, p.sd_epochs);
  return csv;
}

std::string to_json(const Reference& ref) {
  nlohmann::json points = nlohmann::json::array();
  for (const ReferencePoint& p : ref.points) points.push_back(point_json(p));
  return json_text(nlohmann::json{{"target_accuracy", ref.target_accuracy},
                                  {"target_loss", ref.target_loss},
                                  {"olympic_from_runs", kOlympicFrom},
                                  {"points", points},
                                  {"left_out", ref.left_out}},
                   2) +
         "\n";
}

std::string checks_markdown(const Reference& ref, const std::vector<ReferenceCheck>& checks) {
  std::string md = fmt::format(
      "Each run against the reference at its global batch (interpolated between the study's "
      "batches): the interval one run of the reference's recipe falls in 95 times in 100, "
      "widened at each end by the run's resolution (the epochs between two scorings of its "
      "test set). Target: {}.\n\n"
      "| run | gpus | global batch | epochs to target | reference mean | interval | verdict |\n"
      "|---|---|---|---|---|---|---|\n",
      target_text(ref.target_accuracy, ref.target_loss));
  for (const ReferenceCheck& c : checks) {
    const bool judged = c.at && (c.verdict == Convergence::within ||
                                 c.verdict == Convergence::slower ||
                                 c.verdict == Convergence::faster);
    md += fmt::format("| {} | {} | {} | {} | {}{} | {} | {} |\n", c.run_id, c.gpus,
                      c.global_batch, number_text(c.epochs, "{:g}"),
                      c.at ? fmt::format("{:.2f}", c.at->mean_epochs) : "-",
                      c.at && c.at->interpolated ? " (interpolated)" : "",
                      judged ? fmt::format("{:.2f} to {:.2f}", c.low, c.high) : "-",
                      to_string(c.verdict));
  }
  return md;
}

std::string checks_csv(const std::vector<ReferenceCheck>& checks) {
  std::string csv = "run,gpus,global_batch,epochs_to_target,reference_mean,interpolated,low,"
                    "high,verdict\n";
  for (const ReferenceCheck& c : checks)
    csv += fmt::format("{},{},{},{},{},{},{:.6g},{:.6g},{}\n", csv_escape(c.run_id), c.gpus,
                       c.global_batch, c.epochs ? fmt::format("{:g}", *c.epochs) : "",
                       c.at ? fmt::format("{:.6g}", c.at->mean_epochs) : "",
                       c.at && c.at->interpolated ? 1 : 0, c.low, c.high,
                       csv_escape(to_string(c.verdict)));
  return csv;
}

std::string checks_json(const std::vector<ReferenceCheck>& checks) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ReferenceCheck& c : checks)
    rows.push_back({{"run", c.run_id},
                    {"gpus", c.gpus},
                    {"global_batch", c.global_batch},
                    {"epochs_to_target", c.epochs ? nlohmann::json(*c.epochs) : nullptr},
                    {"reference", c.at ? point_json(*c.at) : nlohmann::json(nullptr)},
                    {"resolution_epochs", c.resolution},
                    {"low", c.low},
                    {"high", c.high},
                    {"verdict", to_string(c.verdict)}});
  return json_text(rows, 2) + "\n";
}

}  // namespace dtrain
