// dtrain devices: the GPUs this machine offers the CUDA backend, with library versions.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "commands.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/base/json.hpp"

namespace dtrain::cli {

void setup_devices(CLI::App& app, DevicesOptions& opt) {
  app.add_flag("--json", opt.json, "Print one JSON object instead of a table");
  app.add_flag("--measure", opt.measure,
               "Also measure each GPU's kernel launch latency and cuBLAS SGEMM throughput "
               "(FP32, TF32): the floors a training step is compared with");
}

int run_devices(const DevicesOptions& opt) {
  const GpuSystem s = query_gpus();
  std::vector<GpuFloors> floors;
  if (opt.measure)
    for (const auto& g : s.gpus) floors.push_back(measure_gpu(g.index));
  const unsigned cores = std::thread::hardware_concurrency();
  // What a run started now would use: DTRAIN_CPU_CONV, _GEMM and _FUSE where set (a value
  // they refuse is the command's error, as it would be a run's).
  const CpuConv conv = cpu_conv_from_env();
  const std::string cpu_conv = to_string(conv);
  const bool winograd = winograd_available(conv);
  const std::string cpu_gemm = to_string(cpu_gemm_from_env());
  const bool fuse = cpu_fuse_from_env();
  if (opt.json) {
    nlohmann::json gpus = nlohmann::json::array();
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      const auto& g = s.gpus[i];
      nlohmann::json e = {{"index", g.index},
                          {"name", g.name},
                          {"memory_bytes", g.memory_bytes},
                          {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                          {"sms", g.sm_count}};
      if (i < floors.size()) {
        e["launch_us"] = floors[i].launch_us;
        e["sgemm_fp32_tflops"] = floors[i].sgemm_fp32_tflops;
        e["sgemm_tf32_tflops"] = floors[i].sgemm_tf32_tflops;
      }
      gpus.push_back(e);
    }
    const nlohmann::json j = {{"cpu",
                               {{"threads", cores},
                                {"blas", blas_description()},
                                {"conv", cpu_conv},
                                {"conv_winograd", winograd},
                                {"gemm", cpu_gemm},
                                {"fuse", fuse}}},
                              {"cuda_built", s.built_with_cuda},
                              {"driver", s.driver},
                              {"cuda_runtime", s.runtime},
                              {"cudnn", s.cudnn},
                              {"nccl", s.nccl},
                              {"gpus", gpus},
                              {"no_gpu_reason", s.gpus.empty() ? s.none_reason : ""}};
    fmt::print("{}\n", json_text(j));
    return 0;
  }
  const char* how = conv != CpuConv::onednn ? ""
                    : winograd              ? " (Winograd's where they suit)"
                                            : " (direct: no Winograd kernels for this CPU)";
  fmt::print("cpu: {} hardware threads, {}, convolutions by {}{}, matrix products by {}{}\n", cores,
             blas_description(), cpu_conv, how, cpu_gemm,
             fuse ? "" : ", BatchNorm's passes unfused (DTRAIN_CPU_FUSE=off)");
  if (!s.built_with_cuda) {
    fmt::print("cuda: no GPU: {}\n", s.none_reason);
    return 0;
  }
  fmt::print("cuda: driver {}, runtime {} (built against), cuDNN {}, NCCL {}\n", s.driver,
             s.runtime, s.cudnn, s.nccl);
  if (s.gpus.empty()) {
    fmt::print("no GPU: {}; backend: auto runs on the CPU\n", s.none_reason);
    return 0;
  }
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    const auto& g = s.gpus[i];
    fmt::print("gpu {}: {}, {:.1f} GiB, compute capability {}.{}, {} SMs\n", g.index, g.name,
               static_cast<double>(g.memory_bytes) / (1024.0 * 1024 * 1024), g.cc_major, g.cc_minor,
               g.sm_count);
    if (i < floors.size())
      fmt::print(
          "  measured: launch latency {:.2f} us, cuBLAS SGEMM {:.1f} TFLOP/s fp32, {:.1f} "
          "TFLOP/s tf32\n",
          floors[i].launch_us, floors[i].sgemm_fp32_tflops, floors[i].sgemm_tf32_tflops);
  }
  return 0;
}

}  // namespace dtrain::cli
