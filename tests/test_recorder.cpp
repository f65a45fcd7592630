// Run folders: atomic replacement, no symbolic link followed, a full disk reported as a system
// failure that leaves consistent state, and the status readers trust.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/results/recorder.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// A synthetic experiment that runs in a fraction of a second.
std::string tiny_yaml(int epochs) {
  return R"(name: tiny
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 256, test_size: 64, shape: [8], classes: 3}
model: {hidden: [8]}
train: {epochs: )" + std::to_string(epochs) + ", per_replica_batch: 16}\n";
}

// Files in `dir` whose name holds ".tmp.": what an interrupted atomic write leaves behind.
int temp_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

// Runs `body` in a child process whose files may not grow past `bytes` (writes beyond fail
// with EFBIG, as on a full disk); returns the child's exit code.
int with_file_size_limit(rlim_t bytes, const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{bytes, bytes};
    setrlimit(RLIMIT_FSIZE, &lim);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("write_file_atomic replaces a file whole and leaves no temporary file", "[recorder]") {
  TempDir d("rec");
  const auto f = (d.path / "a.txt").string();
  write_file_atomic(f, "one\n");
  write_file_atomic(f, "two\n");
  CHECK(slurp(f) == "two\n");
  CHECK(temp_files(d.path) == 0);
}

TEST_CASE("write_file_atomic never follows a link planted at its temporary name", "[recorder]") {
  TempDir d("rec");
  const auto victim = d.path / "victim";
  put(victim, "precious\n");
  const auto f = d.path / "summary.json";
  fs::create_symlink(victim, fs::path(f.string() + ".tmp." + std::to_string(::getpid())));
  write_file_atomic(f.string(), "{}\n");
  CHECK(slurp(victim) == "precious\n");
  CHECK(slurp(f) == "{}\n");
  CHECK(!fs::is_symlink(f));
  CHECK(temp_files(d.path) == 0);
}

// A path the user names as an output (explain-time --json, project --out) may hold a device,
// a FIFO or a link (/dev/stdout): a rename over it would put a file in its place.
TEST_CASE("write_file_atomic replaces only a regular file, never a FIFO, a link or a folder",
          "[recorder]") {
  TempDir d("rec");
  const auto fifo = d.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  put(d.path / "target", "kept\n");
  fs::create_symlink(d.path / "target", d.path / "link.json");
  fs::create_directory(d.path / "folder");
  for (const auto& [path, kind] :
       {std::pair{fifo, "a FIFO"}, {d.path / "link.json", "a symbolic link"},
        {d.path / "folder", "a folder"}}) {
    INFO(path);
    CHECK_THROWS_WITH(write_file_atomic(path.string(), "{}\n"),
                      Catch::Contains(std::string("not a regular file (") + kind));
  }
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_symlink(d.path / "link.json"));
  CHECK(slurp(d.path / "target") == "kept\n");
  CHECK_THROWS_WITH(write_file_atomic("", "x"), Catch::Contains("an empty file name"));
  CHECK(temp_files(d.path) == 0);
}

TEST_CASE("a full disk is a system error naming the folder, and the old content survives",
          "[recorder]") {
  TempDir d("rec");
  const auto f = (d.path / "metrics.csv").string();
  write_file_atomic(f, "old\n");
  const int code = with_file_size_limit(64, [&] {
    try {
      write_file_atomic(f, std::string(1000, 'x'));
    } catch (const UserError&) {
      return 2;  // a user mistake: wrong
    } catch (const SystemError& e) {
      return std::string(e.what()).find(d.path.string()) != std::string::npos ? 0 : 3;
    }
    return 4;
  });
  CHECK(code == 0);
  CHECK(slurp(f) == "old\n");
  CHECK(temp_files(d.path) == 0);
}

TEST_CASE("a run's status is read from its summary before its status file", "[recorder]") {
  TempDir d("rec");
  const auto run = d.path / "r";
  fs::create_directories(run);
  put(run / "status", "running\n");
  RunLock held(run.string());
  CHECK(read_run_status(run.string()) == "running");
  // A crash between the two writes: the summary is final, the status file is not.
  put(run / "summary.json", R"({"status": "done"})");
  CHECK(read_run_status(run.string()) == "done");
  put(run / "summary.json", "{corrupt");
  CHECK(read_run_status(run.string()) == "running");
}

