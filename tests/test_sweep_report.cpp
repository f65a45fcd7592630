// dtrain report on fixture run folders (good, diverged, failed, corrupt, missing), and a sweep
// that is killed and resumed.
#include <fmt/format.h>
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

#include "dtrain/base/files.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/results/plots.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

using namespace dtrain::test;

namespace {

// A run folder as dtrain writes it, with the fields the report reads.
// `extra` replaces fields of summary.json.
void fixture_run(const fs::path& root, const std::string& id, int gpus, const std::string& status,
                 double rate, double acc, const json& extra = json::object()) {
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
  j.update(extra);
  put(d / "summary.json", j.dump(2));
  put(d / "status", status + "\n");
  const std::string nan = status == "diverged" ? "-nan" : "0.3";
  put(d / "metrics.csv",
      "epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,epoch_time_s,samples_per_s\n"
      "1,0.1,0.1,0.9,0.6,0.8,0.62,1.0,1000\n"
      "2,0.1,0.1," +
          nan + ",0.8," + nan + "," + std::to_string(acc) + ",1.0,1000\n");
}

// `s` quoted for /bin/sh: the tests hand hostile strings to dtrain as single arguments.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Files named PWNED* anywhere under `root` or in the current folder: the hostile names below
// create one if any of them is ever run as a shell or gnuplot command.
std::vector<std::string> pwned_files(const fs::path& root) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename().string().rfind("PWNED", 0) == 0) found.push_back(e.path().string());
  for (const auto& e : fs::directory_iterator(fs::current_path()))
    if (e.path().filename().string().rfind("PWNED", 0) == 0) found.push_back(e.path().string());
  return found;
}

bool is_png(const fs::path& p) {
  const auto png = slurp(p);
  return png.size() > 1000 && png.substr(1, 3) == "PNG";
}

}  // namespace

TEST_CASE("a run folder copied under another name is a run of that name", "[report][cli]") {
  TempDir tmp("report-copy");
  fixture_run(tmp.path, "g1", 1, "done", 100, 0.90);
  fixture_run(tmp.path, "g2", 2, "done", 180, 0.89);
  fs::copy(tmp.path / "fx" / "g1", tmp.path / "fx" / "g1-again");
  const auto r = dtrain_cli("report " + tmp.path.string() + " --baseline g1-again --out " +
                            (tmp.path / "out").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = json::parse(slurp(tmp.path / "out" / "fx.json"));
  std::vector<std::string> ids;
  for (const auto& run : j["runs"]) {
    ids.push_back(run["run_id"].get<std::string>());
    CHECK(run["baseline"] == "g1-again");
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::string>{"g1", "g1-again", "g2"});
  // Two results folders with a run of one name: --baseline does not guess which.
  TempDir other("report-copy-2");
  fixture_run(other.path, "g1", 1, "done", 120, 0.80);
  const auto two = dtrain_cli("report " + tmp.path.string() + " " + other.path.string() +
                              " --baseline g1 --out " + (tmp.path / "out2").string());
  INFO(two.out);
  CHECK(two.code == 2);
  CHECK_THAT(two.out, Catch::Contains("--baseline g1: two runs have this name"));
}

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
  // A link to a run folder elsewhere is not followed out of the tree.
  TempDir elsewhere("elsewhere");
  fixture_run(elsewhere.path, "g64", 64, "done", 100, 0.90);
  fs::create_directory_symlink(elsewhere.path / "fx" / "g64", root / "fx" / "g64-link");
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
  CHECK_THAT(md, !Catch::Contains("g64"));
  const auto j = json::parse(slurp(out / "fx.json"));
  REQUIRE(j["runs"].size() == 6);
  int unreadable = 0;
  for (const auto& run : j["runs"]) {
    if (run["run_id"] == "g2") CHECK(run["speedup"].get<double>() == Approx(1.8));
    if (run["run_id"] == "g4") CHECK(run["speedup"].is_null());
    if (run["status"].get<std::string>().rfind("unreadable", 0) == 0) {
      ++unreadable;
      // Nothing read: no made-up zeros for what the summary would have said.
      CHECK(run["gpus"].is_null());
      CHECK(run["global_batch"].is_null());
      CHECK(run["peak_lr"].is_null());
    }
  }
  CHECK(unreadable == 2);
  CHECK_THAT(md, Catch::Matches("[\\s\\S]*\\| g32 +\\| - +\\| - +\\| - +\\|[\\s\\S]*"));
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
  // Real replicas (their devices say nothing of simulation): the title says nothing either.
  CHECK_THAT(slurp(out / "fx-speedup.svg"), !Catch::Contains("simulated"));
}

