// Replicas that share one copy of the weights (replicas: shared, the default for in-process CPU
// replicas) train exactly like replicas with their own copies (replicas: threads): the same
// bits in every step loss and every epoch metric, whatever has state beyond the weights.
// (Against MPI processes: see test_mpi.cpp, which compares with both.)
#include <catch2/catch.hpp>
#include <cstring>

#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::synthetic_config;
using dtrain::test::run_config;

namespace {

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Every number both runs report, bit for bit (NaN equals NaN of the same bits).
void check_same_training(const TrainResult& a, const TrainResult& b) {
  REQUIRE(a.step_losses.size() == b.step_losses.size());
  REQUIRE(!a.step_losses.empty());
  size_t differing = 0;
  for (size_t i = 0; i < a.step_losses.size(); ++i)
    differing += same_bits(a.step_losses[i], b.step_losses[i]) ? 0 : 1;
  CHECK(differing == 0);
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (size_t e = 0; e < a.epochs.size(); ++e) {
    const EpochMetrics &x = a.epochs[e], &y = b.epochs[e];
    INFO("epoch " << e + 1);
    CHECK(same_bits(x.train_loss, y.train_loss));
    CHECK(same_bits(x.train_acc, y.train_acc));
    CHECK(same_bits(x.test_loss, y.test_loss));
    CHECK(same_bits(x.test_acc, y.test_acc));
    CHECK(same_bits(x.lr, y.lr));
    CHECK(same_bits(x.noise_g2, y.noise_g2));
    CHECK(same_bits(x.noise_trace, y.noise_trace));
    CHECK(x.samples == y.samples);
  }
}

// Per-replica weights against shared weights run three ways: as fibers on one worker (replicas
// strictly in turn), as fibers on two workers (two at a time, folding across cores), and as
// one thread per replica (all at once). Each replica has one thread in every case.
void check_modes_agree(Config c) {
  c.replicas = ReplicaMode::threads;
  c.threads = c.gpus;
  const TrainResult threads = run_config(c);
  CHECK(threads.info.replica_mode == "threads");
  // The training really moved, so agreement is not agreement of constants.
  CHECK(threads.step_losses.back() != threads.step_losses.front());
  c.replicas = ReplicaMode::shared;
  for (int t : {1, 2, c.gpus}) {
    c.threads = t;
    const TrainResult shared = run_config(c);
    INFO("shared weights, " << shared.info.devices);
    CHECK(shared.info.replica_mode == "shared");
    CHECK_THAT(shared.info.devices,
               Catch::Contains(t < c.gpus ? "in turn on " + std::to_string(t) : "as threads"));
    check_same_training(threads, shared);
  }
}

// A small conv net with BatchNorm and dropout on images, with flips and crops.
Config image_config(int gpus, BatchNormMode bn) {
  // 10 full steps and a short one
  Config c = dtrain::test::small_image_config(gpus, 8, 8 * gpus * 10 + 5);
  c.data.augment.crop_padding = 1;
  c.model.batchnorm = bn;
  c.train.epochs = 2;
  return c;
}

}  // namespace

TEST_CASE("shared weights train like per-replica weights: mean, sum, momentum, Adam",
          "[shared][equivalence]") {
  SECTION("mean, SGD with momentum and weight decay, 4 replicas") {
    Config c = synthetic_config(4, 16);
    c.optimizer.weight_decay = 5e-4;
    check_modes_agree(c);
  }
  SECTION("sum, nesterov, 3 replicas") {
    Config c = synthetic_config(3, 16);
    c.train.reduction = Reduction::sum;
    c.optimizer.nesterov = true;
    c.optimizer.lr = 0.01;
    check_modes_agree(c);
  }
  SECTION("AdamW with warmup and cosine, a short last batch, 5 replicas") {
    Config c = synthetic_config(5, 16);
    c.train.epochs = 2;
    c.data.drop_remainder = false;
    c.data.synthetic.train_size = 16 * 5 * 20 + 13;
    c.optimizer.type = OptimizerType::adamw;
    c.optimizer.lr = 0.003;
    c.optimizer.weight_decay = 0.01;
    c.optimizer.warmup_epochs = 1;
    c.optimizer.schedule = Schedule::cosine;
    check_modes_agree(c);
  }
  SECTION("AdamW with gradient clipping and decay on weights only, 3 replicas") {
    // Each rank updates its own part of the shared weights, after one rank clipped the whole.
    Config c = synthetic_config(3, 16);
    c.optimizer.type = OptimizerType::adamw;
    c.optimizer.lr = 0.003;
    c.optimizer.weight_decay = 0.1;
    c.optimizer.decay_bn_and_bias = false;
    c.optimizer.grad_clip = 0.05;  // below the first steps' norms
    check_modes_agree(c);
  }
  SECTION("accumulation steps and small buckets (the noise scale's per-bucket norms)") {
    Config c = synthetic_config(4, 16);
    c.train.accumulation_steps = 3;
    c.train.bucket_mb = 0.001;  // 262 floats: several buckets
    check_modes_agree(c);
  }
}

