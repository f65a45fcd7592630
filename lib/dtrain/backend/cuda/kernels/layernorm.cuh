#pragma once
// LayerNorm over the last dimension (c features) of n vectors: one warp per vector for the
// statistics, the output and dx (math.hpp's two-pass sums in double, reduced across the warp:
// the CPU twin adds the same terms in a different order); dgamma and dbeta per channel over the
// vectors in ascending order, as the CPU twin, from tiles staged in shared memory.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// stats[2v], [2v + 1] = mean, rstd (math::layernorm_stats); y = math::layernorm_one.
__global__ void k_layernorm_forward(const float* x, const float* gamma, const float* beta,
                                    int64_t n, int64_t c, float eps, float* y, float* stats) {
  const int lane = threadIdx.x % kWarp;
  WARP_STRIDE(v, n) {
    const float* in = x + v * c;
    double s = 0.0;
    for (int64_t i = lane; i < c; i += kWarp) s += static_cast<double>(in[i]);
    const double mean = warp_sum(s) / static_cast<double>(c);
    double q = 0.0;
    for (int64_t i = lane; i < c; i += kWarp) {
      const double d = static_cast<double>(in[i]) - mean;
      q += d * d;
    }
    const double var = warp_sum(q) / static_cast<double>(c);
    const float m = static_cast<float>(mean);
    const float rstd = static_cast<float>(1.0 / ::sqrt(var + static_cast<double>(eps)));
    float* out = y + v * c;
    for (int64_t i = lane; i < c; i += kWarp)
      out[i] = math::layernorm_one(in[i], m, rstd, gamma[i], beta[i]);
    if (lane == 0) {
      stats[2 * v] = m;
      stats[2 * v + 1] = rstd;
    }
  }
}

// dx of each vector: math::layernorm_back_means's sums across the warp, then
// math::layernorm_dx_one per element.
__global__ void k_layernorm_dx(const float* x, const float* dy, const float* gamma,
                               const float* stats, int64_t n, int64_t c, float* dx) {
  const int lane = threadIdx.x % kWarp;
  WARP_STRIDE(v, n) {
    const float *in = x + v * c, *g = dy + v * c;
    const float mean = stats[2 * v], rstd = stats[2 * v + 1];
    double a = 0.0, b = 0.0;
    for (int64_t i = lane; i < c; i += kWarp) {
      const double gi = static_cast<double>(g[i] * gamma[i]);
      a += gi;
      b += gi * static_cast<double>((in[i] - mean) * rstd);
    }
    const math::LnBackMeans m{static_cast<float>(warp_sum(a) / static_cast<double>(c)),
                              static_cast<float>(warp_sum(b) / static_cast<double>(c))};
    float* out = dx + v * c;
    for (int64_t i = lane; i < c; i += kWarp)
      out[i] = math::layernorm_dx_one(in[i], g[i], gamma[i], mean, rstd, m);
  }
}

// dgamma += sum of dy * xhat, dbeta += sum of dy, per channel, the vectors in ascending order
// (the CPU twin's order, one add per vector onto the old value). A block takes kLnCols
// channels; its kLnLanes rows of threads stage kLnTile vectors' terms in shared memory
// (coalesced, many loads in flight), then the first row of threads adds them in order.
constexpr int kLnCols = 32, kLnLanes = 8, kLnTile = 128;

__global__ void k_layernorm_dparams(const float* x, const float* dy, const float* stats, int64_t n,
                                    int64_t c, float* dgamma, float* dbeta) {
  __shared__ float tg[kLnTile][kLnCols + 1], tb[kLnTile][kLnCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t c0 = int64_t(blockIdx.x) * kLnCols; c0 < c; c0 += int64_t(gridDim.x) * kLnCols) {
    const int64_t ch = c0 + tx;
    float ag = 0.f, ab = 0.f;
    if (ty == 0 && ch < c) {
      ag = dgamma[ch];
      ab = dbeta[ch];
    }
    for (int64_t v0 = 0; v0 < n; v0 += kLnTile) {
      const int rows = n - v0 < kLnTile ? static_cast<int>(n - v0) : kLnTile;
      for (int q = ty; q < rows && ch < c; q += kLnLanes) {
        const int64_t off = (v0 + q) * c + ch;
        const float mean = stats[2 * (v0 + q)], rstd = stats[2 * (v0 + q) + 1];
        const float xhat = (x[off] - mean) * rstd;
        tg[q][tx] = __fmul_rn(dy[off], xhat);  // rounded, as the CPU's product
        tb[q][tx] = dy[off];
      }
      __syncthreads();
      if (ty == 0 && ch < c)
        for (int q = 0; q < rows; ++q) {
          ag += tg[q][tx];
          ab += tb[q][tx];
        }
      __syncthreads();
    }
    if (ty == 0 && ch < c) {
      dgamma[ch] = ag;
      dbeta[ch] = ab;
    }
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                       float eps, float* y, float* stats, cudaStream_t s) {
  k_layernorm_forward<<<blocks_for(static_cast<size_t>(n) * kWarp), kThreads, 0, s>>>(
      x, gamma, beta, n, c, eps, y, stats);
}

void layernorm_dx(const float* x, const float* dy, const float* gamma, const float* stats,
                  int64_t n, int64_t c, float* dx, cudaStream_t s) {
  k_layernorm_dx<<<blocks_for(static_cast<size_t>(n) * kWarp), kThreads, 0, s>>>(x, dy, gamma,
                                                                                 stats, n, c, dx);
}

void layernorm_dparams(const float* x, const float* dy, const float* stats, int64_t n, int64_t c,
                       float* dgamma, float* dbeta, cudaStream_t s) {
  const auto tiles = std::min<int64_t>((c + kLnCols - 1) / kLnCols, 65535);
  k_layernorm_dparams<<<static_cast<unsigned>(std::max<int64_t>(tiles, 1)), dim3(kLnCols, kLnLanes),
                        0, s>>>(x, dy, stats, n, c, dgamma, dbeta);
}

}  // namespace dtrain::kernels