// One run of one epoch: every curve is a point, which gnuplot warns about; its messages go to
// the figure's log, not to the terminal.
TEST_CASE("report --plots on a one-epoch run says nothing of gnuplot's ranges", "[report][plots]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-one");
  const auto cfg = tmp.write("one.yaml", tiny_config("one"));
  const auto res = tmp.path / "res";
  REQUIRE(dtrain_cli("run " + cfg + " train.epochs=1 --results " + res.string() + " --tag t")
              .code == 0);
  const auto out = tmp.path / "report";
  const auto r = dtrain_cli("report " + res.string() + " --plots --out " + out.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, !Catch::Contains("Warning") && !Catch::Contains("range"));
  CHECK(slurp(out / "one-curves-epochs1.png").substr(1, 3) == "PNG");
  CHECK_THAT(slurp(out / "data" / "one-curves-epochs1.log"), Catch::Contains("range"));
  // Its metrics.csv cut inside the header: the report says the file holds fewer epochs.
  const auto csv = res / "one" / "t-g1" / "metrics.csv";
  put(csv, slurp(csv).substr(0, 100));
  const auto cut = dtrain_cli("report " + res.string() + " --plots --out " + out.string());
  CHECK_THAT(cut.out, Catch::Contains("metrics.csv: 0 epoch rows, but summary.json counts 1 "
                                      "finished epochs"));
  // Rows the summary does not count are said too; a file that does not read counts as an
  // unreadable run (exit 1).
  put(csv,
      "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n"
      "1,0.1,1,0.5,1,0.5,0.1\n2,0.1,1,0.5,1,0.5,0.1\n");
  const auto extra = dtrain_cli("report " + res.string() + " --plots --out " + out.string());
  CHECK(extra.code == 0);
  CHECK_THAT(extra.out, Catch::Contains("metrics.csv: 2 epoch rows, but summary.json counts 1"));
  put(csv,
      "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n"
      "1,0.1,1e400,0.5,1,0.5,0.1\n");
  const auto bad = dtrain_cli("report " + res.string() + " --plots --out " + out.string());
  INFO(bad.out);
  CHECK(bad.code == 1);
  CHECK_THAT(bad.out, Catch::Contains("1 run's metrics.csv could not be read"));
  CHECK_THAT(bad.out, !Catch::Contains("could not be drawn"));  // no figure failed
  // A missing one is named the same way: the run's curves left out, exit 1.
  fs::remove(csv);
  const auto gone = dtrain_cli("report " + res.string() + " --plots --out " + out.string());
  INFO(gone.out);
  CHECK(gone.code == 1);
  CHECK_THAT(gone.out, Catch::Contains("metrics.csv") &&
                           Catch::Contains("1 run's metrics.csv could not be read"));
}

