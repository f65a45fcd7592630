#pragma once
// CUDA graphs of the steady-state training step, for CudaDevice (see DeviceQueue in
// device.hpp for the protocol): capture, instantiate, launch and drop, which graph a step
// takes, and the staging of the per-step values that a replay still has to supply. In the
// spirit of tiny-cuda-nn's cuda_graph.h, but a graph per timing slot and per-step values that
// change between replays.
//
// The rule that keeps the device's operations free of graph logic: in a replay an operation
// queues nothing (CudaDevice::enqueue skips its work, the graph holds it) and only stages its
// per-step values (stage(), param()), which end() copies to the device before the launch.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dtrain/backend/cuda/kernels.hpp"  // kernels::Param
#include "dtrain/backend/device.hpp"        // GraphMode

namespace dtrain {

class AbortGate;

// Per-step values of kernels: copied from a pinned host area to one device area. Eagerly, each
// value is copied as it is staged (stream order keeps earlier readers safe); inside a graph
// step they are collected and copied once, before the graph's launch, so that a replay reads
// this step's values at the addresses the capture recorded. The host areas form a ring: one is
// reused once the copy out of it (queued earlier) has run.
class StagingRing {
 public:
  StagingRing(cudaStream_t stream, int rank) : stream_(stream), rank_(rank) {}
  ~StagingRing() { release(); }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t capacity() const { return cap_; }
  size_t used() const { return used_; }  // bytes staged in the current area
  bool fits(size_t span) const { return used_ + span <= cap_; }
  // Waits for the stream, then reallocates every area with `cap` bytes.
  void reallocate(size_t cap);
  // Copies `bytes` from src into the current area (taking `span` bytes of it) and returns the
  // device address they have (once copied). `copy_now`: queue that copy at once.
  const void* put(const void* src, size_t bytes, size_t span, bool copy_now);
  // Queues the copy of everything staged in the current area (before a graph launch).
  void copy_area();
  // Moves to the next area, once the copies out of it (queued earlier) have run.
  void next_area();
  void release();

 private:
  static constexpr int kAreas = 4;
  struct Area {
    char* host = nullptr;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  cudaStream_t stream_;
  int rank_;
  Area areas_[kAreas];
  int area_ = 0;
  size_t used_ = 0, cap_ = 0;
  char* dev_ = nullptr;
};

// The graphs of one device's stream: one per timing slot (each records its slot's events).
class CudaGraph {
 public:
  static constexpr int kSlots = 4;  // the device's timing slots
  CudaGraph(cudaStream_t stream, int rank) : stream_(stream), rank_(rank), ring_(stream, rank) {}
  ~CudaGraph() { drop(); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  GraphMode mode() const { return mode_; }
  bool replaying() const { return mode_ == GraphMode::replay; }
  int64_t launches() const { return launches_; }

  // DeviceQueue's functions of the same names; `slot` is the timing slot the step takes.
  void enable(bool on, size_t staging_bytes, AbortGate* gate);
  GraphMode propose(int slot) const;
  // `before_start()` runs where a graph step does start, before its capture (the device waits
  // there for the slot's previous timing events).
  template <class F>
  GraphMode begin(GraphMode agreed, int slot, F&& before_start) {
    if (!accept(agreed, slot)) return GraphMode::eager;
    before_start();
    return start(agreed, slot);
  }
  void end();
  void abort() noexcept;
  // Drops every graph; the next graph step comes after one eager step. Whenever device memory
  // is freed (the graphs may point into it).
  void drop();
  // Drops the graphs and frees the staging area (the device's teardown).
  void release();

  // This step's `count` values at src, where the step's kernels read them on the device.
  template <class T>
  const T* stage(const T* src, size_t count) {
    return static_cast<const T*>(stage_bytes(src, count * sizeof(T)));
  }
  // A per-step value for a kernel: by value eagerly, staged inside a graph step.
  template <class T>
  kernels::Param<T> param(const T& v) {
    static_assert(sizeof(T) <= 16, "graph_staging_bytes plans 16 bytes a value");
    kernels::Param<T> p;
    p.value = v;
    if (mode_ != GraphMode::eager) p.at = stage(&v, 1);
    return p;
  }

 private:
  bool accept(GraphMode agreed, int slot);
  GraphMode start(GraphMode agreed, int slot);
  void instantiate(int slot);
  const void* stage_bytes(const void* src, size_t bytes);
  void reserve(size_t cap);  // staging of at least `cap` bytes (growing it drops the graphs)
  void fit_capture();        // staging for what the warm-up step staged, before a capture

  cudaStream_t stream_;
  int rank_;
  GraphMode mode_ = GraphMode::eager;
  bool on_ = false;
  size_t staging_ = 0;         // enable()'s staging room
  AbortGate* gate_ = nullptr;  // of the communicators the graphs hold NCCL calls of
  int warm_ = 0;               // eager steps since the graphs were last dropped
  int slot_ = -1;              // of the step in progress
  // What the warm-up step staged (eagerly, from its start to the next step's), which a
  // capture must fit: the plan (enable's staging_bytes) is checked against it.
  size_t eager_staged_ = 0, warm_staged_ = 0;
  bool warming_ = false, warned_ = false;
  cudaGraphExec_t graphs_[kSlots] = {nullptr, nullptr, nullptr, nullptr};
  size_t staged_[kSlots] = {0, 0, 0, 0};  // bytes each graph's capture staged
  int64_t launches_ = 0;
  StagingRing ring_;
};

}  // namespace dtrain
