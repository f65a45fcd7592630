// The CPU backend's two convolution paths against each other, and its kernels against
// themselves at other thread counts.
#include <algorithm>
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/backend/math.hpp"
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

namespace {

// Where MapLayout puts sample s, channel ch, position i of maps of c channels at p positions.
size_t blocked_at(int64_t b, int64_t c, int64_t p, int64_t s, int64_t ch, int64_t i) {
  return static_cast<size_t>(b ? ((s * (c / b) + ch / b) * p + i) * b + ch % b
                               : (s * c + ch) * p + i);
}

std::vector<float> converted(Device& d, const std::vector<float>& v, int64_t n, int64_t c,
                             int64_t p, int64_t from, int64_t to) {
  std::vector<float> out(v.size(), -7.f);
  d.convert_layout(v.data(), n, c, p, from, to, out.data());
  return out;
}

// BatchNorm's four kernels over n samples in layout `block`, from NCHW x and dy; y and dx come
// back in NCHW. The statistics and the sums that y and dx use are given, so that only the
// layout differs between two calls.
struct BnOut {
  std::vector<double> moments, sums;
  std::vector<float> y, dx, dg, db, y_relu;  // y_relu: bn_apply with its ReLU fused
};
BnOut run_bn(Device& d, int64_t block, const std::vector<float>& x, const std::vector<float>& dy,
             const std::vector<float>& stats, const std::vector<double>& sums_in, int64_t n,
             int64_t c, int64_t p) {
  const auto xb = converted(d, x, n, c, p, 0, block), dyb = converted(d, dy, n, c, p, 0, block);
  std::vector<float> gamma(static_cast<size_t>(c)), beta(gamma.size());
  for (size_t k = 0; k < gamma.size(); ++k) gamma[k] = 0.5f + 0.1f * float(k), beta[k] = -0.2f;
  BnOut r{std::vector<double>(2 * c), std::vector<double>(2 * c), std::vector<float>(x.size()),
          std::vector<float>(x.size()), std::vector<float>(c, 0.f), std::vector<float>(c, 0.f),
          std::vector<float>(x.size())};
  d.channel_moments(xb.data(), n, c, p, block, r.moments.data());
  d.bn_apply(xb.data(), stats.data(), gamma.data(), beta.data(), n, c, p, block, r.y.data(),
             false);
  d.bn_apply(xb.data(), stats.data(), gamma.data(), beta.data(), n, c, p, block, r.y_relu.data(),
             true);
  d.bn_backward_sums(xb.data(), dyb.data(), stats.data(), gamma.data(), n, c, p, block,
                     r.sums.data(), r.dg.data(), r.db.data());
  d.bn_backward_dx(xb.data(), dyb.data(), stats.data(), gamma.data(), sums_in.data(),
                   double(n * p), n, c, p, block, r.dx.data());
  r.y = converted(d, r.y, n, c, p, block, 0);
  r.y_relu = converted(d, r.y_relu, n, c, p, block, 0);
  r.dx = converted(d, r.dx, n, c, p, block, 0);
  return r;
}

}  // namespace

TEST_CASE("maps in channel blocks: the layout, and BatchNorm's values as in NCHW", "[bn][blocks]") {
  // p odd: no position count a vector width divides; n * c * p past kParallelMin, so that the
  // kernels and conversions run on several threads.
  const int64_t n = 16, c = 64, p = 37;
  Rng rng(12);
  const auto x = random_vec(rng, n * c * p), dy = random_vec(rng, n * c * p);
  std::vector<float> stats(2 * c);
  std::vector<double> sums(2 * c);
  for (int64_t k = 0; k < c; ++k) {
    stats[k] = 0.01f * float(k), stats[c + k] = 1.5f - 0.02f * float(k);
    sums[k] = 0.3 * double(k), sums[c + k] = -0.1 * double(k);
  }
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(make_cpu_device({3, CpuConv::im2col}));  // dtrain's own conversion loops
  if (have_onednn()) devices.push_back(make_cpu_device({2, CpuConv::onednn}));  // oneDNN's
  for (auto& d : devices) {
    const BnOut want = run_bn(*d, 0, x, dy, stats, sums, n, c, p);
    // The ReLU fused into BatchNorm: the bits of a ReLU after it.
    size_t unlike = 0;
    for (size_t i = 0; i < want.y.size(); ++i)
      unlike += std::bit_cast<uint32_t>(want.y_relu[i]) !=
                std::bit_cast<uint32_t>(math::relu(want.y[i]));
    CHECK(unlike == 0);
    for (int64_t b : {8, 16}) {
      INFO(d->name() << ", blocks of " << b);
      const auto xb = converted(*d, x, n, c, p, 0, b);
      bool placed = true;
      for (int64_t s = 0; s < n; ++s)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t i = 0; i < p; ++i)
            placed = placed && xb[blocked_at(b, c, p, s, ch, i)] == x[blocked_at(0, c, p, s, ch, i)];
      CHECK(placed);
      CHECK(converted(*d, xb, n, c, p, b, 0) == x);
      const BnOut got = run_bn(*d, b, x, dy, stats, sums, n, c, p);
      // Elementwise with the same statistics: the same bits; sums: only their order differs.
      CHECK(got.y == want.y);
      CHECK(got.y_relu == want.y_relu);
      CHECK(got.dx == want.dx);
      // (Each sample's 37 terms summed in float, below 1 for the moments, up to about 10 for
      // the sums, which carry gamma: about 1e-6 and 2e-5 apart.)
      for (size_t k = 0; k < want.moments.size(); ++k) {
        CHECK(got.moments[k] == Approx(want.moments[k]).margin(1e-5));
        CHECK(got.sums[k] == Approx(want.sums[k]).margin(2e-4));
      }
      CHECK(rel_error(got.dg, want.dg) < 1e-5);
      CHECK(rel_error(got.db, want.db) < 1e-5);
    }
  }
  // The blocked sums do not depend on the thread count.
  auto one = make_cpu_device({1, CpuConv::im2col}), three = make_cpu_device({3, CpuConv::im2col});
  const BnOut a = run_bn(*one, 8, x, dy, stats, sums, n, c, p);
  const BnOut b = run_bn(*three, 8, x, dy, stats, sums, n, c, p);
  CHECK(a.moments == b.moments);
  CHECK(a.sums == b.sums);
}

