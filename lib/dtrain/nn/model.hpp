#pragma once
// Layers and models. A layer's public forward/backward are non-virtual: they check shapes and
// then call the *_impl hooks. Parameters and gradients of a whole model live in one flat buffer
// each, so the gradient exchange is a single contiguous all-reduce.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/nn/optimizer.hpp"

namespace dtrain {

class Communicator;

// What layers that depend on more than their input see: training or evaluation, the replica
// group (synchronised BatchNorm), and a per-replica random stream (dropout).
struct LayerContext {
  bool train = true;
  Communicator* comm = nullptr;
  Rng* rng = nullptr;
  // Called with the start and end of each of synchronised BatchNorm's statistics exchanges
  // (empty: not timed).
  std::function<void(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>
      synced;
};

// Per-sample feature map shape (CHW); dense layers use {features, 1, 1, flat}. `flat`: features
// without positions (after flatten or dense, or flat data), which spatial layers refuse; a map
// pooled or convolved down to 1x1 is not flat.
struct MapShape {
  int64_t c = 1, h = 1, w = 1;
  bool flat = false;
  int64_t size() const { return c * h * w; }
  bool same_shape(const MapShape& o) const { return c == o.c && h == o.h && w == o.w; }
};

class Layer {
 public:
  Layer(int64_t in, int64_t out) : in_(in), out_(out) {}
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  virtual int64_t param_count() const { return 0; }
  // Points the layer at its slice of the model's flat parameter and gradient buffers.
  virtual void bind(float* /*params*/, float* /*grads*/) {}
  // Fills host memory `params` (param_count() floats) with initial values.
  virtual void init(Rng& /*rng*/, float* /*params*/) const {}
  // Allocates the layer's device buffers (called once by Model).
  virtual void setup(Device& /*d*/) {}
  // Has the device prepare the layer's convolutions for `rows` samples (Device::plan_conv);
  // returns how many there are.
  virtual int plan_convs(Device& /*d*/, int64_t /*rows*/, bool /*backward*/) { return 0; }
  // Appends the non-trained state that evaluation uses (BatchNorm running statistics, in device
  // memory) to `out`: a block appends its layers', in order. Checkpoints save this list.
  virtual void collect_state(std::vector<Buffer<float>*>& /*out*/) {}
  // The training context (a block passes it on to its layers).
  virtual void attach(const LayerContext* ctx) { ctx_ = ctx; }
  // Floats per sample that forward keeps for backward (a block counts its layers' too).
  virtual int64_t activation_floats() const { return out_; }
  // Multiply-adds per sample of forward's GEMMs and convolutions (0 for the elementwise
  // layers, as FLOP counters of papers count); backward does twice as many (the input's and
  // the weights' gradients), less the input's gradient of the first layer.
  virtual int64_t macs_per_sample() const { return 0; }
  // Floats of evaluation state (BatchNorm's running statistics), a block's layers' included:
  // what a checkpoint holds of this layer per replica.
  virtual int64_t state_floats() const { return 0; }
  // Appends the runs of this layer's parameters that are weights (not biases, not BatchNorm's
  // scale and shift), the layer's first parameter at `offset` of the flat buffer.
  virtual void weight_ranges(int64_t /*offset*/, std::vector<ParamRange>& /*out*/) const {}
  // The most features per sample of any tensor the layer reads or writes (a block's layers'
  // included): what a GPU library sees as one buffer, times the rows.
  virtual int64_t largest_features() const { return std::max(in_, out_); }
  // Appends, for each BatchNorm (a block's included), the positions it pools per channel and
  // sample: h x w of its input map, 1 for features without positions.
  virtual void batchnorm_positions(std::vector<int64_t>& /*out*/) const {}

  // y = f(x) for `rows` samples; x must stay valid until backward.
  const float* forward(Device& d, const float* x, int64_t rows);
  // Given dL/dy, accumulates parameter gradients and returns dL/dx (nullptr if !need_dx).
  const float* backward(Device& d, const float* dy, int64_t rows, bool need_dx);

