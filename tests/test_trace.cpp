// Step traces (train.trace): the window, the packing between ranks, and whole runs' trace.json
// read back as trace-event JSON: every span complete, nested in its step, the ranks' steps
// aligned, in process and under mpirun.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dtrain/train/trace.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

std::string write_config(const fs::path& dir) {
  const auto p = dir / "tr.yaml";
  std::ofstream(p) << "name: tr\nthreads: 1\ndata:\n  dataset: synthetic\n"
                      "  synthetic: {train_size: 512, test_size: 64, shape: [24], classes: 4}\n"
                      "model: {hidden: [64, 32]}\n"
                      "train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0, "
                      "bucket_mb: 0.002}\noptimizer: {lr: 0.05, base_batch: 16}\n";
  return p.string();
}

struct Span {
  std::string cat;
  int64_t step = 0;
  double t0 = 0, t1 = 0;
};

// Checks what Perfetto needs of a JSON trace and what dtrain promises of its spans; returns
// each rank's spans.
std::map<int, std::vector<Span>> read_trace(const fs::path& file, int ranks, int64_t from,
                                            int64_t steps) {
  const auto doc = nlohmann::json::parse(slurp(file));
  REQUIRE(doc.at("traceEvents").is_array());
  std::map<int, std::vector<Span>> by_rank;
  std::set<int> named;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e.at("ph");
    const int pid = e.at("pid");
    REQUIRE((pid >= 0 && pid < ranks));
    if (ph == "M") {
      if (e.at("name") == "process_name") named.insert(pid);
      continue;
    }
    REQUIRE(ph == "X");  // complete events only
    const double ts = e.at("ts"), dur = e.at("dur");
    REQUIRE(dur >= 0);
    REQUIRE(e.at("tid") == 0);
    by_rank[pid].push_back({e.at("cat"), e.at("args").at("step"), ts, ts + dur});
  }
  CHECK(static_cast<int>(named.size()) == ranks);
  REQUIRE(static_cast<int>(by_rank.size()) == ranks);
  for (auto& [rank, spans] : by_rank) {
    INFO("rank " << rank);
    std::map<int64_t, Span> step_of;
    for (const Span& s : spans)
      if (s.cat == "step") step_of[s.step] = s;
    CHECK(static_cast<int64_t>(step_of.size()) == steps);  // the window, whole
    CHECK(step_of.begin()->first == from);
    for (const Span& s : spans) {
      INFO(s.cat << " of step " << s.step);
      CHECK((s.step >= from && s.step < from + steps));
      if (s.cat == "step" || s.cat == "evaluation" || s.cat == "checkpoint") continue;
      const Span& st = step_of.at(s.step);  // nested in its step (a microsecond of rounding)
      CHECK(s.t0 >= st.t0 - 1e-3);
      CHECK(s.t1 <= st.t1 + 1e-3);
    }
  }
  // Aligned: each step's spans overlap on every rank (the all-reduce holds them together).
  for (int64_t s = from; s < from + steps; ++s) {
    double latest_start = -1e300, earliest_end = 1e300;
    for (auto& [rank, spans] : by_rank)
      for (const Span& x : spans)
        if (x.cat == "step" && x.step == s) {
          latest_start = std::max(latest_start, x.t0);
          earliest_end = std::min(earliest_end, x.t1);
        }
    INFO("step " << s);
    CHECK(latest_start < earliest_end);
  }
  return by_rank;
}

int count(const std::vector<Span>& spans, const std::string& cat) {
  return static_cast<int>(
      std::count_if(spans.begin(), spans.end(), [&](const Span& s) { return s.cat == cat; }));
}

}  // namespace

