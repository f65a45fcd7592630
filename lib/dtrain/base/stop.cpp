#include "dtrain/base/stop.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

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

namespace {
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}
}  // namespace

void route_stop_signals() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  try {
    std::thread([set] {
      pthread_setname_np(pthread_self(), "dtrain-signals");
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      for (;;) ::pause();  // each handled signal returns here; the default action ends it all
    }).detach();
  } catch (const std::exception&) {
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // no thread to spare: taken where they land
  }
}

void unblock_stop_signals_in_child() {
  const sigset_t set = stop_signals();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace dtrain
