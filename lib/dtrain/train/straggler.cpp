#include "dtrain/train/straggler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

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

Straggler name_straggler(const std::vector<std::vector<double>>& ranks, const StepLog& log,
                         const StragglerRule& rule) {
  const size_t n = ranks.size();
  if (n < 2 || log.steps <= 0) return {};
  for (const auto& v : ranks)
    if (v.size() < static_cast<size_t>(log.steps) * log.stride()) return {};
  // Per rank and phase: steps over the rule, and each step's ratio to the others' median and
  // excess seconds over it.
  std::vector<int64_t> slow(n * kStepPhases, 0);
  std::vector<std::vector<double>> ratio(n * kStepPhases), extra(n * kStepPhases);
  std::vector<double> others;
  for (int64_t s = 0; s < log.steps; ++s) {
    const auto busy = busy_of_step(ranks, log, s);
    std::vector<double> totals;
    for (const auto& b : busy) totals.push_back(b[0] + b[1] + b[2] + b[3] + b[4]);
    const double floor = std::max(rule.floor_s, rule.floor_step * median(totals));
    for (int p = 0; p < kStepPhases; ++p)
      for (size_t r = 0; r < n; ++r) {
        others.clear();
        for (size_t q = 0; q < n; ++q)
          if (q != r) others.push_back(busy[q][static_cast<size_t>(p)]);
        const double mine = busy[r][static_cast<size_t>(p)], med = median(others);
        const size_t k = r * kStepPhases + static_cast<size_t>(p);
        if (mine > med * (1 + rule.threshold) && mine - med > floor) ++slow[k];
        if (med > 0) ratio[k].push_back(mine / med);
        extra[k].push_back(mine - med);
      }
  }
  // Of the ranks and phases over the rule in enough steps, the one that costs the step most.
  const double steps = static_cast<double>(log.steps);
  Straggler out;
  double cost = -1;
  for (size_t k = 0; k < slow.size(); ++k) {
    if (!(rule.phases >> (k % kStepPhases) & 1u)) continue;
    const double share = static_cast<double>(slow[k]) / steps;
    if (share < rule.share) {
      if (out.rank < 0) out.share = std::max(out.share, share);
      continue;
    }
    const double c = median(extra[k]);
    if (c <= cost) continue;
    cost = c;
    out = {static_cast<int>(k / kStepPhases), static_cast<int>(k % kStepPhases),
           ratio[k].empty() ? std::nan("") : median(ratio[k]) - 1, share};
  }
  return out;
}

std::string describe(const Straggler& s) {
  if (s.rank < 0) return "none";
  std::string out = fmt::format("rank {} in {}: ", s.rank, to_string(static_cast<StepPhase>(s.phase)));
  out += std::isfinite(s.excess) ? fmt::format("{:+.0f}%", 100 * s.excess) : "slower";
  if (s.share > 0) out += fmt::format(" in {:.0f}% of steps", 100 * s.share);
  return out;
}

}  // namespace dtrain
