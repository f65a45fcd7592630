#pragma once
// A compute device: memory and the kernels the training core needs, on device pointers.
// The CPU implementation is the reference ("CPU twin") every other backend is tested against.
// All matrices are row-major.
#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/kinds.hpp"

namespace dtrain {

class AbortGate;  // base/abort_gate.hpp

// A mark of a training step on a device's queue (DeviceQueue::step_begin, step_mark): when the
// device got there, in seconds on the host's steady clock (time since its epoch).
struct DeviceMark {
  int64_t step = 0;
  int phase = -1;  // -1: the step's start; else the StepPhase that ends here
  double t = 0;
};

// How a batch of c-channel maps lies in memory: NCHW (block 0), or in the device's channel
// blocks of `block` (Device::conv_out_block): sample s, channel ch, position i of p at
// ((s * c / block + ch / block) * p + i) * block + ch % block. A convolution writes them where
// the device's convolutions prefer them, and BatchNorm and elementwise layers keep them.
struct MapLayout {
  int64_t block = 0, c = 0;  // c: the channels, where block > 0
  bool operator==(const MapLayout&) const = default;
};

// A convolution's geometry: input c x h x w, oc output channels, a square k x k kernel; the
// input (and its gradient) in channel blocks of in_block, the output (and its gradient) in
// blocks of out_block (0: NCHW; MapLayout).
struct ConvGeom {
  int64_t c = 1, h = 1, w = 1, oc = 1, k = 1, stride = 1, pad = 0, in_block = 0, out_block = 0;
  int64_t ho() const { return (h + 2 * pad - k) / stride + 1; }
  int64_t wo() const { return (w + 2 * pad - k) / stride + 1; }
  auto operator<=>(const ConvGeom&) const = default;
};

// What a gradient kernel does with its output: overwrite it, or add to it (gradients that
// accumulate over micro-batches).
enum class Accumulate { overwrite, add };

// How a training step runs on a device that records CUDA graphs (see DeviceQueue):
//   eager:   op by op (graphs off, or a warm-up step after memory changed);
//   capture: the calls that follow are recorded, not run; graph_step_end() instantiates the
//            graph and launches it;
//   replay:  the calls only stage their per-step values (batch indices, random seeds, the
//            learning rate) in pinned memory; graph_step_end() copies them to the device and
//            launches the graph recorded for this step.
enum class GraphMode { eager, capture, replay };

// A point in one queue's work that another queue of the same device can wait for
// (DeviceQueue::record, wait_for): a CUDA event.
class QueueFence {
 public:
  virtual ~QueueFence() = default;
};

// The optional capability of a device that queues its work instead of finishing each call
// (the CUDA backend): the queue itself, step timing by device events, and CUDA graphs of the
// steady-state step. The CPU finishes every call before returning and has none of this:
// Device::queue() returns null there.
class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;
  // Waits for all work queued so far.
  virtual void synchronize() = 0;
  // The queue itself (a cudaStream_t), for communicators that order their work against it.
  virtual void* native_stream() = 0;
  // Order across the queues of one device with no host wait: record(f) marks the work queued
  // so far, and another queue's wait_for(f) starts its later work after that point (the latest
  // record(f) made before the wait_for call counts).
  virtual std::unique_ptr<QueueFence> make_fence() = 0;
  virtual void record(QueueFence& f) = 0;
  virtual void wait_for(QueueFence& f) = 0;
  // Kernels (and library calls) launched so far, for the launch-latency floor.
  virtual int64_t launches() const = 0;

  // Step timing by device events. step_begin(step) where training step `step` starts, then
  // step_mark(p) each time the queue has been given the whole of phase p of it (p: a
  // StepPhase's number, train/straggler.hpp: data, forward, backward, exchange, optimizer):
  // the device time since the previous mark is phase p's. Phases may repeat (forward and
  // backward once per accumulated micro-batch). anchor_clock() waits for the queue and ties
  // the device's clock to the host's steady clock; each step is anchored to the latest
  // anchor before it (the queue anchors once when it is made). take_step_marks
  // appends the marks of every step finished on the device (all of them when `wait`), oldest
  // first, and returns how many steps it read.
  virtual void step_begin(int64_t step) = 0;
  virtual void step_mark(int phase) = 0;
  virtual void anchor_clock() = 0;
  virtual size_t take_step_marks(std::vector<DeviceMark>& out, bool wait) = 0;

