// Why N replicas are not N times faster: the waterfall's terms on epochs with known phases, and
// `dtrain explain-time` on two real runs.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/results/time_gap.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

EpochMetrics epoch(double total, double data, double compute, double optimizer, double exposed,
                   double busy_max) {
  EpochMetrics m;
  m.epoch_time_s = total;
  m.data_s = data;
  m.compute_s = compute;
  m.optimizer_s = optimizer;
  m.exchange_exposed_s = exposed;
  m.exchange_s = exposed;
  m.rank_busy_max_s = busy_max;
  return m;
}

}  // namespace

TEST_CASE("the time waterfall's terms add up to the measured epoch", "[report]") {
  // 1 replica: 8 s an epoch (data 0.4, compute 6, optimizer 1, rest 0.6); the first epoch
  // (slower) is left out of the medians.
  const std::vector<EpochMetrics> one = {epoch(20, 1, 15, 2, 0, 18), epoch(8, 0.4, 6, 1, 0, 7.4),
                                         epoch(8, 0.4, 6, 1, 0, 7.4)};
  // 4 replicas: compute 2 (not 1.5), data 0.1, optimizer 1 (each replica: not 0.25), exposed
  // exchange 0.9 of which 0.3 waiting for a rank busy 3.4 against rank 0's 3.1.
  const std::vector<EpochMetrics> four = {epoch(9, 0.1, 2, 1, 0.9, 3.4),
                                          epoch(4.4, 0.1, 2, 1, 0.9, 3.4)};
  const TimeGap g = time_gap(one, 1, four, 4);
  CHECK(g.epochs_small == 2);
  CHECK(g.epochs_large == 1);
  CHECK(g.ideal == Approx(2.0));
  CHECK(g.measured_large == Approx(4.4));
  std::map<std::string, double> t;
  double sum = g.ideal;
  for (const auto& term : g.terms) {
    t[term.name] = term.seconds;
    sum += term.seconds;
  }
  CHECK(sum == Approx(g.measured_large));
  CHECK(t["compute"] == Approx(0.5));
  CHECK(t["data"] == Approx(0.0));
  CHECK(t["optimizer"] == Approx(0.75));
  CHECK(t["waiting"] == Approx(0.3));
  CHECK(t["exchange"] == Approx(0.6));
  CHECK(t["the rest"] == Approx(0.25));  // 4.4 - (2 + 0.5 + 0 + 0.75 + 0.3 + 0.6)
  const std::string md = to_markdown(g);
  CHECK_THAT(md, Catch::Contains("| + optimizer | +0.750 | 31% |"));
  CHECK_THAT(md, Catch::Contains("speedup 1.82x of 4x"));
  CHECK_THAT(md, Catch::Contains("| seconds per epoch |"));
  // Epochs under 0.1 s in milliseconds, where seconds would read 0.000 throughout.
  TimeGap tiny = g;
  const double k = 1e-4;
  tiny.ideal *= k;
  tiny.measured_small *= k;
  tiny.measured_large *= k;
  for (auto& term : tiny.terms) term.seconds *= k;
  const std::string tiny_md = to_markdown(tiny);
  CHECK_THAT(tiny_md, Catch::Contains("| milliseconds per epoch |") &&
                          Catch::Contains("| + optimizer | +0.075 | 31% |") &&
                          Catch::Contains("| ideal (0.800 ms x 1/4) | 0.200 |"));
  CHECK(nlohmann::json::parse(to_json(g)).at("terms").size() == 6);
  CHECK_THROWS_AS(time_gap(one, 4, four, 4), UserError);
  CHECK_THROWS_AS(time_gap({}, 1, four, 4), UserError);
  // Every phase from the one median epoch, not a median per column: epochs 2..4 of 5, 6, 7 s
  // whose data times rise the other way.
  const std::vector<EpochMetrics> mixed = {epoch(30, 0, 9, 1, 0, 10), epoch(7, 0.1, 5, 1, 0, 6.1),
                                           epoch(5, 0.3, 3, 1, 0, 4.3), epoch(6, 0.2, 4, 1, 0, 5.2)};
  const TimeGap m = time_gap(mixed, 1, four, 4);
  CHECK(m.measured_small == 6);
  CHECK(m.terms[1].seconds == Approx(0.1 - 0.2 / 4));  // data from the 6 s epoch
  // Synchronised BatchNorm: 0.4 s of the 4-replica run's compute exchanged statistics, a term
  // of its own, and the terms still add up.
  std::vector<EpochMetrics> synced = four;
  for (auto& e : synced) e.bn_sync_s = 0.4;
  TimeGap b = time_gap(one, 1, synced, 4);
  REQUIRE(b.terms.size() == 7);
  CHECK(b.terms[0].seconds == Approx(0.1));  // compute: 2 - 0.4 against 6/4
  CHECK(b.terms[5].name == "bn sync");
  CHECK(b.terms[5].seconds == Approx(0.4));
  CHECK(b.terms[6].name == "the rest");
  double all = b.ideal;
  for (const auto& term : b.terms) all += term.seconds;
  CHECK(all == Approx(b.measured_large));
  ProjectedEpoch q;
  q.link = "l";
  q.steps_per_epoch = 25;
  q.epoch_s = 2;
  add_projection(b, q);
  CHECK(b.terms[5].projected[0] == 0);  // the model has no synchronised BatchNorm
  // A damaged metrics.csv (NaN, a negative time) is refused, not averaged.
  std::vector<EpochMetrics> damaged = four;
  damaged.back().compute_s = std::nan("");
  CHECK_THROWS_AS(time_gap(one, 1, damaged, 4), UserError);
  damaged.back().compute_s = -1;
  CHECK_THROWS_AS(time_gap(one, 1, damaged, 4), UserError);
}

