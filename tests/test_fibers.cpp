// Fibers: every body runs to its end, on its worker, in turn; waits hand the worker to the
// other fibers; an in-process group of fibers meets in its collectives; a failing body's
// exception comes back to the caller. (Catch2's assertions are not thread-safe: bodies on
// several workers record what they saw, and the test checks it afterwards.)
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/fibers.hpp"
#include "dtrain/comm/comm.hpp"

using namespace dtrain;

TEST_CASE("fibers run every body to its end, each on its own worker thread", "[fibers]") {
  for (int workers : {1, 2, 3}) {
    constexpr int n = 7;
    std::mutex mu;
    std::vector<std::thread::id> thread_of(n);
    std::vector<int> ran(n, 0), inside(n, 0);
    CHECK_FALSE(fibers::in_fiber());
    fibers::run(n, workers, [&](int i) {
      std::lock_guard lk(mu);
      inside[static_cast<size_t>(i)] = fibers::in_fiber() ? 1 : 0;
      thread_of[static_cast<size_t>(i)] = std::this_thread::get_id();
      ++ran[static_cast<size_t>(i)];
    });
    CHECK(ran == std::vector<int>(n, 1));
    CHECK(inside == std::vector<int>(n, 1));
    // Fiber i lives on worker i % workers: as many distinct threads as workers.
    CHECK(std::set<std::thread::id>(thread_of.begin(), thread_of.end()).size() ==
          static_cast<size_t>(workers));
    for (int i = workers; i < n; ++i)
      CHECK(thread_of[static_cast<size_t>(i)] == thread_of[static_cast<size_t>(i % workers)]);
  }
}

TEST_CASE("a fiber that waits lets the others of its worker run", "[fibers]") {
  // One worker, three fibers: 0 waits for 2, which comes after it. Without yielding, 0 would
  // wait forever.
  std::atomic<int> stage{0};
  std::vector<int> order;
  fibers::run(3, 1, [&](int i) {
    if (i == 0) {
      fibers::wait_until([&] { return stage.load() == 2; });
      order.push_back(0);
    } else {
      order.push_back(i);
      ++stage;
      fibers::notify();
    }
  });
  CHECK(order == std::vector<int>{1, 2, 0});
}

TEST_CASE("fibers of an in-process group meet in collectives, on fewer threads", "[fibers]") {
  // Six ranks on one and on two workers, many rounds of an all-reduce and of the ordered fold
  // into shared memory. The values make float addition order matter (1e8 + 1 - 1e8 is 0, not
  // 1), so both must give exactly the rank-order sum computed here.
  constexpr int n = 6, rounds = 40;
  constexpr size_t len = 700;  // more than one block of the all-reduce
  const auto value = [](int r, int round, size_t i) {
    const float big = (r + static_cast<int>(i)) % 3 == 0 ? 1e8f : 1.0f;
    return (r % 2 ? -big : big) * static_cast<float>(1 + (round + i) % 7) / 7.0f;
  };
  for (int workers : {1, 2}) {
    InProcessGroup group(n);
    std::vector<float> shared(len, 0.f);
    std::atomic<int> then_calls{0}, wrong_allreduce{0}, wrong_fold{0};
    // Who folded and when `then` ran (-1), in the order they did: each rank's `folded` comes in
    // its turn, so rank order, and the last rank's `then` after its own.
    std::mutex mu;
    std::vector<int> seen;
    fibers::run(n, workers, [&](int r) {
      auto comm = group.communicator(r);
      const auto dev = make_cpu_device();
      for (int round = 0; round < rounds; ++round) {
        std::vector<float> mine(len), want(len);
        for (size_t i = 0; i < len; ++i) {
          mine[i] = value(r, round, i);
          float acc = value(0, round, i);
          for (int q = 1; q < n; ++q) acc += value(q, round, i);
          want[i] = acc * (1.0f / n);
        }
        const auto saw = [&](int who) {
          std::lock_guard lk(mu);
          seen.push_back(who);
        };
        comm->reduce_shared(
            *dev, mine.data(), len, ReduceOp::mean, shared.data(),
            [&] {
              ++then_calls;
              saw(-1);
            },
            [&](double seconds) { saw(seconds >= 0 ? r : -2); });
        for (size_t i = 0; i < len; ++i) wrong_fold += shared[i] == want[i] ? 0 : 1;
        comm->allreduce(mine.data(), len, ReduceOp::mean);
        for (size_t i = 0; i < len; ++i) wrong_allreduce += mine[i] == want[i] ? 0 : 1;
      }
    });
    INFO(workers << " worker(s)");
    CHECK(wrong_fold == 0);
    CHECK(wrong_allreduce == 0);
    CHECK(then_calls == rounds);  // the last rank, once per fold
    std::vector<int> want;
    for (int round = 0; round < rounds; ++round) {
      for (int r = 0; r < n; ++r) want.push_back(r);
      want.push_back(-1);
    }
    CHECK(seen == want);
  }
}

TEST_CASE("a failing fiber releases the others and its error reaches the caller", "[fibers]") {
  InProcessGroup group(4);
  std::atomic<int> aborted{0};
  const auto body = [&](int r) {
    auto comm = group.communicator(r);
    try {
      if (r == 2) throw std::runtime_error("rank 2 broke");
      double x = 1;
      comm->allreduce(&x, 1, ReduceOp::sum);  // never completes: rank 2 is gone
    } catch (const Aborted&) {
      ++aborted;
    } catch (...) {
      group.abort("rank 2 failed");
      throw;
    }
  };
  CHECK_THROWS_WITH(fibers::run(4, 2, body), "rank 2 broke");
  CHECK(aborted == 3);
}
