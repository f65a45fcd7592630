#pragma once
// GPUs: what the machine has, how fast it is, and the CUDA backend's device.
// Compiles everywhere; where dtrain was built without the CUDA toolkit, cuda_built() is false
// and there are no GPUs.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/kinds.hpp"

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

// The device memory this process allocated on each GPU through the CUDA backend (its buffers
// and the cuBLAS and cuDNN workspaces), now and at its peak: the counterpart of the process's
// peak RSS, for summary.json. NCCL's buffers, the CUDA context and the few kilobytes that
// stage a CUDA graph's per-step values are not counted. Thread-safe; allocations are rare
// (at the start, in the first steps and when a buffer grows; never in a CUDA-graph step).
class GpuMemoryGauge {
 public:
  struct Peak {
    int gpu = 0;
    size_t bytes = 0;
  };
  void allocated(int gpu, const void* p, size_t bytes);
  void freed(const void* p);  // a pointer it was not told of is ignored
  size_t live(int gpu) const;
  // Every GPU that held memory since the last reset, by index.
  std::vector<Peak> peaks() const;
  // Peaks start again from what is allocated now (a new run in the same process).
  void reset_peaks();

 private:
  struct Use {
    size_t live = 0, peak = 0;
  };
  mutable std::mutex mu_;
  std::unordered_map<const void*, std::pair<int, size_t>> blocks_;
  std::map<int, Use> gpus_;
};
GpuMemoryGauge& gpu_memory();

// A warning in dtrain's log, for code that cannot include the logger (CUDA sources).
void gpu_warn(const std::string& line);

}  // namespace dtrain
