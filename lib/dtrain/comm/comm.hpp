#pragma once
// Gradient exchange between replicas. Implementations are picked at run time; this one header
// says what every implementation promises: in-place all-reduce, the same result on every rank,
// and, for the in-process one, a fixed reduction order (rank 0 + rank 1 + ...) so results do not
// depend on thread timing.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace dtrain {

class Device;  // backend/device.hpp

enum class ReduceOp { sum, mean };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string kind() const = 0;
  virtual void allreduce(float* data, size_t n, ReduceOp op) = 0;
  virtual void allreduce(double* data, size_t n, ReduceOp op) = 0;
  // For replicas that share one copy of the weights (threads of one process): reduces every
  // rank's `data` into `out` alone, with allreduce's arithmetic (rank 0 + rank 1 + ..., in that
  // order), and the last rank then calls then(); returns when `then` has returned. Each rank
  // adds its part with Device::fold on `dev`, its own device. Where replicas share a GPU, each
  // on its own stream, the ranks' streams are ordered by fences (DeviceQueue::record,
  // wait_for): a rank's fold follows the previous rank's, and each rank's later work follows
  // the last rank's fold and whatever `then` queued; the host returns without waiting for the
  // device. Each rank calls folded(seconds) (where set) right after its own fold, with the
  // fold's host seconds (on a GPU, its queueing's), before the next rank's turn: the exchange
  // work that is the rank's own, where a slow rank delays the ranks after it. Throws
  // SystemError where the ranks do not share memory.
  virtual void reduce_shared(Device& dev, const float* data, size_t n, ReduceOp op, float* out,
                             const std::function<void()>& then,
                             const std::function<void(double)>& folded);
  // Returns once every rank has called it.
  virtual void barrier();
  // Releases every rank blocked in a collective (they throw Aborted); used when one rank fails.
  virtual void abort(const std::string& why) = 0;
};

// Part `rank` of `ranks` of an n-element buffer, [first, second): cut at multiples of 16
// elements, so that a part starts where the runs of vector lanes of a whole pass would (replicas
// that share weights each update one).
std::pair<size_t, size_t> shared_part(size_t n, int rank, int ranks);

// A group of `size` in-process ranks (threads sharing memory). Create once, then hand
// communicator(r) to the thread of rank r.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();
  std::unique_ptr<Communicator> communicator(int rank);
  void abort(const std::string& why);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dtrain
