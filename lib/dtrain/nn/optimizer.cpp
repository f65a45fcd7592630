#include "dtrain/nn/optimizer.hpp"

namespace dtrain {

Optimizer::Optimizer(Device& d, const OptimizerConfig& cfg, size_t n) : dev_(d), cfg_(cfg), n_(n) {
  m_.resize(d, std::max<size_t>(n, 1));
  dev_.fill(m_.data(), n, 0.f);
  if (cfg_.type != OptimizerType::sgd) {
    v_.resize(d, std::max<size_t>(n, 1));
    dev_.fill(v_.data(), n, 0.f);
  }
}

void Optimizer::step(float* params, const float* grads, double lr) {
  ++t_;
  update(dev_, params, grads, lr, t_);
}

void Optimizer::update(Device& d, float* params, const float* grads, double lr, int64_t t) {
  const auto f = [](double x) { return static_cast<float>(x); };
  switch (cfg_.type) {
    case OptimizerType::sgd:
      d.sgd_update(params, grads, m_.data(), n_, f(lr), f(cfg_.momentum), f(cfg_.weight_decay),
                   cfg_.nesterov);
      break;
    case OptimizerType::adam:
    case OptimizerType::adamw:
      d.adam_update(params, grads, m_.data(), v_.data(), n_, f(lr), f(cfg_.beta1), f(cfg_.beta2),
                    f(cfg_.eps), f(cfg_.weight_decay), cfg_.type == OptimizerType::adamw, t);
      break;
  }
}

}  // namespace dtrain
