#pragma once
// Causal multi-head self-attention, as llm.c arranges it: q, k and v are split out of qkv
// [rows, t, 3, heads, d] into [3][rows, heads, t, d], so that every product is one strided
// batched GEMM over (sample, head) pairs (CudaDevice issues those through cuBLAS); the causal
// softmax and its backward run one warp per row of scores, in place; the heads merge back into
// [rows, t, heads, d].
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// dst[part][r][h][i][e] = src[(r t + i) ld + part c + h d + e], c = heads d.
__global__ void k_split_heads(const float* src, int64_t ld, int parts, int64_t rows, int64_t t,
                              int64_t heads, int64_t d, float* dst) {
  const int64_t per = rows * heads * t * d;
  GRID_STRIDE(idx, size_t(parts * per)) {
    const auto el = static_cast<int64_t>(idx);
    const int64_t part = el / per, rest = el % per;
    const int64_t e = rest % d, i = (rest / d) % t, h = (rest / (d * t)) % heads,
                  r = rest / (d * t * heads);
    dst[el] = src[(r * t + i) * ld + part * heads * d + h * d + e];
  }
}

// The inverse: dst[(r t + i) ld + part c + h d + e] = src[part][r][h][i][e].
__global__ void k_merge_heads(const float* src, int parts, int64_t rows, int64_t t, int64_t heads,
                              int64_t d, float* dst, int64_t ld) {
  const int64_t per = rows * heads * t * d;
  GRID_STRIDE(idx, size_t(parts * per)) {
    const auto el = static_cast<int64_t>(idx);
    const int64_t part = el / per, rest = el % per;
    const int64_t e = rest % d, i = (rest / d) % t, h = (rest / (d * t)) % heads,
                  r = rest / (d * t * heads);
    dst[(r * t + i) * ld + part * heads * d + h * d + e] = src[el];
  }
}

// Row `row` of the scores (position i = row % t) becomes the softmax of its entries j <= i,
// 0 above the diagonal: the CPU twin's arithmetic (max, exp, sum, times 1 / sum), the max and
// the sum reduced across the warp.
__global__ void k_causal_softmax(float* att, int64_t nrows, int64_t t) {
  const int lane = threadIdx.x % kWarp;
  WARP_STRIDE(row, nrows) {
    float* s = att + row * t;
    const int64_t i = row % t;
    float mx = -INFINITY;
    for (int64_t j = lane; j <= i; j += kWarp) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int64_t j = lane; j <= i; j += kWarp) {
      const float e = math::exp_poly(s[j] - mx);
      s[j] = e;
      sum += e;
    }
    const float inv = 1.f / warp_sum(sum);
    for (int64_t j = lane; j < t; j += kWarp) s[j] = j <= i ? s[j] * inv : 0.f;
  }
}

// ds holds dP = dY V^T on entry and dS = P (dP - rowsum(dP P)) * scale on exit (0 above the
// diagonal), one warp per row.
__global__ void k_causal_softmax_backward(const float* att, float* ds, int64_t nrows, int64_t t,
                                          float scale) {
  const int lane = threadIdx.x % kWarp;
  WARP_STRIDE(row, nrows) {
    const float* p = att + row * t;
    float* g = ds + row * t;
    const int64_t i = row % t;
    float dot = 0.f;
    for (int64_t j = lane; j <= i; j += kWarp) dot += g[j] * p[j];
    dot = warp_sum(dot);
    for (int64_t j = lane; j < t; j += kWarp) g[j] = j <= i ? p[j] * (g[j] - dot) * scale : 0.f;
  }
}

}  // namespace

void split_heads(const float* src, int64_t ld, int parts, int64_t rows, int64_t t, int64_t heads,
                 int64_t d, float* dst, cudaStream_t s) {
  const auto total = static_cast<size_t>(parts * rows * heads * t * d);
  k_split_heads<<<blocks_for(total), kThreads, 0, s>>>(src, ld, parts, rows, t, heads, d, dst);
}

void merge_heads(const float* src, int parts, int64_t rows, int64_t t, int64_t heads, int64_t d,
                 float* dst, int64_t ld, cudaStream_t s) {
  const auto total = static_cast<size_t>(parts * rows * heads * t * d);
  k_merge_heads<<<blocks_for(total), kThreads, 0, s>>>(src, parts, rows, t, heads, d, dst, ld);
}

void causal_softmax(float* att, int64_t rows, int64_t t, cudaStream_t s) {
  k_causal_softmax<<<blocks_for(static_cast<size_t>(rows) * kWarp), kThreads, 0, s>>>(att, rows, t);
}

void causal_softmax_backward(const float* att, float* ds, int64_t rows, int64_t t, float scale,
                             cudaStream_t s) {
  k_causal_softmax_backward<<<blocks_for(static_cast<size_t>(rows) * kWarp), kThreads, 0, s>>>(
      att, ds, rows, t, scale);
}

}  // namespace dtrain::kernels
