#pragma once
// Finite differences for gradient checks, shared by the layer and the model tests.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dtrain/nn/model.hpp"

namespace dtrain::test {

constexpr double kGradStep = 1e-2;

// d f / d v by central differences, leaving v as it was.
template <class F>
double central_diff(float& v, F&& f, double step = kGradStep) {
  const float keep = v;
  v = keep + static_cast<float>(step);
  const double plus = f();
  v = keep - static_cast<float>(step);
  const double minus = f();
  v = keep;
  return (plus - minus) / (2 * step);
}

inline bool grad_close(double analytic, double numeric) {
  return std::abs(analytic - numeric) <= 2e-3 + 2e-2 * std::abs(numeric);
}

// A whole model's gradient of its mean loss on (x, y) against central differences of that
// loss, parameter by parameter.
inline void check_model_gradient(Model& model, std::vector<float>& x,
                                 const std::vector<int32_t>& y, int64_t rows,
                                 double step = kGradStep) {
  const auto loss = [&] {
    double st[2] = {0, 0};
    model.forward(x.data(), rows);
    model.loss_only(y.data(), rows, st);
    return st[0];
  };
  model.zero_grads();
  double st[2] = {0, 0};
  model.forward(x.data(), rows);
  model.loss_backward(y.data(), rows, 1.f, st);
  const std::vector<float> g(model.grads(), model.grads() + model.param_count());
  for (int64_t j = 0; j < model.param_count(); ++j) {
    const double numeric = central_diff(model.params()[j], loss, step);
    INFO("param " << j << " analytic " << g[static_cast<size_t>(j)] << " numeric " << numeric);
    CHECK(grad_close(g[static_cast<size_t>(j)], numeric));
  }
}

}  // namespace dtrain::test
