#include "dtrain/results/time_gap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.hpp"
#include "dtrain/base/json.hpp"

namespace dtrain {

namespace {

// The median epoch's phases: the epoch after the first whose time is
// the median (the lower of the two middle ones), every phase from that one epoch.
struct Phases {
  double epoch = 0, data = 0, compute = 0, optimizer = 0, exposed = 0, busy0 = 0, busy_max = 0;
  double bn_sync = 0;  // part of compute
  int epochs = 0;
};

Phases phases_of(const std::vector<EpochMetrics>& all, const char* which) {
  if (all.empty()) throw UserError(fmt::format("explain-time: the {} run has no epochs", which));
  // The first epoch carries the start (memory touched for the first time, kernels generated):
  // alone, it would put that in the waterfall.
  if (all.size() < 2)
    throw UserError(
        fmt::format("explain-time: the {} run has 1 epoch; the time gap is read "
                    "from the epochs after the first, which carries the start: "
                    "run at least 2 epochs (train.epochs=2)",
                    which));
  std::vector<EpochMetrics> e(all.begin() + 1, all.end());
  constexpr double kMaxSeconds = 1e9;  // 31 years an epoch: more is a damaged file
  for (const EpochMetrics& m : e)
    for (const auto& [column, v] : {std::pair{"epoch_time_s", m.epoch_time_s},
                                    {"data_s", m.data_s},
                                    {"compute_s", m.compute_s},
                                    {"optimizer_s", m.optimizer_s},
                                    {"exchange_exposed_s", m.exchange_exposed_s},
                                    {"rank_busy_max_s", m.rank_busy_max_s},
                                    {"bn_sync_s", m.bn_sync_s}})
      if (!(std::isfinite(v) && v >= 0 && v <= kMaxSeconds) || !(m.epoch_time_s > 0))
        throw UserError(
            fmt::format("explain-time: the {} run's epoch {} has {} {}, not a number of seconds "
                        "in [0, 1e9] (and epoch_time_s above 0); its metrics.csv is damaged",
                        which, m.epoch, column, v));
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
  p.bn_sync = std::min(m.bn_sync_s, m.compute_s);
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
       (l.compute - l.bn_sync) - (s.compute - s.bn_sync) * share, {}},
      {"data", "rank 0's batch fetching over its share", l.data - s.data * share, {}},
      {"optimizer", "rank 0's update over its share (with shared weights: the wait for the rank "
                    "that runs it)",
       l.optimizer - s.optimizer * share, {}},
      {"waiting", "for the busiest rank: its busy time over rank 0's", waiting, {}},
      {"exchange", "the exposed gradient exchange, less the waiting",
       l.exposed - waiting - s.exposed * share, {}},
  };
  // Synchronised BatchNorm: its exchanges inside forward and backward, apart from compute.
  if (l.bn_sync > 0 || s.bn_sync > 0)
    g.terms.push_back({"bn sync", "synchronised BatchNorm's exchanges in forward and backward",
                       l.bn_sync - s.bn_sync * share, {}});
  double sum = g.ideal;
  for (const TimeGapTerm& t : g.terms) sum += t.seconds;
  g.terms.push_back({"the rest", "loop overhead and the epoch's end", l.epoch - sum, {}});
  g.small_data = s.data;
  g.small_compute = s.compute;
  g.small_optimizer = s.optimizer;
  g.small_exposed = s.exposed;
  return g;
}

void add_projection(TimeGap& g, const ProjectedEpoch& p) {
  const double share = static_cast<double>(g.replicas_small) / g.replicas_large;
  const auto steps = static_cast<double>(p.steps_per_epoch);
  const auto predicted = [&](const std::string& term) {
    if (term == "compute") return steps * p.compute_s - g.small_compute * share;
    if (term == "data") return steps * p.data_s - g.small_data * share;
    if (term == "optimizer") return steps * p.optimizer_s - g.small_optimizer * share;
    if (term == "exchange") return steps * p.exposed_s - g.small_exposed * share;
    return 0.0;  // waiting and synchronised BatchNorm: the model has neither
  };
  double sum = g.ideal;
  for (size_t i = 0; i + 1 < g.terms.size(); ++i) {
    const double v = predicted(g.terms[i].name);
    g.terms[i].projected.push_back(v);
    sum += v;
  }
  g.terms.back().projected.push_back(p.epoch_s - sum);
  g.projections.push_back(p);
}

