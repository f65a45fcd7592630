// CUDA graphs of the steady-state step and the staging of per-step values (see cuda_graph.hpp).
#include "dtrain/backend/cuda/cuda_graph.hpp"

#include <cuda_runtime.h>  // cudaMalloc and cudaMallocHost of typed pointers
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/gpu_check.hpp"
#include "dtrain/base/abort_gate.hpp"
#include "dtrain/base/error.hpp"

namespace dtrain {

// ---- StagingRing ----

void StagingRing::reallocate(size_t cap) {
  DT_CUDA(cudaStreamSynchronize(stream_), rank_);
  release();
  for (auto& a : areas_) {
    DT_CUDA(cudaMallocHost(&a.host, cap), rank_);
    DT_CUDA(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming), rank_);
  }
  DT_CUDA(cudaMalloc(&dev_, cap), rank_);
  cap_ = cap;
}

const void* StagingRing::put(const void* src, size_t bytes, size_t span, bool copy_now) {
  char* h = areas_[area_].host + used_;
  char* d = dev_ + used_;
  std::memcpy(h, src, bytes);
  used_ += span;
  if (copy_now) DT_CUDA(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_), rank_);
  return d;
}

void StagingRing::copy_area() {
  if (used_) {
    DT_CUDA(cudaMemcpyAsync(dev_, areas_[area_].host, used_, cudaMemcpyHostToDevice, stream_),
            rank_);
  }
}

void StagingRing::next_area() {
  Area& a = areas_[area_];
  if (used_ > 0) {
    DT_CUDA(cudaEventRecord(a.done, stream_), rank_);
    a.pending = true;
  }
  area_ = (area_ + 1) % kAreas;
  Area& b = areas_[area_];
  if (b.pending) {
    DT_CUDA(cudaEventSynchronize(b.done), rank_);
    b.pending = false;
  }
  used_ = 0;
}

void StagingRing::release() {
  for (auto& a : areas_) {
    if (a.host) cudaFreeHost(a.host);
    if (a.done) cudaEventDestroy(a.done);
    a = Area{};
  }
  if (dev_) cudaFree(dev_);
  dev_ = nullptr;
  cap_ = used_ = 0;
  area_ = 0;
}

// ---- CudaGraph ----

void CudaGraph::enable(bool on, size_t staging_bytes, AbortGate* gate) {
  on_ = on;
  staging_ = std::max<size_t>(staging_bytes, 4096);
  gate_ = gate;
  if (!on) drop();
  // The staging area now, not at the first capture (growing it drops graphs).
  if (on) reserve(staging_);
}

GraphMode CudaGraph::propose(int slot) const {
  if (!on_ || mode_ != GraphMode::eager) return GraphMode::eager;
  // One eager step first: buffers, plans and workspaces take their sizes.
  if (warm_ < 1) return GraphMode::eager;
  // The graph of the timing slot the step will take, if it was captured.
  return graphs_[slot] ? GraphMode::replay : GraphMode::capture;
}

// Whether the agreed step is a graph step here.
bool CudaGraph::accept(GraphMode agreed, int slot) {
  if (!on_ || mode_ != GraphMode::eager) return false;
  if (warming_) warm_staged_ = eager_staged_;  // the warm-up step is over
  warming_ = false;
  if (agreed == GraphMode::eager) {
    // Every rank runs this step op by op. The graphs still held here are dropped, so that all
    // ranks capture again together; this step is the warm-up.
    drop();
    warm_ = 1;
    warming_ = true;
    eager_staged_ = 0;
    return false;
  }
  // agree_graph_mode picks capture or replay only where every rank proposed it.
  if (agreed != propose(slot))
    throw SystemError(fmt::format("rank {}: CUDA graphs: the ranks agreed on {}, which this rank "
                                  "did not propose",
                                  rank_, agreed == GraphMode::capture ? "a capture" : "a replay"),
                      __FILE__, __LINE__);
  return true;
}