TEST_CASE("a step trace records its window only and packs to the same spans", "[trace]") {
  TraceConfig w;
  w.from_step = 3;
  w.steps = 2;
  StepTrace t(w);
  t.start_clock(StepTrace::Clock::now());
  const auto now = StepTrace::Clock::now();
  for (int64_t s = 1; s <= 6; ++s) {
    t.set_step(s);
    CHECK(t.on() == (s == 3 || s == 4));
    t.span(TracePhase::forward, now, now + std::chrono::microseconds(10 * s));
    t.bucket(2, now, now, now + std::chrono::microseconds(5));
  }
  const std::vector<double> packed = t.take();
  const auto spans = unpack_spans(packed.data(), packed.size());
  REQUIRE(spans.size() == 4);
  CHECK(spans[0].phase == TracePhase::forward);
  CHECK(spans[0].step == 3);
  CHECK(spans[0].dur_us == Approx(30));
  CHECK(spans[1].phase == TracePhase::bucket);
  CHECK(spans[1].index == 2);
  CHECK(spans[1].ready_us >= 0);
  CHECK(spans[2].step == 4);
  CHECK(t.take().empty());  // taken once
  CHECK_THROWS_AS(unpack_spans(packed.data(), packed.size() - 1), SystemError);
  std::vector<double> bad = packed;
  bad[0] = 99;  // no such phase
  CHECK_THROWS_AS(unpack_spans(bad.data(), bad.size()), SystemError);
  StepTrace off(TraceConfig{});
  off.set_step(1);
  CHECK(!off.on());
}

