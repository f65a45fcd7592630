#pragma once
// The per-element arithmetic of the compute operations, shared by the CPU backend's loops and
// the CUDA backend's kernels (as hash.hpp and bf16.hpp share random numbers and rounding): each
// twin is written once here, so the two backends differ in how they split and sum the work,
// never in what one element computes.
//
// Each side compiles these expressions as it always has: the host compiler with
// -ffp-contract=off (lib/CMakeLists.txt), which never contracts a * b + c into a fused
// multiply-add, whatever instruction set a loop is built for (the CPU results are the reference
// the tests pin), and nvcc for the device, which does by default. Keep every
// expression's operation order, its float and double types and its casts as they are: a
// rewrite that is equal on paper may round differently on one side.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dtrain/base/hash.hpp"  // DTRAIN_HD

namespace dtrain::math {

// ---- arithmetic on two tensors ----

// a * b rounded to float before anything adds to it, on both sides: where an exact product
// fused into the next add would leave a rounding residue that the host's exact cancellation
// does not (LayerNorm's dx of a vector of one feature is exactly 0 on the host).
DTRAIN_HD inline float rounded_product(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DTRAIN_HD inline float plus(float a, float b) {
  return a + b;
}
DTRAIN_HD inline float times(float a, float b) {
  return a * b;
}

// ---- activations: forward from the input, backward from dy and the input or output ----

DTRAIN_HD inline float relu(float x) {
  return x > 0.f ? x : 0.f;
}
DTRAIN_HD inline float tanh(float x) {
  return ::tanhf(x);
}
DTRAIN_HD inline float sigmoid(float x) {
  return 1.f / (1.f + ::expf(-x));
}
// e^x without libm, so that the CPU's loops over it vectorise (glibc's scalar tanhf took a
// third of a GPT step in GELU): Cody and Waite's reduction x = n ln 2 + r and the Cephes
// library's degree-6 polynomial for e^r, x clamped to [-87, 88]; relative error about 2e-7.
DTRAIN_HD inline float exp_poly(float x) {
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  // n = x log2(e) rounded half away from zero, by truncation (floorf is a libm call, which no
  // loop vectorises, on CPUs without SSE4.1's rounding instruction).
  const float t = x * 1.44269504088896341f;
  const int32_t ni = static_cast<int32_t>(t + (t >= 0.f ? 0.5f : -0.5f));
  const auto n = static_cast<float>(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (ni + 127) * (1 << 23);  // 2^n
  float two_n = 0.f;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}
// tanh(u) = 1 - 2 / (e^(2u) + 1): absolute error about 2e-7 (what GELU's 1 + tanh needs;
// not a relative-error tanh near 0).
DTRAIN_HD inline float tanh_poly(float u) {
  return 1.f - 2.f / (exp_poly(2.f * u) + 1.f);
}

// GELU, tanh approximation (Hendrycks and Gimpel 2016), as GPT-2 and llm.c use.
DTRAIN_HD inline float gelu(float x) {
  constexpr float k = 0.7978845608028654f;  // ::sqrt(2/pi)
  return 0.5f * x * (1.f + tanh_poly(k * (x + 0.044715f * x * x * x)));
}
DTRAIN_HD inline float gelu_grad(float x) {
  constexpr float k = 0.7978845608028654f;
  const float u = k * (x + 0.044715f * x * x * x);
  const float t = tanh_poly(u);
  const float du = k * (1.f + 3.f * 0.044715f * x * x);
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
}
// A ReLU fused after another map (BatchNorm, a residual sum) runs backward from its output y,
// which is positive exactly where its input is: relu_backward(y, dy) gives the bits of
// relu_backward(x, dy).
DTRAIN_HD inline float relu_backward(float x, float dy) {
  return x > 0.f ? dy : 0.f;
}
DTRAIN_HD inline float add_relu(float a, float b) {
  return relu(a + b);
}
DTRAIN_HD inline float tanh_backward(float y, float dy) {
  return dy * (1.f - y * y);
}
DTRAIN_HD inline float sigmoid_backward(float y, float dy) {
  return dy * y * (1.f - y);
}
DTRAIN_HD inline float gelu_backward(float x, float dy) {
  return dy * gelu_grad(x);
}

// ---- softmax cross-entropy ----

struct XentRow {
  double loss = 0;   // -sum t log softmax(z), t the target (below)
  bool hit = false;  // the first maximum of z is at y
};
// One row z of `classes` logits with label y, in double: the maximum and its (first) position,
// log-sum-exp, the loss, and, where d is non-null, d = grad_scale * (softmax(z) - t). The target
// t is onehot(y), or with label smoothing eps > 0, (1 - eps) onehot(y) + eps / classes.
// The loss is read before d is written, so d may be z itself.
DTRAIN_HD inline XentRow softmax_xent_row(const float* z, int32_t y, int64_t classes,
                                          float grad_scale, float* d, double eps = 0.0) {
  float mx = z[0];
  int64_t arg = 0;
  for (int64_t c = 1; c < classes; ++c)
    if (z[c] > mx) {
      mx = z[c];
      arg = c;
    }
  double sum = 0.0;
  for (int64_t c = 0; c < classes; ++c) sum += ::exp(static_cast<double>(z[c] - mx));
  const double log_sum = ::log(sum);
  XentRow row;
  row.loss = log_sum - static_cast<double>(z[y] - mx);
  row.hit = arg == y;
  // eps = 0 keeps the one-hot arithmetic exactly: no smoothing, the bits as before.
  const double off = eps / static_cast<double>(classes), on = 1.0 - eps + off;
  if (eps > 0.0) {
    double mean_shifted = 0.0;  // the mean of z - max
    for (int64_t c = 0; c < classes; ++c) mean_shifted += static_cast<double>(z[c] - mx);
    mean_shifted /= static_cast<double>(classes);
    row.loss = log_sum - (1.0 - eps) * static_cast<double>(z[y] - mx) - eps * mean_shifted;
  }
  if (d) {
    for (int64_t c = 0; c < classes; ++c) {
      const double p = ::exp(static_cast<double>(z[c] - mx) - log_sum);
      const double t = eps > 0.0 ? (c == y ? on : off) : (c == y ? 1.0 : 0.0);
      d[c] = grad_scale * static_cast<float>(p - t);
    }
  }
  return row;
}

// ---- transformer: token ids, LayerNorm ----

// A token id stored as a float (exact below 2^24), clamped into [0, vocab): loaders refuse ids
// outside the vocabulary, and the clamp keeps a damaged value from reading outside the table.
DTRAIN_HD inline int64_t token_id(float v, int64_t vocab) {
  if (!(v < static_cast<float>(vocab))) return vocab - 1;  // also +inf and NaN: no cast of those
  const auto id = static_cast<int64_t>(v >= 0.f ? v : 0.f);
  return id < vocab ? id : vocab - 1;
}

struct LnStats {
  float mean, rstd;
};
// LayerNorm's sums over one vector of c features run in 8 interleaved double lanes (lane k adds
// the terms i = k mod 8 in order), then the lanes in order and the remainder: a fixed order,
// which a CPU loop vectorises without reassociating anything (one running double sum is a chain
// of dependent additions: 2% of a GPT step in LayerNorm's statistics alone). The CUDA twin sums
// across a warp instead (kernels/layernorm.cuh).
inline constexpr int kLnLanes = 8;
DTRAIN_HD inline double lanes_total(const double* lane) {
  double t = 0.0;
  for (int k = 0; k < kLnLanes; ++k) t += lane[k];
  return t;
}
// The mean and 1/sqrt(variance + eps) of one vector of c features (biased variance, as
// PyTorch's LayerNorm), summed in double.
DTRAIN_HD inline LnStats layernorm_stats(const float* x, int64_t c, float eps) {
  double lane[kLnLanes] = {};
  int64_t i = 0;
  for (; i + kLnLanes <= c; i += kLnLanes)
    for (int k = 0; k < kLnLanes; ++k) lane[k] += static_cast<double>(x[i + k]);
  double s = lanes_total(lane);
  for (; i < c; ++i) s += static_cast<double>(x[i]);
  const double mean = s / static_cast<double>(c);
  double sq[kLnLanes] = {};
  for (i = 0; i + kLnLanes <= c; i += kLnLanes)
    for (int k = 0; k < kLnLanes; ++k) {
      const double d = static_cast<double>(x[i + k]) - mean;
      sq[k] += d * d;
    }
  double v = lanes_total(sq);
  for (; i < c; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    v += d * d;
  }
  const double var = v / static_cast<double>(c);
  return {static_cast<float>(mean),
          static_cast<float>(1.0 / ::sqrt(var + static_cast<double>(eps)))};
}
DTRAIN_HD inline float layernorm_one(float x, float mean, float rstd, float gamma, float beta) {
  return (x - mean) * rstd * gamma + beta;
}
// Backward of one vector: with g = dy * gamma and xhat the normalised input,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); the two means in double.
struct LnBackMeans {
  float g, gx;
};
DTRAIN_HD inline LnBackMeans layernorm_back_means(const float* x, const float* dy,
                                                  const float* gamma, int64_t c, float mean,
                                                  float rstd) {
  double la[kLnLanes] = {}, lb[kLnLanes] = {};
  int64_t i = 0;
  for (; i + kLnLanes <= c; i += kLnLanes)
    for (int k = 0; k < kLnLanes; ++k) {
      const double g = static_cast<double>(dy[i + k] * gamma[i + k]);
      la[k] += g;
      lb[k] += g * static_cast<double>((x[i + k] - mean) * rstd);
    }
  double a = lanes_total(la), b = lanes_total(lb);
  for (; i < c; ++i) {
    const double g = static_cast<double>(dy[i] * gamma[i]);
    a += g;
    b += g * static_cast<double>((x[i] - mean) * rstd);
  }
  return {static_cast<float>(a / static_cast<double>(c)),
          static_cast<float>(b / static_cast<double>(c))};
}
DTRAIN_HD inline float layernorm_dx_one(float x, float dy, float gamma, float mean, float rstd,
                                        const LnBackMeans& m) {
  const float xhat = (x - mean) * rstd;
  return rstd * (rounded_product(dy, gamma) - m.g - rounded_product(xhat, m.gx));
}

// ---- max pooling ----

struct PoolMax {
  float value = 0;
  int64_t index = 0;  // in the plane
};
// Outputs along one side of a pooling window sweep: n inputs, window k, stride, padding pad.
DTRAIN_HD inline int64_t pool_out(int64_t n, int64_t k, int64_t stride, int64_t pad) {
  return (n + 2 * pad - k) / stride + 1;
}

// The outputs along one side whose windows cover padded position ii (an input position plus
// pad): [lo, hi], empty (lo > hi) where a stride wider than the window skips ii. A template so
// that a GPU kernel can do its division in 32 bits where the sizes allow.
template <class I>
struct PoolCover {
  I lo, hi;
};
template <class I>
DTRAIN_HD inline PoolCover<I> pool_cover(I ii, I k, I stride, I out) {
  if (out <= I(0)) return {I(1), I(0)};  // no outputs: empty (and no unsigned out - 1)
  const I lo = ii >= k ? (ii - k) / stride + 1 : I(0);
  const I hi = ii / stride < out - 1 ? ii / stride : out - 1;
  return {lo, hi};
}

// The maximum of the k x k window of output (oi, oj) over an h x w plane, the window starting
// `pad` before the plane (positions outside it are skipped, as PyTorch's -inf padding does;
// pad < k keeps at least one inside): the first maximum in row-major window order wins.
// Selects, not branches: ReLU outputs are often tied at zero, which makes branches
// unpredictable.
DTRAIN_HD inline PoolMax maxpool_window(const float* plane, int64_t h, int64_t w, int64_t k,
                                        int64_t stride, int64_t pad, int64_t oi, int64_t oj) {
  const int64_t i0 = oi * stride - pad, j0 = oj * stride - pad;
  const int64_t ia = i0 > 0 ? i0 : 0, ja = j0 > 0 ? j0 : 0;
  const int64_t ib = i0 + k < h ? i0 + k : h, jb = j0 + k < w ? j0 + k : w;
  int64_t best = ia * w + ja;
  float bv = plane[best];
  for (int64_t i = ia; i < ib; ++i)
    for (int64_t j = ja; j < jb; ++j) {
      const int64_t idx = i * w + j;
      const float v = plane[idx];
      const bool gt = v > bv;
      bv = gt ? v : bv;
      best = gt ? idx : best;
    }
  return {bv, best};
}

// ---- per-channel sums on a GPU ----
// A channel's `count` values (samples x positions) are summed in `parts` runs of `chunk`
// consecutive values, one block a run, then the runs' sums in order: the GPU's kernels fill it
// even for a few channels, and the order depends on the shapes alone (the same bits on every
// call). The runs' partial sums, two per run and channel, take at most kChannelScratch doubles
// (or 2c, where a run a channel needs more).
constexpr int64_t kChannelChunk = 4096, kChannelParts = 64, kChannelScratch = int64_t(1) << 17;
struct ChannelSplit {
  int64_t parts, chunk;
};
DTRAIN_HD inline ChannelSplit channel_split(int64_t count, int64_t c) {
  int64_t parts = (count + kChannelChunk - 1) / kChannelChunk;
  const int64_t room = c > 0 ? kChannelScratch / (2 * c) : kChannelParts;
  parts = parts < kChannelParts ? parts : kChannelParts;
  parts = parts < room ? parts : room;
  parts = parts > 1 ? parts : 1;
  return {parts, count > 0 ? (count + parts - 1) / parts : 1};
}
DTRAIN_HD inline int64_t channel_scratch_size(int64_t c) {
  return 2 * c > kChannelScratch ? 2 * c : kChannelScratch;
}

// ---- BatchNorm ----
// `stats` is [mean (c), inv_std (c)], `running` [mean (c), var (c)], moments and sums
// [first (c), second (c)].

// The statistics of channel ch: from its moments over `count` values (training), with the
// running statistics moved towards them by `momentum` (unbiased variance, as PyTorch), or from
// the running statistics (evaluation: moments null).
DTRAIN_HD inline void bn_prepare_channel(const double* moments, double count, double eps,
                                         double momentum, float* running, float* stats, int64_t c,
                                         int64_t ch) {
  if (!moments) {
    stats[ch] = running[ch];
    const auto var = static_cast<double>(running[c + ch]);
    stats[c + ch] = static_cast<float>(1.0 / ::sqrt(var + eps));
    return;
  }
  const double mean = moments[ch] / count;
  const double d = moments[c + ch] / count - mean * mean;
  const double var = 0.0 < d ? d : 0.0;  // max(0, d); NaN gives 0
  stats[ch] = static_cast<float>(mean);
  stats[c + ch] = static_cast<float>(1.0 / ::sqrt(var + eps));
  const double unbiased = count > 1 ? var * count / (count - 1) : var;
  running[ch] = static_cast<float>((1 - momentum) * running[ch] + momentum * mean);
  running[c + ch] = static_cast<float>((1 - momentum) * running[c + ch] + momentum * unbiased);
}

// y = gamma * (x - mean) * inv_std + beta as y = a * x + b, a and b per channel.
struct BnAffine {
  float a, b;
};
DTRAIN_HD inline BnAffine bn_affine(float gamma, float beta, float mean, float inv_std) {
  const float a = gamma * inv_std;
  return {a, beta - a * mean};
}
DTRAIN_HD inline float bn_apply_one(const BnAffine& t, float x) {
  return t.a * x + t.b;
}
DTRAIN_HD inline float bn_apply_relu_one(const BnAffine& t, float x) {
  return relu(bn_apply_one(t, x));
}
// A residual block's end: its last BatchNorm's output plus the shortcut's s, and its ReLU.
DTRAIN_HD inline float bn_apply_add_one(const BnAffine& t, float x, float s) {
  return bn_apply_one(t, x) + s;
}
DTRAIN_HD inline float bn_apply_add_relu_one(const BnAffine& t, float x, float s) {
  return relu(bn_apply_add_one(t, x, s));
}

// The normalised input.
DTRAIN_HD inline float bn_xhat(float x, float mean, float inv_std) {
  return (x - mean) * inv_std;
}
// Channel ch's totals of the backward pass, t1 = sum(dy) and t2 = sum(dy * xhat): dbeta and
// dgamma accumulate them, sums = [t1, t2] * gamma.
DTRAIN_HD inline void bn_backward_totals(double t1, double t2, const float* gamma, int64_t c,
                                         int64_t ch, double* sums, float* dgamma, float* dbeta) {
  dbeta[ch] += static_cast<float>(t1);
  dgamma[ch] += static_cast<float>(t2);
  sums[ch] = t1 * gamma[ch];
  sums[c + ch] = t2 * gamma[ch];
}

// dx = k * (m * gamma * dy - s1 - xhat * s2), k = inv_std / m, as dx = a * dy + bx * x + c0 in
// float, the coefficients per channel in double (m: the (global) element count).
struct BnDx {
  float a, bx, c0;
};
DTRAIN_HD inline BnDx bn_dx_coeffs(float mean, float inv_std, float gamma, double s1, double s2,
                                   double m) {
  const double is = inv_std, kk = is / m;
  BnDx t;
  t.a = static_cast<float>(kk * m * gamma);
  t.bx = static_cast<float>(-kk * s2 * is);
  t.c0 = static_cast<float>(kk * (-s1 + double(mean) * is * s2));
  return t;
}
DTRAIN_HD inline float bn_dx_one(const BnDx& t, float dy, float x) {
  return t.a * dy + t.bx * x + t.c0;
}

// ---- dropout ----

// The kept elements' scale, 1/(1-p).
DTRAIN_HD inline float dropout_keep(double p) {
  return static_cast<float>(1.0 / (1.0 - p));
}

// ---- gradient clipping ----

// The factor that scales gradients of squared norm `sumsq` to a norm of at most max_norm:
// max_norm / (norm + 1e-6) where the norm is above max_norm, else 1 (PyTorch's
// clip_grad_norm_).
DTRAIN_HD inline float clip_factor(double sumsq, float max_norm) {
  const double norm = ::sqrt(sumsq);
  return norm > static_cast<double>(max_norm)
             ? static_cast<float>(static_cast<double>(max_norm) / (norm + 1e-6))
             : 1.f;
}

// ---- the ordered sum of replicas that share weights (Device::fold) ----

// One replica's turn: its gradient added to the sum of the ranks before it (or the sum's
// start, for the first), times `scale` (1, or 1/p on the last rank of a mean; times 1 is exact).
// Per element the in-process all-reduce's arithmetic: b0 + b1 + ... + b(p-1), then x 1/p.
DTRAIN_HD inline float fold(float acc, float x, bool first, float scale) {
  return (first ? x : acc + x) * scale;
}

// ---- optimizers ----

// PyTorch's SGD semantics: coupled weight decay, momentum buffer without dampening.
DTRAIN_HD inline void sgd_step(float& p, float g, float& buf, float lr, float momentum, float wd,
                               bool nesterov) {
  float d = g + wd * p;
  if (momentum != 0.f) {
    buf = momentum * buf + d;
    d = nesterov ? d + momentum * buf : buf;
  }
  p -= lr * d;
}

// Adam's per-step factors: the learning rate and the bias corrections of step `step` (from 1).
struct AdamFactors {
  float lr, bc1, bc2_sqrt;
};
inline AdamFactors adam_factors(float lr, float b1, float b2, int64_t step) {
  const float bc1 = 1.f - std::pow(b1, static_cast<float>(step));
  const float bc2 = 1.f - std::pow(b2, static_cast<float>(step));
  return {lr, bc1, std::sqrt(bc2)};
}
// `decoupled`: AdamW (Loshchilov and Hutter 2019), else Adam with an L2 penalty.
DTRAIN_HD inline void adam_step(float& p, float g, float& m, float& v, const AdamFactors& f,
                                float b1, float b2, float eps, float wd, bool decoupled) {
  float d = g;
  if (decoupled)
    p *= 1.f - f.lr * wd;
  else
    d += wd * p;
  m = b1 * m + (1.f - b1) * d;
  v = b2 * v + (1.f - b2) * d * d;
  const float denom = ::sqrtf(v) / f.bc2_sqrt + eps;
  p -= (f.lr / f.bc1) * m / denom;
}

}  // namespace dtrain::math
