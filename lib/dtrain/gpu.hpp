#pragma once
// GPUs: what the machine has, the CUDA backend's device and the NCCL group of its replicas.
// Compiles everywhere; where dtrain was built without the CUDA toolkit, cuda_built() is false
// and there are no GPUs.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/comm.hpp"
#include "dtrain/device.hpp"
#include "dtrain/exchange.hpp"

namespace dtrain {

struct GpuInfo {
  int index = 0;
  std::string name;
  size_t memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
};

struct GpuSystem {
  bool built_with_cuda = false;
  std::string none_reason;  // why there are no GPUs, when there are none
  std::string driver;       // e.g. "13.0", or "none"
  std::string runtime;      // CUDA runtime dtrain was built against
  std::string cudnn, nccl, cublas;
  std::vector<GpuInfo> gpus;
};

bool cuda_built();
// Asks the driver; never throws (a missing driver is a reason, not an error).
GpuSystem query_gpus();

// Floors for a step on GPU `index`: the latency of one empty kernel launch (median over
// back-to-back launches) and the FP32 and TF32 SGEMM throughput of cuBLAS on a large product of
// random matrices (FP32 in cuBLAS's default math, as PyTorch runs FP32 GEMMs with TF32 off).
struct GpuFloors {
  double launch_us = 0;
  double sgemm_fp32_tflops = 0;
  double sgemm_tf32_tflops = 0;
};
GpuFloors measure_gpu(int index);

// The CUDA backend on GPU `index`; `rank` names the replica in error messages.
// Throws SystemError where dtrain was built without CUDA or the GPU cannot be used.
std::unique_ptr<Device> make_cuda_device(int index, int rank,
                                         Precision precision = Precision::fp32);

// cuDNN lists a convolution's algorithms best first. The first supported one may use atomics, so
// that its results vary in the last bits from run to run; dtrain takes the first supported
// algorithm that cuDNN marks deterministic, and only where there is none the first supported
// one. Returns its index (-1 where none is supported) and whether it is deterministic.
struct AlgoOption {
  bool supported = false;
  bool deterministic = false;
};
int pick_algorithm(const std::vector<AlgoOption>& best_first, bool* deterministic);

// A warning in dtrain's log, for code that cannot include the logger (CUDA sources).
void gpu_warn(const std::string& line);

// The abort protocol of communicators that several threads use. Every use of a communicator (an
// NCCL call, or the launch of a CUDA graph that holds NCCL calls) happens while holding a Pass.
// close() marks the gate closed before anything else, so that no new pass is handed out (enter()
// throws Aborted instead), then waits for the passes still out; only then may its caller free
// the communicators. A pass is short: NCCL calls only queue work on the host (communicators
// connect when they are created, see NcclGroup::local), and nobody waits for the device while
// holding one. One exception: an NCCL call whose work queue is full spins on the host until the
// GPU drains it, which never happens behind a failed peer, and only NCCL's abort flag ends that
// spin. So close() waits a bounded time, then lets its caller abort anyway (as PyTorch's NCCL
// watchdog does).
class AbortGate {
 public:
  class Pass {
   public:
    Pass() = default;
    Pass(Pass&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Pass& operator=(Pass&&) = delete;
    Pass(const Pass&) = delete;
    ~Pass();

   private:
    friend class AbortGate;
    explicit Pass(AbortGate* g) : gate_(g) {}
    AbortGate* gate_ = nullptr;
  };
  // A pass for one use of the communicators; throws Aborted (naming `what`) once closed.
  Pass enter(const char* what);
  // Closes the gate and waits until every pass is back, or `limit` has passed (then it says so
  // in the log). True for the call that closed it.
  bool close(std::chrono::seconds limit = std::chrono::seconds(30));
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int out_ = 0;
  bool closed_ = false;
};

// NCCL communicators that carry the gradients of GPU replicas (the host Communicator still
// carries the small statistics). Gradients are all-reduced in place on a communication stream
// that waits for backward through CUDA events, bucket by bucket, with ncclAvg for mean and
// ncclSum for sum.
class NcclGroup {
 public:
  virtual ~NcclGroup() = default;
  // This process's replicas, one per GPU in `gpus` (ncclCommInitAll): ranks 0..n-1.
  static std::shared_ptr<NcclGroup> local(const std::vector<int>& gpus);
  // One replica per process under mpirun/srun: rank 0's unique id goes to all ranks over MPI,
  // each rank on GPU `gpu` (chosen by its local rank).
  static std::shared_ptr<NcclGroup> over_mpi(int gpu, int rank, int size);
  virtual std::unique_ptr<GradExchange> exchange(int local_index, Device& dev, ReduceOp op,
                                                 size_t n_params, size_t bucket_elems) = 0;
  // Closes the group's gate (every later NCCL call or graph launch throws Aborted), waits for
  // the calls in flight, then ncclCommAbort on every communicator of the group: work stuck
  // waiting for a failed peer ends instead of hanging. The communicators are never touched
  // again. Call it from a thread that holds no pass (after its worker has unwound).
  virtual void abort() = 0;
  // The gate that every use of this group's communicators passes (CUDA graphs holding NCCL
  // calls included).
  virtual AbortGate& gate() = 0;
  virtual std::string version() const = 0;
};

}  // namespace dtrain
