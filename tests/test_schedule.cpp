#include <catch2/catch.hpp>
#include <cmath>

#include "dtrain/nn/schedule.hpp"

using namespace dtrain;

TEST_CASE("LR scaling rules map lr at base_batch to the global batch", "[lr]") {
  OptimizerConfig o;
  o.lr = 0.1;
  o.base_batch = 64;
  o.lr_scaling = LrScaling::none;
  CHECK(scaled_lr(o, 512) == Approx(0.1));
  o.lr_scaling = LrScaling::linear;
  CHECK(scaled_lr(o, 512) == Approx(0.8));
  CHECK(scaled_lr(o, 32) == Approx(0.05));
  o.lr_scaling = LrScaling::sqrt;
  CHECK(scaled_lr(o, 256) == Approx(0.2));
}

TEST_CASE("warmup ramps linearly from lr to the scaled lr", "[lr]") {
  OptimizerConfig o;
  o.lr = 0.1;
  o.base_batch = 64;
  o.lr_scaling = LrScaling::linear;
  o.warmup_epochs = 2;
  o.schedule = Schedule::constant;
  CHECK(lr_at(o, 10, 256, 0.0) == Approx(0.1));
  CHECK(lr_at(o, 10, 256, 1.0) == Approx(0.25));
  CHECK(lr_at(o, 10, 256, 2.0) == Approx(0.4));
  CHECK(lr_at(o, 10, 256, 7.0) == Approx(0.4));
}

TEST_CASE("warmup_from: zero ramps from 0, and a warmup from lr to lr ramps nothing", "[lr]") {
  OptimizerConfig o;
  o.lr = 0.1;
  o.base_batch = 64;
  o.lr_scaling = LrScaling::none;
  o.warmup_epochs = 2;
  o.schedule = Schedule::constant;
  // From lr to the unscaled lr: flat, at any global batch.
  CHECK(lr_at(o, 10, 256, 0.0) == 0.1);
  CHECK(lr_at(o, 10, 256, 1.0) == 0.1);
  CHECK_FALSE(warmup_ramps(o, 256));
  o.warmup_from = WarmupFrom::zero;
  CHECK(lr_at(o, 10, 256, 0.0) == 0.0);
  CHECK(lr_at(o, 10, 256, 0.5) == Approx(0.025));
  CHECK(lr_at(o, 10, 256, 2.0) == Approx(0.1));
  CHECK(warmup_ramps(o, 256));
  // To the scaled peak, from 0: linear at 4x the batch climbs to 0.4.
  o.lr_scaling = LrScaling::linear;
  CHECK(lr_at(o, 10, 256, 1.0) == Approx(0.2));
  CHECK(lr_at(o, 10, 256, 2.0) == Approx(0.4));
  // From lr, with a rule: flat at base_batch (one replica of a scaling study), a ramp beyond.
  o.warmup_from = WarmupFrom::lr;
  CHECK_FALSE(warmup_ramps(o, 64));
  CHECK(warmup_ramps(o, 256));
  o.warmup_epochs = 0;
  CHECK_FALSE(warmup_ramps(o, 256));
}

TEST_CASE("cosine decays from the peak to min_lr over the epochs after warmup", "[lr]") {
  OptimizerConfig o;
  o.lr = 0.05;
  o.base_batch = 64;
  o.warmup_epochs = 2;
  o.schedule = Schedule::cosine;
  CHECK(lr_at(o, 10, 64, 2.0) == Approx(0.05));
  CHECK(lr_at(o, 10, 64, 6.0) == Approx(0.025));
  CHECK(lr_at(o, 10, 64, 10.0) == Approx(0.0).margin(1e-12));
  o.min_lr = 0.01;
  CHECK(lr_at(o, 10, 64, 6.0) == Approx(0.03));
  // min_lr is given for base_batch and scales with lr: at 4x the batch under the linear rule the
  // cosine falls from 0.2 to 0.04, the same shares of the peak as at base_batch.
  o.lr_scaling = LrScaling::linear;
  CHECK(lr_at(o, 10, 256, 2.0) == Approx(0.2));
  CHECK(lr_at(o, 10, 256, 6.0) == Approx(0.12));
  CHECK(lr_at(o, 10, 256, 10.0) == Approx(0.04));
  o.lr_scaling = LrScaling::sqrt;
  CHECK(lr_at(o, 10, 256, 10.0) == Approx(0.02));
}

TEST_CASE("step decays by gamma every step_size epochs", "[lr]") {
  OptimizerConfig o;
  o.lr = 1.0;
  o.base_batch = 64;
  o.schedule = Schedule::step;
  o.step_size = 3;
  o.gamma = 0.1;
  CHECK(lr_at(o, 10, 64, 2.99) == Approx(1.0));
  CHECK(lr_at(o, 10, 64, 3.0) == Approx(0.1));
  CHECK(lr_at(o, 10, 64, 6.5) == Approx(0.01));
}

TEST_CASE("schedules are defined in epochs - not steps", "[lr]") {
  // Runs with different global batches see the same LR shape at the same epoch.
  OptimizerConfig o;
  o.lr = 0.1;
  o.base_batch = 64;
  o.lr_scaling = LrScaling::none;
  o.warmup_epochs = 1;
  o.schedule = Schedule::cosine;
  for (double e : {0.5, 1.0, 3.3, 7.9}) CHECK(lr_at(o, 8, 64, e) == Approx(lr_at(o, 8, 512, e)));
}
