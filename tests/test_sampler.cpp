#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <set>

#include "dtrain/data/sampler.hpp"

using namespace dtrain;

namespace {
// Everything replica r sees in an epoch, in order.
std::vector<int64_t> all_samples(const Sampler& s, const EpochPlan& p) {
  std::vector<int64_t> out, mb;
  for (int64_t step = 0; step < p.steps(); ++step)
    for (int k = 0; k < s.accumulation_steps(); ++k)
      for (int r = 0; r < s.replicas(); ++r) {
        s.micro_batch(p, step, k, r, mb);
        out.insert(out.end(), mb.begin(), mb.end());
      }
  return out;
}
}  // namespace

TEST_CASE("every sample is seen exactly once per epoch in every mode", "[sampler]") {
  for (auto shuffle : {Shuffle::sample, Shuffle::batch, Shuffle::none})
    for (auto sharding : {Sharding::interleaved, Sharding::contiguous})
      for (int replicas : {1, 3, 4})
        for (int accum : {1, 2}) {
          const int64_t n = 1000;
          const int64_t gb = 8 * replicas * accum;
          Sampler s(n, gb, replicas, accum, shuffle, sharding, /*drop_remainder=*/false, 5);
          for (int epoch = 0; epoch < 2; ++epoch) {
            auto seen = all_samples(s, s.plan(epoch));
            CHECK(static_cast<int64_t>(seen.size()) == n);
            std::sort(seen.begin(), seen.end());
            std::vector<int64_t> expect(static_cast<size_t>(n));
            std::iota(expect.begin(), expect.end(), 0);
            CHECK(seen == expect);
          }
        }
}

TEST_CASE("drop_remainder drops only the last partial batch - never pads", "[sampler]") {
  Sampler keep(100, 32, 2, 1, Shuffle::sample, Sharding::interleaved, false, 1);
  Sampler drop(100, 32, 2, 1, Shuffle::sample, Sharding::interleaved, true, 1);
  CHECK(keep.steps_per_epoch() == 4);
  CHECK(drop.steps_per_epoch() == 3);
  const auto pk = keep.plan(0);
  const auto pd = drop.plan(0);
  CHECK(pk.batch_size(3) == 4);
  CHECK(pd.order.size() == 96);
  std::set<int64_t> uniq(pd.order.begin(), pd.order.end());
  CHECK(uniq.size() == 96);
  // The same permutation: dropping keeps the first 96 of it.
  CHECK(std::equal(pd.order.begin(), pd.order.end(), pk.order.begin()));
}

TEST_CASE("the epoch order depends on seed and epoch only", "[sampler]") {
  Sampler a(500, 20, 4, 1, Shuffle::sample, Sharding::interleaved, true, 9);
  Sampler b(500, 20, 1, 1, Shuffle::sample, Sharding::contiguous, true, 9);
  Sampler c(500, 20, 1, 1, Shuffle::sample, Sharding::contiguous, true, 10);
  CHECK(a.plan(3).order == b.plan(3).order);  // replica count does not change the order
  CHECK(a.plan(3).order != a.plan(4).order);  // a fresh permutation every epoch
  CHECK(a.plan(3).order != c.plan(3).order);
  Sampler none(50, 10, 1, 1, Shuffle::none, Sharding::interleaved, true, 9);
  std::vector<int64_t> expect(50);
  std::iota(expect.begin(), expect.end(), 0);
  CHECK(none.plan(0).order == expect);
}

TEST_CASE("batch shuffle keeps batch composition and permutes batches", "[sampler]") {
  const int64_t n = 120, g = 12;
  Sampler s(n, g, 3, 1, Shuffle::batch, Sharding::interleaved, true, 4);
  std::set<std::set<int64_t>> batches_e0, batches_e1;
  const auto p0 = s.plan(0), p1 = s.plan(1);
  for (int64_t b = 0; b < p0.steps(); ++b) {
    batches_e0.insert(
        std::set<int64_t>(p0.order.begin() + p0.offsets[b], p0.order.begin() + p0.offsets[b + 1]));
    batches_e1.insert(
        std::set<int64_t>(p1.order.begin() + p1.offsets[b], p1.order.begin() + p1.offsets[b + 1]));
  }
  CHECK(batches_e0 == batches_e1);  // same batches
  CHECK(p0.order != p1.order);      // visited in another order
  // Each batch is a block of the stored order.
  for (const auto& b : batches_e0) CHECK(*b.rbegin() - *b.begin() == g - 1);
}

TEST_CASE("interleaved sharding gives replica r positions r - r+N - ...", "[sampler]") {
  Sampler s(64, 16, 4, 1, Shuffle::none, Sharding::interleaved, true, 1);
  const auto p = s.plan(0);
  std::vector<int64_t> mb;
  s.micro_batch(p, 1, 0, 2, mb);
  CHECK(mb == std::vector<int64_t>{18, 22, 26, 30});
}

TEST_CASE("contiguous sharding gives replica r block r", "[sampler]") {
  Sampler s(64, 16, 4, 1, Shuffle::none, Sharding::contiguous, true, 1);
  const auto p = s.plan(0);
  std::vector<int64_t> mb;
  s.micro_batch(p, 1, 0, 2, mb);
  CHECK(mb == std::vector<int64_t>{24, 25, 26, 27});
}

TEST_CASE("accumulation splits a global batch into equal micro-steps", "[sampler]") {
  Sampler s(64, 16, 2, 2, Shuffle::none, Sharding::contiguous, true, 1);
  const auto p = s.plan(0);
  std::vector<int64_t> mb;
  s.micro_batch(p, 0, 1, 1, mb);  // step 0, second micro-step, replica 1
  CHECK(mb == std::vector<int64_t>{12, 13, 14, 15});
}

TEST_CASE("a short last batch is spread over replicas without duplicates", "[sampler]") {
  Sampler s(10, 8, 4, 1, Shuffle::none, Sharding::interleaved, false, 1);
  const auto p = s.plan(0);
  std::vector<int64_t> mb;
  std::map<int, size_t> sizes;
  for (int r = 0; r < 4; ++r) {
    s.micro_batch(p, 1, 0, r, mb);
    sizes[r] = mb.size();
  }
  CHECK(sizes[0] == 1);
  CHECK(sizes[1] == 1);
  CHECK(sizes[2] == 0);
  CHECK(sizes[3] == 0);
}
