#include "dtrain/train/telemetry.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/nvml.hpp"
#include "dtrain/train/rank_gather.hpp"

namespace dtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// A CPU clock in seconds; NaN where it cannot be read (its thread has ended).
double cpu_seconds(clockid_t id) {
  timespec ts{};
  if (clock_gettime(id, &ts) != 0) return kNaN;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The CPUs this process may run on.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

int usable_cores() {
  return std::max(1, static_cast<int>(allowed_cpus().size()));
}

DeviceRow blank_row(double now, int epoch, int rank, DeviceKind kind, int index) {
  DeviceRow r;
  r.fill(kNaN);
  r[DeviceCol::unix_time] = now;
  r[DeviceCol::epoch] = epoch;
  r[DeviceCol::rank] = rank;
  r[DeviceCol::kind] = static_cast<double>(kind);
  r[DeviceCol::index] = index;
  return r;
}

// The PCI bus ids of the GPUs, by CUDA index ("" where the driver gave none).
std::vector<std::string> pci_bus_ids() {
  std::vector<std::string> ids;
  for (const GpuInfo& g : query_gpus().gpus) {
    if (static_cast<size_t>(g.index) >= ids.size()) ids.resize(static_cast<size_t>(g.index) + 1);
    ids[static_cast<size_t>(g.index)] = g.pci_bus_id;
  }
  return ids;
}

}  // namespace

double cpu_busy_seconds(const std::string& proc_stat, const std::vector<int>& allowed,
                        double ticks_per_s) {
  // Lines "cpuN user nice system idle iowait irq softirq steal ...", N the CPU's number.
  std::istringstream in(proc_stat);
  double ticks = 0;
  bool any = false;
  for (std::string line; std::getline(in, line);) {
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(line[3]))
      continue;  // the "cpu " total, "intr", "ctxt" and the rest
    int cpu = -1;
    unsigned long long v[8] = {};
    if (std::sscanf(line.c_str(), "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0],
                    &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 9)
      continue;
    if (std::find(allowed.begin(), allowed.end(), cpu) == allowed.end()) continue;
    ticks += static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);  // not idle, iowait
    any = true;
  }
  return any && ticks_per_s > 0 ? ticks / ticks_per_s : kNaN;
}

CpuClocks read_cpu_clocks() {
  CpuClocks c;
  c.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  c.process_s = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const std::vector<int> cpus = allowed_cpus();
  c.cores = static_cast<int>(cpus.size());
  std::ifstream f("/proc/stat");
  std::stringstream text;
  text << f.rdbuf();
  if (f) c.busy_s = cpu_busy_seconds(text.str(), cpus, static_cast<double>(sysconf(_SC_CLK_TCK)));
  return c;
}

double other_cores(const CpuClocks& a, const CpuClocks& b, double own_s) {
  const double wall = b.wall_s - a.wall_s;
  if (!(wall >= 0.25) || !std::isfinite(a.busy_s) || !std::isfinite(b.busy_s)) return kNaN;
  return std::max(0.0, (b.busy_s - a.busy_s - own_s) / wall);
}

DeviceSampler::DeviceSampler(double period_s, int rank, const std::vector<int>& gpus, int epoch)
    : period_s_(period_s), rank_(rank), cores_(usable_cores()), epoch_(epoch) {
  if (!gpus.empty()) {
    nvml_ = Nvml::open(&note_);
    const std::vector<std::string> ids = nvml_ ? pci_bus_ids() : std::vector<std::string>{};
    for (int g : gpus) {
      if (!nvml_) break;
      const auto at = static_cast<size_t>(g);
      void* h = at < ids.size() && !ids[at].empty() ? nvml_->device(ids[at]) : nullptr;
      if (h)
        gpus_.push_back({g, h});
      else
        note_ += fmt::format("{}NVML does not know GPU {}", note_.empty() ? "" : "; ", g);
    }
  }
  thread_ = std::thread([this] { loop(); });
}

DeviceSampler::~DeviceSampler() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void DeviceSampler::add_replica_thread(int rank) {
  clockid_t id{};
  if (pthread_getcpuclockid(pthread_self(), &id) != 0) return;
  std::lock_guard lk(mu_);
  threads_.push_back({rank, id});
}

