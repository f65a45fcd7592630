#pragma once
// BatchNorm: per-channel reductions in one block per channel (double sums), and the per-channel
// and per-element arithmetic of math.hpp.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// The per-channel reductions take a block of kBnThreads per channel: with 256 threads, the CNN's
// 32-channel layers kept 32 of 132 SMs a quarter busy and took 113-123 us a call at batch 64
// (ncu, H100).
constexpr int kBnThreads = 1024;

// The offset of element i of channel ch, i counting over samples, then positions (32-bit
// division where the count fits, the 64-bit one being several times slower).
__device__ inline int64_t channel_offset(int64_t i, int64_t c, int64_t ch, int64_t spatial,
                                         bool narrow) {
  const int64_t j = narrow ? int64_t(uint32_t(i) / uint32_t(spatial)) : i / spatial;
  return (j * c + ch) * spatial + (i - j * spatial);
}

// One block per channel: sum and sum of squares over samples and positions.
__global__ void __launch_bounds__(kBnThreads) k_channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                                  double* out) {
  const int64_t ch = blockIdx.x;
  const bool narrow = n * spatial <= INT32_MAX;
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < n * spatial; i += blockDim.x) {
    const double v = x[channel_offset(i, c, ch, spatial, narrow)];
    a += v;
    b += v * v;
  }
  block_sum2<kBnThreads>(a, b);
  if (threadIdx.x == 0) {
    out[ch] = a;
    out[c + ch] = b;
  }
}

// One thread per channel (grid-stride: any number of channels).
__global__ void k_bn_prepare(const double* moments, double count, double eps, double momentum,
                             float* running, float* stats, int64_t c) {
  GRID_STRIDE(ch, size_t(c)) {
    math::bn_prepare_channel(moments, count, eps, momentum, running, stats, c,
                             static_cast<int64_t>(ch));
  }
}

// stats = [mean (c), inv_std (c)]
__global__ void k_bn_apply(const float* x, const float* stats, const float* gamma,
                           const float* beta, int64_t n, int64_t c, int64_t spatial, float* y) {
  GRID_STRIDE(i, size_t(n * c * spatial)) {
    const int64_t ch = (static_cast<int64_t>(i) / spatial) % c;
    const math::BnAffine t = math::bn_affine(gamma[ch], beta[ch], stats[ch], stats[c + ch]);
    y[i] = math::bn_apply_one(t, x[i]);
  }
}

// One block per channel; out = [s1 (c), s2 (c)], dgamma/dbeta accumulated.
__global__ void __launch_bounds__(kBnThreads) k_bn_bwd_sums(const float* x, const float* dy, const float* stats,
                              const float* gamma, int64_t n, int64_t c, int64_t spatial,
                              double* out, float* dgamma, float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float m = stats[ch], is = stats[c + ch];
  const bool narrow = n * spatial <= INT32_MAX;
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < n * spatial; i += blockDim.x) {
    const int64_t off = channel_offset(i, c, ch, spatial, narrow);
    const double g = dy[off];
    a += g;
    b += g * static_cast<double>(math::bn_xhat(x[off], m, is));
  }
  block_sum2<kBnThreads>(a, b);
  if (threadIdx.x == 0) math::bn_backward_totals(a, b, gamma, c, ch, out, dgamma, dbeta);
}

// sums = [s1 (c), s2 (c)] as doubles; the CPU twin's arithmetic.
__global__ void k_bn_bwd_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                            const double* sums, double m, int64_t n, int64_t c, int64_t spatial,
                            float* dx) {
  GRID_STRIDE(i, size_t(n * c * spatial)) {
    const int64_t ch = (static_cast<int64_t>(i) / spatial) % c;
    const math::BnDx t =
        math::bn_dx_coeffs(stats[ch], stats[c + ch], gamma[ch], sums[ch], sums[c + ch], m);
    dx[i] = math::bn_dx_one(t, dy[i], x[i]);
  }
}

}  // namespace

void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, double* moments,
                     cudaStream_t s) {
  k_channel_moments<<<static_cast<unsigned>(c), kBnThreads, 0, s>>>(x, n, c, spatial, moments);
}

void bn_prepare(const double* moments, double count, double eps, double momentum, float* running,
                float* stats, int64_t c, cudaStream_t s) {
  k_bn_prepare<<<blocks_for(c), kThreads, 0, s>>>(moments, count, eps, momentum, running, stats, c);
}

void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta, int64_t n,
              int64_t c, int64_t spatial, float* y, cudaStream_t s) {
  const auto total = static_cast<size_t>(n * c * spatial);
  k_bn_apply<<<blocks_for(total), kThreads, 0, s>>>(x, stats, gamma, beta, n, c, spatial, y);
}

void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                      int64_t n, int64_t c, int64_t spatial, double* sums, float* dgamma,
                      float* dbeta, cudaStream_t s) {
  k_bn_bwd_sums<<<static_cast<unsigned>(c), kBnThreads, 0, s>>>(x, dy, stats, gamma, n, c,
                                                                spatial, sums, dgamma, dbeta);
}

void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                    const double* sums, double m, int64_t n, int64_t c, int64_t spatial, float* dx,
                    cudaStream_t s) {
  const auto total = static_cast<size_t>(n * c * spatial);
  k_bn_bwd_dx<<<blocks_for(total), kThreads, 0, s>>>(x, dy, stats, gamma, sums, m, n, c, spatial,
                                                     dx);
}

}  // namespace dtrain::kernels
