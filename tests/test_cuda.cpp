// The CUDA backend against its CPU twin: every Device operation on the same inputs, compared by
// relative error, and the equivalence contract on GPUs. Skips, and says so, without a GPU (fails
// instead with DTRAIN_REQUIRE_GPU=1). The decisions of the GPU code that need no GPU (abort
// gate, cuDNN algorithm choice, graph agreement, timing split) are tested here too, always.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/backend/math.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/abort_gate.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/nn/optimizer.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/trainer.hpp"
#include "checkpoint_helpers.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::random_vec;
using dtrain::test::rel_error;

namespace {

// Prints the reason once per test and returns false where no GPU can run the test; with
// DTRAIN_REQUIRE_GPU=1 (a GPU machine's check) the test fails instead, also where dtrain was
// built without CUDA.
bool gpu_or_skip() {
  const GpuSystem s = query_gpus();
  if (!s.gpus.empty()) return true;
  if (test::gpu_required()) FAIL("DTRAIN_REQUIRE_GPU=1 but no GPU: " << s.none_reason);
  WARN("SKIPPED (no GPU): " << s.none_reason);
  return false;
}

// Host vectors mirrored on a device: `in` uploads, `out` downloads.
struct Mirror {
  Device& d;
  std::vector<std::unique_ptr<Buffer<float>>> bufs;
  std::vector<std::unique_ptr<Buffer<int32_t>>> ibufs;
  float* in(const std::vector<float>& v) {
    bufs.push_back(std::make_unique<Buffer<float>>(d, std::max<size_t>(1, v.size())));
    d.upload(bufs.back()->data(), v.data(), v.size() * sizeof(float));
    return bufs.back()->data();
  }
  int32_t* in(const std::vector<int32_t>& v) {
    ibufs.push_back(std::make_unique<Buffer<int32_t>>(d, std::max<size_t>(1, v.size())));
    d.upload(ibufs.back()->data(), v.data(), v.size() * sizeof(int32_t));
    return ibufs.back()->data();
  }
  std::vector<float> out(const float* p, size_t n) {
    std::vector<float> v(n);
    d.download(v.data(), p, n * sizeof(float));
    return v;
  }
};

// Runs `op` on both devices with the same host inputs; `op` returns the outputs it wants
// compared, read back to the host.
using Outs = std::vector<std::vector<float>>;
using Op = std::function<Outs(Device&, Mirror&)>;
// precision tf32 has no CPU twin: it is compared with the fp32 CPU device.
// `floor` > 0: the error must also exceed it (a reduced precision really in use).
void twin(const char* what, double bound, const Op& op, Precision precision = Precision::fp32,
          double floor = 0) {
  CpuOptions co;
  co.bf16 = precision == Precision::bf16;
  auto cpu = make_cpu_device(co);
  auto gpu = make_cuda_device(0, 0, precision);
  Mirror mc{*cpu, {}, {}}, mg{*gpu, {}, {}};
  const auto a = op(*gpu, mg), b = op(*cpu, mc);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what << " output " << i);
    CHECK(rel_error(a[i], b[i]) <= bound);
    if (floor > 0) CHECK(rel_error(a[i], b[i]) > floor);
  }
}

// A convolution's forward pass and all its gradients on random tensors of `ns` samples; without
// a bias (null b and db) where !bias.
void conv_twin(const char* what, double bound, const ConvGeom& g, int64_t ns, Rng& rng,
               Precision precision, bool bias = true) {
  const auto x = random_vec(rng, ns * g.c * g.h * g.w), w = random_vec(rng, g.oc * g.c * g.k * g.k);
  const auto b = random_vec(rng, g.oc), dy = random_vec(rng, ns * g.oc * g.ho() * g.wo());
  twin(what, bound, [&](Device& d, Mirror& mr) -> Outs {
    float *y = mr.in(std::vector<float>(dy.size())), *dw = mr.in(w), *db = mr.in(b),
          *dx = mr.in(x);
    const float* xp = mr.in(x);
    const float* wp = mr.in(w);
    d.conv_forward(g, ns, xp, wp, bias ? mr.in(b) : nullptr, y);
    d.conv_backward(g, ns, xp, wp, mr.in(dy), dw, bias ? db : nullptr, dx);
    return Outs{mr.out(y, dy.size()), mr.out(dw, w.size()), mr.out(db, b.size()),
                mr.out(dx, x.size())};
  }, precision);
}

}  // namespace

TEST_CASE("CUDA kernels match their CPU twins", "[cuda]") {
  if (!gpu_or_skip()) return;
  Rng rng(9);
  const int64_t m = 67, n = 45, k = 130;
  const auto A = random_vec(rng, m * k), B = random_vec(rng, k * n), C0 = random_vec(rng, m * n);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      twin("gemm", 1e-5, [&](Device& d, Mirror& mr) -> Outs {
        float* c = mr.in(C0);
        d.gemm(ta, tb, m, n, k, 0.7f, mr.in(A), ta ? m : k, mr.in(B), tb ? k : n, 0.3f, c, n);
        return Outs{mr.out(c, C0.size())};
      });

  const auto X = random_vec(rng, 5000, -3, 3), DY = random_vec(rng, 5000);
  for (auto act : {Activation::relu, Activation::tanh, Activation::sigmoid, Activation::gelu})
    twin(to_string(act), 1e-5, [&](Device& d, Mirror& mr) -> Outs {
      float *x = mr.in(X), *y = mr.in(X), *dx = mr.in(X);
      d.activation_forward(act, x, y, X.size());
      d.activation_backward(act, x, y, mr.in(DY), dx, X.size());
      return Outs{mr.out(y, X.size()), mr.out(dx, X.size())};
    });

  // Inputs are drawn outside the op, which runs once per device: both must see the same.
  const auto DB0 = random_vec(rng, n);
  twin("bias", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float* y = mr.in(C0);
    float* db = mr.in(DB0);
    const auto bias = std::vector<float>(C0.begin(), C0.begin() + n);
    d.add_bias(y, mr.in(bias), m, n);
    d.bias_grad(y, db, m, n, Accumulate::add);
    return Outs{mr.out(y, C0.size()), mr.out(db, n)};
  });

  // Softmax cross-entropy: gradients and the (loss, correct) sums.
  std::vector<int32_t> labels(m);
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));
  const auto logits = random_vec(rng, m * 10, -4, 4);
  twin("softmax_xent", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float* dl = mr.in(logits);
    Buffer<double> stats(d, 2);
    const double start[2] = {0.5, 1};
    d.upload(stats.data(), start, sizeof(start));
    d.softmax_xent(mr.in(logits), mr.in(labels), m, 10, 0.25f, dl, stats.data());
    double got[2];
    d.download(got, stats.data(), sizeof(got));
    return Outs{mr.out(dl, logits.size()),
                std::vector<float>{static_cast<float>(got[0]), static_cast<float>(got[1])}};
  });
  twin("softmax_xent_smoothed", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float* dl = mr.in(logits);
    Buffer<double> stats(d, 2);
    d.zero(stats.data(), 2 * sizeof(double));
    d.softmax_xent(mr.in(logits), mr.in(labels), m, 10, 0.25f, dl, stats.data(), 0.1);
    double got[2];
    d.download(got, stats.data(), sizeof(got));
    return Outs{mr.out(dl, logits.size()),
                std::vector<float>{static_cast<float>(got[0]), static_cast<float>(got[1])}};
  });

  // Gather rows by host indices.
  const std::vector<int64_t> idx{5, 0, 66, 5, 12};
  twin("gather", 0, [&](Device& d, Mirror& mr) -> Outs {
    float* dst = mr.in(std::vector<float>(idx.size() * k, 0.f));
    int32_t* dl = mr.in(std::vector<int32_t>(idx.size(), -1));
    d.gather(mr.in(A), mr.in(labels), k, idx.data(), static_cast<int64_t>(idx.size()), dst, dl);
    std::vector<int32_t> got(idx.size());
    d.download(got.data(), dl, got.size() * sizeof(int32_t));
    return Outs{mr.out(dst, idx.size() * k), std::vector<float>(got.begin(), got.end())};
  });

  // Convolution (cuDNN against oneDNN or im2col), pooling and BatchNorm on NCHW maps.
  for (const ConvGeom& g : {ConvGeom{1, 28, 28, 8, 3, 1, 1}, ConvGeom{6, 9, 7, 4, 5, 2, 2}})
    conv_twin("conv", 1e-5, g, 3, rng, Precision::fp32);
  // Without bias (ResNet convolutions), 1x1 strided (the projection shortcut).
  conv_twin("conv, no bias", 1e-5, ConvGeom{4, 9, 9, 6, 3, 2, 1}, 3, rng, Precision::fp32, false);
  conv_twin("conv 1x1 s2, no bias", 1e-5, ConvGeom{4, 9, 9, 6, 1, 2, 0}, 3, rng, Precision::fp32,
            false);
  // Named variables, not a structured binding: clang 14 cannot capture one in a lambda.
  // Windows of 2 and 3, the ImageNet stem's padded one (3, stride 2, padding 1) among them, and
  // a stride past the window (positions no window covers).
  for (const auto& window : {std::array<int64_t, 3>{2, 2, 0}, std::array<int64_t, 3>{3, 2, 0},
                             std::array<int64_t, 3>{3, 2, 1}, std::array<int64_t, 3>{2, 3, 0}}) {
    const int64_t k2 = window[0], s2 = window[1], p2 = window[2];
    const int64_t ns = 2, c = 3, h = 9, w = 8;
    const int64_t ho = math::pool_out(h, k2, s2, p2), wo = math::pool_out(w, k2, s2, p2);
    const auto x = random_vec(rng, ns * c * h * w), dy = random_vec(rng, ns * c * ho * wo);
    twin("maxpool", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
      float *y = mr.in(dy), *dx = mr.in(x);
      Buffer<int32_t> am(d, static_cast<size_t>(ns * c * ho * wo));
      d.maxpool_forward(mr.in(x), ns, c, h, w, k2, s2, p2, y, am.data());
      d.maxpool_backward(mr.in(dy), am.data(), ns, c, h, w, k2, s2, p2, dx);
      return Outs{mr.out(y, dy.size()), mr.out(dx, x.size())};
    });
  }
  // A channel's 150 values in one run of the GPU's sums, and 13 x 700 = 9,100 in three runs
  // (math::channel_split), the last one shorter, the runs' ends inside samples; and 70,000
  // channels, past a grid's 65,535 rows of blocks and the sums' default scratch.
  for (const auto& shape : {std::array<int64_t, 3>{5, 4, 30}, std::array<int64_t, 3>{13, 3, 700},
                            std::array<int64_t, 3>{2, 70000, 3}}) {
    const int64_t ns = shape[0], c = shape[1], sp = shape[2];
    const auto x = random_vec(rng, ns * c * sp, -2, 3), dy = random_vec(rng, ns * c * sp);
    const auto gamma = random_vec(rng, c, 0.5, 1.5), beta = random_vec(rng, c);
    twin("batchnorm", 1e-5, [&](Device& d, Mirror& mr) -> Outs {
      Buffer<double> moments(d, 2 * c), sums(d, 2 * c);
      const float* xp = mr.in(x);
      const float* gp = mr.in(gamma);
      float *running = mr.in(std::vector<float>(2 * c, 0.5f)),
            *stats = mr.in(std::vector<float>(2 * c)), *y = mr.in(x), *dx = mr.in(x),
            *dg = mr.in(gamma), *db = mr.in(beta);
      d.channel_moments(xp, ns, c, sp, 0, moments.data());
      d.bn_prepare(moments.data(), double(ns * sp), 1e-5, 0.1, running, stats, c);
      d.bn_apply(xp, stats, gp, mr.in(beta), ns, c, sp, 0, y, false);
      float* yr = mr.in(x);
      d.bn_apply(xp, stats, gp, mr.in(beta), ns, c, sp, 0, yr, true);  // its ReLU fused
      d.bn_backward_sums(xp, mr.in(dy), stats, gp, ns, c, sp, 0, sums.data(), dg, db);
      d.bn_backward_dx(xp, mr.in(dy), stats, gp, sums.data(), double(ns * sp), ns, c, sp, 0, dx);
      float* eval = mr.in(std::vector<float>(2 * c));
      d.bn_prepare(nullptr, 0, 1e-5, 0, running, eval, c);
      std::vector<double> hs(2 * c);
      d.download(hs.data(), sums.data(), hs.size() * sizeof(double));
      return Outs{mr.out(y, x.size()),
                  mr.out(yr, x.size()),
                  mr.out(dx, x.size()),
                  mr.out(dg, c),
                  mr.out(db, c),
                  mr.out(running, 2 * c),
                  mr.out(eval, 2 * c),
                  std::vector<float>(hs.begin(), hs.end())};
    });
  }
  // Augmentation (crop and flip) is a pure gather: the same bits on both backends.
  {
    const auto imgs = random_vec(rng, 9 * 3 * 11 * 13);
    twin("augment", 0, [&](Device& d, Mirror& mr) -> Outs {
      float* out = mr.in(std::vector<float>(imgs.size()));
      d.augment(mr.in(imgs), out, 9, 3, 11, 13, 2, false, true, 99);
      return Outs{mr.out(out, imgs.size())};
    });
    twin("augment_reflect", 0, [&](Device& d, Mirror& mr) -> Outs {
      float* out = mr.in(std::vector<float>(imgs.size()));
      d.augment(mr.in(imgs), out, 9, 3, 11, 13, 10, true, true, 99);
      return Outs{mr.out(out, imgs.size())};
    });
  }
  // Dropout masks are the same bits on both backends (counter-based random numbers).
  twin("dropout_mask", 0, [&](Device& d, Mirror& mr) -> Outs {
    float* mask = mr.in(std::vector<float>(10007));
    d.dropout_mask(mask, 10007, 0.3, 1234);
    return Outs{mr.out(mask, 10007)};
  });

  // Optimizer updates (three steps, so momentum and Adam's moments matter).
  const auto P = random_vec(rng, 3000), G = random_vec(rng, 3000),
             mask = random_vec(rng, 3000, 0, 2);
  twin("sgd+adam+scale+multiply", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float *p = mr.in(P), *buf = mr.in(std::vector<float>(P.size(), 0.f)), *q = mr.in(P),
          *mm = mr.in(std::vector<float>(P.size(), 0.f)),
          *vv = mr.in(std::vector<float>(P.size(), 0.f));
    float* g = mr.in(G);
    for (int step = 1; step <= 3; ++step) {
      d.sgd_update(p, g, buf, P.size(), 0.1f, 0.9f, 5e-4f, step == 2);
      d.adam_update(q, g, mm, vv, P.size(), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step != 2, step);
    }
    d.scale(g, G.size(), 0.5f);
    float* y = mr.in(G);
    d.multiply(g, mr.in(mask), y, G.size());
    return Outs{mr.out(p, P.size()), mr.out(q, P.size()), mr.out(y, G.size())};
  });
  // Weight decay on weights only (decay_bn_and_bias: false): the optimizer's segments.
  for (const auto type : {OptimizerType::sgd, OptimizerType::adamw}) {
    const std::string name = std::string("decay-weights-only-") + to_string(type);
    twin(name.c_str(), 1e-6,
         [&](Device& d, Mirror& mr) -> Outs {
           OptimizerConfig oc;
           oc.type = type;
           oc.weight_decay = 0.1;
           oc.decay_bn_and_bias = false;
           Optimizer opt(d, oc, P.size(), {{100, 1000}, {1500, 900}});
           float* p = mr.in(P);
           const float* g = mr.in(G);
           for (int step = 1; step <= 3; ++step) opt.step(p, g, 0.01);
           return Outs{mr.out(p, P.size())};
         });
  }
  // The ordered sum of replicas that share weights: exact, as the host's adds are.
  twin("fold", 0, [&](Device& d, Mirror& mr) -> Outs {
    float* acc = mr.in(std::vector<float>(P.size(), 7.f));
    d.fold(acc, mr.in(P), P.size(), true, 1.f);
    d.fold(acc, mr.in(G), P.size(), false, 1.f);
    d.fold(acc, mr.in(mask), P.size(), false, 1.f / 3);
    return Outs{mr.out(acc, P.size())};
  });
  // A residual block's sum and gradient split: exact, one rounding per element everywhere.
  twin("add", 0, [&](Device& d, Mirror& mr) -> Outs {
    float* y = mr.in(std::vector<float>(P.size()));
    float* a = mr.in(P);
    d.add(a, mr.in(G), y, P.size());
    d.add(a, mr.in(mask), a, P.size());  // in place
    float* r = mr.in(std::vector<float>(P.size()));
    d.add_relu(mr.in(P), mr.in(G), r, P.size());  // with the block's ReLU
    return Outs{mr.out(y, P.size()), mr.out(a, P.size()), mr.out(r, P.size())};
  });
}

