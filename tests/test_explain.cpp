// dtrain explain: the rungs from the 1-replica run to the N-replica run (planning only), and
// one CLI run on a tiny synthetic config where the equivalent rung matches the baseline.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "dtrain/config/plan.hpp"
#include "dtrain/nn/schedule.hpp"
#include "dtrain/train/explain.hpp"
#include "dtrain/results/plots.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// One config file at gpus=1 (32 per replica, linear scaling from base_batch 128).
Config base_config() {
  Config c = synthetic_config(1, 32);
  c.optimizer.lr_scaling = LrScaling::linear;
  return c;
}

// The user's 4-replica run: the same per-replica batch (so a 4x global batch), linear
// scaling, and sum instead of mean.
Config user_config() {
  Config c = base_config();
  c.gpus = 4;
  c.train.reduction = Reduction::sum;
  return c;
}

// The config a rung's overrides give from `base` written as a file.
Config apply(const Config& base, const ExplainRung& r) {
  std::vector<Override> ov;
  for (const auto& t : r.overrides) ov.push_back(parse_override(t));
  return parse_config(to_yaml(base), "base.yaml", ov);
}

std::vector<std::string> names(const std::vector<ExplainRung>& rs, bool with_skipped) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (with_skipped || !r.skipped) out.push_back(r.name);
  return out;
}

}  // namespace

TEST_CASE("explain: the rungs for a user config that changes batch, LR rule and reduction",
          "[explain]") {
  const Config base = base_config(), user = user_config();
  const auto rs = plan_explain(base, user, parse_explain_order(""));
  CHECK(names(rs, true) == std::vector<std::string>{"baseline", "equivalent", "global_batch",
                                                    "lr_rule", "warmup", "batchnorm",
                                                    "reduction", "sharding", "accumulation"});
  // The MLP has no BatchNorm: the equivalent's sync BatchNorm changes nothing, so the
  // batchnorm rung is not run.
  CHECK(names(rs, false) == std::vector<std::string>{"baseline", "equivalent", "global_batch",
                                                     "lr_rule", "reduction"});
  CHECK(rs[5].change.find("no BatchNorm layer") != std::string::npos);
  CHECK(rs[2].change == "per_replica_batch 8 -> 32");
  CHECK(rs[3].change == "lr_scaling none -> linear, lr 0.0125 -> 0.05");
  CHECK(rs[6].change == "reduction mean -> sum");
  CHECK(rs[4].change.find("unchanged") != std::string::npos);
  // Rung 0 is the config at gpus=1; the last rung is exactly the user's config.
  CHECK(to_yaml(apply(base, rs[0])) == to_yaml(base));
  CHECK(to_yaml(apply(base, rs.back())) == to_yaml(user));
}

TEST_CASE("explain: the equivalent rung is the baseline's step on N replicas", "[explain]") {
  const Config base = base_config(), user = user_config();
  const Config eq = apply(base, plan_explain(base, user, parse_explain_order(""))[1]);
  CHECK(eq.gpus == 4);
  CHECK(eq.train.per_replica_batch == 8);
  CHECK(eq.global_batch() == base.global_batch());
  CHECK(eq.train.reduction == Reduction::mean);
  CHECK(eq.model.batchnorm == BatchNormMode::sync);
  CHECK(eq.optimizer.lr_scaling == LrScaling::none);
  CHECK(scaled_lr(eq.optimizer, eq.global_batch()) ==
        scaled_lr(base.optimizer, base.global_batch()));
  CHECK(eq.optimizer.warmup_epochs == base.optimizer.warmup_epochs);
  CHECK(eq.data.sharding == base.data.sharding);
  CHECK(eq.data.shuffle == base.data.shuffle);
  CHECK(eq.train.accumulation_steps == base.train.accumulation_steps);
}

TEST_CASE("explain: with warmup to a scaled LR the equivalent keeps the baseline's rule",
          "[explain]") {
  Config base = base_config();
  base.optimizer.base_batch = 16;  // the 1-replica run scales 0.05 to 0.1, after a warmup
  base.optimizer.warmup_epochs = 1;
  Config user = user_config();
  user.optimizer = base.optimizer;
  const auto rs = plan_explain(base, user, explain_settings());
  const Config eq = apply(base, rs[1]);
  CHECK(eq.optimizer.lr_scaling == LrScaling::linear);
  CHECK(eq.optimizer.lr == base.optimizer.lr);
  CHECK(eq.global_batch() == base.global_batch());
  CHECK(rs[1].change.find("LR rule and LR") != std::string::npos);
}

