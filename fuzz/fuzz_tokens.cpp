// libFuzzer target: the llm.c token shard reader (dataset: tokens), through a file as `dtrain
// run` reads it. Any outcome but tokens or a UserError is a bug, and so are tokens that do not
// match the header (as many as it claims, every one below the vocabulary) and memory beyond
// the input's real content (run with -rss_limit_mb to catch a header that makes the reader
// allocate its claim).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/data/text.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // In memory where possible: the file is rewritten for every input.
  static const std::string path =
      (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + std::string("/dtrain-fuzz-tokens-") +
      std::to_string(::getpid());
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  int64_t count = -1;
  try {
    count = dtrain::shard_tokens(path);
    if (count <= 0 || dtrain::kShardHeaderBytes + 2 * count != static_cast<int64_t>(size))
      __builtin_trap();
  } catch (const dtrain::UserError&) {
  }
  // GPT-2's vocabulary, and a small one that the input's size picks (2 to 257).
  for (const int64_t vocab : {int64_t{50257}, static_cast<int64_t>(2 + size % 256)}) {
    std::vector<uint16_t> out = {7};  // appended to: what was there stays
    try {
      dtrain::read_shard(path, vocab, out);
    } catch (const dtrain::UserError&) {
      continue;
    }
    if (count < 0 || out.size() != static_cast<size_t>(count) + 1 || out[0] != 7) __builtin_trap();
    for (size_t i = 1; i < out.size(); ++i)
      if (out[i] >= vocab) __builtin_trap();
  }
  return 0;
}