  // Layouts (MapLayout): before setup the model tells each layer the layout its input maps
  // arrive in and learns its output's. A layer that works on channel blocks says so in
  // layout_for; any other works on NCHW maps, and forward converts a blocked input for it (and
  // backward its input's gradient back).
  MapLayout plan_layout(Device& d, MapLayout in);
  MapLayout layout_in() const { return layout_in_; }  // the input's, as planned

 protected:
  // The output's layout where the layer takes input maps in layout `in` as they are (NCHW
  // inputs included); nullopt where it needs them NCHW.
  virtual std::optional<MapLayout> layout_for(Device& /*d*/, MapLayout /*in*/) {
    return std::nullopt;
  }
  virtual void forward_impl(Device& d, const float* x, float* y, int64_t rows) = 0;
  virtual void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                             int64_t rows) = 0;
  bool training() const { return !ctx_ || ctx_->train; }
  // The input of the last forward, as forward_impl saw it (converted to NCHW where it was).
  const float* input() const { return x_; }
  // False where another layer writes this one's output (a residual block's tail BatchNorm):
  // forward and backward then have no output buffer (null y).
  virtual bool keeps_output() const { return true; }
  const LayerContext* ctx_ = nullptr;

 private:
  int64_t in_, out_;
  const float* x_ = nullptr;
  int64_t rows_ = -1;
  Buffer<float> y_, dx_;
  MapLayout layout_in_;     // the input's, as it arrives
  bool convert_in_ = false;  // blocked input, NCHW layer: x_ and dx_ are NCHW
  Buffer<float> x_nchw_, dx_blocked_;  // the input converted, and its gradient converted back
};

// y = x W + b, W stored as [in x out]. With `positions` > 1 a sample is that many rows of `in`
// features, each mapped by the same W (a transformer's per-position layers). init_std > 0 draws
// W from N(0, init_std) with b = 0 (GPT-2's initialisation); 0 keeps PyTorch's nn.Linear
// default.
class Dense final : public Layer {
 public:
  Dense(int64_t in, int64_t out, int64_t positions = 1, double init_std = 0.0)
      : Layer(in * positions, out * positions),
        in_(in),
        out_(out),
        positions_(positions),
        init_std_(init_std) {}
  std::string describe() const override;
  int64_t param_count() const override { return in_ * out_ + out_; }
  int64_t macs_per_sample() const override { return in_ * out_ * positions_; }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;
  void weight_ranges(int64_t offset, std::vector<ParamRange>& out) const override {
    out.push_back({offset, in_ * out_});
  }

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  int64_t in_, out_, positions_;
  double init_std_;
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(int64_t features, Activation a) : Layer(features, features), act_(a) {}
  std::string describe() const override;
  Activation activation() const { return act_; }

 protected:
  std::optional<MapLayout> layout_for(Device&, MapLayout in) override { return in; }
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  Activation act_;
};

// 2-D convolution (square kernel, stride, zero padding); the device does the arithmetic.
// Weights [out_c x (in_c*k*k)], then bias [out_c] unless !bias (a conv followed by BatchNorm
// needs none); He-uniform init like PyTorch's default.
class Conv2d final : public Layer {
 public:
  Conv2d(MapShape in, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad,
         bool bias = true);
  static MapShape output_shape(MapShape in, int64_t out_channels, int64_t kernel, int64_t stride,
                               int64_t pad);
  std::string describe() const override;
  int64_t param_count() const override { return oc_ * in_.c * k_ * k_ + (bias_ ? oc_ : 0); }
  int64_t macs_per_sample() const override { return out_.size() * in_.c * k_ * k_; }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;
  void weight_ranges(int64_t offset, std::vector<ParamRange>& out) const override {
    out.push_back({offset, oc_ * in_.c * k_ * k_});
  }
  ConvGeom geom() const;
  int plan_convs(Device& d, int64_t rows, bool backward) override {
    d.plan_conv(geom(), rows, backward);
    return 1;
  }

