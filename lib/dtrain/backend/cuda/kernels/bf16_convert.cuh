#pragma once
// precision: bf16: GEMM and convolution operands to bfloat16 (round to nearest even, what
// round_bf16 does on the CPU), and bf16 results back to fp32.
#include <cuda_bf16.h>

#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// Stored rows x cols matrix (leading dimension ld) to bfloat16.
__global__ void k_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                          __nv_bfloat16* dst) {
  GRID_STRIDE(i, size_t(rows * cols)) {
    const int64_t at = (static_cast<int64_t>(i) / cols) * ld + static_cast<int64_t>(i) % cols;
    dst[at] = __float2bfloat16_rn(src[at]);
  }
}
// The same for a matrix stored without gaps (ld == cols, or one row), the usual case: no 64-bit
// division and remainder per element to find its place.
__global__ void k_to_bf16_flat(const float* src, size_t n, __nv_bfloat16* dst) {
  GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

// Each matrix of a batch transposed as it is cast: NCHW's C x HW planes to NHWC's HW x C for
// cuDNN's bf16 engines, which work in NHWC, and back; a filter's OC x C x KK to OC x KK x C
// likewise. One pass where a cast and then cuDNN's own transpose took two (43% of ResNet-18's
// bf16 kernel time went to the pair on an H200). 32 x 32 tiles go through shared memory so that
// both the reads and the writes are coalesced; the grid strides over tiles and matrices.
constexpr int kTile = 32, kTileRows = 8;

__device__ inline float as_float(float v) {
  return v;
}
__device__ inline float as_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

struct StoreBf16 {
  __nv_bfloat16* dst;
  __device__ void operator()(int64_t at, float v) const { dst[at] = __float2bfloat16_rn(v); }
};
struct StoreFloat {
  float* dst;
  bool accumulate;
  __device__ void operator()(int64_t at, float v) const { dst[at] = accumulate ? dst[at] + v : v; }
};

// dst[b][j][i] = store(src[b][i][j]) for each of `batch` rows x cols matrices.
template <class In, class Store>
__global__ void k_transposed_cast(const In* src, int64_t batch, int64_t rows, int64_t cols,
                                  Store store) {
  __shared__ float tile[kTile][kTile + 1];  // +1: a column's reads fall in different banks
  const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  const int x = static_cast<int>(threadIdx.x);
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z)
    for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y)
      for (int64_t tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
        const int64_t i0 = tr * kTile, j0 = tc * kTile, base = b * rows * cols;
        for (int r = static_cast<int>(threadIdx.y); r < kTile; r += kTileRows)
          if (i0 + r < rows && j0 + x < cols)
            tile[r][x] = as_float(src[base + (i0 + r) * cols + j0 + x]);
        __syncthreads();
        for (int r = static_cast<int>(threadIdx.y); r < kTile; r += kTileRows)
          if (j0 + r < cols && i0 + x < rows) store(base + (j0 + r) * rows + i0 + x, tile[x][r]);
        __syncthreads();  // the tile is refilled next
      }
}

template <class In, class Store>
void launch_transposed_cast(const In* src, int64_t batch, int64_t rows, int64_t cols, Store store,
                            cudaStream_t s) {
  const auto cap = [](int64_t v) { return static_cast<unsigned>(std::min<int64_t>(v, 65535)); };
  const dim3 grid(cap((cols + kTile - 1) / kTile), cap((rows + kTile - 1) / kTile), cap(batch));
  k_transposed_cast<<<grid, dim3(kTile, kTileRows), 0, s>>>(src, batch, rows, cols, store);
}

static_assert(sizeof(__nv_bfloat16) == sizeof(Bf16), "bfloat16 is stored in 16 bits");

}  // namespace

void to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, Bf16* dst, cudaStream_t s) {
  if (ld == cols || rows == 1) {
    const auto n = static_cast<size_t>(rows * cols);
    k_to_bf16_flat<<<blocks_for(n), kThreads, 0, s>>>(src, n,
                                                      reinterpret_cast<__nv_bfloat16*>(dst));
    return;
  }
  k_to_bf16<<<blocks_for(static_cast<size_t>(rows * cols)), kThreads, 0, s>>>(
      src, rows, cols, ld, reinterpret_cast<__nv_bfloat16*>(dst));
}

void to_bf16_nhwc(const float* src, int64_t n, int64_t c, int64_t hw, Bf16* dst, cudaStream_t s) {
  if (n * c * hw == 0) return;
  launch_transposed_cast(src, n, c, hw, StoreBf16{reinterpret_cast<__nv_bfloat16*>(dst)}, s);
}

void from_bf16_nhwc(const Bf16* src, int64_t n, int64_t c, int64_t hw, float* dst, bool accumulate,
                    cudaStream_t s) {
  if (n * c * hw == 0) return;
  launch_transposed_cast(reinterpret_cast<const __nv_bfloat16*>(src), n, hw, c,
                         StoreFloat{dst, accumulate}, s);
}

}  // namespace dtrain::kernels
