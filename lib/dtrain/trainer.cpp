#include "dtrain/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "dtrain/comm.hpp"
#include "dtrain/device.hpp"
#include "dtrain/error.hpp"
#include "dtrain/model.hpp"
#include "dtrain/optimizer.hpp"
#include "dtrain/sampler.hpp"
#include "dtrain/schedule.hpp"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_stop{false};
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int resolve_threads(const Config& cfg) {
  if (cfg.threads > 0) return cfg.threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

struct Shared {
  const Config& cfg;
  const DataSplit& data;
  TrainObserver* observer;
  TrainResult result;
};

void worker(Shared& sh, Communicator& comm) {
  const Config& cfg = sh.cfg;
  const int rank = comm.rank();
  const int replicas = comm.size();
  const Dataset& train = sh.data.train;
  const Dataset& test = sh.data.test;
  const int64_t features = train.features();
  const int64_t micro = cfg.micro_batch();
  const int64_t gbatch = cfg.global_batch();
  const int accum = cfg.train.accumulation_steps;

  auto dev = make_cpu_device();
  auto model = build_model(*dev, cfg.model, train.shape, train.classes);
  model->init(cfg.train.seed);
  // Each replica's own stream for dropout (and augmentation): results differ with the replica
  // count whenever these are used, as they do in every framework.
  Rng replica_rng(stream_key(cfg.train.seed, 0xD209, static_cast<uint64_t>(rank)));
  model->set_context(&comm, &replica_rng);
  Optimizer opt(*dev, cfg.optimizer, static_cast<size_t>(model->param_count()));
  Sampler sampler(train.size(), gbatch, replicas, accum, cfg.data.shuffle, cfg.data.sharding,
                  cfg.data.drop_remainder, cfg.train.seed);
  const int64_t steps = sampler.steps_per_epoch();
  const size_t n_params = static_cast<size_t>(model->param_count());

  // Batch buffers hold a full micro-batch or an evaluation chunk, whichever is larger.
  const int64_t cap = std::max(micro, cfg.train.eval_batch);
  Buffer<float> xb(*dev, static_cast<size_t>(cap * features));
  Buffer<int32_t> yb(*dev, static_cast<size_t>(cap));
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(cap));

  const ReduceOp grad_op = cfg.train.reduction == Reduction::mean ? ReduceOp::mean : ReduceOp::sum;

  if (rank == 0) {
    RunInfo& info = sh.result.info;
    info.model = model->describe();
    info.data = sh.data.description;
    info.steps_per_epoch = steps;
    info.global_batch = gbatch;
    info.micro_batch = micro;
    info.peak_lr = scaled_lr(cfg.optimizer, gbatch);
    info.param_count = model->param_count();
    if (sh.observer) sh.observer->on_start(info);
  }

  // Test shard of this replica: a contiguous slice.
  const int64_t test_lo = test.size() * rank / replicas;
  const int64_t test_hi = test.size() * (rank + 1) / replicas;

  // Fault injection for testing failure handling: DTRAIN_FAULT=RANK:STEP makes that rank throw
  // at that (global, 1-based) step.
  int64_t fault_step = -1;
  if (const char* f = std::getenv("DTRAIN_FAULT")) {
    int fr = -1;
    long long fs = -1;
    if (std::sscanf(f, "%d:%lld", &fr, &fs) == 2 && fr == rank) fault_step = fs;
  }
  int64_t global_step = 0;

  std::vector<double> step_stats;  // per step: loss sum, correct, samples
  for (int epoch = 0; epoch < cfg.train.epochs; ++epoch) {
    const EpochPlan plan = sampler.plan(epoch);
    step_stats.assign(static_cast<size_t>(steps * 3), 0.0);
    double t_data = 0, t_compute = 0, t_exchange = 0, t_opt = 0;
    const auto t_epoch = Clock::now();
    double lr_first = 0, lr = 0;

    for (int64_t s = 0; s < steps; ++s) {
      if (g_stop.load(std::memory_order_relaxed)) throw Aborted("interrupted by the user");
      if (++global_step == fault_step)
        DTRAIN_THROW_SYSTEM(
            fmt::format("injected fault (DTRAIN_FAULT) on rank {} at step {}", rank, global_step));
      lr = lr_at(cfg.optimizer, cfg.train.epochs, gbatch,
                 epoch + static_cast<double>(s) / static_cast<double>(steps));
      if (s == 0) lr_first = lr;
      const int64_t g_total = plan.batch_size(s);
      // Local gradients are scaled so that a mean over replicas is the mean over the whole
      // global batch (exact also for a short last batch); `sum` then gives N times that.
      const float grad_scale = static_cast<float>(replicas) / static_cast<float>(g_total);
      double* st = step_stats.data() + s * 3;
      model->zero_grads();
      for (int k = 0; k < accum; ++k) {
        auto t0 = Clock::now();
        sampler.micro_batch(plan, s, k, rank, idx);
        const auto rows = static_cast<int64_t>(idx.size());
        dev->gather(train.x.data(), train.y.data(), features, idx.data(), rows, xb.data(),
                    yb.data());
        augment_batch(xb.data(), rows, train.shape, cfg.data.augment, replica_rng);
        auto t1 = Clock::now();
        model->forward(xb.data(), rows);
        model->loss_backward(yb.data(), rows, grad_scale, st);
        st[2] += static_cast<double>(rows);
        t_data += std::chrono::duration<double>(t1 - t0).count();
        t_compute += seconds_since(t1);
      }
      auto t2 = Clock::now();
      comm.allreduce(model->grads(), n_params, grad_op);
      auto t3 = Clock::now();
      opt.step(model->params(), model->grads(), lr);
      t_exchange += std::chrono::duration<double>(t3 - t2).count();
      t_opt += seconds_since(t3);
      if (rank == 0 && sh.observer) sh.observer->on_step(epoch + 1, s + 1, steps);
    }
    // One exchange per epoch turns local per-step stats into global ones.
    comm.allreduce(step_stats.data(), step_stats.size(), ReduceOp::sum);
    const double epoch_time = seconds_since(t_epoch);

    double loss_sum = 0, correct = 0, seen = 0;
    for (int64_t s = 0; s < steps; ++s) {
      loss_sum += step_stats[static_cast<size_t>(s * 3)];
      correct += step_stats[static_cast<size_t>(s * 3 + 1)];
      seen += step_stats[static_cast<size_t>(s * 3 + 2)];
    }

    // Evaluation: every replica scores its test shard; counts are summed. With per-replica
    // BatchNorm the running statistics differ between replicas, so they are averaged first.
    const auto t_eval = Clock::now();
    if (cfg.model.batchnorm == BatchNormMode::local) model->average_state(comm);
    double test_stats[2] = {0, 0};
    for (int64_t lo = test_lo; lo < test_hi; lo += cfg.train.eval_batch) {
      const int64_t rows = std::min(cfg.train.eval_batch, test_hi - lo);
      dev->upload(xb.data(), test.x.data() + lo * features,
                  static_cast<size_t>(rows * features) * sizeof(float));
      dev->upload(yb.data(), test.y.data() + lo, static_cast<size_t>(rows) * sizeof(int32_t));
      model->forward(xb.data(), rows, /*train=*/false);
      model->loss_only(yb.data(), rows, test_stats);
    }
    comm.allreduce(test_stats, 2, ReduceOp::sum);
    const double eval_time = seconds_since(t_eval);
    std::vector<double> busy(static_cast<size_t>(replicas), 0.0);
    busy[static_cast<size_t>(rank)] = t_data + t_compute + t_opt;
    comm.allreduce(busy.data(), busy.size(), ReduceOp::sum);

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.lr = lr_first;
    m.lr_end = lr;
    m.samples = static_cast<int64_t>(seen);
    m.train_loss = seen > 0 ? loss_sum / seen : 0.0;
    m.train_acc = seen > 0 ? correct / seen : 0.0;
    m.test_loss = test.size() > 0 ? test_stats[0] / static_cast<double>(test.size()) : 0.0;
    m.test_acc = test.size() > 0 ? test_stats[1] / static_cast<double>(test.size()) : 0.0;
    m.epoch_time_s = epoch_time;
    m.samples_per_s = seen / epoch_time;
    m.data_s = t_data;
    m.compute_s = t_compute;
    m.exchange_s = t_exchange;
    m.optimizer_s = t_opt;
    m.eval_s = eval_time;
    const auto [lo_it, hi_it] = std::minmax_element(busy.begin(), busy.end());
    m.rank_busy_min_s = *lo_it;
    m.rank_busy_max_s = *hi_it;
    m.slowest_rank = static_cast<int>(hi_it - busy.begin());
    const bool diverged = !std::isfinite(m.train_loss) || !std::isfinite(m.test_loss);

    if (rank == 0) {
      for (int64_t s = 0; s < steps; ++s) {
        const double n = step_stats[static_cast<size_t>(s * 3 + 2)];
        sh.result.step_losses.push_back(n > 0 ? step_stats[static_cast<size_t>(s * 3)] / n : 0.0);
      }
      sh.result.epochs.push_back(m);
      if (diverged) sh.result.status = RunStatus::diverged;
      if (sh.observer) sh.observer->on_epoch(m);
    }
    // Every rank sees the same reduced numbers, so all stop together.
    if (diverged) break;
  }
}

}  // namespace

