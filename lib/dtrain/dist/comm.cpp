#include "dtrain/dist/comm.hpp"

#include <condition_variable>
#include <mutex>
#include <vector>

#include "dtrain/base/error.hpp"

namespace dtrain {

// A reusable barrier that can be aborted (std::barrier cannot).
struct InProcessGroup::State {
  explicit State(int n) : size(n), slots(static_cast<size_t>(n), nullptr) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string why;
  std::vector<void*> slots;  // each rank's buffer for the collective in flight

  void wait() {
    std::unique_lock lk(mu);
    if (aborted) throw Aborted(why);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (aborted) throw Aborted(why);
  }
  void abort(const std::string& reason) {
    std::lock_guard lk(mu);
    if (!aborted) {
      aborted = true;
      why = reason;
    }
    cv.notify_all();
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
    const T inv = T(1) / static_cast<T>(p);
    std::vector<T*> bufs(static_cast<size_t>(p));
    for (int q = 0; q < p; ++q)
      bufs[static_cast<size_t>(q)] = static_cast<T*>(s_->slots[static_cast<size_t>(q)]);
    for (size_t i = lo; i < hi; ++i) {
      T acc = bufs[0][i];
      for (int q = 1; q < p; ++q) acc += bufs[static_cast<size_t>(q)][i];
      if (op == ReduceOp::mean) acc *= inv;
      for (int q = 0; q < p; ++q) bufs[static_cast<size_t>(q)][i] = acc;
    }
    s_->wait();  // every chunk is reduced everywhere
  }

  std::shared_ptr<InProcessGroup::State> s_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size) : state_(std::make_shared<State>(size)) {}
InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  return std::make_unique<InProcessComm>(state_, rank);
}

void InProcessGroup::abort(const std::string& why) {
  state_->abort(why);
}

}  // namespace dtrain
