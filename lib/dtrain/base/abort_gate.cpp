#include "dtrain/base/abort_gate.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"

namespace dtrain {

AbortGate::Pass::~Pass() {
  if (!gate_) return;
  std::lock_guard lk(gate_->mu_);
  if (--gate_->out_ == 0) gate_->cv_.notify_all();
}

AbortGate::Pass AbortGate::enter(const char* what) {
  std::lock_guard lk(mu_);
  if (closed_)
    throw Aborted(
        fmt::format("{} not started: the communicators were aborted after a failure", what));
  ++out_;
  return Pass(this);
}

bool AbortGate::close(std::chrono::seconds limit) {
  std::unique_lock lk(mu_);
  if (closed_) return false;
  closed_ = true;  // first: from here on nobody starts using the communicators
  // Passes are short (NCCL calls that queue work); say so if one is not.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cv_.wait_until(lk, std::min(deadline, std::chrono::steady_clock::now() +
                                                    std::chrono::seconds(10)),
                         [&] { return out_ == 0; })) {
    if (std::chrono::steady_clock::now() >= deadline) {
      // A call blocked on a failed peer: only NCCL's abort can release it.
      log().error("abort: {} NCCL call(s) still in flight after {} s; aborting the "
                  "communicators anyway, which releases calls blocked on a failed peer",
                  out_, limit.count());
      break;
    }
    log().warn("abort: waiting for {} NCCL call(s) in flight before aborting the communicators",
               out_);
  }
  return true;
}

bool AbortGate::closed() const {
  std::lock_guard lk(mu_);
  return closed_;
}

}  // namespace dtrain
