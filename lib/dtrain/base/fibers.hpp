#pragma once
// Replicas in turn: N bodies run as fibers (user-level contexts, glibc's ucontext) on W worker
// threads, one per core. Fiber i lives on worker i % W for its whole life. A worker always runs
// the first of its fibers (in index order) that can go on, until it waits for something (a
// collective of the in-process group), yields or ends. A switch between fibers costs a
// swapcontext (a signal-mask system call) and wakes no thread, where waking a sleeping thread
// costs tens of microseconds: with more replicas than cores that is the difference between
// simulating N replicas at the machine's speed and spending the time in the scheduler.
//
// What runs in a fiber must not wait for another fiber of its own worker by blocking its
// thread (a mutex held across a wait, a condition variable): it waits with wait_until(), which
// the in-process group's collectives do (see comm.cpp). Nothing may wait while an exception is
// being handled (the C++ runtime keeps that state per thread, not per fiber).
#include <functional>

namespace dtrain::fibers {

// Runs body(i) for every i in [0, n) as fibers on `workers` threads (the calling thread is
// worker 0) and returns when all have returned. A body that throws ends normally for the
// others; its exception is rethrown here once all have returned (so a body that others wait
// for must release them before it throws).
void run(int n, int workers, const std::function<void(int)>& body);

// Whether the calling code runs in a fiber.
bool in_fiber();

// In a fiber: lets the worker run its other fibers until ready() holds (checked by the worker,
// without switching, so ready() must be cheap, must not throw, and must be safe to call from
// any of them). Where there are other workers, spins on ready() for up to `spin_us`
// microseconds first, for a wait that another core ends soon.
void wait_until(const std::function<bool()>& ready, int spin_us = 0);

// In a fiber: lets the worker run the earlier fibers that can go on first (in index order),
// then comes back. Elsewhere nothing.
void yield();

// Something a waiting fiber may wait for has changed: workers with nothing to run look again.
void notify();

}  // namespace dtrain::fibers
