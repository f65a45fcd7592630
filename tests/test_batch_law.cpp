// The batch-size law from run folders: each batch's best LR, batches that never reach the
// target, the fit and the noise scale beside it, and `report --batch-law` on real runs; the
// reference convergence points built from such a study, and runs judged against them.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/results/batch_law.hpp"
#include "dtrain/results/plots.hpp"
#include "dtrain/results/reference.hpp"
#include "dtrain/results/stats.hpp"
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
  RunRecord blown = run(4096, 0.8, std::nullopt, 100);  // a third seed at 4096 diverged
  blown.status = "diverged";
  runs.push_back(blown);
  RunRecord unfinished = run(64, 0.01, 1.0, 100);
  unfinished.status = "failed";
  runs.push_back(unfinished);
  const BatchLaw law = batch_law(runs);
  REQUIRE(law.rows.size() == 4);
  for (const BatchLawRow& r : law.rows) {
    INFO(r.global_batch);
    CHECK(r.lr == 0.1);
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
  CHECK_THAT(md, Catch::Contains("| 1024 | 3 | 0.1 | 2 | 2 | 1500.0 | 1536000 | 100 |"));
  CHECK_THAT(md, Catch::Contains("B_noise (the critical batch) = 512"));
  CHECK_THAT(md, Catch::Contains("No run reached the target at global batch 16384."));
  CHECK(nlohmann::json::parse(to_json(law)).at("fit").at("b_noise").get<double>() ==
        Approx(512));
  // Every LR tried: 3 at each of the 4 batches, the one at 16384; each LR's runs, reached and
  // diverged, the kept one marked.
  REQUIRE(law.tried.size() == 13);
  const BatchLawRow& fast = law.tried[2];  // batch 64, LR 0.8: one seed of two got there
  CHECK(fast.global_batch == 64);
  CHECK(fast.lr == 0.8);
  CHECK(fast.runs == 2);
  CHECK(fast.reached == 1);
  CHECK_FALSE(fast.kept);
  CHECK(law.tried[0].kept);  // 0.1 at batch 64
  CHECK(law.tried.back().global_batch == 16384);
  CHECK(law.tried.back().kept);  // the only LR there, though it never reached the target
  const std::string lrs = tried_markdown(law);
  CHECK_THAT(lrs, Catch::Contains("| 1024 | **0.1** | 2 | 2 | 0 | 1500.0 |"));
  CHECK_THAT(lrs, Catch::Contains("| 1024 | 0.4 | 1 | 1 | 0 | 2250.0 |"));
  CHECK_THAT(lrs, Catch::Contains("| 16384 | **0.1** | 1 | 0 | 0 | never |"));
  CHECK_THAT(tried_csv(law), Catch::Contains("\n64,0.8,2,1,0,4500,0\n"));
  CHECK_THAT(lrs, Catch::Contains("| 4096 | 0.8 | 3 | 1 | 1 | 562.5 |"));
  const auto tj = nlohmann::json::parse(tried_json(law));
  REQUIRE(tj.size() == 13);
  CHECK(tj[12].at("steps_to_target").is_null());
  CHECK(tj[0].at("kept") == true);
  // The figure, where gnuplot is installed (install-deps.sh installs it): the kept LRs' steps,
  // the others that reached the target, and the fit's curve with its numbers.
  if (gnuplot_available()) {
    TempDir fig("batch-law-figure");
    const std::string out = fig.path.string();
    REQUIRE(draw_batch_law(law, "a 'quoted' title", out, "law") == "");
    CHECK(slurp(fig.path / "law.png").substr(1, 3) == "PNG");
    CHECK_THAT(slurp(fig.path / "law.svg"), Catch::Contains("<svg"));
    CHECK(count_lines(slurp(fig.path / "data" / "law.dat")) == 1 + 4);
    CHECK(count_lines(slurp(fig.path / "data" / "law-other-lrs.dat")) == 1 + 8);
    const std::string script = slurp(fig.path / "data" / "law.gp");
    CHECK_THAT(script, Catch::Contains("1000 * (1 + 512 / x)"));
    CHECK_THAT(script, Catch::Contains("set arrow from 400, graph 0"));  // B_simple
    CHECK_THAT(script, !Catch::Contains("quoted"));  // titles travel as data
    CHECK(draw_batch_law(batch_law({run(64, 0.1, std::nullopt, 100)}), "t", out, "none") ==
          "no batch reached the target: nothing to draw");
  } else {
    WARN("SKIPPED: no gnuplot, no figure to check");
  }
  // Runs towards different targets are not one law.
  runs.back().status = "done";
  runs.back().target_accuracy = 0.8;
  CHECK_THROWS_AS(batch_law(runs), UserError);
  // A damaged epochs_to_target is refused, naming its run.
  std::vector<RunRecord> damaged = {run(64, 0.1, -1.0, 100), run(128, 0.1, 2.0, 100),
                                    run(256, 0.1, 1.0, 100)};
  CHECK_THAT(error_of([&] { batch_law(damaged); }),
             Catch::Contains("runs/b64: epochs_to_target -1 is not a count"));
  // Steps to target counted between epochs (train.eval_steps) are taken over whole epochs,
  // with their resolution.
  RunRecord fine = run(64, 0.1, 13.0, 100);
  fine.steps_to_target = 1234;
  fine.target_resolution_steps = 10;
  CHECK(steps_to_target(fine) == 1234);
  CHECK(resolution_steps(fine) == 10);
  CHECK(steps_to_target(run(64, 0.1, 13.0, 100)) == 1300);
  CHECK(resolution_steps(run(64, 0.1, 13.0, 100)) == 100);
  fine.steps_to_target = -3;
  CHECK_THAT(error_of([&] { steps_to_target(fine); }),
             Catch::Contains("runs/b64: steps_to_target -3 is not a count"));
  // Too few batches: no fit, and why.
  const BatchLaw two = batch_law({run(64, 0.1, 3.0, 100), run(128, 0.1, 2.0, 100)});
  CHECK_FALSE(two.fit.ok);
  CHECK_THAT(to_markdown(two), Catch::Contains("No fit: fewer than three batch sizes."));
}

