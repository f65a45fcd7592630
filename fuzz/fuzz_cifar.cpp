// libFuzzer target: the CIFAR-10 and CIFAR-100 record parser on the bytes of one file. Any
// outcome but data or a UserError is a bug, and so is data that does not match the records
// read (3072 pixels a label, every value in [0, 1], every label within the format's classes).
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtrain/base/error.hpp"
#include "dtrain/data/cifar.hpp"
#include "dtrain/data/data.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (auto kind : {dtrain::DatasetKind::cifar10, dtrain::DatasetKind::cifar100}) {
    const auto& f = dtrain::cifar_format(kind);
    dtrain::Dataset d;
    try {
      dtrain::parse_cifar_records(bytes, f, "fuzz.bin", size % 7, d);  // a limit, sometimes 0
    } catch (const dtrain::UserError&) {
      continue;
    }
    if (d.x.size() != d.y.size() * 3072) __builtin_trap();
    for (float v : d.x)
      if (!(v >= 0.f && v <= 1.f)) __builtin_trap();
    for (int32_t y : d.y)
      if (y < 0 || y >= f.classes) __builtin_trap();
  }
  return 0;
}
