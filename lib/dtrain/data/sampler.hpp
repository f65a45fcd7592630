#pragma once
// The data-parallel sampling contract. The epoch's global order depends on (seed, epoch) alone;
// each global batch (one optimizer step) is split into accumulation micro-steps, and each
// micro-step across replicas by the sharding rule. Every sample appears at most once per epoch
// (exactly once unless drop_remainder drops the last partial batch); nothing is padded.
#include <cstdint>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

struct EpochPlan {
  std::vector<int64_t> order;    // sample indices in visiting order
  std::vector<int64_t> offsets;  // global batch b is order[offsets[b], offsets[b+1])
  int64_t steps() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t batch_size(int64_t step) const { return offsets[step + 1] - offsets[step]; }
};

class Sampler {
 public:
  Sampler(int64_t dataset_size, int64_t global_batch, int replicas, int accumulation_steps,
          Shuffle shuffle, Sharding sharding, bool drop_remainder, uint64_t seed);

  int64_t steps_per_epoch() const;
  EpochPlan plan(int epoch) const;
  // Samples of replica `rank` in micro-step `micro` of optimizer step `step`, appended to out
  // (out is cleared first).
  void micro_batch(const EpochPlan& p, int64_t step, int micro, int rank,
                   std::vector<int64_t>& out) const;

  int replicas() const { return replicas_; }
  int accumulation_steps() const { return accum_; }

 private:
  int64_t n_;
  int64_t global_batch_;
  int replicas_;
  int accum_;
  Shuffle shuffle_;
  Sharding sharding_;
  bool drop_remainder_;
  uint64_t seed_;
};

}  // namespace dtrain
