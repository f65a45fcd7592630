// The GPT's layers and the model.type gpt preset built from them.
#include "dtrain/nn/transformer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace {

constexpr double kInitStd = 0.02;  // GPT-2's N(0, 0.02)
constexpr float kLnEps = 1e-5f;

void fill_normal(Rng& rng, float* p, int64_t n, double std) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(std * rng.normal());
}

}  // namespace

Embedding::Embedding(int64_t vocab, int64_t t, int64_t c)
    : Layer(t + 1, t * c), vocab_(vocab), t_(t), c_(c) {}

std::string Embedding::describe() const {
  return fmt::format("embedding({} tokens + {} positions -> {})", vocab_, t_, c_);
}

void Embedding::bind(float* params, float* grads) {
  wte_ = params;
  wpe_ = params + vocab_ * c_;
  dwte_ = grads;
  dwpe_ = grads + vocab_ * c_;
}

void Embedding::init(Rng& rng, float* params) const {
  fill_normal(rng, params, param_count(), kInitStd);
}

void Embedding::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  d.embedding_forward(x, in_features(), wte_, wpe_, rows, t_, c_, vocab_, y);
}

// Token ids have no gradient: dx stays unwritten (the embedding is always the first layer).
void Embedding::backward_impl(Device& d, const float* x, const float*, const float* dy, float*,
                              int64_t rows) {
  d.embedding_backward(x, in_features(), dy, rows, t_, c_, vocab_, dwte_, dwpe_);
}

std::string LayerNorm::describe() const {
  return fmt::format("layernorm({})", c_);
}

void LayerNorm::bind(float* params, float* grads) {
  gamma_ = params;
  beta_ = params + c_;
  dgamma_ = grads;
  dbeta_ = grads + c_;
}

void LayerNorm::init(Rng&, float* params) const {
  std::fill(params, params + c_, 1.f);
  std::fill(params + c_, params + 2 * c_, 0.f);
}

void LayerNorm::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  stats_.resize(d, static_cast<size_t>(std::max<int64_t>(1, rows * t_) * 2));
  d.layernorm_forward(x, gamma_, beta_, rows * t_, c_, kLnEps, y, stats_.data());
}

void LayerNorm::backward_impl(Device& d, const float* x, const float*, const float* dy, float* dx,
                              int64_t rows) {
  d.layernorm_backward(x, dy, gamma_, stats_.data(), rows * t_, c_, dx, dgamma_, dbeta_);
}

std::string CausalAttention::describe() const {
  return fmt::format("causal-attention({} heads x {})", heads_, c_ / heads_);
}

void CausalAttention::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  att_.resize(d, static_cast<size_t>(std::max<int64_t>(1, rows * heads_ * t_ * t_)));
  d.attention_forward(x, rows, t_, c_, heads_, att_.data(), y);
}

void CausalAttention::backward_impl(Device& d, const float* x, const float*, const float* dy,
                                    float* dx, int64_t rows) {
  if (!dx) DTRAIN_THROW_SYSTEM("attention as a model's first layer");
  d.attention_backward(x, att_.data(), dy, rows, t_, c_, heads_, dx);
}

std::string TiedHead::describe() const {
  return fmt::format("head({} -> {} tokens, tied)", c_, vocab_);
}

void TiedHead::forward_impl(Device& d, const float* x, float* y, int64_t rows) {
  d.gemm(false, true, rows * t_, vocab_, c_, 1.f, x, c_, emb_->wte(), c_, 0.f, y, vocab_);
}

void TiedHead::backward_impl(Device& d, const float* x, const float*, const float* dy, float* dx,
                             int64_t rows) {
  const int64_t m = rows * t_;
  d.gemm(true, false, vocab_, c_, m, 1.f, dy, vocab_, x, c_, 1.f, emb_->dwte(), c_);
  if (dx) d.gemm(false, false, m, c_, vocab_, 1.f, dy, vocab_, emb_->wte(), c_, 0.f, dx, c_);
}

int64_t gpt_positions(const std::vector<int64_t>& input_shape) {
  if (input_shape.size() != 1 || input_shape[0] < 2)
    throw UserError(
        "model.type gpt reads windows of token ids (data.dataset: bytes); these data are not");
  return input_shape[0] - 1;
}

namespace {

// x + f(LayerNorm(x)) for the branch `f`, all on [t, c].
std::unique_ptr<Layer> pre_norm_block(int64_t t, int64_t c,
                                      std::vector<std::unique_ptr<Layer>> branch) {
  std::vector<std::unique_ptr<Layer>> body;
  body.push_back(std::make_unique<LayerNorm>(t, c));
  for (auto& l : branch) body.push_back(std::move(l));
  const MapShape shape{c, 1, t, true};
  return std::make_unique<Residual>(shape, shape, std::move(body),
                                    std::vector<std::unique_ptr<Layer>>{}, std::nullopt);
}

void add_dropout(std::vector<std::unique_ptr<Layer>>& v, int64_t features, double p) {
  if (p > 0.0) v.push_back(std::make_unique<Dropout>(features, p));
}

}  // namespace

std::vector<std::unique_ptr<Layer>> gpt_layers(const ModelConfig& cfg,
                                               const std::vector<int64_t>& input_shape,
                                               int64_t vocab) {
  const int64_t t = gpt_positions(input_shape), c = cfg.n_embd, heads = cfg.n_head;
  if (c % heads != 0)
    throw UserError(fmt::format("model.n_embd ({}) must be a multiple of model.n_head ({})", c,
                                heads));
  // GPT-2 scales the init of each branch's last projection by 1/sqrt(2 n_layer).
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  std::vector<std::unique_ptr<Layer>> layers;
  auto emb = std::make_unique<Embedding>(vocab, t, c);
  const Embedding* tied = emb.get();
  layers.push_back(std::move(emb));
  add_dropout(layers, t * c, cfg.dropout);
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    std::vector<std::unique_ptr<Layer>> attn, mlp;
    attn.push_back(std::make_unique<Dense>(c, 3 * c, t, kInitStd));
    attn.push_back(std::make_unique<CausalAttention>(t, c, heads));
    attn.push_back(std::make_unique<Dense>(c, c, t, proj_std));
    add_dropout(attn, t * c, cfg.dropout);
    layers.push_back(pre_norm_block(t, c, std::move(attn)));
    mlp.push_back(std::make_unique<Dense>(c, 4 * c, t, kInitStd));
    mlp.push_back(std::make_unique<ActivationLayer>(t * 4 * c, Activation::gelu));
    mlp.push_back(std::make_unique<Dense>(4 * c, c, t, proj_std));
    add_dropout(mlp, t * c, cfg.dropout);
    layers.push_back(pre_norm_block(t, c, std::move(mlp)));
  }
  layers.push_back(std::make_unique<LayerNorm>(t, c));
  layers.push_back(std::make_unique<TiedHead>(tied, vocab, t, c));
  return layers;
}

}  // namespace dtrain
