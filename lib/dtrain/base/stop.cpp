#include "dtrain/base/stop.hpp"

#include <atomic>

namespace dtrain {

namespace {
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
}  // namespace

void request_stop() {
  g_stop.store(true, std::memory_order_relaxed);
}
bool stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}

}  // namespace dtrain