TEST_CASE("explain: the equivalent run's LRs are the baseline's, floor and warmup included",
          "[explain]") {
  for (const WarmupFrom from : {WarmupFrom::lr, WarmupFrom::zero}) {
    for (const double warmup : {0.0, 1.0}) {
      Config base = base_config();  // 32 of base_batch 128: the rule scales lr by a quarter
      base.optimizer.schedule = Schedule::cosine;
      base.optimizer.min_lr = 0.01;
      base.optimizer.warmup_epochs = warmup;
      base.optimizer.warmup_from = from;
      Config user = user_config();
      user.optimizer = base.optimizer;
      const Config eq = apply(base, plan_explain(base, user, explain_settings())[1]);
      INFO(to_string(from) << " warmup " << warmup);
      for (const double pos : {0.0, 0.5, 1.0, 2.5, 4.0})
        CHECK(lr_at(eq.optimizer, eq.train.epochs, eq.global_batch(), pos) ==
              Approx(lr_at(base.optimizer, base.train.epochs, base.global_batch(), pos)));
    }
  }
}

TEST_CASE("explain: --order is respected and unknown names are refused", "[explain]") {
  const auto order = parse_explain_order("reduction,global_batch");
  CHECK(order == std::vector<std::string>{"reduction", "global_batch", "lr_rule", "warmup",
                                          "batchnorm", "sharding", "accumulation"});
  const auto rs = plan_explain(base_config(), user_config(), order);
  CHECK(names(rs, false) == std::vector<std::string>{"baseline", "equivalent", "reduction",
                                                     "global_batch", "lr_rule"});
  CHECK(to_yaml(apply(base_config(), rs.back())) == to_yaml(user_config()));
  CHECK(error_of([] { parse_explain_order("batch"); }).find("unknown setting 'batch'") !=
        std::string::npos);
  CHECK(error_of([] { parse_explain_order("warmup,warmup"); }).find("twice") !=
        std::string::npos);
}

TEST_CASE("explain: refuses what has no exact equivalent", "[explain]") {
  Config user = user_config();
  user.gpus = 3;  // 32 does not divide by 3
  CHECK(error_of([&] { plan_explain(base_config(), user, explain_settings()); })
            .find("does not divide") != std::string::npos);
  user.gpus = 1;
  CHECK(error_of([&] { plan_explain(base_config(), user, explain_settings()); })
            .find("N >= 2") != std::string::npos);
  Config base = base_config();
  base.train.global_batch = 32;
  CHECK(error_of([&] { plan_explain(base, user_config(), explain_settings()); })
            .find("global_batch") != std::string::npos);
}

