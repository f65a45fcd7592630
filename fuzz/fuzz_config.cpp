// libFuzzer target: the config path, YAML text plus command-line overrides, as `dtrain run`
// reads them. Input: YAML, then optionally a NUL byte and one `key=value` override per line.
// Any outcome but a Config or a UserError is a bug (a crash, a leak of another exception type,
// a sanitizer report), and so is a resolved config that does not read back to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    dtrain::log().set_level(spdlog::level::off);  // a warning per input would slow the search
    return true;
  }();
  (void)quiet;
  const std::string in(reinterpret_cast<const char*>(data), size);
  const auto nul = in.find('\0');
  const std::string yaml = in.substr(0, nul);
  std::vector<dtrain::Override> overrides;
  try {
    if (nul != std::string::npos) {
      size_t pos = nul + 1;
      while (pos <= in.size()) {
        const auto end = std::min(in.find('\n', pos), in.size());
        if (end > pos) overrides.push_back(dtrain::parse_override(in.substr(pos, end - pos)));
        pos = end + 1;
      }
    }
    const dtrain::Config c = dtrain::parse_config(yaml, "fuzz.yaml", overrides);
    const std::string once = dtrain::to_yaml(c);
    const std::string twice = dtrain::to_yaml(dtrain::parse_config(once, "resolved.yaml"));
    if (once != twice) std::abort();  // the resolved config must read back to itself
  } catch (const dtrain::UserError&) {
  }
  return 0;
}