TEST_CASE("report --plots draws each run's devices.csv, passing over rows that are not dtrain's",
          "[report][plots][security]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-devices");
  const auto root = tmp.path;
  fixture_run(root, "g1", 1, "done", 100, 0.90);
  fixture_run(root, "g2", 2, "done", 180, 0.89);
  std::string csv =
      "unix_time_s,epoch,rank,device,util_pct,mem_util_pct,mem_used_mib,mem_total_mib\n";
  for (int i = 0; i < 20; ++i)
    csv += fmt::format("{}.5,0,0,gpu0,{},3,{},81559\n{}.5,0,1,gpu1,{},2,{},81559\n", 100 + i,
                       50 + i, 1000 + 10 * i, 100 + i, 40 + i, 900 + 10 * i);
  // Rows no dtrain writes, each with every cell a row has: a device name that is a gnuplot
  // command, text for a number, a rank past any run, a cut row.
  const std::string cells = ",1,2,3,4,5,6,7,8,9,10,11\n";
  csv += "101,0,0,gpu0'; system \"id > PWNED\"; x',5" + cells + "102,0,0,gpu0,abc" + cells +
         "103,0,1e9,gpu0,5" + cells + "104,0,0\n";
  put(root / "fx" / "g2" / "devices.csv", csv);
  // A devices.csv that is a link to another file: not read, and said.
  put(root / "elsewhere.csv", csv);
  fs::create_symlink(root / "elsewhere.csv", root / "fx" / "g1" / "devices.csv");
  const auto out = root / "report";
  const auto r = dtrain_cli("report " + root.string() + " --plots --out " + out.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(is_png(out / "fx-devices-g2.png"));
  CHECK_FALSE(fs::exists(out / "fx-devices-g1.png"));
  CHECK_THAT(r.out, Catch::Contains("figure fx-devices-g1: "));
  CHECK_THAT(r.out, Catch::Contains("g2/devices.csv: 4 row(s) not dtrain's passed over"));
  // One cut inside its header: said, not silently left out.
  fs::remove(root / "fx" / "g1" / "devices.csv");
  put(root / "fx" / "g1" / "devices.csv", csv.substr(0, 30));
  const auto cut = dtrain_cli("report " + root.string() + " --plots --out " + out.string());
  CHECK_THAT(cut.out, Catch::Contains("g1/devices.csv: no sample dtrain wrote in it"));
  // A whole header alone (a run shorter than one sampling period): nothing drawn, nothing said.
  fs::remove(root / "fx" / "g1" / "devices.csv");
  put(root / "fx" / "g1" / "devices.csv", csv.substr(0, csv.find('\n') + 1));
  const auto bare = dtrain_cli("report " + root.string() + " --plots --out " + out.string());
  CHECK_THAT(bare.out, !Catch::Contains("g1/devices.csv"));
  const std::string svg = slurp(out / "fx-devices-g2.svg");
  // Each process has its own GPU 0: the rank tells them apart.
  CHECK_THAT(svg, Catch::Contains("gpu0 on rank 0") && Catch::Contains("gpu1 on rank 1") &&
                      Catch::Contains("GPU memory used") && !Catch::Contains("PWNED") &&
                      !Catch::Contains("rank 1000000000"));
  CHECK(pwned_files(root).empty());
}

TEST_CASE("speedup tables and figures say when replicas were simulated on one machine",
          "[report][plots]") {
  TempDir tmp("plots-sim");
  const auto root = tmp.path;
  const json cpu_threads = {{"devices", "cpu: 4 replicas in turn on 2 threads, sharing one copy "
                                        "of the weights, conv onednn"},
                            {"replica_mode", "shared"}};
  const json two_hosts = {{"devices", "cpu: 2 replicas as processes (mpi), 1 thread each, conv "
                                      "onednn; mpirun (Open MPI), 2 hosts: node0 node1"},
                          {"replica_mode", "processes"}};
  fixture_run(root, "g1", 1, "done", 100, 0.90);
  fixture_run(root, "g2", 2, "done", 180, 0.89, two_hosts);
  fixture_run(root, "g4", 4, "done", 300, 0.88, cpu_threads);
  const auto out = root / "report";
  const auto r = dtrain_cli("report " + root.string() + " --out " + out.string());
  INFO(r.out);
  CHECK(r.code == 0);
  // The table names the simulated run, and only it.
  CHECK_THAT(r.out, Catch::Contains("Simulated on one machine (replicas sharing its CPU cores, "
                                    "or one GPU): g4. Their speedup"));
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED (figures): gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  const auto p = dtrain_cli("report " + root.string() + " --plots --out " + out.string());
  INFO(p.out);
  CHECK(p.code == 0);
  CHECK_THAT(slurp(out / "fx-speedup.svg"), Catch::Contains("simulated on one machine"));
}

