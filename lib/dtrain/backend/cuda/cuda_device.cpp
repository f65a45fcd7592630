// The CUDA backend's device (see cuda_device.hpp): memory, step timing, graph steps, cuBLAS
// GEMMs and the dispatch of every other operation to its kernel launcher. Convolutions are in
// cudnn_conv.cpp; the kernels in kernels/*.cuh.
#include "dtrain/backend/cuda/cuda_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/gpu_check.hpp"
#include "dtrain/backend/math.hpp"
#include "dtrain/base/error.hpp"

namespace dtrain {

namespace {
cudaStream_t create_stream(int index, int rank) {
  DT_CUDA(cudaSetDevice(index), rank);
  cudaStream_t s = nullptr;
  DT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), rank);
  return s;
}
}  // namespace

CudaDevice::CudaDevice(int index, int rank, Precision precision)
    : index_(index),
      rank_(rank),
      tf32_(precision == Precision::tf32),
      bf16_(precision == Precision::bf16),
      stream_(create_stream(index, rank)),
      graph_(stream_, rank) {
  DT_CUBLAS(cublasCreate(&blas_), rank_);
  DT_CUBLAS(cublasSetStream(blas_, stream_), rank_);
  // fp32: plain FP32 GEMMs like the CPU twin; tf32: tensor cores with TF32 inputs; bf16:
  // bfloat16 operands (converted by dtrain) on tensor cores, fp32 accumulation and output.
  DT_CUBLAS(cublasSetMathMode(blas_, tf32_   ? CUBLAS_TF32_TENSOR_OP_MATH
                                     : bf16_ ? CUBLAS_DEFAULT_MATH
                                             : CUBLAS_PEDANTIC_MATH),
            rank_);
  DT_CUDNN(cudnnCreate(&dnn_), rank_);
  DT_CUDNN(cudnnSetStream(dnn_, stream_), rank_);
  cudaDeviceProp prop{};
  DT_CUDA(cudaGetDeviceProperties(&prop, index_), rank_);
  name_ = fmt::format("cuda:{} ({})", index_, prop.name);
  anchor_clock();  // the first steps' marks have a clock before the trainer anchors again
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  // Everything queued (kernels, graph launches recording the slots' events, copies out of the
  // staging area) finishes before what it uses is destroyed. A capture in progress ends first
  // (a stream in capture cannot be waited for); errors are dropped (no throw from here).
  graph_.abort();
  if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
  for (auto& sl : slots_)
    for (auto e : sl.ev) cudaEventDestroy(e);
  if (anchor_) cudaEventDestroy(anchor_);
  graph_.drop();
  row_stats_ = Buffer<double>();  // while the stream still exists
  norm_partials_ = Buffer<double>();
  channel_partials_ = Buffer<double>();
  token_sort_ = Buffer<int32_t>();
  sort_tmp_ = Buffer<unsigned char>();
  attn_heads_ = Buffer<float>();
  attn_ds_ = Buffer<float>();
  for (auto* b : {&a16_, &b16_, &x16_, &w16_, &y16_, &dy16_, &dw16_}) *b = Buffer<Bf16>();
  graph_.release();  // the staging area
  plans_.clear();    // their descriptors
  for (void* ws : {workspace_, blas_ws_}) {
    gpu_memory().freed(ws);
    if (ws) cudaFree(ws);
  }
  cudnnDestroy(dnn_);
  cublasDestroy(blas_);
  cudaStreamDestroy(stream_);
}

std::unique_ptr<Device> make_cuda_device(int index, int rank, Precision precision) {
  return std::make_unique<CudaDevice>(index, rank, precision);
}

// ---- queue, step timing and graph steps ----

void CudaDevice::synchronize() {
  DT_CUDA(cudaStreamSynchronize(stream_), rank_);
}

namespace {
struct CudaFence final : QueueFence {
  cudaEvent_t event = nullptr;
  ~CudaFence() override {
    if (event) cudaEventDestroy(event);  // released once a pending record completes
  }
};
CudaFence& cuda_fence(QueueFence& f) {
  auto* c = dynamic_cast<CudaFence*>(&f);
  if (!c) DTRAIN_THROW_SYSTEM("a queue fence of another device kind reached the CUDA device");
  return *c;
}
}  // namespace

