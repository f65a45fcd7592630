#include "dtrain/base/fibers.hpp"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dtrain/base/error.hpp"

// AddressSanitizer must be told when the stack changes under it.
#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_FIBERS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_FIBERS_ASAN 1
#endif
#endif
#ifdef DTRAIN_FIBERS_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace dtrain::fibers {

namespace {

using Clock = std::chrono::steady_clock;

// Reserved, not committed: a fiber only uses the pages it touches. The lowest page is a guard.
constexpr size_t kStackBytes = size_t{8} << 20;  // as a thread's default

struct Fiber {
  ucontext_t ctx{};
  void* map = nullptr;  // the mapping, guard page included
  size_t map_bytes = 0;
  void* stack = nullptr;  // above the guard page
  size_t stack_bytes = 0;
  int index = 0;
  bool done = false;
  const std::function<bool()>* waiting = nullptr;  // set while suspended in wait_until
  // g_kick when `waiting` was last found false: until g_kick moves, it still is (every change
  // a fiber may wait for is followed by notify()), so the worker need not ask again.
  uint64_t parked_at = UINT64_MAX;
  void* asan_fake = nullptr;
};

struct Worker {
  ucontext_t home{};
  int workers = 1;  // of the run
  std::vector<Fiber*> fibers;
  Fiber* current = nullptr;
  const std::function<void(int)>* body = nullptr;
  const void* home_bottom = nullptr;  // the thread's own stack, for the sanitizer
  size_t home_bytes = 0;
  void* home_fake = nullptr;
  std::exception_ptr error;
};

thread_local Worker* tl_worker = nullptr;

// Bumped by notify(); a worker with nothing to run waits for it to move.
std::atomic<uint64_t> g_kick{0};
std::atomic<int> g_sleepers{0};
std::mutex g_idle_mu;
std::condition_variable g_idle_cv;

// A moment of spinning that gives the core away if another thread wants it: two workers the
// kernel put on one core must not spin against each other.
void spin_pause() {
  std::this_thread::yield();
}

// Into fiber f, from its worker's own context; back when f waits or ends.
void switch_into(Worker& w, Fiber* f) {
  w.current = f;
#ifdef DTRAIN_FIBERS_ASAN
  __sanitizer_start_switch_fiber(&w.home_fake, f->stack, f->stack_bytes);
#endif
  swapcontext(&w.home, &f->ctx);
#ifdef DTRAIN_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(w.home_fake, nullptr, nullptr);
#endif
  w.current = nullptr;
}

// From fiber f back to its worker (for good when f has ended).
void switch_out(Worker& w, Fiber* f) {
#ifdef DTRAIN_FIBERS_ASAN
  __sanitizer_start_switch_fiber(f->done ? nullptr : &f->asan_fake, w.home_bottom, w.home_bytes);
#endif
  swapcontext(&f->ctx, &w.home);
#ifdef DTRAIN_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake, &w.home_bottom, &w.home_bytes);
#endif
}

void entry() {
  Worker& w = *tl_worker;
  Fiber* f = w.current;
#ifdef DTRAIN_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &w.home_bottom, &w.home_bytes);
#endif
  try {
    (*w.body)(f->index);
  } catch (...) {
    if (!w.error) w.error = std::current_exception();
  }
  f->done = true;
  switch_out(w, f);  // never resumed
}

// Nothing to run until g_kick moves past `seen`: spin a little (another core is about to
// finish what the fibers wait for), then sleep (with a timeout, as a safety net).
void idle(uint64_t seen) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(200);
  while (Clock::now() < spin_until) {
    if (g_kick.load() != seen) return;
    spin_pause();
  }
  ++g_sleepers;
  {
    std::unique_lock lk(g_idle_mu);
    g_idle_cv.wait_for(lk, std::chrono::milliseconds(2), [&] { return g_kick.load() != seen; });
  }
  --g_sleepers;
}

// Always the first fiber (in index order) that can go on: a fiber whose wait has ended goes
// before one that has not started its work yet, so that work finishes in rank order.
void work(Worker& w) {
  tl_worker = &w;
  for (;;) {
    const uint64_t seen = g_kick.load();
    bool left = false;
    Fiber* next = nullptr;
    for (Fiber* f : w.fibers) {
      if (f->done) continue;
      left = true;
      if (f->waiting) {
        if (f->parked_at == seen) continue;
        if (!(*f->waiting)()) {
          f->parked_at = seen;
          continue;
        }
      }
      next = f;
      break;
    }
    if (!left) break;
    if (next)
      switch_into(w, next);
    else
      idle(seen);
  }
  tl_worker = nullptr;
}

