#include "dtrain/nn/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/base/error.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain {

MapLayout Layer::plan_layout(Device& d, MapLayout in) {
  layout_in_ = in;
  const std::optional<MapLayout> out = layout_for(d, in);
  convert_in_ = in.block != 0 && !out;
  return out ? *out : MapLayout{};
}

MapLayout plan_layouts(Device& d, std::vector<std::unique_ptr<Layer>>& layers, MapLayout in) {
  for (auto& l : layers) in = l->plan_layout(d, in);
  return in;
}

const float* in_layout(Device& d, Buffer<float>& buf, const float* v, int64_t rows,
                       int64_t features, MapLayout from, MapLayout to) {
  if (from.block == to.block) return v;
  const int64_t c = std::max(from.c, to.c);
  buf.resize(d, static_cast<size_t>(std::max<int64_t>(rows, 1) * features));
  d.convert_layout(v, rows, c, features / c, from.block, to.block, buf.data());
  return buf.data();
}

const float* Layer::forward(Device& d, const float* x, int64_t rows) {
  if (rows < 0) DTRAIN_THROW_SYSTEM("negative batch");
  if (keeps_output()) y_.resize(d, static_cast<size_t>(std::max<int64_t>(rows, 1) * out_));
  // An NCHW layer after channel blocks: its own NCHW copy, kept for backward.
  if (convert_in_) x = in_layout(d, x_nchw_, x, rows, in_, layout_in_, MapLayout{});
  x_ = x;
  rows_ = rows;
  // Called with zero rows too: a synchronised layer must join its collective even when this
  // replica's share of a short last batch is empty.
  forward_impl(d, x, y_.data(), rows);
  return y_.data();
}

const float* Layer::backward(Device& d, const float* dy, int64_t rows, bool need_dx) {
  if (rows != rows_)
    DTRAIN_THROW_SYSTEM(
        fmt::format("{}: backward for {} rows after forward of {}", describe(), rows, rows_));
  float* dx = nullptr;
  if (need_dx) {
    dx_.resize(d, static_cast<size_t>(std::max<int64_t>(rows, 1) * in_));
    dx = dx_.data();
  }
  backward_impl(d, x_, y_.data(), dy, dx, rows);
  if (!dx || !convert_in_) return dx;
  return in_layout(d, dx_blocked_, dx, rows, in_, MapLayout{}, layout_in_);
}

std::string Dense::describe() const {
  if (positions_ > 1) return fmt::format("dense({}->{} x{})", in_, out_, positions_);
  return fmt::format("dense({}->{})", in_, out_);
}

void Dense::bind(float* params, float* grads) {
  w_ = params;
  b_ = params + in_ * out_;
  dw_ = grads;
  db_ = grads + in_ * out_;
}

void Dense::init(Rng& rng, float* params) const {
  if (init_std_ > 0.0) {
    for (int64_t i = 0; i < in_ * out_; ++i)
      params[i] = static_cast<float>(init_std_ * rng.normal());
    std::fill(params + in_ * out_, params + param_count(), 0.f);
    return;
  }
  // U(-1/sqrt(in), 1/sqrt(in)) for weights and bias: the default of PyTorch's nn.Linear,
  // so recipes tuned there carry over.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  for (int64_t i = 0; i < param_count(); ++i)
    params[i] = static_cast<float>(rng.uniform(-bound, bound));
}

void Dense::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  const int64_t m = rows * positions_;
  d.gemm(false, false, m, out_, in_, 1.f, x, in_, w_, out_, 0.f, y, out_);
  d.add_bias(y, b_, m, out_);
}

void Dense::backward_impl(Device& d, const float* x, const float*, const float* dy, float* dx,
                          int64_t rows) {
  const int64_t m = rows * positions_;
  // Gradients accumulate (beta = 1) so accumulation steps need no extra buffer.
  d.gemm(true, false, in_, out_, m, 1.f, x, in_, dy, out_, 1.f, dw_, out_);
  d.bias_grad(dy, db_, m, out_, Accumulate::add);
  if (dx) d.gemm(false, true, m, in_, out_, 1.f, dy, out_, w_, out_, 0.f, dx, in_);
}

std::string ActivationLayer::describe() const {
  return to_string(act_);
}

void ActivationLayer::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  d.activation_forward(act_, x, y, static_cast<size_t>(rows * in_features()));
}

