// The CUDA backend's device: cuBLAS GEMMs, cuDNN convolutions and dtrain's own kernels, each
// the twin of a CpuDevice function (tests/test_cuda.cpp compares them).
//
// Everything runs in order on one stream per device, and a training step never waits for it:
// loss sums, BatchNorm statistics and dropout masks live in device memory, and batch indices
// are copied from pinned memory asynchronously. upload() and download() do synchronise (they
// serve initialisation, evaluation and the once-per-epoch statistics).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <map>
#include <memory>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/abort_gate.hpp"
#include "dtrain/base/hash.hpp"

namespace dtrain {
namespace {

// printf-style formatting: fmt's headers do not compile under nvcc's C++20 mode.
template <class... A>
std::string strf(const char* f, A... a) {
  const int n = std::snprintf(nullptr, 0, f, a...);
  std::string s(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::snprintf(s.data(), s.size(), f, a...);
  s.pop_back();
  return s;
}

#define DT_CUDA(call)                                                                         \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess)                                                                    \
      throw ::dtrain::SystemError(strf("rank %d: CUDA: %s (%s)", rank_, #call,                 \
                                       cudaGetErrorString(e_)),                              \
                                  __FILE__, __LINE__);                                        \
  } while (0)
#define DT_CUBLAS(call)                                                                       \
  do {                                                                                        \
    const cublasStatus_t s_ = (call);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                          \
      throw ::dtrain::SystemError(strf("rank %d: cuBLAS: %s (status %d)", rank_, #call,        \
                                       static_cast<int>(s_)),                                \
                                  __FILE__, __LINE__);                                        \
  } while (0)
#define DT_CUDNN(call)                                                                        \
  do {                                                                                        \
    const cudnnStatus_t s_ = (call);                                                          \
    if (s_ != CUDNN_STATUS_SUCCESS)                                                           \
      throw ::dtrain::SystemError(strf("rank %d: cuDNN: %s (%s)", rank_, #call,                \
                                       cudnnGetErrorString(s_)),                             \
                                  __FILE__, __LINE__);                                        \
  } while (0)

constexpr int kThreads = 256;

inline unsigned blocks_for(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// A per-step value of a kernel: by value when the kernel is launched directly, or read from
// device memory (staged there before each launch of a CUDA graph) when it is captured.
template <class T>
struct Param {
  T value{};
  const T* at = nullptr;
  __device__ T get() const { return at ? *at : value; }
};
struct AdamScalars {
  float lr, bc1, bc2_sqrt;
};

// ---- elementwise kernels ----

__global__ void k_fill(float* x, size_t n, float v) {
  GRID_STRIDE(i, n) x[i] = v;
}

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

__device__ inline float gelu_f(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ inline float gelu_grad_f(float x) {
  const float k = 0.7978845608028654f;
  const float u = k * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  const float du = k * (1.f + 3.f * 0.044715f * x * x);
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
}

__global__ void k_act_fwd(int a, const float* x, float* y, size_t n) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    switch (a) {
      case 0: y[i] = v > 0.f ? v : 0.f; break;
      case 1: y[i] = tanhf(v); break;
      case 2: y[i] = 1.f / (1.f + expf(-v)); break;
      default: y[i] = gelu_f(v); break;
    }
  }
}

__global__ void k_act_bwd(int a, const float* x, const float* y, const float* dy, float* dx,
                          size_t n) {
  GRID_STRIDE(i, n) {
    switch (a) {
      case 0: dx[i] = x[i] > 0.f ? dy[i] : 0.f; break;
      case 1: dx[i] = dy[i] * (1.f - y[i] * y[i]); break;
      case 2: dx[i] = dy[i] * y[i] * (1.f - y[i]); break;
      default: dx[i] = dy[i] * gelu_grad_f(x[i]); break;
    }
  }
}

// Row r, in double like the CPU twin; its loss and hit go to `row_stats`.
__device__ void softmax_xent_row(const float* logits, const int32_t* labels, int64_t r,
                                 int64_t classes, float grad_scale, float* dlogits,
                                 double* row_stats) {
  const float* z = logits + r * classes;
  const int32_t y = labels[r];
  float mx = z[0];
  int64_t arg = 0;
  for (int64_t c = 1; c < classes; ++c)
    if (z[c] > mx) {
      mx = z[c];
      arg = c;
    }
  double sum = 0.0;
  for (int64_t c = 0; c < classes; ++c) sum += exp(static_cast<double>(z[c] - mx));
  const double log_sum = log(sum);
  row_stats[2 * r] = log_sum - static_cast<double>(z[y] - mx);
  row_stats[2 * r + 1] = arg == y ? 1.0 : 0.0;
  if (dlogits) {
    float* d = dlogits + r * classes;
    for (int64_t c = 0; c < classes; ++c) {
      const double p = exp(static_cast<double>(z[c] - mx) - log_sum);
      d[c] = grad_scale * static_cast<float>(p - (c == y ? 1.0 : 0.0));
    }
  }
}

// One thread per row (grid-stride: any number of rows).
__global__ void k_softmax_xent(const float* logits, const int32_t* labels, int64_t rows,
                               int64_t classes, float grad_scale, float* dlogits,
                               double* row_stats) {
  GRID_STRIDE(r, size_t(rows)) {
    softmax_xent_row(logits, labels, static_cast<int64_t>(r), classes, grad_scale, dlogits,
                     row_stats);
  }
}

// Block reduction of two doubles over the block; thread 0 gets the totals.
__device__ void block_sum2(double& a, double& b) {
  __shared__ double s0[kThreads], s1[kThreads];
  s0[threadIdx.x] = a;
  s1[threadIdx.x] = b;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      s0[threadIdx.x] += s0[threadIdx.x + w];
      s1[threadIdx.x] += s1[threadIdx.x + w];
    }
    __syncthreads();
  }
  a = s0[0];
  b = s1[0];
}

// Sums `rows` (loss, hit) pairs in one block and adds them to out[0..1].
__global__ void k_sum_pairs(const double* v, int64_t rows, double* out) {
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    a += v[2 * i];
    b += v[2 * i + 1];
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    out[0] += a;
    out[1] += b;
  }
}

__global__ void k_gather(const float* src, const int32_t* src_labels, int64_t features,
                         const int64_t* idx, int64_t count, float* dst, int32_t* dst_labels) {
  GRID_STRIDE(i, size_t(count * features)) {
    const int64_t r = static_cast<int64_t>(i) / features, f = static_cast<int64_t>(i) % features;
    dst[i] = src[idx[r] * features + f];
    if (f == 0) dst_labels[r] = src_labels[idx[r]];
  }
}