void CudaDevice::no_fence_in_graph() const {
  // Graphs are off where replicas share a GPU (cuda_graph_state): a fence inside a capture
  // would tie the graph to another stream's event.
  if (graph_.mode() != GraphMode::eager)
    throw SystemError(fmt::format("rank {}: a fence between replicas' streams inside a "
                                  "CUDA-graph step",
                                  rank_),
                      __FILE__, __LINE__);
}

std::unique_ptr<QueueFence> CudaDevice::make_fence() {
  select();
  auto f = std::make_unique<CudaFence>();
  DT_CUDA(cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming), rank_);
  return f;
}

void CudaDevice::record(QueueFence& f) {
  no_fence_in_graph();
  DT_CUDA(cudaEventRecord(cuda_fence(f).event, stream_), rank_);
}

void CudaDevice::wait_for(QueueFence& f) {
  no_fence_in_graph();
  DT_CUDA(cudaStreamWaitEvent(stream_, cuda_fence(f).event, 0), rank_);
}

void CudaDevice::check_launch() {
  ++launches_;
  DT_CUDA(cudaGetLastError(), rank_);
}

void CudaDevice::select() {
  DT_CUDA(cudaSetDevice(index_), rank_);
}

void CudaDevice::no_graph(const char* what) const {
  if (graph_.mode() != GraphMode::eager)
    throw SystemError(
        fmt::format("rank {}: {} waits for the host inside a CUDA-graph step", rank_, what),
        __FILE__, __LINE__);
}

// Step phases timed by events on the stream. Inside a CUDA graph the events are graph nodes
// (one graph per slot, so each records its own slot's events); a replay only keeps the ring's
// books.
void CudaDevice::step_begin(int64_t step) {
  cur_ = next_slot();
  if (slots_[cur_].recorded) read_slot(slots_[cur_], true);
  Slot& sl = slots_[cur_];
  sl.step = step;
  sl.used = 0;
  record_mark(sl, -1);
}

void CudaDevice::step_mark(int phase) {
  record_mark(slots_[cur_], phase);
}

void CudaDevice::record_mark(Slot& sl, int phase) {
  if (sl.used == sl.ev.size()) {
    cudaEvent_t e = nullptr;
    DT_CUDA(cudaEventCreate(&e), rank_);
    sl.ev.push_back(e);
    sl.phase.push_back(phase);
  }
  const size_t j = sl.used++;
  sl.phase[j] = phase;
  const GraphMode mode = graph_.mode();
  if (mode == GraphMode::capture)
    DT_CUDA(cudaEventRecordWithFlags(sl.ev[j], stream_, cudaEventRecordExternal), rank_);
  else if (mode == GraphMode::eager)
    DT_CUDA(cudaEventRecord(sl.ev[j], stream_), rank_);
  sl.recorded = true;
}

// The host reads its steady clock right after the anchor's event is seen done: the device's
// clock is tied to the host's to within that wait's latency (microseconds).
void CudaDevice::anchor_clock() {
  no_graph("anchoring the device clock");
  read_slots(true);  // the steps before this anchor are timed from the one before
  if (!anchor_) DT_CUDA(cudaEventCreate(&anchor_), rank_);
  DT_CUDA(cudaEventRecord(anchor_, stream_), rank_);
  DT_CUDA(cudaEventSynchronize(anchor_), rank_);
  anchor_host_ = std::chrono::duration<double>(
                     std::chrono::steady_clock::now().time_since_epoch())
                     .count();
}

size_t CudaDevice::take_step_marks(std::vector<DeviceMark>& out, bool wait) {
  read_slots(wait);
  size_t steps = 0;
  for (const DeviceMark& m : marks_) steps += m.phase < 0;
  out.insert(out.end(), marks_.begin(), marks_.end());
  marks_.clear();
  return steps;
}

