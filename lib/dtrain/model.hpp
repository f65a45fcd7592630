#pragma once
// Layers and models. A layer's public forward/backward are non-virtual: they check shapes and
// then call the *_impl hooks. Parameters and gradients of a whole model live in one flat buffer
// each, so the gradient exchange is a single contiguous all-reduce.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/config.hpp"
#include "dtrain/device.hpp"
#include "dtrain/rng.hpp"

namespace dtrain {

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

  // y = f(x) for `rows` samples; x must stay valid until backward.
  const float* forward(Device& d, const float* x, int64_t rows);
  // Given dL/dy, accumulates parameter gradients and returns dL/dx (nullptr if !need_dx).
  const float* backward(Device& d, const float* dy, int64_t rows, bool need_dx);

 protected:
  virtual void forward_impl(Device& d, const float* x, float* y, int64_t rows) = 0;
  virtual void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                             int64_t rows) = 0;

 private:
  int64_t in_, out_;
  const float* x_ = nullptr;
  int64_t rows_ = -1;
  Buffer<float> y_, dx_;
};

// y = x W + b, W stored as [in x out].
class Dense final : public Layer {
 public:
  Dense(int64_t in, int64_t out) : Layer(in, out) {}
  std::string describe() const override;
  int64_t param_count() const override { return in_features() * out_features() + out_features(); }
  void bind(float* params, float* grads) override;
  void init(Rng& rng, float* params) const override;

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(int64_t features, Activation a) : Layer(features, features), act_(a) {}
  std::string describe() const override;

 protected:
  void forward_impl(Device& d, const float* x, float* y, int64_t rows) override;
  void backward_impl(Device& d, const float* x, const float* y, const float* dy, float* dx,
                     int64_t rows) override;

 private:
  Activation act_;
};

class Model {
 public:
  Model(Device& d, std::vector<std::unique_ptr<Layer>> layers, int classes);
  Device& device() { return dev_; }
  int64_t param_count() const { return n_params_; }
  int64_t in_features() const { return layers_.front()->in_features(); }
  int classes() const { return classes_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  std::string describe() const;

  // Initialises all parameters from `seed` (same values on every replica).
  void init(uint64_t seed);
  void zero_grads();
  // Forward pass; returns logits [rows x classes].
  const float* forward(const float* x, int64_t rows);
  // Softmax cross-entropy on the last forward's logits; accumulates parameter gradients of
  // grad_scale * summed loss. stats[0] += loss sum, stats[1] += correct count.
  void loss_backward(const int32_t* labels, int64_t rows, float grad_scale, double* stats);
  // Loss and accuracy only (evaluation).
  void loss_only(const int32_t* labels, int64_t rows, double* stats);

 private:
  Device& dev_;
  std::vector<std::unique_ptr<Layer>> layers_;
  int classes_;
  int64_t n_params_ = 0;
  Buffer<float> params_, grads_, dlogits_;
  const float* logits_ = nullptr;
  int64_t rows_ = 0;
};

// Builds the configured model for `in_features` inputs and `classes` outputs.
std::unique_ptr<Model> build_model(Device& d, const ModelConfig& cfg, int64_t in_features,
                                   int classes);

}  // namespace dtrain
