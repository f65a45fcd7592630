#pragma once
// Deterministic random numbers with results fixed by this file alone (std:: distributions are
// implementation-defined, so runs would differ between standard libraries).
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace dtrain {

__extension__ typedef unsigned __int128 uint128_t;

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Derive an independent stream key from a seed and up to three labels (epoch, rank, purpose).
inline uint64_t stream_key(uint64_t seed, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  uint64_t s = seed;
  uint64_t k = splitmix64(s);
  s = k ^ (a * 0xD6E8FEB86659FD93ull);
  k = splitmix64(s);
  s = k ^ (b * 0xA0761D6478BD642Full);
  k = splitmix64(s);
  s = k ^ (c * 0xE7037ED1A0B428DBull);
  return splitmix64(s);
}

// xoshiro256** (Blackman and Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t s = seed;
    for (auto& w : s_) w = splitmix64(s);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // The generator's whole state (a checkpoint's), and back.
  void get_state(uint64_t out[4]) const {
    for (int i = 0; i < 4; ++i) out[i] = s_[i];
  }
  void set_state(const uint64_t in[4]) {
    for (int i = 0; i < 4; ++i) s_[i] = in[i];
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), unbiased (Lemire's method with rejection).
  uint64_t below(uint64_t n) {
    uint128_t m = static_cast<uint128_t>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<uint128_t>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Standard normal via Box-Muller (one value per call; simple and reproducible).
  double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      const size_t j = below(i);
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace dtrain
