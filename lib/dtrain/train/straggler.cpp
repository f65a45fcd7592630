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
  Tally(size_t ranks, size_t steps)
      : slower(ranks * kPer, 0), ratio(ranks * kPer), extra(ranks * kPer) {
    for (size_t k = 0; k < ratio.size(); ++k) {
      ratio[k].reserve(steps);
      extra[k].reserve(steps);
    }
    floors.reserve(steps);
  }
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
using Paces = std::vector<std::array<double, Tally::kPer>>;  // per rank

// For each rank, the median of the other ranks' values: one sort, then each rank's median is a
// fixed position of the sorted values with its own left out.
std::vector<double> others_medians(const std::vector<double>& v) {
  const size_t n = v.size(), m = n - 1;  // n >= 2
  std::vector<size_t> order(n), pos(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  for (size_t i = 0; i < n; ++i) pos[order[i]] = i;
  std::vector<double> out(n);
  for (size_t r = 0; r < n; ++r) {
    auto at = [&](size_t j) { return v[order[j < pos[r] ? j : j + 1]]; };
    out[r] = m % 2 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
  }
  return out;
}

// A step's other-rank medians: [p][r] for each phase, then [kEveryPhase][r] for the busy time
// in the phases the rule may name (`mine`).
struct StepMedians {
  StepMedians(const Busy& busy, const StragglerRule& rule) : mine(busy.size()) {
    std::vector<double> all(busy.size()), column(busy.size());
    for (size_t p = 0; p < kStepPhases; ++p) {
      for (size_t r = 0; r < busy.size(); ++r) {
        column[r] = busy[r][p];
        all[r] += busy[r][p];
        if (rule.phases >> p & 1u) mine[r] += busy[r][p];
      }
      others[p] = others_medians(column);
    }
    others[kEveryPhase] = others_medians(mine);
    step = median(all);
  }
  std::array<std::vector<double>, Tally::kPer> others;
  std::vector<double> mine;
  double step = 0;  // the median rank's busy time
};

// Each rank's pace over the epoch, the median over steps of the median of its time over the
// other ranks' median in the phases the rule may name that take at least rule.pace_share of
// the step: [p], for testing phase p, over those phases but p (at least 2, else 1), so that a
// slow phase does not raise the pace it is measured against; [kEveryPhase] over them all (at
// least 3, else 1).
Paces paces(const std::vector<Busy>& steps, const std::vector<StepMedians>& meds,
            const StragglerRule& rule) {
  const size_t n = steps.empty() ? 0 : steps[0].size();
  std::vector<std::array<std::vector<double>, Tally::kPer>> per(n);
  std::vector<double> x;
  for (size_t s = 0; s < steps.size(); ++s) {
    const Busy& busy = steps[s];
    const StepMedians& med = meds[s];
    for (size_t r = 0; r < n; ++r) {
      std::array<double, kStepPhases> ratio{};
      std::array<bool, kStepPhases> in{};
      for (size_t p = 0; p < kStepPhases; ++p) {
        const double o = med.others[p][r];
        in[p] = (rule.phases >> p & 1u) && o > 0 && o >= rule.pace_share * med.step;
        if (in[p]) ratio[p] = busy[r][p] / o;
      }
      for (size_t left = 0; left <= kStepPhases; ++left) {  // left out; kStepPhases: none
        x.clear();
        for (size_t p = 0; p < kStepPhases; ++p)
          if (in[p] && p != left) x.push_back(ratio[p]);
        const size_t need = left == kStepPhases ? 3 : 2;
        per[r][left].push_back(x.size() >= need ? median(x) : 1.0);
      }
    }
  }
  Paces out(n);
  for (size_t r = 0; r < n; ++r)
    for (size_t k = 0; k < Tally::kPer; ++k)
      out[r][k] = per[r][k].empty() ? 1.0 : median(per[r][k]);
  return out;
}

// A step's comparisons: each rank's phases against the other ranks' medians times its pace for
// that phase (at least 1: a faster rank's phases are compared as they are), and its busy time in
// the phases the rule may name against the other ranks' median.
void tally_step(const Busy& busy, const StepMedians& med, const Paces& pace,
                const StragglerRule& rule, Tally& t) {
  t.floors.push_back(std::max(rule.floor_s, rule.floor_step * med.step));
  for (size_t r = 0; r < busy.size(); ++r) {
    for (size_t p = 0; p < kStepPhases; ++p)
      t.add(r * Tally::kPer + p, busy[r][p], std::max(1.0, pace[r][p]) * med.others[p][r]);
    t.add(r * Tally::kPer + kEveryPhase, med.mine[r], med.others[kEveryPhase][r]);
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
  busy.reserve(static_cast<size_t>(log.steps));
  for (int64_t s = 0; s < log.steps; ++s) busy.push_back(busy_of_step(ranks, log, s));
  std::vector<StepMedians> meds;  // each step's, for the paces and the tally alike
  meds.reserve(busy.size());
  for (const Busy& b : busy) meds.emplace_back(b, rule);
  const Paces pace = paces(busy, meds, rule);
  Tally t(n, busy.size());
  for (size_t s = 0; s < busy.size(); ++s) tally_step(busy[s], meds[s], pace, rule, t);
  // Of the phases over the rule, the one that costs the step most; where none is, of the ranks
  // slower in every phase alike (a pace over the threshold) whose busy time as a whole is.
  const double steps = static_cast<double>(log.steps);
  Straggler out;
  for (const bool whole : {false, true}) {
    double cost = -1;
    for (size_t k = 0; k < t.slower.size(); ++k) {
      const int phase = static_cast<int>(k % Tally::kPer);
      if ((phase == kEveryPhase) != whole || !(rule.phases >> phase & 1u)) continue;
      const double share = static_cast<double>(t.slower[k]) / steps;
      const bool alike = !whole || pace[k / Tally::kPer][kEveryPhase] > 1 + rule.threshold;
      if (!alike || !t.over(k, rule)) {
        if (out.rank < 0) out.share = std::max(out.share, share);
        continue;
      }
      const double c = median(t.extra[k]);  // reorders extra[k]: over() is done with it
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
