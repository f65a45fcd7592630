#pragma once
// NVML, the NVIDIA Management Library, loaded at run time from the driver's libnvidia-ml.so.1,
// so that a machine without an NVIDIA driver gets a note, never a failure, and a build needs no
// NVML header (the CUDA toolkit on this project's machines ships none). The few functions and
// structures read are declared in nvml.cpp after NVML's API reference (nvml.h of CUDA 12 and
// 13: nvmlUtilization_t, nvmlMemory_t, nvmlFieldValue_t); a [cuda] test reads them on a GPU.
#include <memory>
#include <string>

namespace dtrain {

// One reading of a GPU; NaN where NVML has no value (a counter the GPU lacks, NVLink on a GPU
// without it).
struct GpuReading {
  double util_pct;      // share of the last sample period with a kernel running (NVML's "gpu")
  double mem_util_pct;  // share of it with device memory read or written
  double mem_used_bytes, mem_total_bytes;
  double power_w;
  double sm_clock_mhz, mem_clock_mhz;
  double temp_c;
  double pcie_tx_Bps, pcie_rx_Bps;          // NVML's PCIe throughput over its last 20 ms
  double nvlink_tx_bytes, nvlink_rx_bytes;  // data counters summed over the links, since boot
};

class Nvml {
 public:
  // NVML loaded and initialised; nullptr where it cannot be, with the reason in `why`.
  static std::shared_ptr<Nvml> open(std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The GPU at a PCI bus id as CUDA gives it ("0000:3B:00.0"); nullptr where NVML has none.
  void* device(const std::string& pci_bus_id) const;
  GpuReading read(void* device) const;

  struct Api;  // the functions, looked up in the library

 private:
  Nvml(void* lib, std::unique_ptr<Api> api);
  void* lib_;
  std::unique_ptr<Api> api_;
};

}  // namespace dtrain
