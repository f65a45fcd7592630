#pragma once
// Inverted-dropout masks from the counter-based hash (hash.hpp): element i depends only on
// (seed, i), the same bits as the CPU twin.
#include "dtrain/backend/cuda/kernels/common.cuh"
#include "dtrain/base/hash.hpp"

namespace dtrain::kernels {
namespace {

__global__ void k_dropout_mask(float* mask, size_t n, double p, float keep,
                               Param<uint64_t> seed_p) {
  const uint64_t seed = value_of(seed_p);
  GRID_STRIDE(i, n) mask[i] = dropout_value(seed, i, p, keep);
}

}  // namespace

void dropout_mask(float* mask, size_t n, double p, float keep, Param<uint64_t> seed,
                  cudaStream_t s) {
  k_dropout_mask<<<blocks_for(n), kThreads, 0, s>>>(mask, n, p, keep, seed);
}

}  // namespace dtrain::kernels
