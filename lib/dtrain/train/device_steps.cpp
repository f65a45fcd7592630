#include "dtrain/train/device_steps.hpp"

namespace dtrain {

std::vector<DeviceSpan> device_spans(const std::vector<DeviceMark>& marks) {
  std::vector<DeviceSpan> out;
  size_t whole = 0;          // the step span of the step in progress, in `out`
  const DeviceMark* prev = nullptr;  // the step in progress's last mark
  for (const DeviceMark& m : marks) {
    if (m.phase < 0) {
      whole = out.size();
      out.push_back({m.step, -1, m.t, m.t});
      prev = &m;
      continue;
    }
    if (!prev || m.step != prev->step) {
      prev = nullptr;  // a mark of a step whose start is not here
      continue;
    }
    if (m.phase < kStepPhases) out.push_back({m.step, m.phase, prev->t, m.t});
    out[whole].t1 = m.t;
    prev = &m;
  }
  return out;
}

TracePhase trace_phase(int phase) {
  switch (phase) {
    case static_cast<int>(StepPhase::data): return TracePhase::data;
    case static_cast<int>(StepPhase::forward): return TracePhase::forward;
    case static_cast<int>(StepPhase::backward): return TracePhase::backward;
    case static_cast<int>(StepPhase::exchange): return TracePhase::exchange;
    case static_cast<int>(StepPhase::optimizer): return TracePhase::optimizer;
    default: return TracePhase::step;
  }
}

}  // namespace dtrain
