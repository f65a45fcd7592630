#include "dtrain/train/noise_scale.hpp"

#include <cmath>
#include <limits>

namespace dtrain {

void NoiseScale::add(double b_small, double b_big, double g_small_sq, double g_big_sq) {
  if (!(b_big > b_small) || !(b_small > 0)) return;
  const double g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small);
  const double trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big);
  if (!std::isfinite(g2) || !std::isfinite(trace)) return;
  g2_ = decay_ * g2_ + (1 - decay_) * g2;
  trace_ = decay_ * trace_ + (1 - decay_) * trace;
  weight_ = decay_ * weight_ + (1 - decay_);  // 1 - decay^steps: the bias correction
  ++steps_;
}

double NoiseScale::g2() const {
  return weight_ > 0 ? g2_ / weight_ : std::numeric_limits<double>::quiet_NaN();
}

double NoiseScale::trace() const {
  return weight_ > 0 ? trace_ / weight_ : std::numeric_limits<double>::quiet_NaN();
}

double NoiseScale::b_simple() const {
  const double g = g2();
  return g > 0 ? trace() / g : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace dtrain