void CudaDevice::read_slots(bool wait) {
  for (int i = 1; i <= kSlots; ++i) {  // from the slot after the current one: the oldest
    Slot& sl = slots_[(cur_ + i) % kSlots];
    if (sl.recorded && !read_slot(sl, wait)) break;  // the later ones are not done either
  }
}

// The step's start from the anchor (a float of milliseconds: a resolution of about 6e-8 of
// the time since the anchor), each later mark from the one before.
bool CudaDevice::read_slot(Slot& sl, bool wait) {
  const cudaEvent_t last = sl.ev[sl.used - 1];
  if (!wait && cudaEventQuery(last) == cudaErrorNotReady) return false;
  DT_CUDA(cudaEventSynchronize(last), rank_);
  float ms = 0;
  DT_CUDA(cudaEventElapsedTime(&ms, anchor_, sl.ev[0]), rank_);
  double t = anchor_host_ + 1e-3 * ms;
  marks_.push_back({sl.step, -1, t});
  for (size_t j = 1; j < sl.used; ++j) {
    DT_CUDA(cudaEventElapsedTime(&ms, sl.ev[j - 1], sl.ev[j]), rank_);
    t += 1e-3 * ms;
    marks_.push_back({sl.step, sl.phase[j], t});
  }
  sl.recorded = false;
  return true;
}

void CudaDevice::enable_graphs(bool on, size_t staging_bytes, AbortGate* gate) {
  graph_.enable(on, staging_bytes, gate);
}

// A step takes the graph of the timing slot step_begin will take.
GraphMode CudaDevice::graph_step_propose() const {
  return graph_.propose(next_slot());
}

GraphMode CudaDevice::graph_step_begin(GraphMode agreed) {
  const int k = next_slot();
  // Wait for the slot's previous use here, not inside the capture.
  return graph_.begin(agreed, k, [&] {
    if (slots_[k].recorded) read_slot(slots_[k], true);
  });
}

// ---- memory ----

void* CudaDevice::alloc_bytes(size_t bytes) {
  if (graph_.mode() != GraphMode::eager)
    throw SystemError(fmt::format("rank {}: a GPU allocation of {} bytes inside a CUDA-graph "
                                  "step (a step changed shape after warm-up)",
                                  rank_, bytes),
                      __FILE__, __LINE__);
  select();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess)
    throw SystemError(fmt::format("rank {}: out of GPU memory on cuda:{} allocating {} bytes ({})",
                                  rank_, index_, bytes, cudaGetErrorString(e)),
                      __FILE__, __LINE__);
  gpu_memory().allocated(index_, p, std::max<size_t>(bytes, 1));
  DT_CUDA(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream_), rank_);
  return p;
}

void CudaDevice::free_bytes(void* p) {
  cudaStreamSynchronize(stream_);
  gpu_memory().freed(p);
  cudaFree(p);
  graph_.drop();  // they may point into it
}

void CudaDevice::upload(void* dst, const void* src, size_t bytes) {
  no_graph("upload");
  DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), rank_);
  synchronize();  // the host buffer may change as soon as this returns
}

void CudaDevice::download(void* dst, const void* src, size_t bytes) {
  no_graph("download");
  DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), rank_);
  synchronize();
}

void CudaDevice::zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  enqueue([&] { DT_CUDA(cudaMemsetAsync(p, 0, bytes, stream_), rank_); });
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  enqueue(
      [&] { DT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), rank_); });
}

void CudaDevice::fill(float* x, size_t n, float v) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::fill(x, n, v, s); });
}

