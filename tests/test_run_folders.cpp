// The files dtrain wrote are read back as hostile input: a run finished by another command
// between planning and locking is not trained again, links planted in a results tree are
// refused, the index keeps every planned run, names and tags with control characters are
// refused, and damaged numbers in a run folder are named instead of projected.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/results/plots.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/report.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// A sweep over gpus=1,2 whose 1-replica run takes a few seconds on one thread.
std::string sweep_config(const TempDir& d, int epochs = 2) {
  return d.write("rf.yaml",
                 "name: rf\nbackend: cpu\nthreads: 1\ngpus: 2\n"
                 "data:\n  dataset: synthetic\n  synthetic: {train_size: 2000, test_size: 100, "
                 "shape: [16], classes: 4}\n"
                 "model: {hidden: [16]}\n"
                 "train: {epochs: " +
                     std::to_string(epochs) +
                     ", per_replica_batch: 4, target_accuracy: 0}\n"
                     "optimizer: {lr: 0.02, base_batch: 8}\n");
}

bool wait_for(const fs::path& p, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A dtrain command started in the background that the test can pause (SIGSTOP) while another
// command acts, so that "meanwhile" does not depend on how fast this machine is. On every way
// out of the test it is let go again; one whose result the test never took is also stopped
// (SIGTERM), so that a failing test neither waits for a whole run nor leaves one behind.
class Pausable {
 public:
  Pausable(const TempDir& d, const std::string& env_and_args) : pid_file_(d.path / "pausable.pid") {
    const std::string cmd = "echo $$ > " + pid_file_.string() + "; exec env " + env_and_args;
    done_ = std::async(std::launch::async, [cmd] { return shell(cmd); });
  }
  ~Pausable() {
    if (!done_.valid()) return;
    if (pid_ > 1) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGTERM);
    }
    done_.wait();
  }
  Pausable(const Pausable&) = delete;
  Pausable& operator=(const Pausable&) = delete;
  void pause() {
    std::ifstream in(pid_file_);
    in >> pid_;
    REQUIRE(pid_ > 1);
    if (::kill(pid_, SIGSTOP) != 0)
      FAIL("race lost: the first command had ended before it could be paused");
  }
  ShellResult result() {
    if (pid_ > 1) ::kill(pid_, SIGCONT);
    auto r = done_.get();  // the process is reaped: its pid is no longer ours to signal
    pid_ = 0;
    return r;
  }

 private:
  fs::path pid_file_;
  pid_t pid_ = 0;
  std::future<ShellResult> done_;
};

}  // namespace

