// The CUDA backend against its CPU twin: every Device operation on the same inputs, compared by
// relative error, and the equivalence contract on GPUs. Skips, and says so, without a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "dtrain/device.hpp"
#include "dtrain/gpu.hpp"
#include "dtrain/rng.hpp"
#include "dtrain/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::random_vec;
using dtrain::test::rel_error;

namespace {

// Prints the reason once per test and returns false where no GPU can run the test.
bool gpu_or_skip() {
  const GpuSystem s = query_gpus();
  if (!s.gpus.empty()) return true;
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
void twin(const char* what, double bound, const Op& op, Precision precision = Precision::fp32) {
  CpuOptions co;
  co.bf16 = precision == Precision::bf16;
  auto cpu = make_cpu_device(co);
  auto gpu = make_cuda_device(0, 0, precision);
  Mirror mc{*cpu, {}, {}}, mg{*gpu, {}, {}};
  const auto a = op(*gpu, mg), b = op(*cpu, mc);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what << " output " << i);
    CHECK(rel_error(a[i], b[i]) < bound);
  }
}

// A convolution's forward pass and all its gradients on random tensors of `ns` samples.
void conv_twin(const char* what, double bound, const ConvGeom& g, int64_t ns, Rng& rng,
               Precision precision) {
  const auto x = random_vec(rng, ns * g.c * g.h * g.w), w = random_vec(rng, g.oc * g.c * g.k * g.k);
  const auto b = random_vec(rng, g.oc), dy = random_vec(rng, ns * g.oc * g.ho() * g.wo());
  twin(what, bound, [&](Device& d, Mirror& mr) -> Outs {
    float *y = mr.in(std::vector<float>(dy.size())), *dw = mr.in(w), *db = mr.in(b),
          *dx = mr.in(x);
    const float* xp = mr.in(x);
    const float* wp = mr.in(w);
    d.conv_forward(g, ns, xp, wp, mr.in(b), y);
    d.conv_backward(g, ns, xp, wp, mr.in(dy), dw, db, dx);
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

  twin("bias", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
    float* y = mr.in(C0);
    float* db = mr.in(random_vec(rng, n));
    const auto bias = std::vector<float>(C0.begin(), C0.begin() + n);
    d.add_bias(y, mr.in(bias), m, n);
    d.bias_grad(y, db, m, n, true);
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
  for (const ConvGeom g : {ConvGeom{1, 28, 28, 8, 3, 1, 1}, ConvGeom{6, 9, 7, 4, 5, 2, 2}})
    conv_twin("conv", 1e-5, g, 3, rng, Precision::fp32);
  for (auto [k2, s2] : {std::pair{2, 2}, std::pair{3, 2}}) {
    const int64_t ns = 2, c = 3, h = 9, w = 8;
    const int64_t ho = (h - k2) / s2 + 1, wo = (w - k2) / s2 + 1;
    const auto x = random_vec(rng, ns * c * h * w), dy = random_vec(rng, ns * c * ho * wo);
    twin("maxpool", 1e-6, [&](Device& d, Mirror& mr) -> Outs {
      float *y = mr.in(dy), *dx = mr.in(x);
      Buffer<int32_t> am(d, static_cast<size_t>(ns * c * ho * wo));
      d.maxpool_forward(mr.in(x), ns, c, h, w, k2, s2, y, am.data());
      d.maxpool_backward(mr.in(dy), am.data(), ns, c, h, w, k2, s2, dx);
      return Outs{mr.out(y, dy.size()), mr.out(dx, x.size())};
    });
  }
  {
    const int64_t ns = 5, c = 4, sp = 30;
    const auto x = random_vec(rng, ns * c * sp, -2, 3), dy = random_vec(rng, ns * c * sp);
    const auto gamma = random_vec(rng, c, 0.5, 1.5), beta = random_vec(rng, c);
    twin("batchnorm", 1e-5, [&](Device& d, Mirror& mr) -> Outs {
      Buffer<double> moments(d, 2 * c), sums(d, 2 * c);
      const float* xp = mr.in(x);
      const float* gp = mr.in(gamma);
      float *running = mr.in(std::vector<float>(2 * c, 0.5f)),
            *stats = mr.in(std::vector<float>(2 * c)), *y = mr.in(x), *dx = mr.in(x),
            *dg = mr.in(gamma), *db = mr.in(beta);
      d.channel_moments(xp, ns, c, sp, moments.data());
      d.bn_prepare(moments.data(), double(ns * sp), 1e-5, 0.1, running, stats, c);
      d.bn_apply(xp, stats, gp, mr.in(beta), ns, c, sp, y);
      d.bn_backward_sums(xp, mr.in(dy), stats, gp, ns, c, sp, sums.data(), dg, db);
      d.bn_backward_dx(xp, mr.in(dy), stats, gp, sums.data(), double(ns * sp), ns, c, sp, dx);
      float* eval = mr.in(std::vector<float>(2 * c));
      d.bn_prepare(nullptr, 0, 1e-5, 0, running, eval, c);
      std::vector<double> hs(2 * c);
      d.download(hs.data(), sums.data(), hs.size() * sizeof(double));
      return Outs{mr.out(y, x.size()),
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
      d.augment(mr.in(imgs), out, 9, 3, 11, 13, 2, true, 99);
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
  for (const ConvGeom g : {ConvGeom{1, 28, 28, 8, 3, 1, 1}, ConvGeom{8, 14, 14, 16, 3, 1, 1}})
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
  // One replica goes through NCCL with a one-rank communicator; four share the GPU and are
  // reduced by the device kernel.
  const auto a = test::run_config(one);
  const auto b = test::run_config(four);
  REQUIRE(a.step_losses.size() >= 50);
  CHECK(a.info.devices.find("NCCL") != std::string::npos);
  CHECK(b.info.devices.find("reduced on the device") != std::string::npos);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
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
  // Synchronised BatchNorm goes through the host inside the step: no graphs, and it says why.
  c.model.batchnorm = BatchNormMode::sync;
  CHECK_THAT(test::run_config(c).info.cuda_graph, Catch::Contains("off: batchnorm: sync"));
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
