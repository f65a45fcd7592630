// Convolutions on the CUDA backend: cuDNN plans (cudnn_conv.hpp) and CudaDevice's convolution
// operations. The legacy cuDNN convolution API is used on purpose (see cudnn_conv.hpp), so this
// file is compiled without deprecation warnings.
#include "dtrain/backend/cuda/cudnn_conv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/backend/cuda/cuda_device.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/gpu_check.hpp"
#include "dtrain/base/error.hpp"

namespace dtrain {

ConvPlan::~ConvPlan() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (yf) cudnnDestroyTensorDescriptor(yf);
  if (b) cudnnDestroyTensorDescriptor(b);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
}

namespace {

std::string describe(const ConvGeom& g, int64_t n) {
  return fmt::format("a convolution of {} samples {}x{}x{} to {} channels, kernel {}", n, g.c, g.h,
                     g.w, g.oc, g.k);
}

// cuDNN's heuristics list algorithms best first; the first supported deterministic one wins
// (bit-identical reruns, and CUDA-graph steps equal to eager ones), else the first supported
// one, with a warning (see pick_algorithm).
template <class Perf>
const Perf& pick(const Perf* perf, int count, const char* what, const ConvGeom& g, int64_t n,
                 int rank) {
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
  if (i < 0)
    throw SystemError(
        fmt::format("rank {}: cuDNN offers no {} algorithm for {}", rank, what, describe(g, n)),
        __FILE__, __LINE__);
  if (!deterministic)
    gpu_warn(
        fmt::format("rank {}: cuDNN has no deterministic {} algorithm for {}; using "
                    "algorithm {}, whose results may differ in the last bits from run to run",
                    rank, what, describe(g, n), static_cast<int>(perf[i].algo)));
  return perf[i];
}

// The descriptors of a plan: tensors in the compute type, fp32 in NCHW or bf16 in NHWC (cuDNN's
// bfloat16 configuration, fp32 accumulation; its Hopper engines work in NHWC, and would
// transpose NCHW operands themselves), y also as fp32 NCHW, and the bias.
void set_descriptors(ConvPlan& p, const ConvGeom& g, int64_t n, bool tf32, bool bf16, int rank) {
  // cuDNN takes int sizes and describes tensors of at most INT_MAX values: checked, not
  // truncated.
  const std::string conv = "cuDNN: " + describe(g, n);
  const auto i = [&](int64_t v) { return narrow_int(v, (conv + ": a size").c_str(), rank); };
  narrow_int(n * g.c * g.h * g.w, (conv + ": its input's values").c_str(), rank);
  narrow_int(n * g.oc * g.ho() * g.wo(), (conv + ": its output's values").c_str(), rank);
  DT_CUDNN(cudnnCreateTensorDescriptor(&p.x), rank);
  DT_CUDNN(cudnnCreateTensorDescriptor(&p.y), rank);
  DT_CUDNN(cudnnCreateTensorDescriptor(&p.yf), rank);
  DT_CUDNN(cudnnCreateTensorDescriptor(&p.b), rank);
  DT_CUDNN(cudnnCreateFilterDescriptor(&p.w), rank);
  DT_CUDNN(cudnnCreateConvolutionDescriptor(&p.conv), rank);
  const cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  const cudnnTensorFormat_t layout = bf16 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  DT_CUDNN(cudnnSetTensor4dDescriptor(p.x, layout, dt, i(n), i(g.c), i(g.h), i(g.w)), rank);
  DT_CUDNN(cudnnSetTensor4dDescriptor(p.y, layout, dt, i(n), i(g.oc), i(g.ho()), i(g.wo())), rank);
  DT_CUDNN(cudnnSetTensor4dDescriptor(p.yf, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(n), i(g.oc),
                                      i(g.ho()), i(g.wo())),
           rank);
  DT_CUDNN(cudnnSetTensor4dDescriptor(p.b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(g.oc), 1, 1),
           rank);
  DT_CUDNN(cudnnSetFilter4dDescriptor(p.w, dt, layout, i(g.oc), i(g.c), i(g.k), i(g.k)), rank);
  // Cross-correlation, as every framework (and the CPU twin) computes.
  DT_CUDNN(cudnnSetConvolution2dDescriptor(p.conv, i(g.pad), i(g.pad), i(g.stride), i(g.stride), 1,
                                           1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
           rank);
  // FMA: FP32 arithmetic, no TF32; DEFAULT lets cuDNN use TF32 tensor cores for FP32 data.
  DT_CUDNN(cudnnSetConvolutionMathType(p.conv, bf16   ? CUDNN_TENSOR_OP_MATH
                                               : tf32 ? CUDNN_DEFAULT_MATH
                                                      : CUDNN_FMA_MATH),
           rank);
}

// The forward algorithm of a plan and the workspace it needs.
void choose_forward(cudnnHandle_t dnn, ConvPlan& p, const ConvGeom& g, int64_t n, int rank) {
  // Every algorithm, ranked, so that a deterministic one further down the list is seen.
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  DT_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(dnn, p.x, p.w, p.conv, p.y,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fwd),
           rank);
  p.fwd = pick(fwd, got, "forward", g, n, rank).algo;
  DT_CUDNN(
      cudnnGetConvolutionForwardWorkspaceSize(dnn, p.x, p.w, p.conv, p.y, p.fwd, &p.workspace),
      rank);
}

}  // namespace