TEST_CASE("report --plots runs no code from names, statuses or the output folder",
          "[report][plots][security]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-hostile");
  const auto root = tmp.path;
  const std::string in_dir = "cd " + sh_quote(root.string()) + " && " + dtrain_binary() + " ";

  // 1. A config name that closes gnuplot's quoted title and calls system(), run for real (a
  // newline in a name is refused by the config; gnuplot also ends a command at ';').
  put(root / "cfg.yaml", tiny_config(R"("x'; system \"id > PWNED\"; set title '")"));
  const auto run = shell(in_dir + "run cfg.yaml gpus=1,2 --quiet --results res --tag t");
  INFO(run.out);
  REQUIRE(run.code == 0);
  const std::string exp = "x___system__id___PWNED___set_title__";
  // Into the default folder, then (3.) into one whose name is a shell command substitution.
  for (const std::string& out :
       {(root / "res" / "report").string(), (root / "o'$(id>PWNED2)'").string()}) {
    const auto r = shell(in_dir + "report res --plots --out " + sh_quote(out));
    INFO(r.out);
    CHECK(r.code == 0);
    for (const auto& stem : {exp + "-curves", exp + "-speedup", exp + "-efficiency"}) {
      CHECK(is_png(fs::path(out) / (stem + ".png")));
      // The name is drawn as text, quotes and all.
      CHECK_THAT(slurp(fs::path(out) / (stem + ".svg")),
                 Catch::Contains("<svg") && Catch::Contains("system \"id > PWNED\""));
    }
    CHECK_THAT(slurp(fs::path(out) / "index.md"), Catch::Contains("-speedup.png"));
  }

  // 2. The same through a crafted summary.json: status, group, lr_scaling and reduction (with
  //    gnuplot's own backquote shell escape and a macro for good measure). A newline or '|' in
  //    them is refused as a damaged file (load_run); ';' ends a gnuplot command as well.
  const auto payload = [](const std::string& marker) {
    return "p'; system \"id > " + marker + "\"; set title '`id > " + marker + "b` @x";
  };
  const json bad_group = {{"group", payload("PWNED3")}};
  fixture_run(root / "fix", "g1", 1, "done", 100, 0.90, bad_group);
  fixture_run(root / "fix", "g2", 2, "done", 180, 0.89, bad_group);
  fixture_run(root / "fix", "g4", 4, payload("PWNED4"), 300, 0.10, bad_group);
  const json bad_kind = {
      {"group", "h"}, {"lr_scaling", payload("PWNED5")}, {"reduction", payload("PWNED6")}};
  json h1 = bad_kind, h2 = bad_kind;
  h1["lr"] = 0.2;
  h2["lr"] = 0.4;
  fixture_run(root / "fix2", "h1", 1, "done", 100, 0.70, h1);
  fixture_run(root / "fix2", "h2", 2, "done", 150, 0.80, h2);
  // Curves, speedup and efficiency from `fix`; the same plus the heatmap of the crafted LR
  // rule and reduction from `fix2`.
  for (const auto& [in, n_png] : {std::pair<std::string, size_t>{"fix", 3}, {"fix2", 4}}) {
    const auto out2 = root / ("r-" + in);
    const auto f = shell(in_dir + "report " + in + " --plots --out " + sh_quote(out2.string()));
    INFO(f.out);
    CHECK(f.code == 0);
    size_t pngs = 0;
    for (const auto& e : fs::directory_iterator(out2))
      if (e.path().extension() == ".png") {
        CHECK(is_png(e.path()));
        ++pngs;
      }
    CHECK(pngs == n_png);
    CHECK(fs::exists(out2 / "fx-speedup.png"));
  }
  const std::string curves =
      slurp(root / "r-fix" / ("fx-curves-" + dtrain::slug(payload("PWNED3")) + ".svg"));
  CHECK_THAT(curves, Catch::Contains("4 replicas (p'") && Catch::Contains("`id > PWNED4b` @x"));
  const std::string heatmap =
      "fx-lr-heatmap-" + dtrain::slug(payload("PWNED5")) + "-" + dtrain::slug(payload("PWNED6"));
  CHECK_THAT(slurp(root / "r-fix2" / (heatmap + ".svg")), Catch::Contains("`id > PWNED6b` @x"));

  const auto pwned = pwned_files(root);
  CHECK(pwned.empty());
  for (const auto& p : pwned) WARN("created by a hostile name: " << p);
}