// A learning rate run at more seeds is not preferred for that: of those whose runs all reached
// the target, the fewest mean steps wins; the count decides only among LRs where some run missed.
TEST_CASE("the batch-size law keeps the fastest LR whatever its number of seeds",
          "[report][stats]") {
  std::vector<RunRecord> runs;
  for (int seed = 0; seed < 6; ++seed) runs.push_back(run(64, 0.05, 20, 100));  // 2000 steps
  for (int seed = 0; seed < 3; ++seed) runs.push_back(run(64, 0.025, 10, 100));  // 1000 steps
  runs.push_back(run(128, 0.1, 12, 100));  // all of its 2 runs reached: kept
  runs.push_back(run(128, 0.1, 12, 100));
  for (int seed = 0; seed < 3; ++seed) runs.push_back(run(128, 0.2, 6, 100));  // 2 of 3 reached
  runs.back().epochs_to_target = std::nullopt;
  // None all reached: the largest share that did wins, not the most runs.
  for (int seed = 0; seed < 10; ++seed)
    runs.push_back(run(256, 0.4, seed < 5 ? std::optional<double>(3) : std::nullopt, 100));
  runs.push_back(run(256, 0.2, 9, 100));  // 2 of 3
  runs.push_back(run(256, 0.2, 8, 100));
  runs.push_back(run(256, 0.2, std::nullopt, 100));
  const BatchLaw law = batch_law(runs);
  REQUIRE(law.rows.size() == 3);
  CHECK(law.rows[0].lr == 0.025);
  // Runs with no target at all: nothing to fit, said so.
  std::vector<RunRecord> untargeted = {run(64, 0.1, std::nullopt, 100)};
  untargeted[0].target_accuracy = 0;
  CHECK_THAT(to_markdown(batch_law(untargeted)), Catch::StartsWith("No batch-size law: these "
                                                                   "runs set no target"));
  CHECK(law.rows[0].steps == Approx(1000));
  CHECK(law.rows[1].lr == 0.1);
  CHECK(law.rows[2].lr == 0.2);  // 2 of 3 reached, against 5 of 10
  CHECK(law.rows[2].steps == Approx(850));
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
  const auto lrs = nlohmann::json::parse(slurp(d.path / "rep" / "bl-batch-law-lrs.json"));
  CHECK(lrs.size() == 6);  // 3 batches x 2 LRs
  CHECK(fs::exists(d.path / "rep" / "bl-batch-law-lrs.md"));
  const auto ref = nlohmann::json::parse(slurp(d.path / "rep" / "bl-reference.json"));
  CHECK(ref.at("points").size() + ref.at("left_out").size() == 3);
  // A copy of a run passed with the study (another root) is the same run, not another seed:
  // said, and counted once.
  const fs::path first = fs::path(res) / "bl" / "s-g1-per_replica_batch16-lr0.05";
  REQUIRE(fs::is_directory(first));
  fs::create_directories(d.path / "copy" / "bl");
  fs::copy(first, d.path / "copy" / "bl" / first.filename(), fs::copy_options::recursive);
  const auto twice = dtrain_cli("report " + res + " " + (d.path / "copy").string() +
                                " --batch-law --out " + (d.path / "rep2").string());
  INFO(twice.out);
  REQUIRE(twice.code == 0);
  CHECK_THAT(twice.out, Catch::Contains("(run s-g1-per_replica_batch16-lr0.05 of bl, the same "
                                        "summary); counted once"));
  CHECK(slurp(d.path / "rep2" / "bl-batch-law-lrs.json") ==
        slurp(d.path / "rep" / "bl-batch-law-lrs.json"));
  // A summary that says a run reached its target in 0 steps is damaged: named, left out.
  const fs::path bad = d.path / "copy" / "bl" / first.filename() / "summary.json";
  auto js = nlohmann::json::parse(slurp(bad));
  js["steps_to_target"] = 0;
  put(bad, js.dump());
  const auto zero = dtrain_cli("report " + (d.path / "copy").string() + " --out " +
                               (d.path / "rep3").string());
  CHECK(zero.code == 1);
  CHECK_THAT(zero.out, Catch::Contains("'steps_to_target' is 0"));
  // So is one that reached it in 0 epochs, or in epochs of no step.
  js["steps_to_target"] = nullptr;
  js["epochs_to_target"] = 0;
  put(bad, js.dump());
  const auto no_epochs = dtrain_cli("report " + (d.path / "copy").string() + " --out " +
                                    (d.path / "rep4").string());
  CHECK(no_epochs.code == 1);
  CHECK_THAT(no_epochs.out, Catch::Contains("'epochs_to_target' is 0"));
  js["epochs_to_target"] = 2;
  js["steps_per_epoch"] = 0;
  put(bad, js.dump());
  const auto no_steps = dtrain_cli("report " + (d.path / "copy").string() + " --out " +
                                   (d.path / "rep5").string());
  CHECK(no_steps.code == 1);
  CHECK_THAT(no_steps.out,
             Catch::Contains("'steps_per_epoch' is 0 in a run that reached its target"));

  // Two replicas at the study's smallest batch, judged against it.
  const auto more = (d.path / "more").string();
  REQUIRE(dtrain_cli("run " + cfg.string() + " gpus=2 train.per_replica_batch=8 --quiet --tag m "
                     "--results " + more).code == 0);
  const auto vs = dtrain_cli("report " + more + " --reference " + res + " --out " +
                             (d.path / "vs").string());
  INFO(vs.out);
  REQUIRE(vs.code == 0);
  const auto checks = nlohmann::json::parse(slurp(d.path / "vs" / "bl-vs-reference.json"));
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].at("global_batch") == 16);
  CHECK(checks[0].at("verdict").get<std::string>() != "");
  // A study of another experiment, or none: refused before anything is written.
  const auto other = (d.path / "other").string();
  REQUIRE(dtrain_cli("run " + cfg.string() + " name=other train.epochs=1 --quiet --tag o "
                     "--results " + other).code == 0);
  const auto wrong = dtrain_cli("report " + more + " --reference " + other + " --out " +
                                (d.path / "vs2").string());
  CHECK(wrong.code == 2);
  CHECK_THAT(wrong.out, Catch::Contains("--reference " + other +
                                        ": no runs of experiment 'bl' (it has 'other')"));
  CHECK_FALSE(fs::exists(d.path / "vs2"));
  // A study whose runs set no target has no epochs to one to compare with.
  const auto untargeted = (d.path / "untargeted").string();
  REQUIRE(dtrain_cli("run " + cfg.string() +
                     " train.epochs=1 train.target_accuracy=0 --quiet "
                     "--tag u --results " +
                     untargeted)
              .code == 0);
  const auto none = dtrain_cli("report " + more + " --reference " + untargeted + " --out " +
                               (d.path / "vs3").string());
  CHECK(none.code == 2);
  CHECK_THAT(none.out, Catch::Contains("its runs of 'bl' set no target"));
  CHECK_FALSE(fs::exists(d.path / "vs3"));
  const auto missing = dtrain_cli("report " + more + " --reference " + (d.path / "nothing").string());
  CHECK(missing.code == 2);
  const auto empty = dtrain_cli("report " + more + " --reference ''");
  CHECK(empty.code == 2);
  CHECK_THAT(empty.out, Catch::Contains("--reference: give the folder of a batch-size study"));
}