void ActivationLayer::backward_impl(Device& d, const float* x, const float* y, const float* dy,
                                    float* dx, int64_t rows) {
  // No parameters: when the caller needs no dL/dx (this is the model's first layer) there is
  // nothing to compute, and the device kernels would write through a null dx.
  if (!dx) return;
  d.activation_backward(act_, x, y, dy, dx, static_cast<size_t>(rows * in_features()));
}

Model::Model(Device& d, std::vector<std::unique_ptr<Layer>> layers, int classes,
             float* shared_params, int64_t positions)
    : dev_(d),
      layers_(std::move(layers)),
      classes_(classes),
      positions_(positions),
      shared_params_(shared_params) {
  if (layers_.empty()) DTRAIN_THROW_SYSTEM("model has no layers");
  if (positions_ < 1 || layers_.back()->out_features() != classes * positions_)
    DTRAIN_THROW_SYSTEM("last layer does not produce one logit per class and position");
  for (const auto& l : layers_) n_params_ += l->param_count();
  if (!shared_params_) params_.resize(d, static_cast<size_t>(std::max<int64_t>(n_params_, 1)));
  grads_.resize(d, static_cast<size_t>(std::max<int64_t>(n_params_, 1)));
  out_layout_ = plan_layouts(d, layers_, MapLayout{});
  int64_t off = 0;
  for (auto& l : layers_) {
    offsets_.push_back(off);
    l->bind(params() + off, grads_.data() + off);
    l->setup(d);
    l->attach(&ctx_);
    l->collect_state(state_);
    off += l->param_count();
  }
}

std::vector<ParamRange> weight_ranges(const std::vector<std::unique_ptr<Layer>>& layers) {
  std::vector<ParamRange> runs, merged;
  int64_t off = 0;
  for (const auto& l : layers) {
    l->weight_ranges(off, runs);
    off += l->param_count();
  }
  for (const ParamRange& r : runs) {
    if (!merged.empty() && merged.back().offset + merged.back().count == r.offset)
      merged.back().count += r.count;
    else
      merged.push_back(r);
  }
  return merged;
}

std::vector<ParamRange> Model::weight_ranges() const {
  return dtrain::weight_ranges(layers_);
}

void Model::set_context(Communicator* comm, Rng* rng, decltype(LayerContext::synced) synced) {
  ctx_.comm = comm;
  ctx_.rng = rng;
  ctx_.synced = std::move(synced);
}

void Model::average_state(Communicator& comm) {
  std::vector<float> all = download_state();
  if (all.empty()) return;
  comm.allreduce(all.data(), all.size(), ReduceOp::mean);
  upload_state(all);
}

// The states in layer order, a block's layers in theirs: a model without blocks keeps the
// order (and checkpoints) of the days when each layer had one state at most.
std::vector<float> Model::download_state() {
  std::vector<float> all;
  for (auto* st : state_) {
    const size_t at = all.size();
    all.resize(at + st->size());
    dev_.download(all.data() + at, st->data(), st->size() * sizeof(float));
  }
  return all;
}

void Model::upload_state(const std::vector<float>& all) {
  size_t off = 0;
  for (auto* st : state_) {
    if (off + st->size() > all.size()) throw UserError("checkpoint: BatchNorm state too short");
    dev_.upload(st->data(), all.data() + off, st->size() * sizeof(float));
    off += st->size();
  }
  if (off != all.size()) throw UserError("checkpoint: BatchNorm state of another model");
}

std::string Model::describe() const {
  std::string s;
  for (const auto& l : layers_) {
    if (!s.empty()) s += " -> ";
    s += l->describe();
  }
  return fmt::format("{} ({} parameters)", s, n_params_);
}

std::vector<float> initial_params(const std::vector<std::unique_ptr<Layer>>& layers,
                                  uint64_t seed) {
  Rng rng(stream_key(seed, 0x1417));
  int64_t n = 0;
  for (const auto& l : layers) n += l->param_count();
  std::vector<float> host(static_cast<size_t>(n));
  int64_t off = 0;
  for (const auto& l : layers) {
    l->init(rng, host.data() + off);
    off += l->param_count();
  }
  return host;
}

int Model::plan_convs(int64_t rows, bool backward) {
  int n = 0;
  for (auto& l : layers_) n += l->plan_convs(dev_, rows, backward);
  return n;
}

