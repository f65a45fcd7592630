// Finite-difference checks: every layer's backward against central differences of its forward.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/transformer.hpp"
#include "gradcheck.hpp"

using namespace dtrain;
using dtrain::test::central_diff;
using dtrain::test::grad_close;

namespace {

// L = sum(y * u) for a fixed random u, so dL/dy = u.
double probe_loss(Device& d, Layer& l, const std::vector<float>& x, int64_t rows,
                  const std::vector<float>& u) {
  const float* y = l.forward(d, x.data(), rows);
  double s = 0;
  for (size_t i = 0; i < u.size(); ++i) s += double(y[i]) * u[i];
  return s;
}

// Keeps inputs away from the ReLU kink so differences are well defined.
float away_from_zero(Rng& rng) {
  const double v = rng.uniform(0.2, 1.5);
  return static_cast<float>(rng.uniform() < 0.5 ? -v : v);
}

// Inputs whose values are at least 0.05 apart, so max pooling has no near-ties.
std::vector<float> spaced_values(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = -1.f + 0.05f * static_cast<float>(i);
  rng.shuffle(v);
  return v;
}

// `step`: the finite difference; deep stacks (BatchNorm after BatchNorm) curve enough that
// kGradStep's truncation error exceeds the tolerance.
void check_layer(Device& d, Layer& layer, uint64_t seed, bool spaced = false,
                 double step = test::kGradStep) {
  Device* dev = &d;
  Rng rng(seed);
  const int64_t rows = 3;
  const int64_t in = layer.in_features(), out = layer.out_features();
  std::vector<float> params(static_cast<size_t>(layer.param_count())), grads(params.size(), 0.f);
  layer.init(rng, params.data());
  layer.bind(params.data(), grads.data());
  // NCHW in; the output in whatever layout the layer plans (oneDNN: channel blocks), which the
  // probe's weighted sum does not mind.
  layer.plan_layout(d, MapLayout{});
  layer.setup(d);
  std::vector<float> x(static_cast<size_t>(rows * in)), u(static_cast<size_t>(rows * out));
  for (auto& v : x) v = away_from_zero(rng);
  if (spaced) x = spaced_values(rng, x.size());
  for (auto& v : u) v = static_cast<float>(rng.uniform(-1, 1));

  layer.forward(*dev, x.data(), rows);
  const float* dx_ptr = layer.backward(*dev, u.data(), rows, true);
  const std::vector<float> dx(dx_ptr, dx_ptr + x.size());

  const auto loss = [&] { return probe_loss(*dev, layer, x, rows, u); };
  for (size_t i = 0; i < x.size(); ++i) {
    const double numeric = central_diff(x[i], loss, step);
    INFO(layer.describe() << " dx[" << i << "] analytic " << dx[i] << " numeric " << numeric);
    CHECK(grad_close(dx[i], numeric));
  }
  for (size_t j = 0; j < params.size(); ++j) {
    const double numeric = central_diff(params[j], loss, step);
    INFO(layer.describe() << " dparam[" << j << "] analytic " << grads[j] << " numeric "
                          << numeric);
    CHECK(grad_close(grads[j], numeric));
  }
}

}  // namespace

TEST_CASE("dense layer gradients match finite differences", "[grad]") {
  auto dev = make_cpu_device();  // outlives the layer's buffers
  Dense layer(5, 4);
  check_layer(*dev, layer, 11);
}

TEST_CASE("transformer layer gradients match finite differences", "[grad][gpt]") {
  auto dev = make_cpu_device();
  LayerNorm norm(3, 5);
  check_layer(*dev, norm, 21);
  CausalAttention attention(4, 6, 2);
  check_layer(*dev, attention, 22);
  // 70 positions: the CPU's products run in row blocks of 32 (three, the last ragged).
  CausalAttention long_attention(70, 4, 2);
  check_layer(*dev, long_attention, 26);
  Dense per_position(3, 4, 5, 0.5);
  check_layer(*dev, per_position, 23);
}