// ---- GEMM (cuBLAS) ----

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
void CudaDevice::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (!blas_ws_) make_blas_workspace();
  // cuBLAS takes int sizes: checked, not truncated.
  const int in = narrow_int(n, "cuBLAS GEMM n", rank_), im = narrow_int(m, "cuBLAS GEMM m", rank_);
  const int ik = narrow_int(k, "cuBLAS GEMM k", rank_);
  const int ilda = narrow_int(lda, "cuBLAS GEMM lda", rank_);
  const int ildb = narrow_int(ldb, "cuBLAS GEMM ldb", rank_);
  const int ildc = narrow_int(ldc, "cuBLAS GEMM ldc", rank_);
  enqueue([&] {
    const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (bf16_ && k > 0) {
      const Bf16* a16 = to_bf16(a, ta ? k : m, ta ? m : k, lda, a16_);
      const Bf16* b16 = to_bf16(b, tb ? n : k, tb ? k : n, ldb, b16_);
      ++launches_;
      DT_CUBLAS(cublasGemmEx(blas_, op_b, op_a, in, im, ik, &alpha, b16, CUDA_R_16BF, ildb, a16,
                             CUDA_R_16BF, ilda, &beta, c, CUDA_R_32F, ildc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                rank_);
      return;
    }
    ++launches_;
    DT_CUBLAS(cublasSgemm(blas_, op_b, op_a, in, im, ik, &alpha, b, ildb, a, ilda, &beta, c, ildc),
              rank_);
  });
}

// A workspace of our own, so that cuBLAS never allocates inside a CUDA graph capture. Made at
// the first GEMM (always an eager step: a graph is captured only after one), so that a device
// that never multiplies (the weights that replicas on one GPU share) holds none.
void CudaDevice::make_blas_workspace() {
  if (graph_.mode() != GraphMode::eager)
    throw SystemError(fmt::format("rank {}: a first GEMM inside a CUDA-graph step", rank_),
                      __FILE__, __LINE__);
  select();
  DT_CUDA(cudaMalloc(&blas_ws_, kBlasWorkspace), rank_);
  gpu_memory().allocated(index_, blas_ws_, kBlasWorkspace);
  DT_CUBLAS(cublasSetWorkspace(blas_, blas_ws_, kBlasWorkspace), rank_);
}

const kernels::Bf16* CudaDevice::to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                         Buffer<Bf16>& buf) {
  const auto need = static_cast<size_t>((rows - 1) * ld + cols);
  if (buf.size() < need) buf.resize(*this, need);
  launch([&](cudaStream_t s) { kernels::to_bf16(src, rows, cols, ld, buf.data(), s); });
  return buf.data();
}

const kernels::Bf16* CudaDevice::to_bf16_nhwc(const float* src, int64_t n, int64_t c, int64_t hw,
                                              Buffer<Bf16>& buf) {
  const auto need = static_cast<size_t>(n * c * hw);
  if (buf.size() < need) buf.resize(*this, need);
  launch([&](cudaStream_t s) { kernels::to_bf16_nhwc(src, n, c, hw, buf.data(), s); });
  return buf.data();
}

void CudaDevice::from_bf16_nhwc(const Bf16* src, int64_t n, int64_t c, int64_t hw, float* dst,
                                bool accumulate) {
  launch([&](cudaStream_t s) { kernels::from_bf16_nhwc(src, n, c, hw, dst, accumulate, s); });
}

// ---- dtrain's kernels ----

void CudaDevice::add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  launch([&](cudaStream_t s) { kernels::add_bias(y, bias, rows, cols, s); });
}

void CudaDevice::bias_grad(const float* dy, float* db, int64_t rows, int64_t cols,
                           Accumulate mode) {
  if (cols == 0) return;
  launch(
      [&](cudaStream_t s) { kernels::bias_grad(dy, db, rows, cols, mode == Accumulate::add, s); });
}

void CudaDevice::activation_forward(Activation a, const float* x, float* y, size_t n) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::activation_forward(a, x, y, n, s); });
}

void CudaDevice::activation_backward(Activation a, const float* x, const float* y, const float* dy,
                                     float* dx, size_t n) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::activation_backward(a, x, y, dy, dx, n, s); });
}

void CudaDevice::softmax_xent(const float* logits, const int32_t* labels, int64_t rows,
                              int64_t classes, float grad_scale, float* dlogits, double* stats,
                              double smoothing, double stat_scale) {
  if (rows == 0) return;
  enqueue([&] {
    if (row_stats_.size() < static_cast<size_t>(2 * rows)) row_stats_.resize(*this, 2 * rows);
    double* row_stats = row_stats_.data();
    launch([&](cudaStream_t s) {
      kernels::softmax_xent_rows(logits, labels, rows, classes, grad_scale, dlogits, row_stats,
                                 smoothing, s);
    });
    launch([&](cudaStream_t s) { kernels::sum_pairs(row_stats, rows, stats, stat_scale, s); });
  });
}

