// dtrain report on fixture run folders (good, diverged, failed, corrupt, missing), and a sweep
// that is killed and resumed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dtrain/plots.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

using namespace dtrain::test;

namespace {

// A run folder as dtrain writes it, with the fields the report reads.
void fixture_run(const fs::path& root, const std::string& id, int gpus, const std::string& status,
                 double rate, double acc) {
  const fs::path d = root / "fx" / id;
  json j = {{"run_id", id},
            {"experiment", "fx"},
            {"group", ""},
            {"status", status},
            {"gpus", gpus},
            {"per_replica_batch", 32},
            {"global_batch", 32 * gpus},
            {"lr", 0.1},
            {"lr_scaling", "linear"},
            {"peak_lr", 0.1 * gpus},
            {"reduction", "mean"},
            {"shuffle", "sample"},
            {"sharding", "interleaved"},
            {"target_accuracy", 0.5},
            {"final_test_accuracy", status == "done" ? json(acc) : json(nullptr)},
            {"best_test_accuracy", acc},
            {"final_train_loss", status == "done" ? json(0.3) : json(nullptr)},
            {"median_epoch_time_s", 1000.0 / rate},
            {"samples_per_s", rate},
            {"time_to_target_s", status == "done" ? json(2.5) : json(nullptr)}};
  if (status == "failed") j["error"] = "out of memory";
  put(d / "summary.json", j.dump(2));
  put(d / "status", status + "\n");
  const std::string nan = status == "diverged" ? "-nan" : "0.3";
  put(d / "metrics.csv",
      "epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,epoch_time_s,samples_per_s\n"
      "1,0.1,0.1,0.9,0.6,0.8,0.62,1.0,1000\n"
      "2,0.1,0.1," +
          nan + ",0.8," + nan + "," + std::to_string(acc) + ",1.0,1000\n");
}

}  // namespace

TEST_CASE("report regenerates tables from fixture folders and names the broken ones",
          "[report][cli]") {
  TempDir tmp("report");
  const auto root = tmp.path;
  fixture_run(root, "g1", 1, "done", 100, 0.90);
  fixture_run(root, "g2", 2, "done", 180, 0.89);
  fixture_run(root, "g4", 4, "diverged", 300, 0.10);
  fixture_run(root, "g8", 8, "failed", 0, 0.0);
  fixture_run(root, "g16", 16, "done", 1000, 0.5);
  put(root / "fx" / "g16" / "summary.json", "{\"gpus\": 16,");     // corrupt
  put(root / "fx" / "g32" / "status", "running\n");                // killed: no summary
  put(root / "fx" / ".attempts" / "g2.1" / "status", "failed\n");  // hidden: ignored
  const auto out = root / "report";

  const auto r = dtrain_cli("report " + root.string() + " --out " + out.string());
  INFO(r.out);
  CHECK(r.code == 1);  // partial: two folders could not be read
  CHECK_THAT(r.out, Catch::Contains("g16/summary.json: corrupt JSON"));
  CHECK_THAT(r.out, Catch::Contains("g32/summary.json: missing"));
  CHECK_THAT(r.out, Catch::Contains("2 run folders could not be read"));

  const auto md = slurp(out / "fx.md");
  CHECK_THAT(md, Catch::Contains("| g2 ") && Catch::Contains("1.80x") && Catch::Contains("90%"));
  CHECK_THAT(md, Catch::Contains("diverged") && Catch::Contains("failed") &&
                     Catch::Contains("unreadable (interrupted)"));
  CHECK_THAT(md, Catch::Contains("2.5s"));  // time to target
  CHECK_THAT(md, !Catch::Contains("g2.1"));
  const auto j = json::parse(slurp(out / "fx.json"));
  REQUIRE(j["runs"].size() == 6);
  int unreadable = 0;
  for (const auto& run : j["runs"]) {
    if (run["run_id"] == "g2") CHECK(run["speedup"].get<double>() == Approx(1.8));
    if (run["run_id"] == "g4") CHECK(run["speedup"].is_null());
    if (run["status"].get<std::string>().rfind("unreadable", 0) == 0) ++unreadable;
  }
  CHECK(unreadable == 2);
  const auto csv = slurp(out / "fx.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 7);

  // An explicit baseline.
  const auto b =
      dtrain_cli("report " + (root / "fx" / "g1").string() + " " + (root / "fx" / "g2").string() +
                 " --baseline g2 --out " + (root / "r2").string());
  CHECK(b.code == 0);
  CHECK_THAT(slurp(root / "r2" / "fx.md"),
             Catch::Contains("0.56x") && Catch::Contains("Baseline g2"));
  CHECK(dtrain_cli("report " + root.string() + " --baseline nope --out " + (root / "r3").string())
            .code == 2);
  CHECK(dtrain_cli("report " + (root / "missing").string()).code == 2);
}

TEST_CASE("report --plots draws PNG and SVG figures", "[report][plots]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots");
  const auto root = tmp.path;
  fixture_run(root, "g1", 1, "done", 100, 0.90);
  fixture_run(root, "g2", 2, "done", 180, 0.89);
  fixture_run(root, "g4", 4, "diverged", 300, 0.10);
  const auto out = root / "report";
  const auto r = dtrain_cli("report " + root.string() + " --plots --out " + out.string());
  INFO(r.out);
  CHECK(r.code == 0);
  for (const char* stem : {"fx-curves", "fx-speedup", "fx-efficiency"}) {
    const auto png = slurp(out / (std::string(stem) + ".png"));
    REQUIRE(png.size() > 1000);
    CHECK(png.substr(1, 3) == "PNG");
    CHECK_THAT(slurp(out / (std::string(stem) + ".svg")), Catch::Contains("<svg"));
  }
  CHECK_THAT(slurp(out / "index.md"), Catch::Contains("![fx-speedup](fx-speedup.png)"));
}

