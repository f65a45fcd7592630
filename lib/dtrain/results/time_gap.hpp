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
//   the rest    loop overhead and the epoch's end: whatever the terms above leave
// The terms add up to the measured epoch time exactly.
#include <string>
#include <vector>

#include "dtrain/train/run_types.hpp"

namespace dtrain {

struct TimeGapTerm {
  std::string name, meaning;
  double seconds = 0;  // per epoch, may be negative (a term that got faster than its share)
};

struct TimeGap {
  int replicas_small = 1, replicas_large = 1;
  int epochs_small = 0, epochs_large = 0;  // epochs the medians are over
  double measured_small = 0;  // epoch seconds of the smaller run
  double ideal = 0;           // measured_small x replicas_small / replicas_large
  double measured_large = 0;  // epoch seconds of the larger run
  std::vector<TimeGapTerm> terms;
};

// Throws UserError where a run has no epochs or a time that is not a number >= 0 (a positive
// epoch time), or the larger has no more replicas.
TimeGap time_gap(const std::vector<EpochMetrics>& small, int replicas_small,
                 const std::vector<EpochMetrics>& large, int replicas_large);

std::string to_markdown(const TimeGap& g);
std::string to_json(const TimeGap& g);

}  // namespace dtrain
