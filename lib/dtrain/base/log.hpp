#pragma once
// Logging: plain lines through spdlog (stderr, plus the run folder's `log` while a run is
// recorded) and a live progress line when stderr is a terminal.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace dtrain {

spdlog::logger& log();
void set_verbosity(bool quiet);
// Mirrors log lines into `path` until the returned handle is destroyed.
class RunLogFile {
 public:
  explicit RunLogFile(const std::string& path);
  ~RunLogFile();
  RunLogFile(const RunLogFile&) = delete;
  RunLogFile& operator=(const RunLogFile&) = delete;
  // An error line in this file alone (the terminal has it from the one who throws).
  void error(const std::string& text);

 private:
  std::shared_ptr<spdlog::sinks::sink> sink_;
};

bool stderr_is_terminal();
// Rewrites the progress line in place (terminal only); clear_progress() erases it.
void show_progress(const std::string& line);
void clear_progress();

}  // namespace dtrain
