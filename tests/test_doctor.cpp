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

std::vector<std::string> rules_of(const Config& c, const DataSplit* data = nullptr,
                                  const InputProbe* probe = nullptr) {
  std::vector<std::string> out;
  for (const auto& f : diagnose(c, data, probe)) out.push_back(f.rule);
  return out;
}
bool fires(const std::string& rule, const Config& c, const DataSplit* data = nullptr,
           const InputProbe* probe = nullptr) {
  const auto r = rules_of(c, data, probe);
  return std::find(r.begin(), r.end(), rule) != r.end();
}

// The message of the first finding of `rule`, or "".
std::string message_of(const std::string& rule, const Config& c) {
  for (const auto& f : diagnose(c, nullptr, nullptr))
    if (f.rule == rule) return f.message;
  return "";
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
  CHECK(f.front().message.find("every step is 8x the 1-replica step") != std::string::npos);
  CHECK(f.front().message.find("sum at lr is mean at 8x lr;") != std::string::npos);
  c.optimizer.weight_decay = 1e-4;
  CHECK(diagnose(c, nullptr).front().message.find("mean at 8x lr with weight_decay / 8") !=
        std::string::npos);
  c.gpus = 1;  // one replica: sum and mean are the same
  CHECK_FALSE(fires("sum-reduction", c));
}

TEST_CASE("doctor: sum reduction under adam and adamw says their steps stay those of mean",
          "[doctor]") {
  Config c = healthy();
  c.train.reduction = Reduction::sum;
  c.optimizer.lr_scaling = LrScaling::sqrt;
  for (auto t : {OptimizerType::adam, OptimizerType::adamw}) {
    c.optimizer.type = t;
    for (double wd : {0.0, 1e-4}) {
      c.optimizer.weight_decay = wd;
      const auto f = diagnose(c, nullptr);
      REQUIRE(!f.empty());
      const std::string& m = f.front().message;
      INFO(m);
      CHECK(f.front().rule == "sum-reduction");
      CHECK(m.find("its steps stay nearly those of mean, not 8x larger") != std::string::npos);
      CHECK(m.find("every step is 8x") == std::string::npos);
      // adam adds its weight decay to the gradient; adamw decays the weights apart from it.
      CHECK((m.find("weight_decay / 8") != std::string::npos) ==
            (t == OptimizerType::adam && wd > 0));
    }
  }
}

namespace {
// The tiny synthetic config of the equivalence tests, 4 replicas x 32, one epoch (60 steps).
Config tiny(OptimizerType t, Reduction red, double lr, double wd, double momentum = 0.9) {
  Config c = synthetic_config(4, 32);
  c.optimizer.type = t;
  c.train.reduction = red;
  c.optimizer.lr = lr;
  c.optimizer.weight_decay = wd;
  c.optimizer.momentum = momentum;
  return c;
}
}  // namespace

TEST_CASE("the sum-reduction claims hold: sgd's sum at lr is mean at N x lr", "[doctor]") {
  // With and without momentum, with weight decay: sum at (lr, wd) is mean at (4 lr, wd / 4).
  for (double momentum : {0.0, 0.9}) {
    INFO("momentum " << momentum);
    const auto sgd = OptimizerType::sgd;
    const auto sum = test::run_config(tiny(sgd, Reduction::sum, 0.01, 4e-3, momentum));
    const auto mean = test::run_config(tiny(sgd, Reduction::mean, 0.04, 1e-3, momentum));
    const auto mean_same_lr = test::run_config(tiny(sgd, Reduction::mean, 0.01, 4e-3, momentum));
    REQUIRE(sum.step_losses.size() >= 50);
    CHECK(test::max_rel_step_diff(sum, mean) < 1e-5);
    CHECK(test::max_rel_step_diff(sum, mean_same_lr) > 1e-3);  // an N-fold step indeed
  }
}

