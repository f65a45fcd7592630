#pragma once
// What `dtrain run` decides about its run folders before the first run starts, on plain data:
// what rank 0 found in each folder and the command's options. The command reads the folders
// and acts on the answers (and under a launcher, shares rank 0's with every rank).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

// Whether a run with this status (read_run_status) has finished: done or diverged. --resume
// skips a finished run and continues, or starts over, any other.
bool run_finished(const std::string& status);

// Throws UserError if `dir` is one of `planned`: two runs of this command map to one folder.
void check_distinct(const std::string& dir, const std::vector<std::string>& planned);

// What rank 0 found at a planned run folder (nothing, when it does not exist).
struct FolderFound {
  bool exists = false;
  std::string status;  // read_run_status
  long holder = 0;     // RunLock::holder; looked up under --resume only
};

// What the command does with that folder before any run starts.
struct FolderPlan {
  bool skip = false;     // a finished run under --resume: not trained again
  bool compare = false;  // skipped and not refused: its config must be this run's (config_differs)
  std::string refusal;   // why the command stops before its first run; "" if it goes on
};
FolderPlan plan_folder(const std::string& dir, const FolderFound& found, bool resume);

// A resolved config as --resume compares it: without the keys that never change a bit of the
// results: `replicas` (which run folders written before the key existed lack), train.trace,
// train.telemetry_ms and train.checkpoint_steps. Text that does not read as a config is
// compared as it is.
std::string resume_identity(const std::string& yaml);

// The first line where two resolved configs differ (a key and its value), each without its
// indent; "(end of file)" past the end of one.
std::pair<std::string, std::string> first_difference(const std::string& was,
                                                     const std::string& now);

// "" if the finished run in `dir`, whose config.resolved.yaml holds `had` (nullopt: it has
// none), was run with `cfg`; else why --resume cannot reuse it, naming the first line that
// differs.
std::string config_differs(const std::string& dir, const std::optional<std::string>& had,
                           const Config& cfg);

// What an unfinished folder was when --resume moves it aside, for the log: its status, or
// "incomplete" when it has none.
std::string unfinished_as(const std::string& status);

// Rank 0's decisions as one string every rank receives: its refusal, or which runs it skips.
std::string encode_decisions(const std::string& refusal, const std::vector<bool>& skip);
// Reads encode_decisions' string back; `skip` keeps its size (every rank planned the same runs).
void decode_decisions(const std::string& text, std::string& refusal, std::vector<bool>& skip);

}  // namespace dtrain
