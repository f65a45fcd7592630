// What GPUs the machine has. Built with the CUDA toolkit's headers and runtime where CMake found
// them; otherwise every query says there are none, and why. Also the GPU code's parts that need
// no GPU: the choice among cuDNN's algorithms and the log's warnings.
#include "dtrain/backend/gpu.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"

#if DTRAIN_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>  // version only
#endif

namespace dtrain {

#if DTRAIN_HAVE_CUDA
namespace {
std::string version_string(int v, int major_div, int minor_div) {
  return fmt::format("{}.{}", v / major_div, (v % major_div) / minor_div);
}
}  // namespace
#endif

void GpuMemoryGauge::allocated(int gpu, const void* p, size_t bytes) {
  std::lock_guard lk(mu_);
  blocks_[p] = {gpu, bytes};
  Use& u = gpus_[gpu];
  u.live += bytes;
  u.peak = std::max(u.peak, u.live);
}

void GpuMemoryGauge::freed(const void* p) {
  std::lock_guard lk(mu_);
  const auto it = blocks_.find(p);
  if (it == blocks_.end()) return;
  gpus_[it->second.first].live -= it->second.second;
  blocks_.erase(it);
}

size_t GpuMemoryGauge::live(int gpu) const {
  std::lock_guard lk(mu_);
  const auto it = gpus_.find(gpu);
  return it == gpus_.end() ? 0 : it->second.live;
}

std::vector<GpuMemoryGauge::Peak> GpuMemoryGauge::peaks() const {
  std::lock_guard lk(mu_);
  std::vector<Peak> out;
  for (const auto& [gpu, u] : gpus_)
    if (u.peak > 0) out.push_back({gpu, u.peak});
  return out;
}

void GpuMemoryGauge::reset_peaks() {
  std::lock_guard lk(mu_);
  for (auto& [gpu, u] : gpus_) u.peak = u.live;
}

GpuMemoryGauge& gpu_memory() {
  static GpuMemoryGauge g;
  return g;
}

int pick_algorithm(const std::vector<AlgoOption>& best_first, bool* deterministic) {
  int first = -1;
  for (size_t i = 0; i < best_first.size(); ++i) {
    if (!best_first[i].supported) continue;
    if (best_first[i].deterministic) {
      *deterministic = true;
      return static_cast<int>(i);
    }
    if (first < 0) first = static_cast<int>(i);
  }
  *deterministic = false;
  return first;
}

void gpu_warn(const std::string& line) {
  log().warn("{}", line);
}

int narrow_int(int64_t v, const char* what, int rank) {
  if (v < 0 || v > INT_MAX)
    throw SystemError(fmt::format("rank {}: {} is {}, outside the int that cuBLAS and cuDNN take "
                                  "(0..{}); lower train.per_replica_batch, train.eval_batch or "
                                  "the layer's size",
                                  rank, what, v, INT_MAX),
                      __FILE__, __LINE__, rank);
  return static_cast<int>(v);
}

void check_gpu_tensor(const std::string& layer, int64_t rows, int64_t features) {
  if (rows <= 0 || features <= 0 || features <= INT_MAX / rows) return;
  throw UserError(fmt::format(
      "{}: {} rows x {} features is more than the {} values a GPU tensor can hold (cuBLAS and "
      "cuDNN count in int); lower train.per_replica_batch (or raise accumulation_steps), "
      "train.eval_batch or the layer's size",
      layer, rows, features, INT_MAX));
}

size_t graph_staging_bytes(int64_t rows, int64_t accumulation, int64_t values_per_micro,
                           int64_t values_per_step) {
  constexpr double kCap = 0x1p60;  // saturates: a plan this large fails at its allocation
  const auto n = [](int64_t v) { return static_cast<double>(std::max<int64_t>(v, 0)); };
  const double idx = n(rows) * 8 < kCap
                         ? static_cast<double>(graph_stage_span(static_cast<size_t>(rows) * 8))
                         : kCap;
  // Any scalar value: a kernels::Param of at most 16 bytes (math::AdamFactors has 12).
  const double value = static_cast<double>(graph_stage_span(16));
  const double bytes =
      n(accumulation) * (idx + n(values_per_micro) * value) + n(values_per_step) * value;
  return static_cast<size_t>(std::min(bytes, kCap));
}

void mean_of_sum(float* x, size_t n, int ranks) {
  const float inv = mean_factor(ranks);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

GraphMode GraphAgreement::follow(GraphMode mine, int rank) const {
  if (mine != GraphMode::eager) return mine;
  throw SystemError(fmt::format("rank {}: CUDA graphs: this rank dropped its graphs in the middle "
                                "of the schedule the ranks agreed on (device memory was freed "
                                "there), so its steps would no longer match the other ranks'; "
                                "train.cuda_graph: false runs without graphs",
                                rank),
                    __FILE__, __LINE__, rank);
}

bool cuda_built() {
  return DTRAIN_HAVE_CUDA != 0;
}

GpuSystem query_gpus() {
  GpuSystem s;
#if DTRAIN_HAVE_CUDA
  s.built_with_cuda = true;
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  s.runtime = version_string(rt, 1000, 10);
  const size_t dnn = cudnnGetVersion();  // e.g. 91900 for 9.19.0
  s.cudnn = fmt::format("{}.{}.{}", dnn / 10000, (dnn % 10000) / 100, dnn % 100);
  int nccl = 0;
  ncclGetVersion(&nccl);  // e.g. 22804 for 2.28.4
  s.nccl = fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  s.cublas = fmt::format("{}", static_cast<long>(cublasGetCudartVersion()));
  int drv = 0;
  if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) {
    s.driver = "none";
    s.none_reason = "no NVIDIA driver is loaded on this machine";
    return s;
  }
  s.driver = version_string(drv, 1000, 10);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    s.none_reason =
        fmt::format("the CUDA driver reports no usable GPU ({})", cudaGetErrorString(e));
    cudaGetLastError();  // clear the sticky error
    return s;
  }
  if (n == 0) s.none_reason = "the CUDA driver reports 0 GPUs";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    char bus[64] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) != cudaSuccess) bus[0] = '\0';
    s.gpus.push_back(
        {i, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount, bus});
  }