void request_stop() {
  g_stop.store(true);
}
bool stop_requested() {
  return g_stop.load();
}

void check_plan(const Config& cfg, const DataSplit& data) {
  const int64_t g = cfg.global_batch();
  if (data.train.size() < g && cfg.data.drop_remainder)
    throw UserError(fmt::format(
        "train: global batch {} (= per_replica_batch {} x gpus {} x accumulation_steps {}) is "
        "larger than the {} training samples, so drop_remainder leaves no step; use a smaller "
        "batch or data.drop_remainder: false",
        g, cfg.micro_batch(), cfg.gpus, cfg.train.accumulation_steps, data.train.size()));
  if (data.train.size() == 0) throw UserError("data: the training set is empty");
  if (cfg.backend == Backend::cuda)
    throw UserError("backend: cuda is not available in this build (valid here: auto, cpu)");
  const int classes = data.train.classes;
  for (const auto* d : {&data.train, &data.test})
    for (auto y : d->y)
      if (y < 0 || y >= classes)
        throw UserError(fmt::format("data: label {} outside [0, {})", y, classes));
}

TrainResult train_rank(const Config& cfg, const DataSplit& data, Communicator& comm,
                       TrainObserver* observer) {
  check_plan(cfg, data);
  if (comm.size() != cfg.gpus)
    throw UserError(
        fmt::format("gpus={} but {} processes were started; dtrain runs one replica "
                    "per process, so the two must be equal",
                    cfg.gpus, comm.size()));
  int threads = cfg.threads;
  if (threads <= 0) {
    // Share the machine's cores among the processes on it.
    int local = 1;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
      if (const char* s = std::getenv(v)) local = std::max(1, std::atoi(s));
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  }
  set_blas_threads(threads);
  Shared sh{cfg, data, comm.rank() == 0 ? observer : nullptr, {}};
  sh.result.info.devices = fmt::format("cpu: {} replicas as processes ({}), {} BLAS thread{} each",
                                       comm.size(), comm.kind(), threads, threads == 1 ? "" : "s");
  worker(sh, comm);
  return std::move(sh.result);
}

