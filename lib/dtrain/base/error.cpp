#include "dtrain/base/error.hpp"

#include <fmt/format.h>

#include <algorithm>

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
  return printable(text);
}

namespace {
// The length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 where it is none.
size_t utf8_length(const std::string& text, size_t i) {
  const auto at = [&](size_t k) {
    return k < text.size() ? static_cast<unsigned char>(text[k]) : 0u;
  };
  const unsigned c = at(i);
  const auto tail = [&](size_t n) {
    for (size_t k = 1; k <= n; ++k)
      if ((at(i + k) & 0xc0) != 0x80) return false;
    return true;
  };
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return tail(1) ? 2 : 0;
  // No overlong forms, no surrogates, nothing past U+10FFFF.
  if (c >= 0xe0 && c <= 0xef) {
    const unsigned n = at(i + 1);
    if ((c == 0xe0 && n < 0xa0) || (c == 0xed && n > 0x9f)) return 0;
    return tail(2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const unsigned n = at(i + 1);
    if ((c == 0xf0 && n < 0x90) || (c == 0xf4 && n > 0x8f)) return 0;
    return tail(3) ? 4 : 0;
  }
  return 0;
}

// Whether the sequence of `n` bytes at text[i] is a control or a mark that reorders text.
bool hidden_effect(const std::string& text, size_t i, size_t n) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  if (n == 1) return at(0) < 0x20 || at(0) == 0x7f;
  if (n == 2) return at(0) == 0xc2 && at(1) <= 0x9f;  // U+0080-U+009F
  if (n != 3 || at(0) != 0xe2) return false;
  return (at(1) == 0x80 &&
          ((at(2) >= 0x8e && at(2) <= 0x8f) || (at(2) >= 0xaa && at(2) <= 0xae))) ||
         (at(1) == 0x81 && at(2) >= 0xa6 && at(2) <= 0xa9);
}
}  // namespace

bool has_control_character(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::max<size_t>(utf8_length(text, i), 1);
    if (hidden_effect(text, i, n)) return true;
    i += n;
  }
  return false;
}

std::string printable(const std::string& text, bool hex) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n > 0 && !hidden_effect(text, i, n)) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    for (size_t k = 0; k < std::max<size_t>(n, 1); ++k)
      out += hex ? fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i + k])) : "?";
    i += std::max<size_t>(n, 1);
  }
  return out;
}

}  // namespace dtrain