#else
  s.none_reason = "this dtrain was built without the CUDA toolkit";
  s.driver = "-";
#endif
  return s;
}

#if !DTRAIN_HAVE_CUDA
GpuFloors measure_gpu(int) {
  DTRAIN_THROW_SYSTEM("the CUDA backend is not available in this build");
}
std::unique_ptr<Device> make_cuda_device(int, int rank, Precision) {
  DTRAIN_THROW_SYSTEM(
      fmt::format("rank {}: the CUDA backend is not available in this build", rank));
}
#endif

}  // namespace dtrain

namespace dtrain {

DocumentedPeak documented_peak(const std::string& gpu_name, Precision precision) {
  // Dense TFLOP/s, fp32 / tf32 / bf16, from NVIDIA's datasheets (the tensor-core figures there
  // are quoted with sparsity: these are half of them).
  struct Row {
    const char* has;
    const char* lacks;  // a variant with other figures, left out
    double fp32, tf32, bf16;
    const char* sheet;
  };
  static const Row rows[] = {
      {"H200", "NVL", 67, 494.7, 989.4, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"},
      {"H100 PCIe", "", 51, 378, 756, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"},
      {"H100", "NVL", 67, 494.7, 989.4, "NVIDIA H100 Tensor Core GPU datasheet (SXM)"},
      {"A100", "", 19.5, 156, 312, "NVIDIA A100 Tensor Core GPU datasheet"},
      {"L40S", "", 91.6, 183, 362.05, "NVIDIA L40S datasheet"},
  };
  // A name's token: at its start or after a space, and at its end or before a space or '-'
  // ("A100" is not "RTX A1000", "H200" not "GH200").
  const auto has_token = [&](const std::string& t) {
    for (size_t at = gpu_name.find(t); at != std::string::npos; at = gpu_name.find(t, at + 1)) {
      const size_t end = at + t.size();
      if ((at == 0 || gpu_name[at - 1] == ' ') &&
          (end == gpu_name.size() || gpu_name[end] == ' ' || gpu_name[end] == '-'))
        return true;
    }
    return false;
  };
  for (const Row& r : rows) {
    if (!has_token(r.has)) continue;
    if (*r.lacks && has_token(r.lacks)) return {};
    const double t = precision == Precision::bf16   ? r.bf16
                     : precision == Precision::tf32 ? r.tf32
                                                    : r.fp32;
    return {t, fmt::format("{} {} dense peak, {}", r.has, to_string(precision), r.sheet)};
  }
  return {};
}

}  // namespace dtrain