  // CUDA graphs. The trainer brackets each full-size training step with graph_step_begin()
  // and graph_step_end(). Whether a step is captured must be the same on every rank (NCCL's
  // rule for captured collectives), so the choice is made in two steps: graph_step_propose()
  // says what this device would do, the ranks agree (agree_graph_mode in trainer.hpp), and
  // graph_step_begin(agreed) does it. An agreed eager step drops the graphs this device still
  // holds, so that after it all ranks capture again together. Shapes and device buffers must
  // not change between capture and replay: any free of device memory drops the graphs (they
  // are captured again after one eager step).
  // `staging_bytes`: room for one step's staged values. `gate` (may be null): the abort gate
  // of the communicators the graphs hold NCCL calls of; every graph launch passes it.
  virtual void enable_graphs(bool on, size_t staging_bytes, AbortGate* gate) = 0;
  virtual GraphMode graph_step_propose() const = 0;
  virtual GraphMode graph_step_begin(GraphMode agreed) = 0;
  virtual void graph_step_end() = 0;
  virtual void graph_step_abort() noexcept = 0;  // after an error between begin and end
  virtual GraphMode graph_mode() const = 0;
  virtual int64_t graph_launches() const = 0;
};

// Memory and the compute operations of the training core, nothing else.
class Device {
 public:
  using GraphMode = dtrain::GraphMode;
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // True where device pointers are host pointers (the CPU), so host code may read them.
  virtual bool host_memory() const { return true; }
  // The queue, event timing and graphs of an asynchronous device; null on the CPU.
  virtual DeviceQueue* queue() { return nullptr; }

  virtual void* alloc_bytes(size_t bytes) = 0;
  virtual void free_bytes(void* p) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(float* x, size_t n, float v) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device


