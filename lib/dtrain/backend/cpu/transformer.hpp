#pragma once
// The CPU backend's transformer operations (Device's "transformer operations"), on the calling
// thread's OpenMP team of `threads`. Each output element is computed by one thread in a fixed
// order, so the bits do not depend on the thread count.
#include <cstdint>

#include "dtrain/backend/device.hpp"  // CpuGemm

namespace dtrain::cpu {

void embedding_forward(int threads, const float* tokens, int64_t stride, const float* wte,
                       const float* wpe, int64_t rows, int64_t t, int64_t c, int64_t vocab,
                       float* y);
void embedding_backward(int threads, const float* tokens, int64_t stride, const float* dy,
                        int64_t rows, int64_t t, int64_t c, int64_t vocab, float* dwte,
                        float* dwpe);
void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                 int32_t* labels);
void layernorm_forward(int threads, const float* x, const float* gamma, const float* beta,
                       int64_t n, int64_t c, float eps, float* y, float* stats);
void layernorm_backward(int threads, const float* x, const float* dy, const float* gamma,
                        const float* stats, int64_t n, int64_t c, float* dx, float* dgamma,
                        float* dbeta);
void attention_forward(int threads, CpuGemm gemm, const float* qkv, int64_t rows, int64_t t,
                       int64_t c, int64_t heads, float* att, float* y);
void attention_backward(int threads, CpuGemm gemm, const float* qkv, const float* att,
                        const float* dy, int64_t rows, int64_t t, int64_t c, int64_t heads,
                        float* dqkv);

}  // namespace dtrain::cpu
