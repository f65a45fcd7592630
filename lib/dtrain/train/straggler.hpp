#pragma once
// Stragglers named: which rank makes an epoch slow, and in which phase of the step.
//
// The all-reduce evens out wall time: a rank whose backward pass is 20% slower makes every
// other rank wait in the exchange, so every rank's step takes as long and its own time shows
// nothing. What does differ is each rank's busy time per phase, waits excluded: data loading,
// forward, backward (the bucket all-reduces it ran excluded), the exchange less its waits for
// the last rank to arrive at each collective, the optimizer. Each step, each rank's busy time
// in each phase is compared with the median of the other ranks' times the rank's own pace over
// the epoch in its other phases (a rank on a slower core or device is slower in every phase
// alike: that is its pace, not a phase's fault); a rank is named for a phase when it is slower
// than that by more than a threshold, by an amount that matters to the step, in most of the
// epoch's steps. Where no phase stands out, a rank whose pace itself is over the threshold and
// whose busy time as a whole is over the rule is named for every phase.
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
// A straggler's phase is a StepPhase or this: every phase, the rank itself slower.
inline constexpr int kEveryPhase = kStepPhases;
// A straggler's phase by name: a StepPhase's, "all" for kEveryPhase ("?" for anything else).
const char* straggler_phase_name(int phase);
std::optional<int> straggler_phase_code(const std::string& name);

// One rank's epoch, per step: kStepPhases busy seconds (the exchange's waits not yet taken
// out), then `arrivals` times (seconds from an origin every rank shares) at which it called the
// step's collectives, in the same order on every rank.
struct StepLog {
  int64_t steps = 0;
  int arrivals = 0;
  size_t stride() const { return static_cast<size_t>(kStepPhases + arrivals); }
};

// Over the epoch's steps, a rank's phase is named where its time over the expected time (the
// other ranks' median, times the rank's pace in its other phases where that is over 1) has a
// median over 1 + threshold, its excess in seconds has a median over the floor, and it was
// slower than expected in at least `share` of the steps. Medians over steps, not a vote of
// single steps: a 10% slowdown under 5% noise per step is over a 5% threshold in 84% of steps,
// its median in nearly every epoch.
struct StragglerRule {
  // Half the smallest slowdown the trials must name (10%): as far from it as from no slowdown.
  double threshold = 0.05;
  double floor_s = 20e-6;    // the floor: this many seconds (clock jitter) or ...
  double floor_step = 0.01;  // ... this share of the step's busy time, the larger
  double share = 0.6;        // slower than expected in at least this share of the steps
  // The phases that may be named (bit p: phase p; bit kEveryPhase: the rank in every phase).
  // Phases that may not be named count neither in a pace nor in a rank's busy time as a whole.
  unsigned phases = (1u << (kEveryPhase + 1)) - 1;
  // A rank's pace: the median over steps of the median over the phases that take at least this
  // share of the step of its time over the other ranks' median. For testing a phase, over the
  // others (1 in a step where fewer than 2 do); for naming the rank in every phase, over all
  // (1 where fewer than 3 do).
  double pace_share = 0.05;
};

struct Straggler {
  int rank = -1;   // -1: none
  int phase = -1;  // a StepPhase or kEveryPhase, -1: none
  // The median over steps of its time / (the others' median x its pace) - 1; for kEveryPhase,
  // of its busy time / the others' median - 1.
  double excess = std::nan("");
  double share = 0;              // the share of steps in which it was slower than expected
};

// From every rank's StepLog values (ranks[r]: steps x stride doubles): of the ranks and phases
// over the rule, the one whose median excess in seconds is largest (what it costs the step); only
// where no phase is, of the ranks whose busy time as a whole is over the rule (against the
// other ranks' median), the one whose excess costs the most. None where none is (its share
// then: the largest share of steps slower than expected of any), with fewer than 2 ranks, or
// without steps.
Straggler name_straggler(const std::vector<std::vector<double>>& ranks, const StepLog& log,
                         const StragglerRule& rule = {});

// "rank 2 in backward: +12% in 85% of steps" (the share left out where it is 0), "rank 1 in
// every phase: +30%", or "none".
std::string describe(const Straggler& s);

}  // namespace dtrain
