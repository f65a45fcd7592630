#include "dtrain/train/project.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain {

namespace {

// Presets. GB = 1e9 bytes. Their latencies are assumptions of the right order, not
// measurements; `dtrain bench-comm` and `--link measured:FILE` replace them with numbers of a
// real link.
const std::vector<Link>& presets() {
  static const std::vector<Link> links = {
      // NVLink4 gives each H100 450 GB/s per direction. An NCCL maintainer (NVIDIA/nccl-tests
      // issue #212) puts 8-GPU all-reduce busbw at ~370 GB/s for a plain ring and ~480 GB/s
      // peak with NVLink SHARP; issue #272 shows 475 GB/s peak on 8 H200 over NVLink4.
      // 450 GB/s is taken as the round figure of that range; alpha is an assumption.
      {"nvlink-h100", 5e-6, 450e9,
       "NVLink4 line rate, ~370-480 GB/s all-reduce busbw on 8 GPUs (NVIDIA/nccl-tests issues "
       "#212, #272); alpha assumed"},
      // Assumption: PCIe 4.0 x16 carries 31.5 GB/s per direction (16 GT/s x 16 lanes,
      // 128b/130b); GPU-to-GPU rings through the host bridge reach about two thirds of it.
      {"pcie4", 10e-6, 20e9, "assumption: about 2/3 of PCIe 4.0 x16's 31.5 GB/s; alpha assumed"},
      // Between machines, one 400 Gb/s NDR InfiniBand NIC per GPU: 50 GB/s line rate, of which
      // rings reach ~90% (nccl-tests issue #119: 8 A100 with 4x HDR 200G, busbw 85-96 of the
      // 100 GB/s line rate). Inter-node latency assumed.
      {"ib-ndr400", 10e-6, 45e9,
       "assumption: ~90% of one 400 Gb/s NIC per GPU (cf. NVIDIA/nccl-tests issue #119); "
       "alpha assumed"},
  };
  return links;
}

}  // namespace

const Link* find_link_preset(const std::string& name) {
  for (const auto& l : presets())
    if (l.name == name) return &l;
  return nullptr;
}

std::vector<std::string> link_preset_names() {
  std::vector<std::string> names;
  for (const auto& l : presets()) names.push_back(l.name);
  return names;
}

namespace {

// Memory bandwidths and sizes from NVIDIA's datasheets (the dense peaks are documented_peak's).
const std::vector<GpuPreset>& gpu_presets() {
  static const std::vector<GpuPreset> gpus = {
      {"h100-sxm", "NVIDIA H100 80GB HBM3", 3.35e12,
       "3.35 TB/s, NVIDIA H100 Tensor Core GPU datasheet (SXM)", 80e9},
      {"h100-pcie", "NVIDIA H100 PCIe", 2.0e12,
       "2 TB/s, NVIDIA H100 Tensor Core GPU datasheet (PCIe)", 80e9},
      {"h200", "NVIDIA H200", 4.8e12, "4.8 TB/s, NVIDIA H200 Tensor Core GPU datasheet (SXM)",
       141e9},
      {"a100", "NVIDIA A100-SXM4-80GB", 2.039e12,
       "2,039 GB/s, NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)", 80e9},
      {"l40s", "NVIDIA L40S", 864e9, "864 GB/s, NVIDIA L40S datasheet", 48e9},
  };
  return gpus;
}

}  // namespace

const GpuPreset* find_gpu_preset(const std::string& name) {
  for (const auto& g : gpu_presets())
    if (g.name == name) return &g;
  return nullptr;
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& g : gpu_presets()) names.push_back(g.name);
  return names;
}

StepSplit estimate_step(const StepEstimateInput& in) {
  StepSplit s;
  s.compute_s = in.flops_per_sample * static_cast<double>(in.samples_per_step) /
                (in.peak_flops * in.mfu);
  s.optimizer_s = static_cast<double>(in.params) * in.optimizer_bytes_per_param / in.memory_Bps;
  return s;
}

