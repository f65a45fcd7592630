// A GPU run's phases from its device marks (DeviceQueue::step_begin, step_mark): the spans
// between marks, the straggler log they fill after the fact (the exchange's waits taken out by
// the arrivals, as on the CPU), and the trace's device track. The marks here are made up with
// known answers; test_cuda.cpp reads them from a GPU.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/train/device_steps.hpp"
#include "dtrain/train/phase_log.hpp"
#include "helpers.hpp"

using namespace dtrain;

namespace {

constexpr int kData = 0, kFwd = 1, kBwd = 2, kExch = 3, kOpt = 4;

// One step's marks from `t`: `accum` micro-batches of data, forward and backward, then the
// exchange and the optimizer, each phase `ms[p]` milliseconds.
void add_step(std::vector<DeviceMark>& out, int64_t step, double t, int accum,
              const double (&ms)[kStepPhases]) {
  out.push_back({step, -1, t});
  for (int k = 0; k < accum; ++k)
    for (int p : {kData, kFwd, kBwd}) out.push_back({step, p, t += 1e-3 * ms[p]});
  for (int p : {kExch, kOpt}) out.push_back({step, p, t += 1e-3 * ms[p]});
}

}  // namespace

TEST_CASE("a step's device marks become its phases' spans, in order", "[device-steps]") {
  std::vector<DeviceMark> marks;
  marks.push_back({6, kBwd, 99.0});  // a step whose start is not here: let go
  add_step(marks, 7, 100.0, 2, {0.5, 1, 2, 3, 4});
  marks.push_back({8, -1, 200.0});
  marks.push_back({8, 9, 200.5});  // no such phase: no span, but the step reaches it
  marks.push_back({8, kOpt, 201.0});
  const std::vector<DeviceSpan> s = device_spans(marks);
  REQUIRE(s.size() == 1 + 8 + 1 + 1);
  CHECK(s[0].step == 7);
  CHECK(s[0].phase == -1);
  CHECK(s[0].t0 == 100.0);
  CHECK(s[0].t1 == Approx(100.0 + 1e-3 * (2 * 3.5 + 7)));
  const int want[] = {kData, kFwd, kBwd, kData, kFwd, kBwd, kExch, kOpt};
  const double ms[] = {0.5, 1, 2, 3, 4};
  for (int i = 0; i < 8; ++i) {
    INFO("span " << i);
    CHECK(s[1 + i].phase == want[i]);
    CHECK(s[1 + i].t1 - s[1 + i].t0 == Approx(1e-3 * ms[want[i]]));
    CHECK(s[1 + i].t0 == (i == 0 ? s[0].t0 : s[i].t1));  // back to back from the start
  }
  CHECK(s[9].step == 8);
  CHECK(s[9].t1 == 201.0);
  CHECK(s[10].phase == kOpt);
  CHECK(s[10].t0 == 200.5);
  CHECK(trace_phase(kBwd) == TracePhase::backward);
  CHECK(trace_phase(-1) == TracePhase::step);
}

// Three ranks' device marks for 20 steps: rank 1's backward takes `slow` times as long, so the
// others wait for it at the exchange (their exchange spans grow by the wait). The log, filled
// after the fact as a GPU run fills it, must name rank 1 in backward and not the others'
// exchange.
TEST_CASE("device marks fill the straggler log after the fact, waits taken out",
          "[device-steps][straggler]") {
  const int n = 3;
  const int64_t steps = 20;
  for (const double slow : {1.0, 1.5}) {
    INFO("rank 1's backward x" << slow);
    InProcessGroup group(n);
    std::vector<Straggler> named(n);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        auto comm = group.communicator(r);
        PhaseLog log(n, steps, 1, /*host_memory=*/false);
        REQUIRE(log.on());
        log.begin_epoch(0);
        log.begin_step(0);  // host clocks do not write a device-fed log
        log.add(StepPhase::forward, 1.0);
        log.end_step();
        std::vector<DeviceMark> marks;
        for (int64_t s = 0; s < steps; ++s) {
          const double bwd = r == 1 ? 2 * slow : 2, wait = 2 * slow - bwd;
          add_step(marks, s + 1, 0.1 * static_cast<double>(s), 1, {0, 1, bwd, 1 + wait, 1});
        }
        for (const DeviceSpan& sp : device_spans(marks)) {
          if (sp.phase < 0) continue;
          log.add_to(sp.step - 1, static_cast<StepPhase>(sp.phase), sp.t1 - sp.t0);
          if (sp.phase == kExch) log.arrive_at(sp.step - 1, 0, sp.t0);
        }
        named[static_cast<size_t>(r)] = log.epoch_straggler(*comm);
      });
    for (auto& t : ts) t.join();
    if (slow == 1.0) {
      CHECK(named[0].rank == -1);
    } else {
      CHECK(named[0].rank == 1);
      CHECK(named[0].phase == static_cast<int>(StepPhase::backward));
      CHECK(named[0].excess == Approx(0.5));
    }
    CHECK(named[1].rank == -1);  // rank 0 alone names it
  }
}

TEST_CASE("the trace's device track: its window, its own thread, packed and back",
          "[device-steps][trace]") {
  TraceConfig w;
  w.from_step = 2;
  w.steps = 2;
  StepTrace t(w);
  const auto origin = StepTrace::Clock::now();
  t.start_clock(origin);
  const double o = std::chrono::duration<double>(origin.time_since_epoch()).count();
  for (int64_t s = 1; s <= 4; ++s) {
    const auto at = o + static_cast<double>(s);
    t.device_span(TracePhase::backward, s, at, at + 0.25);
  }
  const std::vector<double> packed = t.take();
  const auto spans = unpack_spans(packed.data(), packed.size());
  REQUIRE(spans.size() == 2);
  CHECK(spans[0].step == 2);
  CHECK(spans[0].track == 1);
  CHECK(spans[0].start_us == Approx(2e6));
  CHECK(spans[0].dur_us == Approx(0.25e6));
  std::vector<double> bad = packed;
  bad[6] = 2;  // no such track
  CHECK_THROWS_AS(unpack_spans(bad.data(), bad.size()), SystemError);
  const auto doc = nlohmann::json::parse(trace_json({spans}, "test"));
  int device_names = 0, on_device = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("tid") == 1 &&
        e.at("args").at("name") == "device")
      ++device_names;
    if (e.at("ph") == "X" && e.at("tid") == 1) ++on_device;
  }
  CHECK(device_names == 1);
  CHECK(on_device == 2);
  // A host-only trace names no device thread.
  TraceSpan host;
  const auto doc0 = nlohmann::json::parse(trace_json({{host}}, "test"));
  for (const auto& e : doc0.at("traceEvents")) CHECK(e.value("tid", 0) == 0);
}
