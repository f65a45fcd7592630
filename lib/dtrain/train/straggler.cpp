#include "dtrain/train/straggler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace dtrain {

namespace {

const char* const kNames[kStepPhases] = {"data", "forward", "backward", "exchange", "optimizer"};

double median(std::vector<double>& v) {
  const size_t n = v.size(), h = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  if (n % 2) return v[h];
  const double hi = v[h];
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)) + hi) / 2;
}

// Busy seconds of every rank in step s: the phases, the exchange less its waits (at each
// collective, from the rank's arrival to the last rank's).
std::vector<std::array<double, kStepPhases>> busy_of_step(
    const std::vector<std::vector<double>>& ranks, const StepLog& log, int64_t s) {
  const size_t stride = log.stride(), at = static_cast<size_t>(s) * stride;
  std::vector<std::array<double, kStepPhases>> busy(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    std::copy_n(ranks[r].begin() + static_cast<std::ptrdiff_t>(at), kStepPhases, busy[r].begin());
  const auto ex = static_cast<size_t>(StepPhase::exchange);
  for (int a = 0; a < log.arrivals; ++a) {
    const size_t i = at + kStepPhases + static_cast<size_t>(a);
    double last = ranks[0][i];
    for (const auto& v : ranks) last = std::max(last, v[i]);
    for (size_t r = 0; r < ranks.size(); ++r) busy[r][ex] -= last - ranks[r][i];
  }
  for (auto& b : busy) b[ex] = std::max(0.0, b[ex]);
  return busy;
}

// Per rank, its candidates: each phase, then its busy time as a whole (kEveryPhase): the steps
// in which it was slower than expected, and each step's ratio to that and excess seconds over
// it; and each step's floor.
struct Tally {
  static constexpr size_t kPer = kEveryPhase + 1;
  explicit Tally(size_t ranks) : slower(ranks * kPer, 0), ratio(ranks * kPer), extra(ranks * kPer) {}
  void add(size_t k, double mine, double expected) {
    if (mine > expected) ++slower[k];
    if (expected > 0) ratio[k].push_back(mine / expected);
    extra[k].push_back(mine - expected);
  }
  // Candidate k is over the rule: slower in enough steps, by a median ratio over the threshold
  // and a median excess over the floor.
  bool over(size_t k, const StragglerRule& rule) {
    const auto steps = static_cast<double>(floors.size());
    if (static_cast<double>(slower[k]) < rule.share * steps || ratio[k].empty() ||
        !(median(ratio[k]) > 1 + rule.threshold))
      return false;
    std::vector<double> margin(extra[k].size());
    for (size_t s = 0; s < margin.size(); ++s) margin[s] = extra[k][s] - floors[s];
    return median(margin) > 0;
  }
  std::vector<int64_t> slower;
  std::vector<std::vector<double>> ratio, extra;  // extra[k][s]: step s's
  std::vector<double> floors;                     // per step
};

using Busy = std::vector<std::array<double, kStepPhases>>;  // a step's, per rank

// The median of the ranks' values other than rank r's.
template <class Value>
double others_median(size_t n, size_t r, Value&& value, std::vector<double>& scratch) {
  scratch.clear();
  for (size_t q = 0; q < n; ++q)
    if (q != r) scratch.push_back(value(q));
  return median(scratch);
}

double step_median(const Busy& busy) {
  std::vector<double> all;
  for (const auto& b : busy) all.push_back(b[0] + b[1] + b[2] + b[3] + b[4]);
  return median(all);
}

// Each rank's pace over the epoch: the median over steps of the median over its phases (those
// the rule may name that take at least rule.pace_share of the step) of its time over the other
// ranks' median; 1 in a step where fewer than 3 phases do.
std::vector<double> paces(const std::vector<Busy>& steps, const StragglerRule& rule) {
  const size_t n = steps.empty() ? 0 : steps[0].size();
  std::vector<std::vector<double>> per(n);
  std::vector<double> x, scratch;
  for (const Busy& busy : steps) {
    const double step = step_median(busy);
    for (size_t r = 0; r < n; ++r) {
      x.clear();
      for (size_t p = 0; p < kStepPhases; ++p) {
        const double med = others_median(n, r, [&](size_t q) { return busy[q][p]; }, scratch);
        if ((rule.phases >> p & 1u) && med > 0 && med >= rule.pace_share * step)
          x.push_back(busy[r][p] / med);
      }
      per[r].push_back(x.size() >= 3 ? median(x) : 1.0);
    }
  }
  std::vector<double> out(n, 1.0);
  for (size_t r = 0; r < n; ++r)
    if (!per[r].empty()) out[r] = median(per[r]);
  return out;
}

// A step's comparisons: each rank's phases against the other ranks' medians times its pace (at
// least 1: a faster rank's phases are compared as they are), and its busy time in the phases
// the rule may name against the other ranks' median.
void tally_step(const Busy& busy, const std::vector<double>& pace, const StragglerRule& rule,
                Tally& t) {
  const size_t n = busy.size();
  t.floors.push_back(std::max(rule.floor_s, rule.floor_step * step_median(busy)));
  std::vector<double> mine(n), scratch;  // the nameable phases' busy time
  for (size_t r = 0; r < n; ++r)
    for (size_t p = 0; p < kStepPhases; ++p)
      if (rule.phases >> p & 1u) mine[r] += busy[r][p];
  for (size_t r = 0; r < n; ++r) {
    const double slowed = std::max(1.0, pace[r]);
    for (size_t p = 0; p < kStepPhases; ++p) {
      const double expected =
          slowed * others_median(n, r, [&](size_t q) { return busy[q][p]; }, scratch);
      t.add(r * Tally::kPer + p, busy[r][p], expected);
    }
    t.add(r * Tally::kPer + kEveryPhase, mine[r],
          others_median(n, r, [&](size_t q) { return mine[q]; }, scratch));
  }
}

}  // namespace

