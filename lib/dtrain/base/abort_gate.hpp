#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace dtrain {

// The abort protocol of communicators that several threads use. Every use of a communicator (an
// NCCL call, or the launch of a CUDA graph that holds NCCL calls) happens while holding a Pass.
// close() marks the gate closed before anything else, so that no new pass is handed out (enter()
// throws Aborted instead), then waits for the passes still out; only then may its caller free
// the communicators. A pass is short: NCCL calls only queue work on the host (communicators
// connect when they are created, see NcclGroup::local), and nobody waits for the device while
// holding one. One exception: an NCCL call whose work queue is full spins on the host until the
// GPU drains it, which never happens behind a failed peer, and only NCCL's abort flag ends that
// spin. So close() waits a bounded time, then lets its caller abort anyway (as PyTorch's NCCL
// watchdog does).
class AbortGate {
 public:
  class Pass {
   public:
    Pass() = default;
    Pass(Pass&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Pass& operator=(Pass&&) = delete;
    Pass(const Pass&) = delete;
    ~Pass();

   private:
    friend class AbortGate;
    explicit Pass(AbortGate* g) : gate_(g) {}
    AbortGate* gate_ = nullptr;
  };
  // A pass for one use of the communicators; throws Aborted (naming `what`) once closed.
  Pass enter(const char* what);
  // Closes the gate and waits until every pass is back, or `limit` has passed (then it says so
  // in the log). True for the call that closed it.
  bool close(std::chrono::seconds limit = std::chrono::seconds(30));
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int out_ = 0;
  bool closed_ = false;
};

}  // namespace dtrain
