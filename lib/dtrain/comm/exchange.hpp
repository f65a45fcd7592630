#pragma once
// The gradient exchange of one replica. The flat gradient buffer is cut into buckets of a fixed
// size from its end towards its start (backward finishes the last layers first, as in PyTorch
// DDP); each bucket is all-reduced as soon as backward has finished all of it, so on a device
// with an asynchronous communicator the exchange overlaps the rest of backward. The reduction
// of each element does not depend on the bucket it falls in, so any bucket size gives the same
// result as one all-reduce of the whole buffer.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/comm/comm.hpp"
#include "dtrain/backend/device.hpp"

namespace dtrain {

class GradExchange {
 public:
  // bucket_elems = 0: one bucket, reduced when backward is over.
  GradExchange(size_t n_params, size_t bucket_elems);
  virtual ~GradExchange() = default;
  virtual std::string kind() const = 0;

  // Start of the backward pass whose gradients are exchanged (the last micro-step of a step).
  void begin(float* grads);
  // Backward has finished the gradient range [offset, offset + count).
  void ready(size_t offset, size_t count);
  // Whether ready(offset, ...) would start the reduction of a bucket now.
  bool would_launch(size_t offset) const {
    return !single_ && grads_ && next_ < starts_.size() && std::min(low_, offset) <= starts_[next_];
  }
  // Reduces what is left and waits: afterwards the buffer holds the reduced gradients (on a GPU:
  // for all work queued after this call on the device's stream).
  void finish();

  // The local squared gradient norm for the noise scale, for the step begun next: each
  // bucket's values are added to *norm just before the bucket is reduced (the last moment they
  // are this replica's own). `norm` is memory of `dev`; null turns it off. The time it takes is
  // compute, not exchange: seconds() leaves it out.
  void measure_norm(Device* dev, double* norm) {
    norm_dev_ = dev;
    norm_ = norm;
  }

  // Device seconds the exchange itself took (first bucket to last, on its own stream) over the
  // steps since the last call, waiting for them when `wait`; negative where the exchange runs
  // on the host (then seconds() is the measure).
  virtual double take_device_seconds(bool /*wait*/) { return -1; }

  // Called after each bucket's reduction call returns (on a host exchange: the reduction is
  // done; on a device: queued) with the bucket's number, when the launch found it ready, and
  // the call's start and end. Null: nothing is called (a step trace sets it).
  using Clock = std::chrono::steady_clock;
  using BucketHook = std::function<void(size_t bucket, Clock::time_point ready,
                                        Clock::time_point start, Clock::time_point end)>;
  void on_bucket(BucketHook hook) { hook_ = std::move(hook); }

  size_t bucket_count() const { return starts_.size(); }
  size_t buckets_launched() const { return next_; }
  // Host seconds spent inside the exchange since the last begin().
  double seconds() const { return seconds_; }

 protected:
  virtual void reduce(float* data, size_t n) = 0;  // may return before the reduction is done
  virtual void wait() {}                           // every reduce() so far has completed
  float* buffer() const { return grads_; }         // the buffer given to begin()
  size_t size() const { return n_; }               // its length

 private:
  void launch_ready();
  size_t n_;
  std::vector<size_t> starts_, ends_;  // bucket k: [starts_[k], ends_[k]), k = 0 at the end
  float* grads_ = nullptr;
  size_t low_ = 0;   // lowest offset backward has finished
  size_t next_ = 0;  // first bucket not yet launched
  double seconds_ = 0;
  bool single_ = false;  // one bucket, reduced in finish()
  Device* norm_dev_ = nullptr;
  double* norm_ = nullptr;
  BucketHook hook_;
};

// All-reduce through a host Communicator (in-process threads or MPI). On a device whose memory
// the host cannot read, each bucket goes through a host copy.
std::unique_ptr<GradExchange> make_host_exchange(Communicator& comm, Device& dev, ReduceOp op,
                                                 size_t n_params, size_t bucket_elems);

// For replicas that share one copy of the weights (in-process; CPU replicas, or replicas on
// one GPU): buckets are not reduced as they become ready (each replica's buffer is its own),
// and finish() reduces the whole buffer into out() with Communicator::reduce_shared on `dev`,
// which calls `then` once the sum is whole and `folded` after this rank's own fold.
std::unique_ptr<GradExchange> make_shared_exchange(Communicator& comm, Device& dev, ReduceOp op,
                                                   size_t n_params, size_t bucket_elems,
                                                   std::function<float*()> out,
                                                   std::function<void()> then,
                                                   std::function<void(double)> folded);

}  // namespace dtrain
