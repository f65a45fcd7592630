#pragma once
// The training loop and the in-process launcher: N replica workers (threads), each with its own
// device, model copy, optimizer and sampler shard, exchanging gradients through a Communicator.
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/train/run_types.hpp"

namespace dtrain {

// Runs the whole training, or continues it from `resume` (a checkpoint of the same config).
// Throws UserError for impossible configurations (checked before any worker starts),
// Interrupted when stopped on request, and otherwise rethrows the first worker failure after
// every worker has stopped.
TrainResult train(const Config& cfg, const DataSplit& data, TrainObserver* observer = nullptr,
                  const Checkpoint* resume = nullptr);

class Communicator;

// Runs this process's replica with an external communicator (one process per replica, e.g.
// MPI). The observer is used on rank 0 only.
TrainResult train_rank(const Config& cfg, const DataSplit& data, Communicator& comm,
                       TrainObserver* observer = nullptr, const Checkpoint* resume = nullptr);

// Checks that `cfg` can run on this data and machine (batch versus dataset size, backend and
// GPUs). Throws UserError.
void check_plan(const Config& cfg, const DataSplit& data);

// Where the replicas run: the CPU, or GPU indices per replica (several replicas share a GPU
// only with colocate: true). `local_ranks` is the number of replicas this process places
// (gpus in-process; under mpirun, the processes on this node). Throws UserError with the
// reason when the config asks for something this machine cannot do.
struct Placement {
  Backend backend = Backend::cpu;
  std::vector<int> gpu_of_replica;  // cuda only
  bool colocated = false;
  std::string describe() const;
};
Placement place_replicas(const Config& cfg, int local_ranks);

// Whether the replicas share one copy of the weights and optimizer state: more than one
// replica in one process (no launcher), and `replicas` is not `threads`; on GPUs every replica
// is also on the same GPU (colocated).
bool shares_weights(const Config& cfg, const Placement& place);

// What one replica allocates, estimated from the model's shapes before anything exists (the
// shape engine, model_size): weights, gradients and optimizer state; every layer's output for
// the most rows its buffers hold (a micro-batch or an evaluation chunk) and every layer's input
// gradient for a micro-batch; the batch buffers. `validate --print` shows it; a run whose
// replicas would not fit is refused with it.
struct ReplicaBytes {
  double params = 0;       // weights, gradients and optimizer state
  double grads = 0;        // of params: the gradient buffer alone
  double activations = 0;  // layer outputs, their gradients and the batch buffers
  int64_t rows = 0;        // the most rows the buffers hold
  double input = 0;        // host: the image pipeline's decoded batches (dataset: folder)
  double total() const { return params + activations; }
};
ReplicaBytes replica_bytes(const Config& cfg, const DataSplit& data);
// Of those, the fp32 weights, one gradient buffer and the optimizer's state (SGD's momentum;
// Adam's m and v) of `params` parameters: what no sharding reduces in dtrain.
double state_bytes(const OptimizerConfig& o, int64_t params);

// Decisions of the training loop, as pure functions (tested without a GPU).

// "on", or "off: <why>": whether a CUDA run captures its steps in graphs. `nccl`: gradients go
// through NCCL (not the host); `gpus_in_process`: GPUs this process drives (one per rank
// in-process, 1 under a launcher); `sync_batchnorm`: BatchNorm synchronised over more than one
// replica, which exchanges through the host inside the step.
// `shared`: colocated replicas sharing one copy of the weights (shares_weights).
std::string cuda_graph_state(bool requested, bool nccl, int gpus_in_process, bool sync_batchnorm,
                             bool shared = false);

// Whether a step is captured must be the same on every rank (NCCL's rule for captured
// collectives). From the ranks' proposals (how many proposed each mode): capture or replay
// where every rank proposed it, else eager (then every rank drops its graphs; see Device).
Device::GraphMode agree_graph_mode(int eager_votes, int capture_votes, int replay_votes);

// An epoch's split of the step time, as metrics.csv reports it.
struct PhaseSeconds {
  double compute = 0, exchange = 0, exchange_exposed = 0, optimizer = 0;
};
// `host`: measured by host clocks (exchange: the time inside the exchange's calls). `device`:
// [compute, exposed exchange, optimizer] from device events, or null where the device is not
// timed by events (the CPU). `exchange_device_s`: the exchange's own time on its stream, or
// negative where it has none. `exchange_on_host`: the exchange runs on the host (host copies and
// the host communicator), so the device idles while it runs. `optimizer_in_exchange`: of the
// host-timed optimizer time, what ran inside the exchange's calls (the update of shared weights,
// waited for in the exchange), which the events count as compute or exposed exchange.
PhaseSeconds split_phases(const PhaseSeconds& host, const double* device, double exchange_device_s,
                          bool exchange_on_host, double optimizer_in_exchange = 0);

}  // namespace dtrain