TEST_CASE("activation gradients match finite differences", "[grad]") {
  auto dev = make_cpu_device();
  for (auto a : {Activation::relu, Activation::tanh, Activation::sigmoid, Activation::gelu}) {
    ActivationLayer layer(6, a);
    check_layer(*dev, layer, 12);
  }
}

TEST_CASE("conv2d gradients match finite differences", "[grad][conv]") {
  std::vector<CpuConv> algos{CpuConv::im2col};
  if (have_onednn()) algos.push_back(CpuConv::onednn);
  for (auto algo : algos) {
    INFO("conv " << to_string(algo));
    auto dev = make_cpu_device({1, algo});
    Conv2d same(MapShape{2, 5, 5}, 3, 3, 1, 1);
    check_layer(*dev, same, 21);
    Conv2d strided(MapShape{2, 6, 5}, 2, 3, 2, 0);
    check_layer(*dev, strided, 22);
  }
}

TEST_CASE("max pooling gradients match finite differences", "[grad][conv]") {
  auto dev = make_cpu_device();
  MaxPool2d pool(MapShape{2, 4, 4}, 2, 2);
  check_layer(*dev, pool, 23, /*spaced=*/true);
  MaxPool2d overlapping(MapShape{1, 5, 5}, 3, 2);
  check_layer(*dev, overlapping, 24, /*spaced=*/true);
  MaxPool2d padded(MapShape{2, 6, 5}, 3, 2, 1);  // the ImageNet stem's window
  check_layer(*dev, padded, 28, /*spaced=*/true);
}

TEST_CASE("global average pooling gradients match finite differences", "[grad][conv]") {
  auto dev = make_cpu_device();
  GlobalAvgPool gap(MapShape{3, 4, 4});
  check_layer(*dev, gap, 25);
}

TEST_CASE("batchnorm gradients match finite differences in training mode", "[grad][bn]") {
  auto dev = make_cpu_device();
  BatchNorm bn2d(MapShape{3, 2, 2}, /*sync=*/false);
  check_layer(*dev, bn2d, 26);
  BatchNorm bn1d(MapShape{5, 1, 1}, /*sync=*/false);
  check_layer(*dev, bn1d, 27);
}

// A residual block from its YAML, for input maps of `in`.
std::unique_ptr<Layer> residual_block(const std::string& yaml, MapShape in) {
  const ModelConfig m =
      parse_config("model: {type: layers, layers: [" + yaml + "]}", "r.yaml").model;
  MapShape cur = in;
  return make_residual(m.layers.at(0), cur, /*sync=*/false);
}