TEST_CASE("a resume skips a run that another command finished after this one planned it",
          "[resume][cli]") {
  TempDir d("rf-race");
  const std::string cfg = sweep_config(d, 25);
  const auto res = (d.path / "res").string(), ref = (d.path / "ref").string();
  // A finished 2-replica run of the same experiment, made elsewhere.
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 --results " + ref + " --tag t --quiet").code == 0);
  // Here it failed, so that --resume plans to train it again.
  REQUIRE(shell("DTRAIN_FAULT=0:3 " + dtrain_binary() + " run " + cfg + " gpus=2 --results " +
                res + " --tag t --quiet")
              .code == 1);
  const fs::path g2 = fs::path(res) / "rf" / "t-g2";
  REQUIRE(slurp(g2 / "status") == "failed\n");
  // Its log ends with why, once.
  const std::string log = slurp(g2 / "log");
  CHECK_THAT(log.substr(log.rfind('\n', log.size() - 2) + 1),
             Catch::Contains("error run t-g2 failed: ") && Catch::Contains("fault"));
  CHECK(log.find("failed: ") == log.rfind("failed: "));
  // An allocation failure (DTRAIN_FAULT's oom) says "out of memory" and how to need less, on the
  // terminal, in the log and in the summary, never just "std::bad_alloc".
  const auto oom = shell("DTRAIN_FAULT=1:3:oom " + dtrain_binary() + " run " + cfg +
                         " gpus=2 --results " + res + " --tag oom --quiet");
  CHECK(oom.code == 1);
  CHECK_THAT(oom.out, Catch::Contains("run oom-g2 failed: out of memory (an allocation "
                                      "failed); a smaller batch, model or input (data.shape, "
                                      "data.block_size) needs less"));
  const fs::path oom_dir = fs::path(res) / "rf" / "oom-g2";
  CHECK(slurp(oom_dir / "status") == "failed\n");
  CHECK_THAT(slurp(oom_dir / "log"), Catch::Contains("failed: out of memory"));
  CHECK_THAT(slurp(oom_dir / "summary.json"), Catch::Contains("out of memory"));
  CHECK_THAT(oom.out, !Catch::Contains("bad_alloc"));
  // A replica thread that cannot be started (a limit on threads or memory): the run fails
  // saying why, the threads already started end, and the process does not abort.
  const auto thr = shell("DTRAIN_FAULT=thread:1 " + dtrain_binary() + " run " + cfg +
                         " gpus=2 replicas=threads --results " + res + " --tag thr --quiet");
  CHECK(thr.code == 1);
  CHECK_THAT(thr.out, Catch::Contains("cannot start the thread of rank 1 of 2 replicas"));
  CHECK(slurp(fs::path(res) / "rf" / "thr-g2" / "status") == "failed\n");
  // Its summary still has the LR it would have trained with, not 0.
  const auto thr_summary =
      nlohmann::json::parse(slurp(fs::path(res) / "rf" / "thr-g2" / "summary.json"));
  CHECK(thr_summary.at("peak_lr").get<double>() > 0);
  // Command A plans both runs, then trains t-g1 for seconds; meanwhile "command B" finishes
  // t-g2 (its folder replaced by the finished one).
  // DTRAIN_SLOW stretches t-g1's optimizer steps 100-fold, waiting: about 2 s for 25 epochs
  // (yielding the core: a stretch this short is not slept), about 40 s under ASan (sleeping);
  // 1000 epochs unstretched took 18 s of both cores (88 s under ASan).
  Pausable a(d, "DTRAIN_SLOW=0:optimizer:100 " + dtrain_binary() + " run " + cfg +
                    " gpus=1,2 --results " + res + " --tag t --resume");
  REQUIRE(wait_for(fs::path(res) / "rf" / "t-g1" / "status", 60));
  a.pause();
  // The swap must land while A still trains t-g1; afterwards the test would prove nothing.
  const bool in_time = slurp(fs::path(res) / "rf" / "t-g1" / "status") == "running\n";
  fs::rename(g2, d.path / "failed-g2");
  fs::copy(fs::path(ref) / "rf" / "t-g2", g2, fs::copy_options::recursive);
  const std::string finished = slurp(g2 / "summary.json");
  const auto r = a.result();
  INFO(r.out);
  if (!in_time) FAIL("race lost: t-g1 had ended before the swap (a machine too loaded)");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("was finished by another command meanwhile") != std::string::npos);
  CHECK(slurp(g2 / "summary.json") == finished);  // not trained again
  CHECK(!fs::exists(fs::path(res) / "rf" / ".attempts" / "t-g2.1"));
}

// Two commands of one tag at once, each training its own part of the sweep: each saves the
// index with the other's rows as they are now, not as they were when it started.
TEST_CASE("two commands of one tag at once keep each other's rows in the index", "[resume][cli]") {
  TempDir d("rf-two");
  const std::string cfg = sweep_config(d, 25);
  const auto res = (d.path / "res").string();
  Pausable a(d, "DTRAIN_SLOW=0:optimizer:100 " + dtrain_binary() + " run " + cfg +
                    " gpus=1 --results " + res + " --tag t --quiet");
  const fs::path exp = fs::path(res) / "rf";
  // Paused once its index says t-g1 is running: training, not in the middle of a save.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (slurp(exp / "index-t.csv").find("\nt-g1,running,") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  a.pause();  // until the second command has ended
  const bool in_time = slurp(exp / "t-g1" / "status") == "running\n";
  const auto b =
      dtrain_cli("run " + cfg + " gpus=2 --results " + res + " --tag t --resume --quiet");
  INFO(b.out);
  REQUIRE(b.code == 0);
  const auto ra = a.result();
  INFO(ra.out);
  REQUIRE(ra.code == 0);
  if (!in_time) FAIL("race lost: t-g1 had ended before the second command did");
  const std::string index = slurp(exp / "index-t.csv");
  INFO(index);
  CHECK_THAT(index, Catch::Contains("\nt-g1,done,") && Catch::Contains("\nt-g2,done,"));
}