TEST_CASE("reference points: olympic means per batch, interpolated between batches",
          "[report][stats]") {
  std::vector<RunRecord> runs;
  // Five runs at 64: the fastest (3) and the slowest (9) are left out, 4, 4, 5 stay.
  for (double e : {4.0, 9.0, 3.0, 5.0, 4.0}) runs.push_back(run(64, 0.1, e, 100));
  runs.push_back(run(64, 0.4, 2.0, 100));  // another LR that did not always get there
  runs.push_back(run(64, 0.4, std::nullopt, 100));
  // Three runs at 256: all stay.
  for (double e : {6.0, 7.0, 6.0}) runs.push_back(run(256, 0.2, e, 25));
  // Five runs at 1024, one of which never reached the target: left out as the slowest.
  for (std::optional<double> e : {std::optional<double>(9.0), {10.0}, {}, {9.0}, {8.0}})
    runs.push_back(run(1024, 0.4, e, 6));
  // Three at 4096, one never: no reference there.
  for (std::optional<double> e : {std::optional<double>(20.0), {}, {21.0}})
    runs.push_back(run(4096, 0.8, e, 2));
  const Reference ref = reference_points(runs);
  REQUIRE(ref.points.size() == 3);
  const ReferencePoint& a = ref.points[0];
  CHECK(a.global_batch == 64);
  CHECK(a.peak_lr == 0.1);
  CHECK(a.runs == 5);
  CHECK(a.kept == 3);
  CHECK(a.mean_epochs == Approx(13.0 / 3));
  CHECK(a.sd_epochs == Approx(std::sqrt(1.0 / 3)));
  CHECK(ref.points[1].kept == 3);
  CHECK(ref.points[1].mean_epochs == Approx(19.0 / 3));
  CHECK(ref.points[2].mean_epochs == Approx(28.0 / 3));  // 8 and never left out: 9, 9, 10
  REQUIRE(ref.left_out.size() == 1);
  CHECK_THAT(ref.left_out[0], Catch::Contains("global batch 4096: 1 of 3 runs at LR 0.8 did not "
                                              "reach the target"));
  // A third of the way from 64 to 256: a third of the way from 13/3 to 19/3.
  const auto at128 = reference_at(ref, 128);
  REQUIRE(at128);
  CHECK(at128->interpolated);
  CHECK(at128->mean_epochs == Approx(5.0));
  CHECK(at128->sd_epochs == Approx(std::sqrt(1.0 / 3)));
  CHECK(reference_at(ref, 256)->mean_epochs == Approx(19.0 / 3));
  CHECK_FALSE(reference_at(ref, 32));
  CHECK_FALSE(reference_at(ref, 2048));  // beyond the last batch with a reference
  // A batch the study left out between two with points: none at it, none across it.
  std::vector<RunRecord> gap = runs;
  for (std::optional<double> e : {std::optional<double>(7.0), {}, {}})
    gap.push_back(run(512, 0.3, e, 12));
  const Reference holed = reference_points(gap);
  CHECK(holed.left_out_batches == std::vector<long long>{512, 4096});
  CHECK_FALSE(reference_at(holed, 512));
  CHECK_FALSE(reference_at(holed, 384));
  CHECK(reference_at(holed, 128));  // 64 to 256: nothing left out between
  CHECK_THAT(to_markdown(ref), Catch::Contains("| 64 | 0.1 | 5 | 3 | 4.33 | 0.58 |"));
  CHECK_THAT(to_markdown(ref), Catch::Contains("Left out: global batch 4096"));
}

