#pragma once
// What the devices did while a run trained: devices.csv. A thread of its own reads, every
// train.telemetry_ms, each GPU this process drives through NVML (loaded at run time: without it
// a note, never a failure), how busy each CPU replica's own thread was (its CPU clock against
// the wall clock) and how busy the whole process was (its CPU clock against the wall clock
// times the cores it may use). At each epoch's end the rows go to rank 0 (a collective) and its
// observer appends them to devices.csv.
#include <condition_variable>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/train/run_types.hpp"  // DeviceRow

namespace dtrain {

class Nvml;

class DeviceSampler {
 public:
  // Samples every `period_s` the GPUs (CUDA indices) this process drives and its CPU clocks;
  // `rank` is the process's first rank, `epoch` the one training starts in (a resumed run's).
  // NVML is opened only where `gpus` is not empty.
  DeviceSampler(double period_s, int rank, const std::vector<int>& gpus, int epoch = 0);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Why GPUs this process drives have no rows (NVML missing, a GPU it does not know); "" else.
  const std::string& note() const { return note_; }
  // Called on replica `rank`'s own thread: that thread's CPU clock is the replica's.
  void add_replica_thread(int rank);
  void set_epoch(int epoch);
  // The rows sampled since the last call, oldest first; at most `per_device` of each device
  // (evenly spaced in time; 0: all). `*period_s` (where given): the sampling period now. Where
  // kMaxHeldRows wait, every second sample of each device is let go and the period doubles,
  // so that a long epoch keeps its whole span at a coarser step.
  std::vector<DeviceRow> take(size_t per_device = 0, double* period_s = nullptr);
  static constexpr size_t kMaxHeldRows = 1000000;  // 136 MB

 private:
  struct Gpu {
    int index;
    void* handle;
    double nvlink_tx = -1, nvlink_rx = -1;  // the counters at the previous sample
  };
  struct Clock {
    int index;
    clockid_t id;
    double cpu_s = -1;  // at the previous sample
  };
  void loop();
  void sample();
  DeviceRow read_gpu(Gpu& g, DeviceRow row, double dt);

  double period_s_;
  int rank_;
  std::shared_ptr<Nvml> nvml_;
  std::vector<Gpu> gpus_;
  std::vector<Clock> threads_;
  Clock process_{0, CLOCK_PROCESS_CPUTIME_ID};
  int cores_ = 1;
  double last_wall_ = -1;
  int epoch_ = 0;
  std::string note_;
  std::vector<DeviceRow> rows_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Other work on the machine, which distorts a run's times (replicas waiting for a core another
// program holds): the CPUs this process may use, how long they were busy with anyone's work
// (/proc/stat: user, nice, system, irq, softirq and steal time, in 10 ms ticks) and this
// process's own CPU seconds, at one moment.
struct CpuClocks {
  double busy_s = std::numeric_limits<double>::quiet_NaN();  // NaN: /proc/stat unreadable
  double process_s = 0;
  double wall_s = 0;  // steady clock
  int cores = 0;      // the CPUs this process may use
};
CpuClocks read_cpu_clocks();
// /proc/stat's text to the busy seconds of the CPUs in `allowed` (NaN where none is listed).
double cpu_busy_seconds(const std::string& proc_stat, const std::vector<int>& allowed,
                        double ticks_per_s);
// The cores that work other than this run's kept busy between a and b, on average: their busy
// time less `own_s` (the CPU seconds of this run's processes on the machine over that time),
// over the wall time. NaN where /proc/stat could not be read or the span is under 0.25 s (the
// ticks would make it noise).
double other_cores(const CpuClocks& a, const CpuClocks& b, double own_s);

// Collective: every rank's rows on rank 0, in rank order (ranks that sample nothing pass none);
// the other ranks get none.
std::vector<DeviceRow> gather_device_rows(Communicator& comm, const std::vector<DeviceRow>& mine);

// devices.csv: its header, and a row ("gpu0", "replica3", "process"; empty cells for no value).
std::string devices_csv_header();
std::string devices_csv_row(const DeviceRow& r);

}  // namespace dtrain