// ---- transformer operations ----

namespace {

// `rows` windows of t + 1 token ids (floats) over `vocab` tokens, with ids that the clamp of
// math::token_id must catch (negative, past the vocabulary) where `damaged`.
std::vector<float> token_windows(Rng& rng, int64_t rows, int64_t t, int64_t vocab, bool damaged) {
  std::vector<float> v(static_cast<size_t>(rows * (t + 1)));
  for (auto& x : v) x = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
  if (damaged && v.size() > 3) {
    v[1] = -2.f;
    v[v.size() / 2] = static_cast<float>(vocab + 5);
    v[v.size() - 1] = static_cast<float>(vocab);
  }
  return v;
}

std::vector<float> downloaded_labels(Device& d, const int32_t* p, size_t n) {
  std::vector<int32_t> got(n);
  d.download(got.data(), p, n * sizeof(int32_t));
  return std::vector<float>(got.begin(), got.end());
}

// Embeddings forward and backward (onto random gradients already there) and next-token targets:
// the same bits as the CPU twin.
void embedding_twin(Rng& rng, int64_t rows, int64_t t, int64_t c, int64_t vocab) {
  INFO("embedding rows " << rows << " t " << t << " c " << c << " vocab " << vocab);
  const int64_t stride = t + 1;
  const auto tokens = token_windows(rng, rows, t, vocab, true);
  const auto wte = random_vec(rng, vocab * c), wpe = random_vec(rng, t * c);
  const auto dy = random_vec(rng, rows * t * c);
  const auto n = static_cast<size_t>(rows * t);
  twin("embedding", 0, [&](Device& d, Mirror& mr) -> Outs {
    const float* tk = mr.in(tokens);
    float *y = mr.in(std::vector<float>(n * c, 7.f)), *dwte = mr.in(wte), *dwpe = mr.in(wpe);
    int32_t* labels = mr.in(std::vector<int32_t>(n, -1));
    d.embedding_forward(tk, stride, mr.in(wte), mr.in(wpe), rows, t, c, vocab, y);
    d.embedding_backward(tk, stride, mr.in(dy), rows, t, c, vocab, dwte, dwpe);
    d.next_tokens(tk, stride, rows, t, vocab, labels);
    return Outs{mr.out(y, n * c), mr.out(dwte, wte.size()), mr.out(dwpe, wpe.size()),
                downloaded_labels(d, labels, n)};
  });
}

// LayerNorm forward and backward (dgamma and dbeta onto random values), with and without dx.
void layernorm_twin(Rng& rng, int64_t n, int64_t c) {
  INFO("layernorm n " << n << " c " << c);
  const auto x = random_vec(rng, n * c, -2, 3), dy = random_vec(rng, n * c);
  const auto gamma = random_vec(rng, c, 0.5, 1.5), beta = random_vec(rng, c);
  const auto g0 = random_vec(rng, c), b0 = random_vec(rng, c);
  twin("layernorm", 1e-5, [&](Device& d, Mirror& mr) -> Outs {
    const float* xp = mr.in(x);
    const float* gp = mr.in(gamma);
    float *y = mr.in(x), *stats = mr.in(std::vector<float>(2 * n)), *dx = mr.in(x),
          *dg = mr.in(g0), *db = mr.in(b0), *dg2 = mr.in(g0), *db2 = mr.in(b0);
    d.layernorm_forward(xp, gp, mr.in(beta), n, c, 1e-5f, y, stats);
    d.layernorm_backward(xp, mr.in(dy), gp, stats, n, c, dx, dg, db);
    d.layernorm_backward(xp, mr.in(dy), gp, stats, n, c, nullptr, dg2, db2);
    const auto nc = static_cast<size_t>(n * c);
    return Outs{mr.out(y, nc),  mr.out(stats, 2 * n), mr.out(dx, nc), mr.out(dg, c),
                mr.out(db, c), mr.out(dg2, c),       mr.out(db2, c)};
  });
}

// Causal self-attention forward (probabilities and output) and backward.
void attention_twin(Rng& rng, int64_t rows, int64_t t, int64_t c, int64_t heads,
                    Precision precision = Precision::fp32, double bound = 1e-5) {
  INFO("attention rows " << rows << " t " << t << " c " << c << " heads " << heads);
  const auto qkv = random_vec(rng, rows * t * 3 * c), dy = random_vec(rng, rows * t * c);
  const auto na = static_cast<size_t>(rows * heads * t * t), ny = static_cast<size_t>(rows * t * c);
  twin("attention", bound, [&](Device& d, Mirror& mr) -> Outs {
    const float* q = mr.in(qkv);
    float *att = mr.in(std::vector<float>(na, 7.f)), *y = mr.in(std::vector<float>(ny, 7.f)),
          *dqkv = mr.in(std::vector<float>(qkv.size(), 7.f));
    d.attention_forward(q, rows, t, c, heads, att, y);
    d.attention_backward(q, att, mr.in(dy), rows, t, c, heads, dqkv);
    return Outs{mr.out(att, na), mr.out(y, ny), mr.out(dqkv, qkv.size())};
  }, precision);
}

}  // namespace