TEST_CASE("a killed sweep resumes and runs only what is missing", "[sweep][cli]") {
  TempDir tmp("sweep");
  const auto root = tmp.path;
  put(root / "cfg.yaml", R"(name: sw
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 6000, test_size: 500, shape: [48], classes: 5, noise: 1.5}
model: {hidden: [96, 48]}
train: {epochs: 3, per_replica_batch: 16, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 16}
)");
  const std::string args = "run " + (root / "cfg.yaml").string() +
                           " gpus=1,2 train.seed=1,2,3 --resume --tag s --quiet --results " +
                           (root / "res").string();
  const fs::path exp = root / "res" / "sw";
  auto done_runs = [&] {
    std::vector<std::string> ids;
    if (!fs::exists(exp)) return ids;
    for (const auto& e : fs::directory_iterator(exp))
      if (e.is_directory() && slurp(e.path() / "status") == "done\n")
        ids.push_back(e.path().filename().string());
    std::sort(ids.begin(), ids.end());
    return ids;
  };

  // Start the sweep and kill it hard once two runs have finished.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string cmd = dtrain_binary() + " " + args + " > /dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done_runs().size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const auto first = done_runs();
  REQUIRE(first.size() >= 2);
  REQUIRE(first.size() < 6);  // the kill really interrupted the sweep
  std::map<std::string, std::string> before;
  for (const auto& id : first) before[id] = slurp(exp / id / "summary.json");

  const auto r = dtrain_cli(args);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(done_runs().size() == 6);
  // Finished runs were skipped, not redone: their summaries are byte for byte the same.
  for (const auto& [id, text] : before) CHECK(slurp(exp / id / "summary.json") == text);
  // The run the kill interrupted (if it had started) was moved aside, not overwritten.
  if (fs::exists(exp / ".attempts")) {
    for (const auto& e : fs::directory_iterator(exp / ".attempts"))
      CHECK(slurp(e.path() / "status") == "running\n");
  }
  // The index lists every run as done.
  const auto index = slurp(exp / "index-s.csv");
  CHECK(std::count(index.begin(), index.end(), '\n') == 7);
  CHECK(index.find(",done,") != std::string::npos);
  CHECK(index.find("pending") == std::string::npos);
}
