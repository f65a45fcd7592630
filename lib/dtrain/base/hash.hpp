#pragma once
// Counter-based random numbers shared by the CPU and CUDA backends: value i of a stream depends
// only on (seed, i), so any backend and any thread layout draws the same numbers.
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

namespace dtrain {

// splitmix64's finaliser (Steele, Lea and Flood 2014).
DTRAIN_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a of a text: the same on every machine and build (std::hash need not be).
inline uint64_t text_hash(const char* text, size_t size) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < size; ++i)
    h = (h ^ static_cast<unsigned char>(text[i])) * 0x100000001b3ULL;
  return h;
}

// Uniform in [0, 1) with 53 random bits.
DTRAIN_HD inline double counter_uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(mix64(seed ^ mix64(i)) >> 11) * 0x1.0p-53;
}

DTRAIN_HD inline float dropout_value(uint64_t seed, uint64_t i, double p, float keep) {
  return counter_uniform(seed, i) < p ? 0.f : keep;
}

// Random crop (offsets in [-pad, pad]) and horizontal flip of sample n of a batch.
struct AugmentDraw {
  int64_t di = 0, dj = 0;
  bool flip = false;
};
DTRAIN_HD inline AugmentDraw augment_draw(uint64_t seed, int64_t n, int64_t pad, bool flip) {
  AugmentDraw a;
  const auto k = static_cast<uint64_t>(n) * 3;
  const auto span = static_cast<uint64_t>(2 * pad + 1);
  if (pad > 0) {
    a.di = static_cast<int64_t>(mix64(seed ^ mix64(k)) % span) - pad;
    a.dj = static_cast<int64_t>(mix64(seed ^ mix64(k + 1)) % span) - pad;
  }
  a.flip = flip && counter_uniform(seed, k + 2) < 0.5;
  return a;
}

// Index s of a row or column of length n mirrored at the edges without repeating them
// (reflect padding: -1 reads 1, n reads n - 2); valid for s in (-n, 2n - 1).
DTRAIN_HD inline int64_t reflect_index(int64_t s, int64_t n) {
  return s < 0 ? -s : s >= n ? 2 * (n - 1) - s : s;
}

// Output element (ch, i, j) of an augmented c x h x w sample reads this input element, or
// -1 for the zero padding. `reflect`: the padding mirrors the image (needs the offsets below h
// and w).
DTRAIN_HD inline int64_t augment_source(const AugmentDraw& a, int64_t ch, int64_t i, int64_t j,
                                        int64_t h, int64_t w, bool reflect) {
  int64_t si = i + a.di, sj = (a.flip ? w - 1 - j : j) + a.dj;
  if (reflect) {
    si = reflect_index(si, h);
    sj = reflect_index(sj, w);
  }
  return (si >= 0 && si < h && sj >= 0 && sj < w) ? (ch * h + si) * w + sj : -1;
}

}  // namespace dtrain
