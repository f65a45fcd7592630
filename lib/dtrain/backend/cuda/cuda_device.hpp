#pragma once
// The CUDA backend's device: cuBLAS GEMMs, cuDNN convolutions and dtrain's own kernels
// (kernels.hpp), each the twin of a CpuDevice function (tests/test_cuda.cpp compares them).
//
// Everything runs in order on one stream per device, and a training step never waits for it:
// loss sums, BatchNorm statistics and dropout masks live in device memory, and batch indices
// are copied from pinned memory asynchronously. upload() and download() do synchronise (they
// serve initialisation, evaluation and the once-per-epoch statistics).
//
// Every operation queues its work through enqueue() or launch(), which do nothing while a CUDA
// graph replays (the graph holds that work); an operation with per-step values stages them
// first (stage(), param()), so a replay still supplies this step's values (cuda_graph.hpp).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dtrain/backend/cuda/cuda_graph.hpp"
#include "dtrain/backend/cuda/cudnn_conv.hpp"
#include "dtrain/backend/cuda/kernels.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/base/kinds.hpp"

namespace dtrain {

class CudaDevice final : public Device, public DeviceQueue {
 public:
  CudaDevice(int index, int rank, Precision precision);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  bool host_memory() const override { return false; }
  DeviceQueue* queue() override { return this; }

  // ---- DeviceQueue ----
  void synchronize() override;
  void* native_stream() override { return stream_; }
  std::unique_ptr<QueueFence> make_fence() override;
  void record(QueueFence& f) override;
  void wait_for(QueueFence& f) override;
  int64_t launches() const override { return launches_; }
  void step_begin(int64_t step) override;
  void step_mark(int phase) override;
  void anchor_clock() override;
  size_t take_step_marks(std::vector<DeviceMark>& out, bool wait) override;
  void enable_graphs(bool on, size_t staging_bytes, AbortGate* gate) override;
  GraphMode graph_step_propose() const override;
  GraphMode graph_step_begin(GraphMode agreed) override;
  void graph_step_end() override { graph_.end(); }
  void graph_step_abort() noexcept override { graph_.abort(); }
  GraphMode graph_mode() const override { return graph_.mode(); }
  int64_t graph_launches() const override { return graph_.launches(); }

  // ---- memory ----
  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill(float* x, size_t n, float v) override;

