// Convolution, pooling, BatchNorm and dropout layers (the dense layer lives in model.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dtrain/comm/comm.hpp"
#include "dtrain/backend/math.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/nn/model.hpp"

namespace dtrain {

// ---- Conv2d ----

MapShape Conv2d::output_shape(MapShape in, int64_t oc, int64_t k, int64_t stride, int64_t pad) {
  return {oc, (in.h + 2 * pad - k) / stride + 1, (in.w + 2 * pad - k) / stride + 1};
}

Conv2d::Conv2d(MapShape in, int64_t oc, int64_t k, int64_t stride, int64_t pad, bool bias)
    : Layer(in.size(), output_shape(in, oc, k, stride, pad).size()),
      in_(in),
      out_(output_shape(in, oc, k, stride, pad)),
      oc_(oc),
      k_(k),
      stride_(stride),
      pad_(pad),
      bias_(bias) {
  if (out_.h <= 0 || out_.w <= 0)
    throw UserError(
        fmt::format("conv: kernel {} with stride {} and padding {} does not fit a "
                    "{}x{} input",
                    k, stride, pad, in.h, in.w));
}

std::string Conv2d::describe() const {
  return fmt::format("conv({}->{}, k{}{}{}, {}x{}{})", in_.c, oc_, k_,
                     stride_ != 1 ? fmt::format(" s{}", stride_) : "",
                     pad_ ? fmt::format(" p{}", pad_) : "", out_.h, out_.w,
                     bias_ ? "" : ", no bias");
}

void Conv2d::bind(float* params, float* grads) {
  const int64_t nw = oc_ * in_.c * k_ * k_;
  w_ = params;
  b_ = bias_ ? params + nw : nullptr;
  dw_ = grads;
  db_ = bias_ ? grads + nw : nullptr;
}

void Conv2d::init(Rng& rng, float* params) const {
  // PyTorch's default for Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_.c * k_ * k_));
  for (int64_t i = 0; i < param_count(); ++i)
    params[i] = static_cast<float>(rng.uniform(-bound, bound));
}

ConvGeom Conv2d::geom() const {
  return {in_.c, in_.h, in_.w, oc_, k_, stride_, pad_, in_block_, out_block_};
}

std::optional<MapLayout> Conv2d::layout_for(Device& d, MapLayout in) {
  in_block_ = in.block;
  out_block_ = 0;  // the device is asked about the geometry with an NCHW output
  out_block_ = d.conv_out_block(geom());
  return out_block_ ? MapLayout{out_block_, oc_} : MapLayout{};
}

void Conv2d::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  d.conv_forward(geom(), rows, x, w_, b_, y);
}

void Conv2d::backward_impl(Device& d, const float* x, const float*, const float* dy, float* dx,
                           int64_t rows) {
  d.conv_backward(geom(), rows, x, w_, dy, dw_, db_, dx);
}

// ---- MaxPool2d ----

MapShape MaxPool2d::output_shape(MapShape in, int64_t k, int64_t stride, int64_t padding) {
  return {in.c, math::pool_out(in.h, k, stride, padding), math::pool_out(in.w, k, stride, padding)};
}

MaxPool2d::MaxPool2d(MapShape in, int64_t k, int64_t stride, int64_t padding)
    : Layer(in.size(), output_shape(in, k, stride, padding).size()),
      in_(in),
      k_(k),
      stride_(stride),
      pad_(padding) {
  if (2 * padding > k)
    throw UserError(fmt::format(
        "maxpool: padding {} is more than half the window {} (a window could hold no input)",
        padding, k));
  if (in.h + 2 * padding < k || in.w + 2 * padding < k)
    throw UserError(
        fmt::format("maxpool: window {} is larger than the {}x{} input", k, in.h, in.w));
}

std::string MaxPool2d::describe() const {
  const auto o = output_shape(in_, k_, stride_, pad_);
  return pad_ > 0 ? fmt::format("maxpool(k{}, pad {}, {}x{})", k_, pad_, o.h, o.w)
                  : fmt::format("maxpool(k{}, {}x{})", k_, o.h, o.w);
}

