// libFuzzer target: the IDX reader (raw and gzip-compressed), through a file as `dtrain run`
// reads it. Any outcome but data or a UserError is a bug, and so is memory beyond the input's
// real content (run with -rss_limit_mb to catch a header that makes the reader allocate its
// claim).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "dtrain/data/data.hpp"
#include "dtrain/base/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // In memory where possible: the file is rewritten for every input.
  static const std::string path =
      (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + std::string("/dtrain-fuzz-idx-") +
      std::to_string(::getpid());
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    const auto img = dtrain::read_idx_images(path);
    if (static_cast<size_t>(img.count * img.rows * img.cols) != img.pixels.size()) __builtin_trap();
  } catch (const dtrain::UserError&) {
  }
  try {
    (void)dtrain::read_idx_labels(path);
  } catch (const dtrain::UserError&) {
  }
  return 0;
}