  // C = alpha * op(A) * op(B) + beta * C, op(A) is m x k, op(B) is k x n.
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) = 0;
  virtual void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) = 0;
  // db (+)= column sums of dy.
  virtual void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols,
                         Accumulate mode) = 0;
  virtual void activation_forward(Activation a, const float* x, float* y, size_t n) = 0;
  // dx = dy * f'(x); x is the activation's input, y its output. ReLU's may take y for x (a
  // fused ReLU keeps no input; math::relu_backward), and dx may be dy.
  virtual void activation_backward(Activation a, const float* x, const float* y, const float* dy,
                                   float* dx, size_t n) = 0;
  // Softmax cross-entropy over rows of logits against the targets (1 - smoothing) onehot +
  // smoothing / classes (math::softmax_xent_row). Writes dlogits = grad_scale * (softmax -
  // target) (if dlogits is non-null) and adds the summed loss and the number of correct argmax
  // predictions to stats[0] and stats[1] (device memory: nothing returns to the host here).
  // `stat_scale` multiplies what is added to stats (a language model's 1/T: one sample's T
  // positions count as one sample's loss and accuracy).
  virtual void softmax_xent(const float* logits, const int32_t* labels, int64_t rows,
                            int64_t classes, float grad_scale, float* dlogits, double* stats,
                            double smoothing = 0.0, double stat_scale = 1.0) = 0;
  // dst rows i = src rows idx[i] (idx on the host); labels likewise.
  virtual void gather(const float* src, const int32_t* src_labels, int64_t features,
                      const int64_t* idx, int64_t count, float* dst, int32_t* dst_labels) = 0;

  // 2-D convolution of n samples (x in g.in_block's layout, y in g.out_block's); weights
  // [oc, c, k, k], bias [oc] (null: no bias).
  virtual void conv_forward(const ConvGeom& g, int64_t n, const float* x, const float* w,
                            const float* b, float* y) = 0;
  // Gradients of conv_forward: dw (+)= and db (+)= (accumulated; db null: no bias), dx =
  // (overwritten; skipped when null); dy and dx in the layouts of y and x.
  virtual void conv_backward(const ConvGeom& g, int64_t n, const float* x, const float* w,
                             const float* dy, float* dw, float* db, float* dx) = 0;
  // The channel block b > 0 in which this device would rather have convolution g's output
  // (MapLayout), or 0 for NCHW. The CPU's oneDNN convolutions work in channel blocks, and
  // reorders to and from NCHW around each of them cost over a quarter of their time; a device
  // without such a preference keeps NCHW.
  virtual int64_t conv_out_block(const ConvGeom& /*g*/) { return 0; }
  // Prepares convolution g of n samples ahead of its first call, forward only or for backward
  // too (CUDA: cuDNN's plan and algorithms, whose queries in bf16 compile engines for seconds),
  // so that the first epoch's time is the training's own. Nothing to prepare on the CPU.
  virtual void plan_conv(const ConvGeom& /*g*/, int64_t /*n*/, bool /*backward*/) {}
  // y = n samples of c channels at `spatial` positions, from channel blocks of `from` to
  // blocks of `to` (0: NCHW; MapLayout). x and y do not overlap.
  virtual void convert_layout(const float* x, int64_t n, int64_t c, int64_t spatial,
                              int64_t from, int64_t to, float* y) = 0;
  // Max pooling over k x k windows starting `pad` before the map (math::maxpool_window); argmax
  // (per output) records the winning input index.
  virtual void maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                               int64_t k, int64_t stride, int64_t pad, float* y,
                               int32_t* argmax) = 0;
  virtual void maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c,
                                int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad,
                                float* dx) = 0;
  // BatchNorm. Every pointer is device memory; `stats` is [mean (c), inv_std (c)] and the
  // double buffers are [first (c), second (c)]. `block`: the maps' layout (x, y, dy and dx
  // alike; MapLayout), 0 for NCHW, else the channel blocks conv_out_block offered.
  // moments = per-channel [sum, sum of squares] over samples and positions.
  virtual void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial,
                               int64_t block, double* moments) = 0;
  // Training: stats from moments over `count` values per channel, and running = [mean, var]
  // moved towards them by `momentum` (unbiased variance, as PyTorch). Evaluation (moments
  // null): stats from the running statistics.
  virtual void bn_prepare(const double* moments, double count, double eps, double momentum,
                          float* running, float* stats, int64_t c) = 0;
  // y = gamma * (x - mean) * inv_std + beta, per channel; with `relu`, y = max(that, 0) in the
  // same pass (BatchNorm followed by ReLU; math::bn_apply_relu_one).
  virtual void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                        int64_t n, int64_t c, int64_t spatial, int64_t block, float* y,
                        bool relu) = 0;
  // y = BatchNorm(x) + addend, and with `relu` max(that, 0), in one pass: a residual block's
  // last BatchNorm, its shortcut and its activation (math::bn_apply_add_one), the same bits as
  // bn_apply and then add or add_relu, which the default runs.
  virtual void bn_apply_add(const float* x, const float* stats, const float* gamma,
                            const float* beta, const float* addend, int64_t n, int64_t c,
                            int64_t spatial, int64_t block, float* y, bool relu) {
    bn_apply(x, stats, gamma, beta, n, c, spatial, block, y, false);
    const auto len = static_cast<size_t>(n * c * spatial);
    relu ? add_relu(y, addend, y, len) : add(y, addend, y, len);
  }
  // sums = [sum(dy * gamma), sum(dy * gamma * xhat)] per channel; dgamma, dbeta (+)=.
  virtual void bn_backward_sums(const float* x, const float* dy, const float* stats,
                                const float* gamma, int64_t n, int64_t c, int64_t spatial,
                                int64_t block, double* sums, float* dgamma, float* dbeta) = 0;
  // bn_backward_sums of dy masked by the ReLU whose output is `relu_y` (a ReLU after BatchNorm,
  // or after the residual sum BatchNorm ends), the masked gradient written to `masked` for the
  // passes after: the ReLU's backward and the sums in one pass, the same bits as the two, which
  // the default runs.
  virtual void bn_backward_sums_masked(const float* x, const float* dy, const float* relu_y,
                                       const float* stats, const float* gamma, int64_t n, int64_t c,
                                       int64_t spatial, int64_t block, float* masked, double* sums,
                                       float* dgamma, float* dbeta) {
    activation_backward(Activation::relu, relu_y, relu_y, dy, masked,
                        static_cast<size_t>(n * c * spatial));
    bn_backward_sums(x, masked, stats, gamma, n, c, spatial, block, sums, dgamma, dbeta);
  }
  // dx = inv_std / m * (m * dy * gamma - s1 - xhat * s2), m = the (global) element count. dx may
  // be dy (element by element in place: a fused ReLU's masked gradient is written into dx).
  virtual void bn_backward_dx(const float* x, const float* dy, const float* stats,
                              const float* gamma, const double* sums, double m, int64_t n,
                              int64_t c, int64_t spatial, int64_t block, float* dx) = 0;
  // Inverted-dropout mask: 0 with probability p, else 1/(1-p); element i depends only on
  // (seed, i) through a counter-based hash, so every backend draws the same mask.
  virtual void dropout_mask(float* mask, size_t n, double p, uint64_t seed) = 0;
  // Augmentation of `rows` c x h x w samples from x into y (not in place): a random crop with
  // `pad` pixels of padding (zeros, or if `reflect` the image mirrored at its edges, pad < h and
  // pad < w) and, if `flip`, a horizontal flip with probability 1/2, drawn per sample from
  // (seed, sample) by the counter-based hash (the same on every backend).
  virtual void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w,
                       int64_t pad, bool reflect, bool flip, uint64_t seed) = 0;
  // y = x * mask, mask holding 0 or 1/(1-p).
  virtual void multiply(const float* x, const float* mask, float* y, size_t n) = 0;
  // y = a + b, element by element; y may be a or b (a residual block's sum, and the sum of its
  // two input gradients).
  virtual void add(const float* a, const float* b, float* y, size_t n) = 0;
  // y = max(a + b, 0) (a residual block's sum and its ReLU in one pass; math::add_relu); y may
  // be a or b.
  virtual void add_relu(const float* a, const float* b, float* y, size_t n) = 0;

  // ---- transformer operations: a sample is t positions of c features, [t, c] row-major ----
  // Token and position embeddings, y[r, i] = wte[id(r, i)] + wpe[i], for `rows` samples whose
  // first t of `stride` floats are token ids (math::token_id: exact integers, clamped into
  // [0, vocab) so that no id reads outside the table).
  virtual void embedding_forward(const float* tokens, int64_t stride, const float* wte,
                                 const float* wpe, int64_t rows, int64_t t, int64_t c,
                                 int64_t vocab, float* y) = 0;
  // dwte[id(r, i)] += dy[r, i] and dwpe[i] += dy[r, i], each element summed over samples, then
  // positions, in ascending order (the same bits on every backend and thread count).
  virtual void embedding_backward(const float* tokens, int64_t stride, const float* dy,
                                  int64_t rows, int64_t t, int64_t c, int64_t vocab, float* dwte,
                                  float* dwpe) = 0;
  // Next-token targets of the same windows: labels[r * t + i] = id(r, i + 1) (stride > t).
  virtual void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t,
                           int64_t vocab, int32_t* labels) = 0;
  // LayerNorm of n vectors of c features: y = (x - mean) * rstd * gamma + beta (math::
  // layernorm_stats); stats = [mean, rstd] per vector (2n floats), kept for backward.
  virtual void layernorm_forward(const float* x, const float* gamma, const float* beta, int64_t n,
                                 int64_t c, float eps, float* y, float* stats) = 0;
  // dx = (overwritten; skipped when null); dgamma and dbeta (+=), summed over the n vectors in
  // ascending order.
  virtual void layernorm_backward(const float* x, const float* dy, const float* gamma,
                                  const float* stats, int64_t n, int64_t c, float* dx,
                                  float* dgamma, float* dbeta) = 0;
  // Causal multi-head self-attention of `rows` samples. qkv [rows, t, 3c] holds q, k and v side
  // by side (c = heads x d each; head h in columns h*d .. h*d+d-1 of each); per head,
  // y = softmax(q k^T / sqrt(d), position j <= i) v into y [rows, t, c]; att [rows, heads, t, t]
  // keeps the probabilities (0 above the diagonal) for backward.
  virtual void attention_forward(const float* qkv, int64_t rows, int64_t t, int64_t c,
                                 int64_t heads, float* att, float* y) = 0;
  // dqkv (overwritten, [rows, t, 3c]) from dy [rows, t, c] and the forward's qkv and att.
  virtual void attention_backward(const float* qkv, const float* att, const float* dy,
                                  int64_t rows, int64_t t, int64_t c, int64_t heads,
                                  float* dqkv) = 0;

  virtual void scale(float* x, size_t n, float a) = 0;  // x *= a
  // Gradient clipping by the global norm: y = x * math::clip_factor(*sumsq, max_norm), the
  // squared norm read from device memory (sum_squares of x), so no value returns to the host.
  virtual void clip_by_norm(const float* x, float* y, size_t n, const double* sumsq,
                            float max_norm) = 0;
  // acc = (first ? x : acc + x) * scale, element by element (math::fold): one replica's turn
  // in the ordered sum of replicas that share one copy of the weights.
  virtual void fold(float* acc, const float* x, size_t n, bool first, float scale) = 0;
  // *acc (device memory) += the sum of x[i]^2 (for the gradient noise scale), in an order that
  // depends on n alone; relative error below 2e-5 (the CPU adds short runs in float lanes).
  virtual void sum_squares(const float* x, size_t n, double* acc) = 0;
  virtual void sgd_update(float* p, const float* g, float* momentum_buf, size_t n, float lr,
                          float momentum, float weight_decay, bool nesterov) = 0;
  virtual void adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr,
                           float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                           int64_t step) = 0;
};

