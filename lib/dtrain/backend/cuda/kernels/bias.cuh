#pragma once
// Bias of a dense layer: added to every row, and its gradient.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_add_bias(float* y, const float* b, size_t rows, size_t cols) {
  GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

// One thread per column (grid-stride: any number of columns).
__global__ void k_bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool acc) {
  GRID_STRIDE(ci, size_t(cols)) {
    const auto c = static_cast<int64_t>(ci);
    float s = 0.f;  // rows in order, as on the CPU
    for (int64_t r = 0; r < rows; ++r) s += dy[r * cols + c];
    db[c] = acc ? db[c] + s : s;
  }
}

}  // namespace

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  const auto n = static_cast<size_t>(rows * cols);
  k_add_bias<<<blocks_for(n), kThreads, 0, s>>>(y, bias, rows, cols);
}

void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
               cudaStream_t s) {
  k_bias_grad<<<blocks_for(cols), kThreads, 0, s>>>(dy, db, rows, cols, accumulate);
}

}  // namespace dtrain::kernels
