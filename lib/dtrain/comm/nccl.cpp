// NCCL groups in a build without CUDA: creating one says so (nccl_group.cpp has the real ones).
#include <fmt/format.h>

#include "dtrain/base/error.hpp"
#include "dtrain/comm/nccl.hpp"

namespace dtrain {

#if !DTRAIN_HAVE_CUDA
std::shared_ptr<NcclGroup> NcclGroup::local(const std::vector<int>&) {
  DTRAIN_THROW_SYSTEM("NCCL is not available in this build");
}
std::shared_ptr<NcclGroup> NcclGroup::over_mpi(int, int, int) {
  DTRAIN_THROW_SYSTEM("NCCL is not available in this build");
}
#endif

}  // namespace dtrain
