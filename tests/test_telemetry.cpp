// devices.csv: the device sampler's CPU clocks on threads with known loads, the rows' way to
// rank 0, the file a run writes, and NVML: a note where it is missing, readings on a GPU.
#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/nvml.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/results/metrics.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/train/telemetry.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// The utilisation samples of one device in `rows`.
std::vector<double> utils(const std::vector<DeviceRow>& rows, DeviceKind kind, int index) {
  std::vector<double> out;
  for (const auto& r : rows)
    if (r[DeviceCol::kind] == static_cast<double>(kind) && r[DeviceCol::index] == index)
      out.push_back(r[DeviceCol::util]);
  return out;
}

// The CPU seconds thread `t` has used so far.
double cpu_seconds_of(std::thread& t) {
  clockid_t id{};
  REQUIRE(pthread_getcpuclockid(t.native_handle(), &id) == 0);
  timespec ts{};
  REQUIRE(clock_gettime(id, &ts) == 0);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One replica's utilisation samples, each with its interval (since the sample before: every
// sample but the first has a process row, written before the replicas'); those whose interval
// is unknown are left out.
std::vector<std::pair<double, double>> timed_utils(const std::vector<DeviceRow>& rows, int index) {
  std::vector<std::pair<double, double>> out;  // interval in seconds, utilisation
  double now = -1, before = -1;                // this sample's time and the one's before
  for (const auto& r : rows) {
    const double t = r[DeviceCol::unix_time];
    if (r[DeviceCol::kind] == static_cast<double>(DeviceKind::process)) {
      before = now;
      now = t;
    } else if (r[DeviceCol::kind] == static_cast<double>(DeviceKind::replica) &&
               r[DeviceCol::index] == index && t == now && before > 0) {
      out.emplace_back(t - before, r[DeviceCol::util]);
    }
  }
  return out;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// A small MLP on synthetic data whose devices are sampled every `ms` milliseconds.
std::string mlp_config(TempDir& t, const std::string& name, int threads, int train_size,
                       const std::string& hidden, int epochs, int batch, int ms) {
  return t.write(name + ".yaml",
                 fmt::format("name: {}\nthreads: {}\ndata:\n  dataset: synthetic\n  synthetic: "
                             "{{train_size: {}, test_size: 128, shape: [64], classes: 4}}\n"
                             "model: {{hidden: {}}}\ntrain: {{epochs: {}, per_replica_batch: {}, "
                             "telemetry_ms: {}, target_accuracy: 0}}\n",
                             name, threads, train_size, hidden, epochs, batch, ms));
}

}  // namespace

TEST_CASE("a replica thread that spins reads busy, one that sleeps reads idle", "[telemetry]") {
  DeviceSampler s(0.02, 3, {});
  CHECK(s.note().empty());  // no GPUs asked for: nothing to say
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [&] { return std::chrono::steady_clock::now() - t0; };
  std::thread spin([&] {
    s.add_replica_thread(3);
    volatile double x = 0;
    while (!stop) x = x + 1;
  });
  std::thread sleep([&] {
    s.add_replica_thread(4);
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  s.set_epoch(2);
  const double epoch_set = unix_seconds();  // samples taken before may still say epoch 0
  // 400 ms, and longer on a loaded machine: until the spinner has had a tenth of a CPU second.
  while (since() < std::chrono::seconds(20) &&
         (since() < std::chrono::milliseconds(400) || cpu_seconds_of(spin) < 0.1))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The share of a core the spinner had: all of one, or less beside other load.
  const double share = 100 * cpu_seconds_of(spin) / std::chrono::duration<double>(since()).count();
  stop = true;
  spin.join();
  sleep.join();
  const std::vector<DeviceRow> rows = s.take();
  REQUIRE(!rows.empty());
  // Drained: the sampler runs on, so a second take holds at most the few rows sampled since,
  // none of them older than the first take's newest.
  const std::vector<DeviceRow> again = s.take();
  CHECK(again.size() < rows.size() / 4);
  for (const auto& r : again) CHECK(r[DeviceCol::unix_time] >= rows.back()[DeviceCol::unix_time]);
  const auto busy = utils(rows, DeviceKind::replica, 3), idle = utils(rows, DeviceKind::replica, 4);
  REQUIRE(busy.size() >= 5);
  REQUIRE(idle.size() >= 5);
  // A core of its own, or a share of one beside the other tests' load: at least half the
  // spinner's share (25 where it had half a core or more). Over time, not the median: on a
  // loaded machine a thread runs in bursts, and most samples can fall between them.
  INFO("the spinner had " << share << "% of a core");
  REQUIRE(share > 5);  // below, too loaded a machine to tell busy from idle
  double cpu = 0, wall = 0;
  for (const auto& [dt, util] : timed_utils(rows, 3)) {
    cpu += dt * util;
    wall += dt;
  }
  REQUIRE(wall > 0);
  CHECK(cpu / wall > std::min(25.0, share / 2));
  CHECK(median(busy) < 110);
  // Idle in every sample over half a period or more (one the sampler takes at once after
  // falling behind covers microseconds, and its share is noise).
  std::vector<double> idle_timed;
  for (const auto& [dt, util] : timed_utils(rows, 4))
    if (dt >= 0.01) idle_timed.push_back(util);
  REQUIRE(idle_timed.size() >= 5);
  CHECK(*std::max_element(idle_timed.begin(), idle_timed.end()) < 10);
  CHECK(median(utils(rows, DeviceKind::process, 0)) > 0);
  for (const auto& r : rows) {
    if (r[DeviceCol::unix_time] > epoch_set)
      CHECK(r[DeviceCol::epoch] == 2);
    else
      CHECK((r[DeviceCol::epoch] == 0 || r[DeviceCol::epoch] == 2));
    CHECK(r[DeviceCol::rank] == (r[DeviceCol::kind] == 1 ? r[DeviceCol::index] : 3));
    CHECK(std::isnan(r[DeviceCol::mem_used_mib]));
    CHECK(std::abs(r[DeviceCol::unix_time] - static_cast<double>(std::time(nullptr))) < 60);
  }
}

TEST_CASE("device rows of every rank reach rank 0 in rank order, padded rows left out",
          "[telemetry]") {
  const int n = 3;
  InProcessGroup group(n);
  std::vector<std::vector<DeviceRow>> got(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      auto comm = group.communicator(r);
      std::vector<DeviceRow> mine;
      for (int i = 0; i < (r == 0 ? 2 : r == 1 ? 0 : 3); ++i) {
        DeviceRow row;
        row.fill(std::nan(""));
        row[DeviceCol::rank] = r;
        row[DeviceCol::index] = i;
        row[DeviceCol::util] = 10.0 * r + i;
        mine.push_back(row);
      }
      got[static_cast<size_t>(r)] = gather_device_rows(*comm, mine);
    });
  for (auto& t : ts) t.join();
  CHECK(got[1].empty());
  CHECK(got[2].empty());
  REQUIRE(got[0].size() == 5);
  const double want[] = {0, 1, 20, 21, 22};
  for (size_t i = 0; i < 5; ++i) {
    CHECK(got[0][i][DeviceCol::util] == want[i]);
    CHECK(std::isnan(got[0][i][DeviceCol::power_w]));  // NaN travels as NaN
  }
}

TEST_CASE("devices.csv rows: a device's name, and an empty cell for no value", "[telemetry]") {
  DeviceRow r;
  r.fill(std::nan(""));
  r[DeviceCol::unix_time] = 1.5;
  r[DeviceCol::epoch] = 4;
  r[DeviceCol::rank] = 1;
  r[DeviceCol::kind] = static_cast<double>(DeviceKind::gpu);
  r[DeviceCol::index] = 7;
  r[DeviceCol::util] = 93;
  r[DeviceCol::mem_used_mib] = 40960;
  CHECK(devices_csv_row(r) == "1.500000,4,1,gpu7,93,,40960,,,,,,,,,\n");
  r[DeviceCol::kind] = static_cast<double>(DeviceKind::process);
  CHECK_THAT(devices_csv_row(r), Catch::StartsWith("1.500000,4,1,process,93,"));
  const auto columns = [](const std::string& line) {
    return std::count(line.begin(), line.end(), ',') + 1;
  };
  CHECK(columns(devices_csv_header()) == columns(devices_csv_row(r)));
}

TEST_CASE("a run writes devices.csv: each replica's thread and the process, every epoch",
          "[telemetry][cli]") {
  TempDir t("telemetry-run");
  const std::string cfg = mlp_config(t, "dev", 2, 4096, "[256, 256]", 2, 32, 20);
  const std::string res = (t.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 --quiet --tag a --results " + res).code == 0);
  const auto lines = lines_of(t.path / "res" / "dev" / "a-g2" / "devices.csv");
  REQUIRE(lines.size() > 3);
  CHECK(lines[0] + "\n" == devices_csv_header());
  std::set<std::string> devices, epochs;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> cells;
    std::stringstream ss(lines[i]);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    REQUIRE(cells.size() >= 5);
    epochs.insert(cells[1]);
    devices.insert(cells[3]);
    const double util = std::stod(cells[4]);
    CHECK(util >= 0);
    CHECK(util <= 150);  // a clock read a little late can pass 100
  }
  CHECK(devices == std::set<std::string>{"process", "replica0", "replica1"});
  CHECK(epochs == std::set<std::string>{"0", "1"});
  // Off: no file, and the same run otherwise (the sampler changes no result).
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 train.telemetry_ms=0 --quiet --tag b --results " + res)
              .code == 0);
  CHECK_FALSE(fs::exists(t.path / "res" / "dev" / "b-g2" / "devices.csv"));
  // A run shorter than one sampling period (a share needs two samples): the header alone.
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 train.telemetry_ms=600000 --quiet --tag c " +
                     "--results " + res)
              .code == 0);
  const std::string header_only = slurp(t.path / "res" / "dev" / "c-g2" / "devices.csv");
  CHECK(header_only.rfind("unix_time_s,epoch,rank,device,", 0) == 0);
  CHECK(std::count(header_only.begin(), header_only.end(), '\n') == 1);
  const auto summary = [&](const char* run) {
    return nlohmann::json::parse(slurp(t.path / "res" / "dev" / run / "summary.json"));
  };
  CHECK(summary("a-g2")["final_train_loss"] == summary("b-g2")["final_train_loss"]);
  CHECK(summary("a-g2")["final_test_loss"] == summary("b-g2")["final_test_loss"]);
}

