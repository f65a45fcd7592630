// The batch-size law from run folders: each batch's best LR, batches that never reach the
// target, the fit and the noise scale beside it, and `report --batch-law` on real runs.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/results/batch_law.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

RunRecord run(long long batch, double lr, std::optional<double> epochs, int64_t steps_per_epoch,
              std::optional<double> b_simple = std::nullopt) {
  RunRecord r;
  r.status = "done";
  r.dir = "runs/b" + std::to_string(batch);
  r.global_batch = batch;
  r.peak_lr = lr;
  r.epochs_to_target = epochs;
  r.steps_per_epoch = steps_per_epoch;
  r.target_accuracy = 0.9;
  r.noise_b_simple = b_simple;
  return r;
}

}  // namespace

TEST_CASE("the batch-size law keeps each batch's best LR and fits the steps", "[report][stats]") {
  // S(B) = 1000 (1 + 512 / B) steps, reached in whole epochs of 60000 / B steps... here each
  // epoch is 100 steps and the epochs are S / 100.
  std::vector<RunRecord> runs;
  for (long long b : {64, 256, 1024, 4096}) {
    const double s = 1000 * (1 + 512.0 / static_cast<double>(b));
    runs.push_back(run(b, 0.1, s / 100, 100, 300));       // the best LR: both seeds
    runs.push_back(run(b, 0.1, s / 100, 100, 500));
    runs.push_back(run(b, 0.4, 1.5 * s / 100, 100));      // slower
    runs.push_back(run(b, 0.8, s / 200, 100));            // faster, but one seed never got there
    runs.push_back(run(b, 0.8, std::nullopt, 100));
  }
  runs.push_back(run(16384, 0.1, std::nullopt, 100));  // never reached
  RunRecord unfinished = run(64, 0.01, 1.0, 100);
  unfinished.status = "failed";
  runs.push_back(unfinished);
  const BatchLaw law = batch_law(runs);
  REQUIRE(law.rows.size() == 4);
  for (const BatchLawRow& r : law.rows) {
    INFO(r.global_batch);
    CHECK(r.best_lr == 0.1);
    CHECK(r.runs == 2);
    CHECK(r.reached == 2);
    CHECK(r.lrs_tried == 3);
    CHECK(r.steps == Approx(1000 * (1 + 512.0 / static_cast<double>(r.global_batch))));
    CHECK(r.samples == Approx(r.steps * static_cast<double>(r.global_batch)));
  }
  CHECK(law.never_reached == std::vector<long long>{16384});
  REQUIRE(law.fit.ok);
  CHECK(law.fit.s_min == Approx(1000));
  CHECK(law.fit.b_noise == Approx(512));
  CHECK(law.b_simple == Approx(400));  // the median of 300 and 500 (x4)
  const std::string md = to_markdown(law);
  CHECK_THAT(md, Catch::Contains("| 1024 | 3 | 0.1 | 2 | 2 | 1500.0 | 1536000 |"));
  CHECK_THAT(md, Catch::Contains("B_noise (the critical batch) = 512"));
  CHECK_THAT(md, Catch::Contains("No run reached the target at global batch 16384."));
  CHECK(nlohmann::json::parse(to_json(law)).at("fit").at("b_noise").get<double>() ==
        Approx(512));
  // Runs towards different targets are not one law.
  runs.back().status = "done";
  runs.back().target_accuracy = 0.8;
  CHECK_THROWS_AS(batch_law(runs), UserError);
  // A damaged epochs_to_target is refused, naming its run.
  std::vector<RunRecord> damaged = {run(64, 0.1, -1.0, 100), run(128, 0.1, 2.0, 100),
                                    run(256, 0.1, 1.0, 100)};
  CHECK_THAT(error_of([&] { batch_law(damaged); }),
             Catch::Contains("runs/b64: epochs_to_target -1 is not a count"));
  // Too few batches: no fit, and why.
  const BatchLaw two = batch_law({run(64, 0.1, 3.0, 100), run(128, 0.1, 2.0, 100)});
  CHECK_FALSE(two.fit.ok);
  CHECK_THAT(to_markdown(two), Catch::Contains("No fit: fewer than three batch sizes."));
}

TEST_CASE("report --batch-law over a small sweep of batches and LRs writes its tables",
          "[report][cli]") {
  TempDir d("batch-law");
  const auto cfg = d.path / "b.yaml";
  std::ofstream(cfg) << "name: bl\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 2048, test_size: 256, shape: [16], classes: 4, "
                        "noise: 0.5}\nmodel: {hidden: [32]}\n"
                        "train: {epochs: 4, per_replica_batch: 16, target_accuracy: 0.6}\n"
                        "optimizer: {lr: 0.05, base_batch: 16, lr_scaling: none}\n";
  const auto res = (d.path / "res").string();
  const auto r = dtrain_cli("run " + cfg.string() +
                            " train.per_replica_batch=16,64,256 optimizer.lr=0.05,0.2 --quiet "
                            "--tag s --results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto rep = dtrain_cli("report " + res + " --batch-law --out " + (d.path / "rep").string());
  INFO(rep.out);
  REQUIRE(rep.code == 0);
  CHECK_THAT(rep.out, Catch::Contains("batch-size law"));
  const auto j = nlohmann::json::parse(slurp(d.path / "rep" / "bl-batch-law.json"));
  CHECK(j.at("target_accuracy").get<double>() == 0.6);
  CHECK(j.at("rows").size() + j.at("never_reached").size() == 3);
  for (const auto& row : j["rows"]) CHECK(row.at("lrs_tried") == 2);
}
