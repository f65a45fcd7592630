#pragma once
// Per-channel sums over NCHW maps, in double: BatchNorm's moments and backward sums, and a
// convolution's bias gradient. Two launches, after math::channel_split: a grid of (run, channel)
// blocks writes one partial sum per run, then one thread per channel adds its runs in order. The
// order depends on the shapes alone, so every call gives the same bits (no atomics).
//
// One block per channel, as these sums first ran, kept 32 of 132 SMs busy on the CNN's first
// layer: at batch 1024 (H200, ncu) BatchNorm's two sums took 386 and 431 us, and cuDNN's bias
// gradient (cudnnConvolutionBackwardBias, the same shape of kernel) 1,010 us, together 43% of
// the step's kernel time.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

// The offset of element i of channel ch, i counting over samples, then positions (32-bit
// division where the count fits, the 64-bit one being several times slower).
__device__ inline int64_t channel_offset(int64_t i, int64_t c, int64_t ch, int64_t spatial,
                                         bool narrow) {
  const int64_t j = narrow ? int64_t(uint32_t(i) / uint32_t(spatial)) : i / spatial;
  return (j * c + ch) * spatial + (i - j * spatial);
}

// What one value adds to a channel's two sums, at offset `off` of channel `ch`.
struct MomentsTerm {  // x and x^2
  const float* x;
  __device__ void operator()(int64_t off, int64_t, double& a, double& b) const {
    const double v = x[off];
    a += v;
    b += v * v;
  }
};
struct BnBackwardTerm {  // dy and dy * xhat
  const float *x, *dy, *stats;
  int64_t c;
  __device__ void operator()(int64_t off, int64_t ch, double& a, double& b) const {
    const double g = dy[off];
    a += g;
    b += g * static_cast<double>(math::bn_xhat(x[off], stats[ch], stats[c + ch]));
  }
};
struct SumTerm {  // x alone
  const float* x;
  __device__ void operator()(int64_t off, int64_t, double& a, double&) const { a += x[off]; }
};

// What a channel's totals become.
struct MomentsOut {
  double* out;  // [sum (c), sum of squares (c)]
  int64_t c;
  __device__ void operator()(int64_t ch, double a, double b) const {
    out[ch] = a;
    out[c + ch] = b;
  }
};
struct BnBackwardOut {
  const float* gamma;
  int64_t c;
  double* sums;
  float *dgamma, *dbeta;
  __device__ void operator()(int64_t ch, double a, double b) const {
    math::bn_backward_totals(a, b, gamma, c, ch, sums, dgamma, dbeta);
  }
};
struct BiasOut {
  float* db;
  bool accumulate;
  __device__ void operator()(int64_t ch, double a, double) const {
    db[ch] = accumulate ? db[ch] + static_cast<float>(a) : static_cast<float>(a);
  }
};

// Block (run, channel) sums run blockIdx.x of its channel: values [run * chunk, + chunk) of
// the channel's n * spatial, counted over samples, then positions. partial holds
// [first (c x parts), second (c x parts)].
template <class Term>
__global__ void __launch_bounds__(kThreads)
    k_channel_partials(Term term, int64_t n, int64_t c, int64_t spatial, int64_t parts,
                       int64_t chunk, double* partial) {
  const int64_t count = n * spatial, lo = int64_t(blockIdx.x) * chunk;
  const int64_t hi = lo + chunk < count ? lo + chunk : count;
  const bool narrow = count <= INT32_MAX;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    double a = 0, b = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      term(channel_offset(i, c, ch, spatial, narrow), ch, a, b);
    block_sum2<kThreads>(a, b);
    if (threadIdx.x == 0) {
      partial[ch * parts + blockIdx.x] = a;
      partial[(c + ch) * parts + blockIdx.x] = b;
    }
    __syncthreads();  // block_sum2's shared sums are read before the next channel writes them
  }
}

template <class Out>
__global__ void k_channel_totals(const double* partial, int64_t c, int64_t parts, Out out) {
  GRID_STRIDE(i, size_t(c)) {
    const auto ch = static_cast<int64_t>(i);
    double a = 0, b = 0;
    for (int64_t j = 0; j < parts; ++j) {
      a += partial[ch * parts + j];
      b += partial[(c + ch) * parts + j];
    }
    out(ch, a, b);
  }
}

// scratch: math::channel_scratch_size(c) doubles.
template <class Term, class Out>
void channel_sums(Term term, Out out, int64_t n, int64_t c, int64_t spatial, double* scratch,
                  cudaStream_t s) {
  if (c <= 0) return;
  const math::ChannelSplit sp = math::channel_split(n * spatial, c);
  const dim3 grid(static_cast<unsigned>(sp.parts),
                  static_cast<unsigned>(std::min<int64_t>(c, 65535)));
  k_channel_partials<<<grid, kThreads, 0, s>>>(term, n, c, spatial, sp.parts, sp.chunk,
                                                scratch);
  k_channel_totals<<<blocks_for(static_cast<size_t>(c)), kThreads, 0, s>>>(scratch, c, sp.parts,
                                                                           out);
}

}  // namespace

size_t channel_scratch_size(int64_t c) {
  return static_cast<size_t>(math::channel_scratch_size(c));
}

void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, double* moments,
                     double* scratch, cudaStream_t s) {
  channel_sums(MomentsTerm{x}, MomentsOut{moments, c}, n, c, spatial, scratch, s);
}

void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                      int64_t n, int64_t c, int64_t spatial, double* sums, float* dgamma,
                      float* dbeta, double* scratch, cudaStream_t s) {
  channel_sums(BnBackwardTerm{x, dy, stats, c}, BnBackwardOut{gamma, c, sums, dgamma, dbeta}, n,
               c, spatial, scratch, s);
}

void channel_bias_grad(const float* dy, int64_t n, int64_t c, int64_t spatial, float* db,
                       bool accumulate, double* scratch, cudaStream_t s) {
  channel_sums(SumTerm{dy}, BiasOut{db, accumulate}, n, c, spatial, scratch, s);
}

}  // namespace dtrain::kernels