  // ---- compute (cuda_device.cpp; convolutions in cudnn_conv.cpp) ----
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override;
  void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) override;
  void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, Accumulate mode) override;
  void activation_forward(Activation a, const float* x, float* y, size_t n) override;
  void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                           size_t n) override;
  void softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t classes,
                    float grad_scale, float* dlogits, double* stats, double smoothing,
                    double stat_scale) override;
  void gather(const float* src, const int32_t* src_labels, int64_t features, const int64_t* idx,
              int64_t count, float* dst, int32_t* dst_labels) override;
  void conv_forward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* b,
                    float* y) override;
  void conv_backward(const ConvGeom& g, int64_t n, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx) override;
  void plan_conv(const ConvGeom& g, int64_t n, bool backward) override;
  void maxpool_forward(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                       int64_t stride, int64_t pad, float* y, int32_t* argmax) override;
  void maxpool_backward(const float* dy, const int32_t* argmax, int64_t n, int64_t c, int64_t h,
                        int64_t w, int64_t k, int64_t stride, int64_t pad, float* dx) override;
  void convert_layout(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t from,
                      int64_t to, float* y) override;
  void channel_moments(const float* x, int64_t n, int64_t c, int64_t spatial, int64_t block,
                       double* moments) override;
  void bn_prepare(const double* moments, double count, double eps, double momentum, float* running,
                  float* stats, int64_t c) override;
  void bn_apply(const float* x, const float* stats, const float* gamma, const float* beta,
                int64_t n, int64_t c, int64_t spatial, int64_t block, float* y,
                bool relu) override;
  void bn_backward_sums(const float* x, const float* dy, const float* stats, const float* gamma,
                        int64_t n, int64_t c, int64_t spatial, int64_t block, double* sums,
                        float* dgamma, float* dbeta) override;
  void bn_backward_dx(const float* x, const float* dy, const float* stats, const float* gamma,
                      const double* sums, double m, int64_t n, int64_t c, int64_t spatial,
                      int64_t block, float* dx) override;
  void augment(const float* x, float* y, int64_t rows, int64_t c, int64_t h, int64_t w, int64_t pad,
               bool reflect, bool flip, uint64_t seed) override;
  void dropout_mask(float* mask, size_t n, double p, uint64_t seed) override;
  void multiply(const float* x, const float* mask, float* y, size_t n) override;
  void add(const float* a, const float* b, float* y, size_t n) override;
  void add_relu(const float* a, const float* b, float* y, size_t n) override;
  // Transformer operations (cuda_device.cpp).
  void embedding_forward(const float* tokens, int64_t stride, const float* wte, const float* wpe,
                         int64_t rows, int64_t t, int64_t c, int64_t vocab, float* y) override;
  void embedding_backward(const float* tokens, int64_t stride, const float* dy, int64_t rows,
                          int64_t t, int64_t c, int64_t vocab, float* dwte,
                          float* dwpe) override;
  void next_tokens(const float* tokens, int64_t stride, int64_t rows, int64_t t, int64_t vocab,
                   int32_t* labels) override;
  void layernorm_forward(const float* x, const float* gamma, const float* beta, int64_t n,
                         int64_t c, float eps, float* y, float* stats) override;
  void layernorm_backward(const float* x, const float* dy, const float* gamma, const float* stats,
                          int64_t n, int64_t c, float* dx, float* dgamma, float* dbeta) override;
  void attention_forward(const float* qkv, int64_t rows, int64_t t, int64_t c, int64_t heads,
                         float* att, float* y) override;
  void attention_backward(const float* qkv, const float* att, const float* dy, int64_t rows,
                          int64_t t, int64_t c, int64_t heads, float* dqkv) override;
  void scale(float* x, size_t n, float a) override;
  void clip_by_norm(const float* x, float* y, size_t n, const double* sumsq,
                    float max_norm) override;
  void fold(float* acc, const float* x, size_t n, bool first, float scale) override;
  void sum_squares(const float* x, size_t n, double* acc) override;
  void sgd_update(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
                  float wd, bool nesterov) override;
  void adam_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1,
                   float b2, float eps, float wd, bool decoupled, int64_t step) override;

 private:
  using Bf16 = kernels::Bf16;
  static constexpr int kSlots = CudaGraph::kSlots;  // timing slots, one graph each

  // The work of an operation, queued on the stream; nothing during a graph replay, whose
  // graph holds it.
  template <class F>
  void enqueue(F&& work) {
    if (!graph_.replaying()) work();
  }
  // One kernel of kernels.hpp, launch(s) queuing it on stream s: enqueued, counted, checked.
  template <class F>
  void launch(F&& kernel) {
    enqueue([&] {
      kernel(stream_);
      check_launch();
    });
  }
  void check_launch();
  // Per-step values (batch indices, seeds, the learning rate): see CudaGraph.
  template <class T>
  const T* stage(const T* src, size_t count) {
    return graph_.stage(src, count);
  }
  template <class T>
  kernels::Param<T> param(const T& v) {
    return graph_.param(v);
  }

  void select();
  void make_blas_workspace();
  void no_graph(const char* what) const;  // for the calls that wait for the host
  void no_fence_in_graph() const;
  // The stored rows x cols matrix (leading dimension ld) as bfloat16 in `buf`.
  const Bf16* to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, Buffer<Bf16>& buf);
  // n NCHW planes of c x hw values as NHWC bfloat16 in `buf` (cuDNN's bf16 layout), and back.
  const Bf16* to_bf16_nhwc(const float* src, int64_t n, int64_t c, int64_t hw, Buffer<Bf16>& buf);
  void from_bf16_nhwc(const Bf16* src, int64_t n, int64_t c, int64_t hw, float* dst,
                      bool accumulate);
  // Convolutions (cudnn_conv.cpp).
  ConvPlan& plan(const ConvGeom& g, int64_t n, bool backward);
  // Throws unless `block` is 0: this backend's tensors are NCHW (conv_out_block offers none).
  static void nchw_only(int64_t block);
  void grow_workspace(size_t bytes);
  void conv_backward_bf16(const ConvPlan& p, const ConvGeom& g, int64_t n, const float* x,
                          const float* w, const float* dy, float* dw, float* db, float* dx);
  void conv_bias_grad(const ConvGeom& g, int64_t n, const float* dy, float* db);
  // Attention: the sizes cuBLAS takes (checked), one strided batched GEMM over the (sample,
  // head) pairs in cuBLAS's column-major terms, and the scratch of split heads.
  struct AttnDims {
    int t, d, batch;  // batch = rows * heads
    int64_t nc;       // rows * t * c: one [rows, heads, t, d] tensor
    long long tt, td;  // the strides of one pair's scores and one pair's head
  };
  AttnDims attn_dims(int64_t rows, int64_t t, int64_t c, int64_t heads);
  void batched_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    long long sa, const float* b, int ldb, long long sb, float* c, int ldc,
                    long long sc, int batch);
  float* attn_scratch(int64_t nc);  // 6 tensors of nc floats
  // The scratch of the kernels' per-channel sums for c channels: one buffer of the same size
  // for every layer up to 65,536 channels and every batch size, so that it never moves under a
  // graph captured after the warm-up step.
  double* channel_scratch(int64_t c);
  // Step timing by events: a ring of slots, so the host can run a few steps ahead; a slot is
  // read (waiting for it if need be) before it is reused. A slot's graph records the slot's
  // own events, so a replay marks the step as its capture did.
  struct Slot {
    std::vector<cudaEvent_t> ev;  // the marks' events, created as first needed
    std::vector<int> phase;       // what each mark ends (-1: the start)
    size_t used = 0;              // marks of the step in this slot
    int64_t step = 0;
    bool recorded = false;
  };
  void record_mark(Slot& sl, int phase);
  bool read_slot(Slot& sl, bool wait);  // false: not finished, and `wait` was false
  void read_slots(bool wait);           // oldest first
  int next_slot() const { return (cur_ + 1) % kSlots; }

  int index_, rank_;
  bool tf32_, bf16_;
  cudaStream_t stream_ = nullptr;
  CudaGraph graph_;
  Slot slots_[kSlots];
  int cur_ = 0;
  cudaEvent_t anchor_ = nullptr;  // recorded on the stream at anchor_host_ (steady seconds)
  double anchor_host_ = 0;
  std::vector<DeviceMark> marks_;  // of the steps read, not yet taken

  Buffer<Bf16> a16_, b16_, x16_, w16_, y16_, dy16_, dw16_;  // bf16 operands
  int64_t launches_ = 0;
  std::string name_;
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  Buffer<double> row_stats_;
  Buffer<double> norm_partials_;  // sum_squares: one partial sum per block
  Buffer<double> channel_partials_;  // channel_sums.cuh's runs (channel_scratch)
  // Transformer scratch, grown on demand and never shrunk (a free drops the CUDA graphs):
  // embedding_backward's sort of token ids (keys, positions, sorted keys, sorted positions)
  // and CUB's scratch; attention's split heads and its scores' gradient.
  Buffer<int32_t> token_sort_;
  Buffer<unsigned char> sort_tmp_;
  Buffer<float> attn_heads_, attn_ds_;
  void* blas_ws_ = nullptr;
  static constexpr size_t kBlasWorkspace = size_t{32} << 20;
  using PlanKey = std::array<int64_t, 8>;  // geometry and batch size
  std::map<PlanKey, std::unique_ptr<ConvPlan>> plans_;
};

}  // namespace dtrain
