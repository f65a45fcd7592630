#include "dtrain/base/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "dtrain/base/error.hpp"

namespace dtrain {

namespace {
std::mutex g_progress_mu;
bool g_progress_shown = false;

// %* : the message as printable() shows it. A path or name from a user (a --results with a
// newline, a file name with an escape sequence) never reaches the terminal or the log raw.
class PrintableMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string text = printable(std::string(msg.payload.data(), msg.payload.size()));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PrintableMessage>();
  }
};

std::unique_ptr<spdlog::formatter> line_format(const char* pattern) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<PrintableMessage>('*').set_pattern(pattern);
  return f;
}
}  // namespace

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("dtrain", sink);
    sink->set_formatter(line_format("[%H:%M:%S] %^%l%$ %*"));
    l->set_level(spdlog::level::info);
    // Every line reaches the run's log file as it is logged: a killed run keeps its log (a few
    // lines an epoch, so the writes cost nothing to speak of).
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

// The terminal's sink alone: a run folder's log file keeps every line of a quiet run too.
void set_verbosity(bool quiet) {
  log().sinks().front()->set_level(quiet ? spdlog::level::warn : spdlog::level::info);
}

RunLogFile::RunLogFile(const std::string& path) {
  sink_ = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  sink_->set_formatter(line_format("[%Y-%m-%d %H:%M:%S.%e] %l %*"));
  sink_->set_level(spdlog::level::info);
  log().sinks().push_back(sink_);
}

void RunLogFile::error(const std::string& text) {
  sink_->log(spdlog::details::log_msg(spdlog::source_loc{}, "dtrain", spdlog::level::err, text));
  sink_->flush();
}

RunLogFile::~RunLogFile() {
  auto& sinks = log().sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
}

bool stderr_is_terminal() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}

void show_progress(const std::string& line) {
  if (!stderr_is_terminal()) return;
  std::lock_guard lk(g_progress_mu);
  std::fprintf(stderr, "\r\033[2K%s", line.c_str());
  std::fflush(stderr);
  g_progress_shown = true;
}

void clear_progress() {
  std::lock_guard lk(g_progress_mu);
  if (!g_progress_shown) return;
  std::fprintf(stderr, "\r\033[2K");
  std::fflush(stderr);
  g_progress_shown = false;
}

}  // namespace dtrain
