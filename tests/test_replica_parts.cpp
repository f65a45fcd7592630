// The objects a replica is made of, each alone: the gather of every rank's values to rank 0,
// the per-step sums on the device and the host, the noise probe's scaling of what it measured,
// and the phase log gathered into a straggler.
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/train/noise_probe.hpp"
#include "dtrain/train/phase_log.hpp"
#include "dtrain/train/rank_gather.hpp"
#include "dtrain/train/step_stats.hpp"
#include "helpers.hpp"

using namespace dtrain;
using namespace dtrain::test;

namespace {

// Runs f(comm) on n in-process ranks, one thread each.
void on_ranks(int n, const std::function<void(Communicator&)>& f) {
  InProcessGroup group(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      auto comm = group.communicator(r);
      f(*comm);
    });
  for (auto& t : ts) t.join();
}

std::vector<uint64_t> words_of(int r) {
  const auto u = static_cast<uint64_t>(r);
  return {~u, 0x8000000000000001ull + u, std::bit_cast<uint32_t>(-1.5f * static_cast<float>(r)), 0};
}

}  // namespace

TEST_CASE("every rank's values and words reach rank 0 whole and in rank order", "[replica_parts]") {
  // 70 ranks: more than one block of the gather.
  for (int n : {1, 3, 70}) {
    const auto ranks = static_cast<size_t>(n);
    std::vector<std::vector<double>> values(ranks);
    std::vector<std::vector<uint64_t>> words(ranks);
    on_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      values[static_cast<size_t>(r)] = gather(comm, {r + 0.25, -1e300 * r, 0.0});
      words[static_cast<size_t>(r)] = gather_words(comm, words_of(r));
    });
    INFO("ranks: " << n);
    REQUIRE(values[0].size() == 3 * ranks);
    REQUIRE(words[0].size() == 4 * ranks);
    for (int r = 0; r < n; ++r) {
      const auto at = static_cast<size_t>(r);
      CHECK(values[0][3 * at] == r + 0.25);
      CHECK(values[0][3 * at + 1] == -1e300 * r);
      CHECK(values[0][3 * at + 2] == 0.0);
      const std::vector<uint64_t> got(words[0].begin() + static_cast<std::ptrdiff_t>(4 * at),
                                      words[0].begin() + static_cast<std::ptrdiff_t>(4 * at + 4));
      CHECK(got == words_of(r));
      if (r > 0) CHECK(values[at].empty());
      if (r > 0) CHECK(words[at].empty());
    }
  }
}

// What a run under a launcher checks before it trains: every rank read the data rank 0 read.
TEST_CASE("rank 0's word reaches every rank, and every rank counts the ranks that differ",
          "[replica_parts]") {
  for (int n : {1, 4}) {
    const auto ranks = static_cast<size_t>(n);
    std::vector<uint64_t> got(ranks);
    std::vector<int> differ(ranks);
    on_ranks(n, [&](Communicator& comm) {
      const auto r = static_cast<size_t>(comm.rank());
      // Rank 2 (where there is one) loaded other data: its word differs in the top bit only.
      const uint64_t fingerprint = 0xfedcba9876543210ull ^ (r == 2 ? 1ull << 63 : 0);
      got[r] = broadcast_word(comm, fingerprint);
      differ[r] = count_ranks(comm, fingerprint != got[r]);
    });
    INFO("ranks: " << n);
    for (size_t r = 0; r < ranks; ++r) {
      CHECK(got[r] == 0xfedcba9876543210ull);
      CHECK(differ[r] == (n > 2 ? 1 : 0));
    }
  }
}

TEST_CASE("per-step sums add up over the ranks, and a checkpoint's steps restore to them",
          "[replica_parts]") {
  constexpr int64_t kSteps = 3;
  using S = StepStats;
  // Rank r's value k of step s.
  auto value = [](int r, int64_t s, size_t k) {
    return static_cast<double>((r + 1) * 100 + s * 10) + static_cast<double>(k) + 0.5;
  };
  std::vector<double> all(kSteps * S::kHost), first, restored(kSteps * S::kHost);
  on_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const std::unique_ptr<Device> dev = make_cpu_device();
    StepStats stats(*dev, kSteps);
    stats.begin_epoch();
    for (int64_t s = 0; s < kSteps; ++s) {
      const bool graph = s == 2;  // the last step as a graph step, through the graph's row
      if (graph) stats.clear_graph_row();
      double* row = stats.device_row(s, graph);  // host memory on the CPU
      for (size_t k = 0; k < S::kDev; ++k) row[k] += value(r, s, k);
      if (graph) stats.keep_graph_row(s);
      stats.add_rows(s, value(r, s, S::kRows));
    }
    const std::vector<double> part = stats.reduced_first(comm, 2);
    stats.finish_epoch(comm);
    // A run resumed after step 2: rank 0 puts the reduced sums back, the other rank zeros.
    StepStats again(*dev, kSteps);
    again.begin_epoch();
    if (r == 0) again.restore_first(part);
    again.finish_epoch(comm);
    if (r != 0) return;
    all.assign(stats.host_row(0), stats.host_row(0) + kSteps * S::kHost);
    first = part;
    restored.assign(again.host_row(0), again.host_row(0) + kSteps * S::kHost);
  });
  for (int64_t s = 0; s < kSteps; ++s)
    for (size_t k = 0; k < S::kHost; ++k) {
      INFO("step " << s << ", value " << k);
      const size_t i = static_cast<size_t>(s) * S::kHost + k;
      CHECK(all[i] == value(0, s, k) + value(1, s, k));
      CHECK(restored[i] == (s < 2 ? all[i] : 0.0));
    }
  CHECK(first == std::vector<double>(all.begin(), all.begin() + 2 * S::kHost));
}

