#pragma once
// Max pooling: the window maximum of math.hpp forward; backward gathers, per input position,
// the outputs whose window chose it.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_maxpool_fwd(const float* x, int64_t planes, int64_t h, int64_t w, int64_t k,
                              int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* y,
                              int32_t* argmax) {
  GRID_STRIDE(i, size_t(planes * ho * wo)) {
    const int64_t p = static_cast<int64_t>(i) / (ho * wo), o = static_cast<int64_t>(i) % (ho * wo);
    const math::PoolMax m =
        math::maxpool_window(x + p * h * w, h, w, k, stride, pad, o / wo, o % wo);
    y[i] = m.value;
    argmax[i] = static_cast<int32_t>(m.index);
  }
}

// One thread per input position gathers the outputs whose window chose it (no atomics, so the
// result is deterministic even for overlapping windows).
__global__ void k_maxpool_bwd(const float* dy, const int32_t* argmax, int64_t planes, int64_t h,
                              int64_t w, int64_t k, int64_t stride, int64_t pad, int64_t ho,
                              int64_t wo, float* dx) {
  GRID_STRIDE(i, size_t(planes * h * w)) {
    const int64_t p = static_cast<int64_t>(i) / (h * w), q = static_cast<int64_t>(i) % (h * w);
    // The position in the padded plane: output oi's window covers [oi*stride, oi*stride + k).
    const int64_t ii = q / w + pad, jj = q % w + pad;
    const int64_t oi_lo = ii >= k ? (ii - k) / stride + 1 : 0;
    const int64_t oj_lo = jj >= k ? (jj - k) / stride + 1 : 0;
    const int64_t oi_hi = ii / stride < ho - 1 ? ii / stride : ho - 1;
    const int64_t oj_hi = jj / stride < wo - 1 ? jj / stride : wo - 1;
    float s = 0.f;
    for (int64_t oi = oi_lo; oi <= oi_hi; ++oi)
      for (int64_t oj = oj_lo; oj <= oj_hi; ++oj) {
        const int64_t o = (p * ho + oi) * wo + oj;
        if (argmax[o] == q) s += dy[o];
      }
    dx[i] = s;
  }
}

}  // namespace

void maxpool_forward(const float* x, int64_t planes, int64_t h, int64_t w, int64_t k,
                     int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* y,
                     int32_t* argmax, cudaStream_t s) {
  const auto total = static_cast<size_t>(planes * ho * wo);
  k_maxpool_fwd<<<blocks_for(total), kThreads, 0, s>>>(x, planes, h, w, k, stride, pad, ho, wo, y,
                                                       argmax);
}

void maxpool_backward(const float* dy, const int32_t* argmax, int64_t planes, int64_t h, int64_t w,
                      int64_t k, int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* dx,
                      cudaStream_t s) {
  const auto total = static_cast<size_t>(planes * h * w);
  k_maxpool_bwd<<<blocks_for(total), kThreads, 0, s>>>(dy, argmax, planes, h, w, k, stride, pad,
                                                       ho, wo, dx);
}

}  // namespace dtrain::kernels