void MaxPool2d::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  argmax_.resize(d, static_cast<size_t>(std::max<int64_t>(1, rows * out_features())));
  d.maxpool_forward(x, rows, in_.c, in_.h, in_.w, k_, stride_, pad_, y, argmax_.data());
}

void MaxPool2d::backward_impl(Device& d, const float*, const float*, const float* dy, float* dx,
                              int64_t rows) {
  if (dx)
    d.maxpool_backward(dy, argmax_.data(), rows, in_.c, in_.h, in_.w, k_, stride_, pad_, dx);
}

// ---- GlobalAvgPool: a GEMM with a column of 1/(h*w) ----

namespace {
const float* averaging_column(Device& d, Buffer<float>& ones, int64_t n) {
  if (ones.size() < static_cast<size_t>(n)) {
    ones.resize(d, static_cast<size_t>(n));
    d.fill(ones.data(), static_cast<size_t>(n), 1.f / static_cast<float>(n));
  }
  return ones.data();
}
}  // namespace

void GlobalAvgPool::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  const int64_t s = in_.h * in_.w;
  const float* avg = averaging_column(d, ones_, s);
  d.gemm(false, false, rows * in_.c, 1, s, 1.f, x, s, avg, 1, 0.f, y, 1);
}

void GlobalAvgPool::backward_impl(Device& d, const float*, const float*, const float* dy, float* dx,
                                  int64_t rows) {
  if (!dx) return;
  const int64_t s = in_.h * in_.w;
  const float* avg = averaging_column(d, ones_, s);
  d.gemm(false, true, rows * in_.c, s, 1, 1.f, dy, 1, avg, 1, 0.f, dx, s);
}

// ---- BatchNorm ----

BatchNorm::BatchNorm(MapShape in, bool sync, double momentum, double eps)
    : Layer(in.size(), in.size()), in_(in), sync_(sync), momentum_(momentum), eps_(eps) {}

void BatchNorm::setup(Device& d) {
  const auto c = static_cast<size_t>(in_.c);
  running_.resize(d, 2 * c);
  d.fill(running_.data(), c, 0.f);
  d.fill(running_.data() + c, c, 1.f);
  stats_.resize(d, 2 * c);
  moments_.resize(d, 2 * c);
  sums_.resize(d, 2 * c);
}

std::string BatchNorm::describe() const {
  return fmt::format("batchnorm({}{}){}", in_.c, sync_ ? ", sync" : "", relu_ ? " -> relu" : "");
}

void BatchNorm::bind(float* params, float* grads) {
  gamma_ = params;
  beta_ = params + in_.c;
  dgamma_ = grads;
  dbeta_ = grads + in_.c;
}

void BatchNorm::init(Rng&, float* params) const {
  std::fill_n(params, in_.c, 1.f);
  std::fill_n(params + in_.c, in_.c, 0.f);
}

void BatchNorm::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  const int64_t c = in_.c, s = in_.h * in_.w;
  if (!training()) {
    d.bn_prepare(nullptr, 0, eps_, 0, running_.data(), stats_.data(), c);
    if (!tail_) d.bn_apply(x, stats_.data(), gamma_, beta_, rows, c, s, block_, y, relu_);
    return;
  }
  d.channel_moments(x, rows, c, s, block_, moments_.data());
  count_ = static_cast<double>(rows * s);
  if (synced_over_replicas()) all_reduce_over_replicas(d, moments_, &count_);
  if (count_ <= 0) return;  // nothing anywhere: leave the running statistics alone
  d.bn_prepare(moments_.data(), count_, eps_, momentum_, running_.data(), stats_.data(), c);
  if (!tail_) d.bn_apply(x, stats_.data(), gamma_, beta_, rows, c, s, block_, y, relu_);
}

