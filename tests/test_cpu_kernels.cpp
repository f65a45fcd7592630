// The CPU backend's two convolution paths against each other, and its kernels against
// themselves at other thread counts.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/rng.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::random_vec;
using dtrain::test::rel_error;

namespace {

struct ConvOut {
  std::vector<float> y, dx, dw, db;
};

ConvOut run_conv(Device& d, const ConvGeom& g, int64_t n, uint64_t seed) {
  Rng rng(seed);
  const auto in = static_cast<size_t>(n * g.c * g.h * g.w);
  const auto out = static_cast<size_t>(n * g.oc * g.ho() * g.wo());
  const auto nw = static_cast<size_t>(g.oc * g.c * g.k * g.k);
  const auto x = random_vec(rng, in), w = random_vec(rng, nw), b = random_vec(rng, g.oc),
             dy = random_vec(rng, out);
  ConvOut r;
  r.y.assign(out, 0.f);
  r.dx.assign(in, 7.f);        // overwritten
  r.dw = random_vec(rng, nw);  // accumulated into
  r.db = random_vec(rng, g.oc);
  d.conv_forward(g, n, x.data(), w.data(), b.data(), r.y.data());
  d.conv_backward(g, n, x.data(), w.data(), dy.data(), r.dw.data(), r.db.data(), r.dx.data());
  return r;
}

const std::vector<std::pair<ConvGeom, int64_t>> kGeoms = {
    {{1, 28, 28, 32, 3, 1, 1}, 5},   // the small CNN's first layer
    {{32, 14, 14, 64, 3, 1, 1}, 3},  // and its second
    {{3, 9, 7, 4, 5, 1, 2}, 4},      // 5x5, non-square image
    {{2, 11, 11, 3, 3, 2, 0}, 2},    // strided, output not covering the input
    {{4, 6, 6, 8, 1, 1, 0}, 70},     // 1x1, many samples (several im2col chunks)
    {{1, 5, 5, 2, 5, 1, 0}, 1},      // kernel as large as the image
};

}  // namespace

TEST_CASE("oneDNN convolutions agree with im2col within float rounding", "[conv][onednn]") {
  if (!have_onednn()) {
    WARN("SKIPPED: this dtrain was built without oneDNN");
    return;
  }
  auto ref = make_cpu_device({1, CpuConv::im2col});
  auto dnn = make_cpu_device({2, CpuConv::onednn});
  for (const auto& [g, n] : kGeoms) {
    INFO("conv c" << g.c << " " << g.h << "x" << g.w << " oc" << g.oc << " k" << g.k << " s"
                  << g.stride << " p" << g.pad << " n" << n);
    const auto a = run_conv(*dnn, g, n, 5), b = run_conv(*ref, g, n, 5);
    CHECK(rel_error(a.y, b.y) < 1e-5);
    CHECK(rel_error(a.dx, b.dx) < 1e-5);
    CHECK(rel_error(a.dw, b.dw) < 1e-5);
    CHECK(rel_error(a.db, b.db) < 1e-5);
  }
}

// dtrain's own kernels split work so that every value is summed in the same order whatever the
// thread count. GEMMs are cut into blocks of C, and OpenBLAS's edge kernels (for some kernel
// families) round differently from its interior ones, so there only the last bits may move;
// the same thread count always gives the same bits.
TEST_CASE("CPU kernels give the same bits with 1 2 or 3 threads", "[cpu][threads]") {
  Rng rng(3);
  // A GEMM big enough to be cut into blocks, in all four transpose combinations.
  const int64_t m = 300, n = 260, k = 90;
  const auto a = random_vec(rng, m * k), b = random_vec(rng, k * n);
  std::vector<std::vector<float>> gemms, bns, convs;
  for (int threads : {1, 2, 3, 2}) {
    auto d = make_cpu_device({threads, CpuConv::im2col});
    std::vector<float> all;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        std::vector<float> c(static_cast<size_t>(m * n), 0.5f);
        d->gemm(ta, tb, m, n, k, 1.f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.25f, c.data(),
                n);
        all.insert(all.end(), c.begin(), c.end());
      }
    gemms.push_back(all);

    // BatchNorm statistics and gradients over 40 samples x 8 channels x 100 positions.
    const int64_t ns = 40, ch = 8, sp = 100;
    Rng r2(4);
    const auto x = random_vec(r2, ns * ch * sp), dy = random_vec(r2, ns * ch * sp);
    std::vector<double> moments(2 * ch), sums(2 * ch);
    d->channel_moments(x.data(), ns, ch, sp, moments.data());
    std::vector<float> running(2 * ch, 0.f), stats(2 * ch), gamma(ch, 1.5f), beta(ch, 0.1f),
        dg(ch, 0.f), db(ch, 0.f);
    d->bn_prepare(moments.data(), double(ns * sp), 1e-5, 0.1, running.data(), stats.data(), ch);
    std::vector<float> y(x.size()), dx(x.size());
    d->bn_apply(x.data(), stats.data(), gamma.data(), beta.data(), ns, ch, sp, y.data());
    d->bn_backward_sums(x.data(), dy.data(), stats.data(), gamma.data(), ns, ch, sp, sums.data(),
                        dg.data(), db.data());
    d->bn_backward_dx(x.data(), dy.data(), stats.data(), gamma.data(), sums.data(), double(ns * sp),
                      ns, ch, sp, dx.data());
    std::vector<float> mask(5000);
    d->dropout_mask(mask.data(), mask.size(), 0.25, 77);
    y.insert(y.end(), mask.begin(), mask.end());
    std::vector<float> bn(y);
    bn.insert(bn.end(), dx.begin(), dx.end());
    bn.insert(bn.end(), dg.begin(), dg.end());
    for (auto v : moments) bn.push_back(static_cast<float>(v));
    for (auto v : sums) bn.push_back(static_cast<float>(v));
    bn.insert(bn.end(), running.begin(), running.end());
    bns.push_back(bn);

    const auto r = run_conv(*d, ConvGeom{4, 6, 6, 8, 3, 1, 1}, 70, 6);
    std::vector<float> cv(r.y);
    for (const auto* v : {&r.dx, &r.dw, &r.db}) cv.insert(cv.end(), v->begin(), v->end());
    convs.push_back(cv);
  }
  CHECK(gemms[3] == gemms[1]);  // 2 threads twice
  for (size_t i = 1; i < gemms.size(); ++i) {
    INFO("run " << i << " against 1 thread");
    CHECK(rel_error(gemms[i], gemms[0]) < 1e-6);
    CHECK(bns[i] == bns[0]);
    CHECK(convs[i] == convs[0]);
  }
}

TEST_CASE("DTRAIN_CPU_CONV names the convolution and rejects other values", "[conv]") {
  ::setenv("DTRAIN_CPU_CONV", "im2col", 1);
  CHECK(cpu_conv_from_env() == CpuConv::im2col);
  ::setenv("DTRAIN_CPU_CONV", "winograd", 1);
  CHECK_THROWS_WITH(cpu_conv_from_env(), Catch::Contains("onednn and im2col"));
  ::unsetenv("DTRAIN_CPU_CONV");
  CHECK(cpu_conv_from_env() == CpuOptions::default_cpu_conv());
}
