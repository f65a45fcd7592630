#pragma once
// Why N replicas are not N times faster, measured: the epoch time of an N-replica run against
// a 1-replica run (or any smaller one) as a waterfall, from the ideal (the smaller run's epoch
// time shared out over the replicas) to the measured, one term per cause, from the two runs'
// metrics.csv (each run's median epoch after the first: the epoch whose time is the median,
// every phase from that epoch):
//   compute     rank 0's forward and backward against its ideal share (smaller per-replica
//               batches run less efficiently; replicas sharing cores or a GPU slow each other)
//   data        rank 0's batch fetching against its share
//   optimizer   rank 0's update over its share (at a fixed global batch every replica runs the
//               whole update for 1/N of the samples; with shared weights, the wait for the rank
//               that runs it)
//   waiting     for the busiest rank: its busy time (data, compute, optimizer) over rank 0's
//   exchange    the exposed gradient exchange, less that waiting
//   bn sync     (model.batchnorm: sync) BatchNorm's statistics exchanged inside forward and
//               backward, taken out of compute
//   the rest    loop overhead and the epoch's end: whatever the terms above leave
// The terms add up to the measured epoch time exactly.
#include <optional>
#include <string>
#include <vector>

#include "dtrain/train/run_types.hpp"

namespace dtrain {

struct TimeGapTerm {
  std::string name, meaning;
  double seconds = 0;  // per epoch, may be negative (a term that got faster than its share)
  std::vector<double> projected;  // the same term as each of TimeGap::projections predicted it
};

// What `dtrain project` predicted for the larger run from the smaller (1-replica) run: its row
// for the larger run's replicas (project.hpp; the JSON it writes beside the run).
struct ProjectedEpoch {
  std::string link;             // the link's name
  int64_t steps_per_epoch = 0;  // at the larger run's replicas
  double data_s = 0, compute_s = 0, optimizer_s = 0;  // the 1-replica step's, per step
  double exposed_s = 0;                               // the exposed exchange, per step
  double epoch_s = 0;
};

struct TimeGap {
  int replicas_small = 1, replicas_large = 1;
  int epochs_small = 0, epochs_large = 0;  // epochs the medians are over
  double measured_small = 0;  // epoch seconds of the smaller run
  double ideal = 0;           // measured_small x replicas_small / replicas_large
  double measured_large = 0;  // epoch seconds of the larger run
  std::vector<TimeGapTerm> terms;
  // The smaller run's median epoch: data, compute, optimizer and exposed exchange seconds.
  double small_data = 0, small_compute = 0, small_optimizer = 0, small_exposed = 0;
  std::vector<ProjectedEpoch> projections;  // add_projection's, in order
};

// Adds a projection's terms beside the measured ones, by the projection's own arithmetic:
// compute, data and optimizer are the 1-replica step's times the steps of an epoch at N, less
// their share of the smaller run's (about 0: the model has no contention); waiting is 0 (it
// models no stragglers); the exchange is the exposed ring all-reduce of each step; the rest
// makes the terms add up to the projected epoch.
void add_projection(TimeGap& g, const ProjectedEpoch& p);

// The row for `gpus` replicas of a projection `dtrain project` wrote (its JSON text, read from
// `path`), or none where it has no such row. Throws UserError naming `path` where the text is
// not such a projection (a number missing, negative or not finite).
std::optional<ProjectedEpoch> projected_epoch(const std::string& text, const std::string& path,
                                              int gpus);

// Throws UserError where a run has no epochs or a time that is not a number >= 0 (a positive
// epoch time), or the larger has no more replicas.
TimeGap time_gap(const std::vector<EpochMetrics>& small, int replicas_small,
                 const std::vector<EpochMetrics>& large, int replicas_large);

std::string to_markdown(const TimeGap& g);
std::string to_json(const TimeGap& g);

}  // namespace dtrain
