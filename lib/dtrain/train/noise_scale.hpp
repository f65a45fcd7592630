#pragma once
// The gradient noise scale of McCandlish et al. 2018 ("An Empirical Model of Large-Batch
// Training", arXiv:1812.06162, appendix A.1), from what data parallelism computes anyway: each
// replica's gradient over its B_small samples before the exchange, and the mean gradient over
// all B_big samples after it. Per step, the unbiased estimates are
//   |G|^2  ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//   tr(S)  ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
// (|G_small|^2: the mean over replicas of each replica's squared norm). Each is noisy, so each
// is averaged by its own exponential moving average, and B_simple = tr(S) / |G|^2 is taken
// from the two averages: the batch size beyond which a larger batch stops cutting the number
// of steps in proportion (the critical batch, to first order).
#include <array>
#include <cstdint>

namespace dtrain {

class NoiseScale {
 public:
  // `decay`: of both moving averages (bias-corrected, so early values are usable).
  explicit NoiseScale(double decay = 0.99) : decay_(decay) {}
  // One optimizer step. Steps with b_big <= b_small (one replica, no accumulation) carry no
  // information and are ignored.
  void add(double b_small, double b_big, double g_small_sq, double g_big_sq);
  int64_t steps() const { return steps_; }
  double g2() const;         // |G|^2, averaged
  double trace() const;      // tr(S), averaged
  double b_simple() const;   // tr(S) / |G|^2; NaN before the first step or if |G|^2 <= 0
  // The averages and the step count, for a checkpoint.
  std::array<double, 4> save() const { return {g2_, trace_, weight_, static_cast<double>(steps_)}; }
  void restore(const std::array<double, 4>& s) {
    g2_ = s[0], trace_ = s[1], weight_ = s[2], steps_ = static_cast<int64_t>(s[3]);
  }

 private:
  double decay_;
  double g2_ = 0, trace_ = 0, weight_ = 0;  // the averages before bias correction
  int64_t steps_ = 0;
};

}  // namespace dtrain
