#pragma once
// train.trace across epochs: after each epoch in the window, every rank's spans since the last
// epoch go to rank 0, which keeps them and hands the whole trace so far to the observer
// (trace.json), so that a run stopped part way leaves the trace of what it did. And the
// origin every rank's times are taken from (the trace's and the straggler log's).
#include <chrono>
#include <cstdint>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/train/run_types.hpp"
#include "dtrain/train/trace.hpp"

namespace dtrain {

// The common origin (collective): the moment every rank leaves one collective, as rank 0 read
// it. Ranks on rank 0's machine share its monotonic clock and take its reading exactly; a rank
// on another machine takes its own reading of that moment (aligned to the collective's exit
// skew).
std::chrono::steady_clock::time_point common_clock_origin(Communicator& comm);

class TraceWindow {
 public:
  explicit TraceWindow(const TraceConfig& cfg) : cfg_(cfg) {}
  // The run starts, `global_step` steps in: a resumed run past the window has its trace.json
  // whole already.
  void start(int64_t global_step);
  // Collective: after an epoch that ends `global_step` steps into the run, or at a stop all
  // ranks agreed there. Once the window has begun and until its last step has been written,
  // rank 0 gathers `trace`'s new spans and hands `observer` the trace so far.
  void after_epoch(Communicator& comm, StepTrace& trace, int64_t global_step,
                   TrainObserver* observer);

 private:
  // The window's steps up to `global_step` (the last one run so far).
  void write(Communicator& comm, StepTrace& trace, TrainObserver* observer, int64_t global_step);

  TraceConfig cfg_;
  std::vector<std::vector<TraceSpan>> ranks_;  // rank 0: every rank's spans so far
  bool written_ = false;                       // the window is over and written
  int64_t started_at_ = 0;                     // steps done when this process started the run
};

}  // namespace dtrain
