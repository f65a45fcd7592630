#include "dtrain/results/time_gap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace {

// The median epoch's phases: the epoch (after the first, where there are more) whose time is
// the median (the lower of the two middle ones), every phase from that one epoch.
struct Phases {
  double epoch = 0, data = 0, compute = 0, optimizer = 0, exposed = 0, busy0 = 0, busy_max = 0;
  int epochs = 0;
};

Phases phases_of(const std::vector<EpochMetrics>& all, const char* which) {
  if (all.empty()) throw UserError(fmt::format("explain-time: the {} run has no epochs", which));
  std::vector<EpochMetrics> e(all.begin() + (all.size() > 1 ? 1 : 0), all.end());
  for (const EpochMetrics& m : e)
    for (double v : {m.epoch_time_s, m.data_s, m.compute_s, m.optimizer_s, m.exchange_exposed_s,
                     m.rank_busy_max_s})
      if (!(std::isfinite(v) && v >= 0) || !(m.epoch_time_s > 0))
        throw UserError(fmt::format("explain-time: the {} run's epoch {} has a time that is not "
                                    "a positive number ({}); its metrics.csv is damaged",
                                    which, m.epoch, v));
  std::sort(e.begin(), e.end(), [](const EpochMetrics& a, const EpochMetrics& b) {
    return a.epoch_time_s < b.epoch_time_s;
  });
  const EpochMetrics& m = e[(e.size() - 1) / 2];
  Phases p;
  p.epochs = static_cast<int>(e.size());
  p.epoch = m.epoch_time_s;
  p.data = m.data_s;
  p.compute = m.compute_s;
  p.optimizer = m.optimizer_s;
  p.exposed = m.exchange_exposed_s;
  p.busy_max = m.rank_busy_max_s;
  p.busy0 = p.data + p.compute + p.optimizer;
  return p;
}

}  // namespace

TimeGap time_gap(const std::vector<EpochMetrics>& small, int replicas_small,
                 const std::vector<EpochMetrics>& large, int replicas_large) {
  if (!(replicas_large > replicas_small && replicas_small >= 1))
    throw UserError(fmt::format("explain-time: the second run needs more replicas than the "
                                "first ({} against {})",
                                replicas_large, replicas_small));
  const Phases s = phases_of(small, "first"), l = phases_of(large, "second");
  TimeGap g;
  g.replicas_small = replicas_small;
  g.replicas_large = replicas_large;
  g.epochs_small = s.epochs;
  g.epochs_large = l.epochs;
  g.measured_small = s.epoch;
  const double share = static_cast<double>(replicas_small) / replicas_large;
  g.ideal = s.epoch * share;
  g.measured_large = l.epoch;
  const double waiting = std::max(0.0, l.busy_max - l.busy0);
  g.terms = {
      {"compute", "rank 0's forward and backward over its share of the smaller run's",
       l.compute - s.compute * share},
      {"data", "rank 0's batch fetching over its share", l.data - s.data * share},
      {"optimizer", "rank 0's update over its share (with shared weights: the wait for the rank "
                    "that runs it)",
       l.optimizer - s.optimizer * share},
      {"waiting", "for the busiest rank: its busy time over rank 0's", waiting},
      {"exchange", "the exposed gradient exchange, less the waiting",
       l.exposed - waiting - s.exposed * share},
  };
  double sum = g.ideal;
  for (const TimeGapTerm& t : g.terms) sum += t.seconds;
  g.terms.push_back({"the rest", "loop overhead and the epoch's end", l.epoch - sum});
  return g;
}

std::string to_markdown(const TimeGap& g) {
  std::string md = fmt::format(
      "Epoch time of {} replicas against {} (median epoch after the first: {} and {} epochs), "
      "from the ideal (the smaller run's epoch shared out) to the measured.\n\n"
      "| | seconds per epoch | share of the gap | what |\n|---|---|---|---|\n",
      g.replicas_large, g.replicas_small, g.epochs_large, g.epochs_small);
  const double gap = g.measured_large - g.ideal;
  md += fmt::format("| ideal ({:.3f} s x {}/{}) | {:.3f} | | the smaller run's epoch, shared out |\n",
                    g.measured_small, g.replicas_small, g.replicas_large, g.ideal);
  for (const TimeGapTerm& t : g.terms) {
    const double pct = gap != 0 ? 100 * t.seconds / gap : 0;
    md += fmt::format("| + {} | {:+.3f} | {} | {} |\n", t.name, t.seconds,
                      gap == 0 ? "-" : fmt::format("{:.0f}%", std::abs(pct) < 0.5 ? 0.0 : pct),
                      t.meaning);
  }
  md += fmt::format("| = measured | {:.3f} | | speedup {:.2f}x of {}x |\n", g.measured_large,
                    g.measured_small / g.measured_large,
                    static_cast<double>(g.replicas_large) / g.replicas_small);
  return md;
}

std::string to_json(const TimeGap& g) {
  nlohmann::json terms = nlohmann::json::array();
  for (const TimeGapTerm& t : g.terms)
    terms.push_back({{"name", t.name}, {"seconds", t.seconds}, {"meaning", t.meaning}});
  return nlohmann::json{{"replicas_small", g.replicas_small},
                        {"replicas_large", g.replicas_large},
                        {"epochs_small", g.epochs_small},
                        {"epochs_large", g.epochs_large},
                        {"measured_small_s", g.measured_small},
                        {"ideal_s", g.ideal},
                        {"measured_large_s", g.measured_large},
                        {"terms", terms}}
             .dump(2) +
         "\n";
}

}  // namespace dtrain
