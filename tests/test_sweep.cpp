// The decisions `dtrain run` takes about its run folders before the first run starts, on plain
// data and without the CLI: a fresh run goes ahead, an existing folder is refused without
// --resume, a finished run is skipped only for the same config, an unfinished one is continued
// (moved aside first), a held one and two runs in one folder are refused.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/results/sweep.hpp"

using namespace dtrain;

namespace {

const std::string kDir = "results/exp/t-g1";

Config config_with_lr(const std::string& lr) {
  return parse_config("name: exp\noptimizer: {lr: " + lr + "}\n", "exp.yaml");
}

}  // namespace

TEST_CASE("a sweep trains a run whose folder does not exist yet, with or without --resume",
          "[sweep]") {
  for (const bool resume : {false, true}) {
    const FolderPlan plan = plan_folder(kDir, FolderFound{}, resume);
    CHECK_FALSE(plan.skip);
    CHECK_FALSE(plan.compare);
    CHECK(plan.refusal.empty());
  }
}

TEST_CASE("a sweep refuses an existing run folder without --resume, finished or not", "[sweep]") {
  for (const std::string status : {"done", "diverged", "failed", "interrupted", "running", ""}) {
    const FolderPlan plan = plan_folder(kDir, {true, status, 0}, false);
    CHECK(plan.refusal ==
          "results/exp/t-g1: run folder already exists; runs are never overwritten (pick "
          "another --tag or --results folder, or pass --resume)");
    CHECK_FALSE(plan.compare);  // refused already: its config is not read
  }
}

TEST_CASE("a sweep under --resume skips a finished run once its config is compared", "[sweep]") {
  for (const std::string status : {"done", "diverged"}) {
    const FolderPlan plan = plan_folder(kDir, {true, status, 0}, true);
    CHECK(plan.skip);
    CHECK(plan.compare);
    CHECK(plan.refusal.empty());
  }
  CHECK(run_finished("done"));
  CHECK(run_finished("diverged"));
  CHECK_FALSE(run_finished("failed"));
  CHECK_FALSE(run_finished(""));
}

TEST_CASE("a sweep under --resume continues a failed or interrupted run, its folder moved aside",
          "[sweep]") {
  for (const std::string status : {"failed", "interrupted", "running", ""}) {
    const FolderPlan plan = plan_folder(kDir, {true, status, 0}, true);
    CHECK_FALSE(plan.skip);  // planned as pending: trained again
    CHECK_FALSE(plan.compare);
    CHECK(plan.refusal.empty());
  }
  // The log names what the folder was when it is moved to .attempts/.
  CHECK(unfinished_as("failed") == "failed");
  CHECK(unfinished_as("interrupted") == "interrupted");
  CHECK(unfinished_as("") == "incomplete");
}

TEST_CASE("a sweep under --resume refuses a run folder another process is writing", "[sweep]") {
  FolderPlan plan = plan_folder(kDir, {true, "running", 4242}, true);
  CHECK(plan.refusal ==
        "results/exp/t-g1: another dtrain process (pid 4242) is writing this run; wait for it "
        "to finish");
  plan = plan_folder(kDir, {true, "done", -1}, true);  // held by a process not yet known
  CHECK(plan.refusal ==
        "results/exp/t-g1: another dtrain process is writing this run; wait for it to finish");
  CHECK(plan.skip);
  CHECK_FALSE(plan.compare);  // refused first: the config is not read
}

TEST_CASE("a sweep whose two runs map to one folder is refused", "[sweep]") {
  const std::vector<std::string> planned = {"results/exp/t-g1", "results/exp/t-g2"};
  CHECK_NOTHROW(check_distinct("results/exp/t-g4", planned));
  CHECK_NOTHROW(check_distinct("results/exp/t-g1", {}));
  CHECK_THROWS_MATCHES(check_distinct("results/exp/t-g2", planned), UserError,
                       Catch::Message("two runs of this command map to results/exp/t-g2"));
}

TEST_CASE("a sweep reuses a finished run only for the config it ran with", "[sweep]") {
  const Config cfg = config_with_lr("0.5");
  CHECK(config_differs(kDir, to_yaml(cfg), cfg).empty());
  // `replicas` never changes a bit of the results, and older folders lack it.
  Config shared = cfg;
  shared.replicas = ReplicaMode::shared;
  CHECK(config_differs(kDir, to_yaml(shared), cfg).empty());

  const std::string why = config_differs(kDir, to_yaml(config_with_lr("0.25")), cfg);
  CHECK(why ==
        "results/exp/t-g1: --resume: this run finished with another config (it has 'lr: 0.25', "
        "this command asks for 'lr: 0.5'); pick a new --tag to run the changed experiment");

  CHECK(config_differs(kDir, std::nullopt, cfg) ==
        "results/exp/t-g1: --resume: this finished run has no config.resolved.yaml to compare "
        "with; pick a new --tag");
  // Text that does not read as a config is compared as it is: the first line differs.
  const std::string damaged = config_differs(kDir, std::string("not: [a config"), cfg);
  CHECK(damaged.find("(it has 'not: [a config', this command asks for '") != std::string::npos);
}

TEST_CASE("a sweep's decisions on rank 0 reach every rank as they were taken", "[sweep]") {
  const std::vector<bool> skip = {true, false, true};
  const std::string text = encode_decisions("", skip);
  CHECK(text == "101");
  std::string refusal;
  std::vector<bool> got(3, false);
  decode_decisions(text, refusal, got);
  CHECK(got == skip);
  CHECK(refusal.empty());

  const std::string refused = encode_decisions("results/exp/t-g1: no", skip);
  CHECK(refused == "Eresults/exp/t-g1: no");
  std::vector<bool> untouched(3, false);
  decode_decisions(refused, refusal, untouched);
  CHECK(refusal == "results/exp/t-g1: no");
  CHECK(untouched == std::vector<bool>(3, false));
}
