// Gradient buckets: which ranges are reduced when, and that bucketing never changes a result.
#include <catch2/catch.hpp>

#include "dtrain/dist/exchange.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;

namespace {
// Records the ranges it is asked to reduce, relative to the buffer.
class Recorder final : public GradExchange {
 public:
  Recorder(float* base, size_t n, size_t bucket) : GradExchange(n, bucket), base_(base) {}
  std::string kind() const override { return "recorder"; }
  std::vector<std::pair<size_t, size_t>> calls;
  int waits = 0;

 protected:
  void reduce(float* data, size_t n) override {
    calls.emplace_back(static_cast<size_t>(data - base_), n);
  }
  void wait() override { ++waits; }

 private:
  float* base_;
};
}  // namespace

TEST_CASE("buckets are cut from the end and reduced once backward has finished them",
          "[exchange]") {
  std::vector<float> g(10);
  Recorder r(g.data(), 10, 4);  // buckets [6,10) [2,6) [0,2)
  REQUIRE(r.bucket_count() == 3);
  r.begin(g.data());
  r.ready(8, 2);  // the last layer: bucket [6,10) is not complete yet
  CHECK(r.calls.empty());
  r.ready(5, 3);  // now it is
  REQUIRE(r.calls.size() == 1);
  CHECK(r.calls[0] == std::pair<size_t, size_t>{6, 4});
  r.ready(0, 5);  // the rest of backward completes both remaining buckets
  CHECK(r.calls.size() == 3);
  CHECK(r.calls[1] == std::pair<size_t, size_t>{2, 4});
  CHECK(r.calls[2] == std::pair<size_t, size_t>{0, 2});
  r.finish();
  CHECK(r.calls.size() == 3);  // nothing twice
  CHECK(r.waits == 1);

  // A second step starts over; finish() reduces whatever backward did not report.
  r.calls.clear();
  r.begin(g.data());
  r.ready(9, 1);
  r.finish();
  CHECK(r.calls.size() == 3);

  // bucket 0: one all-reduce of everything, only in finish().
  Recorder one(g.data(), 10, 0);
  one.begin(g.data());
  one.ready(0, 10);
  CHECK(one.calls.empty());
  one.finish();
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0] == std::pair<size_t, size_t>{0, 10});
}

TEST_CASE("bucketed all-reduce gives the same bits as one all-reduce", "[exchange][equivalence]") {
  Config big = test::synthetic_config(4, 32);
  big.train.bucket_mb = 0;
  Config small = big;
  small.train.bucket_mb = 0.0005;  // 131 floats: many buckets per step
  small.train.accumulation_steps = big.train.accumulation_steps = 2;
  small.train.per_replica_batch = big.train.per_replica_batch = 16;
  const auto a = test::run_config(big);
  const auto b = test::run_config(small);
  REQUIRE(a.step_losses.size() > 20);
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.epochs.back().test_acc == b.epochs.back().test_acc);
}

TEST_CASE("on the CPU the whole exchange is exposed and timed apart from compute", "[exchange]") {
  Config c = test::synthetic_config(2, 32);
  c.train.bucket_mb = 0.001;
  const auto r = test::run_config(c);
  const auto& m = r.epochs.back();
  CHECK(m.exchange_s > 0);
  CHECK(m.exchange_exposed_s == m.exchange_s);
  CHECK(m.compute_s > 0);
  CHECK(m.data_s + m.compute_s + m.exchange_s + m.optimizer_s <= m.epoch_time_s * 1.01);
}
