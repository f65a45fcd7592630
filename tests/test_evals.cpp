// Scoring the test set between steps (train.eval_steps): training is the same bits as without
// it, the scorings land in evals.csv and survive a resume, summary.json's steps to target come
// from them, and train.stop_at_target ends a run after the epoch that reached its target.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_helpers.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Two replicas of a small CNN with BatchNorm statistics of their own (13 steps an epoch, the
// last one short), which average their statistics to be scored.
Config scored_config(int64_t eval_steps) {
  Config c = small_image_config(2, 16, 16 * 2 * 12 + 7);
  c.train.epochs = 2;
  c.train.eval_steps = eval_steps;
  c.train.target_accuracy = 0;
  return c;
}

std::vector<std::vector<std::string>> csv_rows(const fs::path& p) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(slurp(p));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace

TEST_CASE("scoring the test set between steps leaves training the same bits", "[evals]") {
  const Config plain = scored_config(0), scored = scored_config(4);
  const DataSplit data = load_data(plain.data, plain.train.seed);
  const TrainResult a = train(plain, data);
  const TrainResult b = train(scored, data);
  CHECK(a.evals.empty());  // without train.eval_steps nothing is recorded
  REQUIRE(a.step_losses.size() == b.step_losses.size());
  for (size_t i = 0; i < a.step_losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(same_bits(a.step_losses[i], b.step_losses[i]));
  }
  REQUIRE(a.epochs.size() == 2);
  REQUIRE(b.epochs.size() == 2);
  for (size_t e = 0; e < 2; ++e) {
    INFO("epoch " << e + 1);
    CHECK(same_bits(a.epochs[e].test_loss, b.epochs[e].test_loss));
    CHECK(same_bits(a.epochs[e].test_acc, b.epochs[e].test_acc));
    CHECK(same_bits(a.epochs[e].train_loss, b.epochs[e].train_loss));
  }
  // 13 steps an epoch, scored every 4 global steps: 4, 8, 12 and the end (13); then 16, 20, 24
  // and the end (26).
  std::vector<int64_t> steps;
  for (const EvalPoint& p : b.evals) steps.push_back(p.global_step);
  CHECK(steps == std::vector<int64_t>{4, 8, 12, 13, 16, 20, 24, 26});
  const EvalPoint& end1 = b.evals[3];
  CHECK(end1.epoch == 1);
  CHECK(end1.step == 13);
  CHECK(end1.samples == 16 * 2 * 12 + 7);
  CHECK(same_bits(end1.test_acc, b.epochs[0].test_acc));
  CHECK(same_bits(end1.test_loss, b.epochs[0].test_loss));
  CHECK(b.evals[4].samples == end1.samples + 3 * 32);  // 3 full steps into epoch 2
  CHECK(b.evals[1].samples == 8 * 32);
  for (size_t i = 1; i < b.evals.size(); ++i)
    CHECK(b.evals[i].train_time_s >= b.evals[i - 1].train_time_s);
  // A scoring between steps sees the model of that step: not the epoch's end.
  CHECK_FALSE(same_bits(b.evals[1].test_loss, end1.test_loss));
}

TEST_CASE("a run resumed from any checkpoint keeps its scorings", "[evals][checkpoint]") {
  Config cfg = scored_config(3);
  cfg.train.checkpoint_steps = 5;
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  const TrainResult full = train(cfg, data, &keep);
  REQUIRE(keep.all.size() >= 5);
  for (const Checkpoint& c : keep.all) {
    INFO("from epoch " << c.epoch << " step " << c.step);
    const TrainResult resumed = train(cfg, data, nullptr, &c);
    require_same_numeric_columns(full, resumed);
    REQUIRE(resumed.evals.size() == full.evals.size());
    for (size_t i = 0; i < full.evals.size(); ++i) {
      CHECK(resumed.evals[i].global_step == full.evals[i].global_step);
      CHECK(resumed.evals[i].samples == full.evals[i].samples);
      CHECK(same_bits(resumed.evals[i].test_loss, full.evals[i].test_loss));
    }
  }
}

TEST_CASE("evals.csv, steps to target and stop_at_target through the CLI", "[evals][cli]") {
  TempDir d("evals");
  const std::string cfg = d.write(
      "e.yaml",
      "name: ev\nbackend: cpu\nthreads: 1\n"
      "data:\n  dataset: synthetic\n  synthetic: {train_size: 2000, test_size: 200, "
      "shape: [16], classes: 4, noise: 0.5}\n"
      "model: {hidden: [32]}\n"
      "train: {epochs: 6, per_replica_batch: 20, target_accuracy: 0.6, eval_steps: 7}\n"
      "optimizer: {lr: 0.05, base_batch: 20}\n");
  const auto res = (d.path / "res").string();
  const auto r = dtrain_cli("run " + cfg + " train.stop_at_target=true --quiet --tag s --results " +
                            res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const fs::path run = fs::path(res) / "ev" / "s-g1";
  const auto rows = csv_rows(run / "evals.csv");
  REQUIRE(rows.size() > 2);
  CHECK(rows[0] == std::vector<std::string>{"epoch", "step", "global_step", "samples",
                                            "train_time_s", "test_loss", "test_acc"});
  const auto summary = nlohmann::json::parse(slurp(run / "summary.json"));
  // The first row at or over the target is where the summary says it was reached.
  int64_t first = -1, samples = -1;
  int epoch = 0;
  for (size_t i = 1; i < rows.size() && first < 0; ++i)
    if (std::stod(rows[i][6]) >= 0.6) {
      first = std::stoll(rows[i][2]);
      samples = std::stoll(rows[i][3]);
      epoch = std::stoi(rows[i][0]);
    }
  REQUIRE(first > 0);
  CHECK(summary["steps_to_target"] == first);
  CHECK(summary["samples_to_target"] == samples);
  CHECK(summary["target_resolution_steps"] == 7);
  CHECK(summary["status"] == "done");
  // Stopped after the epoch that reached it, its last scoring that epoch's end (100 steps).
  CHECK(summary["epochs_completed"] == epoch);
  CHECK(epoch < 6);
  CHECK(rows.back()[1] == "100");
  CHECK(std::stoi(rows.back()[0]) == epoch);
  // stop_at_target without a target is refused before anything runs.
  const auto none = dtrain_cli("run " + cfg + " train.stop_at_target=true train.target_accuracy=0 "
                               "--results " + res + " --tag n");
  CHECK(none.code == 2);
  CHECK_THAT(none.out, Catch::Contains("train.stop_at_target needs a target"));
}
