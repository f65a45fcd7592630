// Who is slow: the straggler rule on step logs with known answers (a slow phase, waits in the
// exchange, noise alone), whole runs where one rank is slowed on purpose (DTRAIN_SLOW), and the
// model FLOPs utilisation in summary.json.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/train/straggler.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// `ranks` ranks' logs of `steps` steps with one collective each: every phase 1 ms times
// (1 + noise), rank `slow` `factor` times slower in `phase`, and rank `paced` `pace` times
// slower in every phase (a slower core). A rank that is late to the collective makes the others
// wait there: their exchange grows by the wait, which their arrival times show.
std::vector<std::vector<double>> logs(int ranks, int64_t steps, double noise, int slow,
                                      StepPhase phase, double factor, uint64_t seed = 7,
                                      int paced = -1, double pace = 1) {
  Rng rng(seed);
  const StepLog log{steps, 1};
  const std::vector<double> empty(static_cast<size_t>(steps) * log.stride());
  std::vector<std::vector<double>> out(static_cast<size_t>(ranks), empty);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<double> before(static_cast<size_t>(ranks));  // busy time before the collective
    for (int r = 0; r < ranks; ++r) {
      double* v = out[static_cast<size_t>(r)].data() + static_cast<size_t>(s) * log.stride();
      for (int p = 0; p < kStepPhases; ++p) {
        v[p] = 1e-3 * (1 + noise * rng.uniform(-1, 1));
        if (r == slow && p == static_cast<int>(phase)) v[p] *= factor;
        if (r == paced) v[p] *= pace;
      }
      before[static_cast<size_t>(r)] = v[0] + v[1] + v[2];
    }
    const double last = *std::max_element(before.begin(), before.end());
    for (int r = 0; r < ranks; ++r) {
      double* v = out[static_cast<size_t>(r)].data() + static_cast<size_t>(s) * log.stride();
      v[kStepPhases] = 10.0 * static_cast<double>(s) + before[static_cast<size_t>(r)];
      v[static_cast<int>(StepPhase::exchange)] += last - before[static_cast<size_t>(r)];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the straggler rule names the slow rank and phase, and waits are not busy",
          "[straggler]") {
  const StepLog log{60, 1};
  for (const StepPhase p : {StepPhase::data, StepPhase::forward, StepPhase::backward,
                            StepPhase::exchange, StepPhase::optimizer}) {
    INFO(to_string(p));
    const Straggler s = name_straggler(logs(4, 60, 0.02, 2, p, 1.1), log);
    CHECK(s.rank == 2);
    CHECK(s.phase == static_cast<int>(p));
    CHECK(s.excess == Approx(0.1).margin(0.02));
    CHECK(s.share >= 0.9);
  }
  // Two ranks: the other rank's median is the other rank.
  const Straggler two = name_straggler(logs(2, 60, 0.02, 0, StepPhase::forward, 1.2), log);
  CHECK(two.rank == 0);
  CHECK(two.phase == static_cast<int>(StepPhase::forward));
  // Noise alone (up to 6% either way: single steps pass the threshold, and a rank is slower
  // than the others in about half the steps) names no one, in many draws, even where some
  // rank and phase was slower in 60% of the steps: no median is over the threshold.
  double most = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Straggler none = name_straggler(logs(4, 60, 0.06, 0, StepPhase::data, 1.0, seed), log);
    INFO("seed " << seed << ": " << describe(none));
    CHECK(none.rank == -1);
    most = std::max(most, none.share);  // the largest share of steps slower than expected
  }
  CHECK(most >= 0.6);
  // Slow in half the steps only: not named; in two thirds: named.
  for (const auto& [period, named_expected] : {std::pair{2, false}, std::pair{3, true}}) {
    auto half = logs(2, 60, 0.0, -1, StepPhase::data, 1.0);
    for (size_t s = 0; s < 60; ++s)
      if (s % static_cast<size_t>(period) != 0)
        half[1][s * log.stride() + static_cast<int>(StepPhase::forward)] *= 1.3;
    CHECK((name_straggler(half, log).rank == 1) == named_expected);
  }
  // A slowdown below the rule's threshold, or in too few steps, is not named.
  CHECK(name_straggler(logs(4, 60, 0.0, 1, StepPhase::forward, 1.04), log).rank == -1);
  CHECK(name_straggler(logs(4, 60, 0.0, 1, StepPhase::forward, 1.06), log).rank == 1);
  // Without the arrivals, the rank that waited would look slow in the exchange.
  auto no_waits = logs(2, 60, 0.0, 1, StepPhase::backward, 1.3);
  for (size_t s = 0; s < 60; ++s) {  // rank 1 also 0.2 ms late with its data: 0.5 ms of waits
    double* late = no_waits[1].data() + s * log.stride();
    late[static_cast<int>(StepPhase::data)] += 0.2e-3;
    late[kStepPhases] += 0.2e-3;
    no_waits[0][s * log.stride() + static_cast<int>(StepPhase::exchange)] += 0.2e-3;
  }
  const Straggler named = name_straggler(no_waits, log);
  CHECK(named.rank == 1);
  CHECK(named.phase == static_cast<int>(StepPhase::backward));
  for (auto& v : no_waits)
    for (size_t s = 0; s < 60; ++s)  // every rank arrives at once
      v[s * log.stride() + kStepPhases] = 10.0 * static_cast<double>(s);
  const Straggler fooled = name_straggler(no_waits, log);
  CHECK(fooled.rank == 0);
  CHECK(fooled.phase == static_cast<int>(StepPhase::exchange));
  // A phase the rule may not name (shared weights: the last rank makes every rank's sum) is
  // passed over, and the next slowest that qualifies is named instead, or no one.
  StragglerRule no_exchange;
  no_exchange.phases &= ~(1u << static_cast<int>(StepPhase::exchange));
  CHECK(name_straggler(logs(4, 60, 0.02, 3, StepPhase::exchange, 3.0), log, no_exchange).rank ==
        -1);
  auto both = logs(4, 60, 0.02, 3, StepPhase::exchange, 3.0);
  for (size_t st = 0; st < 60; ++st) both[1][st * log.stride() + 1] *= 1.3;  // rank 1's forward
  const Straggler next = name_straggler(both, log, no_exchange);
  CHECK(next.rank == 1);
  CHECK(next.phase == static_cast<int>(StepPhase::forward));
  CHECK(name_straggler(both, log).phase == static_cast<int>(StepPhase::exchange));
  // Nothing to compare: one rank, no steps, a short log.
  CHECK(name_straggler({std::vector<double>(60 * log.stride(), 1e-3)}, log).rank == -1);
  CHECK(name_straggler(logs(4, 60, 0, 1, StepPhase::data, 2), StepLog{0, 1}).rank == -1);
  CHECK(name_straggler({{1e-3}, {1e-3}}, log).rank == -1);
  CHECK(describe(Straggler{2, 1, 0.123, 0.85}) == "rank 2 in forward: +12% in 85% of steps");
  CHECK(describe(Straggler{}) == "none");
  CHECK(describe(Straggler{0, 4, 0.3, 0}) == "rank 0 in optimizer: +30%");
  CHECK(describe(Straggler{1, kEveryPhase, 0.3, 0.9}) ==
        "rank 1 in every phase: +30% in 90% of steps");
  CHECK(std::string(straggler_phase_name(kEveryPhase)) == "all");
  CHECK(straggler_phase_code("all") == kEveryPhase);
  CHECK(straggler_phase_code("exchange") == static_cast<int>(StepPhase::exchange));
  CHECK(!straggler_phase_code("?"));
  CHECK(step_phase_named("backward") == StepPhase::backward);
  CHECK(!step_phase_named("sleep"));
}