TEST_CASE("residual block gradients match finite differences, both shortcuts", "[grad][residual]") {
  // Smooth activations (no ReLU kink for the differences to straddle); BatchNorm in training.
  std::vector<CpuConv> algos{CpuConv::im2col};
  if (have_onednn()) algos.push_back(CpuConv::onednn);
  for (auto algo : algos) {
    INFO("conv " << to_string(algo));
    auto dev = make_cpu_device({1, algo});
    SECTION("identity shortcut, with a nested block in the body") {
      auto block = residual_block(
          "{residual: {shortcut: identity, activation: tanh, body: ["
          "{conv: {channels: 2, kernel: 3, padding: 1, bias: false}}, batchnorm, tanh,"
          "{residual: {activation: none, body: [{conv: {channels: 2, padding: 1}}, batchnorm]}}]}}",
          MapShape{2, 4, 4});
      CHECK_THAT(block->describe(), Catch::Contains("| identity) + tanh"));
      check_layer(*dev, *block, 31, false, 2e-3);
    }
    SECTION("16 channels: oneDNN's channel blocks, converted for a pool and the sum") {
      // Convolutions write blocks; max pooling needs NCHW (a window of 1, the identity without
      // kinks: its input is converted and its gradient converted back), so the body ends in
      // NCHW and the projection's blocked 3x3 maps are converted to it before the sum.
      auto block = residual_block(
          "{residual: {shortcut: project, activation: tanh, body: ["
          "{conv: {channels: 16, kernel: 3, padding: 1, bias: false}}, batchnorm, tanh,"
          "{conv: {channels: 16, kernel: 3, padding: 1}}, batchnorm,"
          "{maxpool: {size: 1, stride: 1}}]}}",
          MapShape{3, 3, 3});
      check_layer(*dev, *block, 33, false, 2e-3);
    }
    SECTION("projection shortcut (stride 2, more channels)") {
      auto block = residual_block(
          "{residual: {shortcut: auto, activation: gelu, body: ["
          "{conv: {channels: 3, kernel: 3, stride: 2, padding: 1, bias: false}}, batchnorm, gelu,"
          "{conv: {channels: 3, kernel: 3, padding: 1, bias: false}}, batchnorm]}}",
          MapShape{2, 5, 5});
      CHECK_THAT(block->describe(),
                 Catch::Contains("conv(2->3, k1 s2, 3x3, no bias) -> batchnorm(3)) + gelu"));
      // Body: 3x2x3x3 + 2x3 + 3x3x3x3 + 2x3; shortcut: 3x2 + 2x3; no conv biases.
      CHECK(block->param_count() == 54 + 6 + 81 + 6 + 6 + 6);
      check_layer(*dev, *block, 32, false, 2e-3);
    }
  }
}

TEST_CASE("batchnorm normalises in training and uses running statistics in evaluation", "[bn]") {
  auto dev = make_cpu_device();
  BatchNorm bn(MapShape{2, 1, 3}, false, /*momentum=*/0.5);
  std::vector<float> params(4), grads(4, 0.f);
  Rng rng(1);
  bn.init(rng, params.data());
  bn.bind(params.data(), grads.data());
  bn.setup(*dev);
  LayerContext ctx;
  bn.attach(&ctx);
  // Two samples, two channels of three values: channel 0 holds 1..6, channel 1 holds 10s.
  const std::vector<float> x = {1, 2, 3, 10, 10, 10, 4, 5, 6, 10, 10, 10};
  const float* y = bn.forward(*dev, x.data(), 2);
  double mean0 = 0, sq0 = 0;
  for (int i : {0, 1, 2, 6, 7, 8}) {
    mean0 += y[i] / 6.0;
    sq0 += double(y[i]) * y[i] / 6.0;
  }
  CHECK(mean0 == Approx(0).margin(1e-6));
  CHECK(sq0 == Approx(1).epsilon(1e-3));     // unit variance (eps aside)
  CHECK(y[3] == Approx(0).margin(1e-6));     // a constant channel maps to beta
  const float* run = bn.state()->data();     // the CPU's device memory is host memory
  CHECK(run[0] == Approx(0.5 * 3.5));        // running mean moved halfway to 3.5
  CHECK(run[2] == Approx(0.5 + 0.5 * 3.5));  // running var towards the unbiased 17.5/5
  ctx.train = false;
  const float* e = bn.forward(*dev, x.data(), 2);
  CHECK(e[0] == Approx((1 - run[0]) / std::sqrt(run[2] + 1e-5)).epsilon(1e-5));
}

