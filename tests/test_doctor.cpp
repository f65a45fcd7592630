// dtrain doctor: every rule fires on the config that has its pitfall and stays silent on the
// same config with the pitfall fixed; the CLI prints one line per finding and exits 0.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <thread>

#include "dtrain/data/data.hpp"
#include "dtrain/train/doctor.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

std::vector<std::string> rules_of(const Config& c, const DataSplit* data = nullptr) {
  std::vector<std::string> out;
  for (const auto& f : diagnose(c, data)) out.push_back(f.rule);
  return out;
}
bool fires(const std::string& rule, const Config& c, const DataSplit* data = nullptr) {
  const auto r = rules_of(c, data);
  return std::find(r.begin(), r.end(), rule) != r.end();
}

// The healthy baseline: 8 replicas of 16 (global 128 = base_batch), mean, linear scaling, a
// short warmup, per-sample shuffle, no BatchNorm, and a global batch that divides the data.
Config healthy() {
  Config c = synthetic_config(8, 16);
  c.train.epochs = 10;
  c.optimizer.lr_scaling = LrScaling::linear;
  c.optimizer.warmup_epochs = 1;
  return c;
}

Config cnn(Config c) {
  c.model.type = ModelType::cnn;
  c.model.hidden = ModelConfig{}.hidden;  // the mlp's: a cnn does not read it
  c.data.synthetic.shape = {1, 8, 8};
  return c;
}

}  // namespace

TEST_CASE("the healthy config has no finding", "[doctor]") {
  const auto r = rules_of(healthy());
  INFO(r.size());
  CHECK(r.empty());
  CHECK(rules_of(cnn(healthy())).empty());
}

TEST_CASE("doctor: sum reduction over several replicas", "[doctor]") {
  Config c = healthy();
  c.train.reduction = Reduction::sum;
  CHECK(fires("sum-reduction", c));
  const auto f = diagnose(c, nullptr);
  CHECK(f.front().message.find("8x") != std::string::npos);
  c.gpus = 1;  // one replica: sum and mean are the same
  CHECK_FALSE(fires("sum-reduction", c));
}

TEST_CASE("doctor: a grown global batch with an unscaled LR", "[doctor]") {
  Config c = healthy();
  c.optimizer.lr_scaling = LrScaling::none;
  c.train.per_replica_batch = 64;  // global 512 = 4x base_batch
  CHECK(fires("unscaled-lr", c));
  c.train.per_replica_batch = 16;  // global 128 = base_batch: nothing to scale
  CHECK_FALSE(fires("unscaled-lr", c));
}

TEST_CASE("doctor: linear scaling far past base_batch without warmup", "[doctor]") {
  Config c = healthy();
  c.train.per_replica_batch = 64;  // 4x
  c.optimizer.warmup_epochs = 0;
  CHECK(fires("linear-no-warmup", c));
  c.optimizer.warmup_epochs = 2;
  CHECK_FALSE(fires("linear-no-warmup", c));
  c.optimizer.warmup_epochs = 0;
  c.train.per_replica_batch = 32;  // 2x: not far past
  CHECK_FALSE(fires("linear-no-warmup", c));
}

TEST_CASE("doctor: a linear LR rule with Adam or AdamW", "[doctor]") {
  Config c = healthy();
  c.train.per_replica_batch = 32;
  for (auto t : {OptimizerType::adam, OptimizerType::adamw}) {
    c.optimizer.type = t;
    c.optimizer.lr_scaling = LrScaling::linear;
    CHECK(fires("linear-adam", c));
    c.optimizer.lr_scaling = LrScaling::sqrt;
    CHECK_FALSE(fires("linear-adam", c));
  }
  c.optimizer.type = OptimizerType::sgd;
  c.optimizer.lr_scaling = LrScaling::linear;
  CHECK_FALSE(fires("linear-adam", c));
}

TEST_CASE("doctor: warmup longer than a fifth of training", "[doctor]") {
  Config c = healthy();
  c.optimizer.warmup_epochs = 3;  // of 10
  CHECK(fires("long-warmup", c));
  c.optimizer.warmup_epochs = 2;
  CHECK_FALSE(fires("long-warmup", c));
}

TEST_CASE("doctor: batch or no shuffle on label-ordered data", "[doctor]") {
  Config c = healthy();
  c.data.sharding = Sharding::contiguous;
  c.data.sort_by_label = true;
  for (auto s : {Shuffle::batch, Shuffle::none}) {
    c.data.shuffle = s;
    CHECK(fires("ordered-data", c));
  }
  c.data.shuffle = Shuffle::sample;
  CHECK_FALSE(fires("ordered-data", c));

  // Without sort_by_label, the data itself shows the order: labels stored class by class.
  c.data.sort_by_label = false;
  c.data.shuffle = Shuffle::batch;
  DataSplit d = load_data(c.data, c.train.seed);
  CHECK_FALSE(fires("ordered-data", c, &d));  // synthetic data comes shuffled
  std::sort(d.train.y.begin(), d.train.y.end());
  CHECK(fires("ordered-data", c, &d));
}

