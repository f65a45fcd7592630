#pragma once
// What a training run reports, as plain types: the metrics of an epoch, the run's description,
// its result, and the observer that hears of its progress. Nothing heavy is included, so the
// results layer (run folders, tables) reads them without the training loop's headers.
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain {

// The other_cores (EpochMetrics) at which the log warns that other work slowed the run.
constexpr double kOtherCoresWarn = 0.25;

struct EpochMetrics {
  int epoch = 0;      // 1-based
  double lr = 0;      // LR at the epoch's first step
  double lr_end = 0;  // LR at its last step
  double train_loss = 0, train_acc = 0;
  double test_loss = 0, test_acc = 0;
  double epoch_time_s = 0;  // wall time of the training steps (evaluation excluded)
  double samples_per_s = 0;
  int64_t samples = 0;
  // Rank 0's split of epoch_time_s (the rest is loop overhead and the epoch-end stats exchange).
  double data_s = 0, compute_s = 0, exchange_s = 0, optimizer_s = 0;
  // The part of exchange_s that compute did not hide (equal to it where the exchange is
  // synchronous, as on the CPU).
  double exchange_exposed_s = 0;
  double eval_s = 0;
  // model.batchnorm: sync: rank 0's seconds in the BatchNorm statistics' exchanges over the
  // replicas (part of compute_s; 0 without).
  double bn_sync_s = 0;
  // Cores kept busy by work other than this run's on the CPUs it may use (on rank 0's machine),
  // on average over the epoch; NaN where unknown (no /proc/stat, an epoch under 0.25 s, replicas
  // as processes, which may each be bound to cores of their own). Work that takes cores the run
  // needs slows it: its times then say more about the machine than about the run.
  double other_cores = std::nan("");
  // Each rank's busy time (data + compute + optimizer, waiting for the exchange excluded; with
  // synchronised BatchNorm its exchanges are in compute, as in compute_s): stragglers show here.
  double rank_busy_min_s = 0, rank_busy_max_s = 0;
  int slowest_rank = 0;
  // The straggler named from every rank's busy time per phase (straggler.hpp; the CPU with more
  // than one replica): its rank and phase (0 data, 1 forward, 2 backward, 3 exchange,
  // 4 optimizer), -1 for none, and its median excess over the other ranks (NaN for none).
  int straggler_rank = -1, straggler_phase = -1;
  double straggler_excess = std::nan("");
  // The gradient exchange: bytes all-reduced per optimizer step (the flat gradient buffer) and
  // the bus bandwidth achieved, busbw = bytes / (exchange_s per step) x 2(n-1)/n (nccl-tests'
  // definition: comparable across replica counts); NaN with one replica.
  int64_t exchange_bytes_per_step = 0;
  double busbw_gbps = std::nan("");
  // Gradient noise scale so far (moving averages; see noise_scale.hpp), NaN where not measured
  // (one replica, or train.noise_scale: false).
  double noise_g2 = std::nan(""), noise_trace = std::nan(""), noise_b_simple = std::nan("");
  // dataset: folder: images the replicas' decode threads made per second of the epoch, and the
  // share of those threads' time spent decoding; NaN for data held in memory.
  double input_images_per_s = std::nan(""), input_busy = std::nan("");
};

// One scoring of the test set: after each epoch, and with train.eval_steps every that many
// optimizer steps in between (evals.csv), so that the steps a target takes are known to within
// that many.
struct EvalPoint {
  int epoch = 0;            // 1-based: the epoch in progress (or just finished)
  int64_t step = 0;         // optimizer steps of that epoch done
  int64_t global_step = 0;  // optimizer steps of the run done
  int64_t samples = 0;      // training samples of the run seen
  double train_time_s = 0;  // training time so far (evaluation excluded)
  double test_loss = 0, test_acc = 0;
};

// What time_to_target_s and the steps to target measure to: a test accuracy to reach, a test
// loss to get below, or both (0: not set). Nothing set: no target.
struct Targets {
  double accuracy = 0, loss = 0;
  bool any() const { return accuracy > 0 || loss > 0; }
  bool reached(double test_acc, double test_loss) const {
    return any() && (accuracy <= 0 || test_acc >= accuracy) && (loss <= 0 || test_loss <= loss);
  }
  bool reached(const EpochMetrics& e) const { return reached(e.test_acc, e.test_loss); }
  bool reached(const EvalPoint& e) const { return reached(e.test_acc, e.test_loss); }
};

struct Checkpoint;

struct RunInfo {
  std::string model;
  std::string data;
  std::string devices;  // e.g. "cpu: 4 replicas as threads, 1 BLAS thread each"
  std::string placement;  // under a launcher: each rank's host and local rank
  // How the replicas ran: "one replica", "threads" (each its own weights), "shared" (threads
  // sharing one copy of the weights and optimizer state), "processes" (under a launcher).
  std::string replica_mode;
  int64_t steps_per_epoch = 0;
  int64_t global_batch = 0;
  int64_t micro_batch = 0;
  double peak_lr = 0;
  int64_t param_count = 0;
  // FLOPs per sample of a training step (the shape engine's, model_size), and one replica's
  // peak in TFLOP/s with where it comes from (a GEMM measured on the replica's CPU threads when
  // the run ends, or a GPU's documented peak for the precision); 0 and "" where none is known.
  double forward_flops = 0, backward_flops = 0;
  double peak_tflops = 0;
  std::string peak_source;
  std::string backend = "cpu";  // where the replicas ran: cpu or cuda
  std::string precision = "fp32";
  std::string blas;  // the OpenBLAS build and kernel family (see blas_description)
  int64_t launches_per_step = 0;  // GPU kernels and library calls in one training step
  std::string cuda_graph;         // "on", or "off: <why>" (empty on the CPU)
  int64_t cuda_graph_steps = 0;   // steps launched as CUDA graphs (rank 0)
  // GPU index -> MiB: the most device memory the CUDA backend held at once on each GPU of this
  // process during the run (see GpuMemoryGauge); empty on the CPU. Known when the run ends.
  std::map<int, double> peak_device_mib;
  // dataset: folder: the class of each label, and the files left out (on_bad_file: skip).
  std::vector<std::string> class_names;
  std::vector<std::string> skipped_files;
};

enum class RunStatus { done, diverged };

struct TrainResult {
  RunInfo info;
  std::vector<EpochMetrics> epochs;
  std::vector<double> step_losses;  // global mean loss of every optimizer step, in order
  std::vector<EvalPoint> evals;     // train.eval_steps: every scoring of the test set
  RunStatus status = RunStatus::done;
};

// devices.csv (telemetry.hpp): one sample of one device. kind: what `index` counts.
enum class DeviceKind { process = 0, replica = 1, gpu = 2 };
// The columns of a DeviceRow.
struct DeviceCol {
  enum : int {
    unix_time,  // seconds since 1970 (UTC), to the microsecond
    epoch,      // the epoch in training (0-based) when it was taken
    rank,       // the rank that took it (a replica's own rank; a process's first rank)
    kind,       // DeviceKind
    index,      // the replica's rank, the GPU's CUDA index, 0 for a process
    util,       // percent: a kernel running (GPU); on a core (replica thread; process: of its cores)
    mem_util,   // percent of the period device memory was read or written (GPU)
    mem_used_mib,
    mem_total_mib,
    power_w,
    sm_clock_mhz,
    mem_clock_mhz,
    temp_c,
    pcie_tx_mbps,    // NVML's PCIe throughput, MB/s (10^6 bytes)
    pcie_rx_mbps,
    nvlink_tx_mbps,  // NVLink data between this sample and the one before, MB/s
    nvlink_rx_mbps,
    count
  };
};
using DeviceRow = std::array<double, DeviceCol::count>;  // NaN: no value

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const RunInfo&) {}
  // Called by rank 0 after every optimizer step.
  virtual void on_step(int /*epoch*/, int64_t /*step*/, int64_t /*steps*/) {}
  virtual void on_epoch(const EpochMetrics&) {}
  // Called by rank 0 after each scoring of the test set, where train.eval_steps is set (the
  // epoch's own scoring comes before on_epoch).
  virtual void on_eval(const EvalPoint&) {}
  // Called by rank 0 with the run's state at a step boundary (see checkpoint.hpp).
  virtual void on_checkpoint(const Checkpoint&) {}
  // Called by rank 0 with the step trace so far (train.trace; trace-event JSON, see trace.hpp).
  virtual void on_trace(const std::string& /*json*/) {}
  // Called by rank 0 at each epoch's end with every rank's device samples since the last call
  // (train.telemetry_ms; columns in telemetry.hpp).
  virtual void on_devices(const std::vector<DeviceRow>& /*rows*/) {}
};

}  // namespace dtrain