// BatchNorm takes over the ReLU after it (one pass forward, one map fewer kept); the fused
// layer must give the bits of the two layers, forward and backward, with and without dx, on
// NCHW maps and in channel blocks (the values' order is the same for both chains, so x and dy
// serve as given).
TEST_CASE("batchnorm with its ReLU fused gives the bits of batchnorm then relu", "[bn]") {
  auto dev = make_cpu_device();
  const MapShape shape{16, 5, 7};
  const int64_t rows = 9, n = rows * shape.size();
  Rng rng(31);
  const auto x = test::random_vec(rng, static_cast<size_t>(n), -2, 2);
  const auto dy = test::random_vec(rng, static_cast<size_t>(n));
  for (int64_t block : {0, 8})
    for (bool need_dx : {true, false}) {
      INFO("blocks of " << block << ", need_dx " << need_dx);
      BatchNorm plain(shape, false), fused(shape, false);
      ActivationLayer relu(shape.size(), Activation::relu);
      fused.fuse_relu();
      std::vector<float> p1(32), g1(32, 0.f), p2(32), g2(32, 0.f);
      for (size_t i = 0; i < 16; ++i) p1[i] = p2[i] = 0.5f + 0.05f * float(i);  // gamma
      for (size_t i = 16; i < 32; ++i) p1[i] = p2[i] = 0.05f * float(i) - 1.1f;  // beta
      LayerContext ctx;
      const MapLayout in{block, block ? shape.c : 0};
      for (Layer* l : {static_cast<Layer*>(&plain), static_cast<Layer*>(&fused),
                       static_cast<Layer*>(&relu)}) {
        CHECK(l->plan_layout(*dev, in) == in);
        l->setup(*dev);
        l->attach(&ctx);
      }
      plain.bind(p1.data(), g1.data());
      fused.bind(p2.data(), g2.data());
      const float* ya = relu.forward(*dev, plain.forward(*dev, x.data(), rows), rows);
      const float* yb = fused.forward(*dev, x.data(), rows);
      CHECK(std::vector<float>(ya, ya + n) == std::vector<float>(yb, yb + n));
      const float* da = plain.backward(*dev, relu.backward(*dev, dy.data(), rows, true), rows,
                                       need_dx);
      const float* db = fused.backward(*dev, dy.data(), rows, need_dx);
      CHECK(g1 == g2);  // dgamma, dbeta
      if (need_dx) CHECK(std::vector<float>(da, da + n) == std::vector<float>(db, db + n));
      CHECK(fused.describe() == "batchnorm(16) -> relu");
    }
  // In a list, each BatchNorm followed by a ReLU takes it over; other pairs stay.
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<BatchNorm>(shape, false));
  layers.push_back(std::make_unique<ActivationLayer>(shape.size(), Activation::relu));
  layers.push_back(std::make_unique<ActivationLayer>(shape.size(), Activation::relu));
  layers.push_back(std::make_unique<BatchNorm>(shape, false));
  layers.push_back(std::make_unique<ActivationLayer>(shape.size(), Activation::tanh));
  layers.push_back(std::make_unique<BatchNorm>(shape, false));
  layers.push_back(std::make_unique<ActivationLayer>(shape.size(), Activation::relu));
  fuse_batchnorm_relu(layers);
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l->describe());
  CHECK(names == std::vector<std::string>{"batchnorm(16) -> relu", "relu", "batchnorm(16)",
                                          "tanh", "batchnorm(16) -> relu"});
}

TEST_CASE("dropout masks in training, scales survivors and is the identity in evaluation",
          "[dropout]") {
  auto dev = make_cpu_device();
  Dropout drop(1000, 0.3);
  Rng rng(9);
  LayerContext ctx;
  ctx.rng = &rng;
  drop.attach(&ctx);
  std::vector<float> x(2000, 2.f), dy(2000, 1.f);
  const float* y = drop.forward(*dev, x.data(), 2);
  int zeros = 0;
  for (int i = 0; i < 2000; ++i) {
    if (y[i] == 0.f)
      ++zeros;
    else
      CHECK(y[i] == Approx(2.0 / 0.7));
  }
  CHECK(zeros == Approx(600).margin(80));
  const float* dx = drop.backward(*dev, dy.data(), 2, true);
  for (int i = 0; i < 2000; ++i) CHECK((dx[i] == 0.f) == (y[i] == 0.f));
  ctx.train = false;
  const float* e = drop.forward(*dev, x.data(), 2);
  for (int i = 0; i < 2000; ++i) CHECK(e[i] == 2.f);
}

