// The ordered fold of replicas that share one GPU (Communicator::reduce_shared) without the host
// waiting for the device: each rank's stream is ordered against the others by fences alone.
// A device whose queue defers its work, as a GPU's stream does, records every fold, fence and
// later read; the queued work then runs in adversarial orders that respect only each queue's
// own order and the fences (a wait on a fence holds until the queue that recorded it has run
// past the latest record made before the wait was queued: CUDA's event semantics). Every order
// must give each rank the rank-order sum of every round.
#include <catch2/catch.hpp>
#include <functional>
#include <stdexcept>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/fibers.hpp"
#include "dtrain/comm/comm.hpp"

using namespace dtrain;

namespace {

struct SimFence final : QueueFence {
  int queue = -1;  // the queue of the latest record, -1 before any
  size_t pos = 0;  // that record's index in its queue
};

struct QueuedOp {
  std::function<void()> work;  // empty for fences
  int wait_queue = -1;         // a wait: holds until that queue has run past wait_pos
  size_t wait_pos = 0;
};

constexpr size_t kFoldLen = 16;  // floats a rank adds each round

[[noreturn]] void not_modelled() {
  throw std::logic_error("a deferred test device was asked for work it does not model");
}

class DeferredQueue final : public DeviceQueue {
 public:
  explicit DeferredQueue(int id) : id_(id) {}
  std::vector<QueuedOp> ops;
  size_t done = 0;  // ops run so far

  void synchronize() override { not_modelled(); }  // the protocol under test never waits
  void* native_stream() override { return nullptr; }
  int64_t launches() const override { return 0; }
  std::unique_ptr<QueueFence> make_fence() override { return std::make_unique<SimFence>(); }
  void record(QueueFence& f) override {
    auto& s = dynamic_cast<SimFence&>(f);
    s.queue = id_;
    s.pos = ops.size();
    ops.push_back({});
  }
  void wait_for(QueueFence& f) override {
    const auto& s = dynamic_cast<SimFence&>(f);
    QueuedOp op;
    op.wait_queue = s.queue;  // never recorded: nothing to wait for
    op.wait_pos = s.pos;
    ops.push_back(op);
  }
  void step_begin(int64_t) override {}
  void step_mark(int) override {}
  void anchor_clock() override {}
  size_t take_step_marks(std::vector<DeviceMark>&, bool) override { return 0; }
  void enable_graphs(bool, size_t, AbortGate*) override {}
  GraphMode graph_step_propose() const override { return GraphMode::eager; }
  GraphMode graph_step_begin(GraphMode) override { return GraphMode::eager; }
  void graph_step_end() override {}
  void graph_step_abort() noexcept override {}
  GraphMode graph_mode() const override { return GraphMode::eager; }
  int64_t graph_launches() const override { return 0; }

 private:
  int id_;
};

// Only fold() and the queue are modelled; every other call throws.
class DeferredDevice final : public Device {
 public:
  explicit DeferredDevice(int id) : q(id) {}
  DeferredQueue q;
  std::string name() const override { return "deferred"; }
  bool host_memory() const override { return false; }
  DeviceQueue* queue() override { return &q; }
  void fold(float* acc, const float* x, size_t n, bool first, float scale) override {
    std::vector<float> mine(x, x + n);  // the caller's buffer is reused after the call
    q.ops.push_back({[acc, mine, first, scale] {
      for (size_t i = 0; i < mine.size(); ++i)
        acc[i] = (first ? mine[i] : acc[i] + mine[i]) * scale;
    }});
  }
  void* alloc_bytes(size_t) override { not_modelled(); }
  void free_bytes(void*) override { not_modelled(); }
  void upload(void*, const void*, size_t) override { not_modelled(); }
  void download(void*, const void*, size_t) override { not_modelled(); }
  void fill(float*, size_t, float) override { not_modelled(); }
  void zero(void*, size_t) override { not_modelled(); }
  void copy(void*, const void*, size_t) override { not_modelled(); }
  void gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
            int64_t, float, float*, int64_t) override {
    not_modelled();
  }
  void add_bias(float*, const float*, int64_t, int64_t) override { not_modelled(); }
  void bias_grad(const float*, float*, int64_t, int64_t, Accumulate) override { not_modelled(); }
  void activation_forward(Activation, const float*, float*, size_t) override { not_modelled(); }
  void activation_backward(Activation, const float*, const float*, const float*, float*,
                           size_t) override {
    not_modelled();
  }
  void softmax_xent(const float*, const int32_t*, int64_t, int64_t, float, float*, double*, double,
                    double) override {
    not_modelled();
  }
  void gather(const float*, const int32_t*, int64_t, const int64_t*, int64_t, float*,
              int32_t*) override {
    not_modelled();
  }
  void conv_forward(const ConvGeom&, int64_t, const float*, const float*, const float*,
                    float*) override {
    not_modelled();
  }
  void conv_backward(const ConvGeom&, int64_t, const float*, const float*, const float*, float*,
                     float*, float*) override {
    not_modelled();
  }
  void convert_layout(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) override {
    not_modelled();
  }
  void maxpool_forward(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       float*, int32_t*) override {
    not_modelled();
  }
  void maxpool_backward(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, float*) override {
    not_modelled();
  }
  void channel_moments(const float*, int64_t, int64_t, int64_t, int64_t, double*) override {
    not_modelled();
  }
  void bn_prepare(const double*, double, double, double, float*, float*, int64_t) override {
    not_modelled();
  }
  void bn_apply(const float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                int64_t, float*, bool) override {
    not_modelled();
  }
  void bn_backward_sums(const float*, const float*, const float*, const float*, int64_t, int64_t,
                        int64_t, int64_t, double*, float*, float*) override {
    not_modelled();
  }
  void bn_backward_dx(const float*, const float*, const float*, const float*, const double*, double,
                      int64_t, int64_t, int64_t, int64_t, float*) override {
    not_modelled();
  }
  void dropout_mask(float*, size_t, double, uint64_t) override { not_modelled(); }
  void augment(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool,
               uint64_t) override {
    not_modelled();
  }
  void multiply(const float*, const float*, float*, size_t) override { not_modelled(); }
  void add(const float*, const float*, float*, size_t) override { not_modelled(); }
  void add_relu(const float*, const float*, float*, size_t) override { not_modelled(); }
  void embedding_forward(const float*, int64_t, const float*, const float*, int64_t, int64_t,
                         int64_t, int64_t, float*) override {
    not_modelled();
  }
  void embedding_backward(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                          float*, float*) override {
    not_modelled();
  }
  void next_tokens(const float*, int64_t, int64_t, int64_t, int64_t, int32_t*) override {
    not_modelled();
  }
  void layernorm_forward(const float*, const float*, const float*, int64_t, int64_t, float, float*,
                         float*) override {
    not_modelled();
  }
  void layernorm_backward(const float*, const float*, const float*, const float*, int64_t, int64_t,
                          float*, float*, float*) override {
    not_modelled();
  }
  void attention_forward(const float*, int64_t, int64_t, int64_t, int64_t, float*,
                         float*) override {
    not_modelled();
  }
  void attention_backward(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                          int64_t, float*) override {
    not_modelled();
  }
  void scale(float*, size_t, float) override { not_modelled(); }
  void clip_by_norm(const float*, float*, size_t, const double*, float) override { not_modelled(); }
  void sum_squares(const float*, size_t, double*) override { not_modelled(); }
  void sgd_update(float*, const float*, float*, size_t, float, float, float, bool) override {
    not_modelled();
  }
  void adam_update(float*, const float*, float*, float*, size_t, float, float, float, float, float,
                   bool, int64_t) override {
    not_modelled();
  }
};