TEST_CASE("CUDA transformer kernels match their CPU twins", "[cuda][transformer]") {
  if (!gpu_or_skip()) return;
  Rng rng(41);
  // Embeddings: the same bits. c past one block of threads (300), one position, and runs of
  // one token longer than a block stages at once (vocab 2, 600 positions).
  embedding_twin(rng, 3, 37, 40, 50);
  embedding_twin(rng, 4, 5, 300, 11);
  embedding_twin(rng, 2, 1, 8, 5);
  embedding_twin(rng, 5, 120, 33, 2);
  // LayerNorm: c below a warp, past it, and past a block's tile of vectors (n > 128).
  layernorm_twin(rng, 7, 20);
  layernorm_twin(rng, 70, 45);
  layernorm_twin(rng, 300, 300);
  layernorm_twin(rng, 1, 1);
  // Attention: t not a multiple of 32 with several heads, t past a warp, one position, one
  // head.
  attention_twin(rng, 3, 37, 48, 4);
  attention_twin(rng, 2, 70, 64, 2);
  attention_twin(rng, 2, 1, 16, 4);
  attention_twin(rng, 1, 9, 8, 1);
  // precision bf16 leaves attention in FP32 (bfloat16 operands are the dense layers' and the
  // convolutions'), on both backends.
  attention_twin(rng, 2, 37, 48, 4, Precision::bf16);
  // precision tf32 runs them on TF32 tensor cores, like the device's other GEMMs (see the tf32
  // bounds below).
  attention_twin(rng, 2, 37, 48, 4, Precision::tf32, 1e-2);

  // No rows: nothing is written.
  twin("transformer ops, no rows", 0, [&](Device& d, Mirror& mr) -> Outs {
    const std::vector<float> seven(64, 7.f);
    float *y = mr.in(seven), *dw = mr.in(seven), *dp = mr.in(seven), *st = mr.in(seven),
          *att = mr.in(seven), *dq = mr.in(seven);
    int32_t* labels = mr.in(std::vector<int32_t>(4, -1));
    const float* in = mr.in(seven);
    d.embedding_forward(in, 5, in, in, 0, 4, 4, 8, y);
    d.embedding_backward(in, 5, in, 0, 4, 4, 8, dw, dp);
    d.next_tokens(in, 5, 0, 4, 8, labels);
    d.layernorm_forward(in, in, in, 0, 4, 1e-5f, y, st);
    d.layernorm_backward(in, in, in, in, 0, 4, y, dw, dp);
    d.attention_forward(in, 0, 4, 4, 2, att, y);
    d.attention_backward(in, in, in, 0, 4, 4, 2, dq);
    return Outs{mr.out(y, 64),   mr.out(dw, 64), mr.out(dp, 64), mr.out(st, 64),
                mr.out(att, 64), mr.out(dq, 64), downloaded_labels(d, labels, 4)};
  });

  // Gradient clipping: the factor read from the squared norm on the device; one norm above the
  // bound (scaled down), one below (left alone).
  const auto grads = random_vec(rng, 5000, -1, 1);
  for (const float bound : {1.f, 1000.f}) {
    twin("clip_by_norm", 2e-5, [&](Device& d, Mirror& mr) -> Outs {
      float* y = mr.in(std::vector<float>(grads.size()));
      Buffer<double> sq(d, 1);
      d.zero(sq.data(), sizeof(double));
      d.sum_squares(mr.in(grads), grads.size(), sq.data());
      d.clip_by_norm(mr.in(grads), y, grads.size(), sq.data(), bound);
      return Outs{mr.out(y, grads.size())};
    });
  }

  // A language model's loss statistics: stat_scale multiplies what is added.
  std::vector<int32_t> labels(60);
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(13));
  const auto logits = random_vec(rng, 60 * 13, -4, 4);
  twin("softmax_xent stat_scale", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float* dl = mr.in(logits);
    Buffer<double> stats(d, 2);
    const double start[2] = {0.5, 1};
    d.upload(stats.data(), start, sizeof(start));
    d.softmax_xent(mr.in(logits), mr.in(labels), 60, 13, 1.f / 60, dl, stats.data(), 0.0,
                   1.0 / 12);
    double got[2];
    d.download(got, stats.data(), sizeof(got));
    return Outs{mr.out(dl, logits.size()),
                std::vector<float>{static_cast<float>(got[0]), static_cast<float>(got[1])}};
  });
}

// precision: bf16: the CPU twin rounds operands exactly as the GPU converts them, so GEMMs
// (fp32 output) agree to fp32 accumulation order; convolutions write bf16, where a different
// accumulation order can move an element across a rounding boundary (one bf16 step, 2^-8).
TEST_CASE("CUDA bf16 GEMMs and convolutions match the bf16 CPU twin", "[cuda][bf16]") {
  if (!gpu_or_skip()) return;
  Rng rng(21);
  const int64_t m = 67, n = 45, k = 130;
  const auto A = random_vec(rng, m * k), B = random_vec(rng, k * n), C0 = random_vec(rng, m * n);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      twin("gemm bf16", 1e-5, [&](Device& d, Mirror& mr) -> Outs {
        float* c = mr.in(C0);
        d.gemm(ta, tb, m, n, k, 0.7f, mr.in(A), ta ? m : k, mr.in(B), tb ? k : n, 0.3f, c, n);
        return Outs{mr.out(c, C0.size())};
      }, Precision::bf16);
  // cuDNN works on NHWC copies here: tiles of 32 channels and positions with ragged edges (40
  // channels of 20 x 20, 36 out), a strided 1x1 projection, RGB's 3 channels.
  for (const ConvGeom& g : {ConvGeom{1, 28, 28, 8, 3, 1, 1}, ConvGeom{8, 14, 14, 16, 3, 1, 1},
                            ConvGeom{40, 20, 20, 36, 3, 2, 1}, ConvGeom{16, 9, 9, 33, 1, 2, 0},
                            ConvGeom{3, 32, 32, 64, 3, 1, 1}})
    conv_twin("conv bf16", 1e-2, g, 4, rng, Precision::bf16);
}

TEST_CASE("CUDA bf16 training follows the bf16 CPU twin", "[cuda][bf16][train]") {
  if (!gpu_or_skip()) return;
  Config gpu = test::synthetic_config(1, 64);
  gpu.precision = Precision::bf16;
  gpu.backend = Backend::cuda;
  gpu.devices = {0};
  Config cpu = gpu;
  cpu.backend = Backend::cpu;
  const auto a = test::run_config(gpu), b = test::run_config(cpu);
  // Rounding boundaries crossed in a different order make the runs drift apart slowly, not
  // step by step: compare the learning, not the bits.
  REQUIRE(a.epochs.size() == b.epochs.size());
  CHECK(std::abs(a.epochs.back().test_acc - b.epochs.back().test_acc) < 0.02);
  CHECK(test::rel_diff(a.step_losses.front(), b.step_losses.front()) < 1e-3);
}

TEST_CASE("CUDA replicas colocated on one GPU equal 1 replica x N*B step by step",
          "[cuda][equivalence]") {
  if (!gpu_or_skip()) return;
  Config one = test::synthetic_config(1, 128);
  Config four = test::synthetic_config(4, 32);
  for (Config* c : {&one, &four}) {
    c->backend = Backend::cuda;
    c->colocate = true;
    c->devices = {0};
  }
  // One replica goes through NCCL with a one-rank communicator; four share the GPU, each with
  // a copy of the weights (replicas: threads), and their gradients go through the host (the
  // in-process reduction, the CPU's arithmetic).
  four.replicas = ReplicaMode::threads;
  const auto a = test::run_config(one);
  const auto b = test::run_config(four);
  REQUIRE(a.step_losses.size() >= 50);
  CHECK(a.info.devices.find("NCCL") != std::string::npos);
  CHECK(b.info.devices.find("gradients through the host") != std::string::npos);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
  CHECK(b.info.replica_mode == "threads");
  // One shared copy of the weights (what replicas: auto picks here), the gradients added on the
  // GPU in rank order: the host reduction's arithmetic per element, so the same bits.
  Config shared = four;
  shared.replicas = ReplicaMode::auto_;
  const auto s = test::run_config(shared);
  // Both hold four training sets, batches and activations; shared holds one copy of the
  // weights and momentum instead of four (plus two sum buffers).
  REQUIRE(b.info.peak_device_mib.size() == 1);
  REQUIRE(s.info.peak_device_mib.count(0) == 1);
  CHECK(s.info.peak_device_mib.at(0) > 0);
  CHECK(s.info.peak_device_mib.at(0) <= b.info.peak_device_mib.at(0));
  CHECK(s.info.replica_mode == "shared");
  CHECK(s.info.devices.find("added on the GPU in rank order") != std::string::npos);
  CHECK(s.step_losses == b.step_losses);
  REQUIRE(s.epochs.size() == b.epochs.size());
  CHECK(s.epochs.back().test_acc == b.epochs.back().test_acc);
  // The same GPU named four times without colocate: refused (NCCL runs a replica per GPU).
  Config spread = shared;
  spread.colocate = false;
  spread.devices = {0, 0, 0, 0};
  CHECK_THROWS_WITH(test::run_config(spread), Catch::Contains("GPU 0 is listed twice"));
  // One replica has one copy of the weights whatever `replicas` says, so the 1-GPU baseline of
  // a sweep such as gpus=1,4 with replicas: shared is accepted (it was refused) and trains as a
  // plain replica.
  Config lone = shared, plain = shared;
  lone.gpus = plain.gpus = 1;
  plain.replicas = ReplicaMode::auto_;
  CHECK(test::run_config(lone).step_losses == test::run_config(plain).step_losses);
  // Buckets reduced during backward give the same bits as one reduction after it.
  Config bucketed = four, single = four;
  bucketed.train.bucket_mb = 0.0005;
  single.train.bucket_mb = 0;
  CHECK(test::run_config(bucketed).step_losses == test::run_config(single).step_losses);
  // And the GPU trains like the CPU.
  Config cpu = test::synthetic_config(1, 128);
  cpu.backend = Backend::cpu;
  CHECK(test::max_rel_step_diff(a, test::run_config(cpu)) < 1e-4);
}

