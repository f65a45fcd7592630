#pragma once
// Max pooling: the window maximum of math.hpp forward; backward gathers, per input position,
// the outputs whose window chose it (math::pool_cover). Index arithmetic in I: 32 bits where
// the sizes allow, since ncu put the 64-bit divisions of the first version at 436 us for the
// CNN's first pool backward at batch 1024 (H200), 11% of the step.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

template <class I>
__global__ void k_maxpool_fwd(const float* x, I planes, I h, I w, I k, I stride, I pad, I ho,
                              I wo, float* y, int32_t* argmax) {
  const I total = planes * ho * wo;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I p = i / (ho * wo), o = i - p * (ho * wo), oi = o / wo;
    const math::PoolMax m = math::maxpool_window(x + int64_t(p) * h * w, h, w, k, stride, pad,
                                                 oi, o - oi * wo);
    y[i] = m.value;
    argmax[i] = static_cast<int32_t>(m.index);
  }
}

// One thread per input position sums, in output order, the outputs whose window chose it (no
// atomics, so the result is deterministic even for overlapping windows, and the CPU twin's
// order of additions).
template <class I>
__global__ void k_maxpool_bwd(const float* dy, const int32_t* argmax, I planes, I h, I w, I k,
                              I stride, I pad, I ho, I wo, float* dx) {
  const I total = planes * h * w;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I p = i / (h * w), q = i - p * (h * w), r = q / w;
    const math::PoolCover<I> rows = math::pool_cover<I>(r + pad, k, stride, ho);
    const math::PoolCover<I> cols = math::pool_cover<I>(q - r * w + pad, k, stride, wo);
    float s = 0.f;
    for (I oi = rows.lo; oi <= rows.hi; ++oi)
      for (I oj = cols.lo; oj <= cols.hi; ++oj) {
        const I o = (p * ho + oi) * wo + oj;
        if (argmax[o] == static_cast<int32_t>(q)) s += dy[o];
      }
    dx[i] = s;
  }
}

}  // namespace

void maxpool_forward(const float* x, int64_t planes, int64_t h, int64_t w, int64_t k,
                     int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* y,
                     int32_t* argmax, cudaStream_t s) {
  const int64_t in = planes * h * w, out = planes * ho * wo;
  const unsigned blocks = blocks_for(static_cast<size_t>(out));
  if (fits_u32(in) && fits_u32(out)) {
    const auto u = [](int64_t v) { return static_cast<uint32_t>(v); };
    k_maxpool_fwd<uint32_t><<<blocks, kThreads, 0, s>>>(x, u(planes), u(h), u(w), u(k),
                                                        u(stride), u(pad), u(ho), u(wo), y, argmax);
  } else {
    k_maxpool_fwd<int64_t><<<blocks, kThreads, 0, s>>>(x, planes, h, w, k, stride, pad, ho, wo, y,
                                                       argmax);
  }
}

void maxpool_backward(const float* dy, const int32_t* argmax, int64_t planes, int64_t h, int64_t w,
                      int64_t k, int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* dx,
                      cudaStream_t s) {
  const int64_t in = planes * h * w, out = planes * ho * wo;
  const unsigned blocks = blocks_for(static_cast<size_t>(in));
  if (fits_u32(in) && fits_u32(out)) {
    const auto u = [](int64_t v) { return static_cast<uint32_t>(v); };
    k_maxpool_bwd<uint32_t><<<blocks, kThreads, 0, s>>>(dy, argmax, u(planes), u(h), u(w), u(k),
                                                        u(stride), u(pad), u(ho), u(wo), dx);
  } else {
    k_maxpool_bwd<int64_t><<<blocks, kThreads, 0, s>>>(dy, argmax, planes, h, w, k, stride, pad,
                                                       ho, wo, dx);
  }
}

}  // namespace dtrain::kernels
