#pragma once
// The kernels of measure_gpu's floors: an empty one (launch latency) and random data for the
// SGEMM throughput.
#include "dtrain/backend/cuda/kernels/common.cuh"
#include "dtrain/base/hash.hpp"

namespace dtrain::kernels {
namespace {

__global__ void k_empty() {}

// Uniform in [-1, 1): GEMM floors on data like a network's, not on zeros (which take less power
// and so can run at higher clocks).
__global__ void k_fill_uniform(float* x, size_t n, uint64_t seed) {
  GRID_STRIDE(i, n) x[i] = static_cast<float>(2.0 * counter_uniform(seed, i) - 1.0);
}

}  // namespace

void empty_kernels(int count, cudaStream_t s) {
  for (int i = 0; i < count; ++i) k_empty<<<1, 1, 0, s>>>();
}

void fill_uniform(float* x, size_t n, uint64_t seed, cudaStream_t s) {
  k_fill_uniform<<<blocks_for(n), kThreads, 0, s>>>(x, n, seed);
}

}  // namespace dtrain::kernels
