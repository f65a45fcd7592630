// Multi-process runs under mpirun: equivalence with in-process replicas, a wrong process count,
// and failure handling (a rank that throws, a rank that is killed). Skipped without mpirun or
// without MPI in dtrain.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "dtrain/comm/mpi.hpp"
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

// Starts `cmd` under sh in the background; its pid.
pid_t start_shell(const std::string& cmd) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The pid of the launched rank `rank` whose command line holds `marker` (not mpirun's), or -1.
pid_t rank_process(const std::string& marker, int rank) {
  const std::string env = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0';
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto cmdline = slurp(e.path() / "cmdline");
    if (cmdline.find(marker) == std::string::npos || cmdline.find("mpirun") != std::string::npos)
      continue;
    if (slurp(e.path() / "environ").find(env) != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// Waits up to a minute for `pid` to end (killed after that); the seconds since `t0` and its
// wait status. `done` says whether it ended by itself.
struct Ended {
  bool done = false;
  double secs = 0;
  int wstatus = 0;
};
Ended wait_for_end(pid_t pid, std::chrono::steady_clock::time_point t0) {
  Ended e;
  pid_t got = 0;
  while ((got = waitpid(pid, &e.wstatus, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  e.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.done = got == pid;
  if (!e.done) {
    kill(pid, SIGKILL);
    waitpid(pid, &e.wstatus, 0);
  }
  return e;
}

}  // namespace

TEST_CASE("mpirun -np 2 and -np 4 reproduce the in-process runs bit for bit", "[mpi]") {
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
    // In-process replicas with their own weights, and sharing one copy.
    for (const std::string mode : {"threads", "shared"}) {
      const auto b = shell(bin + " run " + cfg + " " + g + " replicas=" + mode + " --quiet --tag " +
                           mode + " --results " + res);
      REQUIRE(b.code == 0);
    }
    const fs::path mp = fs::path(res) / "mp" / ("mpi-g" + std::to_string(np));
    CHECK(slurp(mp / "status") == "done\n");
    const auto m = numeric_columns(mp / "metrics.csv");
    CHECK(std::count(m.begin(), m.end(), '\n') == 4);
    for (const std::string mode : {"threads", "shared"}) {
      INFO(mode);
      const fs::path in = fs::path(res) / "mp" / (mode + "-g" + std::to_string(np));
      CHECK(m == numeric_columns(in / "metrics.csv"));
      CHECK_THAT(slurp(in / "summary.json"),
                 Catch::Contains("\"replica_mode\": \"" + mode + "\""));
    }
    CHECK_THAT(slurp(mp / "summary.json"), Catch::Contains("\"replica_mode\": \"processes\""));
    CHECK_THAT(slurp(mp / "summary.json"), Catch::Contains("as processes (mpi)"));
    // Straggler columns: busy times of every rank, min <= max.
    CHECK_THAT(slurp(mp / "metrics.csv"),
               Catch::Contains("rank_busy_min_s,rank_busy_max_s,slowest_rank"));
    // Only rank 0 wrote: exactly one run folder per run.
    CHECK(!fs::exists(fs::path(res) / "mp" / ("mpi-g" + std::to_string(np) + ".1")));
  }
}

TEST_CASE("mpirun reproduces replicas sharing weights with BatchNorm, dropout and augmentation",
          "[mpi][shared]") {
  // What has state beyond the weights, every way the replicas can run: 3 processes, 3 threads
  // with their own weights, and shared weights on 1 and 2 worker threads (fibers) and on 3.
  // Synchronised BatchNorm, dropout, flips and crops, `sum`, 2 accumulation steps, a short
  // last batch.
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-stateful");
  const auto cfg = d.path / "st.yaml";
  std::ofstream(cfg) << R"(name: st
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 221, test_size: 90, shape: [2, 6, 6], classes: 3, noise: 1.5}
  drop_remainder: false
  augment: {flip: true, crop_padding: 1}
model:
  type: layers
  batchnorm: sync
  layers:
    - {conv: {channels: 4, kernel: 3, padding: 1}}
    - batchnorm
    - relu
    - flatten
    - {dropout: {p: 0.3}}
    - {dense: {units: 16}}
    - relu
train: {epochs: 3, per_replica_batch: 6, accumulation_steps: 2, reduction: sum,
        target_accuracy: 0}
optimizer: {lr: 0.01, base_batch: 36, momentum: 0.9}
)";
  const auto bin = dtrain::test::dtrain_binary();
  const auto res = (d.path / "res").string();
  const auto a = shell(mpirun(3) + bin + " run " + cfg.string() +
                       " gpus=3 --quiet --tag mpi --results " + res);
  INFO(a.out);
  REQUIRE(a.code == 0);
  const auto m = numeric_columns(fs::path(res) / "st" / "mpi-g3" / "metrics.csv");
  REQUIRE(std::count(m.begin(), m.end(), '\n') == 4);
  int k = 0;
  for (const std::string how :
       {"replicas=threads threads=3", "replicas=shared threads=1", "replicas=shared threads=2",
        "replicas=shared threads=3"}) {
    const std::string tag = "in" + std::to_string(k++);
    const auto b =
        shell(bin + " run " + cfg.string() + " gpus=3 " + how + " --quiet --tag " + tag +
              " --results " + res);
    INFO(how << ": " << b.out);
    REQUIRE(b.code == 0);
    CHECK(m == numeric_columns(fs::path(res) / "st" / (tag + "-g3") / "metrics.csv"));
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
  // Shared weights need every replica in one process.
  const auto s = shell(mpirun(2) + dtrain::test::dtrain_binary() + " run " + cfg +
                       " gpus=2 replicas=shared --results " + (d.path / "res").string());
  CHECK(s.code != 0);
  CHECK_THAT(s.out, Catch::Contains("dtrain: error: " + cfg +
                                    ": replicas: shared keeps every replica in one "
                                    "process, but this run was started by a launcher"));
  CHECK_FALSE(fs::exists(d.path / "res" / "mp"));
  // Commands that run once are refused under a launcher, in one line (rank 0's).
  const auto v = shell(mpirun(2) + dtrain::test::dtrain_binary() + " validate " + cfg);
  CHECK(v.code != 0);
  const std::string once = "dtrain: error: validate runs once, not one per process";
  CHECK(v.out.find(once) != std::string::npos);
  CHECK(v.out.find(once) == v.out.rfind(once));
}

// The default tag is the second the run starts; where 999 tags of that second are taken, rank 0
// refuses, and every rank ends with it instead of waiting for the tag.
TEST_CASE("under mpirun, a second with every default tag taken is refused on every rank", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-tags");
  const auto cfg = write_config(d.path, 1);
  const fs::path experiment = d.path / "res" / "mp";
  fs::create_directories(experiment);
  // Every tag of the next 40 seconds taken by an index file.
  const std::time_t now = std::time(nullptr);
  for (std::time_t t = now; t < now + 40; ++t) {
    std::tm tm{};
    gmtime_r(&t, &tm);
    char second[32];
    std::strftime(second, sizeof second, "%Y%m%d-%H%M%S", &tm);
    std::ofstream(experiment / ("index-" + std::string(second) + ".csv")).put('\n');
    for (int n = 2; n < 1000; ++n)
      std::ofstream(experiment /
                    ("index-" + std::string(second) + "-" + std::to_string(n) + ".csv"))
          .put('\n');
  }
  // With the net after a lone failure set past the timeout, only the refusal itself ends rank 1.
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      shell("DTRAIN_FINALIZE_GRACE_S=600 timeout 60 " + mpirun(2) + dtrain::test::dtrain_binary() +
            " run " + cfg + " gpus=2 --results " + (d.path / "res").string());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(secs < 50);
  CHECK_THAT(r.out, Catch::Contains("999 tags of this second are taken; give --tag"));
}

// The net under the refusals: a rank that ends by a path that tells no peer (DTRAIN_FAULT=exit:R)
// ends the job after DTRAIN_FINALIZE_GRACE_S instead of leaving the others waiting for it.
TEST_CASE("under mpirun, a rank that ends alone ends the job after the grace", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-grace");
  const auto cfg = write_config(d.path, 1);
  const auto start = std::chrono::steady_clock::now();
  const auto r = shell("DTRAIN_FAULT=exit:1 DTRAIN_FINALIZE_GRACE_S=1 timeout 100 " + mpirun(2) +
                       dtrain::test::dtrain_binary() + " run " + cfg + " gpus=2 --results " +
                       (d.path / "res").string());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // not the timeout's
  // 1.5 s on an idle machine; mpirun alone takes about 10 s among a loaded CI's parallel
  // tests, so the bound tells an end from a hang, not the 1 s grace from the 10 s default.
  CHECK(secs < 60);
}

// A rank that hangs before training (stuck on a file system, stopped) held the others in a
// blocking broadcast for ever: the steps before training wait train.collective_timeout_s too.
TEST_CASE("under mpirun, a rank that hangs before training ends the job after the timeout",
          "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-stall");
  const auto cfg = write_config(d.path, 1);
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      shell("DTRAIN_FAULT=stall:1 DTRAIN_FINALIZE_GRACE_S=30 timeout 100 " + mpirun(2) +
            dtrain::test::dtrain_binary() + " run " + cfg +
            " gpus=2 train.collective_timeout_s=2 --results " + (d.path / "res").string());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // not the timeout's
  CHECK_THAT(r.out, Catch::Contains("dtrain: error: rank 0") &&
                        Catch::Contains("for the other ranks in the") &&
                        Catch::Contains("train.collective_timeout_s"));
  // The job ends once rank 0 has recorded the failure, not after the finalize grace (30 s
  // here) that a rank failing alone gives the others: a silent rank will not come.
  CHECK(secs < 25);
}

TEST_CASE("ranks under mpirun given other configs are refused together at once", "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-config");
  const auto cfg = write_config(d.path, 1);
  const std::string bin = dtrain::test::dtrain_binary();
  // A CIFAR-10 folder in the binary format (20 records a file) that one node lacks.
  const fs::path cifar = d.path / "cifar";
  fs::create_directories(cifar);
  for (const std::string f : {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                              "data_batch_5", "test_batch"}) {
    std::string bytes;
    for (int i = 0; i < 20; ++i) bytes += static_cast<char>(i % 10) + std::string(3072, 'x');
    put(cifar / (f + ".bin"), bytes);
  }
  // The same files with other pixels: a node whose copy differs.
  const fs::path other_copy = d.path / "cifar-other";
  fs::create_directories(other_copy);
  for (const auto& f : fs::directory_iterator(cifar)) {
    std::string bytes = slurp(f.path());
    bytes[1] = 'y';
    put(other_copy / f.path().filename(), bytes);
  }
  const std::string base = " run " + cfg + " --results " + (d.path / "res").string();
  const std::string rank0 = base + " gpus=2 --tag t";
  const std::string files = " data.dataset=cifar10 data.path=";
  const std::string host = shell("hostname").out.substr(0, shell("hostname").out.find('\n'));
  // One node's command (an MPMD launch: one rank each) differs from rank 0's: another learning
  // rate (no collective would notice: each rank would train its own recipe), another replica
  // count or tag, a data folder that node lacks, a command line that does not parse. Rank 1
  // fails alone in planning; rank 0 must not wait for it at a collective.
  const std::string other =
      "its config, overrides, --tag or --resume plan other runs than rank 0's";
  const std::vector<std::array<std::string, 3>> cases = {
      {rank0, rank0 + " optimizer.lr=0.5", other},
      {rank0, base + " gpus=3 --tag t", other},
      {rank0, base + " gpus=2 --tag u", other},
      {rank0 + files + cifar.string(), rank0 + files + (d.path / "none").string(),
       cfg + ": data.path: '"},
      {rank0 + files + cifar.string(), rank0 + files + other_copy.string(),
       "data: this rank loaded other data than rank 0 (fingerprint "},
      {rank0, rank0 + " nosuch=1", "override 'nosuch=1': unknown key 'nosuch'"},
      {rank0, " run " + (d.path / "none.yaml").string(),
       "its command line ended before the command"}};
  for (const auto& [first, second, why] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = shell(mpirun(1) + bin + first + " : -np 1 " + bin + second);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(second << "\n" << r.out);
    CHECK(r.code == 2);
    // Agreed: every rank exits 2 by itself, none is ended by the lone rank's timer (MPI_Abort),
    // and the job ends in seconds, not at the 300 s collective timeout. (Launches on a loaded
    // 2-core machine took up to 12 s.)
    CHECK(r.out.find("MPI_ABORT") == std::string::npos);
    CHECK(secs < 60);
    CHECK_THAT(r.out, Catch::Contains("dtrain: error: rank 1 (" + host + "): " + why));
    CHECK_FALSE(fs::exists(d.path / "res" / "mp" / "t-g2"));
  }
  // Another command on one rank: refused on every rank, naming both.
  const auto v = shell(mpirun(1) + bin + rank0 + " : -np 1 " + bin + " bench-comm --iters 1");
  INFO(v.out);
  CHECK(v.code == 2);
  CHECK_THAT(v.out, Catch::Contains("dtrain: error: rank 1 (" + host +
                                    "): its command is bench-comm, rank 0's run"));
  // The same folder on both: the run trains (the check above is not a refusal of every run).
  const auto ok = shell(mpirun(1) + bin + rank0 + files + cifar.string() + " : -np 1 " + bin +
                        rank0 + files + cifar.string());
  INFO(ok.out);
  CHECK(ok.code == 0);
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
  // Every surviving rank names the failed one, and its host.
  const std::string host = shell("hostname").out.substr(0, shell("hostname").out.find('\n'));
  for (int rank : {0, 2, 3})
    CHECK_THAT(r.out, Catch::Contains("rank " + std::to_string(rank) + ": run t-g4 failed: rank 1 (" +
                                      host + ") failed"));
  const fs::path run = d.path / "res" / "mp" / "t-g4";
  CHECK(slurp(run / "status") == "failed\n");
  CHECK_THAT(slurp(run / "summary.json"), Catch::Contains(") failed: injected fault"));
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
  const pid_t pid = start_shell(cmd);
  REQUIRE(pid >= 0);
  // Wait until training is under way, then find rank 1 by its environment and kill it.
  const fs::path status = d.path / "res" / "mp" / "k-g4" / "metrics.csv";
  for (int i = 0; i < 600 && slurp(status).find("\n1,") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const pid_t victim = rank_process(cfg, 1);
  REQUIRE(victim > 0);
  const auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  const Ended end = wait_for_end(pid, t0);
  const int wstatus = end.wstatus;
  const auto out = slurp(log);
  INFO(out);
  CHECK(end.done);
  CHECK(end.secs < 30);
  CHECK(!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
  CHECK_THAT(out, Catch::Contains("process rank 1"));
  CHECK(slurp(d.path / "res" / "mp" / "k-g4" / "status") == "failed\n");
}

TEST_CASE("bench-comm under mpirun: a rank that stops answering ends the job at --timeout",
          "[mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("mpi-bench-stall");
  const std::string out = (d.path / "bc").string();
  const fs::path log = d.path / "out.log";
  // Enough all-reduces for minutes; rank 1 stopped (SIGSTOP) a second in.
  const std::string cmd = mpirun(2) + dtrain::test::dtrain_binary() +
                          " bench-comm --sizes 4K:1M --iters 1000000 --timeout 3 --out " + out +
                          " > " + log.string() + " 2>&1";
  const pid_t pid = start_shell(cmd);
  REQUIRE(pid >= 0);
  pid_t victim = -1;
  for (int i = 0; i < 200 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    victim = rank_process(out, 1);
  }
  REQUIRE(victim > 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill(victim, SIGSTOP);
  const Ended end = wait_for_end(pid, std::chrono::steady_clock::now());
  // Stopped, it could outlive the job; where it is gone, its pid may be another's by now.
  if (slurp(fs::path("/proc") / std::to_string(victim) / "cmdline").find(out) != std::string::npos)
    kill(victim, SIGKILL);
  const int wstatus = end.wstatus;
  const auto said = slurp(log);
  INFO(said);
  CHECK(end.done);
  CHECK(end.secs < 25);  // the timeout, then the launcher's teardown; 300 s without --timeout
  CHECK(!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
  CHECK_THAT(said, Catch::Contains("rank 1") && Catch::Contains("bench-comm --timeout"));
  CHECK_FALSE(fs::exists(out + ".json"));
}

// What the launchers set, as a real srun (Slurm 22.05 with PMIx) and mpirun set it; the
// multi-node tests (scripts/testbed/test-multinode.sh) check the same under the real daemons.
TEST_CASE("Slurm task lists give the tasks on each node", "[mpi][launch]") {
  using dtrain::mpi::slurm_tasks_on_node;
  CHECK(slurm_tasks_on_node("2,1", 0) == 2);
  CHECK(slurm_tasks_on_node("2,1", 1) == 1);
  CHECK(slurm_tasks_on_node("2,1", 2) == 0);
  CHECK(slurm_tasks_on_node("4(x3),2", 0) == 4);
  CHECK(slurm_tasks_on_node("4(x3),2", 2) == 4);
  CHECK(slurm_tasks_on_node("4(x3),2", 3) == 2);
  CHECK(slurm_tasks_on_node("8", 0) == 8);
  CHECK(slurm_tasks_on_node("", 0) == 0);
  CHECK(slurm_tasks_on_node("x", 0) == 0);
  CHECK(slurm_tasks_on_node("2(x", 0) == 0);
  CHECK(slurm_tasks_on_node("2(x0)", 0) == 0);
}


TEST_CASE("srun under PMIx is recognised as Slurm with its task layout", "[mpi][launch]") {
  // Rank 2 of `srun -N 2 -n 3`: srun sets PMIX_RANK but no PMI_SIZE.
  const EnvScope env({{"SLURM_PROCID", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "3"},
                      {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
                      {"SLURM_STEP_TASKS_PER_NODE", "2,1"}, {"SLURM_TASKS_PER_NODE", "2,1"},
                      {"PMIX_RANK", "2"}});
  const auto l = dtrain::mpi::detect();
  CHECK(l.active);
  CHECK(l.launcher == "srun (Slurm)");
  CHECK(l.size == 3);
  CHECK(l.rank == 2);
  CHECK(l.local_rank == 0);
  CHECK(l.local_size == 1);
}

TEST_CASE("mpirun inside a Slurm allocation is recognised as mpirun", "[mpi][launch]") {
  // Open MPI's daemons are started by srun, so its ranks inherit a step's SLURM_* variables.
  const EnvScope env({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "1"}, {"SLURM_NTASKS", "2"},
                      {"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                      {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  const auto l = dtrain::mpi::detect();
  CHECK(l.launcher == "mpirun (Open MPI)");
  CHECK(l.size == 8);
  CHECK(l.rank == 5);
  CHECK(l.local_rank == 1);
  CHECK(l.local_size == 4);
}

TEST_CASE("an mpiexec of its own inside a Slurm allocation is recognised by PMI", "[mpi][launch]") {
  // MPICH's or Intel MPI's mpiexec starts its proxies with srun, one per node: rank 5 runs under
  // the proxy that is Slurm's task 1, so the SLURM_* variables describe the proxy.
  const EnvScope env({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"},
                      {"SLURM_LOCALID", "0"}, {"PMI_SIZE", "8"}, {"PMI_RANK", "5"}});
  const auto l = dtrain::mpi::detect();
  CHECK(l.launcher == "PMI");
  CHECK(l.size == 8);
  CHECK(l.rank == 5);
}

TEST_CASE("a batch script without a step is not a launch", "[mpi][launch]") {
  const EnvScope env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
  CHECK_FALSE(dtrain::mpi::detect().active);
}