TEST_CASE("report --plots draws a sweep whose name has a quote", "[report][plots]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-quote");
  put(tmp.path / "cfg.yaml", tiny_config("bob's sweep"));
  const auto res = tmp.path / "res";
  const auto run =
      dtrain_cli("run " + (tmp.path / "cfg.yaml").string() +
                 " gpus=1,2 optimizer.lr=0.05,0.1 --quiet --tag t --results " + res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  const auto r = dtrain_cli("report " + res.string() + " --plots");
  INFO(r.out);
  CHECK(r.code == 0);
  const auto out = res / "report";
  for (const char* stem :
       {"bob_s_sweep-curves-lr0.05", "bob_s_sweep-curves-lr0.1", "bob_s_sweep-speedup",
        "bob_s_sweep-efficiency", "bob_s_sweep-lr-heatmap-linear-mean"}) {
    CHECK(is_png(out / (std::string(stem) + ".png")));
    CHECK_THAT(slurp(out / (std::string(stem) + ".svg")), Catch::Contains("bob's sweep"));
  }
}

TEST_CASE("report --plots draws a sweep whose names are longer than a file name may be",
          "[report][plots]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-long");
  // A 120-character experiment and a group of ninety layers: 400 bytes of figure name.
  const std::string name(120, 'n');
  put(tmp.path / "cfg.yaml", tiny_config(name));
  std::string hidden = "model.hidden=[8";
  for (int i = 1; i < 90; ++i) hidden += ",8";
  const auto res = tmp.path / "res";
  const auto run = dtrain_cli("run " + (tmp.path / "cfg.yaml").string() + " '" + hidden +
                              "]' train.seed=1,2 --quiet --tag t --results " + res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  const auto r = dtrain_cli("report " + res.string() + " --plots");
  INFO(r.out);
  CHECK(r.code == 0);
  // Each figure is drawn, under a name that keeps its start and end around a hash; the two
  // seeds' curves stay apart (and where a run has devices.csv, its figure too).
  CHECK(r.out.find("not drawn") == std::string::npos);
  int curves = 0;
  for (const auto& f : fs::directory_iterator(res / "report")) {
    const std::string file = f.path().filename().string();
    CHECK(file.size() < 200);
    if (file.rfind(name.substr(0, 80), 0) == 0 && file.find("seed") != std::string::npos &&
        f.path().extension() == ".png") {
      CHECK(is_png(f.path()));
      ++curves;
    }
  }
  CHECK(curves >= 2);
}

