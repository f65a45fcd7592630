#pragma once
// dtrain doctor: the known reasons an N-replica run trains worse than the 1-replica run, read
// from a config (and its data) before any training, and one that makes any run slower than it
// need be (more threads than cores). Each finding is one line: what is wrong, why it matters,
// and the fix. docs/doctor-explain.md ("dtrain doctor: the pitfalls it names before training")
// gives each rule's source or the dtrain measurement behind it.
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"

namespace dtrain {

struct Finding {
  std::string rule;     // a stable name, e.g. "sum-reduction"
  std::string message;  // "<what and why>; fix: <what to change>"
};

// Every rule that fires for `cfg`, each saying what holds for the configured optimizer (sgd,
// with or without momentum, against adam and adamw, whose steps are invariant to the
// gradient's scale but for eps and adam's weight decay). `data` (may be null) adds the rules
// that need the data: samples dropped per epoch, label-ordered training data, sparse labels.
std::vector<Finding> diagnose(const Config& cfg, const DataSplit* data);

// "doctor: [rule] message", the line `dtrain doctor` prints and `dtrain run` logs.
std::string to_line(const Finding& f);

// The rule names, in the order diagnose checks them.
const std::vector<std::string>& doctor_rules();

}  // namespace dtrain
