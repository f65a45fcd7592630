#pragma once
// NCCL groups of GPU replicas. Compiles
// everywhere; where dtrain was built without the CUDA toolkit, creating a group throws.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/abort_gate.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/comm/exchange.hpp"

namespace dtrain {

// NCCL communicators that carry the gradients of GPU replicas (the host Communicator still
// carries the small statistics). Gradients are all-reduced in place on a communication stream
// that waits for backward through CUDA events, bucket by bucket, with ncclSum; a mean is then
// scaled by 1/ranks on the device as the host paths scale theirs (mean_factor in gpu.hpp), not
// with ncclAvg, which scales each input before the sum.
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
