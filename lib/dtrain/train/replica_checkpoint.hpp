#pragma once
// Checkpoints of a running training (the state and its file: checkpoint.hpp): what every
// replica gives to one, which rank 0 assembles, and how one is loaded back into a replica.
#include <array>
#include <cstdint>
#include <optional>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/optimizer.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/noise_scale.hpp"
#include "dtrain/train/run_types.hpp"
#include "dtrain/train/step_stats.hpp"

namespace dtrain {

// One replica's share of a run's state: what a checkpoint reads and a restore writes.
struct ReplicaState {
  const Config& cfg;   // the run's (a checkpoint keeps it as YAML)
  int64_t steps;       // optimizer steps per epoch
  Communicator& comm;  // the replica's rank, the run's replicas, the checkpoint's collectives
  Device& dev;
  Model& model;         // the weights and BatchNorm's running statistics
  Optimizer& opt;       // the shared one where the weights are shared
  bool shared_weights;  // one copy of the weights and optimizer for every rank: rank 0's
  Rng& rng;             // the replica's own stream (dropout, augmentation)
  NoiseScale& noise;    // the same on every rank
  StepStats& stats;     // the epoch in progress's per-step sums
  uint64_t data_fingerprint;  // DataSplit::fingerprint of the data it trains on (0: unknown)
};

// Where a run stands at a step boundary.
struct RunPosition {
  int epoch = 0;            // 0-based epoch to continue
  int64_t step = 0;         // its next step (0: the epoch starts)
  int64_t global_step = 0;  // optimizer steps taken in the run
};

// The epoch in progress, at a checkpoint inside it: its first LR and rank 0's phase times so far
// (its finished steps' sums are in ReplicaState::stats).
struct PartialEpoch {
  double lr_first = 0;
  std::array<double, 6> times{};  // data, compute, exchange, exposed, optimizer, total
};

// Collective: every rank calls it at the same step boundary `at`, with `partial` where that
// lies inside an epoch. Every rank's random stream and BatchNorm statistics and the finished
// steps' sums go to rank 0, which returns the checkpoint where it is given `record` (the run's
// finished epochs and step losses so far); nothing is returned elsewhere.
std::optional<Checkpoint> collect_checkpoint(const ReplicaState& r, const RunPosition& at,
                                             const PartialEpoch* partial,
                                             const TrainResult* record);

// Loads `c` into this replica: its random stream, BatchNorm statistics and noise-scale
// averages, and the weights and optimizer state (shared weights: by rank 0 alone, one copy);
// `record` (rank 0's, or null) gets the finished epochs back. Throws UserError where `c` is not
// a checkpoint of this run (another replica or parameter count, a position outside its
// epochs). Returns where the run continues.
RunPosition restore_checkpoint(const ReplicaState& r, const Checkpoint& c, TrainResult* record);

// The first steps of the epoch a run resumes in (after StepStats::begin_epoch): their sums
// back into the step statistics, and the epoch's first LR and phase times so far.
PartialEpoch restore_partial_epoch(const ReplicaState& r, const Checkpoint& c);

}  // namespace dtrain