// Runs every queue to its end, each step the head of the first runnable queue in `order`.
// Returns false on a deadlock (a wait that can never be met).
bool run_all(std::vector<DeferredQueue*>& qs, const std::vector<int>& order) {
  for (;;) {
    bool ran = false, left = false;
    for (int r : order) {
      DeferredQueue& q = *qs[static_cast<size_t>(r)];
      if (q.done == q.ops.size()) continue;
      left = true;
      const QueuedOp& op = q.ops[q.done];
      if (op.wait_queue >= 0 && qs[static_cast<size_t>(op.wait_queue)]->done <= op.wait_pos)
        continue;
      if (op.work) op.work();
      ++q.done;
      ran = true;
      break;
    }
    if (!left) return true;
    if (!ran) return false;
  }
}

}  // namespace

TEST_CASE("shared-weight folds on deferred queues are ordered by fences alone", "[comm]") {
  constexpr int n = 4, rounds = 5;
  // Values whose float sum depends on the order (1e8 + 1 - 1e8 is 0, not 1).
  const auto value = [](int r, int round, size_t i) {
    const float big = (r + static_cast<int>(i)) % 3 == 0 ? 1e8f : 1.0f;
    return (r % 2 ? -big : big) * static_cast<float>(1 + (round + i) % 5) / 5.0f;
  };
  const auto want = [&](int round, size_t i) {
    float acc = value(0, round, i);
    for (int q = 1; q < n; ++q) acc += value(q, round, i);
    return acc * (1.0f / n);
  };
  // Rank orders the device may favour: highest rank first, lowest first, and one mixed.
  const std::vector<std::vector<int>> orders{{3, 2, 1, 0}, {0, 1, 2, 3}, {2, 0, 3, 1}};
  for (const auto& order : orders) {
    InProcessGroup group(n);
    std::vector<std::unique_ptr<DeferredDevice>> devs;
    for (int r = 0; r < n; ++r) devs.push_back(std::make_unique<DeferredDevice>(r));
    std::vector<float> sums[2] = {std::vector<float>(kFoldLen), std::vector<float>(kFoldLen)};
    int wrong = 0, then_calls = 0;
    fibers::run(n, 2, [&](int r) {
      auto comm = group.communicator(r);
      DeferredDevice& dev = *devs[static_cast<size_t>(r)];
      for (int round = 0; round < rounds; ++round) {
        std::vector<float> mine(kFoldLen);
        for (size_t i = 0; i < kFoldLen; ++i) mine[i] = value(r, round, i);
        float* out = sums[round % 2].data();  // two buffers, as the replicas keep them
        comm->reduce_shared(
            dev, mine.data(), kFoldLen, ReduceOp::mean, out, [&] { ++then_calls; }, nullptr);
        // This rank's later work reads the sum (the optimizer, the noise scale): queued.
        dev.q.ops.push_back({[&wrong, out, round, want] {
          for (size_t i = 0; i < kFoldLen; ++i) wrong += out[i] == want(round, i) ? 0 : 1;
        }});
      }
    });
    std::vector<DeferredQueue*> qs;
    for (auto& d : devs) qs.push_back(&d->q);
    INFO("device order " << order[0] << order[1] << order[2] << order[3]);
    REQUIRE(run_all(qs, order));
    CHECK(wrong == 0);
    CHECK(then_calls == rounds);
  }
}
