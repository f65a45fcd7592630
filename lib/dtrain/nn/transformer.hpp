#pragma once
// The layers of a GPT (Radford et al. 2019, as nanoGPT and llm.c build it): token and position
// embeddings, LayerNorm, causal self-attention and the output head tied to the token
// embedding. A sample is a window of t + 1 token ids (floats); inside the model it is t
// positions of c features, [t, c] row-major, and the head gives t rows of vocab logits.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/nn/model.hpp"

namespace dtrain {

// y[i] = wte[token i] + wpe[i] for the first t of the window's t + 1 ids. Parameters: wte
// [vocab, c], then wpe [t, c], both N(0, 0.02) as GPT-2; both decayed (nanoGPT's choice).
class Embedding final : public Layer {
 public:
  Embedding(int64_t vocab, int64_t t, int64_t c);
  std::string describe() const override;
  int64_t param_count() const override { return (vocab_ + t_) * c_; }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;
  void weight_ranges(int64_t offset, std::vector<ParamRange>& out) const override {
    out.push_back({offset, param_count()});
  }
  const float* wte() const { return wte_; }
  float* dwte() const { return dwte_; }

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  int64_t vocab_, t_, c_;
  float *wte_ = nullptr, *wpe_ = nullptr, *dwte_ = nullptr, *dwpe_ = nullptr;
};

// LayerNorm over each position's c features (eps 1e-5), scale 1 and shift 0 at the start;
// neither is decayed.
class LayerNorm final : public Layer {
 public:
  LayerNorm(int64_t t, int64_t c) : Layer(t * c, t * c), t_(t), c_(c) {}
  std::string describe() const override;
  int64_t param_count() const override { return 2 * c_; }
  int64_t activation_floats() const override { return t_ * c_ + 2 * t_; }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  int64_t t_, c_;
  float *gamma_ = nullptr, *beta_ = nullptr, *dgamma_ = nullptr, *dbeta_ = nullptr;
  Buffer<float> stats_;  // [mean, rstd] per position of the last forward
};

// Causal multi-head self-attention on [t, 3c] (q, k, v side by side, from a dense layer before
// it) to [t, c]; no parameters. Keeps the [heads, t, t] probabilities for backward.
class CausalAttention final : public Layer {
 public:
  CausalAttention(int64_t t, int64_t c, int64_t heads)
      : Layer(t * 3 * c, t * c), t_(t), c_(c), heads_(heads) {}
  std::string describe() const override;
  int64_t activation_floats() const override { return t_ * c_ + heads_ * t_ * t_; }
  int64_t macs_per_sample() const override { return 2 * t_ * t_ * c_; }
  int64_t largest_features() const override { return std::max(3 * t_ * c_, heads_ * t_ * t_); }

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  int64_t t_, c_, heads_;
  Buffer<float> att_;
};

// Logits = x wte^T at every position, the weights those of `emb` (weight tying, as GPT-2): no
// parameters of its own; its gradient adds to the embedding's, which backward finishes last.
class TiedHead final : public Layer {
 public:
  TiedHead(const Embedding* emb, int64_t vocab, int64_t t, int64_t c)
      : Layer(t * c, t * vocab), emb_(emb), vocab_(vocab), t_(t), c_(c) {}
  std::string describe() const override;
  int64_t macs_per_sample() const override { return t_ * c_ * vocab_; }

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  const Embedding* emb_;
  int64_t vocab_, t_, c_;
};

// The positions a GPT predicts per sample: the window of input_shape ({t + 1}) less one.
// Throws UserError where the data are not token windows.
int64_t gpt_positions(const std::vector<int64_t>& input_shape);

// model.type gpt for windows of input_shape ({t + 1} ids) over `vocab` tokens: embeddings,
// model.n_layer pre-LayerNorm blocks (attention, then a 4c GELU MLP, each added to its input),
// a final LayerNorm and the tied head. model.dropout drops after the embeddings and after each
// block's two branches.
std::vector<std::unique_ptr<Layer>> gpt_layers(const ModelConfig& cfg,
                                               const std::vector<int64_t>& input_shape,
                                               int64_t vocab);

}  // namespace dtrain