void CudaDevice::gather(const float* src, const int32_t* src_labels, int64_t features,
                        const int64_t* idx, int64_t count, float* dst, int32_t* dst_labels) {
  if (count == 0) return;
  // The indices travel through pinned memory asynchronously (staged: see CudaGraph::stage).
  const int64_t* didx = stage(idx, static_cast<size_t>(count));
  launch([&](cudaStream_t s) {
    kernels::gather(src, src_labels, features, didx, count, dst, dst_labels, s);
  });
}

void CudaDevice::maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                 int64_t k, int64_t stride, int64_t pad, float* y,
                                 int32_t* argmax) {
  const int64_t ho = math::pool_out(h, k, stride, pad), wo = math::pool_out(w, k, stride, pad);
  if (n * c * ho * wo == 0) return;
  launch([&](cudaStream_t s) {
    kernels::maxpool_forward(x, n * c, h, w, k, stride, pad, ho, wo, y, argmax, s);
  });
}

void CudaDevice::maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c,
                                  int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad,
                                  float* dx) {
  const int64_t ho = math::pool_out(h, k, stride, pad), wo = math::pool_out(w, k, stride, pad);
  if (n * c * h * w == 0) return;
  launch([&](cudaStream_t s) {
    kernels::maxpool_backward(dy, argmax, n * c, h, w, k, stride, pad, ho, wo, dx, s);
  });
}

void CudaDevice::nchw_only(int64_t block) {
  if (block != 0)
    DTRAIN_THROW_SYSTEM(fmt::format("a tensor in channel blocks of {} reached the CUDA backend, "
                                    "whose tensors are NCHW",
                                    block));
}

void CudaDevice::convert_layout(const float* x, int64_t n, int64_t c, int64_t spatial,
                                int64_t from, int64_t to, float* y) {
  nchw_only(from);
  nchw_only(to);
  copy(y, x, static_cast<size_t>(n * c * spatial) * sizeof(float));
}

void CudaDevice::channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                                 int64_t block, double* moments) {
  nchw_only(block);
  if (c == 0) return;
  launch([&](cudaStream_t s) {
    ++launches_;  // two kernels; launch() counts one
    kernels::channel_moments(x, n, c, spatial, moments, channel_scratch(c), s);
  });
}

void CudaDevice::bn_prepare(const double* moments, double count, double eps, double momentum,
                            float* running, float* stats, int64_t c) {
  if (c == 0) return;
  launch([&](cudaStream_t s) {
    kernels::bn_prepare(moments, count, eps, momentum, running, stats, c, s);
  });
}

void CudaDevice::bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                          int64_t n, int64_t c, int64_t spatial, int64_t block, float* y,
                          bool relu) {
  nchw_only(block);
  if (n * c * spatial == 0) return;
  launch([&](cudaStream_t s) {
    kernels::bn_apply(x, stats, gamma, beta, n, c, spatial, y, relu, s);
  });
}

void CudaDevice::bn_backward_sums(const float* x, const float* dy, const float* stats,
                                  const float* gamma, int64_t n, int64_t c, int64_t spatial,
                                  int64_t block, double* sums, float* dgamma, float* dbeta) {
  nchw_only(block);
  if (c == 0) return;
  launch([&](cudaStream_t s) {
    ++launches_;  // two kernels; launch() counts one
    kernels::bn_backward_sums(x, dy, stats, gamma, n, c, spatial, sums, dgamma, dbeta,
                              channel_scratch(c), s);
  });
}

void CudaDevice::bn_backward_dx(const float* x, const float* dy, const float* stats,
                                const float* gamma, const double* sums, double m, int64_t n,
                                int64_t c, int64_t spatial, int64_t block, float* dx) {
  nchw_only(block);
  if (n * c * spatial == 0) return;
  launch([&](cudaStream_t s) {
    kernels::bn_backward_dx(x, dy, stats, gamma, sums, m, n, c, spatial, dx, s);
  });
}

