#include "dtrain/train/replica.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string_view>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/comm/nccl.hpp"
#include "dtrain/nn/schedule.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/device_steps.hpp"
#include "dtrain/train/rank_gather.hpp"

namespace dtrain {

namespace {
using Clock = std::chrono::steady_clock;
// One replica's CPU peak: the best of three 512 x 512 x 512 SGEMMs on its device (its BLAS
// threads), in TFLOP/s; 0 where it cannot be measured.
double sgemm_tflops(Device& d) {
  constexpr int64_t n = 512;
  Buffer<float> a, b, c;
  for (Buffer<float>* x : {&a, &b, &c}) {
    x->resize(d, static_cast<size_t>(n * n));
    d.fill(x->data(), static_cast<size_t>(n * n), 0.5f);
  }
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    d.gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / std::max(best, 1e-9) / 1e12;
}
double measure_sgemm_tflops(Device& d) {
  try {
    return sgemm_tflops(d);
  } catch (const std::exception& e) {  // a finished run is not failed for its peak
    log().warn("peak for the utilisation not measured: {}", e.what());
    return 0;
  }
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
size_t at_least_one(int64_t n) {
  return static_cast<size_t>(std::max<int64_t>(1, n));
}
}  // namespace

Replica::AbortOnUnwind::~AbortOnUnwind() {
  if (group && std::uncaught_exceptions() > uncaught) group->abort();
}

Replica::Replica(RunContext& run, Communicator& comm)
    : run_(run),
      cfg_(run.cfg),
      comm_(comm),
      rank_(comm.rank()),
      replicas_(comm.size()),
      train_(run.data.train),
      test_(run.data.test),
      features_(run.data.train.features()),
      micro_(run.cfg.micro_batch()),
      gbatch_(run.cfg.global_batch()),
      accum_(run.cfg.train.accumulation_steps),
      replica_rng_(stream_key(run.cfg.train.seed, 0xD209, static_cast<uint64_t>(comm.rank()))),
      sampler_(run.data.train.size(), run.cfg.global_batch(), comm.size(),
               run.cfg.train.accumulation_steps, run.cfg.data.shuffle, run.cfg.data.sharding,
               run.cfg.data.drop_remainder, run.cfg.train.seed),
      noise_(run.cfg, comm.size()),
      targets_{run.cfg.train.target_accuracy, run.cfg.train.target_loss},
      trace_(run.cfg.train.trace),
      trace_window_(run.cfg.train.trace),
      slow_(SlowPhase::from_env(comm.rank())),
      abort_on_unwind_{run.nccl.get()} {
  dev_ = run.place.backend == Backend::cuda
             ? make_cuda_device(run.place.gpu_of_replica[static_cast<size_t>(rank_)], rank_,
                                cfg_.precision)
             : make_cpu_device(run.cpu);
  queue_ = dev_->queue();
  upload_training_set();
  // A micro-batch never holds more rows than the training set (a batch larger than the data
  // with drop_remainder: false), nor an evaluation chunk more than the test set.
  const int64_t micro_rows = std::min(micro_, train_.size());
  eval_rows_ = eval_chunk_rows(
      cfg_.train.eval_batch, micro_rows, test_.size(),
      model_size(cfg_.model, train_.shape, train_.classes).activations_per_sample, replicas_);
  if (train_.files) {  // decoded and augmented by the pipeline's threads
    const DataConfig& d = cfg_.data;
    // The run's own transform: data loaded once may serve runs that differ in it.
    train_input_ = std::make_unique<ImagePipeline>(with_transform(train_.files, d), train_.y,
                                                   d.workers, d.prefetch, micro_rows);
    test_input_ = std::make_unique<ImagePipeline>(with_transform(test_.files, d), test_.y,
                                                  d.workers, 1, eval_rows_);
  } else if (cfg_.data.augment.enabled()) {
    xa_.resize(*dev_, at_least_one(micro_rows * features_));
  }
  make_model();
  const auto n_params = static_cast<size_t>(model_->param_count());
  if (!run.shared)
    opt_ = std::make_unique<Optimizer>(*dev_, cfg_.optimizer, n_params, model_->weight_ranges());
  steps_ = sampler_.steps_per_epoch();

  // Batch buffers hold a full micro-batch or an evaluation chunk, whichever is larger.
  const int64_t cap = std::max(micro_rows, eval_rows_);
  xb_.resize(*dev_, static_cast<size_t>(cap * features_));
  yb_.resize(*dev_, static_cast<size_t>(cap));
  idx_.reserve(static_cast<size_t>(cap));

  make_exchange(n_params);
  enable_graphs();
  stats_ = StepStats(*dev_, steps_);
  dev_test_.resize(*dev_, 2);

  read_fault_injection();
  if (run.resume) restore(*run.resume);
  if (run.shared && run.resume && replicas_ > 1) {
    double restored = 0;  // no rank reads the shared weights before rank 0 has restored them
    comm_.allreduce(&restored, 1, ReduceOp::sum);
  }
  if (rank_ == 0) report_start();
  plan_convolutions(micro_rows);
}

Replica::~Replica() = default;

// cuDNN's plans for a training micro-batch (backward too) and an evaluation chunk, made before
// the first epoch: in bf16 their algorithm queries compile engines for seconds (3.7 s for the
// CNN's first shape on an H200), which the first epoch's time would otherwise hold. A shape met
// later (a last, smaller batch) is planned when it first runs.
void Replica::plan_convolutions(int64_t micro_rows) {
  if (run_.place.backend != Backend::cuda) return;
  const auto t0 = Clock::now();
  const int convs = model_->plan_convs(micro_rows, true);
  if (convs == 0) return;
  // Evaluation's chunks of this replica's slice of the test set (evaluate()): full ones and the
  // last, smaller one.
  const int64_t slice = test_.size() * (rank_ + 1) / replicas_ - test_.size() * rank_ / replicas_;
  for (const int64_t rows : {std::min(eval_rows_, slice), slice % eval_rows_})
    if (rows > 0) model_->plan_convs(rows, false);
  if (queue_) queue_->synchronize();
  if (rank_ == 0)
    log().info(
        "cuDNN planned {} convolutions for {}-sample micro-batches and evaluation's chunks in "
        "{:.2f} s (rank 0; each replica plans its own), before the first epoch",
        convs, micro_rows, seconds_since(t0));
}

void Replica::upload_training_set() {
  train_x_ = train_.x.data();
  train_y_ = train_.y.data();
  if (dev_->host_memory() || train_.files) return;
  // On a GPU the training set is uploaded once and batches are gathered there.
  dev_train_x_.resize(*dev_, std::max<size_t>(1, train_.x.size()));
  dev_train_y_.resize(*dev_, std::max<size_t>(1, train_.y.size()));
  dev_->upload(dev_train_x_.data(), train_.x.data(), train_.x.size() * sizeof(float));
  dev_->upload(dev_train_y_.data(), train_.y.data(), train_.y.size() * sizeof(int32_t));
  train_x_ = dev_train_x_.data();
  train_y_ = dev_train_y_.data();
}

void Replica::make_model() {
  // Shared weights: initialised once, by the trainer.
  model_ = build_model(*dev_, cfg_.model, train_.shape, train_.classes,
                       run_.shared ? run_.shared->params.data() : nullptr);
  model_->set_label_smoothing(cfg_.train.label_smoothing);
  if (run_.shared)
    model_->zero_grads();
  else
    model_->init(cfg_.train.seed);
  // Each replica's own stream for dropout (and augmentation): results differ with the replica
  // count whenever these are used, as they do in every framework. Synchronised BatchNorm's
  // exchanges are timed apart (no part of a rank's busy forward and backward) and traced.
  model_->set_context(&comm_, &replica_rng_, [this](Clock::time_point t0, Clock::time_point t1) {
    bn_sync_s_ += seconds(t1 - t0);
    trace_.span(TracePhase::bn_sync, t0, t1);
  });
}

void Replica::make_exchange(size_t n_params) {
  const auto bucket_elems = static_cast<size_t>(cfg_.train.bucket_mb * 1024 * 1024 / sizeof(float));
  const ReduceOp op = cfg_.train.reduction == Reduction::mean ? ReduceOp::mean : ReduceOp::sum;
  own_part_ = run_.shared && dev_->host_memory();
  std::function<void(double)> on_fold;
  if (own_part_) on_fold = [this](double s) { folded(s); };
  if (run_.shared)
    exchange_ = make_shared_exchange(
        comm_, *dev_, op, n_params, bucket_elems, [this] { return reduced_grads(); },
        [this] { update_shared(); }, on_fold);
  else if (run_.nccl)
    exchange_ = run_.nccl->exchange(run_.nccl_per_process ? 0 : rank_, *dev_, op, n_params,
                                    bucket_elems);
  else
    exchange_ = make_host_exchange(comm_, *dev_, op, n_params, bucket_elems);
  // A host exchange on a GPU (colocated replicas) copies each bucket to the host, which waits
  // for the device first. That wait is compute still queued, not exchange: it is waited out
  // before the exchange is timed, so that the host clocks measure the exchange alone.
  exchange_on_host_ = !run_.nccl;
  wait_before_exchange_ = exchange_on_host_ && !dev_->host_memory();
  if (wait_before_exchange_) exchange_in_backward_.assign(static_cast<size_t>(steps_), 0.0);
  if (queue_ && cfg_.model.batchnorm == BatchNormMode::sync && model_->has_batchnorm())
    bn_sync_in_pass_.assign(2 * static_cast<size_t>(steps_), 0.0);
  on_ready_ = [this](size_t off, size_t count) {
    // Only before a bucket goes out: a wait per layer would stall the device for nothing.
    // Shared weights send nothing during backward (the whole sum is made in finish()).
    if (wait_before_exchange_ && !run_.shared && exchange_->would_launch(off))
      queue_->synchronize();
    exchange_->ready(off, count);
  };
  // The straggler log: per step the phases and an arrival per bucket. On a GPU, one: when the
  // device finished the step's compute (the exchange's start). Shared weights in host memory,
  // none: a rank's exchange is its own fold alone, timed as it runs (folded()).
  const int arrivals = own_part_               ? 0
                       : run_.shared || queue_ ? 1
                                               : static_cast<int>(exchange_->bucket_count());
  phases_ = PhaseLog(replicas_, steps_, arrivals, dev_->host_memory());
  // Shared weights on a GPU: the host only queues the folds, and the last rank also makes the
  // update for every rank, so neither phase is a rank's own. On the CPU a rank's fold is its
  // own, but alike only where every rank folds on one thread: on several cores rank 0 copies
  // into a sum in its own cache while the others read it from another core's, 20-60% slower
  // with no straggler (results/stragglers/shared-cores).
  if (run_.shared && !(own_part_ && run_.one_thread)) phases_.never_name(StepPhase::exchange);
  if (run_.shared && !own_part_) phases_.never_name(StepPhase::optimizer);
  // Buckets in the step trace, and when this rank arrived at each (stragglers). Shared weights
  // reduce the whole buffer at once, in finish() (in host memory, one bucket: folded()).
  if ((cfg_.train.trace.enabled() || phases_.on()) && !run_.shared)
    exchange_->on_bucket([this](size_t b, Clock::time_point ready, Clock::time_point t0,
                                Clock::time_point t1) {
      trace_.bucket(b, ready, t0, t1);
      phases_.arrive(b, trace_.seconds_at(t0));
    });
}

void Replica::enable_graphs() {
  // CUDA graphs for full-size steps, where nothing in a step waits for the host (see
  // cuda_graph_state).
  if (run_.place.backend != Backend::cuda) return;
  graph_state_ =
      cuda_graph_state(cfg_.train.cuda_graph, run_.nccl != nullptr, run_.gpus_in_process,
                       cfg_.model.batchnorm == BatchNormMode::sync && model_->has_batchnorm() &&
                           comm_.size() > 1,  // one replica has nothing to exchange
                       run_.shared != nullptr);
  if (train_.files && graph_state_ == "on")  // a graph replays a fixed copy, not a new batch
    graph_state_ = "off: images from files are copied to the GPU from the host each step";
  // What a step stages (CudaDevice's per-step values): per micro-step its batch indices, the
  // augmentation seed and a seed per dropout layer; per step the optimizer's factors.
  int64_t seeds = cfg_.data.augment.enabled() ? 1 : 0;
  for (const LayerSpec& l : expand_layers(cfg_.model))
    if (l.type == LayerType::dropout && l.p > 0) ++seeds;
  const size_t staging = graph_staging_bytes(std::min(micro_, train_.size()), accum_, seeds, 1);
  queue_->enable_graphs(graph_state_ == "on", staging, run_.nccl ? &run_.nccl->gate() : nullptr);
}

void Replica::read_fault_injection() {
  // Fault injection for testing failure handling: DTRAIN_FAULT=RANK:STEP makes that rank throw
  // at that (global, 1-based) step; DTRAIN_FAULT=RANK:STEP:oom makes it an allocation failure.
  if (const char* f = std::getenv("DTRAIN_FAULT")) {
    int fr = -1;
    long long fs = -1;
    char kind[4] = {};
    const int n = std::sscanf(f, "%d:%lld:%3s", &fr, &fs, kind);
    if (n >= 2 && fr == rank_) {
      fault_step_ = fs;
      fault_oom_ = n == 3 && std::string_view(kind) == "oom";
    }
  }
}

void Replica::report_start() {
  RunInfo& info = run_.result.info;
  info.model = model_->describe();
  info.data = run_.data.description;
  info.class_names = run_.data.class_names;
  info.skipped_files = run_.data.skipped;
  info.steps_per_epoch = steps_;
  info.global_batch = gbatch_;
  info.micro_batch = micro_;
  info.peak_lr = scaled_lr(cfg_.optimizer, gbatch_);
  info.param_count = model_->param_count();
  const ModelSize size = model_size(cfg_.model, train_.shape, train_.classes);
  info.forward_flops = size.forward_flops;
  info.backward_flops = size.backward_flops;
  if (run_.place.backend == Backend::cuda) {
    const int gpu = run_.place.gpu_of_replica[static_cast<size_t>(rank_)];
    for (const GpuInfo& g : query_gpus().gpus)
      if (g.index == gpu) {
        const DocumentedPeak peak = documented_peak(g.name, cfg_.precision);
        info.peak_tflops = peak.tflops;
        info.peak_source = peak.source;
      }
  }
  info.backend = to_string(run_.place.backend);
  info.precision = to_string(cfg_.precision);
  info.cuda_graph = graph_state_;
  if (!graph_state_.empty()) info.devices += "; CUDA graphs " + graph_state_;
  if (run_.observer) run_.observer->on_start(info);
}

void Replica::run() {
  // This thread is the replica's own (devices.csv's replica rows), unless replicas take turns.
  if (run_.devices && run_.replica_threads) run_.devices->add_replica_thread(rank_);
  // The origin of the trace's and the straggler log's times, common to every rank.
  if (cfg_.train.trace.enabled() || replicas_ > 1) trace_.start_clock(common_clock_origin(comm_));
  trace_window_.start(global_step_);
  const int64_t last_step = cfg_.train.epochs * steps_;
  const TraceConfig& tw = cfg_.train.trace;
  if (rank_ == 0 && tw.enabled() && tw.from_step > last_step)
    log().warn("train.trace: the window starts at step {}, but the run has {} steps: no "
               "trace.json will be written (train.trace.from_step at most {})",
               tw.from_step, last_step, last_step);
  else if (rank_ == 0 && tw.enabled() && tw.from_step + tw.steps - 1 > last_step)
    log().warn("train.trace: the window ends at step {}, but the run has {} steps: trace.json "
               "will hold steps {} to {}",
               tw.from_step + tw.steps - 1, last_step, tw.from_step, last_step);
  for (int epoch = start_epoch_; epoch < cfg_.train.epochs; ++epoch) {
    if (run_.devices && rank_ == run_.devices_rank) run_.devices->set_epoch(epoch);
    const EpochTotals tr = train_epoch(epoch);
    const auto t_eval = Clock::now();
    const std::vector<double> test = evaluate(/*stoppable=*/true);
    trace_.span(TracePhase::evaluation, t_eval, Clock::now());
    record_scoring(epoch, steps_, (epoch + 1) * static_cast<int64_t>(tr.seen), test,
                   tr.times.total);
    EpochMetrics m = epoch_metrics(epoch, tr, test, seconds_since(t_eval) + tr.scoring_s);
    const Straggler slow = phases_.epoch_straggler(comm_);
    m.straggler_rank = slow.rank;
    m.straggler_phase = slow.phase;
    m.straggler_excess = slow.excess;
    const bool diverged = !std::isfinite(m.train_loss) || !std::isfinite(m.test_loss);
    if (rank_ == 0) {
      for (int64_t s = 0; s < steps_; ++s) {
        const double* st = stats_.host_row(s);
        const double rows = st[StepStats::kRows];
        run_.result.step_losses.push_back(rows > 0 ? st[StepStats::kLoss] / rows : 0.0);
      }
      run_.result.epochs.push_back(m);
      if (diverged) run_.result.status = RunStatus::diverged;
      if (run_.observer) run_.observer->on_epoch(m);
    }
    report_devices(epoch);
    // Every rank sees the same reduced numbers, so all stop together; the target, near its
    // threshold, is agreed as well (a rank that alone stopped would leave the others waiting in
    // the next collective).
    const bool done = cfg_.train.stop_at_target && reached_everywhere();
    if (!diverged && !done && epoch + 1 < cfg_.train.epochs)
      checkpoint_scored(epoch, seconds_since(t_eval), tr.saved_s);
    trace_window_.after_epoch(comm_, trace_, global_step_, run_.observer);
    if (diverged || done) break;
  }
  if (rank_ == 0) run_.result.info.cuda_graph_steps = queue_ ? queue_->graph_launches() : 0;
  if (rank_ == 0 && dev_->host_memory()) {  // the CPU's peak, once training is over
    RunInfo& info = run_.result.info;
    info.peak_tflops = measure_sgemm_tflops(*dev_);
    info.peak_source = fmt::format("SGEMM 512^3 measured on one replica's {} BLAS thread(s)",
                                   run_.cpu.threads);
  }
}

Replica::EpochTotals Replica::train_epoch(int epoch) {
  const EpochPlan plan = sampler_.plan(epoch);
  stats_.begin_epoch();
  bn_sync_s_ = 0;
  epoch_clocks_ = read_cpu_clocks();
  EpochTotals out;
  EpochTimes& t = out.times;
  const int64_t first = epoch == start_epoch_ ? start_step_ : 0;
  phases_.begin_epoch(first);
  if (first > 0) {
    resume_epoch(out);
    // The LR of the last step taken, as the epoch's row reports it (a resume after the epoch's
    // last step, before its scoring, takes no step to set it).
    out.lr_last = lr_at(cfg_.optimizer, cfg_.train.epochs, gbatch_,
                        epoch + static_cast<double>(first - 1) / static_cast<double>(steps_));
  }
  if (train_input_) start_input(plan, epoch, first);
  // Evaluation may have freed device memory on some ranks: the graph steps agree again.
  graph_agreement_.unsettle();
  anchor_device_clock(0);  // the device's clock against the host's, each epoch
  const double before = t.total;  // of a resumed epoch, the time before the stop
  input_since_s_ = before;         // the input counters start here (start_input)
  const auto t_epoch = Clock::now();
  const auto elapsed = [&] {
    return before + seconds_since(t_epoch) - out.scoring_s - out.saved_s;
  };
  for (int64_t s = first; s < steps_; ++s) {
    // A stop at a step boundary, agreed by every rank: the state is saved, then every rank ends.
    if (stop_agreed(s)) {
      t.total = elapsed();
      checkpoint(epoch, s, &out);
      // The steps traced so far, as at an epoch's end: a stop mid-epoch loses none.
      trace_window_.after_epoch(comm_, trace_, global_step_, run_.observer);
      throw Interrupted("interrupted by the user");
    }
    const double lr = lr_at(cfg_.optimizer, cfg_.train.epochs, gbatch_,
                            epoch + static_cast<double>(s) / static_cast<double>(steps_));
    if (s == 0) out.lr_first = lr;
    out.lr_last = lr;
    // Kernels per step, counted on the second step (the first sets things up).
    const int64_t launches_before = queue_ ? queue_->launches() : 0;
    trace_.set_step(global_step_ + 1);
    phases_.begin_step(s);
    train_step(plan, s, lr, t);
    phases_.end_step();
    anchor_device_clock(10.0);
    if (rank_ == 0 && epoch == 0 && s == 1)
      run_.result.info.launches_per_step = (queue_ ? queue_->launches() : 0) - launches_before;
    if (rank_ == 0 && run_.observer) run_.observer->on_step(epoch + 1, s + 1, steps_);
    if (scoring_due(s)) out.scoring_s += score_between_steps(epoch, s + 1, plan, elapsed());
    const int64_t every = cfg_.train.checkpoint_steps;
    if (every > 0 && global_step_ % every == 0 && s + 1 < steps_) {
      t.total = elapsed();
      checkpoint(epoch, s + 1, &out);
      report_devices(epoch);  // the samples so far, where a long epoch has checkpoints
    }
  }
  // The epoch's one wait for the device (besides the clock's anchors): its steps end inside
  // its time.
  if (queue_) queue_->synchronize();
  // The epoch's steps are kept before it is scored: scoring a large test set can take longer
  // than training, and a stop or a kill there then loses no step (a resume scores the epoch
  // again; see checkpoint_scored).
  t.total = elapsed();
  const auto t_saved = Clock::now();
  checkpoint(epoch, steps_, &out);
  out.saved_s = seconds_since(t_saved);
  // One exchange turns local per-step stats into global ones.
  stats_.finish_epoch(comm_);
  t.total = elapsed();
  close_epoch(out);
  return out;
}

void Replica::close_epoch(EpochTotals& out) {
  EpochTimes& t = out.times;
  // On a GPU the host only queues work: the split comes from device events instead (but for
  // an exchange that runs on the host).
  double dt[3] = {0, 0, 0};
  if (queue_) read_device_steps(dt);
  const double comm_s = queue_ ? exchange_->take_device_seconds(/*wait=*/true) : -1.0;
  // Shared weights on a GPU: the optimizer ran inside the exchange (train_step moved its time
  // there).
  const PhaseSeconds p =
      split_phases({t.compute, t.exchange, t.exchange, t.optimizer}, queue_ ? dt : nullptr,
                   comm_s, exchange_on_host_, run_.shared ? t.optimizer : 0.0);
  t.compute = p.compute;
  t.exchange = p.exchange;
  t.exposed = p.exchange_exposed;
  t.optimizer = p.optimizer;
  for (int64_t s = 0; s < steps_; ++s) {
    const double* st = stats_.host_row(s);
    out.loss_sum += st[StepStats::kLoss];
    out.correct += st[StepStats::kCorrect];
    out.seen += st[StepStats::kRows];
    noise_.add_step(st);
  }
}

double Replica::score_between_steps(int epoch, int64_t done, const EpochPlan& plan,
                                    double train_s) {
  // A GPU runs steps behind the host: they finish first, as training time, not scoring time.
  if (queue_) queue_->synchronize();
  const auto t0 = Clock::now();
  // Replicas with BatchNorm statistics of their own average them to evaluate: kept aside, so
  // that training goes on from the statistics it had, as without this scoring.
  const bool averages = cfg_.model.batchnorm == BatchNormMode::local && replicas_ > 1 &&
                        model_->has_batchnorm();
  const std::vector<float> kept = averages ? model_->download_state() : std::vector<float>{};
  const std::vector<double> test = evaluate();
  if (averages) model_->upload_state(kept);
  trace_.span(TracePhase::evaluation, t0, Clock::now());
  graph_agreement_.unsettle();  // evaluation may have freed device memory on some ranks
  record_scoring(epoch, done, epoch * plan.offsets.back() + plan.offsets[static_cast<size_t>(done)],
                 test, train_s);
  return seconds_since(t0);
}

bool Replica::reached_everywhere() {
  double any = target_reached_ ? 1.0 : 0.0;
  if (replicas_ > 1) comm_.allreduce(&any, 1, ReduceOp::sum);
  return any > 0;
}

void Replica::record_scoring(int epoch, int64_t done, int64_t samples,
                             const std::vector<double>& test, double train_s) {
  const auto n_test = static_cast<double>(test_.size());
  EvalPoint p;
  p.epoch = epoch + 1;
  p.step = done;
  p.global_step = global_step_;
  p.samples = samples;
  p.test_loss = n_test > 0 ? test[0] / n_test : 0.0;
  p.test_acc = n_test > 0 ? test[1] / n_test : 0.0;
  if (targets_.reached(p)) target_reached_ = true;
  if (rank_ != 0 || cfg_.train.eval_steps <= 0) return;
  p.train_time_s = train_s;
  for (const EpochMetrics& m : run_.result.epochs) p.train_time_s += m.epoch_time_s;
  run_.result.evals.push_back(p);
  if (run_.observer) run_.observer->on_eval(p);
}

void Replica::report_devices(int epoch) {
  if (cfg_.train.telemetry_ms <= 0) return;  // the same on every rank
  const bool mine = run_.devices && rank_ == run_.devices_rank;
  // Across processes, at most kGatheredRows a device an epoch travel (evenly spaced), so that
  // the collective stays small; in one process rank 0 takes every row itself.
  constexpr size_t kGatheredRows = 1000;
  double period = 0;
  std::vector<DeviceRow> rows;
  if (mine) rows = run_.devices->take(run_.devices_gather ? kGatheredRows : 0, &period);
  // The sampler doubles its period where a million rows wait: said once per doubling.
  const double said = std::max(devices_period_s_, cfg_.train.telemetry_ms / 1000.0);
  if (mine && period > said) {
    log().warn("rank {}: devices.csv: sampled every {:g} ms in epoch {} ({} rows waited for "
               "their write; train.checkpoint_steps writes them sooner)",
               rank_, 1e3 * period, epoch + 1, DeviceSampler::kMaxHeldRows);
    devices_period_s_ = period;
  }
  if (run_.devices_gather) rows = gather_device_rows(comm_, rows);
  if (rank_ == 0 && run_.observer && cfg_.train.telemetry_ms > 0) run_.observer->on_devices(rows);
}

void Replica::check_fault() {
  if (++global_step_ == fault_step_ && fault_oom_) throw std::bad_alloc();
  if (global_step_ == fault_step_)
    DTRAIN_THROW_SYSTEM(
        fmt::format("injected fault (DTRAIN_FAULT) on rank {} at step {}", rank_, global_step_));
}

void Replica::train_step(const EpochPlan& plan, int64_t s, double lr, EpochTimes& t) {
  const auto t_step = Clock::now();
  check_fault();
  const bool in_graph = graph_policy(plan.batch_size(s)) != GraphMode::eager;
  double* stats = stats_.device_row(s, in_graph);
  noise_.measure_local(*exchange_, dev_.get(), stats);
  try {
    if (queue_) queue_->step_begin(global_step_);
    if (in_graph) stats_.clear_graph_row();
    forward_backward(plan, s, stats, t);  // the last backward starts reducing gradients
    step_lr_ = lr;
    const double exchange_before = t.exchange;
    const auto t_exchange = Clock::now();
    reduce_gradients(t);  // shared weights on a GPU: the last rank also runs the optimizer
    trace_.span(TracePhase::exchange, t_exchange, Clock::now());
    mark(StepPhase::exchange);
    if (run_.shared) {  // the last rank's update (on the host: clipping) is every rank's optimizer
      const double u =
          std::min(run_.shared->update_s[global_step_ & 1], t.exchange - exchange_before);
      t.exchange -= u;
      t.optimizer += u;
      if (!own_part_) phases_.add(StepPhase::exchange, -u);  // every rank waited for the update
      phases_.add(StepPhase::optimizer, u);
      if (own_part_) update_own_part(t);
    } else {
      const auto t0 = Clock::now();
      opt_->step(model_->params(), model_->grads(), lr);
      slow_.stretch(StepPhase::optimizer, seconds_since(t0));
      t.optimizer += seconds_since(t0);
      phases_.add(StepPhase::optimizer, seconds_since(t0));
      trace_.span(TracePhase::optimizer, t0, Clock::now());
    }
    mark(StepPhase::optimizer);
    // The optimizer only read the reduced gradients: they are still the step's.
    noise_.measure_reduced(*dev_, reduced_grads(), static_cast<size_t>(model_->param_count()),
                           rank_, stats);
    if (in_graph) queue_->graph_step_end();
  } catch (const SystemError& e) {
    if (!in_graph) throw;
    queue_->graph_step_abort();
    throw SystemError(fmt::format("{} (in a CUDA-graph step; train.cuda_graph: false runs "
                                  "without graphs)",
                                  e.what()),
                      e.file(), e.line(), e.rank());
  } catch (...) {
    if (in_graph) queue_->graph_step_abort();
    throw;
  }
  if (in_graph) stats_.keep_graph_row(s);
  trace_.span(TracePhase::step, t_step, Clock::now());
}

void Replica::anchor_device_clock(double every_s) {
  if (!queue_ || (every_s > 0 && seconds_since(anchored_at_) < every_s)) return;
  queue_->anchor_clock();
  anchored_at_ = Clock::now();
}

void Replica::read_device_steps(double* dt) {
  std::vector<DeviceMark> marks;
  queue_->take_step_marks(marks, /*wait=*/true);
  const int64_t first = global_step_ - steps_ + 1;  // the epoch's first step (1-based)
  double backward = 0;  // the step's device backward so far
  for (const DeviceSpan& sp : device_spans(marks)) {
    trace_.device_span(trace_phase(sp.phase), sp.step, sp.t0, sp.t1);
    if (sp.phase < 0) {  // a step begins
      backward = 0;
      continue;
    }
    const auto p = static_cast<StepPhase>(sp.phase);
    const double d = sp.t1 - sp.t0;
    dt[p == StepPhase::exchange ? 1 : p == StepPhase::optimizer ? 2 : 0] += d;
    const int64_t s = sp.step - first;
    const double own = d - bn_sync_taken(s, p, d);
    phases_.add_to(s, p, own);
    if (p == StepPhase::backward) backward += own;
    if (p != StepPhase::exchange) continue;
    // A host exchange inside backward: the device waited for it, so it is exchange, and the
    // rank arrived at the exchange that much earlier (never more than the backward it was in).
    const double host = exchange_in_backward_.empty() || s < 0 || s >= steps_
                            ? 0.0
                            : std::min(backward, exchange_in_backward_[static_cast<size_t>(s)]);
    phases_.add_to(s, StepPhase::backward, -host);
    phases_.add_to(s, StepPhase::exchange, host);
    phases_.arrive_at(s, 0, trace_.seconds_at(sp.t0) - host);
  }
}

// Synchronised BatchNorm's exchanges inside a device span of step s's phase p (at most the
// span): taken out of what is left of the step's, so that micro-steps' spans share them.
double Replica::bn_sync_taken(int64_t s, StepPhase p, double span) {
  if (bn_sync_in_pass_.empty() || s < 0 || s >= steps_) return 0.0;
  if (p != StepPhase::forward && p != StepPhase::backward) return 0.0;
  double& left = bn_sync_in_pass_[2 * static_cast<size_t>(s) + (p == StepPhase::backward)];
  const double taken = std::clamp(left, 0.0, span);
  left -= taken;
  return taken;
}

void Replica::forward_backward(const EpochPlan& plan, int64_t s, double* stats, EpochTimes& t) {
  // Local gradients are scaled so that a mean over replicas is the mean over the whole global
  // batch (exact also for a short last batch); `sum` then gives N times that.
  const float grad_scale = static_cast<float>(replicas_) / static_cast<float>(plan.batch_size(s));
  model_->zero_grads();
  for (int k = 0; k < accum_; ++k) {
    const auto t0 = Clock::now();
    int64_t rows = 0;
    const float* batch = load_micro_batch(plan, s, k, rows);
    slow_.stretch(StepPhase::data, seconds_since(t0));
    mark(StepPhase::data);
    // Synchronised BatchNorm meets the other replicas inside forward and backward: its
    // exchanges (mostly waiting, and with replicas in turn on one thread, the others' work)
    // are no part of this rank's busy time.
    const double bn0 = bn_sync_s_;
    const auto t1 = Clock::now();
    model_->forward(batch, rows);
    const double bn_forward = bn_sync_s_ - bn0;
    slow_.stretch(StepPhase::forward, seconds_since(t1) - bn_forward);
    mark(StepPhase::forward);
    const auto t2 = Clock::now();
    const bool last = k == accum_ - 1;
    if (last) exchange_->begin(model_->grads());
    model_->loss_backward(yb_.data(), rows, grad_scale, stats,
                          last ? on_ready_ : Model::GradsReady{});
    const double buckets = last ? exchange_->seconds() : 0.0;  // reduced on this thread
    const double bn_backward = bn_sync_s_ - bn0 - bn_forward;
    if (last && !exchange_in_backward_.empty())
      exchange_in_backward_[static_cast<size_t>(s)] = buckets;
    if (!bn_sync_in_pass_.empty()) {
      double* in = &bn_sync_in_pass_[2 * static_cast<size_t>(s)];
      in[0] = (k == 0 ? 0.0 : in[0]) + bn_forward;
      in[1] = (k == 0 ? 0.0 : in[1]) + bn_backward;
    }
    slow_.stretch(StepPhase::backward, seconds_since(t2) - buckets - bn_backward);
    mark(StepPhase::backward);
    const auto t3 = Clock::now();
    trace_.span(TracePhase::data, t0, t1);
    trace_.span(TracePhase::forward, t1, t2);
    trace_.span(TracePhase::backward, t2, t3);
    phases_.add(StepPhase::data, seconds(t1 - t0));
    phases_.add(StepPhase::forward, seconds(t2 - t1) - bn_forward);
    phases_.add(StepPhase::backward, seconds(t3 - t2) - buckets - bn_backward);
    noise_.measure_micro(*dev_, k, model_->grads(), static_cast<size_t>(model_->param_count()),
                         stats);
    stats_.add_rows(s, static_cast<double>(rows));
    const double load = std::chrono::duration<double>(t1 - t0).count();
    const double data = train_input_ ? input_wait_s_ : load;
    t.data += data;
    t.compute += load - data + seconds_since(t1);
  }
}

const float* Replica::load_micro_batch(const EpochPlan& plan, int64_t s, int k, int64_t& rows) {
  if (train_input_) {  // the time spent waiting here is the input time the step could not hide
    const auto t0 = Clock::now();
    const ImagePipeline::Batch b = train_input_->next();
    input_wait_s_ = seconds_since(t0);  // the copies below wait for the device: not input
    rows = b.rows;
    dev_->upload(yb_.data(), b.y, static_cast<size_t>(rows) * sizeof(int32_t));
    if (dev_->host_memory()) return b.x;  // read before the next batch is asked for
    dev_->upload(xb_.data(), b.x, static_cast<size_t>(rows * features_) * sizeof(float));
    return xb_.data();
  }
  sampler_.micro_batch(plan, s, k, rank_, idx_);
  rows = static_cast<int64_t>(idx_.size());
  dev_->gather(train_x_, train_y_, features_, idx_.data(), rows, xb_.data(), yb_.data());
  if (!cfg_.data.augment.enabled()) return xb_.data();
  // On the device, from one draw of the replica's stream.
  const auto& shape = train_.shape;
  const AugmentConfig& a = cfg_.data.augment;
  dev_->augment(xb_.data(), xa_.data(), rows, shape[0], shape[1], shape[2], a.crop_padding,
                a.padding_mode == PaddingMode::reflect, a.flip, replica_rng_.next());
  return xa_.data();
}

void Replica::start_input(const EpochPlan& plan, int epoch, int64_t first) {
  input_decoded_ = train_input_->decoded();
  input_busy_s_ = train_input_->busy_seconds();
  // The plan is copied: the pipeline's threads read it until the next start.
  auto p = std::make_shared<const EpochPlan>(plan);
  auto micro = [this, p, first](int64_t b, std::vector<int64_t>& out) {
    sampler_.micro_batch(*p, first + b / accum_, static_cast<int>(b % accum_), rank_, out);
  };
  train_input_->start((steps_ - first) * accum_, std::move(micro), epoch, cfg_.train.seed);
}

const float* Replica::load_test_chunk(int64_t lo, int64_t rows) {
  if (!test_input_) {
    dev_->upload(xb_.data(), test_.x.data() + lo * features_,
                 static_cast<size_t>(rows * features_) * sizeof(float));
    dev_->upload(yb_.data(), test_.y.data() + lo, static_cast<size_t>(rows) * sizeof(int32_t));
    return xb_.data();
  }
  const ImagePipeline::Batch b = test_input_->next();
  dev_->upload(yb_.data(), b.y, static_cast<size_t>(rows) * sizeof(int32_t));
  if (dev_->host_memory()) return b.x;
  dev_->upload(xb_.data(), b.x, static_cast<size_t>(rows * features_) * sizeof(float));
  return xb_.data();
}

void Replica::reduce_gradients(EpochTimes& t) {
  // Buckets reduced during backward ran on this thread: their time is exchange, not compute.
  const double during_backward = exchange_->seconds();
  if (wait_before_exchange_) queue_->synchronize();  // see on_ready_
  const auto t0 = Clock::now();
  if (run_.shared && !own_part_) phases_.arrive(0, trace_.seconds_at(t0));
  fold_ready_ = t0;
  exchange_->finish();  // shared weights in host memory: folded() logs this rank's own part
  if (!own_part_) slow_.stretch(StepPhase::exchange, during_backward + seconds_since(t0));
  t.compute -= during_backward;
  t.exchange += during_backward + seconds_since(t0);
  if (!own_part_) phases_.add(StepPhase::exchange, during_backward + seconds_since(t0));
}

void Replica::folded(double seconds) {
  // Inside this rank's turn: a straggler's fold, stretched here, delays the ranks after it.
  const auto t0 = Clock::now();
  slow_.stretch(StepPhase::exchange, seconds);
  const auto t1 = Clock::now();
  phases_.add(StepPhase::exchange, seconds + std::chrono::duration<double>(t1 - t0).count());
  // The trace's one bucket of the sum: ready when this rank arrived, its fold from its turn.
  const auto fold =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  trace_.bucket(0, fold_ready_, std::max(fold_ready_, t0 - fold), t1);
}

void Replica::update_shared() {
  // A GPU: the folds of every rank, ordered by fences and still queued, finish first, so that
  // the time below is the update's alone (they are the exchange's).
  if (queue_) queue_->synchronize();
  const auto t0 = Clock::now();
  SharedWeights& sw = *run_.shared;
  // global_step_ counts this step already: it is the optimizer's 1-based step number. In host
  // memory, what precedes each rank's part of the update (update_own_part): clipping.
  if (own_part_)
    sw.opt->prepare(*dev_, reduced_grads());
  else
    sw.opt->update(*dev_, sw.params.data(), reduced_grads(), step_lr_, global_step_);
  if (queue_) queue_->synchronize();  // a GPU: the update's time, not its queueing
  if (!own_part_) slow_.stretch(StepPhase::optimizer, seconds_since(t0));
  sw.update_s[global_step_ & 1] = seconds_since(t0);
  if (!own_part_ || sw.opt->prepares()) trace_.span(TracePhase::optimizer, t0, Clock::now());
}

void Replica::update_own_part(EpochTimes& t) {
  SharedWeights& sw = *run_.shared;
  const auto t0 = Clock::now();
  const auto [lo, hi] = shared_part(sw.opt->size(), rank_, replicas_);
  sw.opt->update_part(*dev_, sw.params.data(), reduced_grads(), step_lr_, global_step_, lo, hi);
  slow_.stretch(StepPhase::optimizer, seconds_since(t0));
  const double own = seconds_since(t0);
  trace_.span(TracePhase::optimizer, t0, Clock::now());
  const auto t1 = Clock::now();
  comm_.barrier();  // every part is updated: the next forward pass reads them all
  trace_.span(TracePhase::exchange, t1, Clock::now());
  t.optimizer += own;
  t.exchange += seconds_since(t1);  // waiting for the other ranks, as in the exchange
  phases_.add(StepPhase::optimizer, own);
}

bool Replica::stop_voted() {
  double stop = stop_requested() ? 1 : 0;
  if (replicas_ > 1) comm_.allreduce(&stop, 1, ReduceOp::sum);  // host only
  return stop > 0;
}

bool Replica::stop_agreed(int64_t step) {
  if (replicas_ == 1) return stop_requested();
  // The ranks vote every kStopVoteSteps steps: a vote is one more meeting of all replicas,
  // which cost 6% of a 4-replica CPU run when held every step.
  constexpr int64_t kStopVoteSteps = 8;
  if (step % kStopVoteSteps != 0) return false;
  double stop = stop_requested() ? 1 : 0;
  comm_.allreduce(&stop, 1, ReduceOp::sum);  // host only
  return stop > 0;
}

void Replica::checkpoint(int epoch, int64_t next_step, const EpochTotals* partial) {
  if (global_step_ == last_checkpoint_) return;  // the same state as the last one
  last_checkpoint_ = global_step_;
  const auto t0 = Clock::now();
  struct Span {  // recorded however the function returns
    StepTrace& trace;
    Clock::time_point t0;
    ~Span() { trace.span(TracePhase::checkpoint, t0, Clock::now()); }
  } span{trace_, t0};
  graph_agreement_.unsettle();  // every rank checkpoints at this step: the graphs re-agree
  PartialEpoch part;
  if (partial) {
    const EpochTimes& t = partial->times;
    part = {partial->lr_first, {t.data, t.compute, t.exchange, t.exposed, t.optimizer, t.total}};
  }
  const bool keep = rank_ == 0 && run_.observer;
  const std::optional<Checkpoint> c =
      collect_checkpoint(state(), {epoch, next_step, global_step_}, partial ? &part : nullptr,
                         keep ? &run_.result : nullptr);
  if (c) run_.observer->on_checkpoint(*c);
}

void Replica::checkpoint_scored(int epoch, double scoring_s, double saved_s) {
  double again = scoring_s > saved_s ? 1 : 0;
  if (replicas_ > 1) comm_.allreduce(&again, 1, ReduceOp::sum);  // host only
  if (again == 0) return;
  last_checkpoint_ = -1;  // the global step of the checkpoint before the scoring: written again
  checkpoint(epoch + 1, 0, nullptr);
}

void Replica::restore(const Checkpoint& c) {
  const RunPosition at = restore_checkpoint(state(), c, rank_ == 0 ? &run_.result : nullptr);
  global_step_ = last_checkpoint_ = at.global_step;
  start_epoch_ = at.epoch;
  start_step_ = at.step;
  // A scoring before the stop may have reached the targets (train.stop_at_target).
  for (const EvalPoint& p : c.evals) target_reached_ = target_reached_ || targets_.reached(p);
}

void Replica::resume_epoch(EpochTotals& out) {
  const PartialEpoch part = restore_partial_epoch(state(), *run_.resume);
  out.lr_first = part.lr_first;
  EpochTimes& t = out.times;
  t.data = part.times[0], t.compute = part.times[1], t.exchange = part.times[2];
  t.exposed = part.times[3], t.optimizer = part.times[4], t.total = part.times[5];
}

ReplicaState Replica::state() {
  return {cfg_,        steps_,         comm_,  *dev_, *model_, optimizer(), run_.shared != nullptr,
          replica_rng_, noise_.scale(), stats_, run_.data.fingerprint};
}

GraphMode Replica::graph_policy(int64_t global_rows) {
  if (graph_state_ != "on" || global_rows != gbatch_) return GraphMode::eager;
  GraphMode mine = queue_->graph_step_propose();
  // A vote only until the ranks agree on a graph step (see GraphAgreement), not every step.
  if (replicas_ > 1)
    mine = graph_agreement_.decide(mine, rank_, [&](GraphMode m) {
      double votes[3] = {0, 0, 0};
      votes[static_cast<int>(m)] = 1;
      comm_.allreduce(votes, 3, ReduceOp::sum);  // host only: the device does not wait
      return agree_graph_mode(static_cast<int>(votes[0]), static_cast<int>(votes[1]),
                              static_cast<int>(votes[2]));
    });
  return queue_->graph_step_begin(mine);
}

std::vector<double> Replica::evaluate(bool stoppable) {
  // With per-replica BatchNorm the running statistics differ between replicas, so they are
  // averaged first.
  if (cfg_.model.batchnorm == BatchNormMode::local) model_->average_state(comm_);
  const int64_t lo_end = test_.size() * rank_ / replicas_;  // this replica's contiguous slice
  const int64_t hi_end = test_.size() * (rank_ + 1) / replicas_;
  dev_->zero(dev_test_.data(), 2 * sizeof(double));
  if (test_input_) {  // the chunks below, in order
    const int64_t chunk = eval_rows_;
    test_input_->start(
        (hi_end - lo_end + chunk - 1) / chunk,
        [lo_end, hi_end, chunk](int64_t b, std::vector<int64_t>& out) {
          for (int64_t i = lo_end + b * chunk; i < std::min(hi_end, lo_end + (b + 1) * chunk); ++i)
            out.push_back(i);
        },
        0, 0);
  }
  // The chunks every rank has (their slices differ by a sample at most): where they vote.
  const int64_t voted = (test_.size() / replicas_ + eval_rows_ - 1) / eval_rows_;
  for (int64_t lo = lo_end, chunk = 0; lo < hi_end; lo += eval_rows_, ++chunk) {
    if (stoppable && chunk < voted && stop_voted()) {
      trace_window_.after_epoch(comm_, trace_, global_step_, run_.observer);
      throw Interrupted("interrupted by the user");
    }
    const int64_t rows = std::min(eval_rows_, hi_end - lo);
    model_->forward(load_test_chunk(lo, rows), rows, /*train=*/false);
    model_->loss_only(yb_.data(), rows, dev_test_.data());
  }
  std::vector<double> stats(2, 0.0);
  dev_->download(stats.data(), dev_test_.data(), 2 * sizeof(double));
  comm_.allreduce(stats.data(), 2, ReduceOp::sum);
  return stats;
}

EpochMetrics Replica::epoch_metrics(int epoch, const EpochTotals& tr,
                                    const std::vector<double>& test, double eval_s) {
  const EpochTimes& t = tr.times;
  // Each rank's busy time (waiting excluded), on rank 0: stragglers show here; its input
  // threads' images and busy seconds over the epoch; and its process's CPU seconds (one rank a
  // process: the one that samples its devices), less which the machine ran other work (known
  // where every rank is in one process, run_.one_process).
  std::vector<double> mine = {t.data + t.compute + t.optimizer, 0, 0, 0};
  if (train_input_) {
    mine[1] = static_cast<double>(train_input_->decoded() - input_decoded_);
    mine[2] = train_input_->busy_seconds() - input_busy_s_;
  }
  const CpuClocks clocks = read_cpu_clocks();
  if (rank_ == run_.devices_rank) mine[3] = clocks.process_s - epoch_clocks_.process_s;
  const std::vector<double> all = gather(comm_, mine);
  std::vector<double> busy(static_cast<size_t>(replicas_), 0.0);
  double images = 0, input_s = 0, own_cpu_s = 0;
  for (size_t r = 0; r < all.size() / 4; ++r) {  // empty but on rank 0
    busy[r] = all[4 * r];
    images += all[4 * r + 1];
    input_s += all[4 * r + 2];
    own_cpu_s += all[4 * r + 3];
  }

  EpochMetrics m;
  m.epoch = epoch + 1;
  m.lr = tr.lr_first;
  m.lr_end = tr.lr_last;
  m.samples = static_cast<int64_t>(tr.seen);
  m.train_loss = tr.seen > 0 ? tr.loss_sum / tr.seen : 0.0;
  m.train_acc = tr.seen > 0 ? tr.correct / tr.seen : 0.0;
  const auto n_test = static_cast<double>(test_.size());
  m.test_loss = n_test > 0 ? test[0] / n_test : 0.0;
  m.test_acc = n_test > 0 ? test[1] / n_test : 0.0;
  m.epoch_time_s = t.total;
  m.samples_per_s = tr.seen / t.total;
  m.data_s = t.data;
  m.compute_s = t.compute;
  m.exchange_s = t.exchange;
  m.exchange_exposed_s = t.exposed;
  m.optimizer_s = t.optimizer;
  m.eval_s = eval_s;
  m.bn_sync_s = bn_sync_s_;
  if (run_.one_process) m.other_cores = other_cores(epoch_clocks_, clocks, own_cpu_s);
  if (train_input_ && t.total > input_since_s_) {
    const double span = std::max(1e-9, t.total - input_since_s_);  // since (re)start
    m.input_images_per_s = images / span;
    m.input_busy = input_s / (span * replicas_ * cfg_.data.workers);
  }
  const auto [lo_it, hi_it] = std::minmax_element(busy.begin(), busy.end());
  m.rank_busy_min_s = *lo_it;
  m.rank_busy_max_s = *hi_it;
  m.slowest_rank = static_cast<int>(hi_it - busy.begin());
  m.exchange_bytes_per_step = model_->param_count() * static_cast<int64_t>(sizeof(float));
  if (replicas_ > 1 && t.exchange > 0 && steps_ > 0) {
    const double n = replicas_;
    const double algbw = static_cast<double>(m.exchange_bytes_per_step) *
                         static_cast<double>(steps_) / t.exchange;
    m.busbw_gbps = algbw * 2 * (n - 1) / n / 1e9;
  }
  noise_.report(m);
  return m;
}

}  // namespace dtrain
