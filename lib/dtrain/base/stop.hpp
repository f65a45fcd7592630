#pragma once
// Cooperative stop (Ctrl-C, SIGTERM): a flag that signal handlers set and every rank polls at
// its next step, so that the run ends at a step boundary and is recorded as stopped.
namespace dtrain {

void request_stop();  // async-signal-safe
bool stop_requested();

}  // namespace dtrain