void CudaDevice::augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w,
                         int64_t pad, bool reflect, bool flip, uint64_t seed) {
  if (rows * c * h * w == 0) return;
  const kernels::Param<uint64_t> sp = param(seed);
  launch([&](cudaStream_t s) { kernels::augment(x, y, rows, c, h, w, pad, reflect, flip, sp, s); });
}

void CudaDevice::dropout_mask(float* mask, size_t n, double p, uint64_t seed) {
  if (n == 0) return;
  const kernels::Param<uint64_t> sp = param(seed);
  launch([&](cudaStream_t s) { kernels::dropout_mask(mask, n, p, math::dropout_keep(p), sp, s); });
}

void CudaDevice::multiply(const float* x, const float* mask, float* y, size_t n) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::multiply(x, mask, y, n, s); });
}

void CudaDevice::add(const float* a, const float* b, float* y, size_t n) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::add(a, b, y, n, s); });
}

void CudaDevice::add_relu(const float* a, const float* b, float* y, size_t n) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::add_relu(a, b, y, n, s); });
}

// ---- transformer operations ----

void CudaDevice::embedding_forward(const float* tokens, int64_t stride, const float* wte,
                                   const float* wpe, int64_t rows, int64_t t, int64_t c,
                                   int64_t vocab, float* y) {
  if (rows * t * c == 0) return;
  launch([&](cudaStream_t s) {
    kernels::embedding_forward(tokens, stride, wte, wpe, rows, t, c, vocab, y, s);
  });
}

// dwte through a stable sort of the positions by token id, so that each id's positions are
// added in ascending order, as the CPU twin adds them (the same bits); dwpe one thread per
// element. The sort (CUB, several kernels) counts as one launch.
void CudaDevice::embedding_backward(const float* tokens, int64_t stride, const float* dy,
                                    int64_t rows, int64_t t, int64_t c, int64_t vocab,
                                    float* dwte, float* dwpe) {
  if (rows * t * c == 0) return;
  const int n = narrow_int(rows * t, "embedding gradient: token positions", rank_);
  narrow_int(vocab, "embedding gradient: vocabulary", rank_);
  enqueue([&] {
    const auto un = static_cast<size_t>(n);
    if (token_sort_.size() < 4 * un) token_sort_.resize(*this, 4 * un);
    const size_t tmp_bytes = kernels::sort_tokens_bytes(n, vocab);
    // Never null: CUB takes a null scratch for a query of its size.
    if (sort_tmp_.size() < std::max<size_t>(tmp_bytes, 16))
      sort_tmp_.resize(*this, std::max<size_t>(tmp_bytes, 16));
    int32_t *keys = token_sort_.data(), *pos = keys + un, *skeys = pos + un, *spos = skeys + un;
    void* tmp = sort_tmp_.data();
    launch([&](cudaStream_t s) {
      kernels::token_keys(tokens, stride, rows, t, vocab, keys, pos, s);
    });
    launch([&](cudaStream_t s) {
      DT_CUDA(kernels::sort_tokens(tmp, tmp_bytes, keys, skeys, pos, spos, n, vocab, s), rank_);
    });
    launch([&](cudaStream_t s) { kernels::embedding_dwte(skeys, spos, n, dy, c, dwte, s); });
  });
  launch([&](cudaStream_t s) { kernels::embedding_dwpe(dy, rows, t, c, dwpe, s); });
}

void CudaDevice::next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t,
                             int64_t vocab, int32_t* labels) {
  if (rows * t == 0) return;
  launch([&](cudaStream_t s) { kernels::next_tokens(tokens, stride, rows, t, vocab, labels, s); });
}

void CudaDevice::layernorm_forward(const float* x, const float* gamma, const float* beta,
                                   int64_t n, int64_t c, float eps, float* y, float* stats) {
  if (n * c == 0) return;
  launch([&](cudaStream_t s) {
    kernels::layernorm_forward(x, gamma, beta, n, c, eps, y, stats, s);
  });
}

