#pragma once
// Optimizer updates: the element steps of math.hpp. The learning rate (and Adam's bias
// corrections) are per-step values: staged in device memory when a CUDA graph is captured.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_sgd(float* p, const float* g, float* buf, size_t n, Param<float> lr_p,
                      float momentum, float wd, bool nesterov) {
  const float lr = value_of(lr_p);
  GRID_STRIDE(i, n) math::sgd_step(p[i], g[i], buf[i], lr, momentum, wd, nesterov);
}

__global__ void k_adam(float* p, const float* g, float* m, float* v, size_t n,
                       Param<math::AdamFactors> sc, float b1, float b2, float eps, float wd,
                       bool decoupled) {
  const math::AdamFactors f = value_of(sc);
  GRID_STRIDE(i, n) math::adam_step(p[i], g[i], m[i], v[i], f, b1, b2, eps, wd, decoupled);
}

}  // namespace

void sgd(float* p, const float* g, float* buf, size_t n, Param<float> lr, float momentum, float wd,
         bool nesterov, cudaStream_t s) {
  k_sgd<<<blocks_for(n), kThreads, 0, s>>>(p, g, buf, n, lr, momentum, wd, nesterov);
}

void adam(float* p, const float* g, float* m, float* v, size_t n, Param<math::AdamFactors> f,
          float b1, float b2, float eps, float wd, bool decoupled, cudaStream_t s) {
  k_adam<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, f, b1, b2, eps, wd, decoupled);
}

}  // namespace dtrain::kernels