TEST_CASE("a projection's terms stand beside the measured ones and add up to its epoch",
          "[report]") {
  const std::vector<EpochMetrics> one = {epoch(8, 0.4, 6, 1, 0, 7.4), epoch(8, 0.4, 6, 1, 0, 7.4)};
  const std::vector<EpochMetrics> four = {epoch(4.4, 0.1, 2, 1, 0.9, 3.4),
                                          epoch(4.4, 0.1, 2, 1, 0.9, 3.4)};
  TimeGap g = time_gap(one, 1, four, 4);
  // One epoch is only the start; a time past 1e9 s is a damaged file.
  CHECK_THAT(error_of([&] { time_gap(one, 1, {four[0]}, 4); }),
             Catch::Contains("the second run has 1 epoch; the time gap is read from the epochs "
                             "after the first"));
  EpochMetrics bad = epoch(1e308, 0.4, 6, 1, 0, 7.4);
  bad.epoch = 2;
  CHECK_THAT(error_of([&] {
               time_gap({one[0], bad}, 1, four, 4);
             }),
             Catch::Contains("the first run's epoch 2 has epoch_time_s 1e+308, not a number of "
                             "seconds in [0, 1e9]"));
  bad = epoch(8, 0.4, std::numeric_limits<double>::infinity(), 1, 0, 7.4);
  bad.epoch = 2;
  CHECK_THAT(error_of([&] {
               time_gap(one, 1, {four[0], bad}, 4);
             }),
             Catch::Contains("the second run's epoch 2 has compute_s inf,"));
  // 100 steps an epoch at 1 replica, 25 at 4: per step data 4 ms, compute 60, optimizer 10,
  // and 8 ms of exposed exchange at 4.
  ProjectedEpoch p;
  p.link = "test-link";
  p.steps_per_epoch = 25;
  p.data_s = 0.004;
  p.compute_s = 0.06;
  p.optimizer_s = 0.01;
  p.exposed_s = 0.008;
  p.epoch_s = 25 * (0.004 + 0.06 + 0.01 + 0.008);
  add_projection(g, p);
  REQUIRE(g.projections.size() == 1);
  std::map<std::string, double> t;
  double sum = g.ideal;
  for (const auto& term : g.terms) {
    REQUIRE(term.projected.size() == 1);
    t[term.name] = term.projected[0];
    sum += term.projected[0];
  }
  CHECK(sum == Approx(p.epoch_s));
  CHECK(t["compute"] == Approx(25 * 0.06 - 6.0 / 4));  // 0: no contention in the model
  CHECK(t["optimizer"] == Approx(25 * 0.01 - 1.0 / 4));
  CHECK(t["waiting"] == 0);
  CHECK(t["exchange"] == Approx(25 * 0.008));
  const std::string md = to_markdown(g);
  CHECK_THAT(md, Catch::Contains("| projected (test-link) |"));
  CHECK_THAT(md, Catch::Contains("| + exchange | +0.600 | 25% | +0.200 |"));
  const auto j = nlohmann::json::parse(to_json(g));
  CHECK(j["projections"][0]["epoch_s"].get<double>() == Approx(2.05));
  CHECK(j["terms"][4]["projected"]["test-link"].get<double>() == Approx(0.2));

  // A projection file: its row for 4 replicas, none for 3; a damaged one is named.
  const std::string file = R"({"link": {"name": "pcie4"},
    "step_1_replica_s": {"data": 0.004, "compute": 0.06, "optimizer": 0.01},
    "rows": [{"gpus": 2, "steps_per_epoch": 50, "exposed_s": 0.002, "epoch_s": 3.8},
             {"gpus": 4, "steps_per_epoch": 25, "exposed_s": 0.008, "epoch_s": 2.05}]})";
  const auto row = projected_epoch(file, "p.json", 4);
  REQUIRE(row);
  CHECK(row->link == "pcie4");
  CHECK(row->steps_per_epoch == 25);
  CHECK(row->exposed_s == 0.008);
  CHECK(row->compute_s == 0.06);
  CHECK_FALSE(projected_epoch(file, "p.json", 3));
  std::string negative = file;
  negative.replace(negative.find("0.008"), 5, "-1e99");
  CHECK_THAT(error_of([&] { projected_epoch(negative, "p.json", 4); }),
             Catch::Contains("p.json: not a projection dtrain project wrote ('exposed_s' is"));
  CHECK_THROWS_AS(projected_epoch("[1, 2", "p.json", 4), UserError);
  CHECK_THROWS_AS(projected_epoch(std::string(100, '[') + std::string(100, ']'), "p.json", 4),
                  UserError);
  CHECK_THROWS_AS(projected_epoch(R"({"rows": []})", "p.json", 4), UserError);
}