 protected:
  // Any input layout; the output in the device's preferred one (Device::conv_out_block).
  std::optional<MapLayout> layout_for(Device& d, MapLayout in) override;
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  MapShape in_, out_;
  int64_t oc_, k_, stride_, pad_, in_block_ = 0, out_block_ = 0;
  bool bias_;
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
};

class MaxPool2d final : public Layer {
 public:
  // Windows start `padding` before the map (at most half the window, as in PyTorch); the
  // positions outside it never win.
  MaxPool2d(MapShape in, int64_t kernel, int64_t stride, int64_t padding = 0);
  static MapShape output_shape(MapShape in, int64_t kernel, int64_t stride, int64_t padding = 0);
  std::string describe() const override;

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  MapShape in_;
  int64_t k_, stride_, pad_;
  Buffer<int32_t> argmax_;
};

// Mean over each channel's positions: [c, h, w] -> [c].
class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(MapShape in) : Layer(in.size(), in.c), in_(in) {}
  std::string describe() const override { return "global-avg-pool"; }

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  MapShape in_;
  Buffer<float> ones_;  // a column of 1/(h*w)
};

// Batch normalisation over samples and positions, per channel (Ioffe and Szegedy 2015).
// `sync`: statistics and their gradients are summed over all replicas (SyncBatchNorm), so N
// replicas x B behave as 1 x N*B; otherwise each replica uses its own micro-batch.
class BatchNorm final : public Layer {
 public:
  BatchNorm(MapShape in, bool sync, double momentum = 0.1, double eps = 1e-5);
  std::string describe() const override;
  int64_t param_count() const override { return 2 * in_.c; }
  int64_t state_floats() const override { return 2 * in_.c; }  // running mean, running var
  void batchnorm_positions(std::vector<int64_t>& out) const override {
    out.push_back(in_.h * in_.w);
  }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;
  void setup(Device& d) override;
  Buffer<float>* state() { return &running_; }  // [mean (c), var (c)]
  void collect_state(std::vector<Buffer<float>*>& out) override { out.push_back(&running_); }
  // Takes over the ReLU that follows it (fuse_batchnorm_relu): y = max(BatchNorm(x), 0) in one
  // pass, and backward masks dy by y > 0, as the ReLU layer did: the same bits, one map fewer
  // written and kept.
  void fuse_relu() { relu_ = true; }
  bool relu() const { return relu_; }
  // Ends a residual block (Residual): the block's output is this layer's plus the shortcut's,
  // then `relu` or not, made in one pass by apply_tail; this layer keeps no output of its own.
  // With `relu` its backward takes dL/d(block output), masks it by the block's output (given
  // by tail_output) and leaves the masked gradient, dL/d(sum), in tail_grad for the shortcut.
  // (activation_floats still counts a map: with a ReLU the masked gradient takes the output's
  // place; without one the estimate keeps a map that is not there.)
  void become_tail(bool relu) {
    tail_ = true;
    tail_relu_ = relu;
  }
  // y = [relu](BatchNorm(input of the last forward) + addend), this layer's stats.
  void apply_tail(Device& d, const float* addend, float* y, int64_t rows);
  void tail_output(const float* y) { tail_y_ = y; }
  const float* tail_grad(const float* dy) const { return tail_relu_ ? masked_.data() : dy; }

 protected:
  // Channel blocks of its own channels only: after flatten its features are a map's channels
  // and positions, and the map's blocks are converted to NCHW for it.
  std::optional<MapLayout> layout_for(Device&, MapLayout in) override {
    if (in.block && in.c != in_.c) return std::nullopt;
    block_ = in.block;
    return in;
  }
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;
  bool keeps_output() const override { return !tail_; }