TEST_CASE("a planted .attempts link or a link among the attempts is refused, nothing moved",
          "[resume][cli]") {
  TempDir d("rf-attic");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  const fs::path exp = fs::path(res) / "rf", g2 = exp / "t-g2";
  auto fail_g2 = [&] {
    REQUIRE(shell("DTRAIN_FAULT=0:3 " + dtrain_binary() + " run " + cfg + " --results " + res +
                  " --tag t --quiet")
                .code == 1);
  };
  fail_g2();
  const fs::path outside = d.path / "outside";
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, exp / ".attempts");
  auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains(".attempts: a symbolic link where dtrain keeps earlier"));
  CHECK(fs::is_empty(outside));
  CHECK(slurp(g2 / "status") == "failed\n");
  // A dangling link at the name the attempt would take.
  fs::remove(exp / ".attempts");
  fs::create_directories(exp / ".attempts");
  fs::create_symlink(d.path / "nowhere", exp / ".attempts" / "t-g2.1");
  r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("t-g2.1: a symbolic link among the earlier attempts"));
  CHECK(slurp(g2 / "status") == "failed\n");
  // Without the link, the resume moves the failed attempt aside and trains.
  fs::remove(exp / ".attempts" / "t-g2.1");
  r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume --quiet");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(fs::exists(exp / ".attempts" / "t-g2.1" / "status"));
}

TEST_CASE("a --resume of part of a sweep keeps every planned run in the index and the table",
          "[resume][cli]") {
  TempDir d("rf-index");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1,2 --results " + res + " --tag s --quiet").code == 0);
  const auto r = dtrain_cli("run " + cfg + " gpus=2 --results " + res + " --tag s --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto rows = parse_csv(slurp(fs::path(res) / "rf" / "index-s.csv"));
  REQUIRE(rows.size() == 3);  // the header and both runs
  CHECK(rows[1][0] == "s-g1");
  CHECK(rows[2][0] == "s-g2");
  CHECK(rows[1][1] == "done");
  const std::string table = slurp(fs::path(res) / "rf" / "comparison-s.md");
  CHECK(table.find("s-g1") != std::string::npos);
  CHECK(table.find("s-g2") != std::string::npos);
}

// A SIGTERM that lands once a run has ended (DTRAIN_FAULT=term-after:K: after run K, as one
// arriving while it wrote its results would): after the last run it interrupted nothing, and
// the command ends with 0; after an earlier run the rest of the sweep is left for --resume.
TEST_CASE("a stop after every run has finished exits 0, and after one of two 143",
          "[resume][cli]") {
  TempDir d("rf-late-stop");
  const std::string cfg = sweep_config(d, 1);
  const auto res = (d.path / "res").string();
  const std::string run =
      dtrain_binary() + " run " + cfg + " gpus=1,2 --results " + res + " --tag ";
  const fs::path exp = fs::path(res) / "rf";
  const auto late = shell("DTRAIN_FAULT=term-after:1 " + run + "late 2>&1");
  INFO(late.out);
  CHECK(late.code == 0);
  CHECK_THAT(late.out, Catch::Contains("stop asked for after every run had finished"));
  CHECK(slurp(exp / "late-g1" / "status") == "done\n");
  CHECK(slurp(exp / "late-g2" / "status") == "done\n");
  const auto early = shell("DTRAIN_FAULT=term-after:0 " + run + "early 2>&1");
  INFO(early.out);
  CHECK(early.code == 143);
  CHECK(slurp(exp / "early-g1" / "status") == "done\n");
  CHECK_FALSE(fs::exists(exp / "early-g2" / "summary.json"));
  CHECK_THAT(slurp(exp / "index-early.csv"), Catch::Contains("early-g2,pending"));
}

// A run folder that cannot be written whole (a full disk; here a file-size limit, with SIGXFSZ
// ignored as a shell's trap leaves it) is marked failed, not left "running" with no summary.
TEST_CASE("a run folder that cannot be written whole is marked failed", "[resume][cli]") {
  TempDir d("rf-cannot-write");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  const auto r = shell("trap '' XFSZ; ulimit -f 2; " + dtrain_binary() + " run " + cfg +
                       " gpus=1 --results " + res + " --tag t");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("cannot write config.resolved.yaml: File too large"));
  const fs::path exp = fs::path(res) / "rf";
  CHECK(slurp(exp / "t-g1" / "status") == "failed\n");
  CHECK_THAT(slurp(exp / "index-t.csv"), Catch::Contains("t-g1,failed,"));
}