TEST_CASE("a rank slowed on purpose is named in the log, metrics.csv and summary.json",
          "[straggler]") {
  TempDir d("straggler");
  const auto cfg = d.path / "s.yaml";
  // Phases of milliseconds (a 3.4M-parameter MLP on augmented 3x32x32 images), 3 epochs of 16
  // steps. Timing on a shared machine (CTest runs two tests at once on two cores): rank 1's
  // phase takes 3 times as long, and it must be named in most epochs, not in every one. The
  // two replicas take turns on one thread (shared weights), so that neither runs on a core
  // slower than the other's: the cores of a virtual machine can differ by more than 1.5x.
  std::ofstream(cfg) << "name: s\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 2048, test_size: 128, shape: [3, 32, 32], "
                        "classes: 10}\n  augment: {crop_padding: 4, flip: true}\n"
                        "model: {hidden: [1024, 256]}\n"
                        "train: {epochs: 3, per_replica_batch: 64, target_accuracy: 0}\n"
                        "optimizer: {lr: 0.05, base_batch: 64, warmup_epochs: 0}\n";
  const auto res = (d.path / "res").string();
  // Each of the two ranks adds its own gradients into the shared sum in its turn and updates
  // its own half of the shared weights: the exchange and the optimizer are a rank's own work,
  // as forward and backward are.
  for (const std::string phase : {"forward", "backward", "exchange", "optimizer"}) {
    INFO(phase);
    const auto r = shell("DTRAIN_SLOW=1:" + phase + ":3 " + dtrain_binary() + " run " +
                         cfg.string() + " gpus=2 replicas=shared --tag " + phase +
                         " --results " + res + " 2>&1");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("straggler: rank 1 in " + phase));
    const auto run = fs::path(res) / "s" / (phase + "-g2");
    const auto j = nlohmann::json::parse(slurp(run / "summary.json"));
    int right = 0;
    for (const auto& e : j.at("stragglers"))
      if (e.at("rank") == 1 && e.at("phase") == phase && e.at("excess").get<double>() > 0.5)
        ++right;
    CHECK(right >= 2);
    const std::string csv = slurp(run / "metrics.csv");
    CHECK_THAT(csv, Catch::Contains("straggler_rank,straggler_phase,straggler_excess"));
    // The comparison table names the straggler named most often.
    CHECK_THAT(slurp(fs::path(res) / "s" / ("comparison-" + phase + ".md")),
               Catch::Contains("| rank 1, " + phase + ", "));
  }
  // One replica: nothing to compare, no field.
  REQUIRE(dtrain_cli("run " + cfg.string() + " --quiet --tag one --results " + res).code == 0);
  CHECK(!nlohmann::json::parse(slurp(fs::path(res) / "s" / "one-g1" / "summary.json"))
             .contains("stragglers"));
}

