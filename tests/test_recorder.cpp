// Run folders: atomic replacement, no symbolic link followed, a full disk reported as a system
// failure that leaves consistent state, and the status readers trust.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>

#include "dtrain/error.hpp"
#include "dtrain/recorder.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

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
  put(d.path / "status", "running\n");
  CHECK(read_run_status(d.path.string()) == "running");
  // A crash between the two writes: the summary is final, the status file is not.
  put(d.path / "summary.json", R"({"status": "done"})");
  CHECK(read_run_status(d.path.string()) == "done");
  put(d.path / "summary.json", "{corrupt");
  CHECK(read_run_status(d.path.string()) == "running");
}

TEST_CASE("dtrain run on a full disk exits 1 and leaves the run marked failed", "[recorder][cli]") {
  TempDir s("full");
  const auto cfg = s.write("tiny.yaml", R"(name: tiny
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 256, test_size: 64, shape: [8], classes: 3}
model: {hidden: [8]}
train: {epochs: 2, per_replica_batch: 16}
)");
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
