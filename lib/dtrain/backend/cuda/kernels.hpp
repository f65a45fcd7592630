#pragma once
// The launchers of dtrain's own CUDA kernels, for host code the host compiler builds. The
// kernels and their launchers live in kernels/*.cuh, one operation family a file, compiled by
// nvcc in kernels.cu; this header is plain C++ but for cudaStream_t.
//
// A launcher queues its kernel on `s` with the kernel's launch configuration and returns at
// once. It neither checks for launch errors nor counts the launch: the caller (CudaDevice)
// does both, one kernel per launcher call. Every pointer is device memory; sizes that are
// zero are the caller's to skip (a grid of no blocks is a launch error).
#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>

#include "dtrain/backend/math.hpp"
#include "dtrain/base/kinds.hpp"

namespace dtrain::kernels {

// A per-step value of a kernel: by value when the kernel is launched directly, or read from
// device memory (staged there before each launch of a CUDA graph) when it is captured.
template <class T>
struct Param {
  T value{};
  const T* at = nullptr;
};

// bfloat16 as stored: CUDA's __nv_bfloat16 in the kernels, its bits on the host.
using Bf16 = uint16_t;

// ---- elementwise.cuh ----
void fill(float* x, size_t n, float v, cudaStream_t s);
void scale(float* x, size_t n, float a, cudaStream_t s);  // x *= a
void clip_by_norm(const float* x, float* y, size_t n, const double* sumsq, float max_norm,
                  cudaStream_t s);
// Squared norm in double, in two launches: sum_squares_partial writes sum_squares_blocks(n)
// (at most 256) partial sums, add_partials adds them in order to *acc.
unsigned sum_squares_blocks(size_t n);
void sum_squares_partial(const float* x, size_t n, double* partial, cudaStream_t s);
void add_partials(const double* partial, unsigned count, double* acc, cudaStream_t s);
void multiply(const float* x, const float* mask, float* y, size_t n, cudaStream_t s);
void add(const float* a, const float* b, float* y, size_t n, cudaStream_t s);  // y = a + b
void add_relu(const float* a, const float* b, float* y, size_t n, cudaStream_t s);  // max(a+b, 0)
// acc = (first ? x : acc + x) * scale (math::fold).
void fold(float* acc, const float* x, size_t n, bool first, float scale, cudaStream_t s);

// ---- bias.cuh ----
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// db (+)= column sums of dy (rows in order, as on the CPU).
void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
               cudaStream_t s);

// ---- activation.cuh ----
void activation_forward(Activation a, const float* x, float* y, size_t n, cudaStream_t s);
void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                         size_t n, cudaStream_t s);

// ---- softmax_xent.cuh ----
// Row r's loss and hit to row_stats[2r], [2r + 1], and its gradient (dlogits non-null).
void softmax_xent_rows(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                       float grad_scale, float* dlogits, double* row_stats, double smoothing,
                       cudaStream_t s);
// Adds the sums of `rows` (loss, hit) pairs, times `scale`, to out[0..1] (one block).
void sum_pairs(const double* row_stats, int64_t rows, double* out, double scale, cudaStream_t s);

// ---- gather_augment.cuh ----
// dst rows i = src rows idx[i]; labels likewise.
void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
            int64_t count, float* dst, int32_t* dst_labels, cudaStream_t s);
void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w, int64_t pad,
             bool reflect, bool flip, Param<uint64_t> seed, cudaStream_t s);

// ---- dropout.cuh ----
void dropout_mask(float* mask, size_t n, double p, float keep, Param<uint64_t> seed,
                  cudaStream_t s);

// ---- pool.cuh ----
// `planes` = samples * channels of h x w, output ho x wo.
void maxpool_forward(const float* x, int64_t planes, int64_t h, int64_t w, int64_t k,
                     int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* y,
                     int32_t* argmax, cudaStream_t s);
void maxpool_backward(const float* dy, const int32_t* argmax, int64_t planes, int64_t h, int64_t w,
                      int64_t k, int64_t stride, int64_t pad, int64_t ho, int64_t wo, float* dx,
                      cudaStream_t s);

// ---- channel_sums.cuh: per-channel sums over NCHW maps in double, in a fixed order; each
// takes a scratch of channel_scratch_size(c) doubles (two launches) ----
size_t channel_scratch_size(int64_t c);
void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, double* moments,
                     double* scratch, cudaStream_t s);
void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                      int64_t n, int64_t c, int64_t spatial, double* sums, float* dgamma,
                      float* dbeta, double* scratch, cudaStream_t s);
// A convolution's bias gradient: db (c) = (or +=, accumulate) the channel sums of dy.
void channel_bias_grad(const float* dy, int64_t n, int64_t c, int64_t spatial, float* db,
                       bool accumulate, double* scratch, cudaStream_t s);

// ---- batchnorm.cuh (the arguments of the Device functions of the same names) ----
void bn_prepare(const double* moments, double count, double eps, double momentum, float* running,
                float* stats, int64_t c, cudaStream_t s);
