#include "dtrain/train/explain.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dtrain/base/error.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/schedule.hpp"

namespace dtrain {

namespace {

// Each setting and the keys it changes.
const std::vector<std::pair<std::string, std::vector<std::string>>>& setting_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> s = {
      {"global_batch", {"train.per_replica_batch"}},
      {"lr_rule", {"optimizer.lr_scaling", "optimizer.lr", "optimizer.min_lr"}},
      {"warmup", {"optimizer.warmup_epochs", "optimizer.warmup_from"}},
      {"batchnorm", {"model.batchnorm"}},
      {"reduction", {"train.reduction"}},
      {"sharding", {"data.sharding", "data.shuffle"}},
      {"accumulation", {"train.accumulation_steps"}},
  };
  return s;
}

using Values = std::map<std::string, std::string>;

// The managed keys' values of a config, spelled as overrides.
Values values_of(const Config& c) {
  return {
      {"train.per_replica_batch", fmt::format("{}", c.train.per_replica_batch)},
      {"optimizer.lr_scaling", to_string(c.optimizer.lr_scaling)},
      {"optimizer.lr", fmt::format("{}", c.optimizer.lr)},
      {"optimizer.min_lr", fmt::format("{}", c.optimizer.min_lr)},
      {"optimizer.warmup_epochs", fmt::format("{}", c.optimizer.warmup_epochs)},
      {"optimizer.warmup_from", to_string(c.optimizer.warmup_from)},
      {"model.batchnorm", to_string(c.model.batchnorm)},
      {"train.reduction", to_string(c.train.reduction)},
      {"data.sharding", to_string(c.data.sharding)},
      {"data.shuffle", to_string(c.data.shuffle)},
      {"train.accumulation_steps", fmt::format("{}", c.train.accumulation_steps)},
  };
}

std::vector<std::string> overrides_of(int gpus, const Values& v) {
  std::vector<std::string> out = {fmt::format("gpus={}", gpus)};
  for (const auto& k : explain_keys()) out.push_back(k + "=" + v.at(k));
  return out;
}

std::string short_key(const std::string& key) {
  return key.substr(key.find('.') + 1);
}

void check_equivalent_possible(const Config& base, const Config& user) {
  const int n = user.gpus;
  if (n < 2)
    throw UserError(fmt::format("explain compares 1 replica with N: give gpus=N with N >= 2 "
                                "(the config has gpus={})",
                                n));
  if (base.train.global_batch || user.train.global_batch)
    throw UserError(
        "explain needs train.per_replica_batch, not train.global_batch: give the per-replica "
        "batch of the 1-replica run instead");
  if (base.train.per_replica_batch % n != 0)
    throw UserError(fmt::format(
        "explain: the 1-replica per_replica_batch {} does not divide by gpus={}, so no "
        "{}-replica run has the same global batch; pick a batch or replica count that divides",
        base.train.per_replica_batch, n, n));
}

// Whether the model has a BatchNorm anywhere (blocks' bodies and projection shortcuts too), as
// the shape engine builds it for the data's nominal shape; a model that does not fit that shape
// (validate says why) counts as having one, so that the rung is not skipped on a guess.
bool has_batchnorm(const Config& c) {
  try {
    return !model_size(c.model, nominal_shape(c.data), 10).batchnorm_positions.empty();
  } catch (const UserError&) {
    return true;
  }
}

// The N-replica run that is by construction the baseline, step for step.
Values equivalent_values(const Config& base, int n) {
  Values v = values_of(base);
  v["train.per_replica_batch"] = fmt::format("{}", base.train.per_replica_batch / n);
  v["train.reduction"] = "mean";
  v["model.batchnorm"] = "sync";
  const double peak = scaled_lr(base.optimizer, base.global_batch());
  // A warmup that ramps (from lr to the scaled rate, or from zero): the baseline's own rule
  // (same global batch, same rates) is the exact equivalent. Without one, `none` at the peak,
  // with the cosine floor scaled as the rule scales it.
  if (!warmup_ramps(base.optimizer, base.global_batch())) {
    v["optimizer.lr_scaling"] = "none";
    v["optimizer.lr"] = fmt::format("{}", peak);
    if (base.optimizer.lr > 0)
      v["optimizer.min_lr"] = fmt::format("{}", base.optimizer.min_lr * (peak / base.optimizer.lr));
  }
  return v;
}

std::string describe(const std::vector<std::string>& keys, const Values& from, const Values& to) {
  std::string out;
  for (const auto& k : keys)
    if (from.at(k) != to.at(k))
      out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", short_key(k), from.at(k),
                         to.at(k));
  return out;
}

}  // namespace

const std::vector<std::string>& explain_settings() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, keys] : setting_keys()) n.push_back(name);
    return n;
  }();
  return names;
}

const std::vector<std::string>& explain_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, ks] : setting_keys()) k.insert(k.end(), ks.begin(), ks.end());
    return k;
  }();
  return keys;
}

std::vector<std::string> parse_explain_order(const std::string& text) {
  std::vector<std::string> out;
  const auto& all = explain_settings();
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string name = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (std::find(all.begin(), all.end(), name) == all.end())
      throw UserError(fmt::format("--order: unknown setting '{}' (the settings: {})", name,
                                  fmt::join(all, ", ")));
    if (std::find(out.begin(), out.end(), name) != out.end())
      throw UserError(fmt::format("--order: '{}' is given twice", name));
    out.push_back(name);
  }
  for (const auto& name : all)
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  return out;
}

std::vector<ExplainRung> plan_explain(const Config& base, const Config& user,
                                      const std::vector<std::string>& order) {
  check_equivalent_possible(base, user);
  const int n = user.gpus;
  Values cur = equivalent_values(base, n);
  const Values want = values_of(user);
  std::vector<ExplainRung> rungs;
  rungs.push_back({"baseline", "", overrides_of(1, values_of(base)), "the config at gpus=1"});
  const bool own_rule = cur.at("optimizer.lr_scaling") == to_string(base.optimizer.lr_scaling) &&
                        cur.at("optimizer.lr") == fmt::format("{}", base.optimizer.lr);
  rungs.push_back({"equivalent", "", overrides_of(n, cur),
                   fmt::format("gpus=1 -> {}: the same global batch, mean, sync BatchNorm, the "
                               "baseline's {}",
                               n, own_rule ? "LR rule and LR" : "peak LR")});
  std::map<std::string, std::vector<std::string>> keys_of(setting_keys().begin(),
                                                          setting_keys().end());
  for (const auto& name : order) {
    const auto& keys = keys_of.at(name);
    Values next = cur;
    for (const auto& k : keys) next[k] = want.at(k);
    ExplainRung r{name, fmt::format("{}", fmt::join(keys, ", ")), overrides_of(n, next),
                  describe(keys, cur, next)};
    if (name == "batchnorm" && next != cur && !has_batchnorm(user)) {
      r.skipped = true;  // the next rung carries the value: it changes nothing there either
      r.change = fmt::format("{}: the model has no BatchNorm layer, skipped", r.change);
    } else if (next == cur) {
      r.skipped = true;
      std::vector<std::string> vals;
      for (const auto& k : keys) vals.push_back(short_key(k) + " " + cur.at(k));
      r.change = fmt::format("unchanged ({}): skipped", fmt::join(vals, ", "));
    }
    rungs.push_back(std::move(r));
    cur = std::move(next);
  }
  return rungs;
}

}  // namespace dtrain
