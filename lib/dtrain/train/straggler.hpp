#pragma once
// Stragglers named: which rank makes an epoch slow, and in which phase of the step.
//
// The all-reduce evens out wall time: a rank whose backward pass is 20% slower makes every
// other rank wait in the exchange, so every rank's step takes as long and its own time shows
// nothing. What does differ is each rank's busy time per phase, waits excluded: data loading,
// forward, backward (the bucket all-reduces it ran excluded), the exchange less its waits for
// the last rank to arrive at each collective, the optimizer. Each step, each rank's busy time
// in each phase is compared with the median of the other ranks'; a rank is named for a phase
// when it is slower than that by more than a threshold, by an amount that matters to the step,
// in most of the epoch's steps.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

enum class StepPhase : int { data, forward, backward, exchange, optimizer };
inline constexpr int kStepPhases = 5;
const char* to_string(StepPhase p);
// The phase named `name` (as to_string writes it), or nullopt.
std::optional<StepPhase> step_phase_named(const std::string& name);

// One rank's epoch, per step: kStepPhases busy seconds (the exchange's waits not yet taken
// out), then `arrivals` times (seconds from an origin every rank shares) at which it called the
// step's collectives, in the same order on every rank.
struct StepLog {
  int64_t steps = 0;
  int arrivals = 0;
  size_t stride() const { return static_cast<size_t>(kStepPhases + arrivals); }
};

struct StragglerRule {
  double threshold = 0.075;  // slower than the other ranks' median by more than 7.5% ...
  double floor_s = 20e-6;   // ... and by more than this many seconds (clock jitter) ...
  double floor_step = 0.01;  // ... and by more than this share of the step's busy time ...
  double share = 0.6;       // ... in at least this share of the steps
  unsigned phases = (1u << kStepPhases) - 1;  // the phases that may be named (bit p: phase p)
};

struct Straggler {
  int rank = -1;   // -1: none
  int phase = -1;  // a StepPhase, -1: none
  double excess = std::nan("");  // the median over steps of its time / the others' median - 1
  double share = 0;              // the share of steps in which it was slower than the rule
};

// From every rank's StepLog values (ranks[r]: steps x stride doubles): of the ranks and phases
// that exceed the rule in at least rule.share of the steps, the one whose median excess in
// seconds is largest (what it costs the step). None where none does (its share then: the
// largest share of any), with fewer than 2 ranks, or without steps.
Straggler name_straggler(const std::vector<std::vector<double>>& ranks, const StepLog& log,
                         const StragglerRule& rule = {});

// "rank 2 in backward: +12% in 85% of steps" (the share left out where it is 0), or "none".
std::string describe(const Straggler& s);

}  // namespace dtrain