void CudaDevice::layernorm_backward(const float* x, const float* dy, const float* gamma,
                                    const float* stats, int64_t n, int64_t c, float* dx,
                                    float* dgamma, float* dbeta) {
  if (n * c == 0) return;
  if (dx) launch([&](cudaStream_t s) { kernels::layernorm_dx(x, dy, gamma, stats, n, c, dx, s); });
  launch([&](cudaStream_t s) {
    kernels::layernorm_dparams(x, dy, stats, n, c, dgamma, dbeta, s);
  });
}

// Attention as llm.c does it: q, k, v split into [rows, heads, t, d] (attn_scratch), each
// product one strided batched GEMM over the rows x heads pairs. The GEMMs run in the math mode
// of the device's cuBLAS handle: FP32 (precision fp32, and bf16, whose bfloat16 operands are
// the dense layers' and convolutions' only), TF32 tensor cores (tf32). cuBLAS is column-major:
// a row-major [m, n] matrix is its column-major transpose, so each product is written
// transposed (C^T = B^T A^T).
CudaDevice::AttnDims CudaDevice::attn_dims(int64_t rows, int64_t t, int64_t c, int64_t heads) {
  const int64_t d = c / heads;
  AttnDims a{};
  a.t = narrow_int(t, "attention: positions", rank_);
  a.d = narrow_int(d, "attention: head size", rank_);
  a.batch = narrow_int(rows * heads, "attention: samples x heads", rank_);
  a.nc = rows * t * c;
  a.tt = static_cast<long long>(t) * t;
  a.td = static_cast<long long>(t) * d;
  return a;
}

void CudaDevice::batched_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                              int lda, long long sa, const float* b, int ldb, long long sb,
                              float* c, int ldc, long long sc, int batch) {
  const float beta = 0.f;
  ++launches_;
  DT_CUBLAS(cublasSgemmStridedBatched(blas_, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, sa,
                                      b, ldb, sb, &beta, c, ldc, sc, batch),
            rank_);
}

double* CudaDevice::channel_scratch(int64_t c) {
  const size_t need = kernels::channel_scratch_size(c);
  if (channel_partials_.size() < need) channel_partials_.resize(*this, need);
  return channel_partials_.data();
}

float* CudaDevice::attn_scratch(int64_t nc) {
  const auto need = static_cast<size_t>(6 * nc);
  if (attn_heads_.size() < need) attn_heads_.resize(*this, need);
  return attn_heads_.data();
}

void CudaDevice::attention_forward(const float* qkv, int64_t rows, int64_t t, int64_t c,
                                   int64_t heads, float* att, float* y) {
  if (rows * t * c == 0) return;
  const AttnDims a = attn_dims(rows, t, c, heads);
  const int64_t d = a.d;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));  // as the CPU twin's
  if (!blas_ws_) make_blas_workspace();
  enqueue([&] {
    float* q = attn_scratch(a.nc);
    float *k = q + a.nc, *v = k + a.nc, *o = v + a.nc;
    launch([&](cudaStream_t s) { kernels::split_heads(qkv, 3 * c, 3, rows, t, heads, d, q, s); });
    // S = scale q k^T: S^T = scale k q^T.
    batched_gemm(true, false, a.t, a.t, a.d, scale, k, a.d, a.td, q, a.d, a.td, att, a.t, a.tt,
                 a.batch);
    launch([&](cudaStream_t s) { kernels::causal_softmax(att, rows * heads * t, t, s); });
    // o = P v: o^T = v^T P^T.
    batched_gemm(false, false, a.d, a.t, a.t, 1.f, v, a.d, a.td, att, a.t, a.tt, o, a.d, a.td,
                 a.batch);
    launch([&](cudaStream_t s) { kernels::merge_heads(o, 1, rows, t, heads, d, y, c, s); });
  });
}

