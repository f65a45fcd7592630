#include "dtrain/base/stop.hpp"

#include <atomic>

namespace dtrain {

namespace {
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
static_assert(std::atomic<int>::is_always_lock_free, "request_stop must be async-signal-safe");
}  // namespace

void request_stop(int signal) {
  if (signal > 0) g_signal.store(signal, std::memory_order_relaxed);
  g_stop.store(true, std::memory_order_relaxed);
}
int stop_exit_code() {
  const int s = g_signal.load(std::memory_order_relaxed);
  return 128 + (s > 0 ? s : 2);
}
bool stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}

}  // namespace dtrain
