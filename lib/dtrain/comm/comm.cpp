#include "dtrain/comm/comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/fibers.hpp"

namespace dtrain {

namespace {
// cv.wait(lk, ready), but inside a fiber the worker runs its other fibers meanwhile (spinning
// up to `spin_us` first where another worker can end the wait).
template <class Ready>
void wait_for(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, Ready ready,
              int spin_us = 0) {
  if (fibers::in_fiber() && !ready()) {
    lk.unlock();
    fibers::wait_until(
        [&] {
          std::lock_guard hold(*lk.mutex());
          return ready();
        },
        spin_us);
    lk.lock();
  }
  cv.wait(lk, ready);
}

// A counting semaphore that wakes exactly the one thread (or fiber) waiting on it.
class Signal {
 public:
  void release() {
    {
      std::lock_guard lk(mu_);
      ++count_;
    }
    cv_.notify_one();
    fibers::notify();
  }
  void acquire() {
    std::unique_lock lk(mu_);
    // The rank before this one is often on another core, about to finish: a fiber spins a
    // little first.
    wait_for(lk, cv_, [&] { return count_ > 0; }, /*spin_us=*/200);
    --count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t count_ = 0;
};
}  // namespace

// A reusable barrier that can be aborted (std::barrier cannot), and the turns of an ordered
// fold (reduce_shared): rank r may add its buffer once rank r - 1 has released turn[r].
struct InProcessGroup::State {
  explicit State(int n) : size(n), slots(static_cast<size_t>(n), nullptr) {
    for (int r = 0; r < n; ++r) turn.push_back(std::make_unique<Signal>());
    fence.resize(static_cast<size_t>(n));
  }
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string why;
  std::vector<void*> slots;  // each rank's buffer for the collective in flight
  std::vector<std::unique_ptr<Signal>> turn;
  // A GPU's replicas (reduce_shared): fence[r] marks rank r's fold on its own queue, made by
  // rank r at its first turn and read by the others only after a turn or a barrier.
  std::vector<std::unique_ptr<QueueFence>> fence;

  void wait() {
    std::unique_lock lk(mu);
    if (aborted) throw Aborted(why);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      lk.unlock();
      fibers::notify();
      fibers::yield();  // the worker's earlier fibers go on first, in rank order
      return;
    }
    wait_for(lk, cv, [&] { return generation != gen || aborted; });
    if (aborted) throw Aborted(why);
  }
  void abort(const std::string& reason) {
    std::lock_guard lk(mu);
    if (!aborted) {
      aborted = true;
      why = reason;
      for (auto& t : turn) t->release();  // a rank waiting for its turn wakes and throws
    }
    cv.notify_all();
    fibers::notify();
  }
  void take_turn(int rank) {
    if (rank > 0) turn[static_cast<size_t>(rank)]->acquire();
    std::lock_guard lk(mu);
    if (aborted) throw Aborted(why);
  }
};

namespace {

class InProcessComm final : public Communicator {
 public:
  InProcessComm(std::shared_ptr<InProcessGroup::State> s, int rank)
      : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  std::string kind() const override { return "in-process"; }

  void allreduce(float* data, size_t n, ReduceOp op) override { reduce(data, n, op); }
  void allreduce(double* data, size_t n, ReduceOp op) override { reduce(data, n, op); }
  void abort(const std::string& why) override { s_->abort(why); }

 private:
  template <class T>
  void reduce(T* data, size_t n, ReduceOp op) {
    const int p = s_->size;
    if (p == 1) return;  // sum and mean of one replica are the replica itself
    s_->slots[static_cast<size_t>(rank_)] = data;
    s_->wait();  // every rank's buffer is posted
    // Rank r owns chunk r: it reads that chunk from every buffer, adds ranks in ascending
    // order, and writes the result back into every buffer. No other rank touches the chunk,
    // so no scratch space and no third barrier are needed.
    const size_t lo = n * static_cast<size_t>(rank_) / static_cast<size_t>(p);
    const size_t hi = n * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(p);
    std::vector<T*> bufs(static_cast<size_t>(p));
    for (int q = 0; q < p; ++q)
      bufs[static_cast<size_t>(q)] = static_cast<T*>(s_->slots[static_cast<size_t>(q)]);
    reduce_chunk<T>(bufs, lo, hi, op, bufs);
    s_->wait();  // every chunk is reduced everywhere
  }

