#include "dtrain/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/fibers.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/comm/nccl.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/train/rank_gather.hpp"
#include "dtrain/train/replica.hpp"

namespace dtrain {

namespace {

// Every kernel runs on the replica's own OpenMP team; each sgemm call stays single-threaded
// (dtrain cuts large GEMMs into blocks), so no second thread pool competes for the cores.
CpuOptions cpu_options(int threads, Precision precision) {
  set_blas_threads(1);
  CpuOptions o;
  o.threads = threads;
  o.bf16 = precision == Precision::bf16;
  o.conv = cpu_conv_from_env();
  o.gemm = cpu_gemm_from_env();
  o.fuse = cpu_fuse_from_env();
  return o;
}

int resolve_threads(const Config& cfg) {
  if (cfg.threads > 0) return cfg.threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// One copy of the weights for replicas that share it, initialised as every replica would
// initialise its own.
std::shared_ptr<SharedWeights> make_shared_weights(const RunContext& sh) {
  const Config& cfg = sh.cfg;
  auto sw = std::make_shared<SharedWeights>();
  // On a GPU, the one all the replicas are on (shares_weights); rank 0 names it in errors.
  sw->dev = sh.place.backend == Backend::cuda
                ? make_cuda_device(sh.place.gpu_of_replica.front(), 0, cfg.precision)
                : make_cpu_device(sh.cpu);
  const auto layers = build_layers(cfg.model, sh.data.train.shape, sh.data.train.classes);
  const std::vector<float> init = initial_params(layers, cfg.train.seed);
  const size_t n = init.size();
  sw->params.resize(*sw->dev, std::max<size_t>(n, 1));
  sw->dev->upload(sw->params.data(), init.data(), n * sizeof(float));
  sw->opt = std::make_unique<Optimizer>(*sw->dev, cfg.optimizer, n, weight_ranges(layers));
  for (auto& b : sw->reduced) b.resize(*sw->dev, std::max<size_t>(n, 1));
  // A GPU zeroes new memory on this device's stream; the replicas use it on theirs.
  if (DeviceQueue* q = sw->dev->queue()) q->synchronize();
  return sw;
}

// The log's `devices` for replicas in this process, e.g. "cpu: 64 replicas in turn on 2
// threads, sharing one copy of the weights, conv onednn, gemm onednn". `workers` > 0: fibers
// on so many.
std::string in_process_devices(const RunContext& sh, int per_replica, int workers) {
  const int n = sh.cfg.gpus;
  if (sh.place.backend == Backend::cuda)
    return fmt::format("{}; gradients {}", sh.place.describe(),
                       sh.nccl     ? "by NCCL " + sh.nccl->version()
                       : sh.shared ? "added on the GPU in rank order, into one shared copy of "
                                     "the weights"
                                   : "through the host");
  const auto plural = [](int k) { return k == 1 ? "" : "s"; };
  std::string how =
      workers > 0 ? fmt::format("in turn on {} thread{}", workers, plural(workers))
                  : fmt::format("as threads, {} thread{} each", per_replica, plural(per_replica));
  if (sh.shared) how += ", sharing one copy of the weights";
  return fmt::format("cpu: {} replica{} {}, {}", n, plural(n), how, cpu_libraries(sh.cpu));
}

// What the CUDA backend held at most on each GPU of this process since the run began.
std::map<int, double> device_peaks_mib() {
  std::map<int, double> out;
  for (const auto& p : gpu_memory().peaks())
    out[p.gpu] = static_cast<double>(p.bytes) / (1024.0 * 1024.0);
  return out;
}

// devices.csv's sampler for this process, which drives `gpus` (CUDA indices; none on the CPU)
// and holds ranks from `first_rank` on; null where train.telemetry_ms is 0.
std::shared_ptr<DeviceSampler> device_sampler(const Config& cfg, int first_rank,
                                              std::vector<int> gpus, const Checkpoint* resume) {
  if (cfg.train.telemetry_ms <= 0) return nullptr;
  std::sort(gpus.begin(), gpus.end());
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  auto s = std::make_shared<DeviceSampler>(cfg.train.telemetry_ms / 1000.0, first_rank, gpus,
                                           resume ? resume->epoch : 0);
  if (!s->note().empty()) log().info("devices.csv: {}; those GPUs have no rows", s->note());
  return s;
}

// One replica's whole run, on this thread.
void run_replica(RunContext& run, Communicator& comm) {
  Replica replica(run, comm);
  replica.run();
}

}  // namespace

std::string cuda_graph_state(bool requested, bool nccl, int gpus_in_process, bool sync_batchnorm,
                             bool shared) {
  if (!requested) return "off: train.cuda_graph is false";
  if (!nccl && shared)
    return "off: colocated replicas sharing one copy of the weights are not captured yet";
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
                          bool exchange_on_host, double optimizer_in_exchange) {
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
    p.optimizer += optimizer_in_exchange;
    p.compute = std::max(0.0, device[0] + device[1] - host.exchange - optimizer_in_exchange);
  } else {
    p.compute = device[0];
    p.exchange_exposed = device[1];
    p.exchange = exchange_device_s >= 0 ? exchange_device_s : device[1];
  }
  return p;
}

// "; srun (Slurm), 2 hosts: node0 node1": who started the processes, and where they run.
static std::string launch_description(int ranks) {
  std::vector<std::string> hosts;
  for (int r = 0; r < ranks; ++r)
    if (std::find(hosts.begin(), hosts.end(), mpi::host_of(r)) == hosts.end())
      hosts.push_back(mpi::host_of(r));
  std::string names;
  for (size_t i = 0; i < hosts.size() && i < 4; ++i) names += " " + hosts[i];
  if (hosts.size() > 4) names += " ...";
  return fmt::format("; {}, {} host{}:{}", mpi::detect().launcher, hosts.size(),
                     hosts.size() == 1 ? "" : "s", names);
}

// Replicas placed by this process: all of them in-process, or one per process on this node
// under a launcher.
static int local_replica_count(const Config& cfg) {
  const mpi::Launch l = mpi::detect();
  return l.active ? l.local_size : cfg.gpus;
}

std::string Placement::describe() const {
  if (backend != Backend::cuda) return "cpu";
  std::string s;
  for (size_t i = 0; i < gpu_of_replica.size(); ++i)
    s += fmt::format("{}{}", i ? "," : "", gpu_of_replica[i]);
  return fmt::format("cuda: replicas on GPUs [{}]{}", s, colocated ? " (colocated)" : "");
}

// A GPU listed twice in `devices` puts two replicas on it, which NCCL refuses ("invalid
// usage") unless they are colocated. Checked before asking for GPUs, so that `dtrain validate`
// on a machine without one catches it too.
static void check_device_list(const Config& cfg) {
  if (cfg.colocate) return;
  for (size_t i = 0; i < cfg.devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (cfg.devices[i] == cfg.devices[j])
        throw UserError(fmt::format(
            "devices: GPU {} is listed twice, but NCCL runs one replica per GPU; set colocate: "
            "true to run several replicas on one GPU (in turn, by default sharing one copy of the "
            "weights), or list each GPU once",
            cfg.devices[i]));
}

Placement place_replicas(const Config& cfg, int local_ranks) {
  Placement p;
  if (cfg.backend == Backend::cpu) return p;
  check_device_list(cfg);
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
  for (int r = 0; r < local_ranks; ++r)
    p.gpu_of_replica.push_back(devs[static_cast<size_t>(r) % devs.size()]);
  // Colocated: some GPU holds more than one replica (more replicas than devices, or, with
  // colocate: true, a GPU listed twice).
  std::vector<int> used = p.gpu_of_replica;
  std::sort(used.begin(), used.end());
  p.colocated = std::adjacent_find(used.begin(), used.end()) != used.end();
  return p;
}

// The most rows a replica's buffers hold: a micro-batch or an evaluation chunk, each capped by
// the data's sizes (see Replica).
static int64_t buffer_rows(const Config& cfg, const DataSplit& data,
                           int64_t activations_per_sample) {
  const int64_t micro = std::min(cfg.micro_batch(), data.train.size());
  return std::max(micro, eval_chunk_rows(cfg.train.eval_batch, micro, data.test.size(),
                                         activations_per_sample, cfg.gpus));
}

// The sizes a GPU run hands cuBLAS and cuDNN as int (see narrow_int): every layer's input and
// output for the most rows a replica's buffers hold (a micro-batch or an evaluation chunk).
static void check_gpu_sizes(const Config& cfg, const DataSplit& data) {
  const auto layers = build_layers(cfg.model, data.train.shape, data.train.classes);
  const int64_t rows = buffer_rows(
      cfg, data,
      model_size(cfg.model, data.train.shape, data.train.classes).activations_per_sample);
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string name = fmt::format("model layer {} ({})", i, layers[i]->describe());
    check_gpu_tensor(name, rows, layers[i]->largest_features());  // a block's inside too
  }
}

namespace {
bool on_one_gpu(const Placement& place) {
  const auto& g = place.gpu_of_replica;
  return !g.empty() && std::all_of(g.begin(), g.end(), [&](int i) { return i == g.front(); });
}
}  // namespace

bool shares_weights(const Config& cfg, const Placement& place) {
  if (cfg.gpus <= 1 || cfg.replicas == ReplicaMode::threads || mpi::detect().active) return false;
  if (place.backend == Backend::cpu) return true;
  // GPU replicas: all colocated on one GPU, where the sum is folded on the GPU in rank order
  // (the bits of a copy per replica; 4 replicas of the quickstart MLP on an H200 took 0.066 s
  // an epoch so, against 0.257 s exchanging through the host: results/gpu/20261129-NVIDIA-H200).
  return place.colocated && on_one_gpu(place);
}

double state_bytes(const OptimizerConfig& o, int64_t params) {
  const double state = o.type == OptimizerType::sgd ? 1 : 2;  // momentum; Adam m, v
  return 4.0 * static_cast<double>(params) * (2 + state);
}

ReplicaBytes replica_bytes(const Config& cfg, const DataSplit& data) {
  const ModelSize m = model_size(cfg.model, data.train.shape, data.train.classes);
  const auto micro = static_cast<double>(std::min(cfg.micro_batch(), data.train.size()));
  ReplicaBytes b;
  b.rows = buffer_rows(cfg, data, m.activations_per_sample);
  const auto rows = static_cast<double>(b.rows);
  b.params = state_bytes(cfg.optimizer, m.params);
  b.grads = 4.0 * static_cast<double>(m.params);
  // Outputs for `rows`, input gradients for a micro-batch (backward never runs on more), and
  // the batch buffers.
  b.activations = 4.0 * (static_cast<double>(m.activations_per_sample) * (rows + micro) +
                         static_cast<double>(data.train.features()) * rows);
  // Image files: the training pipeline decodes up to data.prefetch batches ahead of the one in
  // use, the evaluation pipeline one ahead (ImagePipeline's slots).
  if (data.train.files)
    b.input = 4.0 * static_cast<double>(data.train.features()) *
              (micro * (cfg.data.prefetch + 1) + 2 * rows);
  return b;
}

namespace {

// The image pipelines' host buffers of a GPU run's replicas (on the CPU they count with the
// rest): refused where the machine cannot hold them.
void check_input_memory(const Config& cfg, const ReplicaBytes& one, int local_ranks) {
  const double need = one.input * local_ranks, have = available_host_memory();
  if (have <= 0 || need <= have) return;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  throw UserError(fmt::format(
      "the image pipeline's decoded batches need about {:.1f} GiB of host memory ({} replica{} "
      "at data.prefetch {}), but this machine has {:.1f} GiB available; lower data.prefetch, "
      "data.shape or train.per_replica_batch",
      need / kGiB, local_ranks, local_ranks == 1 ? "" : "s", cfg.data.prefetch, have / kGiB));
}

// A model or batch too large for the machine is a user error before any run folder exists,
// not "out of memory" after earlier runs of a sweep have trained.
void check_memory(const Config& cfg, const DataSplit& data, const Placement& place,
                  int local_ranks) {
  const ReplicaBytes one = replica_bytes(cfg, data);
  double have = 0, need = one.total() * local_ranks;
  // Shared weights: one copy of the weights and optimizer state, the two sum buffers, and per
  // replica its gradients and activations.
  const bool shared = shares_weights(cfg, place);
  const double common = one.params + one.grads;  // one.params counts one gradient buffer
  if (shared) need = common + (one.grads + one.activations) * local_ranks;
  std::string where = "this machine has";
  if (place.backend == Backend::cuda) {
    // The GPU holding the most replicas (colocated ones share it), each with its copy of the
    // training set.
    std::map<int, int> on;
    for (int g : place.gpu_of_replica) ++on[g];
    const auto busiest = std::max_element(
        on.begin(), on.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    const int gpu = busiest == on.end() ? 0 : busiest->first;
    const int count = busiest == on.end() ? 1 : busiest->second;
    const GpuSystem sys = query_gpus();
    if (gpu < static_cast<int>(sys.gpus.size()))
      have = static_cast<double>(sys.gpus[static_cast<size_t>(gpu)].memory_bytes);
    // Features and labels, 4 bytes each (the host's copy is in memory already: the data set
    // was refused at its load where it would not fit, see check_synthetic_fits).
    const double train_set =
        4.0 * (static_cast<double>(data.train.x.size()) + static_cast<double>(data.train.size()));
    need = shared ? common + (one.grads + one.activations + train_set) * count
                  : (one.total() + train_set) * count;
    where = fmt::format("GPU {} has", gpu);
  } else {
    have = available_host_memory();
    need += one.input * local_ranks;
  }
  if (place.backend == Backend::cuda && one.input > 0) check_input_memory(cfg, one, local_ranks);
  if (have <= 0 || need <= have) return;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const std::string split =
      shared ? fmt::format("{:.1f} GiB of shared weights and optimizer state + {} replicas x "
                           "({:.1f} GiB of gradients + {:.1f} GiB of activations for {} rows)",
                           common / kGiB, local_ranks, one.grads / kGiB, one.activations / kGiB,
                           one.rows)
             : fmt::format("{} replica{} x ({:.1f} GiB of parameters, gradients and optimizer "
                           "state + {:.1f} GiB of activations for {} rows)",
                           local_ranks, local_ranks == 1 ? "" : "s", one.params / kGiB,
                           one.activations / kGiB, one.rows);
  const std::string input =
      one.input > 0 && place.backend != Backend::cuda
          ? fmt::format(" + {} x {:.1f} GiB of decoded image batches at data.prefetch {}",
                        local_ranks, one.input / kGiB, cfg.data.prefetch)
          : "";
  const char* model_keys =
      cfg.model.type == ModelType::gpt      ? "model.n_embd, model.n_layer, data.block_size"
      : cfg.model.type == ModelType::resnet ? "model.widths, model.depth"
                                            : "model.hidden (or the layers' units and channels)";
  throw UserError(fmt::format(
      "model and batch need about {:.1f} GiB ({}{}), but {} {:.1f} GiB available; lower {}{}, "
      "train.per_replica_batch (train.accumulation_steps keeps the batch a step trains on) or "
      "train.eval_batch",
      need / kGiB, split, input, where, have / kGiB, model_keys,
      input.empty() ? "" : ", data.prefetch"));
}

// Collective: under a launcher every process loads the data itself, and a node whose files
// differ would train its replica on other samples without a word (and its run could never
// resume: the checkpoint keeps rank 0's fingerprint). Every rank refuses alike.
void check_same_data(Communicator& comm, uint64_t fingerprint) {
  const uint64_t first = broadcast_word(comm, fingerprint);
  const int others = count_ranks(comm, fingerprint != first);
  if (others == 0) return;
  const std::string mine =
      fingerprint != first ? fmt::format("; this rank's is {:016x}", fingerprint) : "";
  throw UserError(fmt::format(
      "data: {} of {} ranks loaded other data than rank 0 (its fingerprint {:016x}{}); every "
      "rank must read the same files: check data.path on every node",
      others, comm.size(), first, mine));
}

}  // namespace

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
  const auto& shape = data.train.shape;
  if (cfg.data.augment.padding_mode == PaddingMode::reflect && shape.size() == 3 &&
      cfg.data.augment.crop_padding >= std::min(shape[1], shape[2]))
    throw UserError(fmt::format("data.augment.crop_padding: reflect padding needs it below the "
                                "image's height and width ({} x {}), got {}",
                                shape[1], shape[2], cfg.data.augment.crop_padding));
  const int local_ranks = local_replica_count(cfg);
  const Placement place = place_replicas(cfg, local_ranks);
  if (place.backend == Backend::cuda) check_gpu_sizes(cfg, data);
  if (place.backend != Backend::cuda && cfg.precision == Precision::tf32)
    throw UserError(
        "precision: tf32 needs a GPU, and this run is on the CPU (fp32, or bf16 emulated)");
  // One replica holds one copy of the weights whatever `replicas` says (shares_weights).
  if (cfg.replicas == ReplicaMode::shared && cfg.gpus > 1 && place.backend == Backend::cuda &&
      !(place.colocated && on_one_gpu(place)))
    throw UserError(fmt::format(
        "replicas: shared on GPUs needs colocate: true and every replica on one GPU (one index "
        "in devices); this run has {}; use replicas: auto or threads, or colocate: true",
        place.describe()));
  if (cfg.replicas == ReplicaMode::shared && mpi::detect().active)
    throw UserError(
        "replicas: shared keeps every replica in one process, but this run was started by a "
        "launcher (one replica per process); use replicas: auto or threads");
  check_memory(cfg, data, place, local_ranks);  // builds every layer's shape first
  const int classes = data.train.classes;
  for (const auto* d : {&data.train, &data.test})
    for (auto y : d->y)
      if (y < 0 || y >= classes)
        throw UserError(fmt::format("data: label {} outside [0, {})", y, classes));
}

TrainResult train_rank(const Config& cfg, const DataSplit& data, Communicator& comm,
                       TrainObserver* observer, const Checkpoint* resume) {
  // Before anything a rank can refuse alone: every rank the same data (the command compared
  // their configs when it planned the runs).
  if (comm.size() == cfg.gpus) check_same_data(comm, data.fingerprint);
  check_plan(cfg, data);
  gpu_memory().reset_peaks();  // summary.json's peak_device_mib is this run's
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
  RunContext sh{cfg, data, comm.rank() == 0 ? observer : nullptr, {}};
  sh.resume = resume;
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
        fmt::format("cpu: {} replicas as processes ({}), {} thread{} each, {}", comm.size(),
                    comm.kind(), threads, threads == 1 ? "" : "s", cpu_libraries(sh.cpu));
  }
  sh.result.info.devices += launch_description(comm.size());
  sh.devices = device_sampler(cfg, comm.rank(),
                              sh.place.backend == Backend::cuda ? sh.place.gpu_of_replica
                                                                : std::vector<int>{},
                              resume);
  sh.devices_rank = comm.rank();
  sh.devices_gather = comm.size() > 1;
  sh.one_process = comm.size() == 1;
  sh.result.info.replica_mode = comm.size() == 1 ? "one replica" : "processes";
  sh.result.info.placement = mpi::placement();
  sh.result.info.blas = blas_description();  // also for a run that fails before its first step
  try {
    run_replica(sh, comm);
  } catch (...) {
    // The worker has unwound (its device and graphs are gone): abort rather than destroy the
    // communicator, whose peers may never finish the collectives it still has queued.
    if (sh.nccl) sh.nccl->abort();
    throw;
  }
  sh.result.info.peak_device_mib = device_peaks_mib();
  return std::move(sh.result);
}

