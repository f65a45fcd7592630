#include "dtrain/data/sampler.hpp"

#include <numeric>

#include "dtrain/base/error.hpp"
#include "dtrain/base/rng.hpp"

namespace dtrain {

Sampler::Sampler(int64_t dataset_size, int64_t global_batch, int replicas, int accumulation_steps,
                 Shuffle shuffle, Sharding sharding, bool drop_remainder, uint64_t seed)
    : n_(dataset_size),
      global_batch_(global_batch),
      replicas_(replicas),
      accum_(accumulation_steps),
      shuffle_(shuffle),
      sharding_(sharding),
      drop_remainder_(drop_remainder),
      seed_(seed) {
  if (global_batch_ <= 0 || replicas_ <= 0 || accum_ <= 0)
    DTRAIN_THROW_SYSTEM("sampler: batch, replicas and accumulation steps must be positive");
}

int64_t Sampler::steps_per_epoch() const {
  return drop_remainder_ ? n_ / global_batch_ : (n_ + global_batch_ - 1) / global_batch_;
}

EpochPlan Sampler::plan(int epoch) const {
  EpochPlan p;
  const int64_t full = n_ / global_batch_;
  const int64_t rest = n_ % global_batch_;
  const bool keep_rest = rest > 0 && !drop_remainder_;
  std::vector<int64_t> base(static_cast<size_t>(n_));
  std::iota(base.begin(), base.end(), 0);
  Rng rng(stream_key(seed_, 0xE90C, static_cast<uint64_t>(epoch)));

  if (shuffle_ == Shuffle::batch) {
    // Fixed composition: batch b is always samples [b*G, (b+1)*G) of the stored order; only the
    // order in which batches are visited changes from epoch to epoch.
    std::vector<int64_t> batches(static_cast<size_t>(full + (keep_rest ? 1 : 0)));
    std::iota(batches.begin(), batches.end(), 0);
    rng.shuffle(batches);
    p.offsets.push_back(0);
    for (int64_t b : batches) {
      const int64_t lo = b * global_batch_;
      const int64_t hi = std::min(n_, lo + global_batch_);
      p.order.insert(p.order.end(), base.begin() + lo, base.begin() + hi);
      p.offsets.push_back(static_cast<int64_t>(p.order.size()));
    }
    return p;
  }
  if (shuffle_ == Shuffle::sample) rng.shuffle(base);
  const int64_t used = full * global_batch_ + (keep_rest ? rest : 0);
  base.resize(static_cast<size_t>(used));
  p.order = std::move(base);
  for (int64_t b = 0; b <= full; ++b) p.offsets.push_back(b * global_batch_);
  if (keep_rest) p.offsets.push_back(used);
  return p;
}

void Sampler::micro_batch(const EpochPlan& p, int64_t step, int micro, int rank,
                          std::vector<int64_t>& out) const {
  out.clear();
  const int64_t g = p.batch_size(step);
  const int64_t* batch = p.order.data() + p.offsets[step];
  // Micro-step k takes positions [k*g/K, (k+1)*g/K): equal parts for full batches, as even as
  // possible for the last partial one.
  const int64_t lo = micro * g / accum_;
  const int64_t hi = (micro + 1) * g / accum_;
  const int64_t m = hi - lo;
  const int64_t n = replicas_;
  if (sharding_ == Sharding::interleaved) {
    for (int64_t j = rank; j < m; j += n) out.push_back(batch[lo + j]);
  } else {
    const int64_t a = rank * m / n;
    const int64_t b = (rank + 1) * m / n;
    for (int64_t j = a; j < b; ++j) out.push_back(batch[lo + j]);
  }
}

}  // namespace dtrain
