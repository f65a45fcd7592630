#pragma once
// What every kernel family shares: the block size, the grid of a launch, the grid-stride loop,
// per-step values and a block reduction.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "dtrain/backend/cuda/kernels.hpp"

namespace dtrain::kernels {

constexpr int kThreads = 256;

// Blocks of kThreads for n elements, capped at 65535 * 8: past that, kernels stride.
inline unsigned blocks_for(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

// Whether a grid-stride loop over n elements may count in 32 unsigned bits: n, plus the
// threads of the largest grid (blocks_for's cap) past it, stays below 2^32.
inline bool fits_u32(int64_t n) { return n >= 0 && n <= INT32_MAX; }

#define GRID_STRIDE(i, n)                                                 \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); \
       i += size_t(gridDim.x) * blockDim.x)

// Grid-stride over items of one warp each (v the same for the warp's lanes, which stay
// together: the loop bound is the same for all of them).
constexpr int kWarp = 32;
#define WARP_STRIDE(v, n)                                                              \
  for (int64_t v = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < (n); \
       v += int64_t(gridDim.x) * blockDim.x / kWarp)

template <class T>
__device__ T value_of(const Param<T>& p) {
  return p.at ? *p.at : p.value;
}

namespace {

// Block reduction of two doubles over a block of Threads (a power of two) threads, in a fixed
// tree order; thread 0 gets the totals.
template <int Threads = kThreads>
__device__ void block_sum2(double& a, double& b) {
  __shared__ double s0[Threads], s1[Threads];
  s0[threadIdx.x] = a;
  s1[threadIdx.x] = b;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      s0[threadIdx.x] += s0[threadIdx.x + w];
      s1[threadIdx.x] += s1[threadIdx.x + w];
    }
    __syncthreads();
  }
  a = s0[0];
  b = s1[0];
}

// Sum and maximum over a warp's 32 lanes (butterfly: every lane gets the result).
template <class T>
__device__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace
}  // namespace dtrain::kernels