// How the CPU backend convolves: oneDNN's primitives (the default where dtrain was built with
// oneDNN), Winograd's algorithm where winograd_suits a convolution and oneDNN has it for this
// instruction set, direct convolutions elsewhere; oneDNN's direct convolutions everywhere
// (onednn_direct); or im2col + one GEMM per chunk (always available; the reference in tests).
enum class CpuConv { onednn, onednn_direct, im2col };
bool uses_onednn(CpuConv c);
// Whether CpuConv::onednn computes fp32 convolution g with Winograd's F(4x4, 3x3): 3x3, stride
// 1, padding at most 1 (oneDNN's kernels take no more), at least 32 channels in and out in
// whole blocks of 16. There oneDNN's Winograd kernels
// (AVX-512) take 0.5-0.7x the direct kernels' time; with 16 channels or fewer they are no faster
// or slower (docs/performance.md).
bool winograd_suits(const ConvGeom& g);
// oneDNN's name for the forward kernel a CPU device of `conv` runs fp32 convolution g with at n
// samples, e.g. "jit_wino_4x3:avx512_core"; "" where conv is im2col or dtrain has no oneDNN.
std::string onednn_conv_kernel(CpuConv conv, const ConvGeom& g, int64_t n);
// Whether `conv` runs Winograd's kernels where they suit on this CPU (CpuConv::onednn where
// oneDNN has them: AVX-512), asked of a convolution that suits them.
bool winograd_available(CpuConv conv);
// Whose sgemm multiplies matrices on the CPU: oneDNN's (the default where dtrain was built with
// oneDNN: a GPT's epoch 1.09-1.14x faster than with OpenBLAS's, results/bench/cpu-gemm.md) or
// OpenBLAS's.
enum class CpuGemm { onednn, openblas };
struct CpuOptions {
  int threads = 1;  // worker threads of this replica (OpenMP), used by every kernel
  CpuConv conv = default_cpu_conv();
  // precision: bf16 emulated: GEMM and convolution inputs rounded to bfloat16 exactly as the
  // CUDA backend rounds them (see bf16.hpp), so this device is also the bf16 twin in tests.
  bool bf16 = false;
  CpuGemm gemm = default_cpu_gemm();
  // The passes of two layers in one kernel where the CPU has one (bn_apply_add,
  // bn_backward_sums_masked), and BatchNorm's passes of sums walking the maps from where the
  // pass before left off; false runs the Device defaults' separate passes, each from the start:
  // the same bits (DTRAIN_CPU_FUSE=off, an A/B of both in one binary).
  bool fuse = true;
  static CpuConv default_cpu_conv();
  static CpuGemm default_cpu_gemm();
};
bool have_onednn();
// The implementations named by DTRAIN_CPU_CONV (onednn | onednn-direct | im2col) and
// DTRAIN_CPU_GEMM (onednn | openblas), else the defaults. Throw UserError for another value.
CpuConv cpu_conv_from_env();
CpuGemm cpu_gemm_from_env();
// DTRAIN_CPU_FUSE: on (or unset) or off (CpuOptions::fuse); UserError for another value.
bool cpu_fuse_from_env();
const char* to_string(CpuConv c);
const char* to_string(CpuGemm g);
// What a CPU replica computes with, for logs and names: "conv onednn, gemm onednn", and
// ", bf16 emulated" where it emulates bf16.
std::string cpu_libraries(const CpuOptions& o);

