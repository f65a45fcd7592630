#include "dtrain/base/error.hpp"

#include <fmt/format.h>

namespace dtrain {

namespace {
std::string locate(const std::string& what, const char* file, int line, int rank) {
  if (rank >= 0) return fmt::format("{} ({}:{}, rank {})", what, file, line, rank);
  return fmt::format("{} ({}:{})", what, file, line);
}
}  // namespace

SystemError::SystemError(const std::string& what, const char* file, int line, int rank)
    : std::runtime_error(locate(what, file, line, rank)), file_(file), line_(line), rank_(rank) {}

std::string json_error_text(const std::string& what) {
  std::string text = what;
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  const size_t quote = text.find("; last read: ");
  if (quote != std::string::npos) text.erase(quote);
  for (char& ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  return text;
}

}  // namespace dtrain