  void barrier() override {
    if (s_->size > 1) s_->wait();
  }

  void reduce_shared(Device& dev, const float* data, size_t n, ReduceOp op, float* out,
                     const std::function<void()>& then,
                     const std::function<void(double)>& folded) override {
    // An ordered fold: out = buffer 0, then out += buffer 1, ..., each rank adding its own as
    // soon as the rank before it has, while its gradients are still in this core's cache.
    // Per element that is reduce()'s arithmetic: acc = b0; acc += b1; ...; acc *= 1/p.
    // On a GPU the ranks' queues are ordered by fences, the host waiting for none of them:
    // each rank's fold follows the previous rank's, and every rank's later work follows the
    // last rank's fold and `then`.
    const int p = s_->size;
    s_->take_turn(rank_);
    const bool last = rank_ == p - 1;
    const float scale = last && op == ReduceOp::mean ? 1.0f / static_cast<float>(p) : 1.0f;
    DeviceQueue* queue = dev.queue();
    if (queue && rank_ > 0) queue->wait_for(fence(rank_ - 1, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    dev.fold(out, data, n, rank_ == 0, scale);
    if (folded)
      folded(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (last && then) then();
    if (queue && p > 1) queue->record(fence(rank_, queue));
    if (!last) s_->turn[static_cast<size_t>(rank_ + 1)]->release();
    if (p > 1) s_->wait();  // the sum is queued whole and `then` has run or is queued
    if (queue && !last) queue->wait_for(fence(p - 1, nullptr));
  }

  // Rank r's fence, made by rank r itself (`owner`: its queue) the first time.
  QueueFence& fence(int r, DeviceQueue* owner) {
    auto& f = s_->fence[static_cast<size_t>(r)];
    if (!f && owner) f = owner->make_fence();
    if (!f) DTRAIN_THROW_SYSTEM(fmt::format("rank {}: rank {}'s fence is missing", rank_, r));
    return *f;
  }

  // out[i] = bufs[0][i] + bufs[1][i] + ... in that order (times 1/p for mean) for i in
  // [lo, hi), into every buffer of `outs`. A block at a time, so that the adds run across
  // elements in vector registers.
  template <class T>
  void reduce_chunk(const std::vector<T*>& bufs, size_t lo, size_t hi, ReduceOp op,
                    const std::vector<T*>& outs) {
    const size_t p = bufs.size();
    const T inv = T(1) / static_cast<T>(p);
    constexpr size_t kBlock = 512;
    T acc[kBlock];
    for (size_t b = lo; b < hi; b += kBlock) {
      const size_t m = std::min(kBlock, hi - b);
      std::copy_n(bufs[0] + b, m, acc);
      for (size_t q = 1; q < p; ++q) {
        const T* src = bufs[q] + b;
        for (size_t j = 0; j < m; ++j) acc[j] += src[j];
      }
      if (op == ReduceOp::mean)
        for (size_t j = 0; j < m; ++j) acc[j] *= inv;
      for (T* o : outs) std::copy_n(acc, m, o + b);
    }
  }

  std::shared_ptr<InProcessGroup::State> s_;
  int rank_;
};

}  // namespace

void Communicator::reduce_shared(Device&, const float*, size_t, ReduceOp, float*,
                                 const std::function<void()>&, const std::function<void(double)>&) {
  DTRAIN_THROW_SYSTEM(kind() + " communicator: no shared reduction (replicas in one process only)");
}

void Communicator::barrier() {
  double token = 0;
  allreduce(&token, 1, ReduceOp::sum);
}

std::pair<size_t, size_t> shared_part(size_t n, int rank, int ranks) {
  const auto cut = [&](int k) {
    if (k >= ranks) return n;
    return n * static_cast<size_t>(k) / static_cast<size_t>(ranks) / 16 * 16;
  };
  return {cut(rank), cut(rank + 1)};
}

InProcessGroup::InProcessGroup(int size) : state_(std::make_shared<State>(size)) {}
InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  return std::make_unique<InProcessComm>(state_, rank);
}

void InProcessGroup::abort(const std::string& why) {
  state_->abort(why);
}

}  // namespace dtrain