namespace {
// Starts ranks 1..n-1 on threads of their own. When one cannot start (ulimit -u, or -v reached
// by the threads' stacks), `stop` makes the ranks started leave their first collective, they
// are joined, and the run fails saying why instead of ending the process.
// DTRAIN_FAULT=thread:R (a test facility) fails the start of rank R's thread as a limit would.
template <class Run, class Stop>
std::vector<std::thread> start_rank_threads(int n, const Run& run_rank, const Stop& stop) {
  const char* fault = std::getenv("DTRAIN_FAULT");
  int fault_rank = -1;
  if (fault && std::sscanf(fault, "thread:%d", &fault_rank) != 1) fault_rank = -1;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n));  // no reallocation while threads run
  try {
    for (int r = 1; r < n; ++r) {
      if (r == fault_rank)
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
      pool.emplace_back(run_rank, r);
    }
  } catch (const std::exception& e) {  // system_error, or bad_alloc for a thread's state
    stop();
    for (auto& t : pool) t.join();
    DTRAIN_THROW_SYSTEM(fmt::format(
        "cannot start the thread of rank {} of {} replicas ({}); a limit on threads or memory "
        "(ulimit -u, ulimit -v) is below what {} replica threads need: fewer replicas, or "
        "replicas: shared, which runs them in turn on `threads` threads",
        pool.size() + 1, n, e.what(), n));
  }
  return pool;
}
}  // namespace