TEST_CASE("a status file that a full disk left behind its summary is brought in line",
          "[recorder]") {
  TempDir d("rec");
  const auto run = d.path / "r";
  fs::create_directories(run);
  put(run / "status", "running\n");
  put(run / "summary.json", R"({"status": "done"})");
  repair_status_file(run.string(), read_run_status(run.string()));
  CHECK(slurp(run / "status") == "done\n");
  repair_status_file(run.string(), "done");  // in line already: left as it is
  CHECK(slurp(run / "status") == "done\n");
  CHECK(temp_files(d.path) == 0);
  // --resume skips the finished run and says its status again.
  const auto cfg = d.write("tiny.yaml", tiny_yaml(1));
  const std::string cmd = "run " + cfg + " --results " + (d.path / "res").string() + " --tag t";
  REQUIRE(dtrain_cli(cmd).code == 0);
  const auto made = d.path / "res" / "tiny" / "t-g1";
  put(made / "status", "running\n");
  const auto r = dtrain_cli(cmd + " --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("done already; skipped"));
  CHECK(slurp(made / "status") == "done\n");
}

TEST_CASE("dtrain run on a full disk exits 1 and leaves the run marked failed", "[recorder][cli]") {
  TempDir s("full");
  const auto cfg = s.write("tiny.yaml", tiny_yaml(2));
  // A first run tells the sizes: every file must fit under the limit but summary.json.
  const auto ok = dtrain_cli("run " + cfg + " --results " + (s.path / "ok").string() + " --tag t");
  REQUIRE(ok.code == 0);
  uintmax_t others = 0, summary = 0;
  for (const auto& e : fs::directory_iterator(s.path / "ok" / "tiny" / "t-g1")) {
    auto& largest = e.path().filename() == "summary.json" ? summary : others;
    largest = std::max(largest, fs::file_size(e));
  }
  REQUIRE(others < summary);
  const auto limit = (others + summary) / 2;
  const auto res = s.path / "res";
  // The shell ignores SIGXFSZ, so writes past the limit fail with EFBIG, as with ENOSPC.
  const auto r = shell("trap '' XFSZ; exec prlimit --fsize=" + std::to_string(limit) + " " +
                       dtrain_binary() + " run " + cfg + " --results " + res.string() +
                       " --tag t 2>&1");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("cannot write summary.json"));
  const auto run = res / "tiny" / "t-g1";
  CHECK(slurp(run / "status") == "failed\n");
  CHECK(read_run_status(run.string()) == "failed");
  CHECK(temp_files(res) == 0);
}

// A tag's index is saved under a short lock, waited for; a holder that never lets go (a
// command stopped midway) is waited for only so long. flock locks belong to the open file, so
// a second open in this process contends as another process would.
TEST_CASE("the index lock waits for its holder, for a bounded time", "[recorder]") {
  TempDir d("index-lock");
  const std::string index = (d.path / "exp" / "index-t.csv").string();
  {
    const FileLock first(index, 1);
    REQUIRE(first.held());
    const auto t0 = std::chrono::steady_clock::now();
    const FileLock second(index, 0.3);
    CHECK_FALSE(second.held());
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  }
  auto holder = std::make_unique<FileLock>(index, 1);
  REQUIRE(holder->held());
  std::thread let_go([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    holder.reset();
  });
  const FileLock waited(index, 10);
  CHECK(waited.held());
  let_go.join();
  CHECK(fs::is_regular_file(d.path / "exp" / ".index-t.csv.lock"));
}