void make_fiber(Fiber& f, int index) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  f.index = index;
  f.map_bytes = kStackBytes + page;
  f.map = mmap(nullptr, f.map_bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (f.map == MAP_FAILED) {
    f.map = nullptr;
    DTRAIN_THROW_SYSTEM("fibers: cannot reserve a replica's stack (mmap failed)");
  }
  if (mprotect(f.map, page, PROT_NONE) != 0)
    DTRAIN_THROW_SYSTEM("fibers: cannot protect a stack's guard page");
  f.stack = static_cast<char*>(f.map) + page;
  f.stack_bytes = kStackBytes;
  if (getcontext(&f.ctx) != 0) DTRAIN_THROW_SYSTEM("fibers: getcontext failed");
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = f.stack_bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, entry, 0);
}

}  // namespace

void run(int n, int workers, const std::function<void(int)>& body) {
  if (n <= 0) return;
  workers = std::max(1, std::min(workers, n));
  std::vector<Fiber> all(static_cast<size_t>(n));
  struct Unmap {
    std::vector<Fiber>& all;
    ~Unmap() {
      for (Fiber& f : all) {
        if (!f.map) continue;
#ifdef DTRAIN_FIBERS_ASAN
        // A fiber's last frames never return: forget what the sanitizer knows of them.
        ASAN_UNPOISON_MEMORY_REGION(f.stack, f.stack_bytes);
#endif
        munmap(f.map, f.map_bytes);
      }
    }
  } unmap{all};
  for (int i = 0; i < n; ++i) make_fiber(all[static_cast<size_t>(i)], i);
  std::vector<Worker> ws(static_cast<size_t>(workers));
  for (int i = 0; i < n; ++i)
    ws[static_cast<size_t>(i % workers)].fibers.push_back(&all[static_cast<size_t>(i)]);
  for (Worker& w : ws) {
    w.body = &body;
    w.workers = workers;
  }
  // The workers start together or not at all: the fibers of a worker that never started would
  // leave the others waiting for them.
  std::mutex start_mu;
  std::condition_variable start_cv;
  int start = 0;  // 1: go, -1: give up
  const auto begin = [&](int how) {
    {
      std::lock_guard lk(start_mu);
      start = how;
    }
    start_cv.notify_all();
  };
  const auto worker = [&](Worker& w) {
    {
      std::unique_lock lk(start_mu);
      start_cv.wait(lk, [&] { return start != 0; });
      if (start < 0) return;
    }
    work(w);
  };
  std::vector<std::thread> threads;
  try {
    for (size_t k = 1; k < ws.size(); ++k) threads.emplace_back(worker, std::ref(ws[k]));
  } catch (...) {
    begin(-1);
    for (auto& t : threads) t.join();
    throw;
  }
  begin(1);
  work(ws[0]);
  for (auto& t : threads) t.join();
  for (Worker& w : ws)
    if (w.error) std::rethrow_exception(w.error);
}

bool in_fiber() {
  return tl_worker != nullptr && tl_worker->current != nullptr;
}

void wait_until(const std::function<bool()>& ready, int spin_us) {
  if (ready()) return;
  Worker& w = *tl_worker;
  if (spin_us > 0 && w.workers > 1) {
    const auto until = Clock::now() + std::chrono::microseconds(spin_us);
    while (Clock::now() < until) {
      spin_pause();
      if (ready()) return;
    }
  }
  Fiber* f = w.current;
  f->waiting = &ready;
  f->parked_at = UINT64_MAX;
  switch_out(w, f);  // the worker resumes this fiber once ready() holds
  f->waiting = nullptr;
}

void yield() {
  if (!in_fiber()) return;
  Worker& w = *tl_worker;
  switch_out(w, w.current);  // the worker looks from its first fiber again
}

void notify() {
  ++g_kick;
  if (g_sleepers.load() > 0) {
    std::lock_guard lk(g_idle_mu);
    g_idle_cv.notify_all();
  }
}

}  // namespace dtrain::fibers
