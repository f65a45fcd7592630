#pragma once
// The CPU backend's one matrix product, through OpenBLAS or oneDNN (CpuGemm).
#include <cstdint>

#include "dtrain/backend/device.hpp"

namespace dtrain::cpu {

// C = alpha op(A) op(B) + beta C, row-major, on the calling thread alone: callers split large
// products among their own OpenMP team, each element of C summed by one call. Never throws (it
// runs inside OpenMP regions): where oneDNN refuses a product, OpenBLAS computes it.
void sgemm(CpuGemm lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

}  // namespace dtrain::cpu