void Model::init(uint64_t seed) {
  const std::vector<float> host = initial_params(layers_, seed);
  dev_.upload(params(), host.data(), host.size() * sizeof(float));
  zero_grads();
}

void Model::zero_grads() {
  dev_.fill(grads_.data(), static_cast<size_t>(n_params_), 0.f);
}

const float* Model::forward(const float* x, int64_t rows, bool train) {
  ctx_.train = train;
  const float* h = x;
  for (auto& l : layers_) h = l->forward(dev_, h, rows);
  // Logits as channel maps in blocks: NCHW for the loss.
  logits_ = in_layout(dev_, logits_nchw_, h, rows, classes_ * positions_, out_layout_, {});
  rows_ = rows;
  if (positions_ > 1) {  // a language model: the targets are the windows' next tokens
    targets_.resize(dev_, static_cast<size_t>(std::max<int64_t>(1, rows * positions_)));
    dev_.next_tokens(x, in_features(), rows, positions_, classes_, targets_.data());
  }
  return logits_;
}

void Model::loss_backward(const int32_t* labels, int64_t rows, float grad_scale, double* stats,
                          const GradsReady& ready) {
  if (rows != rows_) DTRAIN_THROW_SYSTEM("loss_backward: batch differs from the last forward");
  // No early return for rows == 0: synchronised layers still take part in their collectives.
  // A language model's loss is the mean over the T positions: per sample, 1/T of their sum.
  const int64_t n = rows * positions_;
  const double per = 1.0 / static_cast<double>(positions_);
  dlogits_.resize(dev_, static_cast<size_t>(std::max<int64_t>(n, 1) * classes_));
  dev_.softmax_xent(logits_, positions_ > 1 ? targets_.data() : labels, n, classes_,
                    grad_scale * static_cast<float>(per), dlogits_.data(), stats,
                    label_smoothing_, per);
  const float* g = in_layout(dev_, dlogits_blocked_, dlogits_.data(), rows, classes_ * positions_,
                             {}, out_layout_);
  for (size_t i = layers_.size(); i-- > 0;) {
    g = layers_[i]->backward(dev_, g, rows, i > 0);
    if (ready && layers_[i]->param_count() > 0)
      ready(static_cast<size_t>(offsets_[i]), static_cast<size_t>(layers_[i]->param_count()));
  }
}

void Model::loss_only(const int32_t* labels, int64_t rows, double* stats) {
  if (rows == 0) return;
  const double per = 1.0 / static_cast<double>(positions_);
  dev_.softmax_xent(logits_, positions_ > 1 ? targets_.data() : labels, rows * positions_,
                    classes_, 0.f, nullptr, stats, 0.0, per);
}

LayerSpec layer_spec(LayerType t) {
  LayerSpec l;
  l.type = t;
  return l;
}

namespace {
// Layer specs of the built-in models.
LayerSpec dense(int64_t units) {
  LayerSpec l = layer_spec(LayerType::dense);
  l.units = units;
  return l;
}
LayerSpec conv(int64_t channels, int64_t kernel, int64_t padding) {
  LayerSpec l = layer_spec(LayerType::conv);
  l.channels = channels;
  l.kernel = kernel;
  l.padding = padding;
  return l;
}
LayerSpec pool() {
  LayerSpec l = layer_spec(LayerType::maxpool);
  l.kernel = 2;
  return l;
}
}  // namespace

LayerType activation_layer(Activation a) {
  switch (a) {
    case Activation::relu:
      return LayerType::relu;
    case Activation::tanh:
      return LayerType::tanh;
    case Activation::sigmoid:
      return LayerType::sigmoid;
    case Activation::gelu:
      return LayerType::gelu;
  }
  return LayerType::relu;
}

