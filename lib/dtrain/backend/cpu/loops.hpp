#pragma once
// The CPU backend's elementwise loops, each compiled for three instruction sets and picked
// when the program loads: x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the x86-64 baseline
// (SSE2), which is all a default build may assume. Without this, the default build ran GELU's
// polynomial four floats at a time on a machine with AVX-512: 12% of a GPT step, against 2.5%
// with -march=native (perf record on the GPT of results/bench/gpt-vs-pytorch.md).
//
// The same bits from every clone: dtrain builds with -ffp-contract=off (lib/CMakeLists.txt), so
// no clone fuses a * b + c, and a clone holds no reduction whose order depends on the vector
// width: its sums run in a fixed order written out in the source (math.hpp's LayerNorm lanes, a
// softmax row's running sum), never under `omp simd reduction`. Loops with such reductions
// (BatchNorm's moments) stay in the baseline build, so that their sums do not depend on the
// machine's instruction set.
//
// A clone is a leaf: the OpenMP team splits the work and each thread calls a clone on its part
// (GCC outlines a parallel region into a function of its own, which a clone would not cover).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dtrain/backend/math.hpp"

// GCC 12 and later name the x86-64 levels in target_clones.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && \
    !defined(DTRAIN_NATIVE)
#define DTRAIN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DTRAIN_CPU_CLONES  // clang, other CPUs and -march=native builds: one version
#endif

namespace dtrain::cpu {

// Loops below this many elements stay on the calling thread: a parallel region costs a few
// microseconds.
inline constexpr int64_t kParallelMin = 1 << 15;

// The threads for `work` elements: all of `threads` from kParallelMin on, else the caller's.
inline int team(int threads, int64_t work) {
  return work >= kParallelMin ? std::max(1, threads) : 1;
}

// body(lo, hi) on each thread of a team of up to `threads` (team(threads, work)) for contiguous
// shares of [0, items), the first threads' one longer where they do not divide evenly; on the
// calling thread alone below kParallelMin. The shares follow the team OpenMP gives (OMP_DYNAMIC
// or a thread limit may give fewer threads than asked), so every item is covered.
template <class Body>
void split_parts(int threads, int64_t work, int64_t items, Body&& body) {
  const int nt = team(threads, work);
  if (nt == 1) {
    body(int64_t{0}, items);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t team = omp_get_num_threads(), k = omp_get_thread_num();
    const int64_t q = items / team, r = items % team;
    const int64_t lo = k * q + std::min(k, r);
    body(lo, lo + q + (k < r ? 1 : 0));
  }
}

// split_parts of [0, len) in runs of 16 floats: every part but the last a multiple of 16 long.
template <class Body>
void split(int threads, int64_t len, Body&& body) {
  split_parts(threads, len, (len + 15) / 16, [&](int64_t lo, int64_t hi) {
    body(std::min(len, lo * 16), std::min(len, hi * 16));
  });
}

// dst[i] = F(a[i]).
template <float (*F)(float)>
DTRAIN_CPU_CLONES void map(const float* a, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F(a[i]);
}

// dst[i] = F(a[i], b[i]). b is loaded unconditionally (an argument), so a select in F still
// vectorises.
template <float (*F)(float, float)>
DTRAIN_CPU_CLONES void map(const float* a, const float* b, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F(a[i], b[i]);
}

// y[i] = x[i] * s (scaling, clipping).
DTRAIN_CPU_CLONES inline void scale_into(const float* x, float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

// row[i] += bias[i].
DTRAIN_CPU_CLONES inline void add_row(float* row, const float* bias, int64_t n) {
  for (int64_t i = 0; i < n; ++i) row[i] += bias[i];
}

// One Adam(W) step over n parameters (math::adam_step).
DTRAIN_CPU_CLONES inline void adam(float* p, const float* g, float* m, float* v, int64_t n,
                                   const math::AdamFactors& f, float b1, float b2, float eps,
                                   float wd, bool decoupled) {
  const math::AdamFactors k = f;  // a copy, which the stores cannot alias: kept in registers
  for (int64_t i = 0; i < n; ++i)
    math::adam_step(p[i], g[i], m[i], v[i], k, b1, b2, eps, wd, decoupled);
}

// One SGD step over n parameters (math::sgd_step).
DTRAIN_CPU_CLONES inline void sgd(float* p, const float* g, float* buf, int64_t n, float lr,
                                  float momentum, float wd, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) math::sgd_step(p[i], g[i], buf[i], lr, momentum, wd, nesterov);
}

// BatchNorm's affine map of one channel's positions, forward, and its dx backward.
DTRAIN_CPU_CLONES inline void bn_apply_row(const math::BnAffine& t, const float* x, float* y,
                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = math::bn_apply_one(t, x[i]);
}
DTRAIN_CPU_CLONES inline void bn_apply_relu_row(const math::BnAffine& t, const float* x, float* y,
                                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = math::bn_apply_relu_one(t, x[i]);
}
template <bool Relu>
DTRAIN_CPU_CLONES inline void bn_apply_add_row(const math::BnAffine& t, const float* x,
                                               const float* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] =
        Relu ? math::bn_apply_add_relu_one(t, x[i], s[i]) : math::bn_apply_add_one(t, x[i], s[i]);
}
DTRAIN_CPU_CLONES inline void bn_dx_row(const math::BnDx& t, const float* dy, const float* x,
                                        float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = math::bn_dx_one(t, dy[i], x[i]);
}

