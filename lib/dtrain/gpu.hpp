#pragma once
// GPUs: what the machine has, and the CUDA backend's device. Compiles everywhere; where dtrain
// was built without the CUDA toolkit, cuda_built() is false and there are no GPUs.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/device.hpp"

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

// The CUDA backend on GPU `index`; `rank` names the replica in error messages.
// Throws SystemError where dtrain was built without CUDA or the GPU cannot be used.
std::unique_ptr<Device> make_cuda_device(int index, int rank);

}  // namespace dtrain