std::vector<LayerSpec> expand_layers(const ModelConfig& cfg) {
  const auto act = [&] { return layer_spec(activation_layer(cfg.activation)); };
  const auto dropout = [&] {
    LayerSpec l = layer_spec(LayerType::dropout);
    l.p = cfg.dropout;
    return l;
  };
  std::vector<LayerSpec> out;
  switch (cfg.type) {
    case ModelType::layers:
      return cfg.layers;
    case ModelType::resnet:
      return resnet_layers(cfg);
    case ModelType::gpt:
      return {};  // not a layer list: build_layers makes its layers (transformer.cpp)
    case ModelType::mlp:
      out.push_back(layer_spec(LayerType::flatten));
      for (int64_t h : cfg.hidden) {
        out.push_back(dense(h));
        out.push_back(act());
        if (cfg.dropout > 0) out.push_back(dropout());
      }
      return out;
    case ModelType::lenet5:
      // LeCun et al. 1998, with max pooling and the configured activation.
      out = {conv(6, 5, 2),
             act(),
             pool(),
             conv(16, 5, 0),
             act(),
             pool(),
             layer_spec(LayerType::flatten),
             dense(120),
             act(),
             dense(84),
             act()};
      return out;
    case ModelType::cnn:
      // Two conv-BN-activation-pool blocks and two dense layers.
      out = {conv(32, 3, 1),
             layer_spec(LayerType::batchnorm),
             act(),
             pool(),
             conv(64, 3, 1),
             layer_spec(LayerType::batchnorm),
             act(),
             pool(),
             layer_spec(LayerType::flatten),
             dense(128),
             act()};
      if (cfg.dropout > 0) out.push_back(dropout());
      return out;
  }
  return out;
}

namespace {

// One layer for input maps of shape `cur`, which it advances to the layer's output; null for
// flatten (NCHW is already contiguous: no copy needed). Throws UserError when it does not fit.
std::unique_ptr<Layer> make_layer(const LayerSpec& l, MapShape& cur, bool sync) {
  const auto spatial = [&](const char* what) {
    if (cur.flat && cur.c > 1)
      throw UserError(
          fmt::format("model: {} needs an image input (channels x height x width) but "
                      "gets {} flat features; put it before flatten/dense, or give "
                      "the data a [c, h, w] shape",
                      what, cur.c));
  };
  std::unique_ptr<Layer> layer;
  switch (l.type) {
    case LayerType::dense:
      if (l.units > 0 && cur.size() > (std::numeric_limits<int64_t>::max() - l.units) / l.units)
        throw UserError(fmt::format("a dense layer of {} x {} weights is too large", cur.size(),
                                    l.units));
      layer = std::make_unique<Dense>(cur.size(), l.units);
      cur = {l.units, 1, 1, true};
      break;
    case LayerType::conv: {
      spatial("conv");
      const int64_t stride = l.stride > 0 ? l.stride : 1;
      layer = std::make_unique<Conv2d>(cur, l.channels, l.kernel, stride, l.padding, l.bias);
      cur = Conv2d::output_shape(cur, l.channels, l.kernel, stride, l.padding);
      break;
    }
    case LayerType::maxpool: {
      spatial("maxpool");
      const int64_t stride = l.stride > 0 ? l.stride : l.kernel;
      layer = std::make_unique<MaxPool2d>(cur, l.kernel, stride, l.padding);
      cur = MaxPool2d::output_shape(cur, l.kernel, stride, l.padding);
      break;
    }
    case LayerType::global_avg_pool:
      spatial("global_avg_pool");
      layer = std::make_unique<GlobalAvgPool>(cur);
      cur = {cur.c, 1, 1};
      break;
    case LayerType::batchnorm:
      layer = std::make_unique<BatchNorm>(cur, sync);
      break;
    case LayerType::dropout:
      layer = std::make_unique<Dropout>(cur.size(), l.p);
      break;
    case LayerType::flatten:
      cur = {cur.size(), 1, 1, true};  // NCHW is already contiguous: no copy needed
      break;
    case LayerType::relu:
      layer = std::make_unique<ActivationLayer>(cur.size(), Activation::relu);
      break;
    case LayerType::tanh:
      layer = std::make_unique<ActivationLayer>(cur.size(), Activation::tanh);
      break;
    case LayerType::sigmoid:
      layer = std::make_unique<ActivationLayer>(cur.size(), Activation::sigmoid);
      break;
    case LayerType::gelu:
      layer = std::make_unique<ActivationLayer>(cur.size(), Activation::gelu);
      break;
    case LayerType::residual:
      layer = make_residual(l, cur, sync);
      break;
  }
  return layer;
}

MapShape input_map(const std::vector<int64_t>& input_shape) {
  if (input_shape.size() == 3) return {input_shape[0], input_shape[1], input_shape[2]};
  if (input_shape.size() == 2) return {1, input_shape[0], input_shape[1]};
  int64_t n = 1;
  for (auto v : input_shape) n *= v;  // validated: the product is bounded (config.cpp)
  return {n, 1, 1, true};
}

}  // namespace

