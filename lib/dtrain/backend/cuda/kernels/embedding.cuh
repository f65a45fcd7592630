#pragma once
// Token and position embeddings of a language model, their gradients, and next-token targets.
// Token ids are floats (math::token_id). The gradient is deterministic and gives the CPU twin's
// bits: each element of dwte and dwpe adds its terms one by one, in ascending (sample,
// position) order, onto its old value. For dwte the positions are first sorted by token id with
// a stable radix sort (CUB), so that each token's positions lie side by side in ascending order;
// a block then walks one token's run, each thread owning channels.
#include <cub/device/device_radix_sort.cuh>

#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_embedding_forward(const float* tokens, int64_t stride, const float* wte,
                                    const float* wpe, int64_t rows, int64_t t, int64_t c,
                                    int64_t vocab, float* y) {
  GRID_STRIDE(e, size_t(rows * t * c)) {
    const auto el = static_cast<int64_t>(e);
    const int64_t ch = el % c, p = el / c, r = p / t, i = p % t;
    y[e] = wte[math::token_id(tokens[r * stride + i], vocab) * c + ch] + wpe[i * c + ch];
  }
}

// keys[p] = the token id at position p = r * t + i, pos[p] = p (the sort's values).
__global__ void k_token_keys(const float* tokens, int64_t stride, int64_t rows, int64_t t,
                             int64_t vocab, int32_t* keys, int32_t* pos) {
  GRID_STRIDE(e, size_t(rows * t)) {
    const auto p = static_cast<int64_t>(e);
    keys[p] = static_cast<int32_t>(math::token_id(tokens[(p / t) * stride + p % t], vocab));
    pos[p] = static_cast<int32_t>(p);
  }
}

// One block per run of equal ids in the sorted keys (the block at the run's first entry; the
// others skip): the run's positions are staged kThreads at a time in shared memory, and each
// thread adds them, in order, to its channels of that token's row of dwte.
__global__ void k_embedding_dwte(const int32_t* keys, const int32_t* pos, int64_t n,
                                 const float* dy, int64_t c, float* dwte) {
  __shared__ int32_t run[kThreads];
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const int32_t v = keys[j];
    if (j > 0 && keys[j - 1] == v) continue;  // the same for the whole block
    float* row = dwte + int64_t(v) * c;
    for (int64_t k0 = j;; k0 += blockDim.x) {
      // The run is a prefix of this chunk: the keys are sorted.
      const int64_t k = k0 + threadIdx.x;
      const bool in = k < n && keys[k] == v;
      if (in) run[threadIdx.x] = pos[k];
      const int m = __syncthreads_count(in);
      for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
        float a = row[ch];
#pragma unroll 8
        for (int q = 0; q < m; ++q) a += dy[int64_t(run[q]) * c + ch];
        row[ch] = a;
      }
      __syncthreads();  // before `run` is staged again
      if (m < static_cast<int>(blockDim.x)) break;
    }
  }
}

// One thread per element of dwpe [t, c], adding the samples in order.
__global__ void k_embedding_dwpe(const float* dy, int64_t rows, int64_t t, int64_t c, float* dwpe) {
  GRID_STRIDE(e, size_t(t * c)) {
    float a = dwpe[e];
    for (int64_t r = 0; r < rows; ++r) a += dy[r * t * c + static_cast<int64_t>(e)];
    dwpe[e] = a;
  }
}

__global__ void k_next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t,
                              int64_t vocab, int32_t* labels) {
  GRID_STRIDE(e, size_t(rows * t)) {
    const auto p = static_cast<int64_t>(e);
    labels[p] = static_cast<int32_t>(math::token_id(tokens[(p / t) * stride + p % t + 1], vocab));
  }
}

// The bits a token id takes (ids are below vocab): the radix sort's passes.
int id_bits(int64_t vocab) {
  int b = 1;
  while (b < 31 && (int64_t{1} << b) < vocab) ++b;
  return b;
}

}  // namespace

void embedding_forward(const float* tokens, int64_t stride, const float* wte, const float* wpe,
                       int64_t rows, int64_t t, int64_t c, int64_t vocab, float* y,
                       cudaStream_t s) {
  const auto total = static_cast<size_t>(rows * t * c);
  k_embedding_forward<<<blocks_for(total), kThreads, 0, s>>>(tokens, stride, wte, wpe, rows, t, c,
                                                             vocab, y);
}

void token_keys(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                int32_t* keys, int32_t* pos, cudaStream_t s) {
  k_token_keys<<<blocks_for(static_cast<size_t>(rows * t)), kThreads, 0, s>>>(tokens, stride, rows,
                                                                              t, vocab, keys, pos);
}

size_t sort_tokens_bytes(int n, int64_t vocab) {
  size_t bytes = 0;
  const int32_t* none = nullptr;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, none, static_cast<int32_t*>(nullptr), none,
                                  static_cast<int32_t*>(nullptr), n, 0, id_bits(vocab));
  return bytes;
}

cudaError_t sort_tokens(void* tmp, size_t tmp_bytes, const int32_t* keys, int32_t* keys_out,
                        const int32_t* pos, int32_t* pos_out, int n, int64_t vocab,
                        cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, keys_out, pos, pos_out, n, 0,
                                         id_bits(vocab), s);
}

void embedding_dwte(const int32_t* keys, const int32_t* pos, int64_t n, const float* dy, int64_t c,
                    float* dwte, cudaStream_t s) {
  // Blocks off a run's start return at once; past this many, blocks stride.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(n, int64_t{1} << 20));
  k_embedding_dwte<<<blocks, kThreads, 0, s>>>(keys, pos, n, dy, c, dwte);
}

void embedding_dwpe(const float* dy, int64_t rows, int64_t t, int64_t c, float* dwpe,
                    cudaStream_t s) {
  k_embedding_dwpe<<<blocks_for(static_cast<size_t>(t * c)), kThreads, 0, s>>>(dy, rows, t, c,
                                                                               dwpe);
}

void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                 int32_t* labels, cudaStream_t s) {
  k_next_tokens<<<blocks_for(static_cast<size_t>(rows * t)), kThreads, 0, s>>>(tokens, stride, rows,
                                                                               t, vocab, labels);
}

}  // namespace dtrain::kernels