__global__ void k_maxpool_fwd(const float* x, int64_t planes, int64_t h, int64_t w, int64_t k,
                              int64_t stride, int64_t ho, int64_t wo, float* y, int32_t* argmax) {
  GRID_STRIDE(i, size_t(planes * ho * wo)) {
    const int64_t p = static_cast<int64_t>(i) / (ho * wo), o = static_cast<int64_t>(i) % (ho * wo);
    const int64_t oi = o / wo, oj = o % wo;
    const float* xp = x + p * h * w;
    int64_t best = (oi * stride) * w + oj * stride;
    float bv = xp[best];
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t kj = 0; kj < k; ++kj) {
        const int64_t idx = (oi * stride + ki) * w + oj * stride + kj;
        if (xp[idx] > bv) {  // first maximum wins, as on the CPU
          bv = xp[idx];
          best = idx;
        }
      }
    y[i] = bv;
    argmax[i] = static_cast<int32_t>(best);
  }
}

// One thread per input position gathers the outputs whose window chose it (no atomics, so the
// result is deterministic even for overlapping windows).
__global__ void k_maxpool_bwd(const float* dy, const int32_t* argmax, int64_t planes, int64_t h,
                              int64_t w, int64_t k, int64_t stride, int64_t ho, int64_t wo,
                              float* dx) {
  GRID_STRIDE(i, size_t(planes * h * w)) {
    const int64_t p = static_cast<int64_t>(i) / (h * w), q = static_cast<int64_t>(i) % (h * w);
    const int64_t ii = q / w, jj = q % w;
    const int64_t oi_lo = ii >= k ? (ii - k) / stride + 1 : 0;
    const int64_t oj_lo = jj >= k ? (jj - k) / stride + 1 : 0;
    const int64_t oi_hi = ii / stride < ho - 1 ? ii / stride : ho - 1;
    const int64_t oj_hi = jj / stride < wo - 1 ? jj / stride : wo - 1;
    float s = 0.f;
    for (int64_t oi = oi_lo; oi <= oi_hi; ++oi)
      for (int64_t oj = oj_lo; oj <= oj_hi; ++oj) {
        const int64_t o = (p * ho + oi) * wo + oj;
        if (argmax[o] == q) s += dy[o];
      }
    dx[i] = s;
  }
}


// One block per channel: sum and sum of squares over samples and positions.
__global__ void k_channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                                  double* out) {
  const int64_t ch = blockIdx.x;
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < n * spatial; i += blockDim.x) {
    const double v = x[((i / spatial) * c + ch) * spatial + i % spatial];
    a += v;
    b += v * v;
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    out[ch] = a;
    out[c + ch] = b;
  }
}

// The CPU's bn_prepare_one for channel ch.
__device__ void bn_prepare_channel(const double* moments, double count, double eps,
                                   double momentum, float* running, float* stats, int64_t c,
                                   int64_t ch) {
  if (!moments) {
    stats[ch] = running[ch];
    stats[c + ch] = static_cast<float>(1.0 / sqrt(static_cast<double>(running[c + ch]) + eps));
    return;
  }
  const double mean = moments[ch] / count;
  const double var = fmax(0.0, moments[c + ch] / count - mean * mean);
  stats[ch] = static_cast<float>(mean);
  stats[c + ch] = static_cast<float>(1.0 / sqrt(var + eps));
  const double unbiased = count > 1 ? var * count / (count - 1) : var;
  running[ch] = static_cast<float>((1 - momentum) * running[ch] + momentum * mean);
  running[c + ch] = static_cast<float>((1 - momentum) * running[c + ch] + momentum * unbiased);
}

// One thread per channel (grid-stride: any number of channels).
__global__ void k_bn_prepare(const double* moments, double count, double eps, double momentum,
                             float* running, float* stats, int64_t c) {
  GRID_STRIDE(ch, size_t(c)) {
    bn_prepare_channel(moments, count, eps, momentum, running, stats, c,
                       static_cast<int64_t>(ch));
  }
}

// stats = [mean (c), inv_std (c)]
__global__ void k_bn_apply(const float* x, const float* stats, const float* gamma,
                           const float* beta, int64_t n, int64_t c, int64_t spatial, float* y) {
  GRID_STRIDE(i, size_t(n * c * spatial)) {
    const int64_t ch = (static_cast<int64_t>(i) / spatial) % c;
    const float a = gamma[ch] * stats[c + ch];
    y[i] = a * x[i] + (beta[ch] - a * stats[ch]);
  }
}

// One block per channel; out = [s1 (c), s2 (c)], dgamma/dbeta accumulated.
__global__ void k_bn_bwd_sums(const float* x, const float* dy, const float* stats,
                              const float* gamma, int64_t n, int64_t c, int64_t spatial,
                              double* out, float* dgamma, float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float m = stats[ch], is = stats[c + ch];
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < n * spatial; i += blockDim.x) {
    const int64_t off = ((i / spatial) * c + ch) * spatial + i % spatial;
    const double g = dy[off];
    a += g;
    b += g * static_cast<double>((x[off] - m) * is);
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    dbeta[ch] += static_cast<float>(a);
    dgamma[ch] += static_cast<float>(b);
    out[ch] = a * gamma[ch];
    out[c + ch] = b * gamma[ch];
  }
}

// sums = [s1 (c), s2 (c)] as doubles; the CPU twin's arithmetic.
__global__ void k_bn_bwd_dx(const float* x, const float* dy, const float* stats,
                            const float* gamma, const double* sums, double m, int64_t n,
                            int64_t c, int64_t spatial, float* dx) {
  GRID_STRIDE(i, size_t(n * c * spatial)) {
    const int64_t ch = (static_cast<int64_t>(i) / spatial) % c;
    const double is = stats[c + ch], kk = is / m;
    const auto a = static_cast<float>(kk * m * gamma[ch]);
    const auto bx = static_cast<float>(-kk * sums[c + ch] * is);
    const auto c0 = static_cast<float>(kk * (-sums[ch] + double(stats[ch]) * is * sums[c + ch]));
    dx[i] = a * dy[i] + bx * x[i] + c0;
  }
}

__global__ void k_augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w,
                          int64_t pad, bool flip, Param<uint64_t> seed_p) {
  const int64_t f = c * h * w;
  const uint64_t seed = seed_p.get();
  GRID_STRIDE(i, size_t(rows * f)) {
    const int64_t n = static_cast<int64_t>(i) / f, e = static_cast<int64_t>(i) % f;
    const AugmentDraw a = augment_draw(seed, n, pad, flip);
    const int64_t src = augment_source(a, e / (h * w), (e / w) % h, e % w, h, w);
    y[i] = src >= 0 ? x[n * f + src] : 0.f;
  }
}