namespace {
// Bits of a float vector equal, element by element (-0 and 0 told apart).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}
}  // namespace

TEST_CASE("BatchNorm's fused residual tail and ReLU mask give the bits of the passes they fuse",
          "[bn][blocks][fusion]") {
  // Device::bn_apply_add and bn_backward_sums_masked's defaults run the separate passes
  // (bn_apply then add or add_relu; the ReLU's backward then bn_backward_sums); the CPU's own
  // run them in one. Every layout, 1 and 2 threads, n * c * p past kParallelMin.
  const int64_t n = 12, c = 32, p = 101;
  const auto len = static_cast<size_t>(n * c * p);
  Rng rng(21);
  const auto x = random_vec(rng, len), dy = random_vec(rng, len), s = random_vec(rng, len);
  auto relu_y = random_vec(rng, len, -1, 1);  // the ReLU's output: zero or positive
  for (auto& v : relu_y) v = std::max(v, 0.f);
  std::vector<float> stats(2 * c), gamma(c), beta(c);
  for (int64_t k = 0; k < c; ++k) {
    stats[k] = 0.02f * float(k) - 0.3f, stats[c + k] = 1.2f - 0.01f * float(k);
    gamma[k] = 0.5f + 0.05f * float(k), beta[k] = 0.1f - 0.01f * float(k);
  }
  for (int threads : {1, 2})
    for (int64_t block : {0, 8, 16}) {
      INFO(threads << " thread(s), blocks of " << block);
      auto d = make_cpu_device({threads, CpuConv::im2col});
      for (bool relu : {false, true}) {
        std::vector<float> fused(len), apart(len);
        d->bn_apply_add(x.data(), stats.data(), gamma.data(), beta.data(), s.data(), n, c, p, block,
                        fused.data(), relu);
        d->Device::bn_apply_add(x.data(), stats.data(), gamma.data(), beta.data(), s.data(), n, c,
                                p, block, apart.data(), relu);
        CHECK(same_bits(fused, apart));
        // Not a pass-through: the ReLU zeroes about half.
        const auto zeros = static_cast<size_t>(std::count(fused.begin(), fused.end(), 0.f));
        CHECK((relu ? zeros > len / 4 : zeros == 0));
      }
      std::vector<float> m1(len, 7.f), m2(len, 7.f), dg1(c, 0.5f), dg2(dg1), db1(c, -0.5f),
          db2(db1);
      std::vector<double> s1(2 * c), s2(2 * c);
      d->bn_backward_sums_masked(x.data(), dy.data(), relu_y.data(), stats.data(), gamma.data(), n,
                                 c, p, block, m1.data(), s1.data(), dg1.data(), db1.data());
      d->Device::bn_backward_sums_masked(x.data(), dy.data(), relu_y.data(), stats.data(),
                                         gamma.data(), n, c, p, block, m2.data(), s2.data(),
                                         dg2.data(), db2.data());
      CHECK(same_bits(m1, m2));
      CHECK(s1 == s2);
      CHECK(same_bits(dg1, dg2));
      CHECK(same_bits(db1, db2));
      size_t masked = 0;
      for (size_t i = 0; i < len; ++i) masked += relu_y[i] > 0.f ? m1[i] != dy[i] : m1[i] != 0.f;
      CHECK(masked == 0);
    }
}