TEST_CASE("parse_csv reads what csv_escape writes", "[report]") {
  const std::vector<std::string> fields = {"plain", "a,b", "say \"hi\"", "two\nlines", ""};
  std::string line;
  for (const auto& f : fields) line += (line.empty() ? "" : ",") + csv_escape(f);
  const auto rows = parse_csv("h1,h2,h3,h4,h5\n" + line + "\n");
  REQUIRE(rows.size() == 2);
  CHECK(rows[1] == fields);
  CHECK(parse_csv("").empty());
  CHECK(parse_csv("a,b").size() == 1);  // a last record without its newline
}

TEST_CASE("report reads no file of a run folder through a symbolic link", "[report][cli]") {
  TempDir d("rf-links");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1,2 --results " + res + " --tag t --quiet").code == 0);
  const fs::path g1 = fs::path(res) / "rf" / "t-g1", g2 = fs::path(res) / "rf" / "t-g2";
  // A secret outside the tree, linked in as a status and as a summary.
  put(d.path / "secret", "TOP-SECRET line\n");
  fs::remove(g1 / "status");
  fs::create_symlink(d.path / "secret", g1 / "status");
  fs::rename(g2 / "summary.json", d.path / "g2-summary.json");
  fs::create_symlink(d.path / "g2-summary.json", g2 / "summary.json");
  const auto r = dtrain_cli("report " + res + " --out " + (d.path / "rep").string());
  INFO(r.out);
  const std::string index = slurp(d.path / "rep" / "index.md");
  CHECK(index.find("TOP-SECRET") == std::string::npos);
  CHECK(r.out.find("TOP-SECRET") == std::string::npos);
  CHECK_THAT(r.out, Catch::Contains("summary.json: a symbolic link where dtrain wrote"));
  CHECK(index.find("unreadable") != std::string::npos);
  // The one way to read dtrain's own files refuses the link; a plain read follows it.
  CHECK_THROWS_WITH(read_own_file((g1 / "status").string(), "status", kMaxStatusBytes),
                    Catch::Contains("a symbolic link"));
  CHECK(read_text_file((g1 / "status").string(), "status") == "TOP-SECRET line\n");
  // A status that is a loop of links: that run is unreadable, the rest is still reported.
  fs::remove(g1 / "status");
  fs::create_symlink("status", g1 / "status");
  const auto loop = dtrain_cli("report " + res + " --out " + (d.path / "rep2").string());
  INFO(loop.out);
  CHECK(loop.code != 2);
  CHECK(fs::exists(d.path / "rep2" / "index.md"));
  CHECK_THAT(slurp(d.path / "rep2" / "index.md"), Catch::Contains("t-g2"));
  // So is a summary.json or a metrics.csv that is a loop of links.
  fs::remove(g2 / "summary.json");
  fs::create_symlink("summary.json", g2 / "summary.json");
  fs::remove(g1 / "metrics.csv");
  fs::create_symlink("metrics.csv", g1 / "metrics.csv");
  // The figures read metrics.csv; without gnuplot (the GPU machine's runtime root) the tables.
  const std::string plots = dtrain::gnuplot_available() ? " --plots" : "";
  const auto loops = dtrain_cli("report " + res + plots + " --out " + (d.path / "rep3").string());
  INFO(loops.out);
  CHECK(loops.code == 1);
  CHECK_THAT(loops.out, Catch::Contains("t-g2/summary.json: a symbolic link"));
  CHECK(fs::exists(d.path / "rep3" / "index.md"));
}

TEST_CASE("report names a folder it cannot list and shows a live run as running",
          "[report][cli]") {
  TempDir d("rf-report");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag t --quiet").code == 0);
  // A run that is still writing: its status says running, no summary yet, metrics partial.
  const fs::path live = fs::path(res) / "rf" / "t-live";
  fs::create_directories(live);
  put(live / "status", "running\n");
  put(live / "metrics.csv", "epoch,lr\n1,0.0");
  auto r = [&] {
    const RunLock held(live.string());  // as the training process holds it
    return dtrain_cli("report " + res + " --out " + (d.path / "rep").string());
  }();
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("warning") == std::string::npos);
  CHECK_THAT(slurp(d.path / "rep" / "index.md"), Catch::Contains("running"));
  if (geteuid() == 0) return;  // root reads any folder: the rest cannot be set up
  const fs::path locked = fs::path(res) / "rf" / "locked";
  fs::create_directories(locked / "inner");
  ::chmod(locked.c_str(), 0);
  r = dtrain_cli("report " + res + " --out " + (d.path / "rep2").string());
  ::chmod(locked.c_str(), 0755);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("locked: cannot list this folder"));
}

