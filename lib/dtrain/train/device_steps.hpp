#pragma once
// Training steps as a device ran them: the spans between a step's device marks
// (DeviceQueue::step_begin, step_mark), which give a GPU run its phase times, its straggler log
// and the trace's device track.
#include <cstdint>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/train/straggler.hpp"
#include "dtrain/train/trace.hpp"

namespace dtrain {

struct DeviceSpan {
  int64_t step = 0;
  int phase = -1;  // a StepPhase's number; -1: the whole step, from its start to its last mark
  double t0 = 0, t1 = 0;  // seconds on the steady clock
};

// Per step: the whole step, then one span per mark after its start (the phase a mark ends ran
// from the mark before it), in the marks' order. Marks with no start of their step before them
// are let go, as are phases outside StepPhase.
std::vector<DeviceSpan> device_spans(const std::vector<DeviceMark>& marks);

// The trace's name of a device span's phase.
TracePhase trace_phase(int phase);

}  // namespace dtrain