TEST_CASE("summary.json's utilisation: the shape engine's FLOPs at the run's rate, over a peak",
          "[straggler][utilisation]") {
  TempDir d("mfu");
  const auto cfg = d.path / "m.yaml";
  // An MLP 64 -> 128 -> 32 -> 4: forward 2 x (64*128 + 128*32 + 32*4) FLOPs per sample.
  std::ofstream(cfg) << "name: m\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 1024, test_size: 64, shape: [64], classes: 4}\n"
                        "model: {hidden: [128, 32]}\n"
                        "train: {epochs: 2, per_replica_batch: 32, target_accuracy: 0}\n"
                        "optimizer: {lr: 0.05, base_batch: 32}\n";
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg.string() + " gpus=2 --quiet --tag u --results " + res).code ==
          0);
  const auto j = nlohmann::json::parse(slurp(fs::path(res) / "m" / "u-g2" / "summary.json"));
  const auto& u = j.at("utilisation");
  const double forward = 2.0 * (64 * 128 + 128 * 32 + 32 * 4);
  CHECK(u.at("flops_per_sample").at("forward").get<double>() == forward);
  // Backward: the weights' gradients of every layer, the inputs' of all but the first.
  CHECK(u.at("flops_per_sample").at("backward").get<double>() ==
        2.0 * (64 * 128 + 128 * 32 + 32 * 4) + 2.0 * (128 * 32 + 32 * 4));
  const double flops = u["flops_per_sample"]["forward"].get<double>() +
                       u["flops_per_sample"]["backward"].get<double>();
  const double achieved = u.at("achieved_tflops_per_replica").get<double>();
  CHECK(achieved == Approx(j.at("samples_per_s").get<double>() * flops / 2 / 1e12));
  const double peak = u.at("peak_tflops_per_replica").get<double>();
  CHECK(peak > 1e-3);  // a 512^3 SGEMM on one thread: a few GFLOP/s at least
  CHECK(u.at("mfu").get<double>() == Approx(achieved / peak));
  CHECK_THAT(u.at("peak_source").get<std::string>(), Catch::Contains("SGEMM"));
}

