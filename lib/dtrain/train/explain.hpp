#pragma once
// dtrain explain: the path from a config's 1-replica run to its N-replica run, one setting per
// rung. Planning only (a pure function of two configs); apps/dtrain/cmd_explain.cpp runs it.
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

struct ExplainRung {
  std::string name;     // "baseline", "equivalent", or a setting name (explain_settings())
  std::string setting;  // the keys this rung changes, e.g. "train.per_replica_batch"
  // key=value overrides that give this rung from the config file together with the user's
  // overrides of other keys: gpus and every key explain manages, always all of them.
  std::vector<std::string> overrides;
  std::string change;    // e.g. "per_replica_batch 8 -> 16"; why, for a skipped rung
  bool skipped = false;  // the setting already has the user's value: nothing to run
};

// The setting names --order accepts, in the default order.
const std::vector<std::string>& explain_settings();

// The keys explain sets on every rung (the user's overrides of these are replaced).
const std::vector<std::string>& explain_keys();

// Parses "a,b,..." (names of explain_settings()); settings not named follow in the default
// order. Throws UserError for an unknown or repeated name. "" gives the default order.
std::vector<std::string> parse_explain_order(const std::string& text);

// Rungs from `base` (the config at gpus=1) to `user` (the config at gpus=N): baseline,
// equivalent, then one rung per setting in `order`. Throws UserError when the equivalent
// cannot be built (N < 2, train.global_batch given, per_replica_batch not divisible by N).
std::vector<ExplainRung> plan_explain(const Config& base, const Config& user,
                                      const std::vector<std::string>& order);

}  // namespace dtrain
