#include "dtrain/nn/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dtrain {

double lr_at(const OptimizerConfig& o, int total_epochs, int64_t global_batch, double epoch_pos) {
  const double peak = scaled_lr(o, global_batch);
  const double w = o.warmup_epochs;
  const double from = o.warmup_from == WarmupFrom::zero ? 0.0 : o.lr;
  if (w > 0 && epoch_pos < w) return from + (peak - from) * (epoch_pos / w);
  const double t = epoch_pos - w;
  const double span = std::max(1e-12, static_cast<double>(total_epochs) - w);
  switch (o.schedule) {
    case Schedule::constant:
      return peak;
    case Schedule::step:
      return peak * std::pow(o.gamma, std::floor(t / o.step_size + 1e-9));
    case Schedule::cosine: {
      const double frac = std::clamp(t / span, 0.0, 1.0);
      // min_lr is given for base_batch, as lr is, and scales by the same rule: the floor keeps
      // its share of the peak at every global batch, so 1 and N replicas decay alike.
      const double floor_lr = o.lr > 0 ? std::min(o.min_lr * (peak / o.lr), peak) : 0.0;
      return floor_lr + (peak - floor_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
    }
  }
  return peak;
}

bool warmup_ramps(const OptimizerConfig& o, int64_t global_batch) {
  if (o.warmup_epochs <= 0) return false;
  return o.warmup_from == WarmupFrom::zero || scaled_lr(o, global_batch) != o.lr;
}

}  // namespace dtrain