void DeviceSampler::set_epoch(int epoch) {
  std::lock_guard lk(mu_);
  epoch_ = epoch;
}

namespace {

// Each device's rows, `keep(n)` of its n kept, evenly spaced: the k-th is kept where it starts
// a new share of n / keep(n).
template <class Keep>
std::vector<DeviceRow> thin(std::vector<DeviceRow> rows, Keep keep) {
  std::map<std::pair<double, double>, std::vector<size_t>> of_device;
  for (size_t i = 0; i < rows.size(); ++i)
    of_device[{rows[i][DeviceCol::kind], rows[i][DeviceCol::index]}].push_back(i);
  std::vector<bool> kept(rows.size(), false);
  for (const auto& [device, at] : of_device) {
    const size_t n = at.size(), m = std::min(n, keep(n));
    for (size_t k = 0; k < n; ++k) kept[at[k]] = (k * m) / n != ((k + 1) * m) / n;
  }
  std::vector<DeviceRow> out;
  for (size_t i = 0; i < rows.size(); ++i)
    if (kept[i]) out.push_back(rows[i]);
  return out;
}

}  // namespace

std::vector<DeviceRow> DeviceSampler::take(size_t per_device, double* period_s) {
  std::vector<DeviceRow> rows;
  {
    std::lock_guard lk(mu_);
    rows = std::exchange(rows_, {});
    if (period_s) *period_s = period_s_;
  }
  if (per_device == 0) return rows;
  return thin(std::move(rows), [&](size_t) { return per_device; });
}

void DeviceSampler::loop() {
  using Steady = std::chrono::steady_clock;
  auto next = Steady::now();
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    sample();
    lk.lock();
    // On a fixed grid: the time a sample takes does not stretch the period (which take() may
    // have doubled). Behind: one period from now, neither a burst to catch up nor a sample
    // right after this one (whose interval of microseconds would make its shares noise).
    const auto period =
        std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(period_s_));
    next += period;
    if (const auto now = Steady::now(); next < now) next = now + period;
    wake_.wait_until(lk, next, [this] { return stop_; });
  }
}

void DeviceSampler::sample() {
  // The GPUs first, without the lock (NVML takes its time; only this thread reads them).
  const double now = unix_now();
  const double dt = last_wall_ < 0 ? kNaN : now - last_wall_;
  last_wall_ = now;
  int epoch = 0;
  {
    std::lock_guard lk(mu_);
    epoch = epoch_;
  }
  std::vector<DeviceRow> gpu_rows;
  for (Gpu& g : gpus_)
    gpu_rows.push_back(read_gpu(g, blank_row(now, epoch, rank_, DeviceKind::gpu, g.index), dt));
  std::lock_guard lk(mu_);  // replicas register threads and take rows on other threads
  // A clock's busy share since the previous sample: CPU seconds over wall seconds.
  const auto busy = [&](Clock& c, double cores) {
    const double s = cpu_seconds(c.id);
    const double share = c.cpu_s < 0 || !(dt > 0) ? kNaN : 100 * (s - c.cpu_s) / (dt * cores);
    c.cpu_s = std::isfinite(s) ? s : -1;
    return share;
  };
  DeviceRow p = blank_row(now, epoch, rank_, DeviceKind::process, 0);
  p[DeviceCol::util] = busy(process_, cores_);
  if (std::isfinite(p[DeviceCol::util])) rows_.push_back(p);
  for (Clock& c : threads_) {
    DeviceRow r = blank_row(now, epoch, c.index, DeviceKind::replica, c.index);
    r[DeviceCol::util] = busy(c, 1);
    if (std::isfinite(r[DeviceCol::util])) rows_.push_back(r);
  }
  rows_.insert(rows_.end(), gpu_rows.begin(), gpu_rows.end());
  if (rows_.size() >= kMaxHeldRows) {  // nobody has taken them: a coarser step, the same span
    rows_ = thin(std::move(rows_), [](size_t n) { return (n + 1) / 2; });
    period_s_ *= 2;
  }
}

