// Multi-process runs under mpirun: equivalence with in-process replicas, a wrong process count,
// and failure handling (a rank that throws, a rank that is killed). Skipped without mpirun or
// without MPI in dtrain.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "helpers.hpp"

namespace fs = std::filesystem;

using namespace dtrain::test;

namespace {

std::string write_config(const fs::path& dir, int epochs) {
  const auto p = dir / "mp.yaml";
  std::ofstream(p) << "name: mp\nthreads: 1\ndata:\n  dataset: synthetic\n"
                      "  synthetic: {train_size: 3000, test_size: 500, shape: [24], classes: 4, "
                      "noise: 1.5}\nmodel: {hidden: [32, 16]}\n"
                      "train: {epochs: "
                   << epochs
                   << ", per_replica_batch: 8, target_accuracy: 0}\n"
                      "optimizer: {lr: 0.05, base_batch: 8, momentum: 0.9, warmup_epochs: 1, "
                      "schedule: cosine}\n";
  return p.string();
}

}  // namespace

TEST_CASE("mpirun -np 2 and -np 4 reproduce the in-process run bit for bit", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-equiv");
  const auto cfg = write_config(d.path, 3);
  const auto bin = dtrain::test::dtrain_binary();
  const auto res = (d.path / "res").string();
  for (int np : {2, 4}) {
    const std::string g = "gpus=" + std::to_string(np);
    const auto a =
        shell(mpirun(np) + bin + " run " + cfg + " " + g + " --quiet --tag mpi --results " + res);
    INFO(a.out);
    REQUIRE(a.code == 0);
    const auto b = shell(bin + " run " + cfg + " " + g + " --quiet --tag threads --results " + res);
    REQUIRE(b.code == 0);
    const fs::path mp = fs::path(res) / "mp" / ("mpi-g" + std::to_string(np));
    const fs::path th = fs::path(res) / "mp" / ("threads-g" + std::to_string(np));
    CHECK(slurp(mp / "status") == "done\n");
    const auto m = numeric_columns(mp / "metrics.csv");
    CHECK(std::count(m.begin(), m.end(), '\n') == 4);
    CHECK(m == numeric_columns(th / "metrics.csv"));
    CHECK_THAT(slurp(mp / "summary.json"), Catch::Contains("as processes (mpi)"));
    // Straggler columns: busy times of every rank, min <= max.
    CHECK_THAT(slurp(mp / "metrics.csv"),
               Catch::Contains("rank_busy_min_s,rank_busy_max_s,slowest_rank"));
    // Only rank 0 wrote: exactly one run folder per run.
    CHECK(!fs::exists(fs::path(res) / "mp" / ("mpi-g" + std::to_string(np) + ".1")));
  }
}

TEST_CASE("a process count that differs from gpus is a clear error", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-count");
  const auto cfg = write_config(d.path, 1);
  const auto r = shell(mpirun(2) + dtrain::test::dtrain_binary() + " run " + cfg +
                       " gpus=4 --results " + (d.path / "res").string());
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("gpus=4 but the launcher started 2 processes"));
  CHECK_FALSE(fs::exists(d.path / "res" / "mp"));
}

TEST_CASE("a rank that throws ends every rank quickly and the run says failed", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-throw");
  const auto cfg = write_config(d.path, 50);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r =
      shell("DTRAIN_FAULT=1:30 " + mpirun(4) + "-x DTRAIN_FAULT " + dtrain::test::dtrain_binary() +
            " run " + cfg + " gpus=4 --tag t --results " + (d.path / "res").string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(secs < 30);
  // Every surviving rank names the failed one.
  for (int rank : {0, 2, 3})
    CHECK_THAT(r.out, Catch::Contains("rank " + std::to_string(rank) +
                                      ": run t-g4 failed: rank 1 failed"));
  const fs::path run = d.path / "res" / "mp" / "t-g4";
  CHECK(slurp(run / "status") == "failed\n");
  CHECK_THAT(slurp(run / "summary.json"), Catch::Contains("rank 1 failed: injected fault"));
}

TEST_CASE("a killed rank makes the others exit within 30 seconds", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-kill");
  const auto cfg = write_config(d.path, 100000);  // would run for hours
  const fs::path log = d.path / "out.log";
  const std::string cmd = mpirun(4) + dtrain::test::dtrain_binary() + " run " + cfg +
                          " gpus=4 --tag k --results " + (d.path / "res").string() + " > " +
                          log.string() + " 2>&1";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until training is under way, then find rank 1 by its environment and kill it.
  const fs::path status = d.path / "res" / "mp" / "k-g4" / "metrics.csv";
  for (int i = 0; i < 600 && slurp(status).find("\n1,") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pid_t victim = -1;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto cmdline = slurp(e.path() / "cmdline");
    if (cmdline.find(cfg) == std::string::npos || cmdline.find("mpirun") != std::string::npos)
      continue;
    const auto env = slurp(e.path() / "environ");
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos)
      victim = std::stoi(name);
  }
  REQUIRE(victim > 0);
  const auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  int wstatus = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &wstatus, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
  }
  const auto out = slurp(log);
  INFO(out);
  CHECK(done == pid);
  CHECK(secs < 30);
  CHECK(!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
  CHECK_THAT(out, Catch::Contains("process rank 1"));
  CHECK(slurp(d.path / "res" / "mp" / "k-g4" / "status") == "failed\n");
}
