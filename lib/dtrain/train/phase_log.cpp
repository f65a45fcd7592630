#include "dtrain/train/phase_log.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "dtrain/train/rank_gather.hpp"

namespace dtrain {

PhaseLog::PhaseLog(int replicas, int64_t steps, int arrivals, bool host_memory)
    : host_(host_memory), replicas_(replicas), log_{steps, arrivals} {
  on_ = replicas > 1 &&
        static_cast<double>(replicas) * static_cast<double>(steps) *
                static_cast<double>(log_.stride()) <=
            0x1p25;
}

void PhaseLog::begin_epoch(int64_t first) {
  if (on_) values_.assign(static_cast<size_t>(log_.steps) * log_.stride(), 0.0);
  first_ = first;
}

Straggler PhaseLog::epoch_straggler(Communicator& comm) const {
  // The same decision on every rank: each holds as many values.
  if (!on_) return {};
  const std::vector<double> all = gather(comm, values_);
  if (comm.rank() != 0) return {};
  // The steps this process ran (a resumed epoch's earlier ones are not in the log).
  const size_t skip = static_cast<size_t>(first_) * log_.stride();
  std::vector<std::vector<double>> ranks(static_cast<size_t>(replicas_));
  for (size_t r = 0; r < ranks.size(); ++r)
    ranks[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r * values_.size() + skip),
                    all.begin() + static_cast<std::ptrdiff_t>((r + 1) * values_.size()));
  return name_straggler(ranks, StepLog{log_.steps - first_, log_.arrivals}, rule_);
}

SlowPhase SlowPhase::from_env(int rank) {
  SlowPhase slow;
  const char* f = std::getenv("DTRAIN_SLOW");
  if (!f) return slow;
  int fr = -1;
  char phase[32] = {};
  double factor = 1;
  if (std::sscanf(f, "%d:%31[a-z]:%lf", &fr, phase, &factor) == 3 && fr == rank && factor >= 1 &&
      factor <= 100)
    if (const auto p = step_phase_named(phase)) {
      slow.phase_ = static_cast<int>(*p);
      slow.factor_ = factor;
    }
  return slow;
}

void SlowPhase::stretch(StepPhase p, double busy_s) const {
  using Clock = std::chrono::steady_clock;
  if (static_cast<int>(p) != phase_ || !(busy_s > 0)) return;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>((factor_ - 1) * busy_s));
  // Sleep through most of it, then yield to the end: a core shared with other replicas is not
  // held, and the end is kept to a few microseconds.
  for (auto now = Clock::now(); now < until; now = Clock::now()) {
    if (until - now > std::chrono::microseconds(300))
      std::this_thread::sleep_for(until - now - std::chrono::microseconds(200));
    else
      std::this_thread::yield();
  }
}

}  // namespace dtrain