__global__ void k_dropout_mask(float* mask, size_t n, double p, float keep,
                               Param<uint64_t> seed_p) {
  const uint64_t seed = seed_p.get();
  GRID_STRIDE(i, n) mask[i] = dropout_value(seed, i, p, keep);
}

__global__ void k_multiply(const float* x, const float* mask, float* y, size_t n) {
  GRID_STRIDE(i, n) y[i] = x[i] * mask[i];
}

// precision: bf16. Stored rows x cols matrix (leading dimension ld) to bfloat16, rounding to
// nearest even like round_bf16 on the CPU.
__global__ void k_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                          __nv_bfloat16* dst) {
  GRID_STRIDE(i, size_t(rows * cols)) {
    const int64_t at = (static_cast<int64_t>(i) / cols) * ld + static_cast<int64_t>(i) % cols;
    dst[at] = __float2bfloat16_rn(src[at]);
  }
}
__global__ void k_from_bf16(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
  GRID_STRIDE(i, n) dst[i] = accumulate ? dst[i] + __bfloat162float(src[i]) : __bfloat162float(src[i]);
}

__global__ void k_scale(float* x, size_t n, float a) {
  GRID_STRIDE(i, n) x[i] *= a;
}

__global__ void k_sgd(float* p, const float* g, float* buf, size_t n, Param<float> lr_p,
                      float momentum, float wd, bool nesterov) {
  const float lr = lr_p.get();
  GRID_STRIDE(i, n) {
    float d = g[i] + wd * p[i];
    if (momentum != 0.f) {
      buf[i] = momentum * buf[i] + d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

__global__ void k_adam(float* p, const float* g, float* m, float* v, size_t n,
                       Param<AdamScalars> sc, float b1, float b2, float eps, float wd,
                       bool decoupled) {
  const AdamScalars a = sc.get();
  const float lr = a.lr, bc1 = a.bc1, bc2_sqrt = a.bc2_sqrt;
  GRID_STRIDE(i, n) {
    float d = g[i];
    if (decoupled)
      p[i] *= 1.f - lr * wd;
    else
      d += wd * p[i];
    m[i] = b1 * m[i] + (1.f - b1) * d;
    v[i] = b2 * v[i] + (1.f - b2) * d * d;
    const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] -= (lr / bc1) * m[i] / denom;
  }
}

// ---- cuDNN convolution plans ----
//
// cuDNN 9 marks the descriptor-based ("legacy") convolution API deprecated in favour of the
// graph API (cudnn_frontend). dtrain uses the legacy API on purpose for now: it is still
// shipped and supported in cuDNN 9, it needs no header-only C++ frontend that Debian does not
// package, and the three calls it takes (forward, backward data, backward filter) map one to
// one onto the Device interface. Moving to the graph API is a contained change inside ConvPlan.
// A plan owns its descriptors: one that fails half-way through (no algorithm, a bad shape)
// releases what it had created.
struct ConvPlan {
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (yf) cudnnDestroyTensorDescriptor(yf);
    if (b) cudnnDestroyTensorDescriptor(b);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
  // x, y, w in the compute type (fp32 or bf16); yf is y as fp32, for the bias.
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, yf = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t workspace = 0;
};

class CudaDevice final : public Device, public DeviceQueue {
 public:
  CudaDevice(int index, int rank, Precision precision)
      : index_(index),
        rank_(rank),
        tf32_(precision == Precision::tf32),
        bf16_(precision == Precision::bf16) {
    DT_CUDA(cudaSetDevice(index_));
    DT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DT_CUBLAS(cublasCreate(&blas_));
    DT_CUBLAS(cublasSetStream(blas_, stream_));
    // fp32: plain FP32 GEMMs like the CPU twin; tf32: tensor cores with TF32 inputs; bf16:
    // bfloat16 operands (converted by dtrain) on tensor cores, fp32 accumulation and output.
    DT_CUBLAS(cublasSetMathMode(blas_, tf32_   ? CUBLAS_TF32_TENSOR_OP_MATH
                                       : bf16_ ? CUBLAS_DEFAULT_MATH
                                               : CUBLAS_PEDANTIC_MATH));
    // A workspace of our own, so that cuBLAS never allocates inside a CUDA graph capture.
    DT_CUDA(cudaMalloc(&blas_ws_, kBlasWorkspace));
    DT_CUBLAS(cublasSetWorkspace(blas_, blas_ws_, kBlasWorkspace));
    DT_CUDNN(cudnnCreate(&dnn_));
    DT_CUDNN(cudnnSetStream(dnn_, stream_));
    cudaDeviceProp prop{};
    DT_CUDA(cudaGetDeviceProperties(&prop, index_));
    name_ = strf("cuda:%d (%s)", index_, prop.name);
  }
  ~CudaDevice() override {
    cudaSetDevice(index_);
    for (auto& sl : slots_)
      for (auto e : sl.ev)
        if (e) cudaEventDestroy(e);
    drop_graphs();
    row_stats_ = Buffer<double>();  // while the stream still exists
    for (auto* b : {&a16_, &b16_, &x16_, &w16_, &y16_, &dy16_, &dw16_}) *b = Buffer<__nv_bfloat16>();
    free_staging();
    plans_.clear();  // their descriptors
    if (workspace_) cudaFree(workspace_);
    if (blas_ws_) cudaFree(blas_ws_);
    cudnnDestroy(dnn_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  bool host_memory() const override { return false; }
  DeviceQueue* queue() override { return this; }
  void synchronize() override { DT_CUDA(cudaStreamSynchronize(stream_)); }
  void* native_stream() override { return stream_; }
  int64_t launches() const override { return launches_; }

  // Step phases timed by events on the stream. Slots form a ring, so the host can run a few
  // steps ahead; a slot is read (waiting for it if need be) before it is reused.
  // Inside a CUDA graph the events are graph nodes (one graph per slot, so each records its
  // own slot's events); a replay only keeps the ring's books.
  void step_mark(int phase) override {
    if (phase == 0) {
      cur_ = (cur_ + 1) % kSlots;
      if (slots_[cur_].recorded) read_slot(slots_[cur_], true);
    }
    auto& sl = slots_[cur_];
    if (mode_ != Mode::replay) {
      if (!sl.ev[phase]) DT_CUDA(cudaEventCreate(&sl.ev[phase]));
      if (mode_ == Mode::capture)
        DT_CUDA(cudaEventRecordWithFlags(sl.ev[phase], stream_, cudaEventRecordExternal));
      else
        DT_CUDA(cudaEventRecord(sl.ev[phase], stream_));
    }
    if (phase == 3) sl.recorded = true;
  }
  int take_step_times(double* seconds, bool wait) override {
    for (auto& sl : slots_)
      if (sl.recorded) read_slot(sl, wait);
    for (int i = 0; i < 3; ++i) seconds[i] += taken_[i];
    const int n = taken_steps_;
    taken_[0] = taken_[1] = taken_[2] = 0;
    taken_steps_ = 0;
    return n;
  }

  void* alloc_bytes(size_t bytes) override {
    if (mode_ != Mode::eager)
      throw SystemError(strf("rank %d: a GPU allocation of %zu bytes inside a CUDA-graph step "
                             "(a step changed shape after warm-up)",
                             rank_, bytes),
                        __FILE__, __LINE__);
    select();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess)
      throw SystemError(strf("rank %d: out of GPU memory on cuda:%d allocating %zu bytes (%s)",
                             rank_, index_, bytes, cudaGetErrorString(e)),
                        __FILE__, __LINE__);
    DT_CUDA(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream_));
    return p;
  }
  void free_bytes(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
    drop_graphs();  // they may point into it
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    no_graph("upload");
    DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    synchronize();  // the host buffer may change as soon as this returns
  }
  void download(void* dst, const void* src, size_t bytes) override {
    no_graph("download");
    DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void zero(void* p, size_t bytes) override {
    if (replaying()) return;
    if (bytes) DT_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (replaying()) return;
    if (bytes) DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill(float* x, size_t n, float v) override {
    if (replaying()) return;
    if (n == 0) return;
    k_fill<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, v);
    check_launch();
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    if (replaying()) return;
    if (m == 0 || n == 0) return;
    if (bf16_ && k > 0) {
      const __nv_bfloat16* a16 = to_bf16(a, ta ? k : m, ta ? m : k, lda, a16_);
      const __nv_bfloat16* b16 = to_bf16(b, tb ? n : k, tb ? k : n, ldb, b16_);
      ++launches_;
      DT_CUBLAS(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                             static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
                             b16, CUDA_R_16BF, static_cast<int>(ldb), a16, CUDA_R_16BF,
                             static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
    ++launches_;
    DT_CUBLAS(cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                          static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                          static_cast<int>(ldc)));
  }
  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override {
    if (replaying()) return;
    const auto n = static_cast<size_t>(rows * cols);
    if (n == 0) return;
    k_add_bias<<<blocks_for(n), kThreads, 0, stream_>>>(y, bias, rows, cols);
    check_launch();
  }
  void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols,
                 Accumulate mode) override {
    if (replaying()) return;
    if (cols == 0) return;
    k_bias_grad<<<blocks_for(cols), kThreads, 0, stream_>>>(dy, db, rows, cols, mode == Accumulate::add);
    check_launch();
  }
  void activation_forward(Activation a, const float* x, float* y, size_t n) override {
    if (replaying()) return;
    if (n == 0) return;
    k_act_fwd<<<blocks_for(n), kThreads, 0, stream_>>>(act_code(a), x, y, n);
    check_launch();
  }
  void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                           size_t n) override {
    if (replaying()) return;
    if (n == 0) return;
    k_act_bwd<<<blocks_for(n), kThreads, 0, stream_>>>(act_code(a), x, y, dy, dx, n);
    check_launch();
  }
  void softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                    float grad_scale, float* dlogits, double* stats) override {
    if (replaying()) return;
    if (rows == 0) return;
    if (row_stats_.size() < static_cast<size_t>(2 * rows)) row_stats_.resize(*this, 2 * rows);
    k_softmax_xent<<<blocks_for(rows), kThreads, 0, stream_>>>(
        logits, labels, rows, classes, grad_scale, dlogits, row_stats_.data());
    check_launch();
    k_sum_pairs<<<1, kThreads, 0, stream_>>>(row_stats_.data(), rows, stats);
    check_launch();
  }
  void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
              int64_t count, float* dst, int32_t* dst_labels) override {
    if (count == 0) return;
    // The indices travel through pinned memory asynchronously (staged: see stage()).
    const int64_t* didx = stage(idx, static_cast<size_t>(count));
    if (replaying()) return;
    const auto n = static_cast<size_t>(count * features);
    k_gather<<<blocks_for(n), kThreads, 0, stream_>>>(src, src_labels, features, didx, count, dst,
                                                      dst_labels);
    check_launch();
  }

  void conv_forward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* b,
                    float* y) override {
    if (replaying()) return;
    if (n == 0) return;
    ConvPlan& p = plan(g, n);
    const float one = 1.f, zero = 0.f;
    launches_ += 2;
    if (bf16_) {  // bf16 in, bf16 out (fp32 accumulation), then fp32 plus the bias
      const int64_t in = n * g.c * g.h * g.w, nw = g.oc * g.c * g.k * g.k;
      const auto out = static_cast<size_t>(n * g.oc * g.ho() * g.wo());
      const __nv_bfloat16* x16 = to_bf16(x, 1, in, in, x16_);
      const __nv_bfloat16* w16 = to_bf16(w, 1, nw, nw, w16_);
      if (y16_.size() < out) y16_.resize(*this, out);
      DT_CUDNN(cudnnConvolutionForward(dnn_, &one, p.x, x16, p.w, w16, p.conv, p.fwd, workspace_,
                                       p.workspace, &zero, p.y, y16_.data()));
      from_bf16(y16_.data(), y, out, false);
    } else {
      DT_CUDNN(cudnnConvolutionForward(dnn_, &one, p.x, x, p.w, w, p.conv, p.fwd, workspace_,
                                       p.workspace, &zero, p.y, y));
    }
    DT_CUDNN(cudnnAddTensor(dnn_, &one, p.b, b, &one, p.yf, y));
  }
  void conv_backward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx) override {
    if (replaying()) return;
    if (n == 0) return;
    ConvPlan& p = plan(g, n);
    const float one = 1.f, zero = 0.f;
    launches_ += dx ? 3 : 2;
    if (bf16_) {  // bf16 operands; dx and dw come out in bf16; db sums the fp32 dy
      const int64_t in = n * g.c * g.h * g.w, nw = g.oc * g.c * g.k * g.k;
      const int64_t out = n * g.oc * g.ho() * g.wo();
      const __nv_bfloat16* dy16 = to_bf16(dy, 1, out, out, dy16_);
      const __nv_bfloat16* w16 = to_bf16(w, 1, nw, nw, w16_);
      if (dx) {
        if (y16_.size() < static_cast<size_t>(in)) y16_.resize(*this, static_cast<size_t>(in));
        DT_CUDNN(cudnnConvolutionBackwardData(dnn_, &one, p.w, w16, p.y, dy16, p.conv, p.bwd_data,
                                              workspace_, p.workspace, &zero, p.x, y16_.data()));
        from_bf16(y16_.data(), dx, static_cast<size_t>(in), false);
      }
      const __nv_bfloat16* x16 = to_bf16(x, 1, in, in, x16_);
      if (dw16_.size() < static_cast<size_t>(nw)) dw16_.resize(*this, static_cast<size_t>(nw));
      DT_CUDNN(cudnnConvolutionBackwardFilter(dnn_, &one, p.x, x16, p.y, dy16, p.conv,
                                              p.bwd_filter, workspace_, p.workspace, &zero, p.w,
                                              dw16_.data()));
      from_bf16(dw16_.data(), dw, static_cast<size_t>(nw), true);
      DT_CUDNN(cudnnConvolutionBackwardBias(dnn_, &one, p.yf, dy, &one, p.b, db));
      return;
    }
    if (dx)
      DT_CUDNN(cudnnConvolutionBackwardData(dnn_, &one, p.w, w, p.y, dy, p.conv, p.bwd_data,
                                            workspace_, p.workspace, &zero, p.x, dx));
    DT_CUDNN(cudnnConvolutionBackwardFilter(dnn_, &one, p.x, x, p.y, dy, p.conv, p.bwd_filter,
                                            workspace_, p.workspace, &one, p.w, dw));
    DT_CUDNN(cudnnConvolutionBackwardBias(dnn_, &one, p.yf, dy, &one, p.b, db));
  }

  void maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                       int64_t stride, float* y, int32_t* argmax) override {
    if (replaying()) return;
    const int64_t ho = (h - k) / stride + 1, wo = (w - k) / stride + 1;
    const auto total = static_cast<size_t>(n * c * ho * wo);
    if (total == 0) return;
    k_maxpool_fwd<<<blocks_for(total), kThreads, 0, stream_>>>(x, n * c, h, w, k, stride, ho, wo,
                                                                y, argmax);
    check_launch();
  }
  void maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c, int64_t h,
                        int64_t w, int64_t k, int64_t stride, float* dx) override {
    if (replaying()) return;
    const int64_t ho = (h - k) / stride + 1, wo = (w - k) / stride + 1;
    const auto total = static_cast<size_t>(n * c * h * w);
    if (total == 0) return;
    k_maxpool_bwd<<<blocks_for(total), kThreads, 0, stream_>>>(dy, argmax, n * c, h, w, k, stride,
                                                                ho, wo, dx);
    check_launch();
  }

  void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                       double* moments) override {
    if (replaying()) return;
    if (c == 0) return;
    k_channel_moments<<<static_cast<unsigned>(c), kThreads, 0, stream_>>>(x, n, c, spatial,
                                                                           moments);
    check_launch();
  }
  void bn_prepare(const double* moments, double count, double eps, double momentum,
                  float* running, float* stats, int64_t c) override {
    if (replaying()) return;
    if (c == 0) return;
    k_bn_prepare<<<blocks_for(c), kThreads, 0, stream_>>>(moments, count, eps, momentum, running,
                                                          stats, c);
    check_launch();
  }
  void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                int64_t n, int64_t c, int64_t spatial, float* y) override {
    if (replaying()) return;
    const auto total = static_cast<size_t>(n * c * spatial);
    if (total == 0) return;
    k_bn_apply<<<blocks_for(total), kThreads, 0, stream_>>>(x, stats, gamma, beta, n, c, spatial,
                                                             y);
    check_launch();
  }
  void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                        int64_t n, int64_t c, int64_t spatial, double* sums, float* dgamma,
                        float* dbeta) override {
    if (replaying()) return;
    if (c == 0) return;
    k_bn_bwd_sums<<<static_cast<unsigned>(c), kThreads, 0, stream_>>>(x, dy, stats, gamma, n, c,
                                                                       spatial, sums, dgamma,
                                                                       dbeta);
    check_launch();
  }
  void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                      const double* sums, double m, int64_t n, int64_t c, int64_t spatial,
                      float* dx) override {
    if (replaying()) return;
    const auto total = static_cast<size_t>(n * c * spatial);
    if (total == 0) return;
    k_bn_bwd_dx<<<blocks_for(total), kThreads, 0, stream_>>>(x, dy, stats, gamma, sums, m, n, c,
                                                              spatial, dx);
    check_launch();
  }
  void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w,
               int64_t pad, bool flip, uint64_t seed) override {
    const auto n = static_cast<size_t>(rows * c * h * w);
    if (n == 0) return;
    const Param<uint64_t> sp = param(seed);
    if (replaying()) return;
    k_augment<<<blocks_for(n), kThreads, 0, stream_>>>(x, y, rows, c, h, w, pad, flip, sp);
    check_launch();
  }
  void dropout_mask(float* mask, size_t n, double p, uint64_t seed) override {
    if (n == 0) return;
    const Param<uint64_t> sp = param(seed);
    if (replaying()) return;
    k_dropout_mask<<<blocks_for(n), kThreads, 0, stream_>>>(
        mask, n, p, static_cast<float>(1.0 / (1.0 - p)), sp);
    check_launch();
  }
  void multiply(const float* x, const float* mask, float* y, size_t n) override {
    if (replaying()) return;
    if (n == 0) return;
    k_multiply<<<blocks_for(n), kThreads, 0, stream_>>>(x, mask, y, n);
    check_launch();
  }
  void scale(float* x, size_t n, float a) override {
    if (replaying()) return;
    if (n == 0) return;
    k_scale<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, a);
    check_launch();
  }
  void sgd_update(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
                  float wd, bool nesterov) override {
    if (n == 0) return;
    const Param<float> lp = param(lr);
    if (replaying()) return;
    k_sgd<<<blocks_for(n), kThreads, 0, stream_>>>(p, g, buf, n, lp, momentum, wd, nesterov);
    check_launch();
  }
  void adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
                   float b2, float eps, float wd, bool decoupled, int64_t step) override {
    if (n == 0) return;
    const float bc1 = 1.f - std::pow(b1, static_cast<float>(step));
    const float bc2_sqrt = std::sqrt(1.f - std::pow(b2, static_cast<float>(step)));
    const Param<AdamScalars> sp = param(AdamScalars{lr, bc1, bc2_sqrt});
    if (replaying()) return;
    k_adam<<<blocks_for(n), kThreads, 0, stream_>>>(p, g, m, v, n, sp, b1, b2, eps, wd, decoupled);
    check_launch();
  }

  // ---- CUDA graphs of the steady-state step (see Device) ----
  void enable_graphs(bool on, size_t staging_bytes, AbortGate* gate) override {
    graphs_on_ = on;
    graph_staging_ = std::max<size_t>(staging_bytes, 4096);
    gate_ = gate;
    if (!on) drop_graphs();
    // The staging area now, not at the first capture (growing it drops graphs).
    if (on) ensure_staging(graph_staging_);
  }
  GraphMode graph_mode() const override {
    return mode_ == Mode::capture  ? GraphMode::capture
           : mode_ == Mode::replay ? GraphMode::replay
                                   : GraphMode::eager;
  }
  int64_t graph_launches() const override { return graph_launches_; }
  GraphMode graph_step_propose() const override {
    if (!graphs_on_ || mode_ != Mode::eager) return GraphMode::eager;
    // One eager step first: buffers, plans and workspaces take their sizes.
    if (warm_ < 1) return GraphMode::eager;
    // The graph of the timing slot step_mark(0) will take, if it was captured.
    return graphs_[(cur_ + 1) % kSlots] ? GraphMode::replay : GraphMode::capture;
  }
  GraphMode graph_step_begin(GraphMode agreed) override {
    if (!graphs_on_ || mode_ != Mode::eager) return GraphMode::eager;
    if (agreed == GraphMode::eager) {
      // Every rank runs this step op by op. The graphs still held here are dropped, so that all
      // ranks capture again together; this step is the warm-up.
      drop_graphs();
      warm_ = 1;
      return GraphMode::eager;
    }
    // agree_graph_mode picks capture or replay only where every rank proposed it.
    if (agreed != graph_step_propose())
      throw SystemError(strf("rank %d: CUDA graphs: the ranks agreed on %s, which this rank did "
                             "not propose",
                             rank_, agreed == GraphMode::capture ? "a capture" : "a replay"),
                        __FILE__, __LINE__);
    // The timing slot step_mark(0) will take; wait for its previous use here, not inside the
    // capture.
    const int k = (cur_ + 1) % kSlots;
    if (slots_[k].recorded) read_slot(slots_[k], true);
    if (cap_ < graph_staging_)
      throw SystemError(strf("rank %d: CUDA graphs: no staging area (enable_graphs first)", rank_),
                        __FILE__, __LINE__);
    next_area();  // an empty area for this step's values
    graph_slot_ = k;
    if (agreed == GraphMode::replay) {
      mode_ = Mode::replay;
    } else {
      DT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      mode_ = Mode::capture;
    }
    return graph_mode();
  }
  void graph_step_end() override {
    const int k = graph_slot_;
    if (mode_ == Mode::capture) {
      cudaGraph_t g = nullptr;
      mode_ = Mode::eager;
      DT_CUDA(cudaStreamEndCapture(stream_, &g));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      DT_CUDA(e);
      graphs_[k] = exec;
      graph_staged_[k] = used_;
    } else if (mode_ == Mode::replay) {
      mode_ = Mode::eager;
      if (used_ != graph_staged_[k])
        throw SystemError(strf("rank %d: a CUDA-graph step staged %zu bytes of per-step values "
                               "but its capture staged %zu (the step changed shape)",
                               rank_, used_, graph_staged_[k]),
                          __FILE__, __LINE__);
    } else {
      return;
    }
    // The graph may hold NCCL calls: launched only while its communicators are not aborted.
    const AbortGate::Pass pass = gate_ ? gate_->enter("CUDA graph launch") : AbortGate::Pass{};
    if (used_) {
      DT_CUDA(cudaMemcpyAsync(stage_dev_, areas_[area_].host, used_, cudaMemcpyHostToDevice,
                              stream_));
    }
    DT_CUDA(cudaGraphLaunch(graphs_[k], stream_));
    ++graph_launches_;
    next_area();  // the copy out of this area is queued; it is reused once that has run
  }
  void graph_step_abort() noexcept override {
    if (mode_ == Mode::capture) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();  // clear the capture's error
    }
    mode_ = Mode::eager;
  }

 private:
  void select() { DT_CUDA(cudaSetDevice(index_)); }
  bool replaying() const { return mode_ == Mode::replay; }
  void no_graph(const char* what) {
    if (mode_ != Mode::eager)
      throw SystemError(strf("rank %d: %s waits for the host inside a CUDA-graph step", rank_,
                             what),
                        __FILE__, __LINE__);
  }
  void drop_graphs() {
    for (auto& g : graphs_)
      if (g) {
        cudaGraphExecDestroy(g);
        g = nullptr;
      }
    warm_ = 0;
  }

  // Per-step values for kernels: copied from a pinned area to the device area. Eagerly, each
  // value is copied as it is staged (stream order keeps earlier readers safe); inside a graph
  // step they are collected and copied once, before the graph's launch, so that a replay reads
  // this step's values at the addresses the capture recorded.
  template <class T>
  const T* stage(const T* src, size_t count) {
    const size_t bytes = count * sizeof(T), span = (bytes + 15) / 16 * 16;
    if (mode_ == Mode::eager) {
      if (cap_ < span) ensure_staging(std::max<size_t>(span, 65536));
      if (used_ + span > cap_) next_area();
    } else if (used_ + span > cap_) {
      throw SystemError(strf("rank %d: a CUDA-graph step stages more than %zu bytes", rank_, cap_),
                        __FILE__, __LINE__);
    }
    char* h = areas_[area_].host + used_;
    char* d = stage_dev_ + used_;
    std::memcpy(h, src, bytes);
    used_ += span;
    if (mode_ == Mode::eager)
      DT_CUDA(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
    return reinterpret_cast<const T*>(d);
  }
  template <class T>
  Param<T> param(const T& v) {
    Param<T> p;
    p.value = v;
    if (mode_ != Mode::eager) p.at = stage(&v, 1);
    return p;
  }
  // Moves to the next pinned area, once the copies out of it (queued earlier) have run.
  void next_area() {
    Area& a = areas_[area_];
    if (used_ > 0) {
      DT_CUDA(cudaEventRecord(a.done, stream_));
      a.pending = true;
    }
    area_ = (area_ + 1) % kAreas;
    Area& b = areas_[area_];
    if (b.pending) {
      DT_CUDA(cudaEventSynchronize(b.done));
      b.pending = false;
    }
    used_ = 0;
  }
  void ensure_staging(size_t cap) {
    if (cap <= cap_) return;
    synchronize();
    free_staging();
    drop_graphs();  // they read the old device area
    for (auto& a : areas_) {
      DT_CUDA(cudaMallocHost(&a.host, cap));
      DT_CUDA(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming));
    }
    DT_CUDA(cudaMalloc(&stage_dev_, cap));
    cap_ = cap;
  }
  void free_staging() {
    for (auto& a : areas_) {
      if (a.host) cudaFreeHost(a.host);
      if (a.done) cudaEventDestroy(a.done);
      a = Area{};
    }
    if (stage_dev_) cudaFree(stage_dev_);
    stage_dev_ = nullptr;
    cap_ = used_ = 0;
    area_ = 0;
  }
  // The stored rows x cols matrix (leading dimension ld) as bfloat16 in `buf`.
  const __nv_bfloat16* to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                               Buffer<__nv_bfloat16>& buf) {
    const auto need = static_cast<size_t>((rows - 1) * ld + cols);
    if (buf.size() < need) buf.resize(*this, need);
    k_to_bf16<<<blocks_for(static_cast<size_t>(rows * cols)), kThreads, 0, stream_>>>(
        src, rows, cols, ld, buf.data());
    check_launch();
    return buf.data();
  }
  void from_bf16(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
    k_from_bf16<<<blocks_for(n), kThreads, 0, stream_>>>(src, dst, n, accumulate);
    check_launch();
  }
  void check_launch() {
    ++launches_;
    DT_CUDA(cudaGetLastError());
  }
  static int act_code(Activation a) {
    switch (a) {
      case Activation::relu: return 0;
      case Activation::tanh: return 1;
      case Activation::sigmoid: return 2;
      case Activation::gelu: return 3;
    }
    return 0;
  }

  // cuDNN's heuristics list algorithms best first; the first supported deterministic one wins
  // (bit-identical reruns, and CUDA-graph steps equal to eager ones), else the first supported
  // one, with a warning (see pick_algorithm).
  template <class Perf>
  const Perf& pick(const Perf* perf, int count, const char* what, const ConvGeom& g, int64_t n) {
    // Deterministic algorithms further down the list (FFT, say) can ask for gigabytes of
    // workspace at evaluation batch sizes: those above 1 GiB count only when nothing else works.
    constexpr size_t kMaxWorkspace = size_t(1) << 30;
    bool deterministic = false;
    int i = -1;
    for (const size_t cap : {kMaxWorkspace, SIZE_MAX}) {
      std::vector<AlgoOption> options;
      for (int k = 0; k < count; ++k)
        options.push_back({perf[k].status == CUDNN_STATUS_SUCCESS && perf[k].memory <= cap,
                           perf[k].determinism == CUDNN_DETERMINISTIC});
      i = pick_algorithm(options, &deterministic);
      if (i >= 0) break;
    }
    const auto ll = [](int64_t v) { return static_cast<long long>(v); };
    if (i < 0)
      throw SystemError(strf("rank %d: cuDNN offers no %s algorithm for a convolution of %lld "
                             "samples %lldx%lldx%lld to %lld channels, kernel %lld",
                             rank_, what, ll(n), ll(g.c), ll(g.h), ll(g.w), ll(g.oc), ll(g.k)),
                        __FILE__, __LINE__);
    if (!deterministic)
      gpu_warn(strf("rank %d: cuDNN has no deterministic %s algorithm for a convolution of %lld "
                    "samples %lldx%lldx%lld to %lld channels, kernel %lld; using algorithm %d, "
                    "whose results may differ in the last bits from run to run",
                    rank_, what, ll(n), ll(g.c), ll(g.h), ll(g.w), ll(g.oc), ll(g.k),
                    static_cast<int>(perf[i].algo)));
    return perf[i];
  }

  ConvPlan& plan(const ConvGeom& g, int64_t n) {
    const PlanKey key{g.c, g.h, g.w, g.oc, g.k, g.stride, g.pad, n};
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto owned = std::make_unique<ConvPlan>();  // released if anything below throws
    ConvPlan& p = *owned;
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    DT_CUDNN(cudnnCreateTensorDescriptor(&p.x));
    DT_CUDNN(cudnnCreateTensorDescriptor(&p.y));
    DT_CUDNN(cudnnCreateTensorDescriptor(&p.yf));
    DT_CUDNN(cudnnCreateTensorDescriptor(&p.b));
    DT_CUDNN(cudnnCreateFilterDescriptor(&p.w));
    DT_CUDNN(cudnnCreateConvolutionDescriptor(&p.conv));
    // bf16: cuDNN's bfloat16 configuration (bf16 tensors, fp32 accumulation).
    const cudnnDataType_t dt = bf16_ ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    DT_CUDNN(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, dt, i(n), i(g.c), i(g.h), i(g.w)));
    DT_CUDNN(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, dt, i(n), i(g.oc), i(g.ho()),
                                        i(g.wo())));
    DT_CUDNN(cudnnSetTensor4dDescriptor(p.yf, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(n), i(g.oc),
                                        i(g.ho()), i(g.wo())));
    DT_CUDNN(cudnnSetTensor4dDescriptor(p.b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(g.oc), 1,
                                        1));
    DT_CUDNN(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NCHW, i(g.oc), i(g.c), i(g.k),
                                        i(g.k)));
    // Cross-correlation, as every framework (and the CPU twin) computes.
    DT_CUDNN(cudnnSetConvolution2dDescriptor(p.conv, i(g.pad), i(g.pad), i(g.stride),
                                             i(g.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    // FMA: FP32 arithmetic, no TF32; DEFAULT lets cuDNN use TF32 tensor cores for FP32 data.
    DT_CUDNN(cudnnSetConvolutionMathType(p.conv, bf16_   ? CUDNN_TENSOR_OP_MATH
                                                 : tf32_ ? CUDNN_DEFAULT_MATH
                                                         : CUDNN_FMA_MATH));
    // Every algorithm, ranked, so that a deterministic one further down the list is seen.
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DT_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(dnn_, p.x, p.w, p.conv, p.y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fwd));
    p.fwd = pick(fwd, got, "forward", g, n).algo;
    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DT_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        dnn_, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd));
    p.bwd_data = pick(bd, got, "backward-data", g, n).algo;
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DT_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        dnn_, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf));
    p.bwd_filter = pick(bf, got, "backward-filter", g, n).algo;
    size_t w1 = 0, w2 = 0, w3 = 0;
    DT_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(dnn_, p.x, p.w, p.conv, p.y, p.fwd, &w1));
    DT_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, p.w, p.y, p.conv, p.x,
                                                          p.bwd_data, &w2));
    DT_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, p.x, p.y, p.conv, p.w,
                                                            p.bwd_filter, &w3));
    p.workspace = std::max({w1, w2, w3});
    if (p.workspace > workspace_bytes_) {
      if (mode_ != Mode::eager)
        throw SystemError(strf("rank %d: a new convolution shape inside a CUDA-graph step",
                               rank_),
                          __FILE__, __LINE__);
      drop_graphs();
      synchronize();
      if (workspace_) DT_CUDA(cudaFree(workspace_));
      workspace_ = nullptr;  // no dangling pointer if the allocation below fails
      workspace_bytes_ = 0;
      DT_CUDA(cudaMalloc(&workspace_, p.workspace));
      workspace_bytes_ = p.workspace;
    }
    return *plans_.emplace(key, std::move(owned)).first->second;
  }

  static constexpr int kSlots = 4;
  struct Slot {
    cudaEvent_t ev[4] = {nullptr, nullptr, nullptr, nullptr};
    bool recorded = false;
  };
  void read_slot(Slot& sl, bool wait) {
    if (!wait && cudaEventQuery(sl.ev[3]) == cudaErrorNotReady) return;
    DT_CUDA(cudaEventSynchronize(sl.ev[3]));
    for (int i = 0; i < 3; ++i) {
      float ms = 0;
      DT_CUDA(cudaEventElapsedTime(&ms, sl.ev[i], sl.ev[i + 1]));
      taken_[i] += ms * 1e-3;
    }
    ++taken_steps_;
    sl.recorded = false;
  }
  Slot slots_[kSlots];
  int cur_ = 0;
  double taken_[3] = {0, 0, 0};
  int taken_steps_ = 0;

  int index_, rank_;
  bool tf32_, bf16_;
  Buffer<__nv_bfloat16> a16_, b16_, x16_, w16_, y16_, dy16_, dw16_;  // bf16 operands
  int64_t launches_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  Buffer<double> row_stats_;
  void* blas_ws_ = nullptr;
  static constexpr size_t kBlasWorkspace = size_t{32} << 20;

  // CUDA graphs: one per timing slot (each records its slot's events).
  enum class Mode { eager, capture, replay };
  Mode mode_ = Mode::eager;
  bool graphs_on_ = false;
  size_t graph_staging_ = 0;
  AbortGate* gate_ = nullptr;  // of the communicators the graphs hold NCCL calls of
  int warm_ = 0;  // eager steps since the graphs were last dropped
  int graph_slot_ = -1;
  cudaGraphExec_t graphs_[kSlots] = {nullptr, nullptr, nullptr, nullptr};
  size_t graph_staged_[kSlots] = {0, 0, 0, 0};
  int64_t graph_launches_ = 0;

  // Staging of per-step values: a ring of pinned host areas and one device area.
  static constexpr int kAreas = 4;
  struct Area {
    char* host = nullptr;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  Area areas_[kAreas];
  int area_ = 0;
  size_t used_ = 0, cap_ = 0;
  char* stage_dev_ = nullptr;
  using PlanKey = std::array<int64_t, 8>;  // geometry and batch size
  std::map<PlanKey, std::unique_ptr<ConvPlan>> plans_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int index, int rank, Precision precision) {
  return std::make_unique<CudaDevice>(index, rank, precision);
}