TEST_CASE("explain CLI: sum reduction carries the gap, the equivalent matches", "[explain][cli]") {
  TempDir dir("explain");
  const auto cfg = dir.write("tiny.yaml", tiny_config("tiny"));
  const auto res = (dir.path / "results").string();
  // lr 0.4: large enough that summing 2 replicas' gradients visibly hurts.
  const std::string args = cfg + " gpus=2 train.reduction=sum optimizer.lr=0.4";
  const auto r = dtrain_cli("explain " + args + " -q --tag t --results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("matches the baseline") != std::string::npos);
  CHECK(r.out.find("DOES NOT") == std::string::npos);
  CHECK(r.out.find("order of the rungs matters") != std::string::npos);
  const auto j = nlohmann::json::parse(slurp(dir.path / "results" / "tiny" / "explain-t-gpus_2.json"));
  REQUIRE(j["equivalent_matches"].get<bool>());
  // At lr 0.8 the run is chaotic: the 4-replica sum's rounding grows past 1e-4 in 4 epochs. One
  // seed cannot tell that from a step that differs, and explain says so, not "DOES NOT match".
  const auto c = dtrain_cli("explain " + cfg +
                            " gpus=4 optimizer.lr=0.8 train.epochs=4 -q --tag c "
                            "--results " +
                            res);
  INFO(c.out);
  REQUIRE(c.code == 0);
  CHECK_THAT(c.out, Catch::Contains("The equivalent run differs from the baseline by ") &&
                        Catch::Contains("one finite loss a side (1 and 1 seeds) cannot tell") &&
                        !Catch::Contains("DOES NOT"));
  // Dropout draws its masks per replica: the equivalent run cannot take the baseline's steps,
  // and the line says so rather than blame rounding.
  const auto drop = dtrain_cli("explain " + cfg + " gpus=2 model.dropout=0.5 -q --tag drop " +
                               "--results " + res);
  INFO(drop.out);
  REQUIRE(drop.code == 0);
  CHECK_THAT(drop.out, Catch::Contains("dropout draws random numbers per replica") &&
                           !Catch::Contains("rounds differently"));
  // Every run diverged: nothing to compare, and said so.
  const auto d = dtrain_cli("explain " + cfg +
                            " gpus=2 optimizer.lr=1000000 "
                            "optimizer.lr_scaling=none -q --tag d --results " +
                            res);
  INFO(d.out);
  CHECK_THAT(d.out, Catch::Contains("The baseline and the equivalent run diverged (no finite "
                                    "final train loss in any seed): nothing to compare") &&
                        !Catch::Contains("DOES NOT"));
  // The rung with the largest |delta| in accuracy, and in train loss.
  std::string by_acc, by_loss;
  double best_acc = -1, best_loss = -1;
  for (const auto& rung : j["rungs"]) {
    if (rung["skipped"].get<bool>() || rung["name"] == "baseline") continue;
    const auto& da = rung["delta_acc_points"];
    const auto& dl = rung["delta_train_loss"];
    if (!da.is_null() && std::abs(da["value"].get<double>()) > best_acc)
      best_acc = std::abs(da["value"].get<double>()), by_acc = rung["name"];
    if (!dl.is_null() && std::abs(dl["value"].get<double>()) > best_loss)
      best_loss = std::abs(dl["value"].get<double>()), by_loss = rung["name"];
  }
  INFO("largest accuracy change: " << by_acc << ", largest loss change: " << by_loss);
  CHECK((by_acc == "reduction" || by_loss == "reduction"));
  // One seed per rung: a delta but no test, and no p columns in the table.
  const auto& one = j["rungs"][2]["delta_acc_points"];
  CHECK(one["test"] == "too_few");
  CHECK(one["p"].is_null());
  CHECK(one["distinguishable"].is_null());
  CHECK(!one.contains("noise"));
  CHECK(r.out.find("| acc p |") == std::string::npos);
  CHECK(r.out.find("not distinguishable") == std::string::npos);
  // The waterfall figure, where gnuplot is installed (install-deps.sh installs it): a bar per
  // rung after the baseline, each labelled with its name in the script.
  if (dtrain::gnuplot_available()) {
    const auto tiny = dir.path / "results" / "tiny";
    CHECK(std::filesystem::file_size(tiny / "explain-t-gpus_2.png") > 1000);
    CHECK(std::filesystem::file_size(tiny / "explain-t-gpus_2.svg") > 1000);
    const std::string script = slurp(tiny / "data" / "explain-t-gpus_2.gp");
    CHECK(script.find("'reduction'") != std::string::npos);
    int ran = 0;  // the rungs with a change from the one before: one bar each
    for (const auto& rung : j["rungs"])
      ran += rung.contains("delta_acc_points") && !rung["delta_acc_points"].is_null();
    CHECK(ran >= 3);
    CHECK(count_lines(slurp(tiny / "data" / "explain-t-gpus_2.dat")) == 1 + ran);
  } else {
    WARN("SKIPPED: no gnuplot, no figure to check");
  }
  // --resume with the same tag runs nothing again.
  const auto again = dtrain_cli("explain " + args + " --tag t --resume --results " + res);
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK(again.out.find("already finished") != std::string::npos);
  // The same tag without --resume, even with other settings (other run names), is refused
  // before anything runs, and the finished explanation is kept.
  const std::string md = slurp(dir.path / "results" / "tiny" / "explain-t-gpus_2.md");
  const auto over = dtrain_cli("explain " + cfg + " gpus=2 --seeds 2 --tag t --results " + res);
  CHECK(over.code == 2);
  CHECK_THAT(over.out, Catch::Contains("exists already; pick another --tag"));
  CHECK(slurp(dir.path / "results" / "tiny" / "explain-t-gpus_2.md") == md);
  // Nor with --resume and other seeds: that would train other runs and replace the table.
  const auto seeds =
      dtrain_cli("explain " + args + " --seeds 2 --tag t --resume --results " + res);
  CHECK(seeds.code == 2);
  CHECK_THAT(seeds.out, Catch::Contains("made with --seeds 1; --resume continues it with the same"));
  CHECK(slurp(dir.path / "results" / "tiny" / "explain-t-gpus_2.md") == md);
  CHECK(dtrain_cli("explain " + cfg + " gpus=2 --order nope --results " + res).code == 2);
}

namespace {

// A delta of explain's JSON against the two rungs' statistics (mean, sd over 3 seeds), in
// units of `scale`: the fields exist and agree with each other and with Welch's formulas.
void check_delta(const nlohmann::json& d, const nlohmann::json& prev, const nlohmann::json& cur,
                 double scale) {
  INFO(d.dump());
  REQUIRE(d.is_object());
  CHECK(!d.contains("noise"));
  REQUIRE(d["test"] == "welch");
  CHECK(d["n"] == nlohmann::json::array({3, 3}));
  const double value = d["value"], lo = d["ci_low"], hi = d["ci_high"], p = d["p"];
  const double se = d["se"], df = d["df"];
  CHECK(value == Approx(scale * (cur["mean"].get<double>() - prev["mean"].get<double>())));
  const double sa = scale * prev["sd"].get<double>(), sb = scale * cur["sd"].get<double>();
  CHECK(se == Approx(std::sqrt(sa * sa / 3 + sb * sb / 3)));
  CHECK(df == Approx(std::pow(sa * sa + sb * sb, 2) / (std::pow(sa, 4) / 2 + std::pow(sb, 4) / 2)));
  // With 3 values a side the df lies between 2 and 4, so the CI's half-width between
  // t(0.975, 4) = 2.776 and t(0.975, 2) = 4.303 standard errors.
  CHECK(df >= 2 - 1e-9);
  CHECK(df <= 4 + 1e-9);
  CHECK((hi + lo) / 2 == Approx(value).margin(1e-9));
  CHECK((hi - lo) / 2 >= 2.776 * se);
  CHECK((hi - lo) / 2 <= 4.303 * se);
  CHECK(p >= 0);
  CHECK(p <= 1);
  // Distinguishable exactly when p < 0.05, exactly when the CI leaves out 0.
  const bool distinguishable = d["distinguishable"];
  CHECK(distinguishable == (p < 0.05));
  CHECK(distinguishable == (lo > 0 || hi < 0));
  CHECK(d["mdd"].get<double>() > 0);
  if (!distinguishable) {
    // More seeds than 3 would be needed: a number above 3, or more than the cap.
    CHECK(std::abs(value) < d["mdd"].get<double>());
    if (d["seeds_needed"].is_null())
      CHECK(d["seeds_needed_over_cap"].get<bool>());
    else
      CHECK(d["seeds_needed"].get<int>() > 3);
  }
}

}  // namespace

TEST_CASE("explain CLI --seeds: each delta carries Welch's test", "[explain][cli]") {
  TempDir dir("explain-seeds");
  const auto cfg = dir.write("tiny.yaml", tiny_config("tiny"));
  const auto res = (dir.path / "results").string();
  const auto r = dtrain_cli("explain " + cfg +
                            " gpus=2 train.reduction=sum optimizer.lr=0.4 --seeds 3 -q --tag s "
                            "--results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j =
      nlohmann::json::parse(slurp(dir.path / "results" / "tiny" / "explain-s-gpus_2.json"));
  const nlohmann::json* prev = nullptr;
  int tested = 0, undecided = 0;
  for (const auto& rung : j["rungs"]) {
    if (rung["skipped"].get<bool>()) continue;
    REQUIRE(rung["final_test_acc"]["n"] == 3);
    if (prev) {
      INFO("rung " << rung["name"]);
      check_delta(rung["delta_acc_points"], (*prev)["final_test_acc"], rung["final_test_acc"],
                  100);
      check_delta(rung["delta_train_loss"], (*prev)["final_train_loss"],
                  rung["final_train_loss"], 1);
      tested += 2;
      undecided += !rung["delta_acc_points"]["distinguishable"].get<bool>();
    }
    prev = &rung;
  }
  CHECK(tested >= 6);
  // The table: CI in the delta cells, p columns, the wording for undecided deltas, and the
  // note that says what they mean; the old rule of thumb is gone.
  CHECK(r.out.find("| delta acc (points) [95% CI] | acc p |") != std::string::npos);
  CHECK(r.out.find("(noise)") == std::string::npos);
  CHECK(r.out.find("Welch's t-test") != std::string::npos);
  if (undecided > 0) CHECK(r.out.find("not distinguishable at 3 seeds (") != std::string::npos);
  // The equivalent rung is the baseline's step: within 1e-4, or not distinguishable.
  const auto& eq = j["rungs"][1]["delta_train_loss"];
  CHECK((j["equivalent_matches"].get<bool>() || j["equivalent_within_noise"].get<bool>()));
  CHECK(!eq["distinguishable"].get<bool>());
}
