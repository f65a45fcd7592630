#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "dtrain/comm/comm.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

using namespace dtrain;

TEST_CASE("in-process all-reduce sums and averages in rank order", "[comm]") {
  for (int n : {1, 2, 3, 5}) {
    InProcessGroup group(n);
    std::vector<std::vector<float>> bufs(static_cast<size_t>(n));
    std::vector<std::vector<double>> dbufs(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        auto comm = group.communicator(r);
        auto& b = bufs[static_cast<size_t>(r)];
        b.resize(101);
        for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(r + 1) * float(i);
        comm->allreduce(b.data(), b.size(), ReduceOp::sum);
        auto& d = dbufs[static_cast<size_t>(r)];
        d.assign(7, r + 1.0);
        comm->allreduce(d.data(), d.size(), ReduceOp::mean);
      });
    }
    for (auto& t : ts) t.join();
    const float tri = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < 101; ++i) CHECK(bufs[static_cast<size_t>(r)][i] == tri * float(i));
      for (double v : dbufs[static_cast<size_t>(r)]) CHECK(v == Approx((n + 1) / 2.0));
    }
  }
}

TEST_CASE("an aborted group releases ranks blocked in a collective", "[comm]") {
  InProcessGroup group(3);
  std::atomic<int> aborted{0};
  std::vector<std::thread> ts;
  for (int r = 1; r < 3; ++r)
    ts.emplace_back([&, r] {
      auto comm = group.communicator(r);
      float x = 1;
      try {
        comm->allreduce(&x, 1, ReduceOp::sum);  // rank 0 never joins
      } catch (const Aborted&) {
        ++aborted;
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.abort("rank 0 failed");
  for (auto& t : ts) t.join();
  CHECK(aborted == 2);
}

TEST_CASE("a failing replica stops the others - and its error is the one reported", "[comm]") {
  // Rank 0 throws in the middle of an epoch; the three others are blocked in (or heading
  // to) the gradient all-reduce and must be released, not hang.
  struct Saboteur : TrainObserver {
    void on_step(int, int64_t step, int64_t) override {
      if (step == 10) throw std::runtime_error("injected failure on rank 0");
    }
  } saboteur;
  Config c = test::synthetic_config(4, 8);
  const auto data = load_data(c.data, c.train.seed);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(train(c, data, &saboteur), "injected failure on rank 0");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("labels outside the class range are rejected before training", "[comm]") {
  Config c = test::synthetic_config(2, 8);
  auto data = load_data(c.data, c.train.seed);
  data.train.y[5] = 99;
  CHECK_THROWS_WITH(train(c, data), Catch::Contains("label 99 outside [0, 4)"));
}