// The CPU backend: every kernel runs on `threads` OpenMP threads of the calling thread, GEMMs as
// row or column blocks through single-threaded sgemm calls, so that one thread pool (the same
// that oneDNN uses) does all the work.
std::unique_ptr<Device> make_cpu_device(const CpuOptions& opt = {});
void set_blas_threads(int n);
// OpenBLAS build and the kernel family it picked, e.g. "OpenBLAS 0.3.21 ... (core SkylakeX)".
std::string blas_description();
// Why an address-space limit (ulimit -v) is too small for this process to go on, or "" when
// it is not (or there is none). OpenBLAS's worker threads each reserve a buffer when they
// start, and one that cannot retries for ever; its exit handler then waits on it for ever.
// So the caller must end the process with _exit(), not exit(), after saying why.
std::string address_space_shortfall();

// Owning device buffer of T.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& d, size_t n) { resize(d, n); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      dev_ = o.dev_;
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  // Grows to at least n elements (contents are not kept).
  void resize(Device& d, size_t n) {
    if (n <= n_ && dev_ == &d) return;
    release();
    dev_ = &d;
    p_ = static_cast<T*>(d.alloc_bytes(n * sizeof(T)));
    n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_ && dev_) dev_->free_bytes(p_);
    p_ = nullptr;
    n_ = 0;
  }
  Device* dev_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dtrain