TEST_CASE("names and tags with control characters are refused, and configs read back to themselves",
          "[config][cli]") {
  // In YAML's double-quoted escapes: a carriage return, a tab, a newline, DEL.
  for (const std::string bad : {"syn\\r", "a\\tb", "line\\nbreak", "x\\x7f"}) {
    INFO(bad);
    CHECK_THAT(config_error(tiny_config("\"" + bad + "\"")), Catch::Contains("control characters"));
  }
  TempDir d("rf-tag");
  const std::string cfg = sweep_config(d);
  const auto r = dtrain_cli("run " + cfg + " --results " + (d.path / "r").string() +
                            " --tag \"$(printf 'a\\rb')\"");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("control characters are not allowed in a tag"));
  CHECK(!fs::exists(d.path / "r"));
  // A C1 control (U+009B, a terminal's CSI) is refused too, and not echoed as it is.
  const auto c1 = dtrain_cli("run " + cfg + " --results " + (d.path / "r").string() +
                             " --tag \"$(printf 'a\\302\\2332Jb')\"");
  CHECK(c1.code == 2);
  CHECK_THAT(c1.out, Catch::Contains("--tag 'a\\xc2\\x9b2Jb': control characters"));
  // Any string the writer emits reads back as itself (data.path may hold any byte).
  Config c = parse_config(slurp(cfg), "rf.yaml");
  c.data.path = "dir\rwith\tcontrols";
  const std::string once = to_yaml(c);
  CHECK(parse_config(once, "resolved.yaml").data.path == c.data.path);
  CHECK(to_yaml(parse_config(once, "resolved.yaml")) == once);
}

TEST_CASE("project names a damaged number in a run folder instead of projecting it",
          "[project][cli]") {
  TempDir d("rf-project");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag t --quiet").code == 0);
  const fs::path run = fs::path(res) / "rf" / "t-g1";
  const std::string metrics = slurp(run / "metrics.csv"), summary = slurp(run / "summary.json");
  REQUIRE(dtrain_cli("project " + run.string()).code == 0);
  // The compute_s column (12th) of the first epoch row replaced by `value`.
  auto with_compute = [&](const std::string& value) {
    std::istringstream in(metrics);
    std::string out, line;
    for (int n = 0; std::getline(in, line); ++n) {
      if (n == 1) {
        std::vector<std::string> f;
        std::stringstream ss(line);
        for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
        f[11] = value;
        line.clear();
        for (const auto& x : f) line += (line.empty() ? "" : ",") + x;
      }
      out += line + "\n";
    }
    return out;
  };
  for (const std::string bad : {"abc", "1e308x", "inf", "nan", "-5", "1e308"}) {
    INFO("compute_s " << bad);
    put(run / "metrics.csv", with_compute(bad));
    const auto r = dtrain_cli("project " + run.string());
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("'compute_s' is '" + bad + "' in epoch row 1"));
  }
  put(run / "metrics.csv", metrics);
  for (const std::string bad : {"1e30", "0", "-5", "2.5"}) {
    INFO("global_batch " << bad);
    const auto at = summary.find("\n  \"global_batch\": ");  // the top level's, not the config's
    REQUIRE(at != std::string::npos);
    const auto end = summary.find_first_of(",\n", at + 1);
    put(run / "summary.json",
        summary.substr(0, at) + "\n  \"global_batch\": " + bad + summary.substr(end));
    const auto r = dtrain_cli("project " + run.string());
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("'global_batch' is"));
  }
}