// A CUDA graph replays the captured step with this step's staged values (batch indices, seeds,
// learning rate, Adam's bias corrections): the same kernels on the same data, so the same bits
// as launching them one by one. Covers dropout, AdamW, a short last batch (eager), evaluation
// between epochs (which grows buffers and so drops the graphs) and bucketed NCCL.
TEST_CASE("CUDA graph steps give the same bits as eager steps", "[cuda][graph]") {
  if (!gpu_or_skip()) return;
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    INFO("precision " << to_string(prec));
    Config c = test::synthetic_config(1, 96);
    c.backend = Backend::cuda;
    c.devices = {0};
    c.precision = prec;
    c.train.epochs = 2;
    c.train.bucket_mb = 0.001;
    c.data.synthetic.train_size = 96 * 40 + 17;
    c.data.drop_remainder = false;
    c.model.dropout = 0.2;
    c.optimizer.type = OptimizerType::adamw;
    c.optimizer.lr = 2e-3;
    c.optimizer.weight_decay = 0.01;
    Config e = c;
    e.train.cuda_graph = false;
    const auto a = test::run_config(c), b = test::run_config(e);
    CHECK(a.info.cuda_graph == "on");
    CHECK(b.info.cuda_graph == "off: train.cuda_graph is false");
    CHECK(a.info.cuda_graph_steps >= 70);  // all full steps but the warm-up ones
    CHECK(b.info.cuda_graph_steps == 0);
    REQUIRE(a.step_losses.size() == b.step_losses.size());
    CHECK(a.step_losses == b.step_losses);
    CHECK(a.epochs.back().test_acc == b.epochs.back().test_acc);
  }
  // A CNN: cuDNN convolutions, local BatchNorm and augmentation on the device.
  Config c = test::synthetic_config(1, 32);
  c.backend = Backend::cuda;
  c.devices = {0};
  c.data.synthetic.shape = {1, 12, 12};
  c.data.synthetic.train_size = 32 * 30;
  c.data.augment.crop_padding = 2;
  c.data.augment.flip = true;
  c.model.type = ModelType::layers;
  c.model.layers = parse_config(
                       "model:\n  type: layers\n  layers:\n    - {conv: {channels: 4, kernel: 3}}\n"
                       "    - batchnorm\n    - relu\n    - {maxpool: {size: 2}}\n    - flatten\n",
                       "cnn.yaml")
                       .model.layers;
  Config e = c;
  e.train.cuda_graph = false;
  const auto a = test::run_config(c), b = test::run_config(e);
  CHECK(a.info.cuda_graph_steps > 0);
  CHECK(a.step_losses == b.step_losses);
  // Synchronised BatchNorm goes through the host inside the step, but one replica has nothing
  // to exchange: its graphs stay on and its steps are plain BatchNorm's. (Two replicas need two
  // GPUs, or colocated replicas, which meet on the host anyway.)
  c.model.batchnorm = BatchNormMode::sync;
  const auto s = test::run_config(c);
  CHECK(s.info.cuda_graph == "on");
  CHECK(s.info.cuda_graph_steps > 0);
  CHECK(s.step_losses == a.step_losses);
}

TEST_CASE("backend cuda without a GPU or with too many replicas fails before training",
          "[cuda][errors]") {
  const GpuSystem s = query_gpus();
  Config c = test::synthetic_config(1, 32);
  c.backend = Backend::cuda;
  if (s.gpus.empty()) {
    CHECK_THROWS_AS(place_replicas(c, 1), UserError);
    CHECK_THROWS_WITH(place_replicas(c, 1), Catch::Contains("backend: cuda, but"));
    c.backend = Backend::auto_;
    CHECK(place_replicas(c, 4).backend == Backend::cpu);
    // auto lands on the CPU here, which cannot honour tf32.
    c.precision = Precision::tf32;
    CHECK_THROWS_WITH(check_plan(c, load_data(c.data, c.train.seed)),
                      Catch::Contains("precision: tf32 needs a GPU"));
    return;
  }
  const int n = static_cast<int>(s.gpus.size());
  c.gpus = n + 1;
  CHECK_THROWS_WITH(place_replicas(c, n + 1), Catch::Contains("colocate: true"));
  c.backend = Backend::auto_;  // auto falls back to the CPU instead
  CHECK(place_replicas(c, n + 1).backend == Backend::cpu);
  c.backend = Backend::cuda;
  c.colocate = true;
  const auto p = place_replicas(c, n + 1);
  CHECK(p.colocated);
  CHECK(p.gpu_of_replica.back() == 0);
  c.devices = {n};
  CHECK_THROWS_WITH(place_replicas(c, 1), Catch::Contains("does not exist"));
}

// ---- precision tf32 ----

namespace {
// Multiples of 1/256 in [-1, 1]: 9 significant bits, so TF32 (10 stored mantissa bits) holds
// them exactly and their products are exact in FP32.
std::vector<float> tf32_exact_vec(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(std::round(rng.uniform(-256, 256))) / 256.f;
  return v;
}
}  // namespace

// tf32 reads 10 of FP32's 23 mantissa bits of each GEMM and convolution operand (truncating),
// so each product may come out up to 2^-9 (about 2e-3) smaller in magnitude, 1e-3 on average:
// against the FP32 CPU twin, a relative error near 1e-3 (up to 2e-3 where a sum's products share
// their sign), bounded here by 3e-3 for GEMMs and 1e-2 for convolutions (whose algorithm may
// transform its operands first, Winograd's for one, and round the transformed values). GEMMs on
// operands that TF32 holds exactly differ by summation order only, as in fp32 (1e-5): that
// checks the tf32 path computes the right thing, the bound on random operands that it rounds
// like TF32 and no worse.
TEST_CASE("CUDA tf32 GEMMs and convolutions match the FP32 CPU twin to TF32 precision",
          "[cuda][tf32]") {
  if (!gpu_or_skip()) return;
  Rng rng(33);
  const int64_t m = 67, n = 45, k = 130;
  for (bool exact : {true, false}) {
    INFO((exact ? "TF32-exact operands" : "random FP32 operands"));
    const auto A = exact ? tf32_exact_vec(rng, m * k) : random_vec(rng, m * k);
    const auto B = exact ? tf32_exact_vec(rng, k * n) : random_vec(rng, k * n);
    const auto C0 = exact ? tf32_exact_vec(rng, m * n) : random_vec(rng, m * n);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        twin(
            "gemm tf32", exact ? 1e-5 : 3e-3,
            [&](Device& d, Mirror& mr) -> Outs {
              float* c = mr.in(C0);
              d.gemm(ta, tb, m, n, k, 0.75f, mr.in(A), ta ? m : k, mr.in(B), tb ? k : n, 0.25f, c,
                     n);
              return Outs{mr.out(c, C0.size())};
            },
            Precision::tf32);
  }
  // TF32 is really in use: on random operands of a size that surely runs on tensor cores, the
  // error is far above FP32's (about 1e-7 here) yet within TF32's.
  const int64_t t = 256;
  const auto A = random_vec(rng, t * t), B = random_vec(rng, t * t);
  twin(
      "gemm tf32 256^3", 3e-3,
      [&](Device& d, Mirror& mr) -> Outs {
        float* c = mr.in(std::vector<float>(static_cast<size_t>(t * t)));
        d.gemm(false, false, t, t, t, 1.f, mr.in(A), t, mr.in(B), t, 0.f, c, t);
        return Outs{mr.out(c, static_cast<size_t>(t * t))};
      },
      Precision::tf32, 1e-5);
  for (const ConvGeom& g : {ConvGeom{1, 28, 28, 8, 3, 1, 1}, ConvGeom{6, 9, 7, 4, 5, 2, 2}})
    conv_twin("conv tf32", 1e-2, g, 3, rng, Precision::tf32);
}

// ---- kernels over more data than one grid covers ----

// blocks_for() caps a grid at 65535 * 8 blocks of 256 threads (134,215,680 threads): past that,
// the kernels must stride. Known answers instead of the CPU twin, which would take long here.
TEST_CASE("CUDA kernels cover data larger than their grid", "[cuda][big]") {
  if (!gpu_or_skip()) return;
  auto gpu = make_cuda_device(0, 0);
  Device& d = *gpu;
  const int64_t n = int64_t{65535} * 8 * 256 + 12345;
  const auto un = static_cast<size_t>(n);
  const auto all_equal = [&](const float* p, size_t count, float v, const char* what) {
    std::vector<float> h(count);
    d.download(h.data(), p, count * sizeof(float));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; ++i)
      if (h[i] != v && bad++ == 0) first = i;
    INFO(what << ": " << bad << " of " << count << " values differ from " << v << ", the first at "
              << first);
    CHECK(bad == 0);
  };
  {  // bias gradient: n columns of two rows, 1.5 each
    Buffer<float> dy(d, 2 * un), db(d, un);
    d.fill(dy.data(), 2 * un, 1.5f);
    d.fill(db.data(), un, 9.f);
    d.bias_grad(dy.data(), db.data(), 2, n, Accumulate::overwrite);
    all_equal(db.data(), un, 3.f, "bias_grad");
  }
  {  // softmax cross-entropy: n rows of one class, so every row has loss 0 and is a hit
    Buffer<float> logits(d, un), dl(d, un);
    Buffer<int32_t> labels(d, un);  // zeroed by the allocation
    Buffer<double> stats(d, 2);
    d.fill(logits.data(), un, 0.25f);
    d.fill(dl.data(), un, 7.f);
    d.zero(stats.data(), 2 * sizeof(double));
    d.softmax_xent(logits.data(), labels.data(), n, 1, 0.5f, dl.data(), stats.data());
    double got[2] = {-1, -1};
    d.download(got, stats.data(), sizeof(got));
    CHECK(got[0] == 0.0);
    CHECK(got[1] == static_cast<double>(n));
    all_equal(dl.data(), un, 0.f, "softmax_xent gradient");
  }
  {  // BatchNorm evaluation statistics of n channels
    Buffer<float> running(d, 2 * un), stats(d, 2 * un);
    d.fill(running.data(), un, 0.5f);
    d.fill(running.data() + un, un, 3.f);
    d.bn_prepare(nullptr, 0, 1e-5, 0, running.data(), stats.data(), n);
    all_equal(stats.data(), un, 0.5f, "bn_prepare mean");
    all_equal(stats.data() + un, un, static_cast<float>(1.0 / std::sqrt(3.0 + 1e-5)),
              "bn_prepare inv_std");
  }
}

// ---- cuDNN: deterministic algorithms, and plans that fail cleanly ----