void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta, int64_t n,
              int64_t c, int64_t spatial, float* y, bool relu, cudaStream_t s);
void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                    const double* sums, double m, int64_t n, int64_t c, int64_t spatial, float* dx,
                    cudaStream_t s);

// ---- embedding.cuh (token ids are floats: math::token_id) ----
void embedding_forward(const float* tokens, int64_t stride, const float* wte, const float* wpe,
                       int64_t rows, int64_t t, int64_t c, int64_t vocab, float* y,
                       cudaStream_t s);
// dwte in three steps, giving the CPU twin's bits: token_keys writes each of the rows * t
// positions' id and index, sort_tokens sorts them by id (stable: positions stay ascending),
// embedding_dwte adds each id's positions of dy, in order, to its row of dwte. sort_tokens is
// CUB's radix sort (several kernels), with sort_tokens_bytes of scratch `tmp`; it returns
// CUB's status.
void token_keys(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                int32_t* keys, int32_t* pos, cudaStream_t s);
size_t sort_tokens_bytes(int n, int64_t vocab);
cudaError_t sort_tokens(void* tmp, size_t tmp_bytes, const int32_t* keys, int32_t* keys_out,
                        const int32_t* pos, int32_t* pos_out, int n, int64_t vocab,
                        cudaStream_t s);
// `n` sorted (id, position) pairs.
void embedding_dwte(const int32_t* keys, const int32_t* pos, int64_t n, const float* dy,
                    int64_t c, float* dwte, cudaStream_t s);
// dwpe [t, c] += dy summed over the rows in order.
void embedding_dwpe(const float* dy, int64_t rows, int64_t t, int64_t c, float* dwpe,
                    cudaStream_t s);
void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                 int32_t* labels, cudaStream_t s);

// ---- layernorm.cuh (stats = [mean, rstd] per vector) ----
void layernorm_forward(const float* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                       float eps, float* y, float* stats, cudaStream_t s);
void layernorm_dx(const float* x, const float* dy, const float* gamma, const float* stats,
                  int64_t n, int64_t c, float* dx, cudaStream_t s);
// dgamma, dbeta += (the vectors in ascending order).
void layernorm_dparams(const float* x, const float* dy, const float* stats, int64_t n, int64_t c,
                       float* dgamma, float* dbeta, cudaStream_t s);

// ---- attention.cuh (the GEMMs between these are CudaDevice's cuBLAS calls) ----
// Columns part * c .. part * c + c - 1 (c = heads * d) of [rows, t] rows of `ld` floats, for
// parts 0 .. parts - 1, to [parts][rows, heads, t, d]; merge_heads is its inverse.
void split_heads(const float* src, int64_t ld, int parts, int64_t rows, int64_t t, int64_t heads,
                 int64_t d, float* dst, cudaStream_t s);
void merge_heads(const float* src, int parts, int64_t rows, int64_t t, int64_t heads, int64_t d,
                 float* dst, int64_t ld, cudaStream_t s);
// In place over `rows` rows of t scores (row r is position r % t): the causal softmax, and its
// backward (ds: dP in, dS = P (dP - rowsum(dP P)) * scale out).
void causal_softmax(float* att, int64_t rows, int64_t t, cudaStream_t s);
void causal_softmax_backward(const float* att, float* ds, int64_t rows, int64_t t, float scale,
                             cudaStream_t s);

// ---- optimizer.cuh ----
void sgd(float* p, const float* g, float* buf, size_t n, Param<float> lr, float momentum, float wd,
         bool nesterov, cudaStream_t s);
void adam(float* p, const float* g, float* m, float* v, size_t n, Param<math::AdamFactors> f,
          float b1, float b2, float eps, float wd, bool decoupled, cudaStream_t s);

// ---- bf16_convert.cuh (precision: bf16) ----
// The stored rows x cols matrix (leading dimension ld) to bfloat16, rounding to nearest even
// like round_bf16 on the CPU.
void to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, Bf16* dst, cudaStream_t s);
// n NCHW planes of c x hw fp32 values to NHWC bfloat16 (hw x c each), for cuDNN's bf16
// engines; a filter's oc x c x kk to oc x kk x c likewise (n = oc, hw = kk).
void to_bf16_nhwc(const float* src, int64_t n, int64_t c, int64_t hw, Bf16* dst, cudaStream_t s);
// The way back: NHWC bfloat16 to NCHW fp32, written or (accumulate) added.
void from_bf16_nhwc(const Bf16* src, int64_t n, int64_t c, int64_t hw, float* dst, bool accumulate,
                    cudaStream_t s);

// ---- measure.cuh (measure_gpu's floors) ----
// `count` empty kernels, back to back (no error check between them).
void empty_kernels(int count, cudaStream_t s);
// Uniform in [-1, 1) from the counter-based hash.
void fill_uniform(float* x, size_t n, uint64_t seed, cudaStream_t s);

}  // namespace dtrain::kernels