TEST_CASE("softmax cross-entropy gradient matches finite differences", "[grad]") {
  auto dev = make_cpu_device();
  Rng rng(3);
  const int64_t rows = 4, classes = 5;
  std::vector<float> z(static_cast<size_t>(rows * classes)), dz(z.size());
  for (auto& v : z) v = static_cast<float>(rng.uniform(-3, 3));
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  double stats[2] = {0, 0};
  dev->softmax_xent(z.data(), labels.data(), rows, classes, 1.f, dz.data(), stats);
  const auto loss = [&] {
    double st[2] = {0, 0};
    dev->softmax_xent(z.data(), labels.data(), rows, classes, 0.f, nullptr, st);
    return st[0];
  };
  for (size_t i = 0; i < z.size(); ++i) {
    const double numeric = central_diff(z[i], loss);
    INFO("dlogit[" << i << "] analytic " << dz[i] << " numeric " << numeric);
    CHECK(grad_close(dz[i], numeric));
  }
}

TEST_CASE("label-smoothed softmax cross-entropy gradient matches finite differences",
          "[grad][smoothing]") {
  auto dev = make_cpu_device();
  Rng rng(4);
  const int64_t rows = 4, classes = 5;
  const double eps = 0.2;
  std::vector<float> z(static_cast<size_t>(rows * classes)), dz(z.size()), plain(z.size());
  for (auto& v : z) v = static_cast<float>(rng.uniform(-3, 3));
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  double stats[2] = {0, 0};
  dev->softmax_xent(z.data(), labels.data(), rows, classes, 1.f, dz.data(), stats, eps);
  dev->softmax_xent(z.data(), labels.data(), rows, classes, 1.f, plain.data(), stats);
  const auto loss = [&] {
    double st[2] = {0, 0};
    dev->softmax_xent(z.data(), labels.data(), rows, classes, 0.f, nullptr, st, eps);
    return st[0];
  };
  for (size_t i = 0; i < z.size(); ++i) {
    const double numeric = central_diff(z[i], loss);
    INFO("dlogit[" << i << "] analytic " << dz[i] << " numeric " << numeric);
    CHECK(grad_close(dz[i], numeric));
    // The target moved by eps / classes off the label and eps (1 - 1/classes) on it.
    const bool on = static_cast<int64_t>(i) % classes == labels[i / classes];
    CHECK(dz[i] - plain[i] == Approx(on ? eps * (1 - 1.0 / classes) : -eps / classes));
  }
}

TEST_CASE("label-smoothed cross-entropy equals a hand computation", "[grad][smoothing]") {
  auto dev = make_cpu_device();
  // One row z = [2, 0, -1], label 0, eps 0.3, 3 classes: target t = [0.8, 0.1, 0.1].
  const std::vector<float> z = {2, 0, -1};
  const std::vector<int32_t> y = {0};
  std::vector<float> d(3);
  double stats[2] = {0, 0};
  dev->softmax_xent(z.data(), y.data(), 1, 3, 1.f, d.data(), stats, 0.3);
  const double lse = std::log(std::exp(2.0) + std::exp(0.0) + std::exp(-1.0));
  const double t[3] = {0.8, 0.1, 0.1};
  double want = 0;
  for (int c = 0; c < 3; ++c) want -= t[c] * (z[static_cast<size_t>(c)] - lse);
  CHECK(stats[0] == Approx(want).epsilon(1e-12));
  CHECK(stats[1] == 1.0);
  for (int c = 0; c < 3; ++c)
    CHECK(d[static_cast<size_t>(c)] ==
          Approx(std::exp(z[static_cast<size_t>(c)] - lse) - t[c]).epsilon(1e-6));
  // eps = 0 is the plain loss, bit for bit.
  double plain[2] = {0, 0}, zero[2] = {0, 0};
  dev->softmax_xent(z.data(), y.data(), 1, 3, 0.f, nullptr, plain);
  dev->softmax_xent(z.data(), y.data(), 1, 3, 0.f, nullptr, zero, 0.0);
  CHECK(plain[0] == zero[0]);
  CHECK(plain[0] == Approx(lse - 2.0));
}