void BatchNorm::apply_tail(Device& d, const float* addend, float* y, int64_t rows) {
  if (!tail_) DTRAIN_THROW_SYSTEM("BatchNorm::apply_tail on a BatchNorm that is no block's tail");
  if (training() && count_ <= 0) return;  // no rows anywhere, so none here
  d.bn_apply_add(input(), stats_.data(), gamma_, beta_, addend, rows, in_.c, in_.h * in_.w, block_,
                 y, tail_relu_);
}

void BatchNorm::backward_impl(Device& d, const float* x, const float* y, const float* dy,
                              float* dx, int64_t rows) {
  const int64_t c = in_.c, s = in_.h * in_.w;
  if (tail_ ? tail_relu_ : relu_) {
    // The ReLU's gradient in the sums' pass, masked by this layer's output (y > 0 exactly where
    // x > 0), or as a tail by the block's: into dx where there is one (bn_backward_dx then
    // reads and writes each element in place), else into masked_, which as a tail the
    // shortcut reads too.
    if (tail_ && !tail_y_) DTRAIN_THROW_SYSTEM("BatchNorm: a tail's backward without its output");
    float* m = tail_ ? nullptr : dx;
    if (!m) {
      masked_.resize(d, std::max<size_t>(static_cast<size_t>(rows * in_features()), 1));
      m = masked_.data();
    }
    d.bn_backward_sums_masked(x, dy, tail_ ? tail_y_ : y, stats_.data(), gamma_, rows, c, s, block_,
                              m, sums_.data(), dgamma_, dbeta_);
    dy = m;
  } else {
    d.bn_backward_sums(x, dy, stats_.data(), gamma_, rows, c, s, block_, sums_.data(), dgamma_,
                       dbeta_);
  }
  if (synced_over_replicas()) all_reduce_over_replicas(d, sums_, nullptr);
  if (dx && count_ > 0)
    d.bn_backward_dx(x, dy, stats_.data(), gamma_, sums_.data(), count_, rows, c, s, block_,
                     dx);
}

// One replica has nothing to exchange: its sums are already the whole batch's, so it skips the
// host round trip (bit for bit the same: a sum over one replica is that replica's own).
bool BatchNorm::synced_over_replicas() const {
  return sync_ && ctx_ && ctx_->comm && ctx_->comm->size() > 1;
}

// SyncBatchNorm's exchange: the 2c sums (and the element count) summed over replicas. The sums
// cross the host here, so synchronised BatchNorm waits for the device once per layer and pass.
// Its span (waiting for the other replicas included, the device's queued work not) goes to the
// context's `synced`.
void BatchNorm::all_reduce_over_replicas(Device& d, Buffer<double>& v, double* count) {
  if (ctx_->synced && d.queue()) d.queue()->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = static_cast<size_t>(2 * in_.c);
  host_.assign(n + 1, 0.0);
  d.download(host_.data(), v.data(), n * sizeof(double));
  if (count) host_[n] = *count;
  ctx_->comm->allreduce(host_.data(), host_.size(), ReduceOp::sum);
  d.upload(v.data(), host_.data(), n * sizeof(double));
  if (count) *count = host_[n];
  if (ctx_->synced) ctx_->synced(t0, std::chrono::steady_clock::now());
}

// ---- Dropout ----

std::string Dropout::describe() const {
  return fmt::format("dropout({})", p_);
}

void Dropout::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  const auto n = static_cast<size_t>(rows * in_features());
  mask_.resize(d, std::max<size_t>(n, 1));
  if (!training() || p_ <= 0) {
    d.fill(mask_.data(), n, 1.f);
  } else {
    if (!ctx_ || !ctx_->rng) DTRAIN_THROW_SYSTEM("dropout needs the replica's random stream");
    // One draw from the replica's stream seeds the whole mask, which the device computes.
    d.dropout_mask(mask_.data(), n, p_, ctx_->rng->next());
  }
  d.multiply(x, mask_.data(), y, n);
}

void Dropout::backward_impl(Device& d, const float*, const float*, const float* dy, float* dx,
                            int64_t rows) {
  if (dx) d.multiply(dy, mask_.data(), dx, static_cast<size_t>(rows * in_features()));
}

}  // namespace dtrain