TEST_CASE("the sum-reduction claims hold: adam's and adamw's steps stay those of mean",
          "[doctor]") {
  for (auto t : {OptimizerType::adam, OptimizerType::adamw}) {
    INFO(to_string(t));
    // No weight decay: sum and mean at the same lr give nearly the same steps (eps aside).
    const auto sum = test::run_config(tiny(t, Reduction::sum, 0.003, 0));
    const auto mean = test::run_config(tiny(t, Reduction::mean, 0.003, 0));
    REQUIRE(sum.step_losses.size() >= 50);
    CHECK(test::max_rel_step_diff(sum, mean) < 1e-4);
    CHECK(sum.step_losses.back() < 0.8 * sum.step_losses.front());  // it does train
    // With weight decay: adamw's is apart from the gradient, so sum is mean at the same decay;
    // adam adds it to the gradient, so sum is mean with weight_decay / 4.
    const auto sum_wd = test::run_config(tiny(t, Reduction::sum, 0.003, 0.4));
    const double mean_wd = t == OptimizerType::adamw ? 0.4 : 0.1;
    const auto mean_matched = test::run_config(tiny(t, Reduction::mean, 0.003, mean_wd));
    CHECK(test::max_rel_step_diff(sum_wd, mean_matched) < 1e-4);
    const auto mean_other = test::run_config(tiny(t, Reduction::mean, 0.003, 2 * mean_wd));
    CHECK(test::max_rel_step_diff(sum_wd, mean_other) > 1e-4);
  }
}