std::vector<double> bucket_bytes(int64_t n_params, double bucket_mb) {
  // The same cut as GradExchange: whole float32 elements, from the end of the buffer.
  const auto n = static_cast<size_t>(std::max<int64_t>(n_params, 0));
  const auto elems = static_cast<size_t>(bucket_mb * 1024 * 1024 / sizeof(float));
  const size_t b = elems == 0 ? std::max<size_t>(n, 1) : elems;
  std::vector<double> out;
  for (size_t end = n; end > 0; end -= std::min(end, b))
    out.push_back(static_cast<double>(std::min(end, b) * sizeof(float)));
  return out;
}

RingCost ring_allreduce(double bytes, int n, const Link& link) {
  if (n <= 1 || bytes <= 0) return {};
  const double steps = 2.0 * (n - 1);
  return {steps * link.alpha_s, steps / n * bytes / link.busbw};
}

ExchangeTiming simulate_exchange(const std::vector<double>& buckets, double backward_s, int n,
                                 const Link& link) {
  ExchangeTiming t;
  if (n <= 1) return t;  // one replica exchanges nothing
  double total_bytes = 0;
  for (double b : buckets) total_bytes += b;
  double covered = 0, link_free = 0;
  for (double b : buckets) {
    covered += b;
    // The fraction first: the last bucket is then ready at backward_s exactly (x * y / y need
    // not be x).
    const double ready = total_bytes > 0 ? backward_s * (covered / total_bytes) : backward_s;
    const RingCost c = ring_allreduce(b, n, link);
    const double start = std::max(ready, link_free);
    link_free = start + c.total();
    t.total_s += c.total();
    // The part of this bucket's all-reduce after backward has ended. Every bucket is ready by
    // then, so the link stays busy from there on and these parts add up to the exposed time.
    const double after = link_free - std::max(start, backward_s);
    if (after > 0 && c.total() > 0) {
      t.exposed_latency_s += after * c.latency_s / c.total();
      t.exposed_bandwidth_s += after * c.bandwidth_s / c.total();
    }
  }
  t.exposed_s = std::max(0.0, link_free - backward_s);
  return t;
}

std::string to_string(Bound b) {
  switch (b) {
    case Bound::compute:
      return "compute";
    case Bound::latency:
      return "latency";
    case Bound::bandwidth:
      return "bandwidth";
  }
  return "?";
}

int64_t steps_per_epoch(const ProjectionInput& in, int n) {
  // The 1-replica epoch cut into global batches n times as large; with the remainder dropped
  // this is floor(floor(D / B) / n) = floor(D / (n B)), as a run at n replicas would count.
  const int64_t batch = in.global_batch * n;
  if (batch <= 0) return 0;
  return in.drop_remainder ? in.samples_per_epoch / batch
                           : (in.samples_per_epoch + batch - 1) / batch;
}

ProjectionRow project_step(const ProjectionInput& in, int n, const Link& link) {
  const StepSplit& s = in.split;
  const double base = s.data_s + s.compute_s + s.optimizer_s;  // step(1): nothing to exchange
  const double backward = in.backward_fraction * s.compute_s / std::max(in.accumulation_steps, 1);
  ProjectionRow r;
  r.gpus = n;
  r.exchange = simulate_exchange(in.buckets, backward, n, link);
  r.exchange_s = r.exchange.total_s;
  r.step_s = base + r.exchange.exposed_s;
  r.exposed_share = r.step_s > 0 ? r.exchange.exposed_s / r.step_s : 0;
  r.steps_per_epoch = steps_per_epoch(in, n);
  r.epoch_s = r.steps_per_epoch > 0 ? static_cast<double>(r.steps_per_epoch) * r.step_s
                                    : std::numeric_limits<double>::quiet_NaN();
  r.efficiency = r.step_s > 0 ? base / r.step_s : 1;
  r.speedup = n * r.efficiency;
  if (r.exposed_share < 0.10)
    r.bound = Bound::compute;
  else if (r.exchange.exposed_latency_s > r.exchange.exposed_bandwidth_s)
    r.bound = Bound::latency;
  else
    r.bound = Bound::bandwidth;
  return r;
}

std::vector<ProjectionRow> project(const ProjectionInput& in, const std::vector<int>& gpus,
                                   const Link& link) {
  std::vector<ProjectionRow> rows;
  for (int n : gpus) rows.push_back(project_step(in, n, link));
  return rows;
}

}  // namespace dtrain
