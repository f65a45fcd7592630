// NCCL for the gradients of GPU replicas: communicator setup (in one process, or across
// processes with the unique id broadcast over MPI), the bucketed exchange on a communication
// stream ordered by CUDA events, and abort.
//
// Abort: a failing replica's thread aborts every communicator of the group, while the other
// replicas' threads may be about to use theirs. So the group has a gate (AbortGate): every NCCL
// call, and every launch of a CUDA graph holding NCCL calls, happens with a pass from it;
// abort() closes the gate first (later calls throw Aborted instead of touching a
// communicator), waits for the calls in flight, and only then calls ncclCommAbort.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/gpu_check.hpp"
#include "dtrain/comm/nccl.hpp"
#include "dtrain/comm/mpi.hpp"

namespace dtrain {

namespace {

// NCCL's message, and for system and remote errors its last error's text.
std::string nccl_detail(ncclResult_t r) {
  return fmt::format("{}{}", ncclGetErrorString(r),
                     r == ncclSystemError || r == ncclRemoteError
                         ? fmt::format("; {}", ncclGetLastError(nullptr))
                         : "");
}

// Like DT_CUDA (gpu_check.hpp); ncclInProgress is no error (nonblocking communicators).
#define DT_NCCL(expr, rank)                                                             \
  do {                                                                                  \
    const ncclResult_t dt_nccl_ = (expr);                                               \
    if (dt_nccl_ != ncclSuccess && dt_nccl_ != ncclInProgress)                          \
      ::dtrain::throw_gpu_error((rank), "NCCL", #expr, nccl_detail(dt_nccl_), __FILE__, \
                                __LINE__);                                              \
  } while (0)

class NcclExchange final : public GradExchange {
 public:
  NcclExchange(ncclComm_t comm, AbortGate& gate, int rank, int gpu, Device& dev, ReduceOp op,
               size_t n, size_t bucket)
      : GradExchange(n, bucket),
        comm_(comm),
        gate_(gate),
        rank_(rank),
        gpu_(gpu),
        queue_(dev.queue()),
        compute_(queue_ ? static_cast<cudaStream_t>(queue_->native_stream()) : nullptr),
        mean_(op == ReduceOp::mean) {
    if (!compute_) DTRAIN_THROW_SYSTEM("NCCL exchange needs a CUDA device");
    DT_NCCL(ncclCommCount(comm_, &ranks_), rank_);
    DT_CUDA(cudaSetDevice(gpu_), rank_);
    DT_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), rank_);
    DT_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), rank_);
    DT_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), rank_);
  }
  ~NcclExchange() override {
    cudaSetDevice(gpu_);
    // After an abort the stream may hold collectives that wait for a failed peer: not waited.
    if (!gate_.closed()) cudaStreamSynchronize(comm_stream_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    for (auto& sl : slots_)
      for (auto e : sl.ev)
        if (e) cudaEventDestroy(e);
    cudaStreamDestroy(comm_stream_);
  }
  std::string kind() const override { return "NCCL"; }

  // Time on the communication stream from the first bucket to the last, per step: events in a
  // ring of slots, read before reuse.
  // Steps inside CUDA graphs are not timed here (negative: the exposed time is the measure).
  double take_device_seconds(bool wait) override {
    for (auto& sl : slots_)
      if (sl.recorded) read(sl, wait);
    const double t = untimed_ ? -1.0 : taken_;
    taken_ = 0;
    untimed_ = false;
    return t;
  }

 protected:
  // The bucket's gradients are final once the compute stream reaches this point: the
  // communication stream waits for that, then all-reduces in place while backward goes on.
  // Inside a CUDA-graph capture the same calls fork the communication stream into the graph
  // and join it back; a replay queues nothing (the graph holds it all).
  void reduce(float* data, size_t n) override {
    const auto mode = queue_->graph_mode();
    if (mode == GraphMode::replay) return;
    DT_CUDA(cudaEventRecord(ready_, compute_), rank_);
    DT_CUDA(cudaStreamWaitEvent(comm_stream_, ready_, 0), rank_);
    if (mode == GraphMode::capture) {
      untimed_ = true;
    } else if (buckets_launched() == 0) {  // the step's first bucket: start its timing slot
      cur_ = (cur_ + 1) % kSlots;
      if (slots_[cur_].recorded) read(slots_[cur_], true);
      for (auto*& e : slots_[cur_].ev)
        if (!e) DT_CUDA(cudaEventCreate(&e), rank_);
      DT_CUDA(cudaEventRecord(slots_[cur_].ev[0], comm_stream_), rank_);
      started_ = true;
    }
    const AbortGate::Pass pass = gate_.enter("NCCL all-reduce");
    DT_NCCL(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, comm_stream_), rank_);
    // A mean as the host paths make it: the sum, then times the float 1/ranks (mean_factor).
    // ncclAvg would scale each input before the sum: other bits.
    if (mean_ && ranks_ > 1 && n > 0) {
      scale_on_stream(data, n, mean_factor(ranks_), comm_stream_);
      DT_CUDA(cudaGetLastError(), rank_);
    }
  }
  // The optimizer (on the compute stream) waits for the last bucket; the host does not.
  void wait() override {
    const auto mode = queue_->graph_mode();
    if (mode == GraphMode::replay) {
      untimed_ = true;
      return;
    }
    if (started_) {
      DT_CUDA(cudaEventRecord(slots_[cur_].ev[1], comm_stream_), rank_);
      slots_[cur_].recorded = true;
      started_ = false;
    }
    DT_CUDA(cudaEventRecord(done_, comm_stream_), rank_);
    DT_CUDA(cudaStreamWaitEvent(compute_, done_, 0), rank_);
  }

 private:
  static constexpr int kSlots = 4;
  struct Slot {
    cudaEvent_t ev[2] = {nullptr, nullptr};
    bool recorded = false;
  };
  void read(Slot& sl, bool wait) {
    if (!wait && cudaEventQuery(sl.ev[1]) == cudaErrorNotReady) return;
    DT_CUDA(cudaEventSynchronize(sl.ev[1]), rank_);
    float ms = 0;
    DT_CUDA(cudaEventElapsedTime(&ms, sl.ev[0], sl.ev[1]), rank_);
    taken_ += ms * 1e-3;
    sl.recorded = false;
  }
  Slot slots_[kSlots];
  int cur_ = 0;
  bool started_ = false;
  bool untimed_ = false;  // a step ran inside a CUDA graph since the last take
  double taken_ = 0;

  ncclComm_t comm_;
  AbortGate& gate_;
  int rank_, gpu_;
  DeviceQueue* queue_;  // the compute device's queue (never null: checked at construction)
  cudaStream_t compute_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool mean_;      // ReduceOp::mean: ncclSum, then the scale by 1/ranks_
  int ranks_ = 1;  // of the communicator
};

