#pragma once
// summary.json, field by field. One table declares every top-level field once: its name, JSON
// type, unit, meaning, the config key it repeats, whether every summary has it, and how its
// value is made from the run. The writer is a loop over the table, the tests check each value
// against its declared type, and docs/run.md's list of fields is tested against it.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/results/metrics.hpp"
#include "dtrain/train/run_types.hpp"

namespace dtrain {

// What a summary is made from: the run as it ended.
struct SummarySource {
  SummarySource(const Config& c, const RunInfo& i, const std::vector<EpochMetrics>& e,
                const RunStats& st)
      : cfg(c), info(i), epochs(e), stats(st) {}
  const Config& cfg;
  const RunInfo& info;
  const std::vector<EpochMetrics>& epochs;
  const RunStats& stats;  // summarize(epochs, the config's targets)
  std::vector<EvalPoint> evals;  // train.eval_steps: the scorings of the test set
  std::string run_id, group, status, error;
  std::string started_at, finished_at;  // UTC, ISO 8601
  double wall_time_s = 0;
  double peak_rss_mib = 0;
};

// The JSON type of a field's value (a `nullable` field may also be null).
enum class SummaryType { string, number, integer, boolean, object, array };
const char* to_string(SummaryType t);

// One top-level field of summary.json (version 1).
struct SummaryField {
  const char* name;  // a summary_key constant (run_schema.hpp)
  SummaryType type;
  bool nullable;     // null where the run has no such number (JSON has no NaN)
  const char* unit;  // "" for counts, words and pure numbers
  const char* meaning;
  // The config key whose value it repeats (kept for the scripts and older readers that read it
  // here rather than from "config"), or "".
  const char* repeats;
  bool always;  // written in every summary (the others only where they apply)
  // The value; a discarded JSON value where the field does not apply to this run.
  nlohmann::json (*value)(const SummarySource&);
};

// The fields in the order the docs list them (the file holds them sorted by name).
const std::vector<SummaryField>& summary_fields();

// The summary of a run: each field of the table whose value applies.
nlohmann::json summary_json(const SummarySource& s);

// Whether `v` has the field's declared type (or is null where the field is nullable).
bool has_declared_type(const SummaryField& f, const nlohmann::json& v);

// What a reader makes of a summary's top-level fields: "" where every declared field present
// has its declared type (an integer may also be written as 64.0, as a script's rewrite may;
// 12.7 is no integer), else "'KEY' is VALUE; dtrain writes TYPE" for the first that has not.
// Fields the table does not declare (a later version's) are left alone.
std::string summary_type_error(const nlohmann::json& summary);

}  // namespace dtrain
