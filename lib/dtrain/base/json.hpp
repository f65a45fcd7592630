#pragma once
// JSON files dtrain wrote and reads back, parsed with a bound on their nesting.
#include <nlohmann/json.hpp>
#include <string>

namespace dtrain {

// `text` parsed, or a discarded value where it is not JSON or nests deeper than `max_depth`.
// The parse stops at that depth: a file of a million '[' would otherwise build a million arrays,
// tens of times the file's size in memory, before anything could look at it.
inline nlohmann::json parse_json_bounded(const std::string& text, int max_depth) {
  struct TooDeep {};
  try {
    return nlohmann::json::parse(
        text,
        [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
          if (depth > max_depth) throw TooDeep{};
          return true;
        },
        /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

// `j` as JSON text, `indent` spaces a level (-1: one line). A string that is not UTF-8 (a
// folder name of bytes: Linux allows any) is written with U+FFFD for each bad byte, not
// thrown at the user as an internal error.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dtrain
