#pragma once
// Checks of CUDA, cuBLAS and cuDNN calls (and, through throw_gpu_error, NCCL's in dist/): a
// failed call throws SystemError "rank R: LIBRARY: CALL (DETAIL)" from the caller's file and
// line. The rank is an argument, so that code without a device at hand (measure_gpu, the NCCL
// group) checks the same way as the device classes.
//
// This header includes no CUDA header: each macro names its library's types and functions only
// where it is used, in files that include that library.
#include <string>

#include "dtrain/base/error.hpp"

namespace dtrain {

[[noreturn]] inline void throw_gpu_error(int rank, const char* library, const char* call,
                                         const std::string& detail, const char* file, int line) {
  throw SystemError(
      "rank " + std::to_string(rank) + ": " + library + ": " + call + " (" + detail + ")", file,
      line);
}

// A status without a message of its own (cuBLAS).
inline std::string gpu_status_text(int status) {
  return "status " + std::to_string(status);
}

}  // namespace dtrain

// `ok`: the library's success value; `describe`: its status to text.
#define DT_GPU_CHECK(expr, text, rank, library, ok, describe)                                     \
  do {                                                                                            \
    const auto dt_status_ = (expr);                                                               \
    if (dt_status_ != (ok))                                                                       \
      ::dtrain::throw_gpu_error((rank), library, text, describe(dt_status_), __FILE__, __LINE__); \
  } while (0)

#define DT_CUDA(expr, rank) DT_GPU_CHECK(expr, #expr, rank, "CUDA", cudaSuccess, cudaGetErrorString)
#define DT_CUBLAS(expr, rank) \
  DT_GPU_CHECK(expr, #expr, rank, "cuBLAS", CUBLAS_STATUS_SUCCESS, ::dtrain::gpu_status_text)
#define DT_CUDNN(expr, rank) \
  DT_GPU_CHECK(expr, #expr, rank, "cuDNN", CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
