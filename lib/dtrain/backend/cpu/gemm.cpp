#include "dtrain/backend/cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <atomic>

#include "dtrain/base/log.hpp"

#if DTRAIN_HAVE_DNNL
#include <dnnl.h>
#endif

namespace dtrain::cpu {

void sgemm(CpuGemm lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
#if DTRAIN_HAVE_DNNL
  if (lib == CpuGemm::onednn) {
    // oneDNN runs a product on as many OpenMP threads as the calling thread may start; one here.
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const dnnl_status_t st =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    omp_set_num_threads(saved);
    if (st == dnnl_success) return;
    // Most calls run inside an OpenMP region, which no exception may leave; oneDNN fails only
    // where it cannot allocate its packing buffers. C is untouched then: OpenBLAS computes it.
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log().warn("oneDNN's sgemm failed (status {}, {}x{}x{}); OpenBLAS computes the products "
                 "it refuses", static_cast<int>(st), m, n, k);
  }
#endif
  (void)lib;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

}  // namespace dtrain::cpu