 private:
  MapShape in_;
  bool sync_;
  double momentum_, eps_;
  float *gamma_ = nullptr, *beta_ = nullptr, *dgamma_ = nullptr, *dbeta_ = nullptr;
  bool synced_over_replicas() const;
  void all_reduce_over_replicas(Device& d, Buffer<double>& v, double* count);
  // Device buffers: running [mean, var]; stats [mean, inv_std] of the last forward; the
  // per-channel double sums of forward (moments) and backward (sums).
  Buffer<float> running_, stats_;
  Buffer<double> moments_, sums_;
  std::vector<double> host_;  // staging for the synchronised all-reduce
  double count_ = 0;          // elements per channel behind stats_ (all replicas if sync)
  int64_t block_ = 0;         // the maps' channel blocks (MapLayout), 0: NCHW
  bool relu_ = false;         // a ReLU fused after it
  bool tail_ = false;         // a residual block's last layer (become_tail)
  bool tail_relu_ = false;    // ... and the block's ReLU after the sum
  const float* tail_y_ = nullptr;  // the block's output, as a tail with a ReLU
  // dy masked by the ReLU, where backward has no dx to hold it, or (as a tail) for the shortcut
  Buffer<float> masked_;
};

// Inverted dropout: zeroes a fraction p in training and scales the rest by 1/(1-p); identity
// in evaluation. The mask comes from the replica's own random stream.
class Dropout final : public Layer {
 public:
  Dropout(int64_t features, double p) : Layer(features, features), p_(p) {}
  std::string describe() const override;

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  double p_;
  Buffer<float> mask_;
};

// A residual block: y = act(body(x) + shortcut(x)), where an empty shortcut is the identity;
// backward sends dL/d(sum) through both branches and adds their input gradients. The block owns
// its layers and binds them to consecutive slices of its own slice of the flat buffers (body
// first, then shortcut), so a model's parameters stay one buffer whatever the nesting.
class Residual final : public Layer {
 public:
  Residual(MapShape in, MapShape out, std::vector<std::unique_ptr<Layer>> body,
           std::vector<std::unique_ptr<Layer>> shortcut, std::optional<Activation> act);
  std::string describe() const override;
  int64_t param_count() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;
  void setup(Device& d) override;
  int plan_convs(Device& d, int64_t rows, bool backward) override;
  void collect_state(std::vector<Buffer<float>*>& out) override;
  void attach(const LayerContext* ctx) override;
  int64_t activation_floats() const override;
  int64_t macs_per_sample() const override;
  int64_t state_floats() const override;
  void weight_ranges(int64_t offset, std::vector<ParamRange>& out) const override;
  void batchnorm_positions(std::vector<int64_t>& out) const override;
  int64_t largest_features() const override;

 protected:
  // The body's output layout; the shortcut's output is converted to it where they differ.
  std::optional<MapLayout> layout_for(Device& d, MapLayout in) override;
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  void add_shortcut_grad(Device& d, const float* gb, const float* g, float* dx, int64_t rows);
  std::vector<std::unique_ptr<Layer>> body_, shortcut_;
  std::optional<Activation> act_;
  // The body's last layer where it is a BatchNorm and the activation none or ReLU: it adds the
  // shortcut and applies the ReLU in its own pass (BatchNorm::become_tail).
  BatchNorm* tail_ = nullptr;
  Buffer<float> sum_, dsum_;  // the sum before the activation, and its gradient
  MapLayout out_layout_, shortcut_layout_;  // the body's output's, and the shortcut's
  Buffer<float> converted_;  // the shortcut's output (forward) or gradient (backward), converted
};

// Plans the layouts of `layers` in order from the first's input layout; returns the last's
// output layout (`in` for an empty list).
MapLayout plan_layouts(Device& d, std::vector<std::unique_ptr<Layer>>& layers, MapLayout in);
// `v`, rows samples of `features` floats (maps in layout `from`), in layout `to`: v itself where
// the two agree, else converted into `buf`.
const float* in_layout(Device& d, Buffer<float>& buf, const float* v, int64_t rows,
                       int64_t features, MapLayout from, MapLayout to);

// The layers of `specs` for input maps of shape `cur`, which it advances to the output shape.
// A UserError from entry i is prefixed with "<where>[i] (<type>): ". Specs that make no layer
// (flatten) only change the shape.
// Each BatchNorm directly followed by a ReLU takes the ReLU over (BatchNorm::fuse_relu), which
// leaves the list.
void fuse_batchnorm_relu(std::vector<std::unique_ptr<Layer>>& layers);
std::vector<std::unique_ptr<Layer>> make_layers(const std::vector<LayerSpec>& specs, MapShape& cur,
                                                bool sync, const std::string& where);
