#include "dtrain/backend/cpu/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dtrain/backend/cpu/gemm.hpp"
#include "dtrain/backend/cpu/loops.hpp"
#include "dtrain/backend/math.hpp"

namespace dtrain::cpu {

namespace {

// LayerNorm's rows: y and the statistics from x, dx from dy, and the sums of dgamma and dbeta,
// in the clone for this machine (loops.hpp), math.hpp's sums in their fixed lane order.
DTRAIN_CPU_CLONES math::LnStats layernorm_row(const float* x, const float* gamma,
                                              const float* beta, int64_t c, float eps, float* y) {
  const math::LnStats s = math::layernorm_stats(x, c, eps);
  for (int64_t k = 0; k < c; ++k)
    y[k] = math::layernorm_one(x[k], s.mean, s.rstd, gamma[k], beta[k]);
  return s;
}
DTRAIN_CPU_CLONES void layernorm_dx_row(const float* x, const float* dy, const float* gamma,
                                        int64_t c, float mean, float rstd, float* dx) {
  const math::LnBackMeans m = math::layernorm_back_means(x, dy, gamma, c, mean, rstd);
  for (int64_t k = 0; k < c; ++k)
    dx[k] = math::layernorm_dx_one(x[k], dy[k], gamma[k], mean, rstd, m);
}
DTRAIN_CPU_CLONES void layernorm_param_row(const float* x, const float* dy, int64_t c, float mean,
                                           float rstd, float* dgamma, float* dbeta) {
  for (int64_t k = 0; k < c; ++k) {
    dgamma[k] += dy[k] * ((x[k] - mean) * rstd);
    dbeta[k] += dy[k];
  }
}

// Row i of the scores becomes the softmax of its entries j <= i, 0 after: the max, e^(s - max)
// (math::exp_poly, which vectorises, as the CUDA twin), their sum in order, times 1 / sum.
DTRAIN_CPU_CLONES void causal_softmax_row(float* row, int64_t i, int64_t t) {
  float mx = row[0];
  for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
  for (int64_t j = 0; j <= i; ++j) row[j] = math::exp_poly(row[j] - mx);
  float sum = 0.f;
  for (int64_t j = 0; j <= i; ++j) sum += row[j];
  const float inv = 1.f / sum;
  for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
  std::fill(row + i + 1, row + t, 0.f);
}

// The causal products of one (sample, head), in row blocks of kCausalBlock: the row block
// [i0, i1) meets the positions [0, i1) only, those after i1 being masked for every row in it.
// At t = 128 this skips 37.5% of the full t x t products' multiply-adds, all of them terms
// that P and dS hold as zeros. Scores and probabilities are t x t (leading dimension t).
constexpr int64_t kCausalBlock = 32;

// S[i0:i1, 0:i1] = alpha A[i0:i1] B[0:i1]^T, A and B t x d: the scores q k^T, and dP = dy v^T.
void causal_scores(CpuGemm gemm, int64_t t, int64_t d, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* s) {
  for (int64_t i0 = 0; i0 < t; i0 += kCausalBlock) {
    const int64_t i1 = std::min(t, i0 + kCausalBlock);
    sgemm(gemm, false, true, i1 - i0, i1, d, alpha, a + i0 * lda, lda, b, ldb, 0.f, s + i0 * t, t);
  }
}

// Y[i0:i1] = P[i0:i1, 0:i1] B[0:i1], P zero after the diagonal: y = P v, and dq = dS k.
void causal_apply(CpuGemm gemm, int64_t t, int64_t d, const float* p, const float* b,
                  int64_t ldb, float* y, int64_t ldy) {
  for (int64_t i0 = 0; i0 < t; i0 += kCausalBlock) {
    const int64_t i1 = std::min(t, i0 + kCausalBlock);
    sgemm(gemm, false, false, i1 - i0, d, i1, 1.f, p + i0 * t, t, b, ldb, 0.f, y + i0 * ldy, ldy);
  }
}

// Y[j0:j1] = P[j0:t, j0:j1]^T B[j0:t], P zero after the diagonal: dv = P^T dy, and dk = dS^T q.
void causal_apply_t(CpuGemm gemm, int64_t t, int64_t d, const float* p, const float* b,
                    int64_t ldb, float* y, int64_t ldy) {
  for (int64_t j0 = 0; j0 < t; j0 += kCausalBlock) {
    const int64_t j1 = std::min(t, j0 + kCausalBlock);
    sgemm(gemm, true, false, j1 - j0, d, t - j0, 1.f, p + j0 * t + j0, t, b + j0 * ldb, ldb, 0.f,
          y + j0 * ldy, ldy);
  }
}

// The scale of the scores, 1/sqrt(d), as the CUDA twin computes it.
float score_scale(int64_t d) {
  return 1.f / std::sqrt(static_cast<float>(d));
}

}  // namespace

void embedding_forward(int threads, const float* tokens, int64_t stride, const float* wte,
                       const float* wpe, int64_t rows, int64_t t, int64_t c, int64_t vocab,
                       float* y) {
#pragma omp parallel for num_threads(team(threads, rows * t * c)) schedule(static)
  for (int64_t p = 0; p < rows * t; ++p) {
    const int64_t r = p / t, i = p % t;
    const float* e = wte + math::token_id(tokens[r * stride + i], vocab) * c;
    const float* q = wpe + i * c;
    float* out = y + p * c;
    for (int64_t k = 0; k < c; ++k) out[k] = e[k] + q[k];
  }
}

void embedding_backward(int threads, const float* tokens, int64_t stride, const float* dy,
                        int64_t rows, int64_t t, int64_t c, int64_t vocab, float* dwte,
                        float* dwpe) {
  // Channels split among threads: each element of dwte and dwpe is summed by one thread, over
  // samples and then positions, in ascending order.
  const int nt = team(threads, rows * t * c);
  const int64_t block = (c + nt - 1) / nt;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int part = 0; part < nt; ++part) {
    const int64_t lo = part * block, hi = std::min(c, lo + block);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < t; ++i) {
        const float* g = dy + (r * t + i) * c;
        float* e = dwte + math::token_id(tokens[r * stride + i], vocab) * c;
        float* q = dwpe + i * c;
        for (int64_t k = lo; k < hi; ++k) {
          e[k] += g[k];
          q[k] += g[k];
        }
      }
  }
}

