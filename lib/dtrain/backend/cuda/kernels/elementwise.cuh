#pragma once
// Elementwise kernels: fill, scale, multiply, add (no CPU-side formula to share) and fold
// (math.hpp).
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_fill(float* x, size_t n, float v) {
  GRID_STRIDE(i, n) x[i] = v;
}

__global__ void k_scale(float* x, size_t n, float a) {
  GRID_STRIDE(i, n) x[i] *= a;
}

// The factor read on the device, from the squared norm sum_squares left there.
__global__ void k_clip_by_norm(const float* x, float* y, size_t n, const double* sumsq,
                               float max_norm) {
  const float a = math::clip_factor(*sumsq, max_norm);
  GRID_STRIDE(i, n) y[i] = x[i] * a;
}

__global__ void k_multiply(const float* x, const float* mask, float* y, size_t n) {
  GRID_STRIDE(i, n) y[i] = x[i] * mask[i];
}

__global__ void k_add(const float* a, const float* b, float* y, size_t n) {
  GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

__global__ void k_add_relu(const float* a, const float* b, float* y, size_t n) {
  GRID_STRIDE(i, n) y[i] = math::add_relu(a[i], b[i]);
}

__global__ void k_fold(float* acc, const float* x, size_t n, bool first, float scale) {
  GRID_STRIDE(i, n) acc[i] = math::fold(first ? 0.f : acc[i], x[i], first, scale);
}

}  // namespace

void fill(float* x, size_t n, float v, cudaStream_t s) {
  k_fill<<<blocks_for(n), kThreads, 0, s>>>(x, n, v);
}

void scale(float* x, size_t n, float a, cudaStream_t s) {
  k_scale<<<blocks_for(n), kThreads, 0, s>>>(x, n, a);
}

void clip_by_norm(const float* x, float* y, size_t n, const double* sumsq, float max_norm,
                  cudaStream_t s) {
  k_clip_by_norm<<<blocks_for(n), kThreads, 0, s>>>(x, y, n, sumsq, max_norm);
}

void multiply(const float* x, const float* mask, float* y, size_t n, cudaStream_t s) {
  k_multiply<<<blocks_for(n), kThreads, 0, s>>>(x, mask, y, n);
}

void add(const float* a, const float* b, float* y, size_t n, cudaStream_t s) {
  k_add<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
}

void add_relu(const float* a, const float* b, float* y, size_t n, cudaStream_t s) {
  k_add_relu<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
}

void fold(float* acc, const float* x, size_t n, bool first, float scale, cudaStream_t s) {
  k_fold<<<blocks_for(n), kThreads, 0, s>>>(acc, x, n, first, scale);
}

}  // namespace dtrain::kernels
