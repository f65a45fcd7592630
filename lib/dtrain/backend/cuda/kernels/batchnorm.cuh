#pragma once
// BatchNorm: the per-channel statistics and the per-element arithmetic of math.hpp (its sums
// over channels are in channel_sums.cuh).
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// One thread per channel (grid-stride: any number of channels).
__global__ void k_bn_prepare(const double* moments, double count, double eps, double momentum,
                             float* running, float* stats, int64_t c) {
  GRID_STRIDE(ch, size_t(c)) {
    math::bn_prepare_channel(moments, count, eps, momentum, running, stats, c,
                             static_cast<int64_t>(ch));
  }
}

// The element-wise kernels find an element's channel by division in I: 32 bits where the
// element count allows (ncu showed the 64-bit division's cost in every element-wise kernel).

// stats = [mean (c), inv_std (c)]; Relu: BatchNorm's ReLU fused.
template <class I, bool Relu>
__global__ void k_bn_apply(const float* x, const float* stats, const float* gamma,
                           const float* beta, I total, I c, I spatial, float* y) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I ch = (i / spatial) % c;
    const math::BnAffine t = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
    y[i] = Relu ? math::bn_apply_relu_one(t, x[i]) : math::bn_apply_one(t, x[i]);
  }
}

template <class I>
void launch_bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                     I total, I c, I spatial, float* y, bool relu, cudaStream_t s) {
  const unsigned blocks = blocks_for(static_cast<size_t>(total));
  if (relu)
    k_bn_apply<I, true><<<blocks, kThreads, 0, s>>>(x, stats, gamma, beta, total, c, spatial, y);
  else
    k_bn_apply<I, false><<<blocks, kThreads, 0, s>>>(x, stats, gamma, beta, total, c, spatial, y);
}

// sums = [s1 (c), s2 (c)] as doubles; the CPU twin's arithmetic.
template <class I>
__global__ void k_bn_bwd_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                            const double* sums, double m, I total, I c, I spatial, float* dx) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I ch = (i / spatial) % c;
    const math::BnDx t =
        math::bn_dx_coeffs(stats[ch], stats[c + ch], gamma[ch], sums[ch], sums[c + ch], m);
    dx[i] = math::bn_dx_one(t, dy[i], x[i]);
  }
}

}  // namespace

void bn_prepare(const double* moments, double count, double eps, double momentum, float* running,
                float* stats, int64_t c, cudaStream_t s) {
  k_bn_prepare<<<blocks_for(c), kThreads, 0, s>>>(moments, count, eps, momentum, running, stats, c);
}

void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta, int64_t n,
              int64_t c, int64_t spatial, float* y, bool relu, cudaStream_t s) {
  const int64_t total = n * c * spatial;
  if (fits_u32(total))
    launch_bn_apply<uint32_t>(x, stats, gamma, beta, uint32_t(total), uint32_t(c),
                              uint32_t(spatial), y, relu, s);
  else
    launch_bn_apply<int64_t>(x, stats, gamma, beta, total, c, spatial, y, relu, s);
}

void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                    const double* sums, double m, int64_t n, int64_t c, int64_t spatial, float* dx,
                    cudaStream_t s) {
  const int64_t total = n * c * spatial;
  const unsigned blocks = blocks_for(static_cast<size_t>(total));
  if (fits_u32(total))
    k_bn_bwd_dx<uint32_t><<<blocks, kThreads, 0, s>>>(x, dy, stats, gamma, sums, m,
                                                      uint32_t(total), uint32_t(c),
                                                      uint32_t(spatial), dx);
  else
    k_bn_bwd_dx<int64_t><<<blocks, kThreads, 0, s>>>(x, dy, stats, gamma, sums, m, total, c,
                                                     spatial, dx);
}

}  // namespace dtrain::kernels