TEST_CASE("oneDNN convolutions between channel blocks give the NCHW convolution's values",
          "[conv][onednn][blocks]") {
  if (!have_onednn()) {
    WARN("SKIPPED: this dtrain was built without oneDNN");
    return;
  }
  auto d = make_cpu_device({2, CpuConv::onednn});
  for (const ConvGeom& nchw :
       {ConvGeom{16, 9, 9, 32, 3, 1, 1}, ConvGeom{32, 9, 9, 16, 1, 2, 0},
        ConvGeom{3, 9, 9, 16, 3, 1, 1}, ConvGeom{32, 9, 9, 48, 3, 1, 1}}) {  // Winograd's (AVX-512)
    const int64_t n = 3, block = d->conv_out_block(nchw);
    INFO("conv c" << nchw.c << " oc" << nchw.oc << " k" << nchw.k << ", blocks of " << block);
    CHECK((block == 8 || block == 16));  // AVX2 and AVX-512 machines: oneDNN's blocks
    if (!block) continue;
    ConvGeom g = nchw;
    g.in_block = nchw.c % block ? 0 : block;
    g.out_block = block;
    const auto want = run_conv(*d, nchw, n, 9);
    // The same inputs in blocks: run_conv's draws, in its order.
    Rng rng(9);
    const int64_t in = n * g.c * g.h * g.w, out = n * g.oc * g.ho() * g.wo(),
                  nw = g.oc * g.c * g.k * g.k, p_in = g.h * g.w, p_out = g.ho() * g.wo();
    const auto x = random_vec(rng, in), w = random_vec(rng, nw), b = random_vec(rng, g.oc),
               dy = random_vec(rng, out);
    const auto xb = converted(*d, x, n, g.c, p_in, 0, g.in_block),
               dyb = converted(*d, dy, n, g.oc, p_out, 0, block);
    std::vector<float> y(static_cast<size_t>(out)), dx(static_cast<size_t>(in)),
        dw = random_vec(rng, nw), db = random_vec(rng, g.oc);
    d->conv_forward(g, n, xb.data(), w.data(), b.data(), y.data());
    d->conv_backward(g, n, xb.data(), w.data(), dyb.data(), dw.data(), db.data(), dx.data());
    CHECK(rel_error(converted(*d, y, n, g.oc, p_out, block, 0), want.y) < 1e-6);
    CHECK(rel_error(converted(*d, dx, n, g.c, p_in, g.in_block, 0), want.dx) < 1e-6);
    CHECK(rel_error(dw, want.dw) < 1e-6);
    CHECK(rel_error(db, want.db) < 1e-6);
  }
}

TEST_CASE("Winograd's convolutions run where they suit, within their rounding of im2col",
          "[conv][onednn][winograd]") {
  CHECK(winograd_suits({32, 8, 8, 32, 3, 1, 1}));
  CHECK(winograd_suits({48, 7, 9, 64, 3, 1, 0}));
  CHECK_FALSE(winograd_suits({16, 8, 8, 16, 3, 1, 1}));  // slower there than direct
  CHECK_FALSE(winograd_suits({32, 8, 8, 16, 3, 1, 1}));
  CHECK_FALSE(winograd_suits({40, 8, 8, 40, 3, 1, 1}));  // not whole blocks of 16
  CHECK_FALSE(winograd_suits({32, 8, 8, 32, 3, 2, 1}));  // strided
  CHECK_FALSE(winograd_suits({32, 8, 8, 32, 1, 1, 0}));  // 1x1
  CHECK_FALSE(winograd_suits({32, 8, 8, 32, 3, 1, 2}));  // oneDNN's kernels pad at most 1
  if (!have_onednn()) {
    WARN("SKIPPED: this dtrain was built without oneDNN");
    return;
  }
  auto ref = make_cpu_device({1, CpuConv::im2col});
  auto wino = make_cpu_device({2, CpuConv::onednn});
  auto direct = make_cpu_device({2, CpuConv::onednn_direct});
  for (const auto& [g, n] : std::vector<std::pair<ConvGeom, int64_t>>{
           {{32, 12, 12, 32, 3, 1, 1}, 4},  // whole 4x4 output tiles
           {{64, 7, 9, 48, 3, 1, 1}, 3},    // tiles cut at the edges
           {{32, 10, 10, 64, 3, 1, 0}, 2}}) {
    INFO("conv c" << g.c << " " << g.h << "x" << g.w << " oc" << g.oc << " p" << g.pad);
    const std::string kernel = onednn_conv_kernel(CpuConv::onednn, g, n),
                      direct_kernel = onednn_conv_kernel(CpuConv::onednn_direct, g, n);
    INFO("kernels: " << kernel << " and " << direct_kernel);
    CHECK(direct_kernel.find("wino") == std::string::npos);
    // oneDNN 2.x has fp32 Winograd kernels for AVX-512 only; elsewhere the direct ones stand in.
    if (direct_kernel.find("avx512_core") != std::string::npos)
      CHECK(kernel.find("wino") != std::string::npos);
    const auto w = run_conv(*wino, g, n, 3), d = run_conv(*direct, g, n, 3),
               r = run_conv(*ref, g, n, 3);
    // Measured: Winograd within 1.7e-6 of im2col (the largest difference over the largest
    // value), the direct kernels within 6.2e-7.
    for (const auto& [got, want] : {std::pair{&w.y, &r.y},
                                    {&w.dx, &r.dx},
                                    {&w.dw, &r.dw},
                                    {&w.db, &r.db},
                                    {&d.y, &r.y},
                                    {&d.dx, &r.dx},
                                    {&d.dw, &r.dw}})
      CHECK(rel_error(*got, *want) < 1e-5);
    // Winograd's products are not the direct ones: it ran, where it was named.
    if (kernel.find("wino") != std::string::npos) CHECK(w.y != d.y);
  }
}

// dtrain's own kernels split work so that every value is summed in the same order whatever the
// thread count. GEMMs are cut into blocks of C, and a GEMM library's edge kernels (for some
// kernel families) round differently from its interior ones, so there only the last bits may move;
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
    d->channel_moments(x.data(), ns, ch, sp, 0, moments.data());
    std::vector<float> running(2 * ch, 0.f), stats(2 * ch), gamma(ch, 1.5f), beta(ch, 0.1f),
        dg(ch, 0.f), db(ch, 0.f);
    d->bn_prepare(moments.data(), double(ns * sp), 1e-5, 0.1, running.data(), stats.data(), ch);
    std::vector<float> y(x.size()), dx(x.size());
    d->bn_apply(x.data(), stats.data(), gamma.data(), beta.data(), ns, ch, sp, 0, y.data(), false);
    d->bn_backward_sums(x.data(), dy.data(), stats.data(), gamma.data(), ns, ch, sp, 0,
                        sums.data(), dg.data(), db.data());
    d->bn_backward_dx(x.data(), dy.data(), stats.data(), gamma.data(), sums.data(), double(ns * sp),
                      ns, ch, sp, 0, dx.data());
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

