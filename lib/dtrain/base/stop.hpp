#pragma once
// Cooperative stop (Ctrl-C, SIGTERM): a flag that signal handlers set and every rank polls at
// its next step, so that the run ends at a step boundary and is recorded as stopped.
namespace dtrain {

void request_stop(int signal = 0);  // async-signal-safe; `signal`: the one that asked, if any
bool stop_requested();
// The exit code of a process stopped by request: 128 + the signal (130 for SIGINT, 143 for
// SIGTERM), 130 when no signal asked.
int stop_exit_code();

}  // namespace dtrain