class Group final : public NcclGroup {
 public:
  Group(std::vector<ncclComm_t> comms, std::vector<int> gpus, std::vector<int> ranks)
      : comms_(std::move(comms)), gpus_(std::move(gpus)), ranks_(std::move(ranks)) {}
  // Every replica has stopped by now (their devices, and with them any CUDA graph that holds
  // NCCL calls, are gone: NCCL's destroy waits for such graphs).
  ~Group() override {
    if (!gate_.closed())
      for (auto c : comms_) ncclCommDestroy(c);
  }
  std::unique_ptr<GradExchange> exchange(int local_index, Device& dev, ReduceOp op, size_t n,
                                         size_t bucket) override {
    const auto pass = gate_.enter("NCCL exchange setup");
    const auto i = static_cast<size_t>(local_index);
    return std::make_unique<NcclExchange>(comms_.at(i), gate_, ranks_.at(i), gpus_.at(i), dev, op,
                                          n, bucket);
  }
  void abort() override {
    if (!gate_.close()) return;  // closed and drained; someone else aborts
    // Errors are not reported: the run has failed already, and this only releases the others.
    for (auto c : comms_) (void)ncclCommAbort(c);
  }
  AbortGate& gate() override { return gate_; }
  std::string version() const override {
    int v = 0;
    ncclGetVersion(&v);
    return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<int> gpus_, ranks_;
  AbortGate gate_;
};

}  // namespace

std::shared_ptr<NcclGroup> NcclGroup::local(const std::vector<int>& gpus) {
  // Connect the communicators here rather than at their first collective (NCCL's default since
  // 2.22): a first all-reduce would wait on the host for its peers, and one whose peer failed
  // before it would never return, holding its pass, so abort() would wait forever. Connected
  // communicators only queue work on the host. (A value the user set is kept; NCCL reads it
  // once per process.)
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(gpus.size());
  DT_NCCL(ncclCommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data()), 0);
  std::vector<int> ranks(gpus.size());
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  return std::make_shared<Group>(std::move(comms), gpus, std::move(ranks));
}

std::shared_ptr<NcclGroup> NcclGroup::over_mpi(int gpu, int rank, int size) {
  ncclUniqueId id{};
  if (rank == 0) DT_NCCL(ncclGetUniqueId(&id), rank);
  std::string bytes(reinterpret_cast<const char*>(&id), sizeof(id));
  mpi::broadcast(bytes);
  if (bytes.size() != sizeof(id))
    DTRAIN_THROW_SYSTEM(
        fmt::format("rank {}: NCCL unique id of {} bytes received", rank, bytes.size()));
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(&id));
  DT_CUDA(cudaSetDevice(gpu), rank);
  ncclComm_t comm = nullptr;
  DT_NCCL(ncclCommInitRank(&comm, size, id, rank), rank);
  return std::make_shared<Group>(std::vector<ncclComm_t>{comm}, std::vector<int>{gpu},
                                 std::vector<int>{rank});
}

}  // namespace dtrain