// The device's elementwise loops run in the clone for this machine's instruction set
// (cpu/loops.hpp: AVX-512, AVX2 or the baseline); this file is built for the baseline, without
// fused multiply-adds. Each element must come out as math.hpp computes it here, bit for bit.
TEST_CASE("CPU elementwise loops give math.hpp's bits in every instruction-set clone",
          "[cpu][clones]") {
  Rng rng(12);
  const size_t n = 100003;  // above the parallel threshold, with a ragged end
  auto x = random_vec(rng, n, -8, 8);
  const auto b = random_vec(rng, n, -2, 2);
  const float extremes[] = {0.f, -0.f, 1e-30f, -1e-30f, 100.f, -100.f, 1e4f, -1e4f, 88.5f, -87.5f};
  std::copy(std::begin(extremes), std::end(extremes), x.begin());
  auto d = make_cpu_device({2, CpuConv::im2col});
  const auto same = [&](const char* what, const std::vector<float>& got, auto expect) {
    INFO(what);
    size_t bad = 0;  // elements whose bits differ
    for (size_t i = 0; i < n; ++i)
      bad += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(expect(i)) ? 1 : 0;
    CHECK(bad == 0);
  };
  std::vector<float> y(n), dx(n);
  const std::pair<Activation, const char*> acts[] = {{Activation::gelu, "gelu"},
                                                     {Activation::sigmoid, "sigmoid"},
                                                     {Activation::tanh, "tanh"},
                                                     {Activation::relu, "relu"}};
  for (const auto& [a, name] : acts) {
    d->activation_forward(a, x.data(), y.data(), n);
    d->activation_backward(a, x.data(), y.data(), b.data(), dx.data(), n);
    const auto fwd = [&, act = a](size_t i) {
      switch (act) {
        case Activation::gelu: return math::gelu(x[i]);
        case Activation::sigmoid: return math::sigmoid(x[i]);
        case Activation::tanh: return math::tanh(x[i]);
        case Activation::relu: break;
      }
      return math::relu(x[i]);
    };
    const auto bwd = [&, act = a](size_t i) {
      switch (act) {
        case Activation::gelu: return math::gelu_backward(x[i], b[i]);
        case Activation::sigmoid: return math::sigmoid_backward(y[i], b[i]);
        case Activation::tanh: return math::tanh_backward(y[i], b[i]);
        case Activation::relu: break;
      }
      return math::relu_backward(x[i], b[i]);
    };
    same(name, y, fwd);
    same(name, dx, bwd);
  }
  d->add(x.data(), b.data(), y.data(), n);
  same("add", y, [&](size_t i) { return x[i] + b[i]; });
  // A residual sum with its ReLU: the bits of the two passes it replaces, and its backward
  // from the output gives those of the backward from the sum.
  d->add_relu(x.data(), b.data(), y.data(), n);
  same("add_relu", y, [&](size_t i) { return math::relu(x[i] + b[i]); });
  d->activation_backward(Activation::relu, y.data(), y.data(), b.data(), dx.data(), n);
  same("relu backward from the output", dx, [&](size_t i) {
    return math::relu_backward(x[i] + b[i], b[i]);
  });
  d->multiply(x.data(), b.data(), y.data(), n);
  same("multiply", y, [&](size_t i) { return x[i] * b[i]; });

  // AdamW over the same values, against math::adam_step one element at a time.
  std::vector<float> p(x), m(b), v(n, 0.25f), p2(x), m2(b), v2(n, 0.25f);
  d->adam_update(p.data(), b.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, true,
                 3);
  const math::AdamFactors f = math::adam_factors(1e-3f, 0.9f, 0.95f, 3);
  for (size_t i = 0; i < n; ++i)
    math::adam_step(p2[i], b[i], m2[i], v2[i], f, 0.9f, 0.95f, 1e-8f, 0.1f, true);
  same("adam parameters", p, [&](size_t i) { return p2[i]; });
  same("adam second moments", v, [&](size_t i) { return v2[i]; });

  // SGD with Nesterov momentum and weight decay; scaling; a bias added to rows.
  std::vector<float> q(x), buf(b), q2(x), buf2(b);
  d->sgd_update(q.data(), b.data(), buf.data(), n, 0.05f, 0.9f, 5e-4f, true);
  for (size_t i = 0; i < n; ++i) math::sgd_step(q2[i], b[i], buf2[i], 0.05f, 0.9f, 5e-4f, true);
  same("sgd parameters", q, [&](size_t i) { return q2[i]; });
  same("sgd momentum", buf, [&](size_t i) { return buf2[i]; });
  y = x;
  d->scale(y.data(), n, 0.37f);
  same("scale", y, [&](size_t i) { return x[i] * 0.37f; });
  const int64_t cols = 1000, rows = static_cast<int64_t>(n) / cols;  // 100 rows
  y = x;
  d->add_bias(y.data(), b.data(), rows, cols);
  same("add_bias", y, [&](size_t i) {
    return i < static_cast<size_t>(rows * cols) ? x[i] + b[i % cols] : x[i];
  });

  // BatchNorm's affine map (100 samples x 10 channels x 100 positions) and LayerNorm's rows of
  // 1000 features, against math.hpp's per-channel and per-row formulas.
  const int64_t ch = 10, sp = 100;
  std::vector<float> stats(2 * ch), gamma(cols), beta(cols);
  for (int64_t k = 0; k < ch; ++k) {
    stats[k] = 0.1f * float(k) - 0.3f;         // mean
    stats[ch + k] = 0.5f + 0.05f * float(k);  // 1 / std
  }
  for (int64_t k = 0; k < cols; ++k) {
    gamma[k] = 1.f + b[k] * 0.25f;
    beta[k] = b[cols + k];
  }
  d->bn_apply(x.data(), stats.data(), gamma.data(), beta.data(), rows, ch, sp, 0, y.data(), false);
  same("bn_apply", y, [&](size_t i) {
    const size_t k = (i / sp) % ch;
    if (i >= static_cast<size_t>(rows * ch * sp)) return y[i];  // the ragged end: not written
    return math::bn_apply_one(math::bn_affine(gamma[k], beta[k], stats[k], stats[ch + k]), x[i]);
  });
  std::vector<float> ln_stats(2 * rows);
  d->layernorm_forward(x.data(), gamma.data(), beta.data(), rows, cols, 1e-5f, y.data(),
                       ln_stats.data());
  std::vector<math::LnStats> want(static_cast<size_t>(rows));
  for (size_t r = 0; r < want.size(); ++r)
    want[r] = math::layernorm_stats(&x[r * cols], static_cast<int64_t>(gamma.size()), 1e-5f);
  same("layernorm_forward", y, [&](size_t i) {
    if (i >= static_cast<size_t>(rows * cols)) return y[i];
    const math::LnStats st = want[i / cols];
    return math::layernorm_one(x[i], st.mean, st.rstd, gamma[i % cols], beta[i % cols]);
  });
}

