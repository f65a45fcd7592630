#pragma once
// GPUs: what the machine has, how fast it is, and the CUDA backend's device.
// Compiles everywhere; where dtrain was built without the CUDA toolkit, cuda_built() is false
// and there are no GPUs.
#include <cstddef>
#include <cstdint>
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
  std::string pci_bus_id;  // e.g. "0000:3B:00.0": how NVML finds the same GPU
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

// A GPU's documented dense peak in TFLOP/s for a training precision (fp32: the FP32 units;
// tf32 and bf16: the tensor cores without sparsity), from its name as the driver gives it
// (e.g. "NVIDIA H100 80GB HBM3"), with the datasheet it comes from; 0 and "" for a GPU not in
// the table (A100, H100 SXM and PCIe, H200 SXM, L40S; not the NVL parts, not GH200).
struct DocumentedPeak {
  double tflops = 0;
  std::string source;
};
DocumentedPeak documented_peak(const std::string& gpu_name, Precision precision);

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

// ---- the GPU code's rules that need no GPU (tests/test_cuda.cpp, [gpu-logic]) ----

// cuBLAS and cuDNN take sizes and element counts as `int`: `v` as one, or SystemError naming
// `what` (the operation and its argument), the size and the limit.
int narrow_int(int64_t v, const char* what, int rank);
// Validation's side of that limit: UserError where a `rows` x `features` tensor of `layer`
// holds more than INT_MAX values (more than cuDNN can describe, or a GEMM's dimension past
// int), saying what to lower.
void check_gpu_tensor(const std::string& layer, int64_t rows, int64_t features);

// CUDA graphs stage each per-step value (CudaGraph::stage) in a span of 16-byte units.
constexpr size_t graph_stage_span(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}
// The bytes one training step stages: per micro-step its `rows` batch indices (int64) and
// `values_per_micro` scalars (the augmentation and dropout seeds), `accumulation` times, and
// `values_per_step` scalars (the optimizer's learning rate or Adam factors). Saturates.
size_t graph_staging_bytes(int64_t rows, int64_t accumulation, int64_t values_per_micro,
                           int64_t values_per_step);

// The mean over `ranks` replicas of gradients already summed, as every host path computes it
// (the in-process and MPI communicators, the shared-weights fold): the float sum times the
// float 1/ranks. The NCCL exchange sums with ncclSum and then scales by mean_factor on the
// device (kernels::scale); mean_of_sum is that kernel's CPU twin.
inline float mean_factor(int ranks) {
  return 1.0f / static_cast<float>(ranks);
}
void mean_of_sum(float* x, size_t n, int ranks);
// x *= a on `stream` (a cudaStream_t), for GPU code outside backend/cuda/ that runs on a stream
// of its own (the NCCL exchange's). Defined only where dtrain is built with CUDA.
void scale_on_stream(float* x, size_t n, float a, void* stream);

// Whether a step is captured in a CUDA graph must be the same on every rank. The ranks vote
// (agree_graph_mode, a host all-reduce) only while unsettled: at the first full-size step, and
// after an agreed eager step, an epoch's end or a checkpoint (where device memory may have
// changed on some ranks). Once they agree on a graph step, every rank follows its own
// proposals without a collective: they are the same on every rank as long as no rank drops
// its graphs alone, and a rank that did (it proposes eager) fails loudly instead of diverging.
class GraphAgreement {
 public:
  // The next full-size step votes again.
  void unsettle() { settled_ = false; }
  bool settled() const { return settled_; }
  int64_t votes() const { return votes_; }
  // This step's mode from this rank's proposal; `vote(mine)` is the collective that returns
  // the agreed mode (called only while unsettled).
  template <class Vote>
  GraphMode decide(GraphMode mine, int rank, Vote&& vote) {
    if (settled_) return follow(mine, rank);
    ++votes_;
    const GraphMode agreed = vote(mine);
    settled_ = agreed != GraphMode::eager;
    return agreed;
  }

 private:
  GraphMode follow(GraphMode mine, int rank) const;  // throws where mine is eager
  bool settled_ = false;
  int64_t votes_ = 0;
};

}  // namespace dtrain