TEST_CASE("a resumed run keeps the device rows of its first attempt and adds its own",
          "[telemetry][cli]") {
  TempDir t("telemetry-resume");
  const std::string cfg = mlp_config(t, "dres", 1, 2048, "[512, 512]", 3, 16, 10);
  const std::string run =
      dtrain_binary() + " run " + cfg + " --quiet --tag r --results " + (t.path / "res").string();
  // 128 steps an epoch: the run fails at step 200 and continues from its checkpoint at 128
  // (taken when epoch 1's steps were done, before its scoring).
  REQUIRE(shell("DTRAIN_FAULT=0:200 " + run + " 2>&1").code != 0);
  const fs::path csv = t.path / "res" / "dres" / "r-g1" / "devices.csv";
  REQUIRE(fs::exists(csv));
  const auto before = lines_of(csv);
  const auto again = shell(run + " --resume 2>&1");
  INFO(again.out);
  REQUIRE(again.code == 0);
  const auto after = lines_of(csv);
  REQUIRE(after.size() > before.size());
  CHECK(std::equal(before.begin(), before.end(), after.begin()));
  CHECK(std::count(after.begin(), after.end(), after[0]) == 1);  // one header
  CHECK_THAT(after.back(), Catch::Contains(",2,0,"));            // epoch 2, rank 0
  // The second attempt starts with the scoring of epoch 1 (index 0), whose steps its checkpoint
  // holds, then trains epochs 2 and 3: rows of both (indices 1 and 2) are its own.
  const auto second =
      std::vector<std::string>(after.begin() + static_cast<long>(before.size()), after.end());
  const auto has = [&](const char* epoch_rank) {
    return std::any_of(second.begin(), second.end(), [&](const std::string& l) {
      return l.find(epoch_rank) != std::string::npos;
    });
  };
  CHECK(has(",1,0,"));
  CHECK(has(",2,0,"));
}

