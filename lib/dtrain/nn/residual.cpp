// Residual blocks (He et al. 2016) and the ResNet presets built from them.
#include <fmt/format.h>

#include <algorithm>

#include "dtrain/base/error.hpp"
#include "dtrain/nn/model.hpp"

namespace dtrain {

namespace {

std::string show(MapShape s) {
  if (s.flat) return fmt::format("[{}]", s.size());  // features, after flatten or dense
  return fmt::format("[{}, {}, {}]", s.c, s.h, s.w);
}

// Runs backward through `layers` from the last; returns dL/d(their input), or null where
// !need_dx. An empty list passes the gradient through (the identity).
const float* backward_through(Device& d, std::vector<std::unique_ptr<Layer>>& layers,
                              const float* g, int64_t rows, bool need_dx) {
  for (size_t i = layers.size(); i-- > 0;) g = layers[i]->backward(d, g, rows, i > 0 || need_dx);
  return g;
}

const float* forward_through(Device& d, std::vector<std::unique_ptr<Layer>>& layers, const float* x,
                             int64_t rows) {
  for (auto& l : layers) x = l->forward(d, x, rows);
  return x;
}

std::optional<Activation> activation_of(BlockActivation a) {
  switch (a) {
    case BlockActivation::none:
      return std::nullopt;
    case BlockActivation::relu:
      return Activation::relu;
    case BlockActivation::tanh:
      return Activation::tanh;
    case BlockActivation::sigmoid:
      return Activation::sigmoid;
    case BlockActivation::gelu:
      return Activation::gelu;
  }
  return std::nullopt;
}

std::string describe_list(const std::vector<std::unique_ptr<Layer>>& layers) {
  std::string s;
  for (const auto& l : layers) s += (s.empty() ? "" : " -> ") + l->describe();
  return s;
}

}  // namespace

Residual::Residual(MapShape in, MapShape out, std::vector<std::unique_ptr<Layer>> body,
                   std::vector<std::unique_ptr<Layer>> shortcut, std::optional<Activation> act)
    : Layer(in.size(), out.size()),
      body_(std::move(body)),
      shortcut_(std::move(shortcut)),
      act_(act) {
  // Forward, BatchNorm's normalisation, the sum and the ReLU in one pass (3 reads and writes
  // of a map where there were 5) and no map kept for BatchNorm's output; backward, the ReLU's
  // mask in BatchNorm's pass of sums (4 where there were 5).
  auto* bn = body_.empty() ? nullptr : dynamic_cast<BatchNorm*>(body_.back().get());
  if (bn && !bn->relu() && (!act_ || *act_ == Activation::relu)) {
    tail_ = bn;
    tail_->become_tail(act_.has_value());
  }
}

std::string Residual::describe() const {
  return fmt::format("residual({} | {}){}", describe_list(body_),
                     shortcut_.empty() ? "identity" : describe_list(shortcut_),
                     act_ ? fmt::format(" + {}", to_string(*act_)) : "");
}

int64_t Residual::param_count() const {
  int64_t n = 0;
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) n += l->param_count();
  return n;
}

void Residual::bind(float* params, float* grads) {
  int64_t off = 0;
  for (auto* list : {&body_, &shortcut_})
    for (auto& l : *list) {
      l->bind(params + off, grads + off);
      off += l->param_count();
    }
}

void Residual::weight_ranges(int64_t offset, std::vector<ParamRange>& out) const {
  int64_t off = offset;
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) {
      l->weight_ranges(off, out);
      off += l->param_count();
    }
}

void Residual::init(Rng& rng, float* params) const {
  int64_t off = 0;
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) {
      l->init(rng, params + off);
      off += l->param_count();
    }
}

void Residual::setup(Device& d) {
  for (auto* list : {&body_, &shortcut_})
    for (auto& l : *list) l->setup(d);
}

int Residual::plan_convs(Device& d, int64_t rows, bool backward) {
  int n = 0;
  for (auto* list : {&body_, &shortcut_})
    for (auto& l : *list) n += l->plan_convs(d, rows, backward);
  return n;
}

std::optional<MapLayout> Residual::layout_for(Device& d, MapLayout in) {
  out_layout_ = plan_layouts(d, body_, in);
  shortcut_layout_ = plan_layouts(d, shortcut_, in);
  return out_layout_;
}

void Residual::collect_state(std::vector<Buffer<float>*>& out) {
  for (auto* list : {&body_, &shortcut_})
    for (auto& l : *list) l->collect_state(out);
}

void Residual::attach(const LayerContext* ctx) {
  Layer::attach(ctx);
  for (auto* list : {&body_, &shortcut_})
    for (auto& l : *list) l->attach(ctx);
}

int64_t Residual::state_floats() const {
  int64_t n = 0;
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) n += l->state_floats();
  return n;
}

int64_t Residual::largest_features() const {
  int64_t n = std::max(in_features(), out_features());
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) n = std::max(n, l->largest_features());
  return n;
}