TEST_CASE("softmax cross-entropy value and accuracy on known logits", "[grad]") {
  auto dev = make_cpu_device();
  // Uniform logits: loss log(C) per row; argmax ties resolve to class 0.
  std::vector<float> z = {0, 0, 0, 0, 5, 1, 0, 0};
  std::vector<int32_t> y = {0, 1};
  double stats[2] = {0, 0};
  dev->softmax_xent(z.data(), y.data(), 2, 4, 0.f, nullptr, stats);
  const double row2 = std::log(std::exp(5.0) + std::exp(1.0) + 2.0) - 1.0;
  CHECK(stats[0] == Approx(std::log(4.0) + row2));
  CHECK(stats[1] == 1.0);
}

TEST_CASE("a whole model's gradient matches finite differences of its loss", "[grad]") {
  auto dev = make_cpu_device();
  ModelConfig mc;
  mc.hidden = {6, 5};
  mc.activation = Activation::tanh;
  auto model = build_model(*dev, mc, {4}, 3);
  model->init(5);
  Rng rng(6);
  const int64_t rows = 5;
  std::vector<float> x(static_cast<size_t>(rows * 4));
  for (auto& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  const std::vector<int32_t> y = {0, 1, 2, 1, 0};
  test::check_model_gradient(*model, x, y, rows);
}

TEST_CASE("grad_clip scales the update to the clipped norm and leaves the gradients as they are",
          "[optim]") {
  auto dev = make_cpu_device();
  OptimizerConfig oc;
  oc.momentum = 0;
  oc.grad_clip = 1.0;
  std::vector<float> p = {0.f, 0.f}, g = {3.f, 4.f};  // norm 5
  Optimizer clipped(*dev, oc, 2);
  clipped.step(p.data(), g.data(), 1.0);
  CHECK(p[0] == Approx(-0.6).epsilon(1e-6));
  CHECK(p[1] == Approx(-0.8).epsilon(1e-6));
  CHECK(g == std::vector<float>{3.f, 4.f});
  // Below the bound: the plain update.
  oc.grad_clip = 10.0;
  Optimizer loose(*dev, oc, 2);
  p = {0.f, 0.f};
  loose.step(p.data(), g.data(), 1.0);
  CHECK(p == std::vector<float>{-3.f, -4.f});
}

TEST_CASE("an update in parts gives the whole update's bits: clipping, Adam, weights-only decay",
          "[optim][shared]") {
  auto dev = make_cpu_device();
  const size_t n = 1000;                                           // not a multiple of 16
  const std::vector<ParamRange> weights = {{5, 300}, {333, 600}};  // decay edges inside parts
  Rng rng(3);
  std::vector<float> p0(n), g(n);
  for (auto& v : p0) v = static_cast<float>(rng.uniform(-1, 1));
  for (auto& v : g) v = static_cast<float>(rng.uniform(-2, 2));
  for (const auto type : {OptimizerType::sgd, OptimizerType::adamw}) {
    OptimizerConfig oc;
    oc.type = type;
    oc.momentum = 0.9;
    oc.weight_decay = 0.1;
    oc.decay_bn_and_bias = false;
    oc.grad_clip = 1.0;  // the gradients' norm is about 36: every step clipped
    for (const int parts : {1, 3, 7, 64}) {
      INFO("type " << static_cast<int>(type) << ", " << parts << " parts");
      Optimizer whole(*dev, oc, n, weights), cut(*dev, oc, n, weights);
      std::vector<float> a = p0, b = p0;
      size_t covered = 0;
      for (int64_t t = 1; t <= 3; ++t) {
        whole.update(*dev, a.data(), g.data(), 0.01, t);
        cut.prepare(*dev, g.data());
        covered = 0;
        for (int r = parts - 1; r >= 0; --r) {  // any order: the parts do not overlap
          const auto [lo, hi] = shared_part(n, r, parts);
          CHECK(lo % 16 == 0);
          CHECK(lo <= hi);
          covered += hi - lo;
          cut.update_part(*dev, b.data(), g.data(), 0.01, t, lo, hi);
        }
      }
      CHECK(covered == n);
      CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
      CHECK(a != p0);
    }
  }
  CHECK(shared_part(n, 0, 2) == std::pair<size_t, size_t>{0, 496});
  CHECK(shared_part(n, 1, 2) == std::pair<size_t, size_t>{496, 1000});
  CHECK(shared_part(10, 0, 4) == std::pair<size_t, size_t>{0, 0});  // small: the last
  CHECK(shared_part(10, 3, 4) == std::pair<size_t, size_t>{0, 10});
}

TEST_CASE("optimizers follow their update rules on one parameter", "[optim]") {
  auto dev = make_cpu_device();
  float p = 1.f, g = 0.5f, m = 0.f, v = 0.f;
  // SGD, momentum 0.9, coupled weight decay 0.1: two steps by hand.
  dev->sgd_update(&p, &g, &m, 1, 0.1f, 0.9f, 0.1f, false);
  CHECK(m == Approx(0.6));
  CHECK(p == Approx(0.94));
  dev->sgd_update(&p, &g, &m, 1, 0.1f, 0.9f, 0.1f, false);
  CHECK(m == Approx(0.9 * 0.6 + 0.5 + 0.094));
  CHECK(p == Approx(0.94 - 0.1 * (0.9 * 0.6 + 0.5 + 0.094)));
  // Adam's first step moves every parameter by lr (bias correction).
  p = 1.f;
  m = v = 0.f;
  dev->adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.f, false, 1);
  CHECK(p == Approx(0.99).epsilon(1e-5));
  // AdamW decays the weight directly.
  p = 1.f;
  m = v = 0.f;
  dev->adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.5f, true, 1);
  CHECK(p == Approx(1.0 * (1 - 0.005) - 0.01).epsilon(1e-5));
}

