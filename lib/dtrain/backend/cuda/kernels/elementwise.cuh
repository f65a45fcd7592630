#pragma once
// Elementwise kernels without a CPU-side formula to share: fill, scale, multiply.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_fill(float* x, size_t n, float v) {
  GRID_STRIDE(i, n) x[i] = v;
}

__global__ void k_scale(float* x, size_t n, float a) {
  GRID_STRIDE(i, n) x[i] *= a;
}

__global__ void k_multiply(const float* x, const float* mask, float* y, size_t n) {
  GRID_STRIDE(i, n) y[i] = x[i] * mask[i];
}

}  // namespace

void fill(float* x, size_t n, float v, cudaStream_t s) {
  k_fill<<<blocks_for(n), kThreads, 0, s>>>(x, n, v);
}

void scale(float* x, size_t n, float a, cudaStream_t s) {
  k_scale<<<blocks_for(n), kThreads, 0, s>>>(x, n, a);
}

void multiply(const float* x, const float* mask, float* y, size_t n, cudaStream_t s) {
  k_multiply<<<blocks_for(n), kThreads, 0, s>>>(x, mask, y, n);
}

}  // namespace dtrain::kernels
