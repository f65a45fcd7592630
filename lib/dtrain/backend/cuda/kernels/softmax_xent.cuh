#pragma once
// Softmax cross-entropy: one thread per row (math::softmax_xent_row, in double like the CPU
// twin), then one block sums the rows' (loss, hit) pairs and scales the sums (stat_scale).
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// One thread per row (grid-stride: any number of rows); row r's loss and hit go to
// row_stats[2r], [2r + 1].
__global__ void k_softmax_xent(const float* logits, const int32_t* labels, int64_t rows,
                               int64_t classes, float grad_scale, float* dlogits,
                               double* row_stats, double smoothing) {
  GRID_STRIDE(ri, size_t(rows)) {
    const auto r = static_cast<int64_t>(ri);
    float* d = dlogits ? dlogits + r * classes : nullptr;
    const math::XentRow row =
        math::softmax_xent_row(logits + r * classes, labels[r], classes, grad_scale, d, smoothing);
    row_stats[2 * r] = row.loss;
    row_stats[2 * r + 1] = row.hit ? 1.0 : 0.0;
  }
}

// Sums `rows` (loss, hit) pairs in one block and adds them, times `scale`, to out[0..1].
__global__ void k_sum_pairs(const double* v, int64_t rows, double* out, double scale) {
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    a += v[2 * i];
    b += v[2 * i + 1];
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    out[0] += a * scale;
    out[1] += b * scale;
  }
}

}  // namespace

void softmax_xent_rows(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                       float grad_scale, float* dlogits, double* row_stats, double smoothing,
                       cudaStream_t s) {
  k_softmax_xent<<<blocks_for(rows), kThreads, 0, s>>>(logits, labels, rows, classes, grad_scale,
                                                       dlogits, row_stats, smoothing);
}

void sum_pairs(const double* row_stats, int64_t rows, double* out, double scale,
               cudaStream_t s) {
  k_sum_pairs<<<1, kThreads, 0, s>>>(row_stats, rows, out, scale);
}

}  // namespace dtrain::kernels
