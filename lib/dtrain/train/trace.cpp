#include "dtrain/train/trace.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.hpp"
#include "dtrain/base/json.hpp"

namespace dtrain {

namespace {
constexpr size_t kPacked = 7;  // phase, step, index, start, duration, ready, track
constexpr auto kPhases = static_cast<size_t>(TracePhase::bn_sync) + 1;

// The row function: one span as one complete event.
nlohmann::json span_event(const TraceSpan& s, size_t rank) {
  nlohmann::json args = {{"step", s.step}};
  if (s.index >= 0) args["bucket"] = s.index;
  if (s.ready_us >= 0) args["ready_ts"] = s.ready_us;
  std::string name = to_string(s.phase);
  if (s.phase == TracePhase::bucket) name += " " + std::to_string(s.index);
  return {{"name", name}, {"cat", to_string(s.phase)}, {"ph", "X"},
          {"ts", s.start_us}, {"dur", s.dur_us}, {"pid", rank},
          {"tid", s.track},   {"args", args}};
}
}  // namespace

const char* to_string(TracePhase p) {
  static const char* const names[kPhases] = {"step",       "data",     "forward",   "backward",
                                             "bucket",     "exchange", "optimizer", "evaluation",
                                             "checkpoint", "bn sync"};
  const auto i = static_cast<size_t>(p);
  return i < kPhases ? names[i] : "?";
}

void StepTrace::add(TracePhase p, Clock::time_point t0, Clock::time_point t1, int64_t index,
                    const Clock::time_point* ready) {
  if (spans_.capacity() == 0) spans_.reserve(256);
  using us = std::chrono::duration<double, std::micro>;
  spans_.push_back({p, step_, index, us(t0 - origin_).count(), us(t1 - t0).count(),
                    ready ? us(*ready - origin_).count() : -1.0});
}

void StepTrace::device_span(TracePhase p, int64_t step, double t0, double t1) {
  if (!cfg_.enabled() || step < cfg_.from_step || step >= cfg_.from_step + cfg_.steps) return;
  spans_.push_back({p, step, -1, 1e6 * seconds_at(t0), 1e6 * (t1 - t0), -1.0, 1});
}

std::vector<double> StepTrace::take() {
  std::vector<double> out;
  out.reserve(spans_.size() * kPacked);
  for (const TraceSpan& s : spans_) {
    out.insert(out.end(), {static_cast<double>(s.phase), static_cast<double>(s.step),
                           static_cast<double>(s.index), s.start_us, s.dur_us, s.ready_us,
                           static_cast<double>(s.track)});
  }
  spans_.clear();
  return out;
}

std::vector<TraceSpan> unpack_spans(const double* packed, size_t n) {
  if (n % kPacked != 0) DTRAIN_THROW_SYSTEM("trace: a packed span array of a wrong length");
  std::vector<TraceSpan> out;
  out.reserve(n / kPacked);
  for (size_t i = 0; i < n; i += kPacked) {
    const double* v = packed + i;
    const auto whole = [](double x) { return std::abs(x) < 0x1p62 && x == std::floor(x); };
    if (!(v[0] >= 0 && v[0] < static_cast<double>(kPhases)) || !whole(v[1]) || !whole(v[2]) ||
        !std::isfinite(v[3]) || !(v[4] >= 0) || !(v[6] == 0 || v[6] == 1))
      DTRAIN_THROW_SYSTEM("trace: a malformed packed span");
    out.push_back({static_cast<TracePhase>(static_cast<int>(v[0])), static_cast<int64_t>(v[1]),
                   static_cast<int64_t>(v[2]), v[3], v[4], std::isfinite(v[5]) ? v[5] : -1.0,
                   static_cast<int>(v[6])});
  }
  return out;
}

std::string trace_json(const std::vector<std::vector<TraceSpan>>& ranks,
                       const std::string& about) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r},
                      {"args", {{"sort_index", r}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0},
                      {"args", {{"name", "host"}}}});
    if (std::any_of(ranks[r].begin(), ranks[r].end(), [](const TraceSpan& s) { return s.track; }))
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 1},
                        {"args", {{"name", "device"}}}});
    std::vector<TraceSpan> spans = ranks[r];  // in time order, parents before their children
    std::stable_sort(spans.begin(), spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
      return a.start_us != b.start_us ? a.start_us < b.start_us : a.dur_us > b.dur_us;
    });
    for (const TraceSpan& s : spans) events.push_back(span_event(s, r));
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"about", about}}}};
  return json_text(doc, 1) + "\n";
}

}  // namespace dtrain