TEST_CASE("the noise probe feeds whole steps to the estimator, scaled for the reduction",
          "[replica_parts]") {
  using S = StepStats;
  auto row = [](double rows) {
    std::vector<double> v(S::kHost, 0.0);
    v[S::kLocalNorm] = 8, v[S::kReducedNorm] = 2, v[S::kRows] = rows;
    return v;
  };
  SECTION("four replicas, mean or sum") {
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      Config c = synthetic_config(4, 32);
      c.train.reduction = red;
      NoiseProbe probe(c, 4);
      REQUIRE(probe.on());
      const auto b = static_cast<double>(c.global_batch());
      probe.add_step(row(b).data());
      probe.add_step(row(b - 1).data());  // a short last step: left out
      NoiseScale ref;
      ref.add(b / 4, b, 8.0 / 4, red == Reduction::sum ? 2.0 / 16 : 2.0);
      CHECK(probe.scale().steps() == 1);
      CHECK(probe.scale().save() == ref.save());
    }
  }
  SECTION("one replica: its first micro-batch, or nothing without accumulation") {
    Config c = synthetic_config(1, 32);
    CHECK_FALSE(NoiseProbe(c, 1).on());
    c.train.accumulation_steps = 4;
    NoiseProbe probe(c, 1);
    REQUIRE(probe.on());
    const auto b = static_cast<double>(c.global_batch());
    probe.add_step(row(b).data());
    NoiseScale ref;
    ref.add(static_cast<double>(c.micro_batch()), b, 8.0 * 16, 2.0);
    CHECK(probe.scale().save() == ref.save());
  }
  SECTION("off by the config") {
    Config c = synthetic_config(4, 32);
    c.train.noise_scale = false;
    NoiseProbe probe(c, 4);
    CHECK_FALSE(probe.on());
    probe.add_step(row(static_cast<double>(c.global_batch())).data());
    CHECK(probe.scale().steps() == 0);
  }
}

TEST_CASE("the phase log names a slow rank on rank 0, from the steps this process ran",
          "[replica_parts]") {
  CHECK_FALSE(PhaseLog(1, 10, 1, true).on());   // one replica
  // A GPU: on, but the host only queues work, so its clocks write nothing (device marks do).
  CHECK(PhaseLog(3, 10, 1, false).on());
  CHECK_FALSE(PhaseLog(3, 10, 1, false).host_clocks());
  std::vector<Straggler> named(3);
  on_ranks(3, [&](Communicator& comm) {
    const int r = comm.rank();
    PhaseLog log(3, 10, 1, true);
    REQUIRE(log.on());
    // A resumed epoch from step 6. Its rows 0 to 5 are filled here all the same: counted, they
    // would name rank 1 in forward (6 of 10 steps); rank 2 is slow in all 4 steps that ran.
    log.begin_epoch(6);
    for (int64_t s = 0; s < 10; ++s) {
      log.begin_step(s);
      for (int p = 0; p < kStepPhases; ++p) log.add(static_cast<StepPhase>(p), 1e-3);
      if (s < 6 && r == 1) log.add(StepPhase::forward, 5e-3);
      if (s >= 6 && r == 2) log.add(StepPhase::backward, 2e-3);
      log.arrive(0, static_cast<double>(s));
      log.end_step();
    }
    named[static_cast<size_t>(r)] = log.epoch_straggler(comm);
  });
  CHECK(named[0].rank == 2);
  CHECK(named[0].phase == static_cast<int>(StepPhase::backward));
  CHECK(named[0].excess == Approx(2.0));
  CHECK(named[1].rank == -1);
  CHECK(named[2].rank == -1);
}
