// The gradient-noise-scale estimator on linear regression with Gaussian inputs and noise, where
// the true gradient and the per-sample gradient covariance have closed forms.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "dtrain/base/rng.hpp"
#include "dtrain/train/noise_scale.hpp"
#include "helpers.hpp"

using namespace dtrain;

namespace {

// y = w*.x + e with x ~ N(0, I_d), e ~ N(0, sigma^2); loss 0.5 (w.x - y)^2 at w = w* + delta.
// The per-sample gradient is g = (delta.x - e) x, so G = E[g] = delta and
// E|g|^2 = |delta|^2 (d + 2) + sigma^2 d (Gaussian fourth moments), hence
// tr(S) = E|g|^2 - |G|^2 = |delta|^2 (d + 1) + sigma^2 d.
struct Regression {
  int d;
  std::vector<double> delta;
  double sigma;
  Rng rng{12345};

  // The mean gradient over b samples.
  std::vector<double> batch_gradient(int b) {
    std::vector<double> g(static_cast<size_t>(d), 0.0), x(static_cast<size_t>(d));
    for (int i = 0; i < b; ++i) {
      double dx = 0;
      for (int k = 0; k < d; ++k) {
        x[static_cast<size_t>(k)] = rng.normal();
        dx += delta[static_cast<size_t>(k)] * x[static_cast<size_t>(k)];
      }
      const double r = dx - sigma * rng.normal();
      for (int k = 0; k < d; ++k) g[static_cast<size_t>(k)] += r * x[static_cast<size_t>(k)] / b;
    }
    return g;
  }
};

double sq(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

// Replicas of b_small samples each; the exchange averages their gradients.
NoiseScale estimate(Regression& p, int replicas, int b_small, int steps, double decay) {
  NoiseScale ns(decay);
  for (int s = 0; s < steps; ++s) {
    std::vector<double> big(static_cast<size_t>(p.d), 0.0);
    double small_sq = 0;
    for (int r = 0; r < replicas; ++r) {
      const auto g = p.batch_gradient(b_small);
      small_sq += sq(g) / replicas;
      for (size_t k = 0; k < g.size(); ++k) big[k] += g[k] / replicas;
    }
    ns.add(b_small, static_cast<double>(b_small) * replicas, small_sq, sq(big));
  }
  return ns;
}

}  // namespace

TEST_CASE("the noise scale lands within 10% of the closed form on linear regression",
          "[noise_scale]") {
  for (const auto& [d, sigma, replicas, b_small] :
       std::vector<std::tuple<int, double, int, int>>{{10, 1.0, 8, 16}, {20, 3.0, 4, 32}}) {
    Regression p{d, std::vector<double>(static_cast<size_t>(d), 0.0), sigma};
    p.delta[0] = 1.0;
    p.delta[1] = -0.5;
    const double g2 = sq(p.delta);
    const double trace = g2 * (d + 1) + sigma * sigma * d;
    const NoiseScale ns = estimate(p, replicas, b_small, 4000, 0.999);
    INFO("d " << d << ": |G|^2 " << ns.g2() << " (true " << g2 << "), tr " << ns.trace()
              << " (true " << trace << "), B_simple " << ns.b_simple() << " (true "
              << trace / g2 << ")");
    CHECK(std::abs(ns.g2() / g2 - 1) < 0.10);
    CHECK(std::abs(ns.trace() / trace - 1) < 0.10);
    CHECK(std::abs(ns.b_simple() / (trace / g2) - 1) < 0.10);
  }
}

TEST_CASE("the noise scale ignores steps without a smaller batch to compare", "[noise_scale]") {
  NoiseScale ns;
  CHECK(std::isnan(ns.b_simple()));
  ns.add(64, 64, 1.0, 1.0);  // one replica, no accumulation
  CHECK(ns.steps() == 0);
  CHECK(std::isnan(ns.g2()));
  ns.add(16, 64, 2.0, 1.0);
  CHECK(ns.steps() == 1);
  // One step: the bias-corrected averages are that step's estimates.
  CHECK(ns.g2() == Approx((64 * 1.0 - 16 * 2.0) / 48));
  CHECK(ns.trace() == Approx((2.0 - 1.0) / (1.0 / 16 - 1.0 / 64)));
}

TEST_CASE("runs with several replicas measure the noise scale without changing training",
          "[noise_scale][train]") {
  Config c = test::synthetic_config(4, 32);
  c.train.epochs = 2;
  const TrainResult on = test::run_config(c);
  REQUIRE(on.epochs.size() == 2);
  for (const auto& m : on.epochs) {
    INFO("epoch " << m.epoch << ": B_simple " << m.noise_b_simple << ", |G|^2 " << m.noise_g2
                  << ", tr " << m.noise_trace);
    CHECK(std::isfinite(m.noise_b_simple));
    CHECK(m.noise_trace > 0);
    CHECK(m.noise_g2 > 0);
  }
  // The norms are read, never written: the same losses bit for bit with the measurement off.
  c.train.noise_scale = false;
  const TrainResult off = test::run_config(c);
  CHECK(on.step_losses == off.step_losses);
  CHECK(std::isnan(off.epochs.back().noise_b_simple));
  // `sum` gives N times the gradient after the exchange; the estimate corrects for it (the
  // trajectory differs from `mean`, so compare only the first step's regime: finite, positive).
  c.train.noise_scale = true;
  c.train.reduction = Reduction::sum;
  c.optimizer.lr = 0.05 / 4;  // the same steps as mean
  const TrainResult sum = test::run_config(c);
  CHECK(sum.epochs.back().noise_b_simple ==
        Approx(on.epochs.back().noise_b_simple).epsilon(1e-3));
  // One replica without accumulation has no smaller batch to compare with.
  const TrainResult one = test::run_config(test::synthetic_config(1, 128));
  CHECK(std::isnan(one.epochs.back().noise_b_simple));
}

TEST_CASE("one replica with gradient accumulation measures the noise scale from its micro-batches",
          "[noise_scale][train]") {
  // 1 replica x 4 micro-batches of 32 against 4 replicas of 32: the same global batch, the same
  // quantity estimated (the first from one small batch a step, the second from four).
  Config acc = test::synthetic_config(1, 32);
  acc.train.accumulation_steps = 4;
  acc.train.epochs = 3;
  const TrainResult a = test::run_config(acc);
  Config rep = test::synthetic_config(4, 32);
  rep.train.epochs = 3;
  const TrainResult r = test::run_config(rep);
  const double ba = a.epochs.back().noise_b_simple, br = r.epochs.back().noise_b_simple;
  INFO("B_simple: accumulation " << ba << ", replicas " << br);
  CHECK(std::isfinite(ba));
  CHECK(a.epochs.back().noise_trace > 0);
  CHECK(a.epochs.back().noise_g2 > 0);
  CHECK(ba / br > 0.5);
  CHECK(ba / br < 2.0);
  // Read, never written: the same losses bit for bit with the measurement off.
  acc.train.noise_scale = false;
  const TrainResult off = test::run_config(acc);
  CHECK(a.step_losses == off.step_losses);
  CHECK(std::isnan(off.epochs.back().noise_b_simple));
}
