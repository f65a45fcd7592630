#pragma once
// One rank's side of finding stragglers (straggler.hpp names them): the phase log, per step of
// the epoch its busy seconds in each phase and when it arrived at each of the step's
// collectives, which rank 0 gathers at the epoch's end; and the straggler the tests plant,
// DTRAIN_SLOW, which stretches one rank's phase.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/train/straggler.hpp"

namespace dtrain {

class PhaseLog {
 public:
  PhaseLog() = default;
  // `arrivals`: the collectives of a step (one per bucket; shared weights: one on a GPU, none
  // in host memory, where a rank's exchange is its own fold, timed as it runs). The log is
  // kept with more than one replica, where every rank's epoch fits in 2^25 values (256 MB) on
  // rank 0. On the CPU (`host_memory`) the host clocks fill it as each step runs; on a GPU,
  // where the host only queues work, the device's events fill it after the fact (add_to() and
  // arrive_at()).
  PhaseLog(int replicas, int64_t steps, int arrivals, bool host_memory);

  bool on() const { return on_; }
  // Phase p is never named, nor counted in a rank's pace or busy time as a whole: where it is
  // not the rank's own work (shared weights on a GPU: the host only queues the folds, and the
  // last rank makes the update for every rank).
  void never_name(StepPhase p) { rule_.phases &= ~(1u << static_cast<int>(p)); }
  bool host_clocks() const { return host_; }
  // The epoch starts at step `first` (a resumed epoch's earlier steps are not in the log).
  void begin_epoch(int64_t first);
  // Step s is in progress: add() and arrive() write its row until end_step() (host clocks
  // only; they do nothing otherwise).
  void begin_step(int64_t s) {
    if (on_ && host_) row_ = values_.data() + static_cast<size_t>(s) * log_.stride();
  }
  // After the fact: adds seconds to step s's phase p, or sets its collective i's arrival
  // (steps outside the epoch's, and collectives it has not, are let go).
  void add_to(int64_t s, StepPhase p, double seconds) {
    if (double* r = row(s)) r[static_cast<int>(p)] += seconds;
  }
  void arrive_at(int64_t s, int i, double seconds) {
    if (double* r = row(s); r && i >= 0 && i < log_.arrivals) r[kStepPhases + i] = seconds;
  }
  void end_step() { row_ = nullptr; }
  // Adds seconds to the step in progress's phase.
  void add(StepPhase p, double seconds) {
    if (row_) row_[static_cast<int>(p)] += seconds;
  }
  // The step in progress's collective i began at `seconds` (from the origin every rank shares).
  void arrive(size_t i, double seconds) {
    if (row_) row_[kStepPhases + i] = seconds;
  }
  // Collective: the epoch's straggler from every rank's log, on rank 0 (none elsewhere, and
  // none where the log is off).
  Straggler epoch_straggler(Communicator& comm) const;

 private:
  double* row(int64_t s) {
    return on_ && s >= first_ && s < log_.steps
               ? values_.data() + static_cast<size_t>(s) * log_.stride()
               : nullptr;
  }
  bool on_ = false;
  bool host_ = true;
  int replicas_ = 1;
  StepLog log_;
  StragglerRule rule_;
  std::vector<double> values_;  // this epoch's StepLog values
  double* row_ = nullptr;       // the step in progress's
  int64_t first_ = 0;           // the epoch's first step run here
};

// DTRAIN_SLOW=RANK:PHASE:FACTOR stretches that rank's phase (data, forward, backward,
// exchange, optimizer) to FACTOR times its time: a straggler to find.
class SlowPhase {
 public:
  // This rank's, from the environment: none where DTRAIN_SLOW is unset, malformed, names
  // another rank, or a factor outside [1, 100].
  static SlowPhase from_env(int rank);
  // Waits out the rest of phase p's stretched time, given its busy seconds so far.
  void stretch(StepPhase p, double busy_s) const;

 private:
  int phase_ = -1;  // a StepPhase; -1: none
  double factor_ = 1;
};

}  // namespace dtrain