TEST_CASE("DTRAIN_CPU_CONV names the convolution and rejects other values", "[conv]") {
  ::setenv("DTRAIN_CPU_CONV", "im2col", 1);
  CHECK(cpu_conv_from_env() == CpuConv::im2col);
  ::setenv("DTRAIN_CPU_CONV", "winograd", 1);
  CHECK_THROWS_WITH(cpu_conv_from_env(),
                    Catch::Contains("valid values are onednn, onednn-direct and im2col"));
  ::setenv("DTRAIN_CPU_CONV", "onednn-direct", 1);
  if (have_onednn()) {
    CHECK(cpu_conv_from_env() == CpuConv::onednn_direct);
    CHECK(std::string(to_string(CpuConv::onednn_direct)) == "onednn-direct");
  } else {
    CHECK_THROWS_WITH(cpu_conv_from_env(), Catch::Contains("built without oneDNN"));
  }
  ::unsetenv("DTRAIN_CPU_CONV");
  CHECK(cpu_conv_from_env() == CpuOptions::default_cpu_conv());
}

TEST_CASE("DTRAIN_CPU_FUSE turns the fused BatchNorm passes off and rejects other values",
          "[bn][fusion]") {
  ::setenv("DTRAIN_CPU_FUSE", "off", 1);
  CHECK_FALSE(cpu_fuse_from_env());
  ::setenv("DTRAIN_CPU_FUSE", "on", 1);
  CHECK(cpu_fuse_from_env());
  ::setenv("DTRAIN_CPU_FUSE", "0", 1);
  CHECK_THROWS_WITH(cpu_fuse_from_env(),
                    Catch::Contains("DTRAIN_CPU_FUSE=0: valid values are on and off"));
  ::unsetenv("DTRAIN_CPU_FUSE");
  CHECK(cpu_fuse_from_env());
  CpuOptions o;
  o.threads = 2;
  o.fuse = false;
  CHECK_THAT(make_cpu_device(o)->name(), Catch::Contains(", unfused)"));
  o.fuse = true;
  CHECK_THAT(make_cpu_device(o)->name(), !Catch::Contains("unfused"));
}

TEST_CASE("DTRAIN_CPU_GEMM names the matrix product and rejects other values", "[gemm]") {
  ::setenv("DTRAIN_CPU_GEMM", "openblas", 1);
  CHECK(cpu_gemm_from_env() == CpuGemm::openblas);
  ::setenv("DTRAIN_CPU_GEMM", "mkl", 1);
  CHECK_THROWS_WITH(cpu_gemm_from_env(),
                    Catch::Contains("DTRAIN_CPU_GEMM=mkl: valid values are onednn and openblas"));
  ::setenv("DTRAIN_CPU_GEMM", "onednn", 1);
  if (have_onednn())
    CHECK(cpu_gemm_from_env() == CpuGemm::onednn);
  else
    CHECK_THROWS_WITH(cpu_gemm_from_env(), Catch::Contains("built without oneDNN"));
  ::unsetenv("DTRAIN_CPU_GEMM");
  CHECK(cpu_gemm_from_env() == CpuOptions::default_cpu_gemm());
}