void Residual::batchnorm_positions(std::vector<int64_t>& out) const {
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) l->batchnorm_positions(out);
}

int64_t Residual::macs_per_sample() const {
  int64_t n = 0;
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) n += l->macs_per_sample();
  return n;
}

int64_t Residual::activation_floats() const {
  // The output, and the sum before an activation other than ReLU (whose backward needs only
  // the output).
  int64_t n = out_features() * (act_ && *act_ != Activation::relu ? 2 : 1);
  for (const auto* list : {&body_, &shortcut_})
    for (const auto& l : *list) n += l->activation_floats();
  return n;
}

void Residual::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  const float* b = forward_through(d, body_, x, rows);  // a tail leaves its output to apply_tail
  const float* s = in_layout(d, converted_, forward_through(d, shortcut_, x, rows), rows,
                             out_features(), shortcut_layout_, out_layout_);
  if (tail_) return tail_->apply_tail(d, s, y, rows);
  const auto n = static_cast<size_t>(rows * out_features());
  if (!act_) return d.add(b, s, y, n);
  if (*act_ == Activation::relu) return d.add_relu(b, s, y, n);  // one pass, no sum kept
  sum_.resize(d, std::max<size_t>(n, 1));
  d.add(b, s, sum_.data(), n);
  d.activation_forward(*act_, sum_.data(), y, n);
}

void Residual::backward_impl(Device& d, const float*, const float* y, const float* dy, float* dx,
                             int64_t rows) {
  if (tail_) {
    // The tail masks dy by y (where there is a ReLU) in its own pass and keeps dL/d(sum).
    tail_->tail_output(y);
    const float* gb = backward_through(d, body_, dy, rows, dx != nullptr);
    tail_->tail_output(nullptr);  // this step's output only
    return add_shortcut_grad(d, gb, tail_->tail_grad(dy), dx, rows);
  }
  const float* g = dy;
  if (act_) {
    const auto n = static_cast<size_t>(rows * out_features());
    dsum_.resize(d, std::max<size_t>(n, 1));
    // ReLU's from its output: y > 0 exactly where the sum is (math::add_relu).
    const float* in = *act_ == Activation::relu ? y : sum_.data();
    d.activation_backward(*act_, in, y, dy, dsum_.data(), n);
    g = dsum_.data();
  }
  // Both branches see dL/d(sum).
  add_shortcut_grad(d, backward_through(d, body_, g, rows, dx != nullptr), g, dx, rows);
}

// dx = gb + the shortcut's input gradient from g = dL/d(sum).
void Residual::add_shortcut_grad(Device& d, const float* gb, const float* g, float* dx,
                                 int64_t rows) {
  const float* gs = backward_through(
      d, shortcut_,
      in_layout(d, converted_, g, rows, out_features(), out_layout_, shortcut_layout_), rows,
      dx != nullptr);
  if (dx) d.add(gb, gs, dx, static_cast<size_t>(rows * in_features()));
}

std::unique_ptr<Layer> make_residual(const LayerSpec& l, MapShape& cur, bool sync) {
  const MapShape in = cur;
  MapShape out = in;
  auto body = make_layers(l.body, out, sync, "body");
  const bool same = out.same_shape(in);
  Shortcut kind = l.shortcut;
  if (kind == Shortcut::auto_) kind = same ? Shortcut::identity : Shortcut::project;
  std::vector<std::unique_ptr<Layer>> shortcut;
  if (kind == Shortcut::identity && !same)
    throw UserError(fmt::format(
        "the body's output {} cannot be added to the identity shortcut's {} (the input); use "
        "shortcut: project or auto, or a body that keeps the input's shape",
        show(out), show(in)));
  if (kind == Shortcut::project) {
    // A 1x1 convolution whose stride takes the input's size to the body's output size, read
    // from both sides: a side of 1 stays 1 at any stride, so one side alone may not tell it.
    const auto ratio = [](int64_t from, int64_t to) {
      return (from + to - 1) / std::max<int64_t>(1, to);
    };
    const int64_t stride = std::max<int64_t>({1, ratio(in.h, out.h), ratio(in.w, out.w)});
    if (out.flat || in.flat)
      throw UserError(fmt::format(
          "the body's output {} cannot be added to a projection shortcut of the input {}: a "
          "projection is a 1x1 convolution, of image maps, and {} is flat (after flatten or "
          "dense); keep the block's body convolutional, or give a body that keeps the input's "
          "shape with shortcut: identity",
          show(out), show(in), in.flat ? "the input" : "the body's output"));
    const MapShape p = Conv2d::output_shape(in, out.c, 1, stride, 0);
    if (!p.same_shape(out))
      throw UserError(fmt::format(
          "the body's output {} cannot be added to the projection shortcut's {} (a 1x1 "
          "convolution of stride {} of the input {}); make the body's height and width the "
          "input's divided by one stride",
          show(out), show(p), stride, show(in)));
    shortcut.push_back(std::make_unique<Conv2d>(in, out.c, 1, stride, 0, /*bias=*/false));
    shortcut.push_back(std::make_unique<BatchNorm>(out, sync));
  }
  cur = out;
  return std::make_unique<Residual>(in, out, std::move(body), std::move(shortcut),
                                    activation_of(l.activation));
}

