#include "dtrain/comm/exchange.hpp"

#include <algorithm>
#include <chrono>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace {
using Clock = std::chrono::steady_clock;

class HostExchange final : public GradExchange {
 public:
  HostExchange(Communicator& comm, Device& dev, ReduceOp op, size_t n, size_t bucket)
      : GradExchange(n, bucket), comm_(comm), dev_(dev), op_(op) {}
  std::string kind() const override {
    return dev_.host_memory() ? comm_.kind() : comm_.kind() + " through host copies";
  }

 protected:
  void reduce(float* data, size_t n) override {
    if (dev_.host_memory()) {
      comm_.allreduce(data, n, op_);
      return;
    }
    staging_.resize(n);
    dev_.download(staging_.data(), data, n * sizeof(float));
    comm_.allreduce(staging_.data(), n, op_);
    dev_.upload(data, staging_.data(), n * sizeof(float));
  }

 private:
  Communicator& comm_;
  Device& dev_;
  ReduceOp op_;
  std::vector<float> staging_;
};
class SharedExchange final : public GradExchange {
 public:
  SharedExchange(Communicator& comm, Device& dev, ReduceOp op, size_t n, size_t bucket,
                 std::function<float*()> out, std::function<void()> then,
                 std::function<void(double)> folded)
      : GradExchange(n, bucket),
        comm_(comm),
        dev_(dev),
        op_(op),
        out_(std::move(out)),
        then_(std::move(then)),
        folded_(std::move(folded)) {}
  std::string kind() const override { return comm_.kind() + " into shared weights"; }

 protected:
  void reduce(float*, size_t) override {}  // the whole buffer goes in wait()
  void wait() override { comm_.reduce_shared(dev_, buffer(), size(), op_, out_(), then_, folded_); }

 private:
  Communicator& comm_;
  Device& dev_;
  ReduceOp op_;
  std::function<float*()> out_;
  std::function<void()> then_;
  std::function<void(double)> folded_;
};
}  // namespace

GradExchange::GradExchange(size_t n_params, size_t bucket_elems) : n_(n_params) {
  const size_t b = bucket_elems == 0 ? std::max<size_t>(n_params, 1) : bucket_elems;
  for (size_t end = n_params; end > 0; end -= std::min(end, b)) {
    ends_.push_back(end);
    starts_.push_back(end - std::min(end, b));
  }
  single_ = bucket_elems == 0;  // the one bucket waits for finish()
}

void GradExchange::begin(float* grads) {
  grads_ = grads;
  low_ = n_;
  next_ = 0;
  seconds_ = 0;
}

void GradExchange::ready(size_t offset, size_t count) {
  if (!grads_) DTRAIN_THROW_SYSTEM("gradient exchange: ready() before begin()");
  if (offset + count > n_) DTRAIN_THROW_SYSTEM("gradient exchange: range outside the buffer");
  low_ = std::min(low_, offset);
  if (!single_) launch_ready();
}

void GradExchange::launch_ready() {
  const auto t0 = Clock::now();
  while (next_ < starts_.size() && low_ <= starts_[next_]) {
    float* bucket = grads_ + starts_[next_];
    const size_t n = ends_[next_] - starts_[next_];
    if (norm_) {  // queued before the reduction; its host time is not the exchange's
      const auto t_norm = Clock::now();
      norm_dev_->sum_squares(bucket, n, norm_);
      seconds_ -= std::chrono::duration<double>(Clock::now() - t_norm).count();
    }
    if (hook_) {
      const auto start = Clock::now();
      reduce(bucket, n);
      hook_(next_, t0, start, Clock::now());
    } else {
      reduce(bucket, n);
    }
    ++next_;
  }
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void GradExchange::finish() {
  if (!grads_) DTRAIN_THROW_SYSTEM("gradient exchange: finish() before begin()");
  low_ = 0;
  launch_ready();
  const auto t0 = Clock::now();
  wait();
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  grads_ = nullptr;
}

std::unique_ptr<GradExchange> make_host_exchange(Communicator& comm, Device& dev, ReduceOp op,
                                                 size_t n_params, size_t bucket_elems) {
  return std::make_unique<HostExchange>(comm, dev, op, n_params, bucket_elems);
}

std::unique_ptr<GradExchange> make_shared_exchange(Communicator& comm, Device& dev, ReduceOp op,
                                                   size_t n_params, size_t bucket_elems,
                                                   std::function<float*()> out,
                                                   std::function<void()> then,
                                                   std::function<void(double)> folded) {
  return std::make_unique<SharedExchange>(comm, dev, op, n_params, bucket_elems, std::move(out),
                                          std::move(then), std::move(folded));
}

}  // namespace dtrain
