#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/base/error.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/report.hpp"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {
RunRecord rec(const std::string& id, int gpus, double rate, double acc,
              const std::string& status = "done") {
  RunRecord r;
  r.run_id = id;
  r.experiment.assign("exp");
  r.gpus = gpus;
  r.status = status;
  r.samples_per_s = rate;
  r.final_test_acc = acc;
  r.target_accuracy = 0.5;
  return r;
}
}  // namespace

TEST_CASE("speedup - efficiency and accuracy delta are taken against the 1-replica run",
          "[report]") {
  const auto c = compare({rec("a", 4, 300, 0.88), rec("b", 1, 100, 0.90), rec("c", 2, 180, 0.895)});
  CHECK(c.rows[0].baseline == "b");
  CHECK(*c.rows[0].speedup == Approx(3.0));
  CHECK(*c.rows[0].efficiency == Approx(0.75));
  CHECK(*c.rows[0].acc_delta_points == Approx(-2.0));
  CHECK(*c.rows[2].efficiency == Approx(0.9));
  const auto md = to_markdown(c);
  CHECK_THAT(md, Catch::Contains("| 3.00x") && Catch::Contains("75%") && Catch::Contains("-2.00"));
  const auto csv = to_csv(c);
  CHECK_THAT(csv, Catch::StartsWith("run,gpus,per-replica batch,global batch"));
}

TEST_CASE("failed runs are listed but never serve as baseline", "[report]") {
  const auto c =
      compare({rec("x", 1, 0, 0, "failed"), rec("y", 2, 100, 0.8), rec("z", 4, 180, 0.8)});
  CHECK(c.rows[2].baseline == "y");  // the finished run of fewest replicas
  CHECK(*c.rows[2].speedup == Approx(1.8));
  CHECK_FALSE(c.rows[0].speedup);
  // y is no baseline of itself (a 1-replica run would have been), nor of the failed x.
  CHECK(c.rows[0].baseline.empty());
  CHECK(c.rows[1].baseline.empty());
  CHECK_FALSE(c.rows[1].speedup);
  const std::string md = to_markdown(c);
  CHECK_THAT(md, Catch::Contains("failed"));
  CHECK_THAT(md, Catch::Contains("Baseline y for: z.") &&
                     Catch::Contains("No finished run to compare with for: x, y."));
}

TEST_CASE("runs whose cores other work took are named under the table", "[report]") {
  auto a = rec("a", 1, 100, 0.8), b = rec("b", 2, 150, 0.8), c = rec("c", 4, 300, 0.8);
  a.other_cores_max = 1.9;
  b.other_cores_max = 0.1;  // under the warning's 0.25
  const std::string md = to_markdown(compare({a, b, c}));
  CHECK_THAT(md, Catch::Contains("Other work kept cores of this machine busy during: a (1.9 "
                                 "cores). Those times are slower"));
  CHECK_THAT(md, !Catch::Contains("b (0.1"));
  CHECK_THAT(to_markdown(compare({b, c})), !Catch::Contains("Other work"));
}

TEST_CASE("a diverged 1-replica run leaves the N-replica run with no baseline", "[report]") {
  const auto c = compare({rec("one", 1, 100, 0.1, "diverged"), rec("many", 64, 900, 0.8)});
  for (const auto& row : c.rows) {
    INFO(row.run.run_id);
    CHECK(row.baseline.empty());
    CHECK_FALSE(row.speedup);
    CHECK_FALSE(row.efficiency);
    CHECK_FALSE(row.acc_delta_points);
  }
  CHECK_THAT(to_markdown(c), Catch::Contains("No finished run to compare with for: one, many."));
  // A run still going (or a folder that cannot be read) has no replica count yet: the
  // finished 1-replica run stays the baseline.
  auto live = rec("live", 0, 0, 0, "running");
  const auto going = compare({rec("g1", 1, 100, 0.8), live, rec("g4", 4, 300, 0.8)});
  CHECK(going.rows[0].baseline == "g1");
  CHECK(*going.rows[0].speedup == Approx(1.0));
  CHECK(*going.rows[2].speedup == Approx(3.0));
  // A 1-replica run killed before its summary (known by the tag's index, or by the config in
  // its folder, group unknown): the 2-replica run is not its own baseline at 1.00x, and the
  // killed run gets no row of its own from the index.
  auto killed = rec("k1", 1, 0, 0, "running");
  killed.in_table = false;
  const auto after_kill = compare({killed, rec("k2", 2, 180, 0.8)});
  REQUIRE(after_kill.rows.size() == 1);
  CHECK(after_kill.rows[0].baseline.empty());
  CHECK_FALSE(after_kill.rows[0].speedup);
  auto unread = rec("u1", 1, 0, 0, "unreadable (interrupted)");
  unread.group_unknown = true;
  auto u2 = rec("u2", 2, 180, 0.8);
  u2.group = "lr0.1";
  const auto damaged = compare({unread, u2});
  CHECK(damaged.rows.size() == 2);
  CHECK(damaged.rows[1].baseline.empty());
  // A sweep of 2 and 4 replicas alone: the 2-replica run is the baseline, as ever.
  const auto two = compare({rec("a", 2, 100, 0.8), rec("b", 4, 190, 0.8)});
  CHECK(two.rows[0].baseline == "a");
  CHECK(*two.rows[1].speedup == Approx(1.9));
}