std::unique_ptr<ConvPlan> make_conv_plan(cudnnHandle_t dnn, const ConvGeom& g, int64_t n, bool tf32,
                                         bool bf16, int rank) {
  auto p = std::make_unique<ConvPlan>();  // released if anything below throws
  set_descriptors(*p, g, n, tf32, bf16, rank);
  choose_forward(dnn, *p, g, n, rank);
  return p;
}

void choose_backward(cudnnHandle_t dnn, ConvPlan& p, const ConvGeom& g, int64_t n, int rank) {
  int got = 0;
  cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  DT_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
               dnn, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd),
           rank);
  p.bwd_data = pick(bd, got, "backward-data", g, n, rank).algo;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  DT_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
               dnn, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf),
           rank);
  p.bwd_filter = pick(bf, got, "backward-filter", g, n, rank).algo;
  size_t w2 = 0, w3 = 0;
  DT_CUDNN(
      cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, p.w, p.y, p.conv, p.x, p.bwd_data, &w2),
      rank);
  DT_CUDNN(
      cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, p.x, p.y, p.conv, p.w, p.bwd_filter, &w3),
      rank);
  p.workspace = std::max({p.workspace, w2, w3});
  p.backward = true;
}

// ---- CudaDevice's convolutions ----

// A shape's backward algorithms are chosen when it first runs backward: evaluation's shapes
// never do, and in bf16 the backward-filter query alone took 3.7 s for the CNN's first shape
// on an H200 (it compiles engines at run time), which evaluation paid for shapes it only runs
// forward. A training step's shapes first run backward in its eager warm-up step, never in a
// capture.
ConvPlan& CudaDevice::plan(const ConvGeom& g, int64_t n, bool backward) {
  const PlanKey key{g.c, g.h, g.w, g.oc, g.k, g.stride, g.pad, n};
  auto it = plans_.find(key);
  if (it == plans_.end())
    it = plans_.emplace(key, make_conv_plan(dnn_, g, n, tf32_, bf16_, rank_)).first;
  ConvPlan& p = *it->second;
  if (backward && !p.backward) {
    // cuDNN's queries must not run inside a stream capture.
    if (graph_.mode() != GraphMode::eager)
      throw SystemError(fmt::format("rank {}: a convolution's first backward inside a CUDA-graph "
                                    "step",
                                    rank_),
                        __FILE__, __LINE__);
    choose_backward(dnn_, p, g, n, rank_);
  }
  if (p.workspace > workspace_bytes_) grow_workspace(p.workspace);
  return p;
}

void CudaDevice::grow_workspace(size_t bytes) {
  if (graph_.mode() != GraphMode::eager)
    throw SystemError(
        fmt::format("rank {}: a new convolution shape inside a CUDA-graph step", rank_), __FILE__,
        __LINE__);
  graph_.drop();
  synchronize();
  gpu_memory().freed(workspace_);
  if (workspace_) DT_CUDA(cudaFree(workspace_), rank_);
  workspace_ = nullptr;  // no dangling pointer if the allocation below fails
  workspace_bytes_ = 0;
  DT_CUDA(cudaMalloc(&workspace_, bytes), rank_);
  gpu_memory().allocated(index_, workspace_, bytes);
  workspace_bytes_ = bytes;
}

void CudaDevice::plan_conv(const ConvGeom& g, int64_t n, bool backward) {
  nchw_only(g.in_block);
  nchw_only(g.out_block);
  if (n > 0) enqueue([&] { plan(g, n, backward); });
}

