#pragma once
// Batch assembly on the device: rows gathered by (staged) indices, and the augmentation of
// hash.hpp (random crop and flip drawn per sample from the counter-based hash).
#include "dtrain/backend/cuda/kernels/common.cuh"
#include "dtrain/base/hash.hpp"

namespace dtrain::kernels {
namespace {

__global__ void k_gather(const float* src, const int32_t* src_labels, int64_t features,
                         const int64_t* idx, int64_t count, float* dst, int32_t* dst_labels) {
  GRID_STRIDE(i, size_t(count * features)) {
    const int64_t r = static_cast<int64_t>(i) / features, f = static_cast<int64_t>(i) % features;
    dst[i] = src[idx[r] * features + f];
    if (f == 0) dst_labels[r] = src_labels[idx[r]];
  }
}

__global__ void k_augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w,
                          int64_t pad, bool reflect, bool flip, Param<uint64_t> seed_p) {
  const int64_t f = c * h * w;
  const uint64_t seed = value_of(seed_p);
  GRID_STRIDE(i, size_t(rows * f)) {
    const int64_t n = static_cast<int64_t>(i) / f, e = static_cast<int64_t>(i) % f;
    const AugmentDraw a = augment_draw(seed, n, pad, flip);
    const int64_t src = augment_source(a, e / (h * w), (e / w) % h, e % w, h, w, reflect);
    y[i] = src >= 0 ? x[n * f + src] : 0.f;
  }
}

}  // namespace

void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
            int64_t count, float* dst, int32_t* dst_labels, cudaStream_t s) {
  const auto n = static_cast<size_t>(count * features);
  k_gather<<<blocks_for(n), kThreads, 0, s>>>(src, src_labels, features, idx, count, dst,
                                              dst_labels);
}

void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w, int64_t pad,
             bool reflect, bool flip, Param<uint64_t> seed, cudaStream_t s) {
  const auto n = static_cast<size_t>(rows * c * h * w);
  k_augment<<<blocks_for(n), kThreads, 0, s>>>(x, y, rows, c, h, w, pad, reflect, flip, seed);
}

}  // namespace dtrain::kernels