GraphMode CudaGraph::start(GraphMode agreed, int slot) {
  if (ring_.capacity() < staging_)
    throw SystemError(
        fmt::format("rank {}: CUDA graphs: no staging area (enable_graphs first)", rank_), __FILE__,
        __LINE__);
  if (agreed == GraphMode::capture) fit_capture();
  ring_.next_area();  // an empty area for this step's values
  slot_ = slot;
  if (agreed == GraphMode::replay) {
    mode_ = GraphMode::replay;
  } else {
    DT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), rank_);
    mode_ = GraphMode::capture;
  }
  return mode_;
}

void CudaGraph::end() {
  const int k = slot_;
  if (mode_ == GraphMode::capture) {
    instantiate(k);
  } else if (mode_ == GraphMode::replay) {
    mode_ = GraphMode::eager;
    if (ring_.used() != staged_[k])
      throw SystemError(fmt::format("rank {}: a CUDA-graph step staged {} bytes of per-step "
                                    "values but its capture staged {} (the step changed shape)",
                                    rank_, ring_.used(), staged_[k]),
                        __FILE__, __LINE__);
  } else {
    return;
  }
  // The graph may hold NCCL calls: launched only while its communicators are not aborted.
  const AbortGate::Pass pass = gate_ ? gate_->enter("CUDA graph launch") : AbortGate::Pass{};
  ring_.copy_area();
  DT_CUDA(cudaGraphLaunch(graphs_[k], stream_), rank_);
  ++launches_;
  ring_.next_area();  // the copy out of this area is queued; it is reused once that has run
}

// Ends the capture of slot k's step and keeps its executable graph.
void CudaGraph::instantiate(int k) {
  cudaGraph_t g = nullptr;
  mode_ = GraphMode::eager;
  DT_CUDA(cudaStreamEndCapture(stream_, &g), rank_);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  DT_CUDA(e, rank_);
  graphs_[k] = exec;
  staged_[k] = ring_.used();
}

void CudaGraph::abort() noexcept {
  if (mode_ == GraphMode::capture) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // clear the capture's error
  }
  mode_ = GraphMode::eager;
}

void CudaGraph::drop() {
  for (auto& g : graphs_)
    if (g) {
      cudaGraphExecDestroy(g);
      g = nullptr;
    }
  warm_ = 0;
}

void CudaGraph::release() {
  drop();
  ring_.release();
}

// The plan (Replica::enable_graphs) sizes the staging area from what a step stages; where the
// warm-up step staged more, the area grows before the first capture (no graph is held then:
// the warm-up dropped them), saying so once.
void CudaGraph::fit_capture() {
  if (warm_staged_ <= ring_.capacity()) return;
  for (auto g : graphs_)
    if (g) return;  // a capture's overflow then fails with stage_bytes' message
  if (!warned_)
    gpu_warn(
        fmt::format("rank {}: CUDA graphs: a step stages {} bytes of per-step values, more "
                    "than the {} planned; the staging area grows to fit",
                    rank_, warm_staged_, staging_));
  warned_ = true;
  staging_ = warm_staged_;
  ring_.reallocate(staging_);  // waits for the stream: nothing reads the old area any more
}

const void* CudaGraph::stage_bytes(const void* src, size_t bytes) {
  const size_t span = graph_stage_span(bytes);
  if (mode_ == GraphMode::eager) {
    eager_staged_ += span;
    if (ring_.capacity() < span) reserve(std::max<size_t>(span, 65536));
    if (!ring_.fits(span)) ring_.next_area();
  } else if (!ring_.fits(span)) {
    throw SystemError(fmt::format("rank {}: a CUDA-graph step stages more than {} bytes", rank_,
                                  ring_.capacity()),
                      __FILE__, __LINE__);
  }
  return ring_.put(src, bytes, span, mode_ == GraphMode::eager);
}

void CudaGraph::reserve(size_t cap) {
  if (cap <= ring_.capacity()) return;
  drop();  // they read the old device area
  ring_.reallocate(cap);
}

}  // namespace dtrain
