#pragma once
// One replica of a run: its device, model, optimizer, gradient exchange, sampler shard and
// buffers. run() trains every epoch; a training step reads top to bottom in train_step():
// forward and backward over the micro-batches (buckets are reduced while backward runs), the
// rest of the reduction, the optimizer update.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/backend/gpu.hpp"  // GraphAgreement
#include "dtrain/base/rng.hpp"
#include "dtrain/data/pipeline.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/comm/exchange.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/optimizer.hpp"
#include "dtrain/train/noise_scale.hpp"
#include "dtrain/train/straggler.hpp"
#include "dtrain/train/trace.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain {

class NcclGroup;

// In-process replicas that share one copy of the weights and optimizer state (replicas:
// shared; replicas hold identical weights after every step, so one copy serves them all), in
// host memory or on the one GPU that every replica is on (`dev`, which only holds it).
// `params` are the weights every replica's model reads (no gradients: each replica has its
// own). The ranks fold their gradients into reduced[step % 2] (see
// Communicator::reduce_shared) and the last rank runs `opt`: two buffers, so that a rank still
// reading step s's sum (the noise scale) is never overwritten by a faster rank folding step
// s + 1. update_s: the seconds the update of a step took, also by step parity.
struct SharedWeights {
  std::unique_ptr<Device> dev;
  Buffer<float> params;
  std::unique_ptr<Optimizer> opt;
  Buffer<float> reduced[2];
  double update_s[2] = {0, 0};
};

// What the replicas of one run share: read-only, but for `result`, which rank 0 fills, and the
// shared weights.
struct RunContext {
  const Config& cfg;
  const DataSplit& data;
  TrainObserver* observer;  // rank 0's only
  TrainResult result;
  CpuOptions cpu{};
  Placement place{};
  std::shared_ptr<NcclGroup> nccl{};  // gradients of GPU replicas, where not colocated
  bool nccl_per_process = false;      // one replica per process: its communicator is index 0
  int gpus_in_process = 1;            // GPUs this process drives
  const Checkpoint* resume = nullptr;  // continue from here
  std::shared_ptr<SharedWeights> shared{};  // null: each replica has its own weights
};