// The residual block of spec `l` for input maps `cur`, which it advances (residual.cpp).
std::unique_ptr<Layer> make_residual(const LayerSpec& l, MapShape& cur, bool sync);
// A layer list entry of type `t`, every field at its default (the presets build theirs so).
LayerSpec layer_spec(LayerType t);
// The layer type of a preset's activation (relu, tanh, sigmoid, gelu).
LayerType activation_layer(Activation a);
// The layer list of model.type resnet (residual.cpp).
std::vector<LayerSpec> resnet_layers(const ModelConfig& cfg);

class Model {
 public:
  // `shared_params`: the model reads its weights from there (param_count() floats that another
  // Model of the same layers owns and keeps alive) and allocates none of its own; gradients
  // are always its own.
  // `positions` > 1: a language model, whose last layer gives `positions` rows of `classes`
  // logits per sample and whose targets are the next tokens of the input windows (the labels
  // passed to the loss are not read); its loss and accuracy are means over the positions.
  Model(Device& d, std::vector<std::unique_ptr<Layer>> layers, int classes,
        float* shared_params = nullptr, int64_t positions = 1);
  Device& device() { return dev_; }
  int64_t param_count() const { return n_params_; }
  int64_t in_features() const { return layers_.front()->in_features(); }
  int classes() const { return classes_; }
  int64_t positions() const { return positions_; }
  float* params() { return shared_params_ ? shared_params_ : params_.data(); }
  float* grads() { return grads_.data(); }
  std::string describe() const;
  // Whether any layer keeps running statistics (BatchNorm), blocks' layers included.
  bool has_batchnorm() const { return !state_.empty(); }

  // Has the device prepare every convolution for `rows` samples, forward only or for backward
  // too (Device::plan_conv): before the first epoch, so that it does not pay for it. Returns
  // how many convolutions the model has.
  int plan_convs(int64_t rows, bool backward);
  // Initialises all parameters from `seed` (same values on every replica).
  void init(uint64_t seed);
  void zero_grads();
  // Forward pass; returns logits [rows x classes]. `train` selects batch statistics and
  // dropout (true) or running statistics and no dropout (false).
  const float* forward(const float* x, int64_t rows, bool train = true);
  // The replica group (for synchronised BatchNorm) and the replica's random stream.
  // `synced`: told of each of synchronised BatchNorm's exchanges (LayerContext::synced).
  void set_context(Communicator* comm, Rng* rng, decltype(LayerContext::synced) synced = {});
  // Averages evaluation state (BatchNorm running statistics) over replicas, so every replica
  // evaluates the same model. No-op for models without such state.
  void average_state(Communicator& comm);
  // That state, every layer's in order, on the host (a checkpoint's), and back.
  std::vector<float> download_state();
  void upload_state(const std::vector<float>& all);
  // Softmax cross-entropy on the last forward's logits; accumulates parameter gradients of
  // grad_scale * summed loss. stats[0] += loss sum, stats[1] += correct count. When `ready` is
  // given, it is called after each layer's backward with the range [offset, offset + count) of
  // the flat gradient buffer that layer has just finished (ranges arrive from the end of the
  // buffer towards its start), so the exchange can start before backward ends.
  using GradsReady = std::function<void(size_t offset, size_t count)>;
  void loss_backward(const int32_t* labels, int64_t rows, float grad_scale, double* stats,
                     const GradsReady& ready = {});
  // Loss and accuracy only (evaluation): plain cross-entropy, whatever the label smoothing, so
  // test losses compare across runs.
  void loss_only(const int32_t* labels, int64_t rows, double* stats);
  // The runs of the flat parameter buffer that are weights, in order (weight_ranges below).
  std::vector<ParamRange> weight_ranges() const;
  // The label smoothing of loss_backward's targets (train.label_smoothing), 0 by default.
  void set_label_smoothing(double eps) { label_smoothing_ = eps; }

