#include "dtrain/nn/optimizer.hpp"

#include <algorithm>

#include "dtrain/base/error.hpp"

namespace dtrain {

Optimizer::Optimizer(Device& d, const OptimizerConfig& cfg, size_t n,
                     const std::vector<ParamRange>& weights)
    : dev_(d), cfg_(cfg), n_(n) {
  if (cfg_.decay_bn_and_bias || cfg_.weight_decay == 0) {
    segments_.push_back({0, n, true});
  } else {
    size_t at = 0;
    for (const ParamRange& r : weights) {
      const auto off = static_cast<size_t>(r.offset), count = static_cast<size_t>(r.count);
      if (off < at || off + count > n) DTRAIN_THROW_SYSTEM("weight ranges out of order");
      if (off > at) segments_.push_back({at, off - at, false});
      if (count > 0) segments_.push_back({off, count, true});
      at = off + count;
    }
    if (at < n) segments_.push_back({at, n - at, false});
  }
  m_.resize(d, std::max<size_t>(n, 1));
  dev_.fill(m_.data(), n, 0.f);
  if (cfg_.type != OptimizerType::sgd) {
    v_.resize(d, std::max<size_t>(n, 1));
    dev_.fill(v_.data(), n, 0.f);
  }
  if (cfg_.grad_clip > 0) {
    clipped_.resize(d, std::max<size_t>(n, 1));
    sumsq_.resize(d, 1);
  }
}

void Optimizer::step(float* params, const float* grads, double lr) {
  ++t_;
  update(dev_, params, grads, lr, t_);
}

void Optimizer::update(Device& d, float* params, const float* grads, double lr, int64_t t) {
  prepare(d, grads);
  update_part(d, params, grads, lr, t, 0, n_);
}

void Optimizer::prepare(Device& d, const float* grads) {
  if (cfg_.grad_clip > 0) {  // by the norm of the whole (reduced) gradient
    d.zero(sumsq_.data(), sizeof(double));
    d.sum_squares(grads, n_, sumsq_.data());
    d.clip_by_norm(grads, clipped_.data(), n_, sumsq_.data(), static_cast<float>(cfg_.grad_clip));
  }
}

void Optimizer::update_part(Device& d, float* params, const float* grads, double lr, int64_t t,
                            size_t lo, size_t hi) {
  const auto f = [](double x) { return static_cast<float>(x); };
  if (cfg_.grad_clip > 0) grads = clipped_.data();  // prepare()'s
  for (const Segment& seg : segments_) {
    const size_t a = std::max(lo, seg.offset), b = std::min(hi, seg.offset + seg.count);
    if (a >= b) continue;
    const float wd = seg.decay ? f(cfg_.weight_decay) : 0.f;
    float* p = params + a;
    const float* g = grads + a;
    switch (cfg_.type) {
      case OptimizerType::sgd:
        d.sgd_update(p, g, m_.data() + a, b - a, f(lr), f(cfg_.momentum), wd, cfg_.nesterov);
        break;
      case OptimizerType::adam:
      case OptimizerType::adamw:
        d.adam_update(p, g, m_.data() + a, v_.data() + a, b - a, f(lr), f(cfg_.beta1),
                      f(cfg_.beta2), f(cfg_.eps), wd, cfg_.type == OptimizerType::adamw, t);
        break;
    }
  }
}

}  // namespace dtrain