// Deterministic algorithms (preferred over faster ones with atomics) give the same bits on
// every call; the weight and input gradients of a batch are where atomics would show.
TEST_CASE("CUDA convolutions give the same bits on every call", "[cuda][determinism]") {
  if (!gpu_or_skip()) return;
  auto gpu = make_cuda_device(0, 0);
  Rng rng(5);
  const ConvGeom g{16, 16, 16, 32, 3, 1, 1};
  const int64_t ns = 64;
  const auto x = random_vec(rng, ns * g.c * g.h * g.w), w = random_vec(rng, g.oc * g.c * g.k * g.k);
  const auto b = random_vec(rng, g.oc), dy = random_vec(rng, ns * g.oc * g.ho() * g.wo());
  Mirror mr{*gpu, {}, {}};
  const float *xp = mr.in(x), *wp = mr.in(w), *bp = mr.in(b), *dyp = mr.in(dy);
  Outs first;
  for (int call = 0; call < 3; ++call) {
    float *y = mr.in(std::vector<float>(dy.size())), *dw = mr.in(std::vector<float>(w.size())),
          *db = mr.in(std::vector<float>(b.size())), *dx = mr.in(std::vector<float>(x.size()));
    gpu->conv_forward(g, ns, xp, wp, bp, y);
    gpu->conv_backward(g, ns, xp, wp, dyp, dw, db, dx);
    Outs now{mr.out(y, dy.size()), mr.out(dw, w.size()), mr.out(db, b.size()),
             mr.out(dx, x.size())};
    if (call == 0)
      first = now;
    else
      for (size_t i = 0; i < now.size(); ++i) {
        INFO("call " << call << ", output " << i << " (y, dw, db, dx)");
        CHECK(now[i] == first[i]);
      }
  }
}

// A convolution plan that fails half-way (here a kernel larger than the padded input) throws,
// releases the cuDNN descriptors it had created, and leaves the device usable.
TEST_CASE("a convolution cuDNN cannot plan throws and leaves the device usable", "[cuda][errors]") {
  if (!gpu_or_skip()) return;
  auto gpu = make_cuda_device(0, 0);
  {
    Buffer<float> x(*gpu, 64), w(*gpu, 64), b(*gpu, 4), y(*gpu, 64);
    const ConvGeom bad{1, 2, 2, 1, 5, 1, 0};  // output -2 x -2
    // Never cached: it fails each time.
    for (int i = 0; i < 3; ++i)
      CHECK_THROWS_AS(gpu->conv_forward(bad, 1, x.data(), w.data(), b.data(), y.data()),
                      SystemError);
  }
  // The same device still convolves, as its CPU twin does.
  Rng rng(8);
  const ConvGeom g{2, 6, 6, 3, 3, 1, 1};
  const int64_t ns = 2;
  const auto x = random_vec(rng, ns * g.c * g.h * g.w), w = random_vec(rng, g.oc * g.c * g.k * g.k);
  const auto b = random_vec(rng, g.oc);
  const auto ny = static_cast<size_t>(ns * g.oc * g.ho() * g.wo());
  const auto forward = [&](Device& dv) {
    Mirror mr{dv, {}, {}};
    float* y = mr.in(std::vector<float>(ny));
    dv.conv_forward(g, ns, mr.in(x), mr.in(w), mr.in(b), y);
    return mr.out(y, ny);
  };
  auto cpu = make_cpu_device();
  CHECK(rel_error(forward(*gpu), forward(*cpu)) < 1e-5);
}

// ---- floors ----

TEST_CASE("dtrain devices --measure gives plausible floors", "[cuda][floors]") {
  if (!gpu_or_skip()) return;
  const GpuFloors f = measure_gpu(0);
  INFO("launch " << f.launch_us << " us, SGEMM " << f.sgemm_fp32_tflops << " TFLOP/s FP32, "
                 << f.sgemm_tf32_tflops << " TF32");
  CHECK(f.launch_us > 0);
  CHECK(f.launch_us < 100);
  CHECK(f.sgemm_fp32_tflops > 1);
  CHECK(f.sgemm_tf32_tflops > f.sgemm_fp32_tflops);  // tensor cores on random data
  // The command prints them, in text as in JSON.
  const auto text = test::dtrain_cli("devices --measure");
  INFO(text.out);
  CHECK(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("measured: launch latency"));
  const auto json = test::dtrain_cli("devices --measure --json");
  CHECK_THAT(json.out, Catch::Contains("\"launch_us\""));
}

// ---- timing of a host exchange on a GPU ----

// Colocated replicas with a copy of the weights each exchange through the host: the device
// waits for the host then, and the host clocks measure that exchange (the device events alone
// would file it under compute).
TEST_CASE("colocated replicas report their host exchange time, not zero", "[cuda][exchange]") {
  if (!gpu_or_skip()) return;
  Config c = test::synthetic_config(2, 64);
  c.backend = Backend::cuda;
  c.colocate = true;
  c.devices = {0};
  c.replicas = ReplicaMode::threads;
  c.train.bucket_mb = 0.001;  // several buckets per step
  const auto r = test::run_config(c);
  const auto& m = r.epochs.back();
  INFO("compute " << m.compute_s << " s, exchange " << m.exchange_s << " s, exposed "
                  << m.exchange_exposed_s << " s, optimizer " << m.optimizer_s << " s, epoch "
                  << m.epoch_time_s << " s");
  CHECK(m.exchange_s > 1e-3);  // 60 steps of several host round trips each
  CHECK(m.exchange_exposed_s == m.exchange_s);
  CHECK(m.compute_s > 0);
  CHECK(m.compute_s + m.exchange_s + m.optimizer_s <= m.epoch_time_s * 1.01);
}

// ---- failures on GPUs: abort ----

namespace {
// Runs a CUDA config through the CLI with DTRAIN_FAULT=`fault` (rank:step), killed after a
// minute (it fails within seconds): a hang shows as exit code 137, a crash as another code
// than 1.
test::ShellResult run_faulty(const test::TempDir& d, const std::string& name,
                             const std::string& placement, const std::string& fault) {
  const std::string cfg = d.write(
      name + ".yaml",
      "name: " + name + "\nbackend: cuda\nthreads: 1\n" + placement +
          "data:\n  dataset: synthetic\n"
          "  synthetic: {train_size: 4096, test_size: 256, shape: [16], classes: 4}\n"
          "model: {hidden: [32, 16]}\n"
          "train: {epochs: 3, per_replica_batch: 32, target_accuracy: 0, bucket_mb: 0.001}\n");
  return test::shell("DTRAIN_FAULT=" + fault + " timeout -s KILL 60 " + test::dtrain_binary() +
                     " run " + cfg + " --tag " + name + " --results " + (d.path / "res").string());
}
void check_failed_with_fault(const test::TempDir& d, const std::string& name, int gpus,
                             const test::ShellResult& r, const std::string& fault) {
  const auto colon = fault.find(':');
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out,
             Catch::Contains("injected fault (DTRAIN_FAULT) on rank " + fault.substr(0, colon) +
                             " at step " + fault.substr(colon + 1)));
  const auto run = d.path / "res" / name / (name + "-g" + std::to_string(gpus));
  CHECK(test::slurp(run / "status") == "failed\n");
}
}  // namespace

// A replica that fails ends the run with its error: the others stop (Aborted) instead of
// waiting forever, and nothing touches a communicator after the abort (no crash). With one GPU:
// NCCL with one rank and CUDA graphs (failing before any step, and once graphs replay), and
// colocated replicas; with two GPUs or more also NCCL across two GPUs in one process, where the
// failing rank aborts the communicator the other rank is using.
TEST_CASE("a failing GPU replica ends the run with its error, without hang or crash",
          "[cuda][abort]") {
  if (!gpu_or_skip()) return;
  test::TempDir d("cuda-abort");
  for (const std::string fault : {"0:1", "0:20"}) {
    const std::string name = "nccl1-" + fault.substr(0, 1) + "-" + fault.substr(2);
    check_failed_with_fault(d, name, 1, run_faulty(d, name, "gpus: 1\ndevices: [0]\n", fault),
                            fault);
  }
  // Colocated replicas, each with a copy of the weights (through the host) and sharing one.
  for (const std::string mode : {"threads", "shared"})
    for (const std::string fault : {"1:1", "1:20"}) {
      const std::string name = "coloc-" + mode + "-" + fault.substr(0, 1) + "-" + fault.substr(2);
      const std::string yaml = "gpus: 2\ncolocate: true\ndevices: [0]\nreplicas: " + mode + "\n";
      check_failed_with_fault(d, name, 2, run_faulty(d, name, yaml, fault), fault);
    }
  if (query_gpus().gpus.size() < 2) {
    WARN("NCCL across two GPUs not tested: this machine has one GPU");
    return;
  }
  for (const std::string fault : {"1:1", "1:20", "0:20"}) {
    const std::string name = "nccl2-" + fault.substr(0, 1) + "-" + fault.substr(2);
    const auto r = run_faulty(d, name, "gpus: 2\ndevices: [0, 1]\n", fault);
    check_failed_with_fault(d, name, 2, r, fault);
    CHECK_THAT(r.out, Catch::Contains("CUDA graphs off: 2 GPUs in one process"));
  }
}

// ---- decisions of the GPU code, tested without a GPU ----