TEST_CASE("report --plots draws what it can when runs diverge in their first epoch",
          "[report][plots]") {
  if (!dtrain::gnuplot_available()) {
    WARN("SKIPPED: gnuplot is not installed (apt-get install gnuplot-nox)");
    return;
  }
  TempDir tmp("plots-diverged");
  put(tmp.path / "cfg.yaml", tiny_config("div"));
  const auto res = tmp.path / "res";
  const auto run =
      dtrain_cli("run " + (tmp.path / "cfg.yaml").string() +
                 " gpus=1,2 optimizer.lr=0.05,1000000 --quiet --tag t --results " + res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  REQUIRE(slurp(res / "div" / "t-g1-lr1000000" / "status") == "diverged\n");
  const auto r = dtrain_cli("report " + res.string() + " --plots");
  INFO(r.out);
  CHECK(r.code == 0);
  const auto out = res / "report";
  for (const char* stem : {"div-curves-lr0.05", "div-curves-lr1000000", "div-speedup",
                           "div-efficiency", "div-lr-heatmap-linear-mean"})
    CHECK(is_png(out / (std::string(stem) + ".png")));
  // The diverged group has no finite loss: that panel is empty, said in one line.
  CHECK_THAT(r.out, Catch::Contains("dtrain: note: figure div-curves-lr1000000: no run has a "
                                    "finite, positive train loss"));
  CHECK_THAT(slurp(out / "index.md"), Catch::Contains("![div-lr-heatmap-linear-mean]"));

  // Nothing finite at all in one group, and no final accuracy for one LR rule: those figures
  // are skipped with a note, the rest is drawn.
  TempDir fx("plots-nan");
  fixture_run(fx.path, "g1", 1, "done", 100, 0.90);
  fixture_run(fx.path, "g2", 2, "done", 180, 0.89);
  const json nan_run = {
      {"group", "lr9"}, {"lr", 9.0}, {"lr_scaling", "sqrt"}, {"final_test_accuracy", nullptr}};
  for (const auto& [id, gpus] : {std::pair<std::string, int>{"n1", 1}, {"n2", 2}}) {
    json extra = nan_run;
    if (gpus == 2) extra["lr"] = 18.0;
    fixture_run(fx.path, id, gpus, "diverged", 100, 0.0, extra);
    put(fx.path / "fx" / id / "metrics.csv",
        "epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,epoch_time_s,samples_per_s\n"
        "1,9,9,nan,nan,nan,-nan,1.0,1000\n");
  }
  const auto f = dtrain_cli("report " + fx.path.string() + " --plots");
  INFO(f.out);
  CHECK(f.code == 0);
  CHECK_THAT(f.out, Catch::Contains("dtrain: note: figure fx-curves-lr9 not drawn: no run has a "
                                    "finite test accuracy or train loss"));
  CHECK_THAT(f.out, Catch::Contains("dtrain: note: figure fx-lr-heatmap-sqrt-mean not drawn"));
  CHECK_FALSE(fs::exists(fx.path / "report" / "fx-curves-lr9.png"));
  CHECK(is_png(fx.path / "report" / "fx-curves.png"));
  CHECK(is_png(fx.path / "report" / "fx-speedup.png"));
  CHECK_THAT(
      slurp(fx.path / "report" / "index.md"),
      Catch::Contains("![fx-curves](fx-curves.png)") && Catch::Contains("fx-curves-lr9 not drawn"));
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
  // The run the kill interrupted (if it had started) was moved aside, not overwritten. The kill
  // may also land between the folder's creation and its first file.
  if (fs::exists(exp / ".attempts")) {
    for (const auto& e : fs::directory_iterator(exp / ".attempts")) {
      const bool has_status = fs::exists(e.path() / "status");
      CHECK((!has_status || slurp(e.path() / "status") == "running\n"));
      CHECK_FALSE(fs::exists(e.path() / "summary.json"));
    }
  }
  // The index lists every run as done.
  const auto index = slurp(exp / "index-s.csv");
  CHECK(std::count(index.begin(), index.end(), '\n') == 7);
  CHECK(index.find(",done,") != std::string::npos);
  CHECK(index.find("pending") == std::string::npos);
}

TEST_CASE("an index row a killed command left running is read from its folder", "[sweep][cli]") {
  TempDir d("index-killed");
  const auto res = d.path / "res";
  const std::string cfg = d.write("c.yaml", tiny_config("killed"));
  const std::string base = "run " + cfg + " --quiet --tag t --resume --results " + res.string();
  const auto first = dtrain_cli(base + " gpus=1");
  INFO(first.out);
  REQUIRE(first.code == 0);
  // As a SIGKILL leaves it: the run's folder and its index row both still say running, and
  // no process holds the folder.
  const fs::path exp = res / "killed";
  std::string index = slurp(exp / "index-t.csv");
  const auto at = index.find(",done,");
  REQUIRE(at != std::string::npos);
  index.replace(at, 6, ",running,");
  const size_t line = index.find('\n') + 1;  // the header, then the run's row
  const std::string id = index.substr(line, index.find(',', line) - line);
  REQUIRE(fs::is_directory(exp / id));
  fs::remove(exp / id / "summary.json");
  put(exp / id / "status", "running\n");
  put(exp / "index-t.csv", index);
  // Another run of the tag: its command rewrites the index, the killed row included.
  const auto second = dtrain_cli(base + " gpus=2");
  INFO(second.out);
  REQUIRE(second.code == 0);
  const auto now = slurp(exp / "index-t.csv");
  INFO(now);
  CHECK(now.find(id + ",interrupted,") != std::string::npos);
  CHECK(now.find(",running,") == std::string::npos);
}

TEST_CASE("report gives an experiment named index files of its own", "[report][cli]") {
  TempDir d("report-index");
  const auto res = d.path / "res";
  const std::string cfg = d.write("c.yaml", tiny_config("index"));
  const auto run = dtrain_cli("run " + cfg + " --quiet --tag t --results " + res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  const auto r = dtrain_cli("report " + res.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  // index.md is the overview, and links to the experiment's own table.
  CHECK_THAT(slurp(res / "report" / "index.md"),
             Catch::StartsWith("# dtrain report") && Catch::Contains("[index-2.md](index-2.md)"));
  CHECK(fs::exists(res / "report" / "index-2.csv"));
}