TEST_CASE("a 4-replica run's trace.json nests every span in its step, ranks aligned",
          "[trace]") {
  TempDir d("trace");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  // 512 / (4 x 16) = 8 steps an epoch: the window crosses the epoch's end.
  const auto r = dtrain_cli("run " + cfg + " gpus=4 replicas=threads train.trace.from_step=7 " +
                            "train.trace.steps=4 --quiet --tag t --results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto spans = read_trace(fs::path(res) / "tr" / "t-g4" / "trace.json", 4, 7, 4);
  for (const auto& [rank, s] : spans) {
    INFO("rank " << rank);
    CHECK(count(s, "forward") == 4);
    CHECK(count(s, "backward") == 4);
    CHECK(count(s, "optimizer") == 4);
    CHECK(count(s, "bucket") >= 8);  // the 2 KB buckets: several a step
    CHECK(count(s, "evaluation") == 1);  // after step 8, the first epoch's last
    // Before the scoring, and again after it where the scoring took longer than the write.
    CHECK(count(s, "checkpoint") >= 1);
    CHECK(count(s, "checkpoint") <= 2);
  }
  // Off: no file; shared weights: every rank updates its own part of them after the exchange.
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 --quiet --tag off --results " + res).code == 0);
  CHECK(!fs::exists(fs::path(res) / "tr" / "off-g2" / "trace.json"));
  REQUIRE(dtrain_cli("run " + cfg + " gpus=2 replicas=shared train.trace.steps=3 --quiet " +
                     "--tag sh --results " + res)
              .code == 0);
  const auto sh = read_trace(fs::path(res) / "tr" / "sh-g2" / "trace.json", 2, 1, 3);
  for (const auto& [who, of_rank] : sh) {
    INFO("rank " << who);
    CHECK(count(of_rank, "optimizer") == 3);
    CHECK(count(of_rank, "exchange") == 6);  // the sum, then the wait for the other parts
    CHECK(count(of_rank, "bucket") == 3);    // the rank's own fold into the sum, a step
  }
}

TEST_CASE("synchronised BatchNorm's exchanges are traced inside forward and backward",
          "[trace][batchnorm]") {
  TempDir d("trace-bn");
  const auto cfg = d.path / "bn.yaml";
  // A ResNet-8 (9 BatchNorm layers: the stem's, two a block, two projections' shortcuts).
  std::ofstream(cfg) << "name: bn\nthreads: 1\ndata:\n  dataset: synthetic\n"
                        "  synthetic: {train_size: 128, test_size: 32, shape: [3, 8, 8], "
                        "classes: 4}\nmodel: {type: resnet, depth: 8, widths: [4, 8, 8], "
                        "batchnorm: sync}\ntrain: {epochs: 1, per_replica_batch: 16, "
                        "target_accuracy: 0}\noptimizer: {lr: 0.05, base_batch: 16}\n";
  const auto res = (d.path / "res").string();
  const auto r =
      dtrain_cli("run " + cfg.string() + " gpus=2 replicas=threads train.trace.from_step=2 " +
                 "train.trace.steps=2 --quiet --tag t --results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto spans = read_trace(fs::path(res) / "bn" / "t-g2" / "trace.json", 2, 2, 2);
  for (const auto& [rank, s] : spans) {
    INFO("rank " << rank);
    CHECK(count(s, "bn sync") == 2 * 9 * 2);  // 2 steps, 9 layers, forward and backward
    for (const Span& x : s) {
      if (x.cat != "bn sync") continue;
      const bool inside = std::any_of(s.begin(), s.end(), [&](const Span& p) {
        return (p.cat == "forward" || p.cat == "backward") && p.step == x.step &&
               x.t0 >= p.t0 - 1e-3 && x.t1 <= p.t1 + 1e-3;
      });
      CHECK(inside);
    }
  }
  // One replica has nothing to exchange: no round trip through the host, so no span.
  const auto one = dtrain_cli("run " + cfg.string() + " gpus=1 train.trace.from_step=2 " +
                              "train.trace.steps=2 --quiet --tag t --results " + res);
  INFO(one.out);
  REQUIRE(one.code == 0);
  const auto spans1 = read_trace(fs::path(res) / "bn" / "t-g1" / "trace.json", 1, 2, 2);
  REQUIRE(spans1.count(0) == 1);
  CHECK(count(spans1.at(0), "bn sync") == 0);
  CHECK(count(spans1.at(0), "forward") == 2);
}

TEST_CASE("a run resumed after its trace window keeps the trace it wrote", "[trace]") {
  TempDir d("trace-resume");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  // 8 steps an epoch at 4 x 16: the window is steps 2 and 3, the run fails at step 12 and
  // continues from its checkpoint at step 8.
  const std::string run = dtrain_binary() + " run " + cfg + " gpus=4 replicas=threads " +
                          "train.trace.from_step=2 train.trace.steps=2 --quiet --tag r " +
                          "--results " + res;
  REQUIRE(shell("DTRAIN_FAULT=0:12 " + run + " 2>&1").code != 0);
  const fs::path trace = fs::path(res) / "tr" / "r-g4" / "trace.json";
  REQUIRE(fs::exists(trace));
  const std::string before = slurp(trace);
  const auto again = shell(run + " --resume 2>&1");
  INFO(again.out);
  REQUIRE(again.code == 0);
  CHECK(slurp(trace) == before);
  read_trace(trace, 4, 2, 2);
}

TEST_CASE("a run resumed inside its trace window says which steps each trace.json holds",
          "[trace]") {
  TempDir d("trace-resume-inside");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  // 8 steps an epoch: the window is steps 6 to 13; the run fails at step 12, after its first
  // epoch wrote steps 6 to 8, and continues from its checkpoint at step 8.
  const std::string run = dtrain_binary() + " run " + cfg + " gpus=4 replicas=threads " +
                          "train.trace.from_step=6 train.trace.steps=8 --quiet --tag r " +
                          "--results " + res;
  REQUIRE(shell("DTRAIN_FAULT=0:12 " + run + " 2>&1").code != 0);
  const auto again = shell(run + " --resume 2>&1");
  INFO(again.out);
  REQUIRE(again.code == 0);
  const auto about = [](const fs::path& f) {
    return nlohmann::json::parse(slurp(f)).at("otherData").at("about").get<std::string>();
  };
  CHECK(about(fs::path(res) / "tr" / "r-g4" / "trace.json") ==
        "dtrain 4 replicas, steps 9 to 13 (resumed at step 9: steps 6 to 8 are in the stopped "
        "attempt's trace.json, under .attempts/)");
  int attempts = 0;
  for (const auto& e : fs::directory_iterator(fs::path(res) / "tr" / ".attempts")) {
    ++attempts;
    CHECK(about(e.path() / "trace.json") == "dtrain 4 replicas, steps 6 to 8");
  }
  CHECK(attempts == 1);
}

TEST_CASE("a run stopped inside an epoch keeps the steps it traced", "[trace]") {
  TempDir d("trace-stop");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  const fs::path dir = fs::path(res) / "tr" / "s-g2";
  // 256 steps an epoch at 2 x 16 on 8,192 samples, the forward pass slowed 100-fold (the
  // most DTRAIN_SLOW takes) and a checkpoint each step; SIGTERM once the first checkpoint is
  // there: the stop comes inside the first epoch, before any epoch's end wrote the trace.
  const std::string run = "DTRAIN_SLOW=0:forward:100 exec " + dtrain_binary() + " run " + cfg +
                          " gpus=2 replicas=threads data.synthetic.train_size=8192 " +
                          "train.trace.from_step=1 train.trace.steps=400 " +
                          "train.checkpoint_steps=1 --quiet --tag s --results " + res;
  const auto r = shell("bash -c '(" + run + ") & p=$!; for i in $(seq 600); do [ -e " +
                       (dir / "checkpoint.bin").string() +
                       " ] && break; sleep 0.02; done; kill -TERM $p; wait $p; "
                       "echo rc=$?' 2>&1");
  INFO(r.out);
  REQUIRE_THAT(r.out, Catch::Contains("rc=143"));
  REQUIRE(fs::exists(dir / "trace.json"));
  const auto j = nlohmann::json::parse(slurp(dir / "trace.json"));
  CHECK_THAT(j.at("otherData").at("about").get<std::string>(),
             Catch::StartsWith("dtrain 2 replicas, steps 1 to "));
}

TEST_CASE("a trace is no part of a run's identity, and its window is checked", "[trace]") {
  TempDir d("trace-id");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " --quiet --tag a --results " + res).code == 0);
  // The finished run is reused with a trace asked for: a trace changes no result.
  const auto again = dtrain_cli("run " + cfg + " train.trace.steps=2 --resume --quiet --tag a " +
                                "--results " + res);
  INFO(again.out);
  CHECK(again.code == 0);
  const auto big = dtrain_cli("validate " + cfg + " train.trace.steps=5000");
  CHECK(big.code == 2);
  CHECK_THAT(big.out, Catch::Contains("train.trace.steps"));
  CHECK(dtrain_cli("validate " + cfg + " train.trace.from_step=0").code == 2);
  // A window past the run's last step (2 epochs of 32 steps) is said, not silently empty.
  const auto late = dtrain_cli("run " + cfg + " train.trace.from_step=65 train.trace.steps=2 --quiet --tag late " +
                               "--results " + res);
  CHECK(late.code == 0);
  CHECK_THAT(late.out, Catch::Contains("the window starts at step 65, but the run has 64 steps"));
  CHECK(!std::filesystem::exists(fs::path(res) / "tr" / "late-g1" / "trace.json"));
  // A window that runs past the end is said too, and the trace names the steps it holds.
  const auto tail = dtrain_cli("run " + cfg + " train.trace.from_step=63 train.trace.steps=5 " +
                               "--quiet --tag tail --results " + res);
  CHECK(tail.code == 0);
  CHECK_THAT(tail.out, Catch::Contains("the window ends at step 67, but the run has 64 steps: "
                                       "trace.json will hold steps 63 to 64"));
  CHECK_THAT(slurp(fs::path(res) / "tr" / "tail-g1" / "trace.json"),
             Catch::Contains("steps 63 to 64"));
}

TEST_CASE("under mpirun the ranks' traces line up in one trace.json", "[trace][mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("trace-mpi");
  const auto cfg = write_config(d.path);
  const auto res = (d.path / "res").string();
  const auto r = shell(mpirun(2) + dtrain_binary() + " run " + cfg +
                       " gpus=2 train.trace.from_step=2 train.trace.steps=3 --quiet --tag m "
                       "--results " + res);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto spans = read_trace(fs::path(res) / "tr" / "m-g2" / "trace.json", 2, 2, 3);
  for (const auto& [rank, s] : spans) CHECK(count(s, "bucket") >= 3);
}
