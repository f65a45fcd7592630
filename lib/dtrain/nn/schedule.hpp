#pragma once
// Learning-rate rules, all defined in epochs so runs with different replica counts see the same
// learning rate at the same point of training.
#include <cstdint>

#include "dtrain/config/config.hpp"

namespace dtrain {

// scaled_lr, the LR the rule maps `lr` to at a global batch, is config.hpp's.

// The LR in effect at fractional epoch `epoch_pos` (0 = first step of training).
// Warmup ramps linearly from `lr` to the scaled LR over warmup_epochs (Goyal et al. 2017), then
// the schedule runs over the remaining epochs.
double lr_at(const OptimizerConfig& o, int total_epochs, int64_t global_batch, double epoch_pos);

}  // namespace dtrain