 private:
  Device& dev_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<int64_t> offsets_;  // each layer's first parameter in the flat buffers
  std::vector<Buffer<float>*> state_;  // every layer's state, in order (collect_state)
  int classes_;
  int64_t positions_ = 1;
  int64_t n_params_ = 0;
  Buffer<float> params_, grads_, dlogits_;
  MapLayout out_layout_;  // the last layer's (channel blocks: the logits are converted)
  Buffer<float> logits_nchw_, dlogits_blocked_;
  Buffer<int32_t> targets_;  // a language model's next tokens of the last forward
  float* shared_params_ = nullptr;
  const float* logits_ = nullptr;
  int64_t rows_ = 0;
  double label_smoothing_ = 0.0;
  LayerContext ctx_;
};

// The layer list a preset stands for (mlp, lenet5, cnn, resnet), or cfg.layers for type: layers.
// The classifier (a dense layer to the class count) is not in the list; build_model adds it.
std::vector<LayerSpec> expand_layers(const ModelConfig& cfg);

// Builds the configured model for samples of `input_shape` (e.g. {1, 28, 28} or {784}) and
// `classes` outputs. Throws UserError when a layer does not fit its input.
std::unique_ptr<Model> build_model(Device& d, const ModelConfig& cfg,
                                   const std::vector<int64_t>& input_shape, int classes,
                                   float* shared_params = nullptr);

// The layers of that model, classifier included, without a device (nothing is allocated).
// Throws UserError naming the layer (model.layers[i], or the preset's layer i) when one does
// not fit its input.
std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg,
                                                 const std::vector<int64_t>& input_shape,
                                                 int classes);

// The runs of the flat parameter buffer of `layers` that are weights (not biases, not
// BatchNorm's scale and shift), adjacent runs merged: what optimizer.decay_bn_and_bias: false
// decays.
std::vector<ParamRange> weight_ranges(const std::vector<std::unique_ptr<Layer>>& layers);

// The initial parameters of `layers` (the flat buffer's order) drawn from `seed`, on the host:
// what Model::init uploads, and what replicas sharing one copy of the weights start from.
std::vector<float> initial_params(const std::vector<std::unique_ptr<Layer>>& layers,
                                  uint64_t seed);

// What one replica of the model holds, for a memory estimate before anything is allocated:
// parameters, and the floats per sample that forward keeps for backward (every layer's output).
// Saturates at INT64_MAX instead of overflowing.
struct ModelSize {
  int64_t params = 0;
  int64_t activations_per_sample = 0;
  // FLOPs per sample (2 per multiply-add) of a training step's GEMMs and convolutions: forward,
  // and backward (the weights' gradients, and the inputs' but for the first layer's).
  double forward_flops = 0, backward_flops = 0;
  // Per BatchNorm, in the model's order (blocks' included), the positions it pools per channel
  // and sample (h x w of its input map; 1 after a dense layer): with the batch, how many values
  // each of its statistics averages.
  std::vector<int64_t> batchnorm_positions;
};
ModelSize model_size(const ModelConfig& cfg, const std::vector<int64_t>& input_shape, int classes);

// Evaluation holds at most this many bytes of activations per chunk, shared by the replicas
// (each holds its chunk at once), or the training micro-batch's where that is more.
inline constexpr double kEvalActivationBytes = 256.0 * 1024 * 1024;

// The rows of one replica's evaluation chunk: train.eval_batch, fewer where the chunks'
// activations (forward keeps every layer's output) would pass both kEvalActivationBytes over all
// `replicas` and the training micro-batch's, so that evaluating never takes more memory than
// training. ResNet-18 on 3x32x32 keeps 7.8 MiB per sample: 1,000 rows would be 7.6 GiB, while
// batch 128 trains in 1. Never more rows than the replica's slice of the test set (`test_rows`
// shared out), at least 1. It depends on the replica count alone, not on how the replicas are
// launched, so that threads and processes score with the same chunks (and the same bits).
int64_t eval_chunk_rows(int64_t eval_batch, int64_t micro_rows, int64_t test_rows,
                        int64_t activations_per_sample, int replicas = 1);

}  // namespace dtrain