TEST_CASE("doctor: local BatchNorm on a small per-replica batch", "[doctor]") {
  Config c = cnn(healthy());
  c.train.per_replica_batch = 8;
  c.gpus = 16;  // global 128
  CHECK(fires("small-bn-batch", c));
  const auto f = diagnose(c, nullptr);
  const auto it = std::find_if(f.begin(), f.end(),
                               [](const Finding& x) { return x.rule == "small-bn-batch"; });
  REQUIRE(it != f.end());
  CHECK(it->message.find("from 8 samples") != std::string::npos);
  c.model.batchnorm = BatchNormMode::sync;  // statistics over 128 samples
  CHECK_FALSE(fires("small-bn-batch", c));
  c = cnn(healthy());
  c.model.type = ModelType::mlp;  // no BatchNorm at all
  c.train.per_replica_batch = 8;
  CHECK_FALSE(fires("small-bn-batch", c));

  // The README's CNN on 28 x 28 images: 8 samples x 14 x 14 positions per statistic, measured
  // harmless; the same 8 samples after a dense layer are 8 values.
  c = cnn(healthy());
  c.data.synthetic.shape = {1, 28, 28};
  c.train.per_replica_batch = 8;
  CHECK_FALSE(fires("small-bn-batch", c));
  c.model.type = ModelType::layers;
  c.model.layers = {LayerSpec{LayerType::flatten}, LayerSpec{LayerType::dense, 32},
                    LayerSpec{LayerType::batchnorm}, LayerSpec{LayerType::relu}};
  CHECK(fires("small-bn-batch", c));
}

TEST_CASE("doctor: gradient accumulation with BatchNorm", "[doctor]") {
  Config c = cnn(healthy());
  c.train.accumulation_steps = 2;
  c.train.per_replica_batch = 16;
  CHECK(fires("accumulation-bn", c));
  c.train.accumulation_steps = 1;
  CHECK_FALSE(fires("accumulation-bn", c));
}

TEST_CASE("doctor: samples dropped every epoch, counted", "[doctor]") {
  Config c = healthy();
  c.data.synthetic.train_size = 1000;  // 1000 = 7 x 128 + 104
  CHECK(fires("dropped-samples", c));
  const auto f = diagnose(c, nullptr);
  const auto it = std::find_if(f.begin(), f.end(),
                               [](const Finding& x) { return x.rule == "dropped-samples"; });
  REQUIRE(it != f.end());
  CHECK(it->message.find("drops 104 of 1000") != std::string::npos);
  c.data.drop_remainder = false;
  CHECK_FALSE(fires("dropped-samples", c));
  c.data.drop_remainder = true;
  c.data.synthetic.train_size = 1024;
  CHECK_FALSE(fires("dropped-samples", c));
  c.data.synthetic.train_size = 128 * 100 + 64;  // 0.5%, different samples each epoch
  CHECK_FALSE(fires("dropped-samples", c));
  c.data.shuffle = Shuffle::none;  // the same 64 samples never seen
  CHECK(fires("dropped-samples", c));
}

TEST_CASE("doctor: more threads than cores", "[doctor]") {
  Config c = healthy();
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  REQUIRE(cores > 0);
  c.threads = cores + 1;
  CHECK(fires("oversubscribed-threads", c));
  const auto f = diagnose(c, nullptr);
  CHECK(f.back().message.find("threads: " + std::to_string(cores + 1) + " is more than the " +
                              std::to_string(cores) + " core") != std::string::npos);
  c.backend = Backend::cuda;  // GPU replicas are a host thread each
  CHECK_FALSE(fires("oversubscribed-threads", c));
  c.backend = Backend::cpu;
  c.threads = cores;
  CHECK_FALSE(fires("oversubscribed-threads", c));
  c.threads = 0;  // one per core
  CHECK_FALSE(fires("oversubscribed-threads", c));
}