TEST_CASE("explain-time reads two run folders and refuses what it cannot use", "[report][cli]") {
  TempDir d("explain-time");
  const auto cfg = d.path / "t.yaml";
  std::ofstream(cfg) << "name: t\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 1024, test_size: 64, shape: [16], classes: 4}\n"
                        "model: {hidden: [32]}\n"
                        "train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0}\n"
                        "optimizer: {lr: 0.05, base_batch: 16}\n";
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg.string() + " gpus=1,2 --quiet --tag x --results " + res).code ==
          0);
  const auto one = (fs::path(res) / "t" / "x-g1").string(),
             two = (fs::path(res) / "t" / "x-g2").string();
  const auto json = (d.path / "gap.json").string();
  const auto r = dtrain_cli("explain-time " + one + " " + two + " --json " + json);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("| + waiting |"));
  const auto j = nlohmann::json::parse(slurp(json));
  double sum = j.at("ideal_s").get<double>();
  for (const auto& t : j.at("terms")) sum += t.at("seconds").get<double>();
  CHECK(sum == Approx(j.at("measured_large_s").get<double>()));
  CHECK(j.at("ideal_s").get<double>() == Approx(j.at("measured_small_s").get<double>() / 2));
  for (const auto& t : j.at("terms"))
    if (t.at("name") == "waiting") CHECK(t.at("seconds").get<double>() >= 0);
  CHECK(j.at("projections").empty());
  // A projection of the 1-replica run, made by `dtrain project`, joins the waterfall; a
  // damaged projection file beside it is named in a warning and passed over.
  REQUIRE(dtrain_cli("project " + one + " --link pcie4 --gpus 2,4").code == 0);
  put(fs::path(one) / "projection-zz.json", "{\"rows\": 5}");
  const auto projected = dtrain_cli("explain-time " + one + " " + two + " --json " + json);
  INFO(projected.out);
  REQUIRE(projected.code == 0);
  CHECK_THAT(projected.out, Catch::Contains("| projected (pcie4) |"));
  CHECK_THAT(projected.out, Catch::Contains("projection-zz.json: not a projection"));
  const auto pj = nlohmann::json::parse(slurp(json));
  REQUIRE(pj.at("projections").size() == 1);
  double projected_sum = pj.at("ideal_s").get<double>();
  for (const auto& t : pj.at("terms")) projected_sum += t.at("projected").at("pcie4").get<double>();
  CHECK(projected_sum == Approx(pj.at("projections")[0].at("epoch_s").get<double>()));
  // Another model (or data set) is refused, naming the key; model.batchnorm may differ.
  REQUIRE(dtrain_cli("run " + cfg.string() + " gpus=2 model.hidden=[64] --quiet --tag m " +
                     "--results " + res)
              .code == 0);
  const auto wider =
      dtrain_cli("explain-time " + one + " " + (fs::path(res) / "t" / "m-g2").string());
  CHECK(wider.code == 2);
  CHECK_THAT(wider.out, Catch::Contains("has model.hidden=[32] and") &&
                            Catch::Contains("has [64]: the two runs must train one model"));
  // The wrong way round, and a folder that is no run: one line, exit 2.
  const auto swapped = dtrain_cli("explain-time " + two + " " + one);
  CHECK(swapped.code == 2);
  CHECK_THAT(swapped.out, Catch::Contains("needs more replicas"));
  // `explain --time` is the same command.
  const auto alias = dtrain_cli("explain " + two + " --time " + one);
  CHECK(alias.code == 2);
  CHECK(alias.out == swapped.out);
  CHECK(dtrain_cli("explain-time " + one + " " + d.path.string()).code == 2);
  const auto lone = dtrain_cli("explain-time " + one);  // the other run forgotten
  CHECK(lone.code == 2);
  CHECK_THAT(lone.out, Catch::Contains("give two run folders") && Catch::Contains("one was given"));
  const auto file = dtrain_cli("explain-time " + one + " " + cfg.string());  // not a run
  CHECK(file.code == 2);
  CHECK_THAT(file.out, Catch::Contains("is not a run folder (give two run folders"));
  // An output that is not a regular file is never replaced.
  CHECK(dtrain_cli("explain-time " + one + " " + two + " --json " + d.path.string()).code == 2);
  // Nor a run's own files: explain-time --json, project --out and report --out that would
  // write over them are refused, one line and exit 2, the run left as it was.
  const std::string one_summary = slurp(fs::path(one) / "summary.json");
  const auto over = dtrain_cli("explain-time " + one + " " + two + " --json " + one +
                               "/summary.json");
  CHECK(over.code == 2);
  CHECK_THAT(over.out, Catch::Contains("that is the run's own summary.json in " + one));
  const auto classes = dtrain_cli("explain-time " + one + " " + two + " --json " + one +
                                  "/skipped-files.txt");
  CHECK(classes.code == 2);
  CHECK_THAT(classes.out, Catch::Contains("that is the run's own skipped-files.txt"));
  // Nor what an experiment keeps beside its runs: a tag's index and comparison table.
  const fs::path exp_dir = fs::path(one).parent_path();
  int tag_files = 0;
  for (const auto& f : fs::directory_iterator(exp_dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("index-", 0) != 0 && name.rfind("comparison-", 0) != 0) continue;
    ++tag_files;
    const std::string before = slurp(f.path());
    const auto over_index = dtrain_cli("explain-time " + one + " " + two + " --json " +
                                       f.path().string());
    CHECK(over_index.code == 2);
    CHECK_THAT(over_index.out, Catch::Contains("write elsewhere"));
    if (f.path().extension() == ".md") {  // project --out STEM writes STEM.md and STEM.json
      fs::path stem = f.path();
      const auto proj_cmp = dtrain_cli("project " + one + " --out " +
                                       stem.replace_extension().string());
      CHECK(proj_cmp.code == 2);
      CHECK_THAT(proj_cmp.out, Catch::Contains("a tag's comparison table"));
    }
    CHECK(slurp(f.path()) == before);
  }
  CHECK(tag_files >= 3);  // index-<tag>.csv, comparison-<tag>.md and .csv
  const auto proj = dtrain_cli("project " + one + " --out " + one + "/metrics.csv/../summary");
  CHECK(proj.code == 2);
  CHECK_THAT(proj.out, Catch::Contains("that is the run's own summary.json"));
  const auto rep = dtrain_cli("report " + res + " --out " + two);
  CHECK(rep.code == 2);
  CHECK_THAT(rep.out, Catch::Contains("that is a run folder"));
  CHECK(slurp(fs::path(one) / "summary.json") == one_summary);
  // Runs of two experiments: refused.
  const auto other = d.path / "o.yaml";
  std::ofstream(other) << slurp(cfg).replace(0, 7, "name: o");
  REQUIRE(dtrain_cli("run " + other.string() + " gpus=2 --quiet --tag y --results " + res).code ==
          0);
  const auto mixed = dtrain_cli("explain-time " + one + " " +
                                (fs::path(res) / "o" / "y-g2").string());
  CHECK(mixed.code == 2);
  CHECK_THAT(mixed.out, Catch::Contains("must be of one experiment"));
  // A run that did not finish: refused.
  const fs::path failed = d.path / "failed-g2";
  fs::copy(two, failed, fs::copy_options::recursive);
  std::string summary = slurp(failed / "summary.json");
  const std::string done = "\"status\": \"done\"";
  REQUIRE(summary.find(done) != std::string::npos);
  summary.replace(summary.find(done), done.size(), "\"status\": \"failed\"");
  put(failed / "summary.json", summary);
  const auto unfinished = dtrain_cli("explain-time " + one + " " + failed.string());
  CHECK(unfinished.code == 2);
  CHECK_THAT(unfinished.out, Catch::Contains("is failed, not done"));
}
