#pragma once
// Squared norms for the gradient noise scale, in double and in a fixed order: a fixed grid of
// at most kThreads blocks writes one partial sum each, one block adds the partials in order, so
// the result does not depend on timing (no atomics).
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_sum_squares_partial(const float* x, size_t n, double* partial) {
  double a = 0, unused = 0;
  GRID_STRIDE(i, n) {
    const double v = x[i];
    a += v * v;
  }
  block_sum2(a, unused);
  if (threadIdx.x == 0) partial[blockIdx.x] = a;
}

__global__ void k_add_partials(const double* partial, unsigned count, double* acc) {
  double a = threadIdx.x < count ? partial[threadIdx.x] : 0.0, unused = 0;
  block_sum2(a, unused);
  if (threadIdx.x == 0) *acc += a;
}

}  // namespace

unsigned sum_squares_blocks(size_t n) {
  return std::min<unsigned>(blocks_for(n), kThreads);
}

void sum_squares_partial(const float* x, size_t n, double* partial, cudaStream_t s) {
  k_sum_squares_partial<<<sum_squares_blocks(n), kThreads, 0, s>>>(x, n, partial);
}

void add_partials(const double* partial, unsigned count, double* acc, cudaStream_t s) {
  k_add_partials<<<1, kThreads, 0, s>>>(partial, count, acc);
}

}  // namespace dtrain::kernels
