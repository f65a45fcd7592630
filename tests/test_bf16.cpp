// precision: bf16 on the CPU: the rounding itself, GEMM and convolution operands rounded exactly
// as documented in bf16.hpp (so the CPU device is the CUDA backend's bf16 twin), and training
// that still learns.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/base/bf16.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::random_vec;
using dtrain::test::rel_error;

namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

uint32_t bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

}  // namespace

TEST_CASE("round_bf16 rounds to nearest with ties to even", "[bf16]") {
  CHECK(round_bf16(1.0f) == 1.0f);
  // bfloat16 keeps 7 mantissa bits: the spacing above 1 is 2^-7.
  CHECK(round_bf16(1.0f + 0x1p-8f) == 1.0f);                    // tie, to even (down)
  CHECK(round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);      // tie, to even (up)
  CHECK(round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // past the tie
  CHECK(round_bf16(1.0f + 0x1p-9f) == 1.0f);
  CHECK(round_bf16(-2.5f) == -2.5f);
  CHECK(round_bf16(3.14159265f) == 3.140625f);
  CHECK((bits(round_bf16(0.1f)) & 0xffffu) == 0u);
  CHECK(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
  CHECK(std::isinf(round_bf16(std::numeric_limits<float>::max())));  // beyond bf16's largest
  CHECK(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low 16 bits must not turn into an infinity.
  float nan_low = 0;
  const uint32_t u = 0x7f800001u;
  std::memcpy(&nan_low, &u, sizeof(u));
  CHECK(std::isnan(round_bf16(nan_low)));
  // Idempotent: a bf16 value rounds to itself.
  Rng rng(3);
  for (float x : random_vec(rng, 1000, -50, 50)) CHECK(round_bf16(round_bf16(x)) == round_bf16(x));
}

TEST_CASE("bf16 GEMM is the fp32 GEMM of bf16-rounded operands", "[bf16]") {
  Rng rng(11);
  const int64_t m = 37, n = 29, k = 70;
  const auto A = random_vec(rng, m * k), B = random_vec(rng, k * n), C0 = random_vec(rng, m * n);
  auto f32 = make_cpu_device({1, CpuConv::im2col, false});
  auto bf = make_cpu_device({1, CpuConv::im2col, true});
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      auto c_bf = C0, c_ref = C0, c_f32 = C0;
      bf->gemm(ta, tb, m, n, k, 0.7f, A.data(), ta ? m : k, B.data(), tb ? k : n, 0.3f,
               c_bf.data(), n);
      const auto Ar = rounded(A), Br = rounded(B);
      f32->gemm(ta, tb, m, n, k, 0.7f, Ar.data(), ta ? m : k, Br.data(), tb ? k : n, 0.3f,
                c_ref.data(), n);
      f32->gemm(ta, tb, m, n, k, 0.7f, A.data(), ta ? m : k, B.data(), tb ? k : n, 0.3f,
                c_f32.data(), n);
      CHECK(c_bf == c_ref);
      // And it is not fp32: bf16 operands move the result by about 2^-9 relative.
      const double e = rel_error(c_bf, c_f32);
      CHECK(e > 1e-5);
      CHECK(e < 2e-2);
    }
}

TEST_CASE("bf16 convolutions round operands and outputs as cuDNN's bf16 configuration", "[bf16][conv]") {
  const ConvGeom g{3, 9, 7, 4, 3, 1, 1};
  const int64_t n = 5;
  const auto in = static_cast<size_t>(n * g.c * g.h * g.w);
  const auto out = static_cast<size_t>(n * g.oc * g.ho() * g.wo());
  const auto nw = static_cast<size_t>(g.oc * g.c * g.k * g.k);
  const auto p = g.ho() * g.wo();
  Rng rng(4);
  const auto x = random_vec(rng, in), w = random_vec(rng, nw), b = random_vec(rng, g.oc),
             dy = random_vec(rng, out), dw0 = random_vec(rng, nw), db0 = random_vec(rng, g.oc);
  for (auto conv : {CpuConv::im2col, CpuConv::onednn}) {
    if (conv == CpuConv::onednn && !have_onednn()) continue;
    INFO("conv " << to_string(conv));
    auto f32 = make_cpu_device({1, conv, false});
    auto bf = make_cpu_device({1, conv, true});
    // bf16 device
    std::vector<float> y(out), dx(in), dw = dw0, db = db0;
    bf->conv_forward(g, n, x.data(), w.data(), b.data(), y.data());
    bf->conv_backward(g, n, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data());
    // the same from fp32 operations on rounded tensors
    const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
    const std::vector<float> zero_b(static_cast<size_t>(g.oc), 0.f);
    std::vector<float> ry(out), rdx(in), tdw(nw, 0.f), tdb(static_cast<size_t>(g.oc), 0.f);
    f32->conv_forward(g, n, xr.data(), wr.data(), zero_b.data(), ry.data());
    ry = rounded(ry);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t o = 0; o < g.oc; ++o)
        for (int64_t i = 0; i < p; ++i) ry[static_cast<size_t>((s * g.oc + o) * p + i)] += b[o];
    f32->conv_backward(g, n, xr.data(), wr.data(), dyr.data(), tdw.data(), tdb.data(), rdx.data());
    rdx = rounded(rdx);
    auto rdw = dw0;
    for (size_t i = 0; i < nw; ++i) rdw[i] += round_bf16(tdw[i]);
    auto rdb = db0;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t o = 0; o < g.oc; ++o)
        for (int64_t i = 0; i < p; ++i) rdb[o] += dy[static_cast<size_t>((s * g.oc + o) * p + i)];
    CHECK(y == ry);
    CHECK(dx == rdx);
    CHECK(dw == rdw);
    CHECK(rel_error(db, rdb) < 1e-6);  // the fp32 bias gradient; summation order may differ
    // Every output and gradient of the convolution is a bf16 value.
    for (float v : dx) CHECK(round_bf16(v) == v);
  }
}

TEST_CASE("bf16 training on the CPU learns like fp32 and is not fp32", "[bf16][train]") {
  Config c = test::synthetic_config(2, 32);
  c.train.epochs = 3;
  c.optimizer.lr = 0.1;
  const TrainResult f32 = test::run_config(c);
  c.precision = Precision::bf16;
  const TrainResult bf = test::run_config(c);
  REQUIRE(bf.epochs.size() == 3);
  INFO("fp32 " << f32.epochs.back().test_acc << " bf16 " << bf.epochs.back().test_acc);
  CHECK(std::abs(bf.epochs.back().test_acc - f32.epochs.back().test_acc) < 0.03);
  CHECK(bf.epochs.back().test_acc > 0.6);
  CHECK(bf.step_losses != f32.step_losses);
  CHECK(bf.info.precision == "bf16");
  CHECK(bf.info.devices.find("bf16 emulated") != std::string::npos);
}