TEST_CASE("runs are judged against the reference at their global batch", "[report][stats]") {
  std::vector<RunRecord> study;
  for (double e : {4.0, 9.0, 3.0, 5.0, 4.0}) study.push_back(run(64, 0.1, e, 100));
  for (double e : {6.0, 7.0, 6.0}) study.push_back(run(256, 0.2, e, 25));
  const Reference ref = reference_points(study);
  // t(0.975, 2) sd sqrt(1 + 1/3) with sd = sqrt(1/3) is t x 2/3; then one epoch each side.
  const double half = t_quantile(0.975, 2) * 2.0 / 3 + 1;
  std::vector<RunRecord> runs = {run(64, 0.1, 4.0, 100), run(64, 0.1, 13.0 / 3 + half + 0.01, 100),
                                 run(128, 0.1, 1.0, 50), run(64, 0.1, std::nullopt, 100),
                                 run(8192, 0.1, 1.0, 8), run(64, 0.1, 4.0, 100)};
  runs.back().target_accuracy = 0.8;
  RunRecord failed = run(64, 0.1, 4.0, 100);
  failed.status = "failed";
  runs.push_back(failed);
  const auto checks = check_against(ref, runs);
  REQUIRE(checks.size() == 6);  // the failed run is not judged
  CHECK(checks[0].verdict == Convergence::within);
  CHECK(checks[0].low == Approx(13.0 / 3 - half));
  CHECK(checks[0].high == Approx(13.0 / 3 + half));
  CHECK(checks[1].verdict == Convergence::slower);
  CHECK(checks[2].verdict == Convergence::faster);  // 1 epoch where the reference says 5 -+ 3.9
  CHECK(checks[2].at->interpolated);
  CHECK(checks[3].verdict == Convergence::not_reached);
  CHECK(checks[4].verdict == Convergence::no_reference);
  CHECK(checks[5].verdict == Convergence::other_target);
  const std::string md = checks_markdown(ref, checks);
  CHECK_THAT(md, Catch::Contains("| 5.00 (interpolated) |"));
  CHECK_THAT(md, Catch::Contains("slower than the reference"));
  const auto j = nlohmann::json::parse(checks_json(checks));
  CHECK(j[4]["reference"].is_null());
  CHECK(j[1]["verdict"] == "slower than the reference");
}
