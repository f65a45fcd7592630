#pragma once
// Counter-based random numbers shared by the CPU and CUDA backends: value i of a stream depends
// only on (seed, i), so any backend and any thread layout draws the same numbers.
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

// Uniform in [0, 1) with 53 random bits.
DTRAIN_HD inline double counter_uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(mix64(seed ^ mix64(i)) >> 11) * 0x1.0p-53;
}

DTRAIN_HD inline float dropout_value(uint64_t seed, uint64_t i, double p, float keep) {
  return counter_uniform(seed, i) < p ? 0.f : keep;
}

}  // namespace dtrain