TEST_CASE("take() thins each device to as many rows as asked, evenly spaced in time",
          "[telemetry]") {
  DeviceSampler s(0.005, 0, {});
  std::thread t([&] {
    s.add_replica_thread(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  t.join();
  double period = 0;
  const auto rows = s.take(5, &period);
  CHECK(period == 0.005);  // far below a million rows: the period as asked
  const auto times = [&](DeviceKind k) {
    std::vector<double> out;
    for (const auto& r : rows)
      if (r[DeviceCol::kind] == static_cast<double>(k)) out.push_back(r[DeviceCol::unix_time]);
    return out;
  };
  for (const auto k : {DeviceKind::process, DeviceKind::replica}) {
    const auto ts = times(k);
    CHECK(ts.size() == 5);
    CHECK(std::is_sorted(ts.begin(), ts.end()));
    // Spread over the samples, not the first five: the thread lived about 0.3 s.
    CHECK(ts.back() - ts.front() > 0.15);
  }
}

TEST_CASE("under mpirun every rank's devices reach rank 0's devices.csv", "[telemetry][mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir t("telemetry-mpi");
  const std::string cfg = mlp_config(t, "dmpi", 1, 4096, "[512, 512]", 2, 16, 10);
  // Epochs of a few tenths of a second: every device has samples in each.
  const auto r = shell(mpirun(2) + dtrain_binary() + " run " + cfg + " gpus=2 --quiet --tag m " +
                       "--results " + (t.path / "res").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto lines = lines_of(t.path / "res" / "dmpi" / "m-g2" / "devices.csv");
  std::set<std::string> seen;  // rank and device
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> cells;
    std::stringstream ss(lines[i]);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    REQUIRE(cells.size() >= 4);
    seen.insert(cells[2] + " " + cells[3]);
  }
  CHECK(seen == std::set<std::string>{"0 process", "0 replica0", "1 process", "1 replica1"});
}

TEST_CASE("NVML: a machine without it gets a reason, one with a GPU gets its readings",
          "[telemetry][cuda]") {
  std::string why;
  const auto nvml = Nvml::open(&why);
  const GpuSystem sys = query_gpus();
  if (sys.gpus.empty()) {
    if (gpu_required()) FAIL("DTRAIN_REQUIRE_GPU=1 but no GPU: " << sys.none_reason);
    if (!nvml) CHECK_THAT(why, Catch::Contains("NVML"));
    WARN("SKIPPED (no GPU): " << sys.none_reason);
    return;
  }
  REQUIRE(nvml);
  const GpuInfo& g = sys.gpus[0];
  void* h = nvml->device(g.pci_bus_id);
  REQUIRE(h);
  const GpuReading r = nvml->read(h);
  INFO(g.name << " at " << g.pci_bus_id);
  CHECK(r.util_pct >= 0);
  CHECK(r.util_pct <= 100);
  // NVML's total and CUDA's agree within what the driver reserves.
  CHECK(std::abs(r.mem_total_bytes - static_cast<double>(g.memory_bytes)) <
        0.05 * r.mem_total_bytes);
  CHECK(r.mem_used_bytes > 0);
  // Each value in its own range: a reading shifted into its neighbour's column fails here.
  CHECK(r.power_w > 1);
  CHECK(r.power_w < 2000);
  CHECK(r.sm_clock_mhz > 100);
  CHECK(r.sm_clock_mhz < 3500);
  CHECK(r.mem_clock_mhz > 100);
  CHECK(r.mem_clock_mhz < 20000);
  CHECK(r.temp_c > 5);
  CHECK(r.temp_c < 110);
  CHECK(r.pcie_tx_Bps >= 0);
  CHECK(r.pcie_tx_Bps < 1e11);  // 100 GB/s: past PCIe 6 x16
  DeviceSampler s(0.02, 0, {g.index});
  CHECK(s.note().empty());
  // Five rows within 10 s: each sample reads NVML for milliseconds, so a fixed wait of a few
  // periods leaves a thin margin on a loaded machine.
  std::vector<double> gpu;
  const auto t0 = std::chrono::steady_clock::now();
  while (gpu.size() < 5 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto more = utils(s.take(), DeviceKind::gpu, g.index);
    gpu.insert(gpu.end(), more.begin(), more.end());
  }
  CHECK(gpu.size() >= 5);
}

TEST_CASE("/proc/stat's busy time of the allowed CPUs, and the cores other work kept busy",
          "[telemetry]") {
  // Ticks: user nice system idle iowait irq softirq steal (guest, guest_nice).
  const std::string stat =
      "cpu  900 0 300 5000 50 0 10 0 0 0\n"
      "cpu0 400 0 100 2500 20 0 5 0 0 0\n"
      "cpu1 500 0 200 2500 30 0 5 10 0 0\n"
      "intr 12345 0 0\nctxt 999\n";
  CHECK(cpu_busy_seconds(stat, {0}, 100) == Approx(5.05));  // idle and iowait left out
  CHECK(cpu_busy_seconds(stat, {1}, 100) == Approx(7.15));  // steal counted: another's work
  CHECK(cpu_busy_seconds(stat, {0, 1}, 100) == Approx(12.2));
  CHECK(std::isnan(cpu_busy_seconds(stat, {5}, 100)));
  CHECK(std::isnan(cpu_busy_seconds("garbage", {0}, 100)));
  // The total's line is no CPU's, whatever its first number.
  CHECK(cpu_busy_seconds("cpu  1 0 0 0 0 0 0 0\ncpu1 100 0 0 0 0 0 0 0\n", {1}, 100) ==
        Approx(1.0));
  CpuClocks a, b;
  a.busy_s = 10;
  a.wall_s = 100;
  b.busy_s = 13;
  b.wall_s = 102;
  CHECK(other_cores(a, b, 1.0) == Approx(1.0));  // 3 busy seconds, 1 of them ours, over 2 s
  CHECK(other_cores(a, b, 5.0) == 0);            // ticks behind our clock: none, not negative
  b.wall_s = 100.1;
  CHECK(std::isnan(other_cores(a, b, 0)));  // too short for 10 ms ticks
  b.wall_s = 102;
  b.busy_s = std::nan("");
  CHECK(std::isnan(other_cores(a, b, 0)));
  const CpuClocks now = read_cpu_clocks();
  CHECK(now.cores >= 1);
  CHECK(std::isfinite(now.busy_s));  // Linux
}

TEST_CASE("a run that shares its cores with other work says so", "[telemetry][cli]") {
  TempDir t("telemetry-others");
  // Epochs of about a second on one thread, on one CPU where a thread of this process spins:
  // the spinner and the run inherit this thread's CPU set, the first CPU alone, so that a test
  // running beside this one keeps the others.
  const std::string cfg = mlp_config(t, "oth", 1, 32768, "[512, 512]", 2, 64, 100);
  cpu_set_t before, one;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const auto r = dtrain_cli("run " + cfg + " --tag o --results " + (t.path / "res").string());
  stop = true;
  spinner.join();
  REQUIRE(sched_setaffinity(0, sizeof before, &before) == 0);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("other work kept") && Catch::Contains("cores busy"));
  // The comparison table says it under the table.
  CHECK_THAT(r.out, Catch::Contains("Other work kept cores of this machine busy during: o-g1 ("));
  for (const EpochMetrics& m :
       read_epochs(read_metrics_csv((t.path / "res" / "oth" / "o-g1").string())))
    CHECK(m.other_cores >= kOtherCoresWarn);
}

TEST_CASE("a run whose output is no terminal writes a progress line during a long epoch", "[cli]") {
  TempDir t("progress-lines");
  const std::string cfg = mlp_config(t, "prog", 1, 8192, "[256, 256]", 1, 64, 100);
  // Every 10 ms here (30 s by default): the 128 steps take longer than that.
  const auto r = test::shell("DTRAIN_PROGRESS_S=0.01 " + dtrain_binary() + " run " + cfg +
                             " --tag p --results " + (t.path / "res").string() + " 2>&1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(std::regex_search(r.out,
                          std::regex(R"(epoch 1/1: step \d+/128 \(\d+%\), about [0-9.]+s to go)")));
  // Without the facility the interval is 30 s: none in so short a run.
  const auto quiet = dtrain_cli("run " + cfg + " --tag q --results " + (t.path / "res").string());
  REQUIRE(quiet.code == 0);
  CHECK_THAT(quiet.out, !Catch::Contains("to go"));
}