TEST_CASE("a run folder held by another process is never moved or resumed", "[recorder][cli]") {
  TempDir s("lock");
  const auto cfg = s.write("tiny.yaml", tiny_yaml(1));
  const auto res = s.path / "res";
  const auto run = res / "tiny" / "t-g1";
  fs::create_directories(run);
  put(run / "status", "running\n");
  const std::string cmd = "run " + cfg + " --results " + res.string() + " --tag t";
  {
    // This test process stands in for a dtrain that is writing the run.
    RunLock held(run.string());
    CHECK(RunLock::holder(run.string()) == ::getpid());
    CHECK(read_run_status(run.string()) == "running");
    CHECK_THROWS_AS(RunLock(run.string()), UserError);
    const auto plain = dtrain_cli(cmd);
    CHECK(plain.code == 2);
    CHECK_THAT(plain.out, Catch::Contains("run folder already exists"));
    const auto resume = dtrain_cli(cmd + " --resume");
    CHECK(resume.code == 2);
    CHECK_THAT(resume.out, Catch::Contains("another dtrain process (pid " +
                                           std::to_string(::getpid()) + ")"));
    CHECK(slurp(run / "status") == "running\n");
    CHECK(!fs::exists(res / "tiny" / ".attempts"));
  }
  // Released: the folder is an interrupted run, which --resume moves aside and runs again,
  // without the partial write its process left when it died.
  put(run / "checkpoint.bin.tmp.99999", "cut short");
  CHECK(RunLock::holder(run.string()) == 0);
  CHECK(read_run_status(run.string()) == "interrupted");
  CHECK(dtrain_cli(cmd).code == 2);
  const auto r = dtrain_cli(cmd + " --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(slurp(run / "status") == "done\n");
  CHECK(slurp(res / "tiny" / ".attempts" / "t-g1.1" / "status") == "running\n");
  CHECK(read_run_status((res / "tiny" / ".attempts" / "t-g1.1").string()) == "interrupted");
  CHECK(!fs::exists(res / "tiny" / ".attempts" / "t-g1.1" / "checkpoint.bin.tmp.99999"));
  CHECK_THAT(r.out, Catch::Contains("checkpoint.bin.tmp.99999, a write cut short"));
}

TEST_CASE("resuming refuses a finished run whose config differs", "[recorder][cli]") {
  TempDir s("resume");
  const auto cfg = s.write("tiny.yaml", tiny_yaml(1));
  const std::string cmd = "run " + cfg + " --results " + (s.path / "res").string() + " --tag t";
  REQUIRE(dtrain_cli(cmd).code == 0);
  const auto same = dtrain_cli(cmd + " --resume");
  CHECK(same.code == 0);
  CHECK_THAT(same.out, Catch::Contains("already"));
  const auto changed = dtrain_cli(cmd + " optimizer.lr=0.2 --resume");
  CHECK(changed.code == 2);
  CHECK_THAT(changed.out, Catch::Contains("finished with another config") &&
                              Catch::Contains("lr: 0.2"));
  // Nothing to compare with: refused too, rather than trusted.
  fs::remove(s.path / "res" / "tiny" / "t-g1" / "config.resolved.yaml");
  const auto unknown = dtrain_cli(cmd + " --resume");
  CHECK(unknown.code == 2);
  CHECK_THAT(unknown.out, Catch::Contains("has no config.resolved.yaml to compare with"));
}

TEST_CASE("a tag must make a visible folder name of sane length", "[cli][errors]") {
  TempDir s("tag");
  const auto cfg = s.write("tiny.yaml", tiny_yaml(1));
  const std::string run = "run " + cfg + " --results " + (s.path / "res").string();
  for (const std::string& tag : {std::string(".hidden"), std::string(101, 'x')}) {
    const auto r = dtrain_cli(run + " --tag " + tag);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("give 1 to 100 characters, not starting with '.'"));
  }
  CHECK(!fs::exists(s.path / "res" / "tiny"));
  CHECK(dtrain_cli(run + " --tag " + std::string(100, 'x')).code == 0);
}

TEST_CASE("SIGTERM ends dtrain validate at once", "[cli]") {
  TempDir s("term");
  // Generating this much synthetic data takes seconds: long enough to be interrupted.
  const auto cfg = s.write("big.yaml", R"(name: big
data:
  dataset: synthetic
  synthetic: {train_size: 4000000, test_size: 1000, shape: [64], classes: 3}
)");
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = shell("exec " + dtrain_binary() + " validate " + cfg +
                       " & pid=$!; sleep 0.3; kill -TERM $pid; wait $pid");
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(r.out);
  CHECK(r.code == 128 + SIGTERM);  // the shell's code for a child killed by SIGTERM
  CHECK(took < std::chrono::seconds(3));
}

TEST_CASE("log lines show control characters from paths and names as '?'", "[recorder]") {
  TempDir d("log-printable");
  const auto file = d.path / "log";
  {
    RunLogFile mirror(file.string());
    dtrain::log().info("run q-g1: {}", std::string("/tmp/RI\nnl/\x1b[31mx\xc2\x9b"));
  }
  const std::string text = slurp(file);
  CHECK_THAT(text, Catch::Contains("run q-g1: /tmp/RI?nl/?[31mx??\n"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}