TEST_CASE("a GPU's documented peak by name and precision", "[utilisation]") {
  CHECK(documented_peak("NVIDIA H100 80GB HBM3", Precision::bf16).tflops == 989.4);
  CHECK(documented_peak("NVIDIA H100 80GB HBM3", Precision::tf32).tflops == 494.7);
  CHECK(documented_peak("NVIDIA H100 80GB HBM3", Precision::fp32).tflops == 67);
  CHECK(documented_peak("NVIDIA H100 PCIe", Precision::bf16).tflops == 756);
  CHECK(documented_peak("NVIDIA H200", Precision::bf16).tflops == 989.4);
  CHECK(documented_peak("NVIDIA A100-SXM4-80GB", Precision::fp32).tflops == 19.5);
  CHECK_THAT(documented_peak("NVIDIA A100-SXM4-80GB", Precision::tf32).source,
             Catch::Contains("A100 tf32 dense peak"));
  // Variants with other figures, and GPUs not in the table: none.
  CHECK(documented_peak("NVIDIA H100 NVL", Precision::bf16).tflops == 0);
  CHECK(documented_peak("NVIDIA H200 NVL", Precision::bf16).tflops == 0);
  CHECK(documented_peak("NVIDIA GeForce RTX 4090", Precision::bf16).tflops == 0);
  CHECK(documented_peak("NVIDIA RTX A1000", Precision::fp32).tflops == 0);  // not an A100
  CHECK(documented_peak("NVIDIA GH200 480GB", Precision::bf16).tflops == 0);
  CHECK(documented_peak("", Precision::fp32).source.empty());
}

TEST_CASE("synchronised BatchNorm's exchanges are timed apart, within compute",
          "[straggler][batchnorm]") {
  // Two replicas of a small CNN with BatchNorm: its statistics exchanged (sync) or not (local).
  Config c = small_image_config(2, 16, 16 * 2 * 6);
  c.train.epochs = 1;
  c.train.target_accuracy = 0;
  const DataSplit data = load_data(c.data, c.train.seed);
  c.model.batchnorm = BatchNormMode::sync;
  const TrainResult synced = train(c, data);
  REQUIRE(synced.epochs.size() == 1);
  const EpochMetrics& m = synced.epochs[0];
  CHECK(m.bn_sync_s > 0);
  CHECK(m.bn_sync_s <= m.compute_s);  // part of forward and backward
  c.model.batchnorm = BatchNormMode::local;
  CHECK(train(c, data).epochs[0].bn_sync_s == 0);
}