TEST_CASE("a run folder's summary cannot move the table, crash the reader or read out of tree",
          "[report][resume][cli]") {
  TempDir d("rf-hostile-summary");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1,2 --results " + res + " --tag t --quiet").code == 0);
  const fs::path exp = fs::path(res) / "rf", g1 = exp / "t-g1";
  std::string summary = slurp(g1 / "summary.json");
  const auto set = [&](const std::string& key, const std::string& value) {
    const auto at = summary.find("\n  \"" + key + "\": ");
    REQUIRE(at != std::string::npos);
    const auto end = summary.find_first_of("\n", at + 1);
    const auto comma = summary[end - 1] == ',' ? "," : "";
    summary = summary.substr(0, at) + "\n  \"" + key + "\": " + value + comma + summary.substr(end);
  };
  // An experiment name that climbs out of the results tree: the table stays in rf/.
  set("experiment", "\"../../escape\"");
  put(g1 / "summary.json", summary);
  auto r = dtrain_cli("run " + cfg + " gpus=1,2 --results " + res + " --tag t --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(!fs::exists(d.path / "escape"));
  CHECK_THAT(r.out, Catch::Contains("names experiment '../../escape', not 'rf'"));
  // Control characters and '|' never reach the terminal or a table: an experiment name that
  // holds them is a damaged summary, and a status file that holds them (no summary beside it)
  // is no status.
  set("experiment", "\"rf\\u001b[2J\\nPWNED\"");
  put(g1 / "summary.json", summary);
  r = dtrain_cli("report " + res + " --out " + (d.path / "rep0").string());
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("'experiment' holds a control character"));
  CHECK(r.out.find('\x1b') == std::string::npos);
  fs::copy(g1, exp / "t-g9", fs::copy_options::recursive);
  fs::remove(exp / "t-g9" / "summary.json");
  put(exp / "t-g9" / "status", "\x1b[31mdone | 99.99% | x\x07\n");
  r = dtrain_cli("report " + res + " --out " + (d.path / "rep1").string());
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find("99.99%") == std::string::npos);
  CHECK_THAT(slurp(d.path / "rep1" / "rf.md"), Catch::Contains("| unreadable"));
  fs::remove_all(exp / "t-g9");
  // A model description of 60000 digits (no param_count) and a config nested a million deep.
  set("experiment", "\"rf\"");
  set("model", "\"(" + std::string(60000, '7') + " parameters)\"");
  const auto pc = summary.find("\n  \"param_count\": ");
  if (pc != std::string::npos) summary.erase(pc, summary.find('\n', pc + 1) - pc);
  put(g1 / "summary.json", summary);
  r = dtrain_cli("report " + res + " --out " + (d.path / "rep").string());
  CHECK(r.code == 0);
  set("group", std::string(1000000, '[') + std::string(1000000, ']'));
  put(g1 / "summary.json", summary);
  r = dtrain_cli("report " + res + " --out " + (d.path / "rep2").string());
  CHECK(r.code == 1);  // that folder unreadable, named; the rest reported
  CHECK_THAT(r.out, Catch::Contains("nested deeper than 72 levels"));
  // An index row naming a link to a folder elsewhere: not read into the table.
  fs::create_directories(d.path / "outside");
  fs::copy(fs::path(res) / "rf" / "t-g2", d.path / "outside" / "evil",
           fs::copy_options::recursive);
  fs::create_directory_symlink(d.path / "outside" / "evil", exp / "evil");
  std::string index = slurp(exp / "index-t.csv");
  put(exp / "index-t.csv", index + "evil,done,2,,,x\nt-g2,failed,2,,,x\n");
  r = dtrain_cli("run " + cfg + " gpus=2 --results " + res + " --tag t --resume");
  INFO(r.out);
  CHECK(slurp(exp / "comparison-t.md").find("evil") == std::string::npos);
  const auto rows = parse_csv(slurp(exp / "index-t.csv"));
  int g2_rows = 0;
  for (const auto& row : rows) g2_rows += row[0] == "t-g2";
  CHECK(g2_rows == 1);  // one row per run, the duplicate gone
}