namespace {
__global__ void k_empty() {}

// Uniform in [-1, 1): GEMM floors on data like a network's, not on zeros (which take less power
// and so can run at higher clocks).
__global__ void k_fill_uniform(float* x, size_t n, uint64_t seed) {
  GRID_STRIDE(i, n) x[i] = static_cast<float>(2.0 * counter_uniform(seed, i) - 1.0);
}

float median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

GpuFloors measure_gpu(int index) {
  const int rank_ = 0;  // for the error macros
  GpuFloors f;
  DT_CUDA(cudaSetDevice(index));
  cudaStream_t s = nullptr;
  DT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a = nullptr, b = nullptr;
  DT_CUDA(cudaEventCreate(&a));
  DT_CUDA(cudaEventCreate(&b));
  // Launch latency: 1000 empty kernels back to back, timed by events, 20 times.
  std::vector<float> per;
  for (int rep = 0; rep < 21; ++rep) {
    DT_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < 1000; ++i) k_empty<<<1, 1, 0, s>>>();
    DT_CUDA(cudaEventRecord(b, s));
    DT_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    DT_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (rep > 0) per.push_back(ms);  // the first warms up
  }
  f.launch_us = median_of(per);  // ms per 1000 launches = us per launch
  // SGEMM throughput on 8192^3, FP32 and TF32.
  const int n = 8192;
  float *x = nullptr, *y = nullptr, *z = nullptr;
  DT_CUDA(cudaMalloc(&x, sizeof(float) * n * n));
  DT_CUDA(cudaMalloc(&y, sizeof(float) * n * n));
  DT_CUDA(cudaMalloc(&z, sizeof(float) * n * n));
  const size_t nn = static_cast<size_t>(n) * n;
  k_fill_uniform<<<blocks_for(nn), kThreads, 0, s>>>(x, nn, 1);
  DT_CUDA(cudaGetLastError());
  k_fill_uniform<<<blocks_for(nn), kThreads, 0, s>>>(y, nn, 2);
  DT_CUDA(cudaGetLastError());
  cublasHandle_t h = nullptr;
  DT_CUBLAS(cublasCreate(&h));
  DT_CUBLAS(cublasSetStream(h, s));
  for (bool tf32 : {false, true}) {
    // FP32: cuBLAS's default math, what PyTorch uses with TF32 off (pedantic math may be
    // slower and buys nothing for a floor).
    DT_CUBLAS(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    const float one = 1.f, zero = 0.f;
    std::vector<float> ms_list;
    for (int rep = 0; rep < 6; ++rep) {
      DT_CUDA(cudaEventRecord(a, s));
      DT_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, n, y, n, &zero, z, n));
      DT_CUDA(cudaEventRecord(b, s));
      DT_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      DT_CUDA(cudaEventElapsedTime(&ms, a, b));
      if (rep > 0) ms_list.push_back(ms);
    }
    const double tflops = 2.0 * n * double(n) * n / (median_of(ms_list) * 1e-3) / 1e12;
    (tf32 ? f.sgemm_tf32_tflops : f.sgemm_fp32_tflops) = tflops;
  }
  cublasDestroy(h);
  cudaFree(x);
  cudaFree(y);
  cudaFree(z);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return f;
}

}  // namespace dtrain