TEST_CASE("shared weights train like per-replica weights: BatchNorm, dropout, augmentation",
          "[shared][equivalence]") {
  SECTION("BatchNorm per replica") {
    check_modes_agree(image_config(3, BatchNormMode::local));
  }
  SECTION("synchronised BatchNorm") {
    check_modes_agree(image_config(3, BatchNormMode::sync));
  }
}

TEST_CASE("the replica mode is chosen, reported and can be overridden", "[shared]") {
  Config c = synthetic_config(2, 16);
  const TrainResult a = run_config(c);  // replicas: auto
  CHECK(a.info.replica_mode == "shared");
  CHECK_THAT(a.info.devices, Catch::Contains("sharing one copy of the weights"));
  c.replicas = ReplicaMode::threads;
  const TrainResult b = run_config(c);
  CHECK(b.info.replica_mode == "threads");
  CHECK_THAT(b.info.devices, !Catch::Contains("sharing"));
  c.gpus = 1;
  c.replicas = ReplicaMode::shared;  // one replica: nothing to share, and no error
  CHECK(run_config(c).info.replica_mode == "one replica");
  // The YAML spelling, and a wrong value named with the valid ones.
  CHECK(dtrain::test::config_error("replicas: shared\n").empty());
  CHECK_THAT(dtrain::test::config_error("replicas: fibers\n"),
             Catch::Contains("auto") && Catch::Contains("threads") && Catch::Contains("shared"));
}

TEST_CASE("a resumed run with shared weights continues to the same bits", "[shared][checkpoint]") {
  // The checkpoint holds the one copy of the weights and optimizer state; rank 0 restores it
  // before any replica reads it. Checkpoints of per-replica weights continue as shared ones
  // and back, on fibers and on threads.
  Config c = image_config(3, BatchNormMode::local);
  c.train.epochs = 3;
  c.train.checkpoint_steps = 4;  // inside epochs too
  c.replicas = ReplicaMode::threads;
  c.threads = 3;
  const TrainResult whole = run_config(c);
  struct Keep final : TrainObserver {
    std::vector<Checkpoint> saved;
    void on_checkpoint(const Checkpoint& k) override { saved.push_back(k); }
  } keep;
  const DataSplit data = load_data(c.data, c.train.seed);
  for (auto mode : {ReplicaMode::threads, ReplicaMode::shared}) {
    keep.saved.clear();
    c.replicas = mode;
    (void)train(c, data, &keep);
    REQUIRE(keep.saved.size() >= 4);
    for (auto resume_mode : {ReplicaMode::threads, ReplicaMode::shared}) {
      for (int t : {1, 3}) {
        Config r = c;
        r.replicas = resume_mode;
        r.threads = t;
        for (const Checkpoint& k : keep.saved) {
          INFO("saved by " << to_string(mode) << ", resumed by " << to_string(resume_mode) << " on "
                           << t << " threads at epoch " << k.epoch << " step " << k.step);
          check_same_training(whole, train(r, data, nullptr, &k));
        }
      }
    }
  }
}

TEST_CASE("resume does not count the replica mode as part of a run", "[shared][cli]") {
  // Run folders written before the `replicas` key lack it; switching between modes gives the
  // same bits. Neither makes --resume redo or refuse a finished run.
  using namespace dtrain::test;
  namespace fs = std::filesystem;
  TempDir tmp("resume-mode");
  put(tmp.path / "t.yaml", tiny_config("rm"));
  const std::string base = "run " + (tmp.path / "t.yaml").string() + " gpus=2 --quiet --results " +
                           (tmp.path / "res").string() + " --tag t";
  REQUIRE(dtrain_cli(base).code == 0);
  const fs::path run_dir = tmp.path / "res" / "rm" / "t-g2";
  // An older folder: its resolved config has no `replicas:` line.
  std::string yaml = slurp(run_dir / "config.resolved.yaml");
  const auto at = yaml.find("replicas: auto\n");
  REQUIRE(at != std::string::npos);
  yaml.erase(at, std::string("replicas: auto\n").size());
  put(run_dir / "config.resolved.yaml", yaml);
  const std::string summary = slurp(run_dir / "summary.json");
  for (const std::string extra : {"", " replicas=threads", " replicas=shared"}) {
    const auto r = dtrain_cli(base + extra + " --resume");
    INFO(extra << ": " << r.out);
    CHECK(r.code == 0);
    CHECK(slurp(run_dir / "summary.json") == summary);  // skipped, not redone
  }
  // A key that does change the results still stops it, naming the line.
  const auto seed = dtrain_cli(base + " train.seed=7 --resume");
  CHECK(seed.code == 2);
  CHECK_THAT(seed.out, Catch::Contains("seed: 7"));
}