void CudaDevice::conv_forward(const ConvGeom& g, int64_t n, const float* x, const float* w,
                              const float* b, float* y) {
  nchw_only(g.in_block);
  nchw_only(g.out_block);
  if (n == 0) return;
  enqueue([&] {
    ConvPlan& p = plan(g, n, false);
    const float one = 1.f, zero = 0.f;
    launches_ += b ? 2 : 1;
    if (bf16_) {  // bf16 NHWC in and out (fp32 accumulation), then fp32 NCHW plus the bias
      const auto out = static_cast<size_t>(n * g.oc * g.ho() * g.wo());
      const Bf16* x16 = to_bf16_nhwc(x, n, g.c, g.h * g.w, x16_);
      const Bf16* w16 = to_bf16_nhwc(w, g.oc, g.c, g.k * g.k, w16_);
      if (y16_.size() < out) y16_.resize(*this, out);
      DT_CUDNN(cudnnConvolutionForward(dnn_, &one, p.x, x16, p.w, w16, p.conv, p.fwd, workspace_,
                                       p.workspace, &zero, p.y, y16_.data()),
               rank_);
      from_bf16_nhwc(y16_.data(), n, g.oc, g.ho() * g.wo(), y, false);
    } else {
      DT_CUDNN(cudnnConvolutionForward(dnn_, &one, p.x, x, p.w, w, p.conv, p.fwd, workspace_,
                                       p.workspace, &zero, p.y, y),
               rank_);
    }
    if (b) DT_CUDNN(cudnnAddTensor(dnn_, &one, p.b, b, &one, p.yf, y), rank_);
  });
}

void CudaDevice::conv_backward(const ConvGeom& g, int64_t n, const float* x, const float* w,
                               const float* dy, float* dw, float* db, float* dx) {
  nchw_only(g.in_block);
  nchw_only(g.out_block);
  if (n == 0) return;
  enqueue([&] {
    const ConvPlan& p = plan(g, n, true);
    const float one = 1.f, zero = 0.f;
    launches_ += 1 + (dx ? 1 : 0);  // cuDNN's; the bias gradient counts its own
    if (bf16_) return conv_backward_bf16(p, g, n, x, w, dy, dw, db, dx);
    if (dx)
      DT_CUDNN(cudnnConvolutionBackwardData(dnn_, &one, p.w, w, p.y, dy, p.conv, p.bwd_data,
                                            workspace_, p.workspace, &zero, p.x, dx),
               rank_);
    DT_CUDNN(cudnnConvolutionBackwardFilter(dnn_, &one, p.x, x, p.y, dy, p.conv, p.bwd_filter,
                                            workspace_, p.workspace, &one, p.w, dw),
             rank_);
    if (db) conv_bias_grad(g, n, dy, db);
  });
}

// bf16 NHWC operands; dx and dw come out in bf16 NHWC and go back to fp32 NCHW (dw added);
// db sums the fp32 dy.
void CudaDevice::conv_backward_bf16(const ConvPlan& p, const ConvGeom& g, int64_t n, const float* x,
                                    const float* w, const float* dy, float* dw, float* db,
                                    float* dx) {
  const float one = 1.f, zero = 0.f;
  const auto in = static_cast<size_t>(n * g.c * g.h * g.w);
  const auto nw = static_cast<size_t>(g.oc * g.c * g.k * g.k);
  const Bf16* dy16 = to_bf16_nhwc(dy, n, g.oc, g.ho() * g.wo(), dy16_);
  const Bf16* w16 = to_bf16_nhwc(w, g.oc, g.c, g.k * g.k, w16_);
  if (dx) {
    if (y16_.size() < in) y16_.resize(*this, in);
    DT_CUDNN(cudnnConvolutionBackwardData(dnn_, &one, p.w, w16, p.y, dy16, p.conv, p.bwd_data,
                                          workspace_, p.workspace, &zero, p.x, y16_.data()),
             rank_);
    from_bf16_nhwc(y16_.data(), n, g.c, g.h * g.w, dx, false);
  }
  const Bf16* x16 = to_bf16_nhwc(x, n, g.c, g.h * g.w, x16_);
  if (dw16_.size() < nw) dw16_.resize(*this, nw);
  DT_CUDNN(cudnnConvolutionBackwardFilter(dnn_, &one, p.x, x16, p.y, dy16, p.conv, p.bwd_filter,
                                          workspace_, p.workspace, &zero, p.w, dw16_.data()),
           rank_);
  from_bf16_nhwc(dw16_.data(), g.oc, g.c, g.k * g.k, dw, true);
  if (db) conv_bias_grad(g, n, dy, db);
}

// db += the channel sums of dy (fp32 in both precisions). cuDNN's cudnnConvolutionBackwardBias
// ran one block per channel: a quarter of the CNN's step at batch 1024 on an H200.
void CudaDevice::conv_bias_grad(const ConvGeom& g, int64_t n, const float* dy, float* db) {
  kernels::channel_bias_grad(dy, n, g.oc, g.ho() * g.wo(), db, true, channel_scratch(g.oc),
                             stream_);
  ++launches_;  // two kernels
  check_launch();
}

}  // namespace dtrain
