#pragma once
// Step traces (train.trace): what each rank did and when, over a window of optimizer steps,
// written as Chrome trace-event JSON (trace.json), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. One process per rank; its host thread's spans nest: a step holds its
// data loads, forward and backward passes, the exchange and the optimizer; a bucket's all-reduce
// sits inside the backward pass that made it ready (or inside the exchange that finished it);
// synchronised BatchNorm's statistics exchanges ("bn sync") inside the passes that made them.
// After the epoch: evaluation and checkpoints.
//
// Times are host clocks from one origin: the moment every rank left one collective, as rank 0's
// monotonic clock read it, which every rank on its machine shares exactly; a rank on another
// machine takes its own reading of that moment (aligned to the collective's exit skew; clock
// drift over the run is not corrected). On a GPU the host spans are when work was queued, not
// when it ran; a second track, "device", holds when it ran: the phases between the step's
// device events (DeviceQueue::step_mark), on the host clock through the device's anchor.
//
// Off (train.trace.steps 0), a span site costs its clock reads and one branch. On, a span is
// also a push into a vector.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

enum class TracePhase : uint8_t {
  step,
  data,
  forward,
  backward,
  bucket,
  exchange,
  optimizer,
  evaluation,
  checkpoint,
  bn_sync,  // synchronised BatchNorm's statistics exchanged, inside forward or backward
};
const char* to_string(TracePhase p);

struct TraceSpan {
  TracePhase phase = TracePhase::step;
  int64_t step = 0;    // the global optimizer step (1-based) it belongs to or follows
  int64_t index = -1;  // a bucket's number (0: the last layers'), or -1
  double start_us = 0, dur_us = 0;
  double ready_us = -1;  // a bucket: when backward had finished it (-1: not a bucket)
  int track = 0;         // 0: the host thread; 1: the device's queue
};

class StepTrace {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepTrace(const TraceConfig& cfg) : cfg_(cfg) {}

  // The common origin of every rank's times (the same instant on every rank).
  void start_clock(Clock::time_point origin) { origin_ = origin; }
  // The global step about to run (1-based): spans from here on belong to it while it lies in
  // the window; evaluation and checkpoints after it belong to it too.
  void set_step(int64_t global_step) {
    step_ = global_step;
    on_ = cfg_.enabled() && global_step >= cfg_.from_step &&
          global_step < cfg_.from_step + cfg_.steps;
  }
  bool on() const { return on_; }
  // Seconds from the origin to t.
  double seconds_at(Clock::time_point t) const {
    return std::chrono::duration<double>(t - origin_).count();
  }
  void span(TracePhase p, Clock::time_point t0, Clock::time_point t1) {
    if (on_) add(p, t0, t1, -1, nullptr);
  }
  void bucket(size_t index, Clock::time_point ready, Clock::time_point t0, Clock::time_point t1) {
    if (on_) add(TracePhase::bucket, t0, t1, static_cast<int64_t>(index), &ready);
  }
  // A span on the device track, read after the fact: `step` (global, 1-based) and its times in
  // seconds on the steady clock (DeviceMark::t). Kept where the step lies in the window.
  void device_span(TracePhase p, int64_t step, double t0, double t1);
  // Seconds on the steady clock to seconds from the origin.
  double seconds_at(double steady_s) const {
    return steady_s - std::chrono::duration<double>(origin_.time_since_epoch()).count();
  }
  // The spans recorded since the last take(), packed as doubles (7 each) for a gather.
  std::vector<double> take();

 private:
  void add(TracePhase p, Clock::time_point t0, Clock::time_point t1, int64_t index,
           const Clock::time_point* ready);
  TraceConfig cfg_;
  Clock::time_point origin_ = Clock::now();
  int64_t step_ = 0;
  bool on_ = false;
  std::vector<TraceSpan> spans_;
};

// Packed spans (StepTrace::take) back into spans; throws SystemError on a malformed array.
std::vector<TraceSpan> unpack_spans(const double* packed, size_t n);

// The trace-event JSON of every rank's spans (ranks[r]: rank r's): a complete event ("ph": "X")
// per span on process `r`, thread 0 (the host) or 1 (the device), with its step (and bucket) in
// "args"; the processes named "rank r". `about`: a line for the trace's metadata (the run, its config).
std::string trace_json(const std::vector<std::vector<TraceSpan>>& ranks, const std::string& about);

}  // namespace dtrain
