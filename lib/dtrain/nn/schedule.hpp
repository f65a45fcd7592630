#pragma once
// Learning-rate rules, all defined in epochs so runs with different replica counts see the same
// learning rate at the same point of training.
#include <cstdint>

#include "dtrain/config/config.hpp"

namespace dtrain {

// The LR the rule maps `lr` (given for base_batch) to at this global batch.
double scaled_lr(const OptimizerConfig& o, int64_t global_batch);

// The LR in effect at fractional epoch `epoch_pos` (0 = first step of training).
// Warmup ramps linearly from `lr` to the scaled LR over warmup_epochs (Goyal et al. 2017), then
// the schedule runs over the remaining epochs.
double lr_at(const OptimizerConfig& o, int total_epochs, int64_t global_batch, double epoch_pos);

}  // namespace dtrain