TEST_CASE("decay_bn_and_bias: false decays weights only, BatchNorm and biases untouched",
          "[optim][decay]") {
  auto dev = make_cpu_device();
  ModelConfig mc;
  mc.type = ModelType::layers;
  LayerSpec conv, bn;
  conv.type = LayerType::conv;
  conv.channels = 2;
  bn.type = LayerType::batchnorm;
  mc.layers = {conv, bn};
  // 1 x 4 x 4 input: conv weights [0, 18), conv bias [18, 20), BatchNorm gamma [20, 22) and
  // beta [22, 24), then the classifier's weights [24, 48) and bias [48, 51).
  auto model = build_model(*dev, mc, {1, 4, 4}, 3);
  REQUIRE(model->param_count() == 51);
  CHECK(model->weight_ranges() == std::vector<ParamRange>{{0, 18}, {24, 24}});
  for (const auto type : {OptimizerType::sgd, OptimizerType::adam, OptimizerType::adamw}) {
    for (const bool all : {true, false}) {
      INFO(to_string(type) << " decay_bn_and_bias " << all);
      OptimizerConfig oc;
      oc.type = type;
      oc.momentum = 0;
      oc.weight_decay = 0.5;
      oc.decay_bn_and_bias = all;
      Optimizer opt(*dev, oc, 51, model->weight_ranges());
      std::vector<float> p(51, 1.f);
      const std::vector<float> g(51, 0.f);  // zero gradient: only decay moves a parameter
      opt.step(p.data(), g.data(), 0.1);
      for (int64_t i = 0; i < 51; ++i) {
        const bool weight = i < 18 || (i >= 24 && i < 48);
        INFO("param " << i);
        if (weight || all)
          CHECK(p[static_cast<size_t>(i)] < 1.f);
        else
          CHECK(p[static_cast<size_t>(i)] == 1.f);
      }
    }
  }
}
