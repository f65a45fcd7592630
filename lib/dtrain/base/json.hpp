#pragma once
// JSON files dtrain wrote and reads back, parsed with a bound on their nesting.
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace dtrain {

// For a parser callback: the keys of each object open at the moment, so that an object naming a
// key twice is found (the parser keeps the last silently, and a file dtrain wrote never has one:
// `"gpus": 2, "gpus": 8` is an edited or damaged file, not a run of 8).
class JsonKeys {
 public:
  // The key `parsed` holds where it repeats one of its object's (event `key`), else "".
  std::string repeated(nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) open_.emplace_back();
    if (event == E::object_end && !open_.empty()) open_.pop_back();
    if (event != E::key || open_.empty() || !parsed.is_string()) return "";
    const auto& key = parsed.get_ref<const std::string&>();
    return open_.back().insert(key).second ? "" : key;
  }

 private:
  std::vector<std::set<std::string>> open_;
};

// `text` parsed, or a discarded value where it is not JSON, nests deeper than `max_depth` or
// names a key twice in an object. The parse stops at that depth: a file of a million '[' would
// otherwise build a million arrays, tens of times the file's size in memory, before anything
// could look at it.
inline nlohmann::json parse_json_bounded(const std::string& text, int max_depth) {
  struct TooDeep {};
  JsonKeys keys;
  try {
    return nlohmann::json::parse(
        text,
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (depth > max_depth || !keys.repeated(event, parsed).empty()) throw TooDeep{};
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