// Both products against a double-precision reference, in all four transpose combinations, on
// the device's blocked path (several threads) and a single call.
TEST_CASE("oneDNN and OpenBLAS matrix products agree with a double-precision product",
          "[gemm]") {
  Rng rng(5);
  const int64_t m = 300, n = 260, k = 90;
  const auto a = random_vec(rng, m * k), b = random_vec(rng, k * n);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> want(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t l = 0; l < k; ++l)
            acc +=
                double(ta ? a[l * m + i] : a[i * k + l]) * double(tb ? b[j * k + l] : b[l * n + j]);
          want[i * n + j] = static_cast<float>(2.0 * acc + 0.25 * 0.5);
        }
      for (CpuGemm lib : {CpuGemm::openblas, CpuGemm::onednn}) {
        if (lib == CpuGemm::onednn && !have_onednn()) continue;
        for (int threads : {1, 2}) {
          INFO(to_string(lib) << " ta " << ta << " tb " << tb << " threads " << threads);
          CpuOptions o;
          o.threads = threads;
          o.gemm = lib;
          auto d = make_cpu_device(o);
          std::vector<float> c(static_cast<size_t>(m * n), 0.5f);
          d->gemm(ta, tb, m, n, k, 2.f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.25f,
                  c.data(), n);
          CHECK(rel_error(c, want) < 1e-6);
        }
      }
    }
}

// ---- math.hpp: the per-element arithmetic both backends run, against independent formulas ----