// BatchNorm on maps in channel blocks of B (8 or 16; Device::conv_out_block): a tile is one
// sample's B channels of a block, position i's B values side by side (x[i * B + j]: channel j of
// the tile). Every tensor of the tile is in that layout. The loops are written on vectors of B
// floats, a channel a lane, so that each lane computes math.hpp's formula for its channel and
// each channel's sums run over its positions in order: the same bits in every clone (the
// compiler splits a vector wider than the machine's into halves or quarters).
//
// B floats as one vector, copied in and out with memcpy (any alignment; the compiler makes it
// one unaligned load or store): no function takes or returns a vector by value, so no clone's
// calling convention depends on its width.
template <int B>
struct BnLanes {
  typedef float V __attribute__((vector_size(B * sizeof(float))));
  [[gnu::always_inline]] static void load(V& v, const float* p) { std::memcpy(&v, p, sizeof v); }
  [[gnu::always_inline]] static void store(float* p, const V& v) { std::memcpy(p, &v, sizeof v); }
};

template <int B>
[[gnu::always_inline]] inline void bn_tile_moments(const float* x, int64_t spatial, float* a,
                                                   float* q) {
  using L = BnLanes<B>;
  typename L::V sa{}, sq{}, v;
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(v, x + i * B);
    sa += v;
    sq += v * v;
  }
  L::store(a, sa);
  L::store(q, sq);
}
template <int B, bool Relu>
[[gnu::always_inline]] inline void bn_tile_apply(const math::BnAffine* t, const float* x,
                                                 int64_t spatial, float* y) {
  using L = BnLanes<B>;
  typename L::V a, b, v, r, zero{};
  for (int j = 0; j < B; ++j) a[j] = t[j].a, b[j] = t[j].b;
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(v, x + i * B);
    r = a * v + b;  // math::bn_apply_one
    if constexpr (Relu) r = r > zero ? r : zero;  // math::relu
    L::store(y + i * B, r);
  }
}
// y = [relu](BatchNorm(x) + s) (math::bn_apply_add_one).
template <int B, bool Relu>
[[gnu::always_inline]] inline void bn_tile_apply_add(const math::BnAffine* t, const float* x,
                                                     const float* s, int64_t spatial, float* y) {
  using L = BnLanes<B>;
  typename L::V a, b, v, w, r, zero{};
  for (int j = 0; j < B; ++j) a[j] = t[j].a, b[j] = t[j].b;
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(v, x + i * B);
    L::load(w, s + i * B);
    r = a * v + b;  // math::bn_apply_one
    r = r + w;
    if constexpr (Relu) r = r > zero ? r : zero;  // math::relu
    L::store(y + i * B, r);
  }
}
template <int B>
[[gnu::always_inline]] inline void bn_tile_sums(const float* x, const float* dy,
                                                const float* mean, const float* inv_std,
                                                int64_t spatial, float* t1, float* t2) {
  using L = BnLanes<B>;
  typename L::V m, is, s1{}, s2{}, g, v;
  L::load(m, mean);
  L::load(is, inv_std);
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(g, dy + i * B);
    L::load(v, x + i * B);
    s1 += g;
    s2 += g * ((v - m) * is);  // math::bn_xhat
  }
  L::store(t1, s1);
  L::store(t2, s2);
}
// bn_tile_sums of g = dy where relu_y > 0, else 0 (math::relu_backward), g stored to `masked`.
template <int B>
[[gnu::always_inline]] inline void bn_tile_sums_masked(const float* x, const float* dy,
                                                       const float* relu_y, const float* mean,
                                                       const float* inv_std, int64_t spatial,
                                                       float* masked, float* t1, float* t2) {
  using L = BnLanes<B>;
  typename L::V m, is, s1{}, s2{}, g, v, y, zero{};
  L::load(m, mean);
  L::load(is, inv_std);
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(g, dy + i * B);
    L::load(y, relu_y + i * B);
    L::load(v, x + i * B);
    g = y > zero ? g : zero;
    L::store(masked + i * B, g);
    s1 += g;
    s2 += g * ((v - m) * is);  // math::bn_xhat
  }
  L::store(t1, s1);
  L::store(t2, s2);
}
template <int B>
[[gnu::always_inline]] inline void bn_tile_dx(const math::BnDx* t, const float* dy, const float* x,
                                              int64_t spatial, float* dx) {
  using L = BnLanes<B>;
  typename L::V a, bx, c0, g, v;
  for (int j = 0; j < B; ++j) a[j] = t[j].a, bx[j] = t[j].bx, c0[j] = t[j].c0;
  for (int64_t i = 0; i < spatial; ++i) {
    L::load(g, dy + i * B);
    L::load(v, x + i * B);
    L::store(dx + i * B, a * g + bx * v + c0);  // math::bn_dx_one
  }
}

