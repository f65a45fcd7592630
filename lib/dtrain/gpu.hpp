#pragma once
// GPUs: what the machine has, and the CUDA backend's device. Compiles everywhere; where dtrain
// was built without the CUDA toolkit, cuda_built() is false and there are no GPUs.
#include <cstddef>
#include <memory>
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
// back-to-back launches) and the FP32 and TF32 SGEMM throughput of cuBLAS on a large product.
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

// Replicas colocated on one GPU in this process. Each bucket is reduced on the device: replica r
// owns chunk r of the bucket, adds the replicas in ascending order and writes the result into
// every replica's buffer, exactly like the in-process CPU communicator, so the results match
// it bit for bit. CUDA events order the streams; the host communicator serves as a barrier.
struct ColocatedState;
std::shared_ptr<ColocatedState> colocated_state(int replicas);
std::unique_ptr<GradExchange> make_colocated_exchange(std::shared_ptr<ColocatedState> state,
                                                      Communicator& comm, Device& dev,
                                                      ReduceOp op, size_t n_params,
                                                      size_t bucket_elems);

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
  // ncclCommAbort on every communicator of the group: work stuck waiting for a failed peer
  // ends with an error instead of hanging.
  virtual void abort() = 0;
  virtual std::string version() const = 0;
};

}  // namespace dtrain
