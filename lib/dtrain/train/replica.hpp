#pragma once
// One replica of a run: its device, model, optimizer, gradient exchange, sampler shard and
// buffers. run() trains every epoch; a training step reads top to bottom in train_step():
// forward and backward over the micro-batches (buckets are reduced while backward runs), the
// rest of the reduction, the optimizer update. What a step measures besides training is kept by
// objects of their own: the per-step sums (StepStats), the noise scale (NoiseProbe), the
// straggler log (PhaseLog), the step trace (StepTrace, TraceWindow); checkpoints are
// replica_checkpoint.hpp's.
#include <chrono>
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
#include "dtrain/train/noise_probe.hpp"
#include "dtrain/train/phase_log.hpp"
#include "dtrain/train/replica_checkpoint.hpp"
#include "dtrain/train/step_stats.hpp"
#include "dtrain/train/telemetry.hpp"
#include "dtrain/train/trace.hpp"
#include "dtrain/train/trace_window.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain {

class NcclGroup;

// In-process replicas that share one copy of the weights and optimizer state (replicas:
// shared; replicas hold identical weights after every step, so one copy serves them all), in
// host memory or on the one GPU that every replica is on (`dev`, which only holds it).
// `params` are the weights every replica's model reads (no gradients: each replica has its
// own). The ranks fold their gradients into reduced[step % 2] (see
// Communicator::reduce_shared); then on a GPU the last rank runs `opt`, and in host memory each
// rank updates its own part of the weights (Optimizer::update_part) after the last rank has
// run what precedes the parts (Optimizer::prepare). Two buffers, so that a rank still reading
// step s's sum (the noise scale) is never overwritten by a faster rank folding step s + 1.
// update_s: the seconds the last rank's share of a step's update took, also by step parity.
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
  std::shared_ptr<DeviceSampler> devices{};  // this process's devices.csv sampler (null: off)
  int devices_rank = 0;         // the rank of this process that takes its rows each epoch
  bool devices_gather = false;  // ranks in other processes: rows go to rank 0 by a collective
  // Every rank in this process: its CPU time and the CPUs it may use are the run's (other_cores;
  // processes bound to cores each see their own CPUs alone).
  bool one_process = true;
  bool replica_threads = true;  // each replica has a thread of its own (not taking turns)
  bool one_thread = false;      // every replica takes its turn on one thread (threads: 1)
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
    double scoring_s = 0;  // train.eval_steps: scoring the test set between steps (not in times)
    double saved_s = 0;    // the checkpoint before the epoch's scoring (not in times)
  };

  EpochTotals train_epoch(int epoch);
  // The epoch's phase split (device events on a GPU) and its sums over every step, once the
  // step stats are reduced (StepStats::finish_epoch).
  void close_epoch(EpochTotals& out);
  // Collective: the device samples since the last call (train.telemetry_ms) to rank 0's
  // observer, at each epoch's end and each checkpoint within an epoch.
  void report_devices(int epoch);
  // forward, backward and reduce, update; stats_ gets this rank's sums of step s (see
  // StepStats).
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
  // Shared weights: called by the exchange on the last rank once the sum is whole: the
  // optimizer step on a GPU; in host memory what precedes the parts (Optimizer::prepare).
  void update_shared();
  // Shared weights in host memory: called by the exchange right after this rank's own fold,
  // in its turn, with the fold's seconds: the rank's exchange work in the straggler log.
  void folded(double seconds);
  // Shared weights in host memory: this rank's part of the update, then a wait for the other
  // ranks' parts (the next forward pass reads them all).
  void update_own_part(EpochTimes& t);
  Optimizer& optimizer() { return run_.shared ? *run_.shared->opt : *opt_; }
  // The gradients after the exchange: this replica's buffer, or the shared one.
  float* reduced_grads() {
    return run_.shared ? run_.shared->reduced[global_step_ & 1].data() : model_->grads();
  }
  // The mode of this step, agreed by every rank: CUDA graphs for full-size steps where on.
  GraphMode graph_policy(int64_t global_rows);
  // Test loss sum and correct predictions over the whole test set (every rank scores its
  // shard; the counts are summed). `stoppable`: the epoch's own scoring, after its checkpoint,
  // which a stop ends between chunks (Interrupted) rather than after the whole test set.
  std::vector<double> evaluate(bool stoppable = false);
  // Collective: whether any rank was asked to stop, asked at every call.
  bool stop_voted();
  // train.eval_steps: whether the test set is scored after step s (0-based) of an epoch; the
  // epoch's last step is scored by the epoch's own evaluation.
  bool scoring_due(int64_t s) const {
    return cfg_.train.eval_steps > 0 && global_step_ % cfg_.train.eval_steps == 0 &&
           s + 1 < steps_;
  }
  // Scores the test set after `done` steps of `epoch` without changing what training or a later
  // evaluation sees (collective); returns the seconds it took. `train_s`: the epoch's training
  // time so far.
  double score_between_steps(int epoch, int64_t done, const EpochPlan& plan, double train_s);
  // One scoring (`test`: evaluate()'s sums) after `done` steps of `epoch`, `samples` into the
  // run: whether it reached the targets (every rank), and with train.eval_steps its point,
  // recorded by rank 0.
  void record_scoring(int epoch, int64_t done, int64_t samples, const std::vector<double>& test,
                      double train_s);
  // Whether any rank's scorings reached the targets (collective).
  bool reached_everywhere();
  EpochMetrics epoch_metrics(int epoch, const EpochTotals& tr, const std::vector<double>& test,
                             double eval_s);
  void upload_training_set();
  void make_model();
  void make_exchange(size_t n_params);
  void enable_graphs();
  void plan_convolutions(int64_t micro_rows);  // cuDNN plans before the first epoch
  void read_fault_injection();
  void report_start();
  void check_fault();
  // Checkpoints (collective: every rank calls them at the same step). `partial`: the epoch in
  // progress, of which `next_step` steps are done.
  void checkpoint(int epoch, int64_t next_step, const EpochTotals* partial);
  // After an epoch's scoring: the checkpoint taken before it is written again past it, where
  // the scoring took longer than that write (a resume then need not score the epoch again);
  // where scoring is the cheaper, a resume redoes it and a write is saved. Ranks agree.
  void checkpoint_scored(int epoch, double scoring_s, double saved_s);
  void restore(const Checkpoint& c);
  // The first steps of the epoch a resumed run continues in: their sums and times.
  void resume_epoch(EpochTotals& out);
  // What a checkpoint reads from this replica and a restore writes.
  ReplicaState state();
  bool stop_agreed(int64_t step);
  // On a GPU: the device's event at the end of phase p of the step in progress.
  void mark(StepPhase p) {
    if (queue_) queue_->step_mark(static_cast<int>(p));
  }
  // On a GPU, at the epoch's end: the phases' device times into `dt` (compute, exchange,
  // optimizer seconds), the straggler log and the trace's device track.
  void read_device_steps(double* dt);
  double bn_sync_taken(int64_t s, StepPhase p, double span);
  // On a GPU: ties the device's clock to the host's again (a wait for the queue) where the
  // last tie is `every_s` old or more. A step's start is a float of milliseconds from the tie
  // (device.hpp): tied every 10 s it is within a microsecond, where once an epoch it drifts
  // by 15 us after 4 minutes.
  void anchor_device_clock(double every_s);

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
  std::chrono::steady_clock::time_point anchored_at_{};  // anchor_device_clock's last tie
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
  // Shared weights in host memory: each rank updates its own part of the weights
  // (shared_part), its own optimizer work, where a straggler can be named. On a GPU the last
  // rank updates them all.
  bool own_part_ = false;
  std::chrono::steady_clock::time_point fold_ready_{};  // when it arrived at the shared sum
  // A GPU whose exchange goes through the host (colocated replicas, a copy each): per step of the
  // epoch, the seconds the host spent exchanging buckets inside backward, with the device idle. Its
  // events count them as backward; read_device_steps moves them to the exchange.
  std::vector<double> exchange_in_backward_;
  // A GPU with synchronised BatchNorm: per step of the epoch, the host's seconds in the
  // statistics' exchanges inside forward and inside backward (two a step), the device idle
  // meanwhile: its events count them in the pass, read_device_steps takes them out.
  std::vector<double> bn_sync_in_pass_;
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
  StepStats stats_;  // the epoch's per-step sums
  Buffer<double> dev_test_;
  NoiseProbe noise_;  // the gradient noise scale
  int64_t global_step_ = 0;
  int64_t fault_step_ = -1;  // DTRAIN_FAULT
  bool fault_oom_ = false;   // ... as std::bad_alloc
  int start_epoch_ = 0;      // where a resumed run continues
  int64_t start_step_ = 0;
  int64_t last_checkpoint_ = -1;  // global step of the last checkpoint
  double bn_sync_s_ = 0;  // the epoch's synchronised-BatchNorm exchanges (LayerContext)
  CpuClocks epoch_clocks_;       // at the epoch's start: other work on the machine (other_cores)
  double devices_period_s_ = 0;  // devices.csv's coarsest sampling period reported so far
  const Targets targets_;
  bool target_reached_ = false;  // by a scoring so far (train.stop_at_target)
  StepTrace trace_;
  TraceWindow trace_window_;
  PhaseLog phases_;  // stragglers: the epoch's phase times
  SlowPhase slow_;   // DTRAIN_SLOW: a straggler planted here

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