const char* to_string(StepPhase p) {
  const auto i = static_cast<int>(p);
  return i >= 0 && i < kStepPhases ? kNames[i] : "?";
}

std::optional<StepPhase> step_phase_named(const std::string& name) {
  for (int i = 0; i < kStepPhases; ++i)
    if (name == kNames[i]) return static_cast<StepPhase>(i);
  return std::nullopt;
}

const char* straggler_phase_name(int phase) {
  return phase == kEveryPhase ? "all" : to_string(static_cast<StepPhase>(phase));
}

std::optional<int> straggler_phase_code(const std::string& name) {
  if (name == "all") return kEveryPhase;
  if (const auto p = step_phase_named(name)) return static_cast<int>(*p);
  return std::nullopt;
}

Straggler name_straggler(const std::vector<std::vector<double>>& ranks, const StepLog& log,
                         const StragglerRule& rule) {
  const size_t n = ranks.size();
  if (n < 2 || log.steps <= 0) return {};
  for (const auto& v : ranks)
    if (v.size() < static_cast<size_t>(log.steps) * log.stride()) return {};
  std::vector<Busy> busy;
  for (int64_t s = 0; s < log.steps; ++s) busy.push_back(busy_of_step(ranks, log, s));
  const std::vector<double> pace = paces(busy, rule);
  Tally t(n);
  for (const Busy& b : busy) tally_step(b, pace, rule, t);
  // Of the phases over the rule, the one that costs the step most; where none is, of the ranks'
  // busy times as a whole.
  const double steps = static_cast<double>(log.steps);
  Straggler out;
  for (const bool whole : {false, true}) {
    double cost = -1;
    for (size_t k = 0; k < t.slower.size(); ++k) {
      const int phase = static_cast<int>(k % Tally::kPer);
      if ((phase == kEveryPhase) != whole || !(rule.phases >> phase & 1u)) continue;
      const double share = static_cast<double>(t.slower[k]) / steps;
      if (!t.over(k, rule)) {
        if (out.rank < 0) out.share = std::max(out.share, share);
        continue;
      }
      const double c = median(t.extra[k]);
      if (c <= cost) continue;
      cost = c;
      out = {static_cast<int>(k / Tally::kPer), phase, median(t.ratio[k]) - 1, share};
    }
    if (out.rank >= 0) break;
  }
  return out;
}

std::string describe(const Straggler& s) {
  if (s.rank < 0) return "none";
  std::string out =
      s.phase == kEveryPhase
          ? fmt::format("rank {} in every phase: ", s.rank)
          : fmt::format("rank {} in {}: ", s.rank, to_string(static_cast<StepPhase>(s.phase)));
  out += std::isfinite(s.excess) ? fmt::format("{:+.0f}%", 100 * s.excess) : "slower";
  if (s.share > 0) out += fmt::format(" in {:.0f}% of steps", 100 * s.share);
  return out;
}

}  // namespace dtrain