TrainResult train(const Config& cfg, const DataSplit& data, TrainObserver* observer,
                  const Checkpoint* resume) {
  check_plan(cfg, data);
  gpu_memory().reset_peaks();  // summary.json's peak_device_mib is this run's
  const int threads = resolve_threads(cfg);
  const int per_replica = std::max(1, threads / cfg.gpus);

  RunContext sh{cfg, data, observer, {}};
  sh.resume = resume;
  sh.cpu = cpu_options(per_replica, cfg.precision);
  sh.place = place_replicas(cfg, cfg.gpus);
  // Colocated replicas share a GPU, which NCCL (before 2.30) does not allow: with a copy of the
  // weights each (replicas: threads, or spread over GPUs) their gradients go through the host
  // (copied there bucket by bucket and reduced by the in-process communicator, so with the
  // CPU's arithmetic); on one GPU they share one copy by default (shares_weights).
  if (sh.place.backend == Backend::cuda && !sh.place.colocated) {
    sh.nccl = NcclGroup::local(sh.place.gpu_of_replica);
    sh.gpus_in_process = cfg.gpus;  // one GPU per replica
  }
  if (shares_weights(cfg, sh.place)) sh.shared = make_shared_weights(sh);
  // More replicas sharing weights than threads: they take turns on one worker thread per
  // core (fibers), each replica's kernels on one thread as they would be as threads.
  const bool in_turn = sh.shared && sh.place.backend == Backend::cpu && cfg.gpus > threads;
  sh.result.info.replica_mode =
      cfg.gpus == 1 ? "one replica" : sh.shared ? "shared" : "threads";
  sh.result.info.devices = in_process_devices(sh, per_replica, in_turn ? threads : 0);
  sh.devices = device_sampler(cfg, 0,
                              sh.place.backend == Backend::cuda ? sh.place.gpu_of_replica
                                                                : std::vector<int>{},
                              resume);
  sh.replica_threads = !in_turn;
  sh.one_thread = in_turn && threads == 1;
  sh.result.info.blas = blas_description();  // also for a run that fails before its first step
  InProcessGroup group(cfg.gpus);
  std::mutex err_mu;
  std::exception_ptr first_error, interrupted;
  auto run_rank = [&](int rank) {
    try {
      auto comm = group.communicator(rank);
      run_replica(sh, *comm);
    } catch (const Interrupted&) {
      // Every rank stops at the same step, after the checkpoint: nothing to release. Reported
      // only if nothing failed (rank 0's checkpoint write may have).
      std::lock_guard lk(err_mu);
      if (!interrupted) interrupted = std::current_exception();
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
  if (in_turn) {
    fibers::run(cfg.gpus, threads, run_rank);
  } else {
    std::vector<std::thread> pool = start_rank_threads(cfg.gpus, run_rank, [&] {
      group.abort("a replica's thread could not be started");
      if (sh.nccl) sh.nccl->abort();
    });
    run_rank(0);
    for (auto& t : pool) t.join();
  }
  if (first_error) std::rethrow_exception(first_error);
  if (interrupted) std::rethrow_exception(interrupted);
  sh.result.info.peak_device_mib = device_peaks_mib();
  return std::move(sh.result);
}

}  // namespace dtrain