// The tile loops above for b = 8 or 16 channels a block, each compiled per instruction set.
DTRAIN_CPU_CLONES inline void bn_block_moments(const float* x, int64_t b, int64_t spatial,
                                               float* a, float* q) {
  b == 16 ? bn_tile_moments<16>(x, spatial, a, q) : bn_tile_moments<8>(x, spatial, a, q);
}
DTRAIN_CPU_CLONES inline void bn_block_apply(const math::BnAffine* t, const float* x, int64_t b,
                                             int64_t spatial, float* y, bool relu) {
  if (relu)
    b == 16 ? bn_tile_apply<16, true>(t, x, spatial, y) : bn_tile_apply<8, true>(t, x, spatial, y);
  else
    b == 16 ? bn_tile_apply<16, false>(t, x, spatial, y)
            : bn_tile_apply<8, false>(t, x, spatial, y);
}
DTRAIN_CPU_CLONES inline void bn_block_sums(const float* x, const float* dy, const float* mean,
                                            const float* inv_std, int64_t b, int64_t spatial,
                                            float* t1, float* t2) {
  b == 16 ? bn_tile_sums<16>(x, dy, mean, inv_std, spatial, t1, t2)
          : bn_tile_sums<8>(x, dy, mean, inv_std, spatial, t1, t2);
}
DTRAIN_CPU_CLONES inline void bn_block_apply_add(const math::BnAffine* t, const float* x,
                                                 const float* s, int64_t b, int64_t spatial,
                                                 float* y, bool relu) {
  if (relu)
    b == 16 ? bn_tile_apply_add<16, true>(t, x, s, spatial, y)
            : bn_tile_apply_add<8, true>(t, x, s, spatial, y);
  else
    b == 16 ? bn_tile_apply_add<16, false>(t, x, s, spatial, y)
            : bn_tile_apply_add<8, false>(t, x, s, spatial, y);
}
DTRAIN_CPU_CLONES inline void bn_block_sums_masked(const float* x, const float* dy,
                                                   const float* relu_y, const float* mean,
                                                   const float* inv_std, int64_t b, int64_t spatial,
                                                   float* masked, float* t1, float* t2) {
  b == 16 ? bn_tile_sums_masked<16>(x, dy, relu_y, mean, inv_std, spatial, masked, t1, t2)
          : bn_tile_sums_masked<8>(x, dy, relu_y, mean, inv_std, spatial, masked, t1, t2);
}
DTRAIN_CPU_CLONES inline void bn_block_dx(const math::BnDx* t, const float* dy, const float* x,
                                          int64_t b, int64_t spatial, float* dx) {
  b == 16 ? bn_tile_dx<16>(t, dy, x, spatial, dx) : bn_tile_dx<8>(t, dy, x, spatial, dx);
}

}  // namespace dtrain::cpu
