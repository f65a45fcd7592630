#pragma once
// Bias of a dense layer: added to every row, and its gradient.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_add_bias(float* y, const float* b, size_t rows, size_t cols) {
  GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

// Column sums of dy (rows x cols): a block takes kBiasCols columns; its kBiasLanes lanes of a
// column each sum the rows lane, lane + kBiasLanes, ... in order, and lane 0 adds the lanes' sums
// in lane order. A fixed order (it depends on rows and cols only), so every call gives the same
// bits. Reads are coalesced along a row. One thread per column, as this kernel first was, left
// 1 of 132 SMs busy on the quickstart MLP and took 110 us at 1024 rows (ncu, H100).
constexpr int kBiasCols = 32, kBiasLanes = 16;

__global__ void k_bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool acc) {
  __shared__ float part[kBiasLanes][kBiasCols + 1];
  const int tx = threadIdx.x, lane = threadIdx.y;
  for (int64_t c0 = int64_t(blockIdx.x) * kBiasCols; c0 < cols;
       c0 += int64_t(gridDim.x) * kBiasCols) {
    const int64_t c = c0 + tx;
    float s = 0.f;
    if (c < cols)
      for (int64_t r = lane; r < rows; r += kBiasLanes) s += dy[r * cols + c];
    part[lane][tx] = s;
    __syncthreads();
    if (lane == 0 && c < cols) {
      float t = 0.f;
      for (int l = 0; l < kBiasLanes; ++l) t += part[l][tx];
      db[c] = acc ? db[c] + t : t;
    }
    __syncthreads();
  }
}

}  // namespace

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  const auto n = static_cast<size_t>(rows * cols);
  k_add_bias<<<blocks_for(n), kThreads, 0, s>>>(y, bias, rows, cols);
}

void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
               cudaStream_t s) {
  const auto tiles = std::min<int64_t>((cols + kBiasCols - 1) / kBiasCols, 65535);
  k_bias_grad<<<static_cast<unsigned>(std::max<int64_t>(tiles, 1)), dim3(kBiasCols, kBiasLanes), 0, s>>>(
      dy, db, rows, cols, accumulate);
}

}  // namespace dtrain::kernels