namespace {
// The GELU of math.hpp in double, for finite differences.
double gelu_double(double x) {
  const double k = std::sqrt(2.0 / 3.141592653589793);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double central_difference(double (*f)(double), double x) {
  const double h = 1e-5;
  return (f(x + h) - f(x - h)) / (2 * h);
}
double sigmoid_double(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
}  // namespace

TEST_CASE("math.hpp activations agree with double-precision formulas and derivatives",
          "[math]") {
  for (double xd = -8; xd <= 8; xd += 0.0625) {
    const auto x = static_cast<float>(xd);
    INFO("x = " << x);
    CHECK(math::gelu(x) == Approx(gelu_double(xd)).margin(1e-6).epsilon(1e-5));
    CHECK(math::gelu_grad(x) ==
          Approx(central_difference(gelu_double, xd)).margin(1e-5).epsilon(1e-4));
    CHECK(math::gelu_backward(x, 0.5f) == Approx(0.5 * math::gelu_grad(x)).epsilon(1e-6));
    CHECK(math::sigmoid(x) == Approx(sigmoid_double(xd)).margin(1e-7).epsilon(1e-6));
    // Backward from the output y: f'(x) = y (1 - y) for the sigmoid, 1 - y^2 for tanh.
    const float ys = math::sigmoid(x), yt = std::tanh(x);
    CHECK(math::sigmoid_backward(ys, 2.f) ==
          Approx(2 * central_difference(sigmoid_double, xd)).margin(1e-6).epsilon(1e-4));
    CHECK(math::tanh_backward(yt, 2.f) ==
          Approx(2 * central_difference([](double v) { return std::tanh(v); }, xd))
              .margin(1e-6)
              .epsilon(1e-4));
    CHECK(math::relu(x) == (xd > 0 ? x : 0.f));
    CHECK(math::relu_backward(x, 3.f) == (xd > 0 ? 3.f : 0.f));
  }
}

TEST_CASE("math.hpp softmax cross-entropy of a row agrees with a direct log-sum-exp",
          "[math]") {
  Rng rng(17);
  for (int64_t classes : {1, 2, 7, 100}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto z = random_vec(rng, static_cast<size_t>(classes), -20, 20);
      const auto y = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
      std::vector<float> d(z.size(), 7.f);
      const math::XentRow row = math::softmax_xent_row(z.data(), y, classes, 0.25f, d.data());
      // Direct: log(sum exp(z_c)) - z_y in long double, no shift by the maximum. The row's
      // differences z_c - max are float, so it agrees to float rounding of the logits.
      long double sum = 0;
      for (float v : z) sum += std::exp(static_cast<long double>(v));
      const double loss = static_cast<double>(std::log(sum) - static_cast<long double>(z[y]));
      INFO(classes << " classes, trial " << trial);
      CHECK(row.loss == Approx(loss).margin(1e-5).epsilon(1e-6));
      const auto first_max = std::max_element(z.begin(), z.end()) - z.begin();
      CHECK(row.hit == (first_max == y));
      for (int64_t c = 0; c < classes; ++c) {
        const double p =
            static_cast<double>(std::exp(static_cast<long double>(z[c])) / sum) - (c == y);
        CHECK(d[c] == Approx(0.25 * p).margin(1e-8).epsilon(1e-6));
      }
      // Without a gradient only the loss and the hit come back.
      const math::XentRow again = math::softmax_xent_row(z.data(), y, classes, 0.25f, nullptr);
      CHECK(again.loss == row.loss);
      CHECK(again.hit == row.hit);
    }
  }
  // Ties: the first maximum is the prediction.
  const std::vector<float> tied{1.f, 3.f, 3.f};
  CHECK(math::softmax_xent_row(tied.data(), 1, 3, 1.f, nullptr).hit);
  CHECK_FALSE(math::softmax_xent_row(tied.data(), 2, 3, 1.f, nullptr).hit);
}

TEST_CASE("math.hpp max-pooling window finds the first maximum", "[math]") {
  Rng rng(23);
  const int64_t h = 9, w = 7;
  auto plane = random_vec(rng, static_cast<size_t>(h * w));
  for (size_t i = 0; i < plane.size(); i += 4) plane[i] = 0.5f;  // ties
  // (window, stride, padding); padded positions are skipped, as PyTorch's -inf padding is.
  for (auto [k, stride, pad] : {std::array<int64_t, 3>{2, 2, 0}, {3, 2, 0}, {3, 1, 0}, {3, 2, 1},
                                {2, 1, 1}, {5, 3, 2}})
    for (int64_t oi = 0; oi < math::pool_out(h, k, stride, pad); ++oi)
      for (int64_t oj = 0; oj < math::pool_out(w, k, stride, pad); ++oj) {
        float best = -2;
        int64_t at = -1;
        for (int64_t ki = 0; ki < k; ++ki)
          for (int64_t kj = 0; kj < k; ++kj) {
            const int64_t r = oi * stride + ki - pad, col = oj * stride + kj - pad;
            if (r < 0 || r >= h || col < 0 || col >= w) continue;
            const int64_t i = r * w + col;
            if (plane[static_cast<size_t>(i)] > best) best = plane[static_cast<size_t>(i)], at = i;
          }
        const math::PoolMax m = math::maxpool_window(plane.data(), h, w, k, stride, pad, oi, oj);
        CHECK(m.value == best);
        CHECK(m.index == at);
      }
  // PyTorch's output sizes: the ImageNet stem's pool takes 112x112 to 56x56.
  CHECK(math::pool_out(112, 3, 2, 1) == 56);
  CHECK(math::pool_out(112, 3, 2, 0) == 55);
}

// The GPU's max-pool backward finds, per input position, the outputs whose windows cover it
// with math::pool_cover, in 32 or 64 bits: the same set as a search of every output.
TEST_CASE("math.hpp pool_cover names exactly the windows over a position", "[math]") {
  for (auto [n, k, stride, pad] :
       {std::array<int64_t, 4>{28, 2, 2, 0}, {9, 3, 2, 0}, {9, 3, 1, 0}, {9, 3, 2, 1},
        {7, 2, 1, 1}, {11, 5, 3, 2}, {10, 2, 3, 0}, {112, 3, 2, 1}, {5, 2, 2, 0}}) {
    const int64_t out = math::pool_out(n, k, stride, pad);
    for (int64_t pos = 0; pos < n; ++pos) {
      std::vector<int64_t> want;
      for (int64_t o = 0; o < out; ++o)
        if (o * stride - pad <= pos && pos < o * stride - pad + k) want.push_back(o);
      const auto wide = math::pool_cover<int64_t>(pos + pad, k, stride, out);
      const auto narrow = math::pool_cover<uint32_t>(static_cast<uint32_t>(pos + pad),
                                                     static_cast<uint32_t>(k),
                                                     static_cast<uint32_t>(stride),
                                                     static_cast<uint32_t>(out));
      std::vector<int64_t> got;
      for (int64_t o = wide.lo; o <= wide.hi; ++o) got.push_back(o);
      INFO("n " << n << " k " << k << " stride " << stride << " pad " << pad << " pos " << pos);
      CHECK(got == want);
      CHECK(static_cast<int64_t>(narrow.lo) == wide.lo);
      CHECK(static_cast<int64_t>(narrow.hi) == wide.hi);
    }
  }
}

// The GPU's per-channel sums split a channel's values into runs; every value is in exactly
// one run, no run is empty, the GPU fills up with runs where there are few channels, and the
// runs' partial sums fit the scratch.
TEST_CASE("math.hpp channel_split covers each channel's values in runs that fit the scratch",
          "[math]") {
  for (int64_t count : {int64_t(0), int64_t(1), int64_t(63), int64_t(4096), int64_t(4097),
                        int64_t(100352), int64_t(802816), int64_t(3136), int64_t(1) << 31})
    for (int64_t c : {1, 3, 32, 64, 2048, 65536, 200000}) {
      const math::ChannelSplit sp = math::channel_split(count, c);
      INFO("count " << count << " channels " << c);
      CHECK(sp.parts >= 1);
      CHECK(sp.parts <= math::kChannelParts);
      CHECK(2 * c * sp.parts <= math::channel_scratch_size(c));
      CHECK(sp.parts * sp.chunk >= count);
      if (count > 0) CHECK((sp.parts - 1) * sp.chunk < count);  // the last run is not empty
      if (count >= math::kChannelChunk * math::kChannelParts && c <= 1024)
        CHECK(sp.parts == math::kChannelParts);
    }
  // The CNN's first BatchNorm at batch 1024 (32 channels of 28 x 28): 64 runs a channel, 2,048
  // blocks, where one block a channel gave 32.
  CHECK(math::channel_split(1024 * 784, 32).parts == 64);
  CHECK(math::channel_scratch_size(32) == math::kChannelScratch);
}

TEST_CASE("math.hpp BatchNorm agrees with the textbook formulas in double", "[math]") {
  Rng rng(29);
  const int64_t count = 500;
  const auto x = random_vec(rng, static_cast<size_t>(count), -2, 4);
  double s = 0, ss = 0;
  for (float v : x) s += v, ss += double(v) * v;
  double mean = 0, var = 0;
  for (float v : x) mean += v / double(count);
  for (float v : x) var += (v - mean) * (v - mean) / double(count);
  // Training: statistics from the moments, running statistics moved by the momentum.
  const double moments[2] = {s, ss}, eps = 1e-5, momentum = 0.1;
  float running[2] = {0.5f, 2.f}, stats[2] = {0, 0};
  math::bn_prepare_channel(moments, double(count), eps, momentum, running, stats, 1, 0);
  CHECK(stats[0] == Approx(mean).epsilon(1e-6));
  CHECK(stats[1] == Approx(1 / std::sqrt(var + eps)).epsilon(1e-6));
  CHECK(running[0] == Approx(0.9 * 0.5 + 0.1 * mean).epsilon(1e-6));
  CHECK(running[1] == Approx(0.9 * 2 + 0.1 * var * count / (count - 1)).epsilon(1e-6));
  // Evaluation: from the running statistics.
  float eval[2] = {0, 0};
  math::bn_prepare_channel(nullptr, 0, eps, 0, running, eval, 1, 0);
  CHECK(eval[0] == running[0]);
  CHECK(eval[1] == Approx(1 / std::sqrt(double(running[1]) + eps)).epsilon(1e-6));
  // Apply, and the input gradient dx = inv_std / m * (m * gamma * dy - s1 - xhat * s2) with
  // s1 = sum(gamma * dy), s2 = sum(gamma * dy * xhat).
  const float gamma = 1.3f, beta = -0.4f;
  const auto dy = random_vec(rng, static_cast<size_t>(count));
  double t1 = 0, t2 = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double xhat = (x[i] - double(stats[0])) * stats[1];
    t1 += dy[i];
    t2 += dy[i] * xhat;
  }
  double sums[2] = {0, 0};
  float dgamma = 0.5f, dbeta = 0.25f;
  math::bn_backward_totals(t1, t2, &gamma, 1, 0, sums, &dgamma, &dbeta);
  CHECK(dbeta == Approx(0.25 + t1).epsilon(1e-6));
  CHECK(dgamma == Approx(0.5 + t2).epsilon(1e-6));
  const math::BnAffine t = math::bn_affine(gamma, beta, stats[0], stats[1]);
  const math::BnDx k = math::bn_dx_coeffs(stats[0], stats[1], gamma, sums[0], sums[1], count);
  for (int64_t i = 0; i < count; i += 7) {
    const double xhat = (x[i] - double(stats[0])) * stats[1];
    CHECK(math::bn_xhat(x[i], stats[0], stats[1]) == Approx(xhat).epsilon(1e-5).margin(1e-6));
    CHECK(math::bn_apply_one(t, x[i]) == Approx(gamma * xhat + beta).epsilon(1e-5).margin(1e-5));
    const double dx = stats[1] / double(count) *
                      (count * gamma * dy[i] - gamma * t1 - xhat * gamma * t2);
    CHECK(math::bn_dx_one(k, dy[i], x[i]) == Approx(dx).epsilon(1e-4).margin(1e-5));
  }
}