class Replica {
 public:
  Replica(RunContext& run, Communicator& comm);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Trains every epoch, or until the loss diverges (every rank sees the same reduced numbers,
  // so all stop together). Rank 0 reports to the observer and fills the run's result.
  void run();

 private:
  // One epoch's training steps, as this rank measured them.
  struct EpochTimes {
    double data = 0, compute = 0, exchange = 0, exposed = 0, optimizer = 0, total = 0;
  };
  struct EpochTotals {  // reduced over all ranks
    double loss_sum = 0, correct = 0, seen = 0;
    double lr_first = 0, lr_last = 0;
    EpochTimes times;
  };

  EpochTotals train_epoch(int epoch);
  // forward, backward and reduce, update; step_stats gets this rank's [loss, correct, rows]
  // (loss and correct on the device, in dev_stats_).
  void train_step(const EpochPlan& plan, int64_t s, double lr, EpochTimes& t);
  void forward_backward(const EpochPlan& plan, int64_t s, double* stats, EpochTimes& t);
  // Micro-batch k of step s into yb_ and the returned rows x features (xb_, its augmented
  // copy, or the input pipeline's buffer on the CPU); `rows` gets its size.
  const float* load_micro_batch(const EpochPlan& plan, int64_t s, int k, int64_t& rows);
  // Image files: the pipeline starts on the epoch's micro-batches from step `first`.
  void start_input(const EpochPlan& plan, int epoch, int64_t first);
  // Test samples [lo, lo + rows) into yb_ and the returned features.
  const float* load_test_chunk(int64_t lo, int64_t rows);
  void reduce_gradients(EpochTimes& t);
  // Shared weights: the optimizer step, called by the exchange on the last rank.
  void update_shared();
  Optimizer& optimizer() { return run_.shared ? *run_.shared->opt : *opt_; }
  // The gradients after the exchange: this replica's buffer, or the shared one.
  float* reduced_grads() {
    return run_.shared ? run_.shared->reduced[global_step_ & 1].data() : model_->grads();
  }
  // The mode of this step, agreed by every rank: CUDA graphs for full-size steps where on.
  GraphMode graph_policy(int64_t global_rows);
  // Test loss sum and correct predictions over the whole test set (every rank scores its
  // shard; the counts are summed).
  std::vector<double> evaluate();
  EpochMetrics epoch_metrics(int epoch, const EpochTotals& tr, const std::vector<double>& test,
                             double eval_s);
  void upload_training_set();
  void make_exchange(size_t n_params);
  void enable_graphs();
  void read_fault_injection();
  void report_start();
  void check_fault();
  void add_noise_step(const double* st);
  void reduced_norm(double* out);
  // Checkpoints (collective: every rank calls them at the same step). `partial`: the epoch in
  // progress, of which `next_step` steps are done.
  void checkpoint(int epoch, int64_t next_step, const EpochTotals* partial);
  void restore(const Checkpoint& c);
  void restore_partial_epoch(EpochTotals& out);
  bool stop_agreed(int64_t step);
  // Copies the device's per-step sums of the first `steps` steps into step_stats_ (whose rows
  // the host counted).
  void pull_step_stats(int64_t steps);
  // Every rank's values (the same count on each), in rank order, on rank 0; empty elsewhere.
  std::vector<double> gather(const std::vector<double>& mine);
  // The same for words, sent in 16-bit pieces, which doubles hold exactly.
  std::vector<uint64_t> gather_words(const std::vector<uint64_t>& mine);
  void mark(int phase) {
    if (queue_) queue_->step_mark(phase);
  }
  // train.trace: every rank's spans since the last call to rank 0, which hands the whole trace
  // so far to the observer (trace.json). Collective: called where the window has begun.
  void write_trace();
  // The origin of the trace's and the straggler log's times, common to every rank (collective).
  void start_clock();
  // Stragglers: adds seconds to the step in progress's phase (CPU, more than one replica).
  void log_phase(StepPhase p, double seconds) {
    if (phase_row_) phase_row_[static_cast<int>(p)] += seconds;
  }
  // DTRAIN_SLOW: stretches this rank's phase by its factor, given the phase's time so far.
  void slow_down(StepPhase p, double busy_s);
  // The epoch's straggler, from every rank's phase log (collective; rank 0's answer, none
  // elsewhere).
  Straggler epoch_straggler();

  RunContext& run_;
  const Config& cfg_;
  Communicator& comm_;
  const int rank_, replicas_;
  const Dataset& train_;
  const Dataset& test_;
  const int64_t features_, micro_, gbatch_;
  const int accum_;

  std::unique_ptr<Device> dev_;
  DeviceQueue* queue_ = nullptr;  // null on the CPU
  Buffer<float> dev_train_x_;     // on a GPU the training set is uploaded once
  Buffer<int32_t> dev_train_y_;
  const float* train_x_ = nullptr;
  const int32_t* train_y_ = nullptr;
  std::unique_ptr<Model> model_;
  Rng replica_rng_;
  std::unique_ptr<Optimizer> opt_;  // null where the weights are shared
  double step_lr_ = 0;              // the LR of the step in progress (for update_shared)
  Sampler sampler_;
  int64_t steps_ = 0;
  int64_t eval_rows_ = 1;  // rows of an evaluation chunk (eval_chunk_rows)
  std::unique_ptr<GradExchange> exchange_;
  bool exchange_on_host_ = false;
  bool wait_before_exchange_ = false;
  Model::GradsReady on_ready_;
  std::string graph_state_;         // "on", "off: <why>", or empty on the CPU
  GraphAgreement graph_agreement_;  // when the ranks vote on graph steps

  Buffer<float> xb_, xa_;  // batch (or evaluation chunk) and its augmented copy
  Buffer<int32_t> yb_;
  std::vector<int64_t> idx_;
  // dataset: folder: the training and the test set's decode threads (null otherwise).
  std::unique_ptr<ImagePipeline> train_input_, test_input_;
  int64_t input_decoded_ = 0;  // the training pipeline's counters at the epoch's start
  double input_busy_s_ = 0;
  double input_since_s_ = 0;  // the epoch's time (t.total) when they were taken
  double input_wait_s_ = 0;   // the last micro-batch's wait for the pipeline
  Buffer<double> dev_stats_;    // per step [loss sum, correct], on the device all epoch
  Buffer<double> graph_stats_;  // a graph step's sums, at the address it was captured with
  Buffer<double> dev_test_;
  // Per step on the device (kDev values) and, at the epoch's end, on the host summed over the
  // ranks (kHost values): loss sum, correct predictions, and for the noise scale the squared
  // gradient norm before and after the exchange; the host adds the step's rows.
  static constexpr size_t kLoss = 0, kCorrect = 1, kLocalNorm = 2, kReducedNorm = 3, kRows = 4;
  static constexpr size_t kDev = 4, kHost = 5;
  std::vector<double> step_stats_;
  bool measure_noise_ = false;
  bool noise_from_micro_ = false;  // one replica: the first micro-batch is the small batch
  NoiseScale noise_;
  int64_t global_step_ = 0;
  int64_t fault_step_ = -1;  // DTRAIN_FAULT
  int start_epoch_ = 0;      // where a resumed run continues
  int64_t start_step_ = 0;
  int64_t last_checkpoint_ = -1;  // global step of the last checkpoint
  StepTrace trace_;
  bool track_stragglers_ = false;  // the CPU with more than one replica
  StepLog step_log_;
  std::vector<double> phase_log_;  // this epoch's StepLog values
  double* phase_row_ = nullptr;    // the step in progress's
  int64_t phase_first_ = 0;        // the epoch's first step run here (a resumed epoch's later)
  int slow_phase_ = -1;            // DTRAIN_SLOW=RANK:PHASE:FACTOR (a StepPhase; -1: none)
  double slow_factor_ = 1;
  std::vector<std::vector<TraceSpan>> trace_ranks_;  // rank 0: every rank's spans so far
  bool trace_written_ = false;                       // the window is over and written

  // Declared last, so destroyed first: a failure in this replica aborts NCCL before anything
  // that waits on its streams unwinds (the exchange's and the device's destructors), or a
  // peer's queued collective would keep this rank from ever getting to the abort.
  struct AbortOnUnwind {
    NcclGroup* group = nullptr;
    int uncaught = std::uncaught_exceptions();
    ~AbortOnUnwind();
  } abort_on_unwind_;
};

}  // namespace dtrain