TEST_CASE("a resume whose saved config no longer reads starts over instead of failing",
          "[resume][cli]") {
  TempDir d("rf-moved");
  const std::string cfg = sweep_config(d);
  const auto res = (d.path / "res").string();
  REQUIRE(shell("DTRAIN_FAULT=0:3 " + dtrain_binary() + " run " + cfg +
                " gpus=1 train.checkpoint_steps=2 --results " + res + " --tag t --quiet")
              .code == 1);
  const fs::path g1 = fs::path(res) / "rf" / "t-g1";
  REQUIRE(fs::exists(g1 / "checkpoint.bin"));
  put(g1 / "config.resolved.yaml", "name: rf\ndata: {dataset: idx, path: /moved/away}\n");
  const auto r = dtrain_cli("run " + cfg + " gpus=1 train.checkpoint_steps=2 --results " + res +
                            " --tag t --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("is of another config (it has '") &&
                        Catch::Contains("'); the run starts over"));
  CHECK(slurp(g1 / "status") == "done\n");
  // A key changed since: the warning names its line as saved and as asked for.
  REQUIRE(shell("DTRAIN_FAULT=0:3 " + dtrain_binary() + " run " + cfg +
                " gpus=1 train.checkpoint_steps=2 --results " + res + " --tag u --quiet")
              .code == 1);
  const auto lr = dtrain_cli("run " + cfg + " gpus=1 train.checkpoint_steps=2 optimizer.lr=0.5" +
                             " --results " + res + " --tag u --resume");
  INFO(lr.out);
  CHECK(lr.code == 0);
  CHECK_THAT(lr.out, Catch::Contains("(it has 'lr: 0.02', this command asks for 'lr: 0.5')"));
  // How often checkpoints are written and how long a rank waits for the others change no
  // result: such a resume continues (test_folder.cpp: the decode threads).
  REQUIRE(shell("DTRAIN_FAULT=0:3 " + dtrain_binary() + " run " + cfg +
                " gpus=1 train.checkpoint_steps=2 --results " + res + " --tag v --quiet")
              .code == 1);
  const auto every = dtrain_cli("run " + cfg +
                                " gpus=1 train.checkpoint_steps=5 train.collective_timeout_s=600 "
                                "--results " +
                                res + " --tag v --resume");
  INFO(every.out);
  CHECK(every.code == 0);
  CHECK_THAT(every.out, Catch::Contains("resume: continuing at epoch 1, step 2"));
  // A resume whose runs are none of the tag's (a sweep's ids name their values) says which
  // runs the tag has.
  const auto other = dtrain_cli("run " + cfg + " gpus=1 optimizer.lr=0.5,0.25 --results " + res +
                                " --tag v --resume");
  INFO(other.out);
  CHECK(other.code == 0);
  CHECK_THAT(other.out, Catch::Contains("none of this command's runs is among those of --tag v") &&
                            Catch::Contains("(v-g1)"));
  // Runs the tag's index lists whose folders were never made (the command ended while
  // planning): they start, and the log says the command had not started them, not that they
  // are another command's.
  fs::remove_all(fs::path(res) / "rf" / "v-g1");
  fs::remove_all(fs::path(res) / "rf" / ".attempts");  // else its checkpoint would be looked for
  const auto again = dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag v --resume");
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK_THAT(again.out, Catch::Contains("ended before its first run started"));
  CHECK_THAT(again.out, !Catch::Contains("none of this command's runs"));
}

// A config of at most 1 MiB may resolve to more (every layer's keys written out): the run's own
// config.resolved.yaml is read back at any size it can have, so such a run still resumes from its
// checkpoint, and a finished one is still recognised as finished.
TEST_CASE("a resolved config over 1 MiB still resumes and is recognised when finished",
          "[resume][cli]") {
  TempDir d("rf-big-config");
  const std::string cfg = sweep_config(d, 2);
  const auto res = (d.path / "res").string();
  const fs::path run = fs::path(res) / "rf" / "t-g1";
  const auto pad = [&] {  // comments: the same config, 1.5 MiB larger
    std::ofstream(run / "config.resolved.yaml", std::ios::app)
        << std::string(1536, '#') + "\n" << std::string(1536 * 1024 - 1537, '#') << "\n";
    REQUIRE(fs::file_size(run / "config.resolved.yaml") > (size_t{3} << 19));
  };
  // --resume under a tag nothing was run with trains from the start, and says so (a typo in
  // --tag or --results would otherwise go unnoticed).
  const auto fresh =
      dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag fresh --resume --quiet");
  CHECK(fresh.code == 0);
  CHECK_THAT(fresh.out, Catch::Contains("--resume: no run of --tag fresh in " + res + "/rf yet"));
  // 500 steps an epoch: the fault comes after the first epoch's checkpoint.
  REQUIRE(shell("DTRAIN_FAULT=0:502 " + dtrain_binary() + " run " + cfg +
                " gpus=1 --results " + res + " --tag t --quiet")
              .code == 1);
  pad();
  const auto resumed =
      dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag t --resume --quiet");
  INFO(resumed.out);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.out, !Catch::Contains("starts over"));
  CHECK_THAT(slurp(run / "log"), Catch::Contains("resume: continuing at epoch 1, step 500") ||
                                     Catch::Contains("resume: continuing at epoch 2, step 0"));
  pad();
  const auto again =
      dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag t --resume --quiet");
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK_THAT(again.out, !Catch::Contains("no config.resolved.yaml"));
}