TEST_CASE("doctor: unscaled-lr names the rule of the configured optimizer", "[doctor]") {
  Config c = healthy();
  c.optimizer.lr_scaling = LrScaling::none;
  c.train.per_replica_batch = 64;  // global 512 = 4x base_batch
  auto message = [&] {
    for (const auto& f : diagnose(c, nullptr))
      if (f.rule == "unscaled-lr") return f.message;
    return std::string();
  };
  CHECK(message().find("where sgd would give each 4x the lr (the linear rule); fix: "
                       "optimizer.lr_scaling: linear (with warmup) or sqrt") != std::string::npos);
  for (auto t : {OptimizerType::adam, OptimizerType::adamw}) {
    c.optimizer.type = t;
    CHECK(message().find(fmt::format("where {} would give each 2x the lr (the square-root "
                                     "rule); fix: optimizer.lr_scaling: sqrt",
                                     to_string(t))) != std::string::npos);
  }
  // Fewer steps at the same lr, whatever the optimizer: the run's own numbers.
  for (auto t : {OptimizerType::sgd, OptimizerType::adamw}) {
    Config one = synthetic_config(1, 128), four = synthetic_config(4, 128);
    for (Config* x : {&one, &four}) x->optimizer.type = t;
    const DataSplit d = load_data(one.data, one.train.seed);
    const auto a = train(one, d), b = train(four, d);
    CHECK(a.info.steps_per_epoch == 4 * b.info.steps_per_epoch);
    CHECK(a.info.peak_lr == b.info.peak_lr);
  }
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

TEST_CASE("doctor: gradient clipping that differs across N", "[doctor]") {
  Config c = healthy();
  c.optimizer.grad_clip = 1.0;
  c.gpus = 4;
  c.optimizer.base_batch = c.global_batch();
  c.train.reduction = Reduction::sum;  // the clip sees 4 replicas' sum
  CHECK(fires("clip-across-n", c));
  CHECK_THAT(message_of("clip-across-n", c), Catch::Contains("up to 4x the mean's"));
  c.train.reduction = Reduction::mean;  // the fix it names
  CHECK_FALSE(fires("clip-across-n", c));
  c.train.per_replica_batch = 64;  // a larger global batch, averaged: no rule guesses that
  CHECK_FALSE(fires("clip-across-n", c));
  c.train.reduction = Reduction::sum;
  c.optimizer.grad_clip = 0;  // no clipping
  CHECK_FALSE(fires("clip-across-n", c));
  c.optimizer.grad_clip = 1.0;
  c.gpus = 1;  // one replica: nothing summed
  CHECK_FALSE(fires("clip-across-n", c));
}

TEST_CASE("doctor: warmup longer than a fifth of training", "[doctor]") {
  Config c = healthy();
  c.optimizer.base_batch = 32;    // the warmup climbs to 4x lr
  c.optimizer.warmup_epochs = 3;  // of 10
  CHECK(fires("long-warmup", c));
  c.optimizer.warmup_epochs = 2;
  CHECK_FALSE(fires("long-warmup", c));
  // A warmup that ramps nothing trains no step below its peak: flat, not long.
  c.optimizer.warmup_epochs = 3;
  c.optimizer.lr_scaling = LrScaling::none;
  CHECK_FALSE(fires("long-warmup", c));
  CHECK(fires("flat-warmup", c));
}

TEST_CASE("doctor: a warmup from lr to an unscaled lr ramps nothing", "[doctor]") {
  Config c = healthy();
  c.optimizer.lr_scaling = LrScaling::none;
  c.optimizer.warmup_epochs = 1;
  c.optimizer.schedule = Schedule::cosine;
  CHECK_THAT(message_of("flat-warmup", c),
             Catch::Contains("only starts the cosine schedule 1 epochs late") &&
                 Catch::Contains("fix: optimizer.warmup_from: zero"));
  // From zero it ramps; with a scaling rule it ramps at N replicas (and is flat at one by
  // design: the baseline of a scaling study); no warmup at all is nothing to say.
  c.optimizer.warmup_from = WarmupFrom::zero;
  CHECK_FALSE(fires("flat-warmup", c));
  c.optimizer.warmup_from = WarmupFrom::lr;
  c.optimizer.lr_scaling = LrScaling::sqrt;
  CHECK_FALSE(fires("flat-warmup", c));
  c.gpus = 1;
  CHECK_FALSE(fires("flat-warmup", c));
  c.optimizer.lr_scaling = LrScaling::none;
  c.optimizer.warmup_epochs = 0;
  CHECK_FALSE(fires("flat-warmup", c));
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

  // The small CNN of docs/studies.md on 28 x 28 images: 8 samples x 14 x 14 positions per
  // statistic, measured harmless; the same 8 samples after a dense layer are 8 values.
  c = cnn(healthy());
  c.data.synthetic.shape = {1, 28, 28};
  c.train.per_replica_batch = 8;
  CHECK_FALSE(fires("small-bn-batch", c));
  c.model.type = ModelType::layers;
  c.model.layers.clear();
  for (LayerType t : {LayerType::flatten, LayerType::dense, LayerType::batchnorm, LayerType::relu}) {
    LayerSpec l;
    l.type = t;
    l.units = t == LayerType::dense ? 32 : 0;
    c.model.layers.push_back(l);
  }
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
  // BatchNorm's mode on a model without BatchNorm (an MLP, a GPT); a ResNet reads it.
  c.model = ModelConfig{};
  c.model.batchnorm = BatchNormMode::sync;
  CHECK_THAT(message_of("ignored-model-key", c),
             Catch::StartsWith("model.batchnorm is set, but model.type mlp does not read it"));
  c.model.type = ModelType::resnet;
  c.model.depth = 8;
  c.data.synthetic.shape = {1, 8, 8};
  CHECK_FALSE(fires("ignored-model-key", c));
}

TEST_CASE("doctor: sparse labels, named with their counts", "[doctor]") {
  Config c = healthy();
  DataSplit d = load_data(c.data, c.train.seed);
  CHECK_FALSE(fires("sparse-labels", c, &d));
  // One label byte of 200 among 0-3: a 201-way output layer, 196 outputs never trained, and
  // a test label the training set lacks.
  d.train.y.assign(400, 0);
  for (size_t i = 0; i < d.train.y.size(); ++i) d.train.y[i] = static_cast<int32_t>(i % 4);
  d.train.y.push_back(200);
  d.train.classes = d.test.classes = 201;
  d.test.y = {0, 1, 7, 7};
  const auto f = diagnose(c, &d);
  const auto it = std::find_if(f.begin(), f.end(),
                               [](const Finding& x) { return x.rule == "sparse-labels"; });
  REQUIRE(it != f.end());
  INFO(it->message);
  CHECK(it->message.find("the training labels are 0-3 (100 each) and 200 (1); of the model's "
                         "201 outputs (labels 0 to 200), 196 belong to no training sample") == 0);
  CHECK(it->message.find("the test set has labels the training set lacks, 7 (2)") !=
        std::string::npos);
  CHECK_FALSE(fires("sparse-labels", c, nullptr));  // a rule of the data
}

TEST_CASE("doctor: input-bound, from the measured rates, with the workers that would do",
          "[doctor]") {
  const Config c = healthy();
  InputProbe p;
  p.on_gpu = true;  // the step on GPUs, decoding on the host: the step waits
  p.workers = 1;
  p.samples_per_step = 64;
  p.step_s = 0.010;        // 6400 samples/s consumed
  p.decode_per_s = 2000;   // by one thread
  const auto f = diagnose(c, nullptr, &p);
  const auto it =
      std::find_if(f.begin(), f.end(), [](const Finding& x) { return x.rule == "input-bound"; });
  REQUIRE(it != f.end());
  INFO(it->message);
  CHECK_THAT(it->message, Catch::Contains("decode 2000 images/s per replica (data.workers: 1"));
  CHECK_THAT(it->message, Catch::Contains("consumes 6400 samples/s"));
  CHECK_THAT(it->message, Catch::Contains("about 69% of the time"));
  CHECK_THAT(it->message, Catch::Contains("fix: data.workers: 4 "));
  p.workers = 4;
  p.decode_per_s = 8000;  // enough: silent
  CHECK_FALSE(fires("input-bound", c, nullptr, &p));
  CHECK_FALSE(fires("input-bound", c));  // nothing measured, nothing said
}

TEST_CASE("doctor: input-bound on the CPU, where decoding and the step share the cores",
          "[doctor]") {
  const Config c = healthy();  // 8 replicas of 16
  InputProbe p;
  p.workers = 2;
  p.samples_per_step = 16;
  p.step_threads = 2;
  p.cores = 2;
  p.step_s = 0.064;        // 128 samples on 2 threads: 1 ms of a core per sample
  p.decode_per_s = 1000;   // 2 ms of a core per image
  const auto f = diagnose(c, nullptr, &p);
  const auto it =
      std::find_if(f.begin(), f.end(), [](const Finding& x) { return x.rule == "input-bound"; });
  REQUIRE(it != f.end());
  INFO(it->message);
  CHECK_THAT(it->message, Catch::Contains("decoding takes 2.00 ms of a core per image"));
  CHECK_THAT(it->message, Catch::Contains("the step 1.00 ms per sample"));
  CHECK_THAT(it->message, Catch::Contains("decoding is 67% of the work"));
  CHECK_THAT(it->message, Catch::Contains("about 3.0x as long"));
  p.decode_per_s = 20000;  // 0.1 ms: a tenth of the step's work, silent
  CHECK_FALSE(fires("input-bound", c, nullptr, &p));
}

TEST_CASE("every doctor rule has a test above that makes it fire", "[doctor]") {
  // The rule list is what `dtrain doctor` counts; a rule added without a case here fails.
  const std::vector<std::string> tested = {
      "sum-reduction",     "unscaled-lr",     "linear-no-warmup", "linear-adam",
      "flat-warmup",       "long-warmup",     "clip-across-n",    "ordered-data",
      "small-bn-batch",    "accumulation-bn", "dropped-samples",  "oversubscribed-threads",
      "ignored-model-key", "sparse-labels",   "input-bound"};
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
  CHECK(clean.out.find("none of the 15 known pitfalls") != std::string::npos);
}