TEST_CASE("doctor: threads per process under a launcher add up on a host", "[doctor]") {
  Config c = healthy();
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  REQUIRE(cores > 0);
  c.threads = cores;  // all the cores: right for one process
  CHECK_FALSE(fires("oversubscribed-threads", c));
  if (cores >= 2) {
    // Rank 0 of 2 processes on this host: each takes `threads` cores.
    const EnvScope env({{"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    CHECK(fires("oversubscribed-threads", c));
    const auto f = diagnose(c, nullptr);
    const std::string& m = f.back().message;
    CHECK(m.find(fmt::format("threads: {} in each of the 2 processes on this host is {} threads",
                             cores, 2 * cores)) != std::string::npos);
    CHECK(m.find(fmt::format("at most {}", cores / 2)) != std::string::npos);
    c.threads = cores / 2;  // the fix, and threads: 0, which shares the cores out
    CHECK_FALSE(fires("oversubscribed-threads", c));
    c.threads = 0;
    CHECK_FALSE(fires("oversubscribed-threads", c));
  }
  {
    // More processes than cores: each has a thread at least, so no `threads` fixes it.
    const std::string procs = std::to_string(cores + 1);
    const EnvScope env({{"OMPI_COMM_WORLD_SIZE", procs.c_str()},
                        {"OMPI_COMM_WORLD_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", procs.c_str()}});
    c.threads = 0;
    CHECK(fires("oversubscribed-threads", c));
    CHECK(diagnose(c, nullptr).back().message.find(procs + " processes on this host share") !=
          std::string::npos);
  }
  {
    // The same 2 processes, one per host (two nodes): nothing shared.
    const EnvScope env({{"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
    c.threads = cores;
    CHECK_FALSE(fires("oversubscribed-threads", c));
  }
}

TEST_CASE("doctor: a model key the model type does not read", "[doctor]") {
  Config c = healthy();
  c.model.type = ModelType::mlp;
  CHECK_FALSE(fires("ignored-model-key", c));
  c.model.hidden = ModelConfig{}.hidden;
  c.model.layers = {LayerSpec{}};  // written, but the mlp preset trains
  CHECK(fires("ignored-model-key", c));
  CHECK(diagnose(c, nullptr).back().message.find(
            "model.layers is set, but model.type mlp does not read it") != std::string::npos);
  c.model.type = ModelType::layers;  // the fix
  CHECK_FALSE(fires("ignored-model-key", c));
  c.model.activation = Activation::gelu;  // the presets' key
  c.model.hidden = {999};
  CHECK(diagnose(c, nullptr).back().message.find(
            "model.hidden, model.activation are set, but model.type layers does not read them") !=
        std::string::npos);
  // Defaults are written by every resolved config whatever the type: never a finding.
  c.model = ModelConfig{};
  c.model.type = ModelType::cnn;
  CHECK_FALSE(fires("ignored-model-key", c));
  c.model.dropout = 0.3;  // cnn reads it
  CHECK_FALSE(fires("ignored-model-key", c));
  c.model.type = ModelType::lenet5;
  CHECK(fires("ignored-model-key", c));
}

TEST_CASE("every doctor rule has a test above that makes it fire", "[doctor]") {
  // The rule list is what `dtrain doctor` counts; a rule added without a case here fails.
  const std::vector<std::string> tested = {
      "sum-reduction", "unscaled-lr",    "linear-no-warmup", "linear-adam",    "long-warmup",
      "ordered-data",  "small-bn-batch", "accumulation-bn",  "dropped-samples",
      "oversubscribed-threads", "ignored-model-key"};
  CHECK(doctor_rules() == tested);
}

TEST_CASE("dtrain doctor prints one line per finding and exits 0", "[doctor][cli]") {
  TempDir tmp("doctor");
  const fs::path cfg = tmp.path / "exp.yaml";
  put(cfg,
      "name: exp\nthreads: 1\n"
      "data: {dataset: synthetic, synthetic: {train_size: 1000, test_size: 64, shape: [8], "
      "classes: 3}}\n"
      "model: {hidden: [8]}\n"
      "train: {epochs: 2, per_replica_batch: 16, reduction: sum}\n"
      "optimizer: {lr_scaling: none, base_batch: 16}\n");
  const auto r = dtrain_cli("doctor " + cfg.string() + " gpus=4");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("doctor: [sum-reduction]") != std::string::npos);
  CHECK(r.out.find("doctor: [unscaled-lr]") != std::string::npos);
  CHECK(r.out.find("doctor: [dropped-samples] data.drop_remainder drops 40 of 1000") !=
        std::string::npos);
  CHECK(r.out.find("3 findings in 1 run") != std::string::npos);

  // A sweep names the run each finding belongs to; a clean config says so.
  const auto sweep = dtrain_cli("doctor " + cfg.string() + " gpus=1,4 train.reduction=mean");
  INFO(sweep.out);
  CHECK(sweep.code == 0);
  CHECK(sweep.out.find("gpus=4") != std::string::npos);
  const auto clean = dtrain_cli("doctor " + cfg.string() +
                                " train.reduction=mean data.drop_remainder=false gpus=1");
  INFO(clean.out);
  CHECK(clean.code == 0);
  CHECK(clean.out.find("none of the 11 known pitfalls") != std::string::npos);
}