TEST_CASE("with synchronised BatchNorm, a slow forward or backward is named, not the wait",
          "[straggler][batchnorm]") {
  TempDir d("straggler-bn");
  const auto cfg = d.path / "b.yaml";
  // A small ResNet whose BatchNorm statistics are exchanged inside forward and backward, two
  // replicas in turn on one thread. Rank 0 reaches each exchange first and waits there while
  // rank 1 runs: counted as busy, that wait made rank 0's backward look slow when rank 1's
  // forward was slowed.
  std::ofstream(cfg) << "name: b\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 1024, test_size: 64, shape: [3, 32, 32], "
                        "classes: 10}\n"
                        "model: {type: resnet, depth: 8, widths: [16, 32, 64], batchnorm: sync}\n"
                        "train: {epochs: 3, per_replica_batch: 32, target_accuracy: 0}\n"
                        "optimizer: {lr: 0.05, base_batch: 32, warmup_epochs: 0}\n";
  const auto res = (d.path / "res").string();
  for (const std::string phase : {"forward", "backward"}) {
    INFO(phase);
    const auto r =
        shell("DTRAIN_SLOW=1:" + phase + ":2 " + dtrain_binary() + " run " + cfg.string() +
              " gpus=2 replicas=shared --quiet --tag " + phase + " --results " + res + " 2>&1");
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto j =
        nlohmann::json::parse(slurp(fs::path(res) / "b" / (phase + "-g2") / "summary.json"));
    INFO(j.value("stragglers", nlohmann::json::array()).dump());
    int right = 0, wrong = 0;
    for (const auto& e : j.value("stragglers", nlohmann::json::array()))
      ++(e.at("rank") == 1 && e.at("phase") == phase ? right : wrong);
    CHECK(right >= 2);
    CHECK(wrong == 0);
  }
}

TEST_CASE("a rank slower in every phase is named for its pace, a phase beyond it for the phase",
          "[straggler]") {
  const StepLog log{60, 1};
  // Rank 1 on a core 30% slower: every phase alike, so no phase is named, the rank is.
  for (const int ranks : {2, 4}) {
    INFO(ranks << " ranks");
    const Straggler core = name_straggler(
        logs(ranks, 60, 0.02, -1, StepPhase::data, 1.0, 7, /*paced=*/1, 1.3), log);
    CHECK(core.rank == 1);
    CHECK(core.phase == kEveryPhase);
    CHECK(core.excess == Approx(0.3).margin(0.03));
  }
  // On that core, its data phase 20% slower again: the data phase is named, by its excess over
  // the rank's own pace in its other phases (the slow phase does not raise it).
  for (const StepPhase p : {StepPhase::data, StepPhase::exchange, StepPhase::optimizer}) {
    INFO(to_string(p));
    const Straggler both =
        name_straggler(logs(2, 60, 0.02, 1, p, 1.2, 7, /*paced=*/1, 1.3), log);
    CHECK(both.rank == 1);
    CHECK(both.phase == static_cast<int>(p));
    CHECK(both.excess == Approx(0.2).margin(0.02));
  }
  // A phase that stands out is named before a slower rank: the rank shows in slowest_rank.
  const Straggler first =
      name_straggler(logs(4, 60, 0.02, 2, StepPhase::forward, 1.15, 7, /*paced=*/1, 1.3), log);
  CHECK(first.rank == 2);
  CHECK(first.phase == static_cast<int>(StepPhase::forward));
  // The faster rank of two is not named for the phases it runs at the others' speed.
  const Straggler fast =
      name_straggler(logs(2, 60, 0.02, -1, StepPhase::data, 1.0, 7, /*paced=*/0, 0.7), log);
  CHECK(fast.rank == 1);
  CHECK(fast.phase == kEveryPhase);
  // A pace under the threshold, with noise: no one, in many draws.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Straggler none =
        name_straggler(logs(4, 60, 0.04, -1, StepPhase::data, 1.0, seed, /*paced=*/3, 1.04), log);
    INFO("seed " << seed << ": " << describe(none));
    CHECK(none.rank == -1);
  }
  // A rule that may not name a rank in every phase: no one.
  StragglerRule no_pace;
  no_pace.phases &= ~(1u << kEveryPhase);
  CHECK(name_straggler(logs(2, 60, 0.02, -1, StepPhase::data, 1.0, 7, 1, 1.3), log, no_pace)
            .rank == -1);
}