void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                 int32_t* labels) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < t; ++i)
      labels[r * t + i] = static_cast<int32_t>(math::token_id(tokens[r * stride + i + 1], vocab));
}

void layernorm_forward(int threads, const float* x, const float* gamma, const float* beta,
                       int64_t n, int64_t c, float eps, float* y, float* stats) {
#pragma omp parallel for num_threads(team(threads, n * c)) schedule(static)
  for (int64_t v = 0; v < n; ++v) {
    const math::LnStats s = layernorm_row(x + v * c, gamma, beta, c, eps, y + v * c);
    stats[2 * v] = s.mean;
    stats[2 * v + 1] = s.rstd;
  }
}

void layernorm_backward(int threads, const float* x, const float* dy, const float* gamma,
                        const float* stats, int64_t n, int64_t c, float* dx, float* dgamma,
                        float* dbeta) {
  const int nt = team(threads, n * c);
  if (dx) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t v = 0; v < n; ++v) {
      layernorm_dx_row(x + v * c, dy + v * c, gamma, c, stats[2 * v], stats[2 * v + 1], dx + v * c);
    }
  }
  // dgamma and dbeta: channels split among threads, vectors in ascending order.
  const int64_t block = (c + nt - 1) / nt;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int part = 0; part < nt; ++part) {
    const int64_t lo = part * block, hi = std::min(c, lo + block);
    if (lo >= hi) continue;
    for (int64_t v = 0; v < n; ++v) {
      layernorm_param_row(x + v * c + lo, dy + v * c + lo, hi - lo, stats[2 * v], stats[2 * v + 1],
                          dgamma + lo, dbeta + lo);
    }
  }
}

// One (sample, head) pair per iteration: S = q k^T * scale (GEMMs by row block), the causal
// softmax row by row, then y = P v (GEMMs by row block); att keeps P.
void attention_forward(int threads, CpuGemm gemm, const float* qkv, int64_t rows, int64_t t,
                       int64_t c, int64_t heads, float* att, float* y) {
  const int64_t d = c / heads, ld = 3 * c;
  const float scale = score_scale(d);
#pragma omp parallel for num_threads(team(threads, rows * heads * t * t)) schedule(static)
  for (int64_t p = 0; p < rows * heads; ++p) {
    const int64_t r = p / heads, h = p % heads;
    const float* q = qkv + r * t * ld + h * d;
    float* s = att + p * t * t;
    causal_scores(gemm, t, d, scale, q, ld, q + c, ld, s);
    for (int64_t i = 0; i < t; ++i) causal_softmax_row(s + i * t, i, t);
    causal_apply(gemm, t, d, s, q + 2 * c, ld, y + r * t * c + h * d, c);
  }
}

// dP = dy v^T, dv = P^T dy, dS = P (dP - rowsum(dP P)) * scale, dq = dS k, dk = dS^T q.
void attention_backward(int threads, CpuGemm gemm, const float* qkv, const float* att,
                        const float* dy, int64_t rows, int64_t t, int64_t c, int64_t heads,
                        float* dqkv) {
  const int64_t d = c / heads, ld = 3 * c;
  const float scale = score_scale(d);
  const int nt = team(threads, rows * heads * t * t);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t p = 0; p < rows * heads; ++p) {
    // dP, then dS: one t x t scratch per thread, kept across calls (OpenMP's threads persist),
    // so a training step allocates nothing here.
    thread_local std::vector<float> ds;
    if (ds.size() < static_cast<size_t>(t * t)) ds.resize(static_cast<size_t>(t * t));
    const int64_t r = p / heads, h = p % heads;
    const float* q = qkv + r * t * ld + h * d;
    const float* prob = att + p * t * t;
    const float* g = dy + r * t * c + h * d;
    float* dq = dqkv + r * t * ld + h * d;
    causal_scores(gemm, t, d, 1.f, g, c, q + 2 * c, ld, ds.data());
    causal_apply_t(gemm, t, d, prob, g, c, dq + 2 * c, ld);
    for (int64_t i = 0; i < t; ++i) {
      const float* pr = prob + i * t;
      float* row = ds.data() + i * t;
      float dot = 0.f;
      for (int64_t j = 0; j <= i; ++j) dot += row[j] * pr[j];
      for (int64_t j = 0; j <= i; ++j) row[j] = pr[j] * (row[j] - dot) * scale;
      std::fill(row + i + 1, row + t, 0.f);
    }
    causal_apply(gemm, t, d, ds.data(), q + c, ld, dq, ld);
    causal_apply_t(gemm, t, d, ds.data(), q, ld, dq + c, ld);
  }
}

}  // namespace dtrain::cpu
