#include "dtrain/train/trainer.hpp"

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

#include "dtrain/dist/comm.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/dist/exchange.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/dist/nccl.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/dist/mpi.hpp"
#include "dtrain/nn/optimizer.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/nn/schedule.hpp"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Every kernel runs on the replica's own OpenMP team; OpenBLAS itself stays single-threaded
// (dtrain cuts large GEMMs into blocks), so no second thread pool competes for the cores.
CpuOptions cpu_options(int threads, Precision precision) {
  set_blas_threads(1);
  CpuOptions o;
  o.threads = threads;
  o.bf16 = precision == Precision::bf16;
  o.conv = cpu_conv_from_env();
  return o;
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
  CpuOptions cpu{};
  Placement place{};
  std::shared_ptr<NcclGroup> nccl{};  // gradients of GPU replicas, where not colocated
  bool nccl_per_process = false;      // one replica per process: its communicator is index 0
  int gpus_in_process = 1;            // GPUs this process drives
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

  std::unique_ptr<Device> dev =
      sh.place.backend == Backend::cuda
          ? make_cuda_device(sh.place.gpu_of_replica[static_cast<size_t>(rank)], rank,
                             cfg.precision)
          : make_cpu_device(sh.cpu);
  DeviceQueue* const queue = dev->queue();  // null on the CPU
  // On a GPU the training set is uploaded once and batches are gathered there.
  const float* train_x = train.x.data();
  const int32_t* train_y = train.y.data();
  Buffer<float> dev_train_x;
  Buffer<int32_t> dev_train_y;
  if (!dev->host_memory()) {
    dev_train_x.resize(*dev, std::max<size_t>(1, train.x.size()));
    dev_train_y.resize(*dev, std::max<size_t>(1, train.y.size()));
    dev->upload(dev_train_x.data(), train.x.data(), train.x.size() * sizeof(float));
    dev->upload(dev_train_y.data(), train.y.data(), train.y.size() * sizeof(int32_t));
    train_x = dev_train_x.data();
    train_y = dev_train_y.data();
  }
  const bool augment = cfg.data.augment.enabled();
  Buffer<float> xa;  // the augmented batch
  if (augment) xa.resize(*dev, static_cast<size_t>(std::max<int64_t>(1, micro * features)));
  const auto bucket_elems = static_cast<size_t>(cfg.train.bucket_mb * 1024 * 1024 / sizeof(float));
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
  auto exchange = sh.nccl ? sh.nccl->exchange(sh.nccl_per_process ? 0 : rank, *dev, grad_op,
                                              n_params, bucket_elems)
                          : make_host_exchange(comm, *dev, grad_op, n_params, bucket_elems);
  // A host exchange on a GPU (colocated replicas) copies each bucket to the host, which waits
  // for the device first. That wait is compute still queued, not exchange: it is waited out
  // before the exchange is timed, so that the host clocks measure the exchange alone.
  // A failure in this replica aborts NCCL before anything that waits on its streams unwinds
  // (the exchange's and the device's destructors), or a peer's queued collective would keep
  // this rank from ever getting to the abort.
  struct AbortOnUnwind {
    NcclGroup* group;
    int uncaught = std::uncaught_exceptions();
    ~AbortOnUnwind() {
      if (group && std::uncaught_exceptions() > uncaught) group->abort();
    }
  } abort_on_unwind{sh.nccl.get()};
  const bool exchange_on_host = !sh.nccl;
  const bool wait_before_exchange = exchange_on_host && !dev->host_memory();
  const Model::GradsReady on_ready = [&](size_t off, size_t count) {
    // Only before a bucket goes out: a wait per layer would stall the device for nothing.
    if (wait_before_exchange && exchange->would_launch(off)) queue->synchronize();
    exchange->ready(off, count);
  };

  // CUDA graphs for full-size steps, where nothing in a step waits for the host (see
  // cuda_graph_state).
  std::string graph_state;
  if (sh.place.backend == Backend::cuda) {
    graph_state =
        cuda_graph_state(cfg.train.cuda_graph, sh.nccl != nullptr, sh.gpus_in_process,
                         cfg.model.batchnorm == BatchNormMode::sync && model->has_batchnorm());
    const auto staging = static_cast<size_t>(accum * micro) * sizeof(int64_t) + 4096;
    queue->enable_graphs(graph_state == "on", staging, sh.nccl ? &sh.nccl->gate() : nullptr);
  }
  const bool graphs_on = graph_state == "on";
  // A graph step's (loss, correct) sums, at the fixed address the graph was captured with.
  Buffer<double> graph_stats(*dev, 2);

  if (rank == 0) {
    RunInfo& info = sh.result.info;
    info.model = model->describe();
    info.data = sh.data.description;
    info.steps_per_epoch = steps;
    info.global_batch = gbatch;
    info.micro_batch = micro;
    info.peak_lr = scaled_lr(cfg.optimizer, gbatch);
    info.param_count = model->param_count();
    info.backend = to_string(sh.place.backend);
    info.precision = to_string(cfg.precision);
    info.blas = blas_description();
    info.cuda_graph = graph_state;
    if (!graph_state.empty()) info.devices += "; CUDA graphs " + graph_state;
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
  // Loss sums and hits stay on the device during the epoch: no step waits for the host.
  Buffer<double> dev_stats(*dev, static_cast<size_t>(std::max<int64_t>(1, steps * 2)));
  Buffer<double> dev_test(*dev, 2);
  std::vector<double> host_stats(static_cast<size_t>(std::max<int64_t>(1, steps * 2)));
  for (int epoch = 0; epoch < cfg.train.epochs; ++epoch) {
    const EpochPlan plan = sampler.plan(epoch);
    step_stats.assign(static_cast<size_t>(steps * 3), 0.0);
    dev->zero(dev_stats.data(), dev_stats.size() * sizeof(double));
    double t_data = 0, t_compute = 0, t_exchange = 0, t_opt = 0;
    const auto t_epoch = Clock::now();
    double lr_first = 0, lr = 0;

    for (int64_t s = 0; s < steps; ++s) {
      if (stop_requested()) throw Aborted("interrupted by the user");
      if (++global_step == fault_step)
        DTRAIN_THROW_SYSTEM(
            fmt::format("injected fault (DTRAIN_FAULT) on rank {} at step {}", rank, global_step));
      lr = lr_at(cfg.optimizer, cfg.train.epochs, gbatch,
                 epoch + static_cast<double>(s) / static_cast<double>(steps));
      if (s == 0) lr_first = lr;
      const int64_t g_total = plan.batch_size(s);
      // Kernels per step, counted on the second step (the first sets things up).
      const int64_t launches_before = queue ? queue->launches() : 0;
      // Local gradients are scaled so that a mean over replicas is the mean over the whole
      // global batch (exact also for a short last batch); `sum` then gives N times that.
      const float grad_scale = static_cast<float>(replicas) / static_cast<float>(g_total);
      double* st = step_stats.data() + s * 3;
      // Full-size steps may run as graphs, the same way on every rank.
      Device::GraphMode gm = Device::GraphMode::eager;
      if (graphs_on && g_total == gbatch) {
        Device::GraphMode mine = queue->graph_step_propose();
        if (replicas > 1) {
          double votes[3] = {0, 0, 0};
          votes[static_cast<int>(mine)] = 1;
          comm.allreduce(votes, 3, ReduceOp::sum);  // host only: the device does not wait
          mine = agree_graph_mode(static_cast<int>(votes[0]), static_cast<int>(votes[1]),
                                  static_cast<int>(votes[2]));
        }
        gm = queue->graph_step_begin(mine);
      }
      const bool in_graph = gm != Device::GraphMode::eager;
      double* st_dev = in_graph ? graph_stats.data() : dev_stats.data() + s * 2;
      try {
        if (queue) queue->step_mark(0);
        if (in_graph) dev->zero(st_dev, 2 * sizeof(double));
        model->zero_grads();
        for (int k = 0; k < accum; ++k) {
          auto t0 = Clock::now();
          sampler.micro_batch(plan, s, k, rank, idx);
          const auto rows = static_cast<int64_t>(idx.size());
          dev->gather(train_x, train_y, features, idx.data(), rows, xb.data(), yb.data());
          const float* batch = xb.data();
          if (augment) {  // on the device, from one draw of the replica's stream
            const auto& sh3 = train.shape;
            dev->augment(xb.data(), xa.data(), rows, sh3[0], sh3[1], sh3[2],
                         cfg.data.augment.crop_padding, cfg.data.augment.flip,
                         replica_rng.next());
            batch = xa.data();
          }
          auto t1 = Clock::now();
          model->forward(batch, rows);
          const bool last = k == accum - 1;
          if (last) exchange->begin(model->grads());
          model->loss_backward(yb.data(), rows, grad_scale, st_dev,
                               last ? on_ready : Model::GradsReady{});
          st[2] += static_cast<double>(rows);
          t_data += std::chrono::duration<double>(t1 - t0).count();
          t_compute += seconds_since(t1);
        }
        if (queue) queue->step_mark(1);
        // Buckets reduced during backward ran on this thread: their time is exchange, not
        // compute.
        const double during_backward = exchange->seconds();
        if (wait_before_exchange) queue->synchronize();  // see on_ready
        auto t2 = Clock::now();
        exchange->finish();
        auto t3 = Clock::now();
        t_compute -= during_backward;
        t_exchange += during_backward + std::chrono::duration<double>(t3 - t2).count();
        if (queue) queue->step_mark(2);
        opt.step(model->params(), model->grads(), lr);
        if (queue) queue->step_mark(3);
        t_opt += seconds_since(t3);
        if (in_graph) queue->graph_step_end();
      } catch (const SystemError& e) {
        if (!in_graph) throw;
        queue->graph_step_abort();
        throw SystemError(fmt::format("{} (in a CUDA-graph step; train.cuda_graph: false runs "
                                      "without graphs)",
                                      e.what()),
                          e.file(), e.line(), e.rank());
      } catch (...) {
        if (in_graph) queue->graph_step_abort();
        throw;
      }
      if (in_graph) dev->copy(dev_stats.data() + s * 2, st_dev, 2 * sizeof(double));
      if (rank == 0 && epoch == 0 && s == 1)
        sh.result.info.launches_per_step = (queue ? queue->launches() : 0) - launches_before;
      if (rank == 0 && sh.observer) sh.observer->on_step(epoch + 1, s + 1, steps);
    }
    // The epoch's only wait for the device; then one exchange turns local per-step stats into
    // global ones.
    dev->download(host_stats.data(), dev_stats.data(), host_stats.size() * sizeof(double));
    for (int64_t s = 0; s < steps; ++s) {
      step_stats[static_cast<size_t>(s * 3)] = host_stats[static_cast<size_t>(s * 2)];
      step_stats[static_cast<size_t>(s * 3 + 1)] = host_stats[static_cast<size_t>(s * 2 + 1)];
    }
    comm.allreduce(step_stats.data(), step_stats.size(), ReduceOp::sum);
    const double epoch_time = seconds_since(t_epoch);
    // On a GPU the host only queues work: the split comes from CUDA events instead (but for
    // an exchange that runs on the host).
    double t_exposed = t_exchange;
    {
      double dt[3] = {0, 0, 0};
      const bool on_device = queue != nullptr;
      if (on_device) queue->take_step_times(dt, /*wait=*/true);
      const double comm_s = on_device ? exchange->take_device_seconds(/*wait=*/true) : -1.0;
      const PhaseSeconds p = split_phases({t_compute, t_exchange, t_exchange, t_opt},
                                          on_device ? dt : nullptr, comm_s, exchange_on_host);
      t_compute = p.compute;
      t_exchange = p.exchange;
      t_exposed = p.exchange_exposed;
      t_opt = p.optimizer;
    }

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
    dev->zero(dev_test.data(), 2 * sizeof(double));
    for (int64_t lo = test_lo; lo < test_hi; lo += cfg.train.eval_batch) {
      const int64_t rows = std::min(cfg.train.eval_batch, test_hi - lo);
      dev->upload(xb.data(), test.x.data() + lo * features,
                  static_cast<size_t>(rows * features) * sizeof(float));
      dev->upload(yb.data(), test.y.data() + lo, static_cast<size_t>(rows) * sizeof(int32_t));
      model->forward(xb.data(), rows, /*train=*/false);
      model->loss_only(yb.data(), rows, dev_test.data());
    }
    dev->download(test_stats, dev_test.data(), sizeof(test_stats));
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
    m.exchange_exposed_s = t_exposed;
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
  if (rank == 0) sh.result.info.cuda_graph_steps = queue ? queue->graph_launches() : 0;
}

}  // namespace

std::string cuda_graph_state(bool requested, bool nccl, int gpus_in_process, bool sync_batchnorm) {
  if (!requested) return "off: train.cuda_graph is false";
  if (!nccl) return "off: colocated replicas meet on the host";
  // NCCL: "Using multiple GPUs per process with CUDA graph capture may result in deadlocks"
  // (cudaGraphLaunch may block). Off until graphs have run on such a machine.
  if (gpus_in_process > 1)
    return fmt::format(
        "off: {} GPUs in one process (NCCL warns that CUDA graphs may deadlock there, and they "
        "have not run on such a machine yet; under mpirun or srun, one GPU per process, they "
        "are on)",
        gpus_in_process);
  if (sync_batchnorm) return "off: batchnorm: sync all-reduces statistics through the host";
  return "on";
}

Device::GraphMode agree_graph_mode(int eager_votes, int capture_votes, int replay_votes) {
  if (eager_votes == 0 && replay_votes == 0 && capture_votes > 0) return Device::GraphMode::capture;
  if (eager_votes == 0 && capture_votes == 0 && replay_votes > 0) return Device::GraphMode::replay;
  return Device::GraphMode::eager;  // some rank cannot, or the ranks differ
}

PhaseSeconds split_phases(const PhaseSeconds& host, const double* device, double exchange_device_s,
                          bool exchange_on_host) {
  PhaseSeconds p = host;
  if (!device) {  // host clocks only: the exchange is synchronous, so all of it is exposed
    p.exchange_exposed = p.exchange;
    return p;
  }
  p.optimizer = device[2];
  if (exchange_on_host) {
    // The device idles while the host exchanges, so its events count that time as compute or
    // exposed exchange; the host clocks measured the exchange itself.
    p.exchange = p.exchange_exposed = host.exchange;
    p.compute = std::max(0.0, device[0] + device[1] - host.exchange);
  } else {
    p.compute = device[0];
    p.exchange_exposed = device[1];
    p.exchange = exchange_device_s >= 0 ? exchange_device_s : device[1];
  }
  return p;
}

// Replicas placed by this process: all of them in-process, or one per process on this node
// under a launcher.
static int local_replica_count(const Config& cfg) {
  if (!mpi::detect().active) return cfg.gpus;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

std::string Placement::describe() const {
  if (backend != Backend::cuda) return "cpu";
  std::string s;
  for (size_t i = 0; i < gpu_of_replica.size(); ++i)
    s += fmt::format("{}{}", i ? "," : "", gpu_of_replica[i]);
  return fmt::format("cuda: replicas on GPUs [{}]{}", s, colocated ? " (colocated)" : "");
}

Placement place_replicas(const Config& cfg, int local_ranks) {
  Placement p;
  if (cfg.backend == Backend::cpu) return p;
  const GpuSystem sys = query_gpus();
  if (cfg.backend == Backend::auto_ && sys.gpus.empty()) return p;
  if (sys.gpus.empty())
    throw UserError(
        fmt::format("backend: cuda, but {}; use backend: cpu or auto", sys.none_reason));
  std::vector<int> devs;
  for (auto d : cfg.devices) {
    if (d >= static_cast<int64_t>(sys.gpus.size()))
      throw UserError(fmt::format("devices: GPU {} does not exist; this machine has {} (0..{})", d,
                                  sys.gpus.size(), sys.gpus.size() - 1));
    devs.push_back(static_cast<int>(d));
  }
  if (devs.empty())
    for (int i = 0; i < static_cast<int>(sys.gpus.size()) && i < local_ranks; ++i)
      devs.push_back(i);
  if (local_ranks > static_cast<int>(devs.size()) && !cfg.colocate) {
    if (cfg.backend == Backend::auto_) return p;  // auto: not enough GPUs, so the CPU
    throw UserError(fmt::format(
        "gpus={} needs {} GPUs on this machine but {} {} available; set colocate: true to run "
        "several replicas per GPU (in turn), lower gpus, or use backend: cpu",
        cfg.gpus, local_ranks, devs.size(), devs.size() == 1 ? "is" : "are"));
  }
  p.backend = Backend::cuda;
  p.colocated = local_ranks > static_cast<int>(devs.size());
  for (int r = 0; r < local_ranks; ++r)
    p.gpu_of_replica.push_back(devs[static_cast<size_t>(r) % devs.size()]);
  return p;
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
  if (cfg.data.augment.enabled() && data.train.shape.size() != 3)
    throw UserError(
        "data.augment: crops and flips need image data with a [c, h, w] shape (this data is "
        "flat; for synthetic data give data.synthetic.shape three dimensions)");
  if (place_replicas(cfg, local_replica_count(cfg)).backend != Backend::cuda &&
      cfg.precision == Precision::tf32)
    throw UserError(
        "precision: tf32 needs a GPU, and this run is on the CPU (fp32, or bf16 emulated)");
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
    threads = std::max(
        1, static_cast<int>(std::thread::hardware_concurrency()) / local_replica_count(cfg));
  }
  Shared sh{cfg, data, comm.rank() == 0 ? observer : nullptr, {}};
  sh.cpu = cpu_options(threads, cfg.precision);
  sh.place = place_replicas(cfg, local_replica_count(cfg));
  if (sh.place.backend == Backend::cuda) {
    // This process's replica takes the GPU of its local rank on this node.
    const auto& g = sh.place.gpu_of_replica;
    const int gpu = g[static_cast<size_t>(mpi::detect().local_rank) % g.size()];
    sh.place.gpu_of_replica.assign(static_cast<size_t>(comm.size()), gpu);
    sh.nccl = NcclGroup::over_mpi(gpu, comm.rank(), comm.size());
    sh.nccl_per_process = true;
    sh.gpus_in_process = 1;
    sh.result.info.devices =
        fmt::format("cuda: {} replicas as processes ({}), rank 0 on GPU {}, gradients by NCCL {}",
                    comm.size(), comm.kind(), gpu, sh.nccl->version());
  } else {
    sh.result.info.devices =
        fmt::format("cpu: {} replicas as processes ({}), {} thread{} each, conv {}{}",
                    comm.size(), comm.kind(), threads, threads == 1 ? "" : "s",
                    to_string(sh.cpu.conv), sh.cpu.bf16 ? ", bf16 emulated" : "");
  }
  try {
    worker(sh, comm);
  } catch (...) {
    // The worker has unwound (its device and graphs are gone): abort rather than destroy the
    // communicator, whose peers may never finish the collectives it still has queued.
    if (sh.nccl) sh.nccl->abort();
    throw;
  }
  return std::move(sh.result);
}

TrainResult train(const Config& cfg, const DataSplit& data, TrainObserver* observer) {
  check_plan(cfg, data);
  const int threads = resolve_threads(cfg);
  const int per_replica = std::max(1, threads / cfg.gpus);

  Shared sh{cfg, data, observer, {}};
  sh.cpu = cpu_options(per_replica, cfg.precision);
  sh.place = place_replicas(cfg, cfg.gpus);
  // Colocated replicas share a GPU, which NCCL (before 2.30) does not allow: their gradients go
  // through the host (copied there bucket by bucket and reduced by the in-process communicator,
  // so with the CPU's arithmetic).
  if (sh.place.backend == Backend::cuda && !sh.place.colocated) {
    sh.nccl = NcclGroup::local(sh.place.gpu_of_replica);
    sh.gpus_in_process = cfg.gpus;  // one GPU per replica
  }
  sh.result.info.devices =
      sh.place.backend == Backend::cuda
          ? fmt::format("{}; gradients {}", sh.place.describe(),
                        sh.nccl ? "by NCCL " + sh.nccl->version() : "through the host")
          : fmt::format("cpu: {} replica{} as threads, {} thread{} each, conv {}{}", cfg.gpus,
                        cfg.gpus == 1 ? "" : "s", per_replica, per_replica == 1 ? "" : "s",
                        to_string(sh.cpu.conv), sh.cpu.bf16 ? ", bf16 emulated" : "");
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
        if (sh.nccl) sh.nccl->abort();
      }
    } catch (...) {
      {
        std::lock_guard lk(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
      group.abort(fmt::format("rank {} failed", rank));
      if (sh.nccl) sh.nccl->abort();
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