void fuse_batchnorm_relu(std::vector<std::unique_ptr<Layer>>& layers) {
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    auto* bn = dynamic_cast<BatchNorm*>(layers[i].get());
    const auto* act = dynamic_cast<const ActivationLayer*>(layers[i + 1].get());
    if (!bn || bn->relu() || !act || act->activation() != Activation::relu) continue;
    bn->fuse_relu();
    layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
}

namespace {

// make_layers with `name(i, spec)` prefixed to entry i's UserError, BatchNorm and ReLU fused.
template <class Name>
std::vector<std::unique_ptr<Layer>> make_named(const std::vector<LayerSpec>& specs, MapShape& cur,
                                               bool sync, const Name& name) {
  std::vector<std::unique_ptr<Layer>> layers;
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      if (auto layer = make_layer(specs[i], cur, sync)) layers.push_back(std::move(layer));
    } catch (const UserError& e) {
      throw UserError(fmt::format("{}: {}", name(i, specs[i]), e.what()));
    }
  }
  fuse_batchnorm_relu(layers);
  return layers;
}

}  // namespace

std::vector<std::unique_ptr<Layer>> make_layers(const std::vector<LayerSpec>& specs, MapShape& cur,
                                                bool sync, const std::string& where) {
  return make_named(specs, cur, sync, [&](size_t i, const LayerSpec& l) {
    return fmt::format("{}[{}] ({})", where, i, to_string(l.type));
  });
}

std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg,
                                                 const std::vector<int64_t>& input_shape,
                                                 int classes) {
  if (cfg.type == ModelType::gpt) return gpt_layers(cfg, input_shape, classes);
  MapShape cur = input_map(input_shape);
  const bool sync = cfg.batchnorm == BatchNormMode::sync;
  // Name the layer: the user's list, or the preset that stands for it.
  auto layers = make_named(expand_layers(cfg), cur, sync, [&](size_t i, const LayerSpec& l) {
    return cfg.type == ModelType::layers
               ? fmt::format("model.layers[{}] ({})", i, to_string(l.type))
               : fmt::format("model.type {} (its layer {}, {})", to_string(cfg.type), i,
                             to_string(l.type));
  });
  layers.push_back(std::make_unique<Dense>(cur.size(), classes));
  return layers;
}

std::unique_ptr<Model> build_model(Device& d, const ModelConfig& cfg,
                                   const std::vector<int64_t>& input_shape, int classes,
                                   float* shared_params) {
  const int64_t positions = cfg.type == ModelType::gpt ? gpt_positions(input_shape) : 1;
  return std::make_unique<Model>(d, build_layers(cfg, input_shape, classes), classes,
                                 shared_params, positions);
}

ModelSize model_size(const ModelConfig& cfg, const std::vector<int64_t>& input_shape, int classes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const auto add = [](int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; };
  ModelSize s;
  const auto layers = build_layers(cfg, input_shape, classes);
  for (const auto& l : layers) {
    s.params = add(s.params, l->param_count());
    s.activations_per_sample = add(s.activations_per_sample, l->activation_floats());
    s.forward_flops += 2.0 * static_cast<double>(l->macs_per_sample());
    l->batchnorm_positions(s.batchnorm_positions);
  }
  // The first layer computes no input gradient (its input is the data).
  const double first =
      layers.empty() ? 0.0 : 2.0 * static_cast<double>(layers[0]->macs_per_sample());
  s.backward_flops = 2.0 * s.forward_flops - first;
  return s;
}

int64_t eval_chunk_rows(int64_t eval_batch, int64_t micro_rows, int64_t test_rows,
                        int64_t activations_per_sample, int replicas) {
  const int64_t n = std::max(1, replicas);
  const double per_row = 4.0 * static_cast<double>(std::max<int64_t>(1, activations_per_sample));
  const double fit = std::floor(kEvalActivationBytes / static_cast<double>(n) / per_row);
  const int64_t cap =
      std::max(micro_rows, fit >= static_cast<double>(eval_batch) ? eval_batch
                                                                   : static_cast<int64_t>(fit));
  // The largest slice a replica scores (Replica::evaluate's split).
  const int64_t slice = (std::max<int64_t>(0, test_rows) + n - 1) / n;
  return std::max<int64_t>(1, std::min({eval_batch, std::max<int64_t>(1, slice), cap}));
}

}  // namespace dtrain
