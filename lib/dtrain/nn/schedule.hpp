#pragma once
// Learning-rate rules, all defined in epochs so runs with different replica counts see the same
// learning rate at the same point of training.
#include <cstdint>

#include "dtrain/config/config.hpp"

namespace dtrain {

// scaled_lr, the LR the rule maps `lr` to at a global batch, is config.hpp's.

// The LR in effect at fractional epoch `epoch_pos` (0 = first step of training).
// Warmup ramps linearly from `lr` (warmup_from: lr, Goyal et al. 2017) or from 0 (zero) to the
// scaled LR over warmup_epochs, then the schedule runs over the remaining epochs.
double lr_at(const OptimizerConfig& o, int total_epochs, int64_t global_batch, double epoch_pos);

// Whether the warmup changes any LR at this global batch: not where it lasts 0 epochs, nor
// where it climbs from lr to a peak that is lr (lr_scaling: none, or the base batch itself).
bool warmup_ramps(const OptimizerConfig& o, int64_t global_batch);

}  // namespace dtrain
