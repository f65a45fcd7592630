#pragma once
// precision: bf16: GEMM and convolution operands to bfloat16 (round to nearest even, what
// round_bf16 does on the CPU), and bf16 results back to fp32.
#include <cuda_bf16.h>

#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// Stored rows x cols matrix (leading dimension ld) to bfloat16.
__global__ void k_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                          __nv_bfloat16* dst) {
  GRID_STRIDE(i, size_t(rows * cols)) {
    const int64_t at = (static_cast<int64_t>(i) / cols) * ld + static_cast<int64_t>(i) % cols;
    dst[at] = __float2bfloat16_rn(src[at]);
  }
}
__global__ void k_from_bf16(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
  GRID_STRIDE(i, n)
  dst[i] = accumulate ? dst[i] + __bfloat162float(src[i]) : __bfloat162float(src[i]);
}

static_assert(sizeof(__nv_bfloat16) == sizeof(Bf16), "bfloat16 is stored in 16 bits");

}  // namespace

void to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, Bf16* dst, cudaStream_t s) {
  k_to_bf16<<<blocks_for(static_cast<size_t>(rows * cols)), kThreads, 0, s>>>(
      src, rows, cols, ld, reinterpret_cast<__nv_bfloat16*>(dst));
}

void from_bf16(const Bf16* src, float* dst, size_t n, bool accumulate, cudaStream_t s) {
  k_from_bf16<<<blocks_for(n), kThreads, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(src), dst,
                                                 n, accumulate);
}

}  // namespace dtrain::kernels
