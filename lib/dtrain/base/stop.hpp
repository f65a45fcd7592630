#pragma once
// Cooperative stop (Ctrl-C, SIGTERM, SIGHUP): a flag that signal handlers set and every rank polls
// at its next step, so that the run ends at a step boundary and is recorded as stopped.
namespace dtrain {

void request_stop(int signal = 0);  // async-signal-safe; `signal`: the one that asked, if any
bool stop_requested();
// The exit code of a process stopped by request: 128 + the signal (130 for SIGINT, 143 for
// SIGTERM), 130 when no signal asked.
int stop_exit_code();

// Routes Ctrl-C, SIGTERM and SIGHUP to one thread of dtrain's own ("dtrain-signals"), which only
// waits for them: blocked in the calling thread and so in every thread started after it (replicas,
// OpenMP's, the device sampler, MPI's), unblocked in that one. A handler then never runs on a
// thread that runs oneDNN's kernels (OpenBLAS's pool, started before main(), may still take
// one: its kernels keep the stack where it is). oneDNN's generated sgemm kernels point the
// stack register at a heap buffer while they run, so the kernel's signal frame written there
// corrupts the heap (oneDNN issue #4845; one SIGTERM in five crashed a run of the MLP before).
// Call it first in main(), before any other thread is started; what handles the signals (the
// default action, or on_interrupt's flag) is still set by signal() as before.
void route_stop_signals();
// In a child between fork() and exec(): the signals unblocked again, so that the program run
// (gnuplot) stops on Ctrl-C as it would by itself. Async-signal-safe.
void unblock_stop_signals_in_child();

}  // namespace dtrain
