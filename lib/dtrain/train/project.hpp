#pragma once
// `dtrain project`: what a measured 1-replica step would become on n GPUs joined by a given
// link. A model, not a measurement: pure functions, no I/O.
//
// The exchange is the ring all-reduce of nccl-tests' model (doc/PERFORMANCE.md): on n GPUs a
// bucket of `bytes` takes
//     T(bytes) = 2(n-1) alpha + 2(n-1)/n * bytes / busbw
// (2(n-1) ring steps, each paying the latency alpha; each GPU sends and receives 2(n-1)/n of the
// buffer at the bus bandwidth busbw). Buckets are cut from the end of the flat gradient buffer
// towards its start, as dist/exchange.hpp cuts them, and backward is taken to produce gradients
// at a uniform rate from the end of the buffer, so bucket k is ready once backward has covered
// the buffer up to its start. Buckets share the one link: each starts when it is ready and the
// one before it has finished. What ends after backward is exposed; the rest hides under it.
//
// Per-replica batch fixed (weak scaling, as `gpus=N` runs it):
//     step(n)   = data + compute + exposed(n) + optimizer        (seconds per optimizer step)
//     epoch(n)  = steps_per_epoch(n) * step(n)
//     speedup   = throughput(n) / throughput(1) = n * step(1) / step(n)   (samples per second)
//     efficiency = speedup / n = step(1) / step(n)
// with steps_per_epoch(n) the 1-replica epoch cut into n-times larger global batches. Not
// modelled: stragglers, the forward of the next step overlapping the exchange, contention of
// the exchange with compute, hierarchical (tree, NVLink SHARP) all-reduces.
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

// A link between the GPUs, in the terms of the ring model above.
struct Link {
  std::string name;
  double alpha_s = 0;  // latency per ring step, seconds
  double busbw = 0;    // bus bandwidth, bytes per second (may be infinite: no bandwidth cost)
  std::string source;  // where the numbers come from
};

// nvlink-h100, pcie4, ib-ndr400 (see project.cpp for their sources); nullptr for another name.
const Link* find_link_preset(const std::string& name);
std::vector<std::string> link_preset_names();

// One optimizer step of the 1-replica run, in seconds.
struct StepSplit {
  double data_s = 0;       // gathering the batch
  double compute_s = 0;    // forward and backward of every micro-step
  double optimizer_s = 0;  // the update
};

// The gradient buckets of `n_params` float32 parameters at `bucket_mb` MiB each (0: one bucket),
// in bytes, in the order backward finishes them (the end of the buffer first).
std::vector<double> bucket_bytes(int64_t n_params, double bucket_mb);

// The ring all-reduce of one bucket, split into its latency and its bandwidth part.
struct RingCost {
  double latency_s = 0, bandwidth_s = 0;
  double total() const { return latency_s + bandwidth_s; }
};
RingCost ring_allreduce(double bytes, int n, const Link& link);

// The buckets of one step on the link, with backward lasting `backward_s` (starting at 0).
struct ExchangeTiming {
  double total_s = 0;    // sum of the buckets' all-reduce times
  double exposed_s = 0;  // how long the exchange runs on after backward has ended
  // The exposed time split in proportion to each bucket's latency and bandwidth parts.
  double exposed_latency_s = 0, exposed_bandwidth_s = 0;
};
ExchangeTiming simulate_exchange(const std::vector<double>& buckets, double backward_s, int n,
                                 const Link& link);

struct ProjectionInput {
  StepSplit split;                       // the 1-replica step
  std::vector<double> buckets;           // bucket_bytes(...)
  double backward_fraction = 2.0 / 3.0;  // share of compute that is backward
  int accumulation_steps = 1;     // micro-steps per step: only the last one's backward overlaps
  int64_t samples_per_epoch = 0;  // samples one epoch trains on at 1 replica
  int64_t global_batch = 0;       // at 1 replica
  bool drop_remainder = true;     // the short last batch is dropped (data.drop_remainder)
};

// The term that bounds the step: compute when the exposed exchange is under 10% of the step,
// else latency when the exposed exchange's latency part is larger than its bandwidth part, else
// bandwidth.
enum class Bound { compute, latency, bandwidth };
std::string to_string(Bound b);

struct ProjectionRow {
  int gpus = 1;
  double step_s = 0;
  double exchange_s = 0;  // the whole all-reduce of a step (hidden or not)
  ExchangeTiming exchange;
  double exposed_share = 0;     // exposed / step
  int64_t steps_per_epoch = 0;  // 0: the global batch is larger than the epoch
  double epoch_s = 0;           // NaN when steps_per_epoch is 0
  double speedup = 0, efficiency = 0;
  Bound bound = Bound::compute;
};

// ---- A step estimated for a GPU the user does not have (`dtrain project CONFIG --gpu G`)

// A GPU an estimate can assume: the name its driver reports (documented_peak reads the dense
// peaks from it) and its memory bandwidth, both from NVIDIA's datasheets.
struct GpuPreset {
  std::string name;         // h100-sxm, h100-pcie, h200, a100, l40s
  std::string driver_name;  // e.g. "NVIDIA H100 80GB HBM3"
  double memory_Bps = 0;    // bytes per second
  std::string memory_source;
  double memory_bytes = 0;  // its memory, as the datasheet gives it (GB: 10^9 bytes)
};
const GpuPreset* find_gpu_preset(const std::string& name);
std::vector<std::string> gpu_preset_names();

// One optimizer step of one replica from the shape engine's FLOPs instead of a run:
//     compute   = (forward + backward FLOPs per sample) x samples per step / (peak x mfu)
//     optimizer = parameters x bytes each update reads and writes / memory bandwidth
//     data      = 0 (the input pipeline is taken to keep up)
// The update streams fp32 parameters, gradients and state: 12 bytes per parameter for plain
// SGD (read both, write the parameter), 20 with momentum, 28 for Adam and AdamW (two moments).
struct StepEstimateInput {
  double flops_per_sample = 0;  // forward + backward
  int64_t samples_per_step = 0;  // per-replica batch x accumulation steps
  double peak_flops = 0;        // FLOP/s at the run's precision
  double mfu = 0.4;             // the share of the peak the step reaches (an assumption)
  int64_t params = 0;
  double optimizer_bytes_per_param = 28;
  double memory_Bps = 0;
};
StepSplit estimate_step(const StepEstimateInput& in);

int64_t steps_per_epoch(const ProjectionInput& in, int n);
ProjectionRow project_step(const ProjectionInput& in, int n, const Link& link);
std::vector<ProjectionRow> project(const ProjectionInput& in, const std::vector<int>& gpus,
                                   const Link& link);

}  // namespace dtrain
