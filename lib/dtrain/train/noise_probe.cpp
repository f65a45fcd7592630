#include "dtrain/train/noise_probe.hpp"

#include "dtrain/train/step_stats.hpp"

namespace dtrain {

NoiseProbe::NoiseProbe(const Config& cfg, int replicas)
    : replicas_(replicas),
      accum_(cfg.train.accumulation_steps),
      micro_(cfg.micro_batch()),
      gbatch_(cfg.global_batch()),
      reduction_(cfg.train.reduction) {
  // The noise scale needs a smaller batch to compare with: each replica's, or with one replica
  // and gradient accumulation, the first micro-batch's.
  on_ = cfg.train.noise_scale && (replicas_ > 1 || accum_ > 1);
  from_micro_ = on_ && replicas_ == 1;
}

void NoiseProbe::measure_local(GradExchange& exchange, Device* dev, double* row) const {
  if (on_ && !from_micro_) exchange.measure_norm(dev, row + StepStats::kLocalNorm);
}

void NoiseProbe::measure_micro(Device& dev, int k, const float* grads, size_t n,
                               double* row) const {
  if (from_micro_ && k == 0) dev.sum_squares(grads, n, row + StepStats::kLocalNorm);
}

void NoiseProbe::measure_reduced(Device& dev, const float* reduced, size_t n, int rank,
                                 double* row) const {
  if (!on_) return;
  const auto r = static_cast<size_t>(rank), size = static_cast<size_t>(replicas_);
  const size_t lo = n * r / size, hi = n * (r + 1) / size;
  if (hi > lo) dev.sum_squares(reduced + lo, hi - lo, row + StepStats::kReducedNorm);
}

// One step's squared norms, summed over ranks: the local ones average to |G_small|^2 over the
// replicas' B_small = B_big / N samples each; the ranks' slices of the reduced buffer add up to
// its whole norm, which a `sum` reduction makes N^2 |G_big|^2.
void NoiseProbe::add_step(const double* row) {
  if (!on_) return;
  const double n = replicas_;
  const double b_big = row[StepStats::kRows];
  const double local = row[StepStats::kLocalNorm], reduced = row[StepStats::kReducedNorm];
  // A short last step splits its rows unevenly (a rank may even get none): its local
  // gradients are not means over B_big / N samples, so it is left out.
  if (b_big != static_cast<double>(gbatch_)) return;
  if (from_micro_) {
    // Gradients are scaled by 1/B_big, so the first micro-batch's mean gradient was held
    // scaled by B_small/B_big = 1/accumulation_steps.
    const double a = accum_;
    scale_.add(static_cast<double>(micro_), b_big, local * a * a, reduced);
    return;
  }
  const double big_scale = reduction_ == Reduction::sum ? n * n : 1.0;
  scale_.add(b_big / n, b_big, local / n, reduced / big_scale);
}

void NoiseProbe::report(EpochMetrics& m) const {
  if (scale_.steps() == 0) return;
  m.noise_g2 = scale_.g2();
  m.noise_trace = scale_.trace();
  m.noise_b_simple = scale_.b_simple();
}

}  // namespace dtrain