TEST_CASE("math.hpp optimizer steps agree with PyTorch's update rules in double", "[math]") {
  Rng rng(31);
  const auto g = random_vec(rng, 50), p0 = random_vec(rng, 50);
  const double lr = 0.1, mom = 0.9, wd = 5e-4;
  for (bool nesterov : {false, true})
    for (size_t i = 0; i < g.size(); ++i) {
      float p = p0[i], buf = 0.f;
      double pd = p0[i], bd = 0;
      for (int step = 0; step < 3; ++step) {
        math::sgd_step(p, g[i], buf, float(lr), float(mom), float(wd), nesterov);
        const double d = g[i] + wd * pd;
        bd = mom * bd + d;
        pd -= lr * (nesterov ? d + mom * bd : bd);
      }
      CHECK(p == Approx(pd).epsilon(1e-5).margin(1e-6));
      CHECK(buf == Approx(bd).epsilon(1e-5).margin(1e-6));
    }
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, alr = 1e-3, awd = 0.01;
  for (bool decoupled : {false, true})
    for (size_t i = 0; i < g.size(); ++i) {
      float p = p0[i], m = 0, v = 0;
      double pd = p0[i], md = 0, vd = 0;
      for (int64_t step = 1; step <= 5; ++step) {
        const math::AdamFactors f = math::adam_factors(float(alr), float(b1), float(b2), step);
        CHECK(f.bc1 == Approx(1 - std::pow(b1, step)).epsilon(1e-5));
        CHECK(f.bc2_sqrt == Approx(std::sqrt(1 - std::pow(b2, step))).epsilon(1e-4));
        math::adam_step(p, g[i], m, v, f, float(b1), float(b2), float(eps), float(awd), decoupled);
        double d = g[i];
        if (decoupled)
          pd *= 1 - alr * awd;
        else
          d += awd * pd;
        md = b1 * md + (1 - b1) * d;
        vd = b2 * vd + (1 - b2) * d * d;
        const double mhat = md / (1 - std::pow(b1, step)), vhat = vd / (1 - std::pow(b2, step));
        pd -= alr * mhat / (std::sqrt(vhat) + eps);
      }
      CHECK(p == Approx(pd).epsilon(1e-4).margin(1e-6));
    }
}

TEST_CASE("CPU sum_squares adds the squared norm within 2e-5, the same bits for any thread count",
          "[cpu][norms]") {
  Rng rng(5);
  for (size_t n : {size_t{0}, size_t{3}, size_t{4096}, size_t{100003}}) {
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(rng.uniform(-2, 2));
    long double ref = 0.25L;
    for (float v : x) ref += static_cast<long double>(v) * v;
    std::vector<double> got;
    for (int threads : {1, 2, 3}) {
      auto d = make_cpu_device({threads, CpuConv::im2col});
      double acc = 0.25;  // host memory is device memory on the CPU
      d->sum_squares(x.data(), n, &acc);
      got.push_back(acc);
    }
    INFO("n " << n);
    CHECK(std::abs(got[0] - static_cast<double>(ref)) <= 2e-5 * static_cast<double>(ref));
    CHECK(got[1] == got[0]);
    CHECK(got[2] == got[0]);
  }
}
