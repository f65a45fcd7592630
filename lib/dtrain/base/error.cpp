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

}  // namespace dtrain
