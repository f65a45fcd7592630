#pragma once
// Turns command-line overrides into a list of runs: a comma list (`gpus=1,2,4`) runs each value,
// several comma lists run their cartesian product (first key outermost).
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/config/config.hpp"

namespace dtrain {

struct PlannedRun {
  std::vector<Override> overrides;  // one value per key
  std::string label;                // swept keys and values, e.g. "lr0.1" ("" if none)
  // Every override but gpus, e.g. "lr0.1-reductionsum": the settings a run shares with the
  // baseline it is compared with (see report.hpp), in key order (group_of).
  std::string group;
  Config config;
};

// The group of a run with these overrides: every one but gpus, as key-value slugs in the
// order of their keys, whatever the order they were given in.
std::string group_of(const std::vector<Override>& overrides);

// Splits `value` on commas outside brackets and quotes.
std::vector<std::string> split_values(const std::string& value);

// The most runs one command plans (the product of its comma lists).
constexpr int64_t kMaxRuns = 10000;

// Parses and validates every run up front, so a typo in the last one fails before any training.
// More than kMaxRuns runs is a UserError, counted before any run is built.
std::vector<PlannedRun> plan_runs(const std::string& config_path,
                                  const std::vector<std::string>& override_texts);

// A mistake found in one run of a sweep, thrown again naming that run by its swept values
// ("the sweep's run train_size8: ..."); as it was where the command plans one run.
[[noreturn]] void rethrow_for_run(const PlannedRun& r, size_t runs, const UserError& e);

// Run folder name: "<tag>-g<gpus>[-<label>]", at most 249 bytes (past that, its first 232 and a
// hash of the whole).
std::string run_id(const std::string& tag, const PlannedRun& run);

}  // namespace dtrain