TEST_CASE("each group of a sweep is compared with its own 1-replica run", "[report]") {
  auto a1 = rec("a1", 1, 100, 0.90), a8 = rec("a8", 8, 400, 0.85);
  auto b1 = rec("b1", 1, 120, 0.10), b8 = rec("b8", 8, 480, 0.80);
  a1.group = a8.group = "lr_scalingnone";
  b1.group = b8.group = "lr_scalinglinear";
  const auto c = compare({a1, b1, a8, b8});
  CHECK(c.rows[2].baseline == "a1");
  CHECK(c.rows[3].baseline == "b1");
  CHECK(*c.rows[2].acc_delta_points == Approx(-5.0));
  CHECK(*c.rows[3].acc_delta_points == Approx(70.0));
  CHECK(*c.rows[3].speedup == Approx(4.0));
  CHECK_THAT(to_markdown(c), Catch::Contains("Baseline a1 for: a1, a8.") &&
                                 Catch::Contains("Baseline b1 for: b1, b8."));
}

TEST_CASE("a missing or corrupt summary.json is named", "[report][errors]") {
  const auto dir = fs::temp_directory_path() / ("dtrain-report-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  CHECK_THROWS_WITH(load_run(dir.string()), Catch::Contains("summary.json: missing"));
  std::ofstream(dir / "summary.json") << "{\"gpus\": 2,";
  CHECK_THROWS_WITH(load_run(dir.string()), Catch::Contains("summary.json: corrupt JSON"));
  // Where it broke, in words: not the parser's tag, nor the file's bytes (an escape sequence
  // in them would reach the terminal).
  std::ofstream(dir / "summary.json") << "{\"gpus\": 2, \"colo\x1b[31mcate";
  try {
    load_run(dir.string());
    FAIL("a cut summary was read");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("corrupt JSON: parse error at line 1"));
    CHECK(what.find("[json.exception") == std::string::npos);
    CHECK(what.find('\x1b') == std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("a summary field of another type than the table's is named", "[report][errors]") {
  const auto dir = fs::temp_directory_path() / ("dtrain-types-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto read = [&](const std::string& body) {
    std::ofstream(dir / "summary.json") << "{\"gpus\": 2, " << body << "}";
    return load_run(dir.string());
  };
  CHECK_THROWS_WITH(read("\"final_test_accuracy\": \"high\""),
                    Catch::Contains("summary.json: 'final_test_accuracy' is \"high\"; dtrain "
                                    "writes a number or null"));
  CHECK_THROWS_WITH(read("\"status\": 3"), Catch::Contains("'status' is 3; dtrain writes a string"));
  CHECK_THROWS_WITH(read("\"noise_scale\": [1]"),
                    Catch::Contains("'noise_scale' is [1]; dtrain writes an object or null"));
  CHECK_THROWS_WITH(read("\"group\": \"" + std::string(100, 'g') + "\", \"seed\": \"7\""),
                    Catch::Contains("'seed' is \"7\"; dtrain writes an integer"));
  // A whole number written with a fraction part, null where a number may be null, and a field
  // of a later version: read.
  const RunRecord r = read("\"global_batch\": 64.0, \"final_test_accuracy\": null, \"new\": []");
  CHECK(r.global_batch == 64);
  CHECK_FALSE(r.final_test_acc);
  // The test loss, a language model's yardstick, reaches the table, its CSV and its JSON.
  RunRecord lm = read(
      "\"run_id\": \"t-g1\", \"final_test_loss\": 1.23456, "
      "\"final_train_loss\": 1.5");
  lm.experiment.assign("lm");
  lm.status = "done";
  REQUIRE(lm.final_test_loss);
  const Comparison c = compare({lm});
  const std::string md = to_markdown(c);
  CHECK_THAT(md, Catch::Contains("| final train loss | final test loss |"));
  const size_t train_cell = md.find(" 1.5000 "), test_cell = md.find(" 1.2346 ");
  REQUIRE(train_cell != std::string::npos);
  REQUIRE(test_cell != std::string::npos);
  CHECK(test_cell > train_cell);
  CHECK_THAT(to_csv(c), Catch::Contains(",final train loss,final test loss,") &&
                            Catch::Contains(",1.5000,1.2346,"));
  CHECK(nlohmann::json::parse(to_json(c))["runs"][0]["final_test_loss"].get<double>() ==
        Approx(1.23456));
  fs::remove_all(dir);
}

TEST_CASE("summary values a table would show as they are must be dtrain's", "[report][errors]") {
  const auto dir = fs::temp_directory_path() / ("dtrain-values-" + std::to_string(::getpid()));
  fs::create_directories(dir / "r1");
  const auto read = [&](const std::string& body) {
    std::ofstream(dir / "r1" / "summary.json") << "{\"gpus\": 2, " << body << "}";
    return load_run((dir / "r1").string());
  };
  CHECK_NOTHROW(read("\"run_id\": \"t-g2\", \"final_test_accuracy\": 0.9, \"group\": \"a'b\""));
  for (const auto& [body, says] : std::vector<std::pair<std::string, std::string>>{
           {"\"group\": \"x\\n| row |\"", "'group' holds a control character or '|'"},
           {"\"status\": \"done|x\"", "'status' holds a control character or '|'"},
           {"\"final_test_accuracy\": 1e308", "'final_test_accuracy' is 1e+308, not in [0, 1]"},
           {"\"best_test_accuracy\": -5", "'best_test_accuracy' is -5"},
           {"\"samples_per_s\": 1e300", "'samples_per_s' is 1e+300, not a time or rate"},
           {"\"median_epoch_time_s\": -1", "'median_epoch_time_s' is -1"},
           {"\"utilisation\": {\"mfu\": 1e308}", "'utilisation.mfu' is 1e+308"}}) {
    INFO(body);
    CHECK_THROWS_WITH(read(body), Catch::Contains(says) && Catch::Contains("(a damaged file?)"));
  }
  // The run's id is its folder's name, whatever the summary says: a folder copied under another
  // name is a run of its own in the tables.
  CHECK(read("\"run_id\": \"a|b\\n| injected | row |\"").run_id == "r1");
  CHECK(read("\"run_id\": \"../x\"").run_id == "r1");
  CHECK(load_run((dir / "r1" / "").string()).run_id == "r1");
  CHECK(load_run((dir / "r1" / ".").string()).run_id == "r1");
  fs::create_directories(dir / "a|b");
  fs::copy_file(dir / "r1" / "summary.json", dir / "a|b" / "summary.json");
  CHECK_THROWS_WITH(load_run((dir / "a|b").string()),
                    Catch::Contains("the run folder's name holds a control character or '|'"));
  fs::remove_all(dir);
}

TEST_CASE("atomic writes replace whole files", "[report]") {
  const auto p = fs::temp_directory_path() / ("dtrain-atomic-" + std::to_string(::getpid()));
  write_file_atomic(p.string(), "one\n");
  write_file_atomic(p.string(), "two\n");
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  CHECK(s == "two\n");
  fs::remove(p);
}

TEST_CASE("report --by: rows against the first are Holm-corrected as a family", "[report][stats]") {
  std::vector<RunRecord> runs;
  const std::vector<std::pair<std::string, std::vector<double>>> rows = {
      {"0.1", {0.80, 0.81, 0.82}}, {"0.2", {0.83, 0.84, 0.85}}, {"0.4", {0.81, 0.83, 0.85}}};
  for (const auto& [lr, accs] : rows)
    for (size_t s = 0; s < accs.size(); ++s) {
      RunRecord r;
      r.run_id = "lr" + lr + "-seed" + std::to_string(s + 1);
      r.status = "done";
      r.gpus = 1;
      r.final_test_acc = accs[s];
      r.final_train_loss = 0.5 + 0.01 * static_cast<double>(s);
      r.config = {{"optimizer.lr", lr}, {"train.seed", std::to_string(s + 1)}};
      runs.push_back(r);
    }
  const Aggregate a = aggregate(runs, {"train.seed"});
  REQUIRE(a.rows.size() == 3);
  for (size_t i = 1; i < 3; ++i) {
    const WelchTest& w = a.rows[i].final_test_acc_test;
    INFO("row " << i);
    REQUIRE(w.kind == WelchTest::Kind::welch);
    CHECK(w.family == 2);
    CHECK(w.p_holm >= w.p);
    CHECK(w.distinguishable == (w.p_holm < 0.05));
  }
  // The smaller p is doubled (two comparisons); the larger kept at least as large.
  const double p1 = a.rows[1].final_test_acc_test.p, p2 = a.rows[2].final_test_acc_test.p;
  REQUIRE(p1 < p2);
  CHECK(a.rows[1].final_test_acc_test.p_holm == Approx(2 * p1));
  CHECK(a.rows[2].final_test_acc_test.p_holm == Approx(std::max(2 * p1, p2)));
  CHECK_THAT(to_markdown(a), Catch::Contains("Holm p=") && Catch::Contains(" of 2"));
  CHECK(nlohmann::json::parse(to_json(a))["rows"][1]["final_test_accuracy_test"]["family"] == 2);
}

// A run written before dtrain had a key has that key's default: it joins the row of its seeds
// written since, and a run that set the key otherwise does not.
TEST_CASE("report --by: a key a run's summary predates counts as its default", "[report][stats]") {
  const std::string telemetry = "train.telemetry_ms";
  std::string fallback;
  for (const KeyInfo& k : schema_keys())
    if (k.key == telemetry) fallback = k.default_value;
  REQUIRE(!fallback.empty());
  std::vector<RunRecord> runs;
  for (int seed = 1; seed <= 4; ++seed) {
    RunRecord r;
    r.run_id = "seed" + std::to_string(seed);
    r.status = "done";
    r.final_test_acc = 0.9;
    r.config = {{"train.seed", std::to_string(seed)}};
    if (seed == 2) r.config[telemetry] = fallback;  // written since, at the default
    if (seed == 3) r.config[telemetry] = "250";     // set otherwise
    runs.push_back(r);
  }
  const Aggregate a = aggregate(runs, {"train.seed"});
  REQUIRE(a.rows.size() == 2);
  CHECK(a.rows[0].run_ids.size() == 3);
  CHECK(a.rows[1].run_ids == std::vector<std::string>{"seed3"});
  CHECK(a.settings == std::vector<std::string>{telemetry});
  // A diverged run's loss is not finite: the loss mean is over the others, and says so; its
  // accuracy, a real one, counts.
  runs[3].status = "diverged";
  runs[3].final_train_loss = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < 3; ++i) runs[i].final_train_loss = 0.5;
  runs[2].config.erase(telemetry);
  const std::string md = to_markdown(aggregate(runs, {"train.seed"}));
  CHECK_THAT(md, Catch::Contains("0.5000 (3 of 4)") && Catch::Contains("90.00%") &&
                     !Catch::Contains("90.00% ("));
}

TEST_CASE("the comparison table's MFU and straggler come from summary.json", "[report]") {
  const auto dir = fs::temp_directory_path() / ("dtrain-strag-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto read = [&](const std::string& body) {
    std::ofstream(dir / "summary.json") << "{\"gpus\": 4, \"epochs_completed\": 5, " << body << "}";
    return load_run(dir.string());
  };
  RunRecord r = read(R"("utilisation": {"mfu": 0.25}, "stragglers": [
      {"epoch": 1, "rank": 2, "phase": "backward"}, {"epoch": 2, "rank": 1, "phase": "data"},
      {"epoch": 3, "rank": 2, "phase": "backward"}, {"epoch": 4, "rank": -3, "phase": "data"},
      {"epoch": 5, "rank": 1, "phase": 7}])");
  CHECK(r.mfu == 0.25);
  CHECK(r.straggler == "rank 2, backward, 2 of 5 epochs");
  CHECK(read(R"("stragglers": [])").straggler == "none");
  CHECK(read(R"("stragglers": [{"epoch": 1, "rank": 3, "phase": "all"}])").straggler ==
        "rank 3, all, 1 of 5 epochs");
  r = read(R"("utilisation": {"mfu": null})");
  CHECK_FALSE(r.mfu);
  CHECK(r.straggler.empty());  // not looked for
  Comparison c = compare({r}, "");
  CHECK_THAT(to_markdown(c), Catch::Contains("| noise scale | MFU | straggler | status"));
  fs::remove_all(dir);
}

TEST_CASE("a summary's steps to target must be a count the run could have taken", "[report]") {
  const auto dir = fs::temp_directory_path() / ("dtrain-steps-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto read = [&](const std::string& body) {
    std::ofstream(dir / "summary.json")
        << "{\"gpus\": 1, \"steps_per_epoch\": 100, \"epochs_completed\": 3, " << body << "}";
    return load_run(dir.string());
  };
  CHECK(*read("\"steps_to_target\": 250, \"target_resolution_steps\": 10").steps_to_target == 250);
  CHECK(*read("\"steps_to_target\": 399").steps_to_target == 399);  // in the 4th, unfinished
  for (const char* bad : {"\"steps_to_target\": 401", "\"steps_to_target\": 1e300",
                          "\"steps_to_target\": -10", "\"target_resolution_steps\": 1e300",
                          "\"epochs_to_target\": -1", "\"samples_to_target\": 2.5"}) {
    INFO(bad);
    CHECK_THROWS_AS(read(bad), UserError);
  }
  CHECK_THROWS_WITH(read("\"steps_to_target\": 401"),
                    Catch::Contains("summary.json: 'steps_to_target' is 401, past the 400 steps"));
  CHECK_FALSE(read("\"steps_to_target\": null").steps_to_target);
  fs::remove_all(dir);
}

// Links to folders below a report's paths are not followed (a loop cannot trap the walk), and
// each one is handed back to be named; a link given as a path is followed.
TEST_CASE("find_run_dirs names the links it does not follow", "[report]") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("dtrain-links-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "elsewhere" / "exp" / "t-g1");
  std::ofstream(root / "elsewhere" / "exp" / "t-g1" / "status") << "done\n";
  fs::create_directories(root / "results");
  fs::create_directory_symlink(root / "elsewhere", root / "results" / "old");
  fs::create_directory_symlink(root / "results", root / "results" / "loop");
  fs::create_symlink(root / "nowhere", root / "results" / "dangling");
  std::vector<std::string> linked;
  CHECK(find_run_dirs({(root / "results").string()}, &linked).empty());
  std::sort(linked.begin(), linked.end());
  CHECK(linked == std::vector<std::string>{(root / "results" / "loop").string(),
                                           (root / "results" / "old").string()});
  CHECK(find_run_dirs({(root / "results" / "old").string()}).size() == 1);
  fs::remove_all(root);
}

// Config values reach a --by table as written (a data.path may hold any byte): a '|' or a newline
// in one stays inside its cell.
TEST_CASE("report --by: a value with '|' or a newline stays in its cell", "[report][stats]") {
  std::vector<RunRecord> runs;
  for (const std::string path : {"a|b\n## injected", "plain\\|c"})
    for (int s = 1; s <= 2; ++s) {
      RunRecord r;
      r.run_id = "r" + std::to_string(runs.size());
      r.status = "done";
      r.gpus = 1;
      r.final_test_acc = 0.8;
      r.final_train_loss = 0.5;
      r.config = {{"data.path", path}, {"train.seed", std::to_string(s)}};
      runs.push_back(r);
    }
  const std::string md = to_markdown(aggregate(runs, {"train.seed"}));
  INFO(md);
  CHECK(md.find("\n## injected") == std::string::npos);
  CHECK_THAT(md, Catch::Contains("a\\|b\\\\x0a## injected"));  // shows a|b\x0a## injected
  CHECK_THAT(md, Catch::Contains("plain\\\\\\|c"));            // a\|b shows as written, in one cell
  size_t table_lines = 0;
  std::istringstream lines(md);
  for (std::string l; std::getline(lines, l);) table_lines += !l.empty() && l.front() == '|';
  CHECK(table_lines == 4);  // the titles, the rule, two rows
}
