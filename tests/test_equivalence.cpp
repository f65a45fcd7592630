// The headline contract: N replicas x batch B with mean reduction train exactly like
// 1 replica x batch N*B on the same global order, step by step.
#include <catch2/catch.hpp>

#include "dtrain/data/data.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::max_rel_step_diff;
using dtrain::test::synthetic_config;
using dtrain::test::run_config;

TEST_CASE("4 replicas x 32 with mean equal 1 replica x 128 - step by step", "[equivalence]") {
  for (auto sharding : {Sharding::interleaved, Sharding::contiguous}) {
    Config one = synthetic_config(1, 128);
    Config four = synthetic_config(4, 32);
    one.data.sharding = four.data.sharding = sharding;
    const auto a = run_config(one);
    const auto b = run_config(four);
    REQUIRE(a.step_losses.size() >= 50);
    INFO("sharding " << to_string(sharding));
    CHECK(max_rel_step_diff(a, b) < 1e-5);
    CHECK(a.epochs.back().test_acc == Approx(b.epochs.back().test_acc).margin(1e-3));
    // The loss really moves, so agreement is not agreement of constants.
    CHECK(a.step_losses.back() < 0.8 * a.step_losses.front());
  }
}

TEST_CASE("equivalence holds with warmup - schedules - Adam and a short last batch",
          "[equivalence]") {
  Config one = synthetic_config(1, 96);
  Config three = synthetic_config(3, 32);
  for (Config* c : {&one, &three}) {
    c->train.epochs = 2;
    c->data.drop_remainder = false;  // 7680 = 80 x 96, so cut the data to leave a remainder
    c->data.synthetic.train_size = 96 * 30 + 50;
    c->optimizer.type = OptimizerType::adamw;
    c->optimizer.lr = 0.003;
    c->optimizer.weight_decay = 0.01;
    c->optimizer.warmup_epochs = 1;
    c->optimizer.schedule = Schedule::cosine;
  }
  const auto a = run_config(one);
  const auto b = run_config(three);
  REQUIRE(a.step_losses.size() == 2 * 31);
  CHECK(max_rel_step_diff(a, b) < 1e-5);
}

TEST_CASE("sum reduction with plain SGD equals mean with an N-fold LR", "[equivalence]") {
  Config sum = synthetic_config(4, 32);
  Config mean = synthetic_config(4, 32);
  for (Config* c : {&sum, &mean}) {
    c->optimizer.momentum = 0.0;
    c->optimizer.weight_decay = 0.0;
  }
  sum.train.reduction = Reduction::sum;
  sum.optimizer.lr = 0.02;
  mean.optimizer.lr = 0.08;
  const auto a = run_config(sum);
  const auto b = run_config(mean);
  REQUIRE(a.step_losses.size() >= 50);
  CHECK(max_rel_step_diff(a, b) < 1e-5);
  // And it is not the same as mean at the same LR: sum really is an N-fold step.
  Config mean_same = mean;
  mean_same.optimizer.lr = 0.02;
  const auto c = run_config(mean_same);
  CHECK(max_rel_step_diff(a, c) > 1e-3);
}

TEST_CASE("2 replicas x 32 x 2 accumulation steps equal 1 replica x 128", "[equivalence]") {
  Config one = synthetic_config(1, 128);
  Config acc = synthetic_config(2, 32);
  acc.train.accumulation_steps = 2;
  REQUIRE(acc.global_batch() == 128);
  const auto a = run_config(one);
  const auto b = run_config(acc);
  REQUIRE(a.step_losses.size() >= 50);
  CHECK(max_rel_step_diff(a, b) < 1e-5);
}

TEST_CASE("equivalence holds with label smoothing, which changes the training",
          "[equivalence][smoothing]") {
  Config one = synthetic_config(1, 128);
  Config four = synthetic_config(4, 32);
  const auto plain = run_config(one);
  one.train.label_smoothing = four.train.label_smoothing = 0.1;
  const auto a = run_config(one);
  const auto b = run_config(four);
  REQUIRE(a.step_losses.size() >= 50);
  CHECK(max_rel_step_diff(a, b) < 1e-5);
  // Smoothing is in force: the targets are not one-hot, so the losses differ from plain ones.
  CHECK(max_rel_step_diff(a, plain) > 1e-3);
}

TEST_CASE("the same config and seed give bit-identical metrics", "[determinism]") {
  Config c = synthetic_config(4, 16);
  c.train.epochs = 2;
  c.threads = 2;
  const auto a = run_config(c);
  const auto b = run_config(c);
  REQUIRE(a.step_losses.size() == b.step_losses.size());
  for (size_t i = 0; i < a.step_losses.size(); ++i) CHECK(a.step_losses[i] == b.step_losses[i]);
  for (size_t e = 0; e < a.epochs.size(); ++e) {
    CHECK(a.epochs[e].train_loss == b.epochs[e].train_loss);
    CHECK(a.epochs[e].test_loss == b.epochs[e].test_loss);
    CHECK(a.epochs[e].test_acc == b.epochs[e].test_acc);
  }
  // A different seed changes them.
  c.train.seed = 2;
  const auto d = run_config(c);
  CHECK(d.step_losses != a.step_losses);
}

TEST_CASE("the LR in effect is logged per epoch and follows the schedule", "[lr][equivalence]") {
  Config c = synthetic_config(2, 32);
  c.train.epochs = 4;
  c.optimizer.lr = 0.1;
  c.optimizer.base_batch = 32;
  c.optimizer.lr_scaling = LrScaling::linear;
  c.optimizer.warmup_epochs = 2;
  c.optimizer.schedule = Schedule::constant;
  const auto r = run_config(c);
  REQUIRE(r.epochs.size() == 4);
  CHECK(r.epochs[0].lr == Approx(0.1));
  CHECK(r.epochs[1].lr == Approx(0.15));
  CHECK(r.epochs[2].lr == Approx(0.2));
  CHECK(r.info.peak_lr == Approx(0.2));
}

TEST_CASE("a diverging run stops and says so", "[divergence]") {
  Config c = synthetic_config(8, 16);
  c.train.epochs = 5;
  c.train.reduction = Reduction::sum;
  c.optimizer.lr = 50.0;
  c.optimizer.momentum = 0.9;
  const auto r = run_config(c);
  CHECK(r.status == RunStatus::diverged);
  CHECK(r.epochs.size() < 5);
}
