#pragma once
// The gradient noise scale's measurements in a training step (see noise_scale.hpp): the
// squared norm of a small batch's gradient and of the big batch's, into the step's row of
// StepStats, and at the epoch's end, from those rows summed over the ranks, the steps that feed
// the estimator.
//
// The small batch is each replica's own (its gradient before the exchange: the exchange adds
// each bucket's values just before it reduces them), or with one replica and gradient
// accumulation, the first micro-batch's. The big batch is the whole step's (the reduced
// gradients: each rank adds its slice, so the slices sum to the whole norm over the ranks).
// Off with one replica and no accumulation (no smaller batch to compare with) and with
// train.noise_scale: false.
#include <cstddef>
#include <cstdint>

#include "dtrain/backend/device.hpp"
#include "dtrain/comm/exchange.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/train/noise_scale.hpp"
#include "dtrain/train/run_types.hpp"

namespace dtrain {

class NoiseProbe {
 public:
  NoiseProbe(const Config& cfg, int replicas);

  bool on() const { return on_; }
  // Before the step's backward (several replicas): the exchange measures this replica's
  // gradient into row[kLocalNorm] (row: the step's device values, StepStats::device_row).
  void measure_local(GradExchange& exchange, Device* dev, double* row) const;
  // After micro-batch k's backward (one replica): the gradient buffer holds the first
  // micro-batch's gradient, the small batch (n values at `grads`), into row[kLocalNorm].
  void measure_micro(Device& dev, int k, const float* grads, size_t n, double* row) const;
  // After the update: rank `rank`'s slice of the n reduced gradients' squared norm, into
  // row[kReducedNorm]. The reduced buffer is the same on every rank, so the slices add up to
  // its whole norm at 1/N of the cost. Outside the timed phases.
  void measure_reduced(Device& dev, const float* reduced, size_t n, int rank, double* row) const;
  // At the epoch's end: one step's host row of StepStats, summed over the ranks.
  void add_step(const double* row);

  // The moving averages (a checkpoint saves and restores them).
  NoiseScale& scale() { return scale_; }
  // The noise scale so far into the epoch's metrics, once a step has been measured.
  void report(EpochMetrics& m) const;

 private:
  bool on_ = false;
  bool from_micro_ = false;  // one replica: the first micro-batch is the small batch
  int replicas_;
  int accum_;
  int64_t micro_, gbatch_;
  Reduction reduction_;
  NoiseScale scale_;
};

}  // namespace dtrain