std::optional<ProjectedEpoch> projected_epoch(const std::string& text, const std::string& path,
                                              int gpus) {
  const auto bad = [&](const std::string& why) {
    return UserError(fmt::format("{}: not a projection dtrain project wrote ({})", path, why));
  };
  nlohmann::json j;
  try {
    JsonKeys keys;
    j = nlohmann::json::parse(
        text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          // dtrain writes 3 levels; a deeper file is refused before it is built.
          if (depth > 8) throw bad("nested deeper than 8 levels");
          if (const std::string key = keys.repeated(event, parsed); !key.empty())
            throw bad(fmt::format("key '{}' given twice in one object",
                                  printable(key.substr(0, 40), true)));
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    throw bad(json_error_text(e.what()));
  }
  // Times and counts dtrain project can write: at most a day a step, a year an epoch, 10^15
  // steps an epoch (a count of GPUs: whole).
  const auto number = [&](const nlohmann::json& o, const char* key, double hi = 86400) {
    if (!o.is_object() || !o.contains(key) || !o[key].is_number())
      throw bad(fmt::format("no number '{}'", key));
    const double v = o[key].get<double>();
    if (!(std::isfinite(v) && v >= 0 && v <= hi)) throw bad(fmt::format("'{}' is {}", key, v));
    return v;
  };
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array() || !j.contains("link") ||
      !j["link"].is_object() || !j["link"].contains("name") || !j["link"]["name"].is_string())
    throw bad("no link name or rows");
  const nlohmann::json& step = j.contains("step_1_replica_s") ? j["step_1_replica_s"] : j;
  for (const nlohmann::json& row : j["rows"]) {
    if (number(row, "gpus", 1 << 20) != gpus) continue;
    ProjectedEpoch p;
    p.link = j["link"]["name"].get<std::string>();
    p.steps_per_epoch = static_cast<int64_t>(number(row, "steps_per_epoch", 1e15));
    p.data_s = number(step, "data");
    p.compute_s = number(step, "compute");
    p.optimizer_s = number(step, "optimizer");
    p.exposed_s = number(row, "exposed_s");
    p.epoch_s = number(row, "epoch_s", 3.2e7);
    return p;
  }
  return std::nullopt;
}

std::string to_markdown(const TimeGap& g) {
  // Epochs under 0.1 s in milliseconds: their terms would otherwise all read 0.000.
  const bool ms = std::max(g.measured_small, g.measured_large) < 0.1;
  const double k = ms ? 1000 : 1;
  std::string proj_head, proj_rule;
  for (const ProjectedEpoch& p : g.projections) {
    proj_head += fmt::format(" projected ({}) |", p.link);
    proj_rule += "---|";
  }
  std::string md = fmt::format(
      "Epoch time of {} replicas against {} (median epoch after the first: {} and {} epochs), "
      "from the ideal (the smaller run's epoch shared out) to the measured.\n\n"
      "| | {} per epoch | share of the gap |{} what |\n|---|---|---|{}---|\n",
      g.replicas_large, g.replicas_small, g.epochs_large, g.epochs_small,
      ms ? "milliseconds" : "seconds", proj_head, proj_rule);
  const double gap = g.measured_large - g.ideal;
  std::string ideal_cells;
  for (size_t i = 0; i < g.projections.size(); ++i)
    ideal_cells += fmt::format(" {:.3f} |", k * g.ideal);
  md += fmt::format(
      "| ideal ({:.3f} {} x {}/{}) | {:.3f} | |{} the smaller run's epoch, shared "
      "out |\n",
      k * g.measured_small, ms ? "ms" : "s", g.replicas_small, g.replicas_large, k * g.ideal,
      ideal_cells);
  for (const TimeGapTerm& t : g.terms) {
    const double pct = gap != 0 ? 100 * t.seconds / gap : 0;
    std::string cells;
    for (double v : t.projected) cells += fmt::format(" {:+.3f} |", k * v);
    md += fmt::format("| + {} | {:+.3f} | {} |{} {} |\n", t.name, k * t.seconds,
                      gap == 0 ? "-" : fmt::format("{:.0f}%", std::abs(pct) < 0.5 ? 0.0 : pct),
                      cells, t.meaning);
  }
  std::string totals;
  for (const ProjectedEpoch& p : g.projections) totals += fmt::format(" {:.3f} |", k * p.epoch_s);
  md += fmt::format("| = measured | {:.3f} | |{} speedup {:.2f}x of {}x |\n", k * g.measured_large,
                    totals, g.measured_small / g.measured_large,
                    static_cast<double>(g.replicas_large) / g.replicas_small);
  if (!g.projections.empty())
    md += "\nProjected: what `dtrain project` predicted from the smaller run (a model of the "
          "exchange on a link: no contention for cores or devices, no stragglers), term by term; "
          "its last line is the projected epoch.\n";
  return md;
}

std::string to_json(const TimeGap& g) {
  nlohmann::json terms = nlohmann::json::array();
  for (const TimeGapTerm& t : g.terms) {
    nlohmann::json projected = nlohmann::json::object();
    for (size_t i = 0; i < t.projected.size(); ++i)
      projected[g.projections[i].link] = t.projected[i];
    terms.push_back({{"name", t.name}, {"seconds", t.seconds}, {"meaning", t.meaning},
                     {"projected", projected}});
  }
  nlohmann::json projections = nlohmann::json::array();
  for (const ProjectedEpoch& p : g.projections)
    projections.push_back({{"link", p.link}, {"epoch_s", p.epoch_s}});
  return json_text(nlohmann::json{{"replicas_small", g.replicas_small},
                                  {"replicas_large", g.replicas_large},
                                  {"epochs_small", g.epochs_small},
                                  {"epochs_large", g.epochs_large},
                                  {"measured_small_s", g.measured_small},
                                  {"ideal_s", g.ideal},
                                  {"measured_large_s", g.measured_large},
                                  {"terms", terms},
                                  {"projections", projections}},
                   2) +
         "\n";
}

}  // namespace dtrain