// dP = dy v^T, dv = P^T dy, dS = P (dP - rowsum(dP P)) * scale, dq = dS k, dk = dS^T q.
void CudaDevice::attention_backward(const float* qkv, const float* att, const float* dy,
                                    int64_t rows, int64_t t, int64_t c, int64_t heads,
                                    float* dqkv) {
  if (rows * t * c == 0) return;
  const AttnDims a = attn_dims(rows, t, c, heads);
  const int64_t d = a.d;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  if (!blas_ws_) make_blas_workspace();
  enqueue([&] {
    float* q = attn_scratch(a.nc);
    float *k = q + a.nc, *v = k + a.nc, *dq = v + a.nc, *dk = dq + a.nc, *dv = dk + a.nc;
    const auto scores = static_cast<size_t>(a.batch) * static_cast<size_t>(a.tt);
    if (attn_ds_.size() < scores) attn_ds_.resize(*this, scores);
    float* ds = attn_ds_.data();
    float* g = dq;  // dy's heads, in dq's place until dq is written
    launch([&](cudaStream_t s) { kernels::split_heads(qkv, 3 * c, 3, rows, t, heads, d, q, s); });
    launch([&](cudaStream_t s) { kernels::split_heads(dy, c, 1, rows, t, heads, d, g, s); });
    // dP^T = v g^T; dv^T = g^T P.
    batched_gemm(true, false, a.t, a.t, a.d, 1.f, v, a.d, a.td, g, a.d, a.td, ds, a.t, a.tt,
                 a.batch);
    batched_gemm(false, true, a.d, a.t, a.t, 1.f, g, a.d, a.td, att, a.t, a.tt, dv, a.d, a.td,
                 a.batch);
    launch([&](cudaStream_t s) {
      kernels::causal_softmax_backward(att, ds, rows * heads * t, t, scale, s);
    });
    // dq^T = k^T dS^T; dk^T = q^T dS.
    batched_gemm(false, false, a.d, a.t, a.t, 1.f, k, a.d, a.td, ds, a.t, a.tt, dq, a.d, a.td,
                 a.batch);
    batched_gemm(false, true, a.d, a.t, a.t, 1.f, q, a.d, a.td, ds, a.t, a.tt, dk, a.d, a.td,
                 a.batch);
    launch([&](cudaStream_t s) { kernels::merge_heads(dq, 3, rows, t, heads, d, dqkv, 3 * c, s); });
  });
}

void CudaDevice::scale(float* x, size_t n, float a) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::scale(x, n, a, s); });
}

void CudaDevice::clip_by_norm(const float* x, float* y, size_t n, const double* sumsq,
                              float max_norm) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::clip_by_norm(x, y, n, sumsq, max_norm, s); });
}

void CudaDevice::fold(float* acc, const float* x, size_t n, bool first, float scale) {
  if (n == 0) return;
  launch([&](cudaStream_t s) { kernels::fold(acc, x, n, first, scale, s); });
}

void CudaDevice::sum_squares(const float* x, size_t n, double* acc) {
  if (n == 0) return;
  enqueue([&] {
    if (norm_partials_.size() < 256) norm_partials_.resize(*this, 256);  // kernels::kThreads
    double* partials = norm_partials_.data();
    launch([&](cudaStream_t s) { kernels::sum_squares_partial(x, n, partials, s); });
    const unsigned count = kernels::sum_squares_blocks(n);
    launch([&](cudaStream_t s) { kernels::add_partials(partials, count, acc, s); });
  });
}

void CudaDevice::sgd_update(float* p, const float* g, float* buf, size_t n, float lr,
                            float momentum, float wd, bool nesterov) {
  if (n == 0) return;
  const kernels::Param<float> lp = param(lr);
  launch([&](cudaStream_t s) { kernels::sgd(p, g, buf, n, lp, momentum, wd, nesterov, s); });
}

void CudaDevice::adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, bool decoupled,
                             int64_t step) {
  if (n == 0) return;
  const kernels::Param<math::AdamFactors> fp = param(math::adam_factors(lr, b1, b2, step));
  launch([&](cudaStream_t s) { kernels::adam(p, g, m, v, n, fp, b1, b2, eps, wd, decoupled, s); });
}

void scale_on_stream(float* x, size_t n, float a, void* stream) {
  kernels::scale(x, n, a, static_cast<cudaStream_t>(stream));
}

}  // namespace dtrain