// A config may nest blocks as deep as the config reader allows (64 levels); the summary that
// repeats it is read back at that depth plus its own levels, so such a run is reported.
TEST_CASE("a run of deeply nested residual blocks is reported like any other", "[report][cli]") {
  TempDir d("rf-nested");
  std::string body = "[relu]";
  for (int i = 0; i < 14; ++i) body = "[{residual: {body: " + body + "}}]";
  const std::string cfg =
      d.write("n.yaml", "name: n\nthreads: 1\ndata: {dataset: synthetic, synthetic: "
                        "{train_size: 64, test_size: 16, shape: [4], classes: 2}}\n"
                        "model: {type: layers, layers: " + body + "}\n"
                        "train: {epochs: 1, per_replica_batch: 16}\n");
  const auto res = (d.path / "res").string();
  const auto v = dtrain_cli("validate " + cfg);
  INFO(v.out);
  REQUIRE(v.code == 0);
  REQUIRE(dtrain_cli("run " + cfg + " --results " + res + " --tag t --quiet").code == 0);
  const auto r = dtrain_cli("report " + res + " --out " + (d.path / "rep").string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(slurp(d.path / "rep" / "n.md"), Catch::Contains("| t-g1 "));
}

TEST_CASE("a results folder named with control characters never reaches the terminal raw",
          "[cli]") {
  TempDir d("ctl-results");
  const std::string cfg = d.write("c.yaml", tiny_config("c"));
  // An escape that sets a terminal's title, a bell, a byte that is not UTF-8.
  const std::string res = (d.path / "r\x1b]0;T\x07\xff").string();
  const auto lines_clean = [](const std::string& out) {
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
      if (has_control_character(l) || printable(l) != l) return false;
    return true;
  };
  const auto run = dtrain_cli("run " + cfg + " --tag t --quiet --results '" + res + "'");
  INFO(printable(run.out, true));
  REQUIRE(run.code == 0);
  CHECK(lines_clean(run.out));
  CHECK_THAT(run.out, Catch::Contains("(written to " + printable(res, true)));
  // report, and project of the run: JSON files and one-line output, whatever the bytes.
  const auto rep = dtrain_cli("report '" + res + "'");
  INFO(printable(rep.out, true));
  CHECK(rep.code == 0);
  CHECK(lines_clean(rep.out));
  const auto proj = dtrain_cli("project '" + res + "/c/t-g1' --gpus 1,2");
  INFO(printable(proj.out, true));
  CHECK(proj.code == 0);
  CHECK(lines_clean(proj.out));
}

// A finished run whose summary.json is gone or damaged is not skipped by --resume (it would be
// left out of the table without a word): it runs again, its folder kept under .attempts/.
TEST_CASE("a resume runs again a finished run whose summary.json is missing or damaged",
          "[resume][cli]") {
  TempDir d("rf-summary");
  const std::string cfg = sweep_config(d, 1);
  const auto res = (d.path / "res").string();
  const std::string args =
      "run " + cfg + " gpus=1 optimizer.lr=0.01,0.02,0.04 --results " + res + " --tag t";
  REQUIRE(dtrain_cli(args + " --quiet").code == 0);
  const fs::path exp = fs::path(res) / "rf";
  fs::remove(exp / "t-g1-lr0.01" / "summary.json");
  put(exp / "t-g1-lr0.02" / "summary.json", "{\"status\": \"done\", ");
  const auto r = dtrain_cli(args + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("t-g1-lr0.01 says done, but") &&
                        Catch::Contains("t-g1-lr0.02 says done, but") &&
                        Catch::Contains("t-g1-lr0.04 is done already; skipped"));
  for (const char* run : {"t-g1-lr0.01", "t-g1-lr0.02"}) {
    CHECK(fs::exists(exp / ".attempts" / (std::string(run) + ".1")));
    CHECK(fs::exists(exp / run / "summary.json"));
    CHECK(slurp(exp / "comparison-t.md").find(std::string("| ") + run) != std::string::npos);
  }
}
