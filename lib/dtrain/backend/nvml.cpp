#include "dtrain/backend/nvml.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <limits>

namespace dtrain {

namespace {

// NVML's types, after its API reference (nvml.h). Only the members read are named.
using nvmlReturn = int;  // NVML_SUCCESS is 0
constexpr nvmlReturn kSuccess = 0;
using nvmlDevice = void*;
struct nvmlUtilization {
  unsigned int gpu, memory;
};
struct nvmlMemory {
  unsigned long long total, free, used;
};
union nvmlValue {
  double d;
  int si;
  unsigned int ui;
  unsigned long ul;
  unsigned long long ull;
  signed long long sll;
  unsigned short us;
};
struct nvmlFieldValue {
  unsigned int field_id, scope_id;
  long long timestamp, latency_usec;
  int value_type;
  nvmlReturn ret;
  nvmlValue value;
};
constexpr int kClockSm = 1, kClockMem = 2;                    // nvmlClockType_t
constexpr int kTemperatureGpu = 0;                            // nvmlTemperatureSensors_t
constexpr int kPcieTx = 0, kPcieRx = 1;                       // nvmlPcieUtilCounter_t (KB/s)
constexpr unsigned kNvlinkDataTx = 138, kNvlinkDataRx = 139;  // NVML_FI_..._THROUGHPUT_DATA, KiB

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

struct Nvml::Api {
  nvmlReturn (*init)();
  nvmlReturn (*shutdown)();
  nvmlReturn (*by_pci)(const char*, nvmlDevice*);
  nvmlReturn (*utilization)(nvmlDevice, nvmlUtilization*);
  nvmlReturn (*memory)(nvmlDevice, nvmlMemory*);
  nvmlReturn (*power)(nvmlDevice, unsigned int*);
  nvmlReturn (*clock)(nvmlDevice, int, unsigned int*);
  nvmlReturn (*temperature)(nvmlDevice, int, unsigned int*);
  nvmlReturn (*pcie)(nvmlDevice, int, unsigned int*);
  nvmlReturn (*fields)(nvmlDevice, int, nvmlFieldValue*);
  const char* (*error_string)(nvmlReturn);
};

namespace {

// Looks up every function; false (and `missing` named) where the library lacks one.
bool bind(void* lib, Nvml::Api& a, std::string* missing) {
  const auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && missing->empty()) *missing = name;
  };
  get(a.init, "nvmlInit_v2");
  get(a.shutdown, "nvmlShutdown");
  get(a.by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
  get(a.utilization, "nvmlDeviceGetUtilizationRates");
  get(a.memory, "nvmlDeviceGetMemoryInfo");
  get(a.power, "nvmlDeviceGetPowerUsage");
  get(a.clock, "nvmlDeviceGetClockInfo");
  get(a.temperature, "nvmlDeviceGetTemperature");
  get(a.pcie, "nvmlDeviceGetPcieThroughput");
  get(a.fields, "nvmlDeviceGetFieldValues");
  get(a.error_string, "nvmlErrorString");
  return missing->empty();
}

}  // namespace

Nvml::Nvml(void* lib, std::unique_ptr<Api> api) : lib_(lib), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(lib_);
}

std::shared_ptr<Nvml> Nvml::open(std::string* why) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    *why = fmt::format("NVML cannot be loaded ({})", e ? e : "libnvidia-ml.so.1 not found");
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  if (!bind(lib, *api, &missing)) {
    *why = fmt::format(
        "libnvidia-ml.so.1 lacks {} (an NVIDIA driver older than dtrain "
        "reads; update the driver)",
        missing);
    dlclose(lib);
    return nullptr;
  }
  if (const nvmlReturn r = api->init(); r != kSuccess) {
    const char* e = api->error_string(r);
    *why = fmt::format("NVML did not start: {} (NVML error {})", e ? e : "unknown", r);
    dlclose(lib);
    return nullptr;
  }
  return std::shared_ptr<Nvml>(new Nvml(lib, std::move(api)));
}

void* Nvml::device(const std::string& pci_bus_id) const {
  nvmlDevice d = nullptr;
  return api_->by_pci(pci_bus_id.c_str(), &d) == kSuccess ? d : nullptr;
}

GpuReading Nvml::read(void* device) const {
  const Api& a = *api_;
  const auto uint_or_nan = [](nvmlReturn r, unsigned int v, double scale) {
    return r == kSuccess ? v * scale : kNaN;
  };
  GpuReading g{};
  nvmlUtilization u{};
  const nvmlReturn ru = a.utilization(device, &u);  // read below, after the call
  g.util_pct = uint_or_nan(ru, u.gpu, 1);
  g.mem_util_pct = uint_or_nan(ru, u.memory, 1);
  nvmlMemory m{};
  const bool mem = a.memory(device, &m) == kSuccess;
  g.mem_used_bytes = mem ? static_cast<double>(m.used) : kNaN;
  g.mem_total_bytes = mem ? static_cast<double>(m.total) : kNaN;
  // Each call before its value is read (an argument list would not order them).
  unsigned int v = 0;
  nvmlReturn r = a.power(device, &v);
  g.power_w = uint_or_nan(r, v, 1e-3);  // milliwatts
  r = a.clock(device, kClockSm, &v);
  g.sm_clock_mhz = uint_or_nan(r, v, 1);
  r = a.clock(device, kClockMem, &v);
  g.mem_clock_mhz = uint_or_nan(r, v, 1);
  r = a.temperature(device, kTemperatureGpu, &v);
  g.temp_c = uint_or_nan(r, v, 1);
  r = a.pcie(device, kPcieTx, &v);
  g.pcie_tx_Bps = uint_or_nan(r, v, 1e3);  // KB/s
  r = a.pcie(device, kPcieRx, &v);
  g.pcie_rx_Bps = uint_or_nan(r, v, 1e3);
  nvmlFieldValue f[2] = {};
  f[0].field_id = kNvlinkDataTx;
  f[1].field_id = kNvlinkDataRx;
  f[0].scope_id = f[1].scope_id = UINT_MAX;  // summed over every link
  const bool fields = a.fields(device, 2, f) == kSuccess;
  g.nvlink_tx_bytes =
      fields && f[0].ret == kSuccess ? 1024.0 * static_cast<double>(f[0].value.ull) : kNaN;
  g.nvlink_rx_bytes =
      fields && f[1].ret == kSuccess ? 1024.0 * static_cast<double>(f[1].value.ull) : kNaN;
  return g;
}

}  // namespace dtrain