TEST_CASE("DTRAIN_REQUIRE_GPU=1 turns the skipped GPU tests into failures", "[gpu-logic]") {
  if (!query_gpus().gpus.empty()) {
    SUCCEED("this machine has a GPU: the GPU tests run instead of skipping");
    return;
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string one = " \"CUDA kernels match their CPU twins\"";
  const auto skipped = test::shell("env -u DTRAIN_REQUIRE_GPU " + self + one);
  INFO(skipped.out);
  CHECK(skipped.code == 0);
  CHECK_THAT(skipped.out, Catch::Contains("SKIPPED (no GPU)"));
  const auto failed = test::shell("DTRAIN_REQUIRE_GPU=1 " + self + one);
  INFO(failed.out);
  CHECK(failed.code != 0);
  CHECK_THAT(failed.out, Catch::Contains("DTRAIN_REQUIRE_GPU=1 but no GPU"));
}

TEST_CASE("an aborted NCCL group starts no call and waits for the calls in flight",
          "[gpu-logic][abort]") {
  SECTION("one call in flight") {
    AbortGate gate;
    { const auto p = gate.enter("NCCL all-reduce"); }  // passes come and go
    auto in_flight = std::make_unique<AbortGate::Pass>(gate.enter("NCCL all-reduce"));
    std::atomic<bool> freed{false};
    std::thread aborter([&] {
      CHECK(gate.close());
      freed = true;  // where abort() frees the communicators
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (!gate.closed() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::yield();
    // Closed first: no new call starts (it throws the typed error instead)...
    CHECK_THROWS_AS(gate.enter("CUDA graph launch"), Aborted);
    CHECK_THROWS_WITH(gate.enter("NCCL all-reduce"),
                      Catch::Contains("NCCL all-reduce not started"));
    // ... and nothing is freed while a call is in flight.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(freed);
    in_flight.reset();
    aborter.join();
    CHECK(freed);
    CHECK_FALSE(gate.close());  // a second abort does nothing
  }
  SECTION("a call blocked on a failed peer does not hold the abort forever") {
    AbortGate gate;
    const auto stuck = gate.enter("NCCL all-reduce");  // never returns on its own
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(gate.close(std::chrono::seconds(1)));  // then aborts anyway, releasing the call
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(waited >= std::chrono::milliseconds(900));
    CHECK(waited < std::chrono::seconds(5));
  }
  SECTION("replicas calling while one aborts") {
    AbortGate gate;
    std::atomic<bool> freed{false};
    std::atomic<int> after_free{0}, stopped{0}, calls{0};
    std::vector<std::thread> replicas;
    for (int r = 0; r < 4; ++r)
      replicas.emplace_back([&] {
        for (;;) {
          try {
            const auto pass = gate.enter("NCCL all-reduce");
            if (freed) ++after_free;  // a communicator used after it was freed
            ++calls;
            std::this_thread::yield();
          } catch (const Aborted&) {
            ++stopped;
            return;
          }
        }
      });
    while (calls < 1000) std::this_thread::yield();
    CHECK(gate.close());
    freed = true;
    for (auto& t : replicas) t.join();
    CHECK(after_free == 0);
    CHECK(stopped == 4);
  }
}

TEST_CASE("the GPU memory gauge keeps each GPU's live bytes and this run's peak", "[gpu-logic]") {
  GpuMemoryGauge g;
  int a = 0, b = 0, c = 0;
  CHECK(g.peaks().empty());
  g.allocated(0, &a, 100);
  g.allocated(0, &b, 50);
  g.allocated(1, &c, 7);
  g.freed(&a);
  g.freed(&a);  // twice, or a pointer it never saw: ignored
  g.freed(nullptr);
  CHECK(g.live(0) == 50);
  CHECK(g.live(1) == 7);
  CHECK(g.live(2) == 0);
  auto p = g.peaks();
  REQUIRE(p.size() == 2);
  CHECK((p[0].gpu == 0 && p[0].bytes == 150));
  CHECK((p[1].gpu == 1 && p[1].bytes == 7));
  g.reset_peaks();  // a new run: its peak starts from what is still allocated
  g.allocated(0, &a, 10);
  p = g.peaks();
  CHECK((p[0].bytes == 60 && p[1].bytes == 7));
  g.freed(&b);
  g.freed(&c);
  g.freed(&a);
  g.reset_peaks();
  CHECK(g.peaks().empty());  // nothing allocated since: no GPU in this run
}

TEST_CASE("replicas share weights on a GPU when all on one GPU, unless asked not to",
          "[gpu-logic]") {
  Config c = test::synthetic_config(4, 32);
  Placement cpu, one, two;
  one.backend = two.backend = Backend::cuda;
  one.colocated = two.colocated = true;
  one.gpu_of_replica = {0, 0, 0, 0};
  two.gpu_of_replica = {0, 1, 0, 1};
  for (ReplicaMode m : {ReplicaMode::auto_, ReplicaMode::threads, ReplicaMode::shared}) {
    c.replicas = m;
    INFO("replicas: " << to_string(m));
    CHECK(shares_weights(c, cpu) == (m != ReplicaMode::threads));
    CHECK(shares_weights(c, one) == (m != ReplicaMode::threads));
    CHECK_FALSE(shares_weights(c, two));  // the sum would cross GPUs
  }
  for (ReplicaMode m : {ReplicaMode::auto_, ReplicaMode::shared}) {
    c.replicas = m;
    one.colocated = false;  // devices: [0, 0] without colocate: NCCL's placement, not shared
    CHECK_FALSE(shares_weights(c, one));
    one.colocated = true;
  }
  c.replicas = ReplicaMode::shared;
  c.gpus = 1;  // one replica has nothing to share
  CHECK_FALSE(shares_weights(c, cpu));
  one.gpu_of_replica = {0};
  CHECK_FALSE(shares_weights(c, one));
}

TEST_CASE("cuDNN algorithms: the first deterministic supported one, else the first supported",
          "[gpu-logic]") {
  bool det = false;
  CHECK(pick_algorithm({{true, false}, {false, true}, {true, true}, {true, true}}, &det) == 2);
  CHECK(det);
  CHECK(pick_algorithm({{false, true}, {true, false}, {true, false}}, &det) == 1);
  CHECK_FALSE(det);
  CHECK(pick_algorithm({{false, true}, {false, false}}, &det) == -1);
  CHECK(pick_algorithm({}, &det) == -1);
}

TEST_CASE("CUDA graph capture is decided by all ranks together", "[gpu-logic][graph]") {
  using M = Device::GraphMode;
  CHECK(agree_graph_mode(0, 4, 0) == M::capture);
  CHECK(agree_graph_mode(0, 0, 4) == M::replay);
  CHECK(agree_graph_mode(0, 1, 0) == M::capture);  // one rank decides alone
  CHECK(agree_graph_mode(4, 0, 0) == M::eager);
  // One rank cannot capture (its graphs were dropped, it must warm up): none captures.
  CHECK(agree_graph_mode(1, 3, 0) == M::eager);
  CHECK(agree_graph_mode(1, 0, 3) == M::eager);
  // Some would replay, some capture: eager, and all capture again together.
  CHECK(agree_graph_mode(0, 1, 3) == M::eager);

  CHECK(cuda_graph_state(true, true, 1, false) == "on");
  CHECK(cuda_graph_state(false, true, 1, false) == "off: train.cuda_graph is false");
  CHECK(cuda_graph_state(true, false, 1, false) == "off: colocated replicas meet on the host");
  CHECK(cuda_graph_state(true, false, 1, false, true) ==
        "off: colocated replicas sharing one copy of the weights are not captured yet");
  CHECK_THAT(cuda_graph_state(true, true, 1, true), Catch::StartsWith("off: batchnorm: sync"));
  // Several GPUs in one process: off (NCCL warns of deadlocks there), and the reason says so.
  CHECK_THAT(cuda_graph_state(true, true, 2, false),
             Catch::StartsWith("off: 2 GPUs in one process") && Catch::Contains("deadlock"));
  CHECK_THAT(cuda_graph_state(true, true, 8, true), Catch::StartsWith("off: 8 GPUs"));
}

TEST_CASE("a host exchange on a GPU keeps its host-measured time", "[gpu-logic][exchange]") {
  // Host clocks: compute 2.0 s (on a GPU only the queueing), exchange 0.5 s, optimizer 0.1 s.
  const PhaseSeconds host{2.0, 0.5, 0.5, 0.1};
  // The CPU: host clocks, and the exchange is all exposed.
  PhaseSeconds p = split_phases(host, nullptr, -1, true);
  CHECK(p.compute == 2.0);
  CHECK(p.exchange == 0.5);
  CHECK(p.exchange_exposed == 0.5);
  CHECK(p.optimizer == 0.1);
  // A GPU with a host exchange: the events put the host round trips into compute (2.4 s) and
  // the exposed exchange (0.2 s). The exchange keeps its 0.5 s; compute gets the rest.
  const double events[3] = {2.4, 0.2, 0.3};
  p = split_phases(host, events, -1, true);
  CHECK(p.exchange == 0.5);
  CHECK(p.exchange_exposed == 0.5);
  CHECK(p.compute == Approx(2.1));
  CHECK(p.optimizer == 0.3);
  CHECK(p.compute + p.exchange == Approx(events[0] + events[1]));
  // NCCL on its own stream: the events split the step, the stream's time is the exchange.
  p = split_phases(host, events, 0.7, false);
  CHECK(p.compute == 2.4);
  CHECK(p.exchange_exposed == 0.2);
  CHECK(p.exchange == 0.7);
  CHECK(p.optimizer == 0.3);
  // ... and inside CUDA graphs, where the stream is not timed, the exposed time.
  p = split_phases(host, events, -1, false);
  CHECK(p.exchange == 0.2);
  // Shared weights on one GPU: the update (0.1 s, host-timed) ran inside the exchange's span,
  // which the events counted as compute; it is the optimizer's.
  p = split_phases(host, events, -1, true, 0.1);
  CHECK(p.exchange == 0.5);
  CHECK(p.optimizer == Approx(0.4));
  CHECK(p.compute == Approx(2.0));
  CHECK(p.compute + p.exchange + p.optimizer == Approx(events[0] + events[1] + events[2]));
  // Never a negative compute time.
  const double idle[3] = {0.1, 0.0, 0.3};
  CHECK(split_phases(host, idle, -1, true).compute == 0.0);
}

TEST_CASE("CUDA sum_squares matches the CPU twin and gives the same bits every call",
          "[cuda][norms]") {
  if (!gpu_or_skip()) return;
  auto cpu = make_cpu_device({});
  auto gpu = make_cuda_device(0, 0);
  Rng rng(77);
  // One block, a partial grid, and more elements than the fixed grid covers in one pass.
  for (size_t n : {size_t{1}, size_t{1000}, size_t{65535} * 8 * 256 + 777}) {
    const auto x = random_vec(rng, n);
    const auto on = [&](Device& d) {
      Buffer<float> xd(d, n);
      Buffer<double> acc(d, 1);
      d.upload(xd.data(), x.data(), n * sizeof(float));
      const double start = 0.5;  // sum_squares adds to what is there
      d.upload(acc.data(), &start, sizeof(double));
      d.sum_squares(xd.data(), n, acc.data());
      d.sum_squares(xd.data(), n, acc.data());
      double out = 0;
      d.download(&out, acc.data(), sizeof(double));
      return out;
    };
    const double c = on(*cpu), g1 = on(*gpu), g2 = on(*gpu);
    INFO("n " << n << ": cpu " << c << ", gpu " << g1);
    CHECK(std::abs(g1 - c) <= 2e-5 * std::abs(c));  // the CPU adds runs in float lanes
    CHECK(g1 == g2);
  }
}

// ---- state that outlives a step, on the GPU ----


// A GPU run continued from any of its checkpoints gives the bits of the run never stopped: one
// replica on NCCL with CUDA graphs, accumulation and the noise scale (sum_squares inside the
// graph), and two colocated replicas sharing one copy of the weights with synchronised
// BatchNorm; SGD with momentum and AdamW.
TEST_CASE("a GPU run resumed from any of its checkpoints gives the same bits",
          "[cuda][checkpoint]") {
  if (!gpu_or_skip()) return;
  for (int replicas : {1, 2}) {
    for (auto opt : {OptimizerType::sgd, OptimizerType::adamw}) {
      Config c = test::small_image_config(replicas, 16, 16 * 2 * 12 + 7);
      c.backend = Backend::cuda;
      c.colocate = true;
      c.devices = {0};
      c.train.epochs = 2;
      c.train.checkpoint_steps = 5;
      c.train.noise_scale = true;
      c.optimizer.type = opt;
      if (opt != OptimizerType::sgd) c.optimizer.lr = 0.003;
      if (replicas == 1) {
        c.train.accumulation_steps = 2;
      } else {
        c.replicas = ReplicaMode::shared;
        c.model.batchnorm = BatchNormMode::sync;
      }
      INFO(replicas << " replica(s), " << to_string(opt));
      const DataSplit data = load_data(c.data, c.train.seed);
      test::Keep keep;
      const TrainResult full = train(c, data, &keep);
      REQUIRE(keep.all.size() >= 3);
      for (const auto& k : keep.all) {
        INFO("from epoch " << k.epoch << " step " << k.step);
        test::require_same_numeric_columns(full, train(c, data, nullptr, &k));
      }
    }
  }
}

// Synchronised BatchNorm across replicas that share a GPU: two replicas at B with statistics
// over both equal one replica at 2B (no dropout, no augmentation: the same samples in each).
// Accumulating two micro-batches of an MLP equals one step at twice the batch.
TEST_CASE("GPU sync BatchNorm and accumulation equal one replica at the whole batch",
          "[cuda][equivalence]") {
  if (!gpu_or_skip()) return;
  auto image = [](int gpus, int64_t batch, BatchNormMode bn) {
    Config c = test::small_image_config(gpus, batch, 32 * 40);
    c.backend = Backend::cuda;
    c.colocate = true;
    c.devices = {0};
    c.data.drop_remainder = true;
    c.data.augment.flip = false;
    c.model.layers.pop_back();  // no dropout
    c.model.batchnorm = bn;
    return c;
  };
  const auto one = test::run_config(image(1, 32, BatchNormMode::local));
  const auto sync = test::run_config(image(2, 16, BatchNormMode::sync));
  const auto local = test::run_config(image(2, 16, BatchNormMode::local));
  Config copies = image(2, 16, BatchNormMode::sync);  // a copy each, through the host
  copies.replicas = ReplicaMode::threads;
  REQUIRE(one.step_losses.size() >= 30);
  CHECK(test::max_rel_step_diff(one, sync) < 1e-5);
  CHECK(test::run_config(copies).step_losses == sync.step_losses);
  CHECK(test::max_rel_step_diff(one, local) > 1e-4);  // per-replica statistics differ
  Config whole = test::synthetic_config(1, 128), acc = whole;
  for (Config* c : {&whole, &acc}) c->backend = Backend::cuda;
  acc.train.accumulation_steps = 2;
  acc.train.per_replica_batch = 64;
  CHECK(test::max_rel_step_diff(test::run_config(whole), test::run_config(acc)) < 1e-5);
}

// ---- placement, sizes, graph staging and agreement, the NCCL mean ----

// devices: [0, 0] without colocate would pass two replicas of one GPU to NCCL, which fails with
// a bare "invalid usage": refused before asking for GPUs, so validate catches it on any machine.
TEST_CASE("a GPU listed twice in devices needs colocate: true, on any machine", "[gpu-logic]") {
  Config c = test::synthetic_config(2, 32);
  c.devices = {0, 0};
  for (Backend b : {Backend::cuda, Backend::auto_}) {
    c.backend = b;
    INFO("backend " << to_string(b));
    CHECK_THROWS_AS(place_replicas(c, 2), UserError);
    CHECK_THROWS_WITH(place_replicas(c, 2), Catch::Contains("GPU 0 is listed twice") &&
                                                Catch::Contains("colocate: true"));
  }
  // What `dtrain validate` runs.
  CHECK_THROWS_WITH(check_plan(c, load_data(c.data, c.train.seed)),
                    Catch::Contains("listed twice"));
  c.devices = {1, 0, 1};
  CHECK_THROWS_WITH(place_replicas(c, 3), Catch::Contains("GPU 1 is listed twice"));
  c.backend = Backend::cpu;  // the CPU reads no device list
  CHECK(place_replicas(c, 3).backend == Backend::cpu);
  // colocate: true makes it two replicas in turn on one GPU (sharing one copy of the weights).
  c.backend = Backend::cuda;
  c.colocate = true;
  c.devices = {0, 0};
  if (query_gpus().gpus.empty()) {
    CHECK_THROWS_WITH(place_replicas(c, 2), Catch::Contains("backend: cuda, but"));
    return;
  }
  const Placement p = place_replicas(c, 2);
  CHECK(p.colocated);
  CHECK(p.gpu_of_replica == std::vector<int>{0, 0});
}

TEST_CASE("sizes past int are refused by name, not truncated for cuBLAS and cuDNN", "[gpu-logic]") {
  CHECK(narrow_int(0, "cuBLAS GEMM m", 0) == 0);
  CHECK(narrow_int(INT_MAX, "cuBLAS GEMM m", 0) == INT_MAX);
  CHECK_THROWS_AS(narrow_int(int64_t{INT_MAX} + 1, "cuBLAS GEMM k", 3), SystemError);
  CHECK_THROWS_WITH(narrow_int(int64_t{1} << 32, "cuBLAS GEMM k", 3),
                    Catch::Contains("rank 3") && Catch::Contains("cuBLAS GEMM k") &&
                        Catch::Contains("4294967296"));
  CHECK_THROWS_AS(narrow_int(-1, "cuBLAS GEMM lda", 0), SystemError);
  try {
    narrow_int(int64_t{5} << 31, "cuDNN: a convolution", 2);
    FAIL("no throw");
  } catch (const SystemError& e) {
    CHECK(e.rank() == 2);
    CHECK(e.line() > 0);
  }
  // Validation's side: a tensor of more than INT_MAX values is a user error naming the layer.
  CHECK_NOTHROW(check_gpu_tensor("model layer 0 (dense)", 65536, 32767));
  CHECK_NOTHROW(check_gpu_tensor("model layer 0 (dense)", 1, INT_MAX));
  CHECK_THROWS_AS(check_gpu_tensor("model layer 0 (dense)", 65536, 32768), UserError);
  CHECK_THROWS_WITH(check_gpu_tensor("model layer 2 (dense 16 -> 16777216)", 256, 1 << 24),
                    Catch::Contains("model layer 2") && Catch::Contains("256 rows") &&
                        Catch::Contains("per_replica_batch"));
  CHECK_THROWS_AS(check_gpu_tensor("x", INT64_MAX, INT64_MAX), UserError);  // no overflow
}

// The staging area of a CUDA-graph step is planned from what the step stages, in
// CudaGraph::stage's 16-byte spans: per micro-step its batch indices and seeds, per step the
// optimizer's factors. The old plan (indices plus 4 KiB of slack) ran out with many
// accumulation steps, and the capture failed the run.
TEST_CASE("a CUDA-graph step's staging is planned from what it stages", "[gpu-logic][graph]") {
  auto staged = [](int64_t rows, int accum, int seeds, size_t optimizer_bytes) {
    size_t total = 0;
    for (int k = 0; k < accum; ++k) {
      total += graph_stage_span(static_cast<size_t>(rows) * sizeof(int64_t));
      for (int s = 0; s < seeds; ++s) total += graph_stage_span(sizeof(uint64_t));
    }
    return total + graph_stage_span(optimizer_bytes);
  };
  for (int64_t rows : {1, 7, 96})
    for (int accum : {1, 8, 512})
      for (int seeds : {0, 1, 3}) {
        INFO(rows << " rows, " << accum << " micro-steps, " << seeds << " seeds");
        const size_t plan = graph_staging_bytes(rows, accum, seeds, 1);
        CHECK(plan == staged(rows, accum, seeds, sizeof(float)));  // SGD's learning rate
        CHECK(plan == staged(rows, accum, seeds, 12));             // Adam's three factors
      }
  const auto old_plan = [](int64_t rows, int accum) {
    return static_cast<size_t>(accum * rows) * sizeof(int64_t) + 4096;
  };
  CHECK(staged(2, 256, 2, 4) > old_plan(2, 256));  // what failed: now planned
  CHECK(graph_staging_bytes(2, 256, 2, 1) == staged(2, 256, 2, 4));
  CHECK(graph_stage_span(1) == 16);
  CHECK(graph_stage_span(16) == 16);
  CHECK(graph_stage_span(17) == 32);
  // Absurd plans saturate instead of wrapping around to a small area.
  CHECK(graph_staging_bytes(INT64_MAX, INT64_MAX, 1, 1) >= (size_t{1} << 60));
  CHECK(graph_staging_bytes(-1, 4, -1, -1) == 0);
}

namespace {
// CudaGraph's proposals, as far as the agreement sees them: eager until one eager step has
// run since the graphs were dropped, then capture for a slot not captured yet, else replay.
struct FakeGraphs {
  int warm = 0, slot = 0;
  bool captured[4] = {false, false, false, false};
  GraphMode propose() const {
    if (warm < 1) return GraphMode::eager;
    return captured[(slot + 1) % 4] ? GraphMode::replay : GraphMode::capture;
  }
  void begin(GraphMode agreed) {
    slot = (slot + 1) % 4;
    if (agreed == GraphMode::eager) {
      drop();
      warm = 1;
    } else if (agreed == GraphMode::capture) {
      captured[slot] = true;
    }
  }
  void drop() {
    warm = 0;
    for (bool& c : captured) c = false;
  }
};

// `ranks` ranks running `steps` full-size steps in lockstep; every `epoch` steps an epoch ends
// (unsettle) and every rank drops its graphs there (evaluation grew a buffer). Returns the
// votes, after checking that every step's mode is the same on every rank.
int64_t graph_votes(int ranks, int steps, int epoch) {
  std::vector<FakeGraphs> g(static_cast<size_t>(ranks));
  std::vector<GraphAgreement> a(static_cast<size_t>(ranks));
  for (int s = 0; s < steps; ++s) {
    if (s > 0 && s % epoch == 0)
      for (int r = 0; r < ranks; ++r) {
        a[static_cast<size_t>(r)].unsettle();
        g[static_cast<size_t>(r)].drop();
      }
    int votes[3] = {0, 0, 0};
    for (const auto& x : g) ++votes[static_cast<int>(x.propose())];
    std::vector<GraphMode> modes;
    for (int r = 0; r < ranks; ++r) {
      auto& rank = g[static_cast<size_t>(r)];
      modes.push_back(a[static_cast<size_t>(r)].decide(rank.propose(), r, [&](GraphMode) {
        return agree_graph_mode(votes[0], votes[1], votes[2]);
      }));
      rank.begin(modes.back());
    }
    for (GraphMode m : modes) REQUIRE(m == modes.front());
  }
  for (const auto& x : a) REQUIRE(x.votes() == a.front().votes());
  return a.front().votes();
}
}  // namespace

// Under mpirun the ranks voted on every step's graph mode (a host all-reduce per step). Now
// they vote until they agree on a graph step (the warm-up step, then its capture) and again
// only after an epoch's end or a checkpoint; between those, each rank follows its own
// proposals, which are the same on every rank.
TEST_CASE("the ranks vote on CUDA graphs a fixed number of times, not every step",
          "[gpu-logic][graph]") {
  CHECK(graph_votes(4, 10, 1000) == 2);  // the warm-up (eager) and the first capture
  CHECK(graph_votes(4, 1000, 1000) == 2);
  CHECK(graph_votes(2, 100000, 1000000) == 2);
  CHECK(graph_votes(4, 3 * 50, 50) == 3 * 2);  // per epoch, whatever its length
  CHECK(graph_votes(4, 3 * 500, 500) == 3 * 2);

  // A rank that dropped its graphs alone while settled fails loudly, before any collective.
  GraphAgreement a;
  int collectives = 0;
  auto vote = [&](GraphMode m) {
    ++collectives;
    return m;
  };
  CHECK(a.decide(GraphMode::eager, 1, vote) == GraphMode::eager);  // not settled by eager
  CHECK_FALSE(a.settled());
  CHECK(a.decide(GraphMode::capture, 1, vote) == GraphMode::capture);
  CHECK(a.settled());
  CHECK(a.decide(GraphMode::replay, 1, vote) == GraphMode::replay);
  CHECK(collectives == 2);
  CHECK_THROWS_AS(a.decide(GraphMode::eager, 1, vote), SystemError);
  CHECK_THROWS_WITH(a.decide(GraphMode::eager, 1, vote),
                    Catch::Contains("rank 1") && Catch::Contains("train.cuda_graph: false"));
  CHECK(collectives == 2);
  a.unsettle();
  CHECK(a.decide(GraphMode::eager, 1, vote) == GraphMode::eager);  // votes again
  CHECK(collectives == 3);
}

// The NCCL exchange's mean is ncclSum, then x *= 1/N on the device (mean_of_sum is that
// kernel's CPU twin): the host communicators' rule, sum in rank order then times the float
// 1/N, bit for bit. ncclAvg (each input times 1/N, then the sum) gives other bits.
TEST_CASE("the NCCL mean's scaling is the host all-reduce's mean, bit for bit", "[gpu-logic]") {
  for (int p : {2, 3, 5, 7}) {
    INFO(p << " ranks");
    Rng rng(static_cast<uint64_t>(40 + p));
    const size_t n = 4099;
    std::vector<std::vector<float>> in;
    for (int r = 0; r < p; ++r) in.push_back(random_vec(rng, n));
    // The host path: the in-process all-reduce with ReduceOp::mean.
    std::vector<std::vector<float>> host = in;
    InProcessGroup group(p);
    std::vector<std::thread> pool;
    for (int r = 0; r < p; ++r)
      pool.emplace_back([&, r] {
        group.communicator(r)->allreduce(host[static_cast<size_t>(r)].data(), n, ReduceOp::mean);
      });
    for (auto& t : pool) t.join();
    // The NCCL path: the sum of two values does not depend on order; in rank order here.
    std::vector<float> twin = in[0], avg_first(n, 0.f);
    for (int r = 1; r < p; ++r)
      for (size_t i = 0; i < n; ++i) twin[i] += in[static_cast<size_t>(r)][i];
    mean_of_sum(twin.data(), n, p);
    CHECK(std::memcmp(twin.data(), host[0].data(), n * sizeof(float)) == 0);
    for (int r = 0; r < p; ++r)
      for (size_t i = 0; i < n; ++i) avg_first[i] += in[static_cast<size_t>(r)][i] * mean_factor(p);
    if (p != 2) CHECK(std::memcmp(avg_first.data(), host[0].data(), n * sizeof(float)) != 0);
  }
}

TEST_CASE("the GPU's mean scaling gives the host's bits", "[cuda]") {
  if (!gpu_or_skip()) return;
  auto gpu = make_cuda_device(0, 0);
  Mirror m{*gpu, {}, {}};
  Rng rng(91);
  for (int p : {3, 5, 7, 12}) {
    INFO(p << " ranks");
    std::vector<float> sum = random_vec(rng, 100003);
    for (auto& v : sum) v *= static_cast<float>(p);
    float* d = m.in(sum);
    gpu->scale(d, sum.size(), mean_factor(p));  // the kernel the NCCL exchange launches
    const std::vector<float> got = m.out(d, sum.size());
    mean_of_sum(sum.data(), sum.size(), p);
    CHECK(std::memcmp(got.data(), sum.data(), sum.size() * sizeof(float)) == 0);
  }
}

// With two GPUs, NCCL (ncclSum, then the mean's scale) gives the bits of the host path that
// colocated replicas take.
TEST_CASE("two replicas on NCCL give the bits of two colocated replicas", "[cuda][exchange]") {
  if (!gpu_or_skip()) return;
  if (query_gpus().gpus.size() < 2) {
    WARN("SKIPPED: one GPU (NCCL with two replicas needs two)");
    return;
  }
  Config nccl = test::synthetic_config(2, 64);
  nccl.backend = Backend::cuda;
  nccl.devices = {0, 1};
  nccl.train.epochs = 2;
  Config host = nccl;
  host.devices = {0};
  host.colocate = true;
  host.replicas = ReplicaMode::threads;  // through the host
  const auto a = test::run_config(nccl), b = test::run_config(host);
  CHECK_THAT(a.info.devices, Catch::Contains("NCCL"));
  REQUIRE(a.step_losses.size() == b.step_losses.size());
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.epochs.back().test_acc == b.epochs.back().test_acc);
}

// A step of many micro-steps with dropout and augmentation stages more than the old plan's
// 4 KiB of slack: its capture overflowed and failed the run. Graph steps still equal eager.
TEST_CASE("a CUDA-graph step with many accumulation steps fits its staging", "[cuda][graph]") {
  if (!gpu_or_skip()) return;
  // per_replica_batch is the micro-batch: 2 rows a micro-step, 256 micro-steps a step of 512.
  Config c = test::small_image_config(1, 2, 512 * 6);
  c.backend = Backend::cuda;
  c.devices = {0};
  c.train.accumulation_steps = 256;  // a flip seed and a dropout seed each
  c.data.drop_remainder = true;
  Config e = c;
  e.train.cuda_graph = false;
  const auto a = test::run_config(c), b = test::run_config(e);
  CHECK(a.info.cuda_graph == "on");
  CHECK(a.info.cuda_graph_steps >= 4);
  CHECK(a.step_losses == b.step_losses);
}

// A GPU run whose layers hand cuBLAS or cuDNN more than INT_MAX values is refused before
// training, naming the layer (the run would otherwise truncate the sizes).
TEST_CASE("a GPU layer past int sizes is refused at validation", "[cuda][errors]") {
  if (!gpu_or_skip()) return;
  Config c = test::synthetic_config(1, 256);
  c.backend = Backend::cuda;
  c.devices = {0};
  c.model.hidden = {int64_t{1} << 24};  // 256 rows x 2^24 units: 2^32 values
  CHECK_THROWS_WITH(check_plan(c, load_data(c.data, c.train.seed)),
                    Catch::Contains("model layer 0") && Catch::Contains("per_replica_batch"));
}

// Device marks on a GPU: each rank's trace has a device track whose phases nest in its device
// steps, no device step starts before the host queued it (the anchor ties the clocks), and a
// rank slowed in forward (eager steps: the device idles while its host sleeps) is named from
// the device's times.
TEST_CASE("a GPU run's device track and straggler come from its events", "[cuda][trace]") {
  if (!gpu_or_skip()) return;
  test::TempDir d("gpu-marks");
  const std::string cfg =
      d.write("m.yaml",
              "name: m\nbackend: cuda\nthreads: 1\ngpus: 2\ncolocate: true\ndevices: [0]\n"
              "replicas: threads\n"
              "data:\n  dataset: synthetic\n"
              "  synthetic: {train_size: 4096, test_size: 256, shape: [256], classes: 4}\n"
              "model: {hidden: [1024, 256]}\n"
              "train: {epochs: 2, per_replica_batch: 64, target_accuracy: 0, cuda_graph: false,\n"
              "        trace: {from_step: 3, steps: 4}}\n");
  const auto r = test::shell("DTRAIN_SLOW=1:forward:3 " + test::dtrain_binary() + " run " + cfg +
                             " --tag t --results " + (d.path / "res").string() + " 2>&1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto run = d.path / "res" / "m" / "t-g2";
  const auto doc = nlohmann::json::parse(test::slurp(run / "trace.json"));
  // Per rank and step: the host's and the device's step spans, and the device's phases.
  std::map<std::pair<int, int64_t>, std::pair<double, double>> host_step, dev_step;
  std::vector<std::tuple<int, int64_t, std::string, double, double>> dev;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid"), tid = e.at("tid");
    const int64_t step = e.at("args").at("step");
    const double t0 = e.at("ts"), t1 = t0 + e.at("dur").get<double>();
    const std::string cat = e.at("cat");
    if (cat == "step") (tid ? dev_step : host_step)[{pid, step}] = {t0, t1};
    else if (tid == 1) dev.emplace_back(pid, step, cat, t0, t1);
  }
  CHECK(dev_step.size() == 8);  // 2 ranks x steps 3 to 6
  std::set<std::string> cats;
  for (const auto& [pid, step, cat, t0, t1] : dev) {
    INFO("rank " << pid << " step " << step << " " << cat);
    const auto& st = dev_step.at({pid, step});
    CHECK(t0 >= st.first - 1e-3);
    CHECK(t1 <= st.second + 1e-3);
    CHECK(t1 > t0);
    cats.insert(cat);
  }
  CHECK(cats == std::set<std::string>{"data", "forward", "backward", "exchange", "optimizer"});
  for (const auto& [key, span] : dev_step) {
    INFO("rank " << key.first << " step " << key.second);
    CHECK(span.first >= host_step.at(key).first - 50.0);  // microseconds of anchoring
  }
  CHECK_THAT(r.out, Catch::Contains("straggler: rank 1 in forward"));
}

TEST_CASE("a GPU run with synchronised BatchNorm names the slow pass, not the wait",
          "[cuda][straggler][batchnorm]") {
  if (!gpu_or_skip()) return;
  test::TempDir d("gpu-bn-slow");
  // Two colocated replicas of a small ResNet whose statistics meet through the host inside
  // forward and backward, the device idle meanwhile: those gaps are taken out of the device's
  // passes, or rank 0's backward (its wait for rank 1's slow forward) would be named.
  const std::string cfg =
      d.write("b.yaml",
              "name: b\nbackend: cuda\nthreads: 1\ngpus: 2\ncolocate: true\ndevices: [0]\n"
              "replicas: threads\n"
              "data:\n  dataset: synthetic\n"
              "  synthetic: {train_size: 2048, test_size: 128, shape: [3, 32, 32], classes: 10}\n"
              "model: {type: resnet, depth: 8, widths: [16, 32, 64], batchnorm: sync}\n"
              "train: {epochs: 2, per_replica_batch: 64, target_accuracy: 0}\n");
  for (const std::string phase : {"forward", "backward"}) {
    INFO(phase);
    const auto r =
        test::shell("DTRAIN_SLOW=1:" + phase + ":3 " + test::dtrain_binary() + " run " + cfg +
                    " --tag " + phase + " --results " + (d.path / "res").string() + " 2>&1");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("straggler: rank 1 in " + phase));
    CHECK_THAT(r.out, !Catch::Contains("straggler: rank 0"));
  }
}
