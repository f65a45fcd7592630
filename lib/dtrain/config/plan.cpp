#include "dtrain/config/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/hash.hpp"

namespace dtrain {

std::vector<std::string> split_values(const std::string& value) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  YamlQuotes quotes(/*anywhere=*/true);
  for (char ch : value) {
    if (quotes.outside(ch)) {
      if (ch == '[' || ch == '{') {
        ++depth;
      } else if (ch == ']' || ch == '}') {
        --depth;
      } else if (ch == ',' && depth == 0) {
        out.push_back(cur);
        cur.clear();
        continue;
      }
    }
    cur += ch;
  }
  out.push_back(cur);
  return out;
}

namespace {
// Each run's config. A mistake is the first failing run's, named by its label, unless every
// run fails with the same words: then it is the config file's (an unknown key), said as it is.
void load_each(const std::string& config_path, std::vector<PlannedRun>& runs) {
  for (size_t i = 0; i < runs.size(); ++i) {
    try {
      runs[i].config = load_config(config_path, runs[i].overrides);
    } catch (const UserError& e) {
      for (size_t j = i + 1; j < runs.size(); ++j) {
        try {
          (void)load_config(config_path, runs[j].overrides);
        } catch (const UserError& other) {
          if (std::string(other.what()) == e.what()) continue;
        }
        rethrow_for_run(runs[i], runs.size(), e);
      }
      if (i == 0) throw;
      rethrow_for_run(runs[i], runs.size(), e);
    }
  }
}
}  // namespace

namespace {
// Two values of a comma list that read alike (0.1 and 0.10, 1,1) would train the same run
// twice under two names: refused, naming both.
void refuse_repeated_runs(const std::vector<PlannedRun>& runs) {
  if (runs.size() < 2) return;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto [it, fresh] = seen.emplace(to_yaml(runs[i].config), i);
    if (fresh) continue;
    const PlannedRun& a = runs[it->second];
    std::string differ;
    for (size_t k = 0; k < a.overrides.size() && k < runs[i].overrides.size(); ++k)
      if (a.overrides[k].value != runs[i].overrides[k].value)
        differ += fmt::format("{}{}={} and {}", differ.empty() ? "" : ", ", a.overrides[k].key,
                              a.overrides[k].value, runs[i].overrides[k].value);
    throw UserError(
        fmt::format("the comma lists make one run twice ({} read alike); give each "
                    "value once",
                    differ.empty() ? "two values" : differ));
  }
}

// Two runs whose values differ only in characters a folder name drops ('a b' and 'a_b') would
// share a run folder: refused here, so that validate and doctor say it as run would.
void refuse_shared_folders(const std::vector<PlannedRun>& runs) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string folder = runs[i].config.name + "/<tag>" + run_id("", runs[i]);
    const auto [it, fresh] = seen.emplace(folder, i);
    if (fresh) continue;
    throw UserError(fmt::format(
        "the sweep's runs {} and {} would share one run folder, {}: their values differ only "
        "in characters a folder name leaves out (letters, digits and . _ - + are kept)",
        runs[it->second].label, runs[i].label, folder));
  }
}
}  // namespace

namespace {

// An override in a run's label or group: its key's last part and its value, e.g. "lr0.1".
std::string override_slug(const std::string& key, const std::string& value) {
  const auto dot = key.rfind('.');
  return slug((dot == std::string::npos ? key : key.substr(dot + 1)) + value);
}

}  // namespace

std::string group_of(const std::vector<Override>& overrides) {
  // In key order, so that the same overrides typed in another order make the same group.
  std::vector<const Override*> sorted;
  for (const Override& o : overrides)
    if (o.key != "gpus") sorted.push_back(&o);
  std::sort(sorted.begin(), sorted.end(),
            [](const Override* a, const Override* b) { return a->key < b->key; });
  std::string group;
  for (const Override* o : sorted)
    group += (group.empty() ? "" : "-") + override_slug(o->key, o->value);
  return group;
}