DeviceRow DeviceSampler::read_gpu(Gpu& g, DeviceRow row, double dt) {
  const GpuReading r = nvml_->read(g.handle);
  constexpr double kMiB = 1024.0 * 1024;
  row[DeviceCol::util] = r.util_pct;
  row[DeviceCol::mem_util] = r.mem_util_pct;
  row[DeviceCol::mem_used_mib] = r.mem_used_bytes / kMiB;
  row[DeviceCol::mem_total_mib] = r.mem_total_bytes / kMiB;
  row[DeviceCol::power_w] = r.power_w;
  row[DeviceCol::sm_clock_mhz] = r.sm_clock_mhz;
  row[DeviceCol::mem_clock_mhz] = r.mem_clock_mhz;
  row[DeviceCol::temp_c] = r.temp_c;
  row[DeviceCol::pcie_tx_mbps] = r.pcie_tx_Bps / 1e6;
  row[DeviceCol::pcie_rx_mbps] = r.pcie_rx_Bps / 1e6;
  // Counters since boot: the rate between this sample and the one before.
  const auto rate = [&](double now, double& before) {
    const double v = before >= 0 && std::isfinite(now) && dt > 0 ? (now - before) / dt / 1e6 : kNaN;
    before = std::isfinite(now) ? now : -1;
    return v;
  };
  row[DeviceCol::nvlink_tx_mbps] = rate(r.nvlink_tx_bytes, g.nvlink_tx);
  row[DeviceCol::nvlink_rx_mbps] = rate(r.nvlink_rx_bytes, g.nvlink_rx);
  return row;
}

std::vector<DeviceRow> gather_device_rows(Communicator& comm, const std::vector<DeviceRow>& mine) {
  // How many rows each rank has (every rank learns it: each adds its count into its own slot),
  // then every rank's rows padded to the most any rank has.
  std::vector<double> counts(static_cast<size_t>(comm.size()), 0.0);
  counts[static_cast<size_t>(comm.rank())] = static_cast<double>(mine.size());
  comm.allreduce(counts.data(), counts.size(), ReduceOp::sum);
  const double most = *std::max_element(counts.begin(), counts.end());
  const auto width = static_cast<size_t>(most) * DeviceCol::count;
  std::vector<double> flat(width, 0.0);
  for (size_t i = 0; i < mine.size(); ++i)
    std::copy(mine[i].begin(), mine[i].end(),
              flat.begin() + static_cast<long>(i * DeviceCol::count));
  const std::vector<double> all = gather(comm, flat);
  std::vector<DeviceRow> out;
  if (comm.rank() != 0) return out;
  for (size_t r = 0; r < counts.size(); ++r)
    for (size_t i = 0; i < static_cast<size_t>(counts[r]); ++i) {
      DeviceRow row;
      std::copy_n(all.begin() + static_cast<long>(r * width + i * DeviceCol::count),
                  DeviceCol::count, row.begin());
      out.push_back(row);
    }
  return out;
}

std::string devices_csv_header() {
  return "unix_time_s,epoch,rank,device,util_pct,mem_util_pct,mem_used_mib,mem_total_mib,"
         "power_w,sm_clock_mhz,mem_clock_mhz,temp_c,pcie_tx_mbps,pcie_rx_mbps,nvlink_tx_mbps,"
         "nvlink_rx_mbps\n";
}

std::string devices_csv_row(const DeviceRow& r) {
  static const char* const kinds[] = {"process", "replica", "gpu"};
  const auto kind = static_cast<size_t>(std::clamp(static_cast<int>(r[DeviceCol::kind]), 0, 2));
  std::string s =
      fmt::format("{:.6f},{},{},{}", r[DeviceCol::unix_time], static_cast<int>(r[DeviceCol::epoch]),
                  static_cast<int>(r[DeviceCol::rank]), kinds[kind]);
  if (kind != 0) s += std::to_string(static_cast<int>(r[DeviceCol::index]));
  for (int c = DeviceCol::util; c < DeviceCol::count; ++c)
    s += std::isfinite(r[c]) ? fmt::format(",{:.6g}", r[c]) : std::string(",");
  return s + "\n";
}

}  // namespace dtrain