namespace {

LayerSpec bn() {
  return layer_spec(LayerType::batchnorm);
}
LayerSpec act_layer(Activation a) {
  return layer_spec(activation_layer(a));
}

// A convolution without bias (BatchNorm follows it).
LayerSpec conv_nb(int64_t channels, int64_t kernel, int64_t stride, int64_t padding) {
  LayerSpec l = layer_spec(LayerType::conv);
  l.channels = channels;
  l.kernel = kernel;
  l.stride = stride;
  l.padding = padding;
  l.bias = false;
  return l;
}

BlockActivation block_activation(Activation a) {
  switch (a) {
    case Activation::relu:
      return BlockActivation::relu;
    case Activation::tanh:
      return BlockActivation::tanh;
    case Activation::sigmoid:
      return BlockActivation::sigmoid;
    case Activation::gelu:
      return BlockActivation::gelu;
  }
  return BlockActivation::relu;
}

// The basic block: two 3x3 convolutions with BatchNorm, the first of stride `stride`.
LayerSpec basic_block(int64_t width, int64_t stride, Activation act) {
  LayerSpec b = layer_spec(LayerType::residual);
  b.body = {conv_nb(width, 3, stride, 1), bn(), act_layer(act), conv_nb(width, 3, 1, 1), bn()};
  b.shortcut = Shortcut::auto_;
  b.activation = block_activation(act);
  return b;
}

// The bottleneck block of ResNet-50/101/152: 1x1 to `width`, 3x3 of stride `stride` (where
// torchvision's v1.5 puts it), 1x1 to 4 x `width`, each with BatchNorm.
LayerSpec bottleneck_block(int64_t width, int64_t stride, Activation act) {
  LayerSpec b = layer_spec(LayerType::residual);
  b.body = {conv_nb(width, 1, 1, 0),      bn(), act_layer(act),
            conv_nb(width, 3, stride, 1), bn(), act_layer(act),
            conv_nb(4 * width, 1, 1, 0),  bn()};
  b.shortcut = Shortcut::auto_;
  b.activation = block_activation(act);
  return b;
}

// Blocks per stage of an ImageNet-style depth (He et al. 2016, table 1); empty for 6n+2.
std::vector<int64_t> imagenet_stages(int64_t depth) {
  switch (depth) {
    case 18:
      return {2, 2, 2, 2};
    case 34:
    case 50:
      return {3, 4, 6, 3};
    case 101:
      return {3, 4, 23, 3};
    case 152:
      return {3, 8, 36, 3};
    default:
      return {};
  }
}

}  // namespace

std::vector<LayerSpec> resnet_layers(const ModelConfig& cfg) {
  // Blocks per stage: CIFAR-style 6n+2 (He et al. 2016, section 4.2), or ResNet-18 to -152.
  std::vector<int64_t> blocks = imagenet_stages(cfg.depth), widths;
  const bool bottleneck = cfg.depth == 50 || cfg.depth == 101 || cfg.depth == 152;
  if (!blocks.empty()) {
    widths = {64, 128, 256, 512};
  } else {
    const int64_t n = std::max<int64_t>(1, (cfg.depth - 2) / 6);  // validated in config.cpp
    blocks = {n, n, n};
    widths = {16, 32, 64};
  }
  if (!cfg.widths.empty()) widths = cfg.widths;
  if (widths.size() != blocks.size())
    throw UserError(fmt::format("model.widths: resnet depth {} has {} stages, got {} widths",
                                cfg.depth, blocks.size(), widths.size()));
  const Activation act = cfg.activation;
  std::vector<LayerSpec> out;
  if (cfg.stem == ResnetStem::cifar) {
    out = {conv_nb(widths[0], 3, 1, 1), bn(), act_layer(act)};
  } else {
    LayerSpec pool = layer_spec(LayerType::maxpool);  // torchvision's: 224 -> 112 -> 56
    pool.kernel = 3;
    pool.stride = 2;
    pool.padding = 1;
    out = {conv_nb(widths[0], 7, 2, 3), bn(), act_layer(act), pool};
  }
  for (size_t s = 0; s < blocks.size(); ++s)
    for (int64_t b = 0; b < blocks[s]; ++b)
      out.push_back(bottleneck ? bottleneck_block(widths[s], s > 0 && b == 0 ? 2 : 1, act)
                               : basic_block(widths[s], s > 0 && b == 0 ? 2 : 1, act));
  out.push_back(layer_spec(LayerType::global_avg_pool));
  return out;
}

}  // namespace dtrain