std::vector<PlannedRun> plan_runs(const std::string& config_path,
                                  const std::vector<std::string>& override_texts) {
  struct Axis {
    std::string key;
    std::vector<std::string> values;
  };
  std::vector<Axis> axes;
  std::set<std::string> keys;
  for (const auto& text : override_texts) {
    const Override o = parse_override(text);
    if (!keys.insert(o.key).second)
      throw UserError(fmt::format("override '{}': key '{}' given twice", text, o.key));
    // A section given whole replaces what an earlier override set inside it.
    for (const auto& earlier : keys)
      if (earlier.size() > o.key.size() && earlier.compare(0, o.key.size() + 1, o.key + ".") == 0)
        throw UserError(fmt::format(
            "override '{}' replaces the whole {} section, so the earlier {}=... would be lost; "
            "give {} inside it, or set the section's keys one by one",
            text, o.key, earlier, earlier.substr(o.key.size() + 1)));
    auto values = split_values(o.value);
    for (const auto& v : values)
      if (v.empty())
        throw UserError(values.size() == 1
                            ? fmt::format("override '{}': no value after '='; give one, e.g. "
                                          "{}=VALUE, or a comma list to sweep (an empty "
                                          "string is \"{}=''\" in the shell)",
                                          text, o.key, o.key)
                            : fmt::format("override '{}': empty value in the comma list", text));
    for (size_t i = 1; i < values.size(); ++i)
      if (std::find(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(i), values[i]) !=
          values.begin() + static_cast<std::ptrdiff_t>(i))
        throw UserError(
            fmt::format("override '{}': {} is in the comma list twice; give each "
                        "value once",
                        text, values[i]));
    axes.push_back({o.key, std::move(values)});
  }
  // The product of the lists is counted before any run is built: a sweep of 1000 x 1000 x 1000
  // values is refused at once instead of filling memory while it is planned.
  int64_t count = 1;
  std::string sizes;
  for (const auto& axis : axes) {
    count = std::min<int64_t>(count * static_cast<int64_t>(axis.values.size()), kMaxRuns + 1);
    sizes += fmt::format("{}{} {}", sizes.empty() ? "" : " x ", axis.values.size(), axis.key);
  }
  if (count > kMaxRuns)
    throw UserError(fmt::format(
        "the comma lists make more than {} runs ({}); split the sweep into several commands",
        kMaxRuns, sizes));
  std::vector<PlannedRun> runs(1);
  for (const auto& axis : axes) {
    std::vector<PlannedRun> next;
    for (const auto& r : runs) {
      for (const auto& v : axis.values) {
        PlannedRun n = r;
        n.overrides.push_back({axis.key, v});
        if (axis.key != "gpus" && axis.values.size() > 1) {
          if (!n.label.empty()) n.label += "-";
          n.label += override_slug(axis.key, v);
        }
        next.push_back(std::move(n));
      }
    }
    runs = std::move(next);
  }
  for (auto& r : runs) r.group = group_of(r.overrides);
  load_each(config_path, runs);
  refuse_repeated_runs(runs);
  refuse_shared_folders(runs);
  return runs;
}

void rethrow_for_run(const PlannedRun& r, size_t runs, const UserError& e) {
  if (runs == 1 || r.label.empty()) throw e;
  throw UserError(fmt::format("the sweep's run {}: {}", r.label, e.what()));
}

std::string run_id(const std::string& tag, const PlannedRun& run) {
  std::string id = fmt::format("{}-g{}", tag, run.config.gpus);
  if (!run.label.empty()) id += "-" + run.label;
  // The id names a folder and its lock file (".<id>.lock"), which must fit in a file name's 255
  // bytes: an id that would not (a long swept value) keeps its start and a hash of the whole, so
  // ids stay distinct and the same for every command that plans them; shorter ones are as ever.
  constexpr size_t kMaxId = 255 - 6;
  if (id.size() > kMaxId) {
    id = fmt::format("{}-{:016x}", id.substr(0, kMaxId - 17), text_hash(id.data(), id.size()));
  }
  return id;
}

}  // namespace dtrain
