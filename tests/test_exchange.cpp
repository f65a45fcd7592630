// Gradient buckets: which ranges are reduced when, and that bucketing never changes a result.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "dtrain/comm/exchange.hpp"
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

TEST_CASE("runs report the bytes each step exchanges and the bus bandwidth achieved",
          "[exchange][busbw]") {
  const TrainResult four = test::run_config(test::synthetic_config(4, 32));
  for (const auto& m : four.epochs) {
    INFO("epoch " << m.epoch << ": exchange " << m.exchange_s << " s, busbw " << m.busbw_gbps);
    CHECK(m.exchange_bytes_per_step == four.info.param_count * 4);
    // busbw = bytes per step / (exchange seconds per step) x 2(n-1)/n
    const double per_step = m.exchange_s / static_cast<double>(four.info.steps_per_epoch);
    CHECK(m.busbw_gbps ==
          Approx(static_cast<double>(m.exchange_bytes_per_step) / per_step * 1.5 / 1e9));
  }
  const TrainResult one = test::run_config(test::synthetic_config(1, 128));
  CHECK(std::isnan(one.epochs.back().busbw_gbps));  // nothing crosses a link
}

TEST_CASE("summary.json and the comparison table carry the exchange and the noise scale",
          "[exchange][busbw][noise_scale][cli]") {
  test::TempDir tmp("busbw");
  const auto cfg = tmp.path / "x.yaml";
  test::put(cfg,
            "name: x\nthreads: 1\n"
            "data: {dataset: synthetic, synthetic: {train_size: 2048, test_size: 128, shape: [8], "
            "classes: 3}}\n"
            "model: {hidden: [16]}\n"
            "train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0}\n");
  const auto r = test::dtrain_cli("run " + cfg.string() + " gpus=1,2 --tag t --quiet --results " +
                                  (tmp.path / "res").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto two = nlohmann::json::parse(test::slurp(tmp.path / "res" / "x" / "t-g2" / "summary.json"));
  CHECK(two["param_count"].get<int64_t>() > 0);
  CHECK(two["exchange_bytes_per_step"].get<int64_t>() == 4 * two["param_count"].get<int64_t>());
  CHECK(two["busbw_gbps"].get<double>() > 0);
  const double share = two["exposed_exchange_share"].get<double>();
  CHECK(share >= 0);
  CHECK(share <= 1);
  CHECK(two["noise_scale"]["b_simple"].is_number());
  CHECK(two["noise_scale"]["advice"].get<std::string>().find("replicas of 16") !=
        std::string::npos);
  const auto one = nlohmann::json::parse(test::slurp(tmp.path / "res" / "x" / "t-g1" / "summary.json"));
  CHECK(one["busbw_gbps"].is_null());
  CHECK(one["noise_scale"].is_null());
  CHECK(r.out.find("exposed exchange") != std::string::npos);
  CHECK(r.out.find("noise scale") != std::string::npos);
}