TrainResult train(const Config& cfg, const DataSplit& data, TrainObserver* observer) {
  check_plan(cfg, data);
  const int threads = resolve_threads(cfg);
  const int blas_threads = std::max(1, threads / cfg.gpus);
  set_blas_threads(blas_threads);

  Shared sh{cfg, data, observer, {}};
  sh.result.info.devices =
      fmt::format("cpu: {} replica{} as threads, {} BLAS thread{} each", cfg.gpus,
                  cfg.gpus == 1 ? "" : "s", blas_threads, blas_threads == 1 ? "" : "s");
  InProcessGroup group(cfg.gpus);
  std::mutex err_mu;
  std::exception_ptr first_error;
  auto run_rank = [&](int rank) {
    try {
      auto comm = group.communicator(rank);
      worker(sh, *comm);
    } catch (const Aborted&) {
      // Another rank failed first (its error is the one reported), or the user interrupted:
      // then release the ranks still blocked in a collective.
      if (stop_requested()) {
        {
          std::lock_guard lk(err_mu);
          if (!first_error) first_error = std::current_exception();
        }
        group.abort("interrupted by the user");
      }
    } catch (...) {
      {
        std::lock_guard lk(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
      group.abort(fmt::format("rank {} failed", rank));
    }
  };
  std::vector<std::thread> pool;
  for (int r = 1; r < cfg.gpus; ++r) pool.emplace_back(run_rank, r);
  run_rank(0);
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return std::move(sh.result);
}

}  // namespace dtrain
