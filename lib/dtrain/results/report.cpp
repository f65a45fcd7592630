#include "dtrain/results/report.hpp"

#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/results/summary.hpp"
#include "dtrain/train/straggler.hpp"

namespace dtrain {

namespace {

std::optional<double> opt_number(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) return std::nullopt;
  const double v = j[key].get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;  // damaged: not a value
}

// A whole number of summary.json within [lo, hi] (`fallback` where the key is absent, as in
// folders of older versions); anything else, a fraction or 1e30 say, names the file and key.
int64_t int_in(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
               int64_t fallback, const std::string& path) {
  if (!j.contains(key)) return fallback;
  const auto& v = j[key];
  const bool whole = v.is_number_integer() ||
                     (v.is_number_float() && std::isfinite(v.get<double>()) &&
                      std::floor(v.get<double>()) == v.get<double>() &&
                      std::abs(v.get<double>()) < 9e15);
  const int64_t n = !whole                     ? 0
                    : v.is_number_unsigned()   ? static_cast<int64_t>(std::min<uint64_t>(
                                                     v.get<uint64_t>(), uint64_t{INT64_MAX}))
                    : v.is_number_integer()    ? v.get<int64_t>()
                                               : static_cast<int64_t>(v.get<double>());
  if (!whole || n < lo || n > hi)
    throw UserError(
        fmt::format("{}: '{}' is {}; expected a whole number from {} to {} (a "
                    "damaged file?)",
                    path, key, json_text(v), lo, hi));
  return n;
}

std::string fmt_opt(const std::optional<double>& v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

std::string pct(const std::optional<double>& v) {
  return v ? fmt::format("{:.2f}%", 100 * *v) : std::string("-");
}

// A run whose summary was not read (still running, or unreadable) has no gpus, batch or LR:
// "-", not a 0 it never had.
std::string known(const RunRecord& r, int64_t v) {
  return r.gpus > 0 ? std::to_string(v) : std::string("-");
}

struct Column {
  const char* title;
  std::string (*cell)(const ComparisonRow&);
};

const std::vector<Column>& columns() {
  static const std::vector<Column> cols = {
      {"run", [](const ComparisonRow& r) { return r.run.run_id; }},
      {"gpus", [](const ComparisonRow& r) { return known(r.run, r.run.gpus); }},
      {"per-replica batch",
       [](const ComparisonRow& r) { return known(r.run, r.run.per_replica_batch); }},
      {"global batch", [](const ComparisonRow& r) { return known(r.run, r.run.global_batch); }},
      {"lr rule", [](const ComparisonRow& r) { return r.run.lr_scaling; }},
      {"peak lr",
       [](const ComparisonRow& r) {
         return r.run.gpus > 0 ? fmt::format("{:.4g}", r.run.peak_lr) : std::string("-");
       }},
      {"reduction", [](const ComparisonRow& r) { return r.run.reduction; }},
      {"shuffle", [](const ComparisonRow& r) { return r.run.shuffle; }},
      {"sharding", [](const ComparisonRow& r) { return r.run.sharding; }},
      {"final test acc", [](const ComparisonRow& r) { return pct(r.run.final_test_acc); }},
      {"best test acc", [](const ComparisonRow& r) { return pct(r.run.best_test_acc); }},
      {"acc delta (pts)",
       [](const ComparisonRow& r) { return fmt_opt(r.acc_delta_points, "{:+.2f}"); }},
      {"final train loss",
       [](const ComparisonRow& r) { return fmt_opt(r.run.final_train_loss, "{:.4f}"); }},
      {"final test loss",
       [](const ComparisonRow& r) { return fmt_opt(r.run.final_test_loss, "{:.4f}"); }},
      {"median epoch s",
       [](const ComparisonRow& r) { return fmt_opt(r.run.median_epoch_time_s, "{:.3f}"); }},
      {"samples/s", [](const ComparisonRow& r) { return fmt_opt(r.run.samples_per_s, "{:.0f}"); }},
      {"speedup", [](const ComparisonRow& r) { return fmt_opt(r.speedup, "{:.2f}x"); }},
      {"efficiency",
       [](const ComparisonRow& r) {
         return r.efficiency ? fmt::format("{:.0f}%", 100 * *r.efficiency) : std::string("-");
       }},
      {"time to target",
       [](const ComparisonRow& r) {
         if (r.run.target_accuracy <= 0 && r.run.target_loss <= 0) return std::string("-");
         return r.run.time_to_target_s ? fmt::format("{:.1f}s", *r.run.time_to_target_s)
                                       : std::string("not reached");
       }},
      {"exposed exchange",
       [](const ComparisonRow& r) {
         return r.run.exposed_exchange_share
                    ? fmt::format("{:.0f}%", 100 * *r.run.exposed_exchange_share)
                    : std::string("-");
       }},
      {"exposed input",
       [](const ComparisonRow& r) {
         return r.run.exposed_input_share
                    ? fmt::format("{:.0f}%", 100 * *r.run.exposed_input_share)
                    : std::string("-");
       }},
      {"busbw GB/s", [](const ComparisonRow& r) { return fmt_opt(r.run.busbw_gbps, "{:.2f}"); }},
      {"noise scale",
       [](const ComparisonRow& r) { return fmt_opt(r.run.noise_b_simple, "{:.0f}"); }},
      {"MFU",
       [](const ComparisonRow& r) {
         return r.run.mfu ? fmt::format("{:.3g}%", 100 * *r.run.mfu) : std::string("-");
       }},
      {"straggler",
       [](const ComparisonRow& r) {
         return r.run.straggler.empty() ? std::string("-") : r.run.straggler;
       }},
      {"status", [](const ComparisonRow& r) { return r.run.status; }},
  };
  return cols;
}

}  // namespace

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

namespace {
// Fields kept per record: dtrain's CSV files have at most a few dozen columns; a hostile file
// of commas costs no more than this many strings a line.
constexpr size_t kMaxCsvFields = 64;
}  // namespace

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    any = true;
    if (quoted) {
      if (ch != '"') {
        field += ch;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      if (row.size() < kMaxCsvFields) row.push_back(std::move(field));
      field.clear();
    } else if (ch == '\n') {
      // Blank lines hold no record (a file of newlines costs nothing).
      if (!row.empty() || !field.empty()) {
        row.push_back(std::move(field));
        rows.push_back(std::move(row));
      }
      field.clear();
      row.clear();
      any = false;
    } else if (ch != '\r') {
      field += ch;
    }
  }
  if (any) {
    row.push_back(std::move(field));
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {
int64_t param_count_of(const nlohmann::json& j, const std::string& path) {
  // 0 where the run failed before its model was built; then the description, if any.
  const int64_t given = int_in(j, "param_count", 0, int64_t{1000000000000}, 0, path);
  if (given > 0) return given;
  if (!j.contains("model") || !j["model"].is_string()) return 0;
  // Older folders: the model description ends "(N parameters)". Read by hand (a regex on a
  // hostile string of digits recurses once per digit).
  std::string model = j["model"].get<std::string>();
  while (!model.empty() && std::isspace(static_cast<unsigned char>(model.back()))) model.pop_back();
  const std::string tail = " parameters)";
  if (model.size() <= tail.size() || model.compare(model.size() - tail.size(), tail.size(), tail))
    return 0;
  const size_t end = model.size() - tail.size();
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(model[begin - 1]))) --begin;
  if (begin == end || begin == 0 || model[begin - 1] != '(' || end - begin > 15) return 0;
  return std::strtoll(model.c_str() + begin, nullptr, 10);
}

// Whether a run's replicas shared one machine's CPU cores or one GPU: in-process CPU replicas
// (threads or shared weights; folders from before `replica_mode` say "as threads"), CPU
// processes on one host, or colocated GPU replicas.
bool simulated_run(const nlohmann::json& j, int gpus) {
  if (gpus <= 1) return false;
  const std::string devices = j.value("devices", std::string());
  const std::string mode = j.value("replica_mode", std::string());
  const auto has = [&](const char* s) { return devices.find(s) != std::string::npos; };
  if (has("(colocated)")) return true;
  if (!devices.starts_with("cpu:")) return false;
  if (mode == "threads" || mode == "shared" || has(" as threads")) return true;
  // Processes: "; mpirun (Open MPI), 1 host: node0" on one machine.
  return (mode == "processes" || has(" as processes")) && !has(" hosts:");
}

}  // namespace

namespace {
// summary.json's "stragglers" (an array, by the type check) in a few words: the rank and phase
// named most often (the first of equals), or "none". Entries without a whole rank from 0 and
// one of the phases dtrain names (straggler.hpp) are not counted.
std::string straggler_text(const nlohmann::json& epochs, int epochs_completed) {
  std::map<std::pair<int64_t, std::string>, int> count;
  for (const auto& e : epochs) {
    if (!e.is_object() || !e.contains("rank") || !e["rank"].is_number_integer() ||
        !e.contains("phase") || !e["phase"].is_string())
      continue;
    const auto rank = e["rank"].get<int64_t>();
    const auto phase = e["phase"].get<std::string>();
    if (rank < 0 || !straggler_phase_code(phase)) continue;
    ++count[{rank, phase}];
  }
  if (count.empty()) return "none";
  auto best = count.begin();
  for (auto it = count.begin(); it != count.end(); ++it)
    if (it->second > best->second) best = it;
  return fmt::format("rank {}, {}, {} of {} epochs", best->first.first, best->first.second,
                     best->second, std::max(epochs_completed, best->second));
}
}  // namespace

namespace {
// A count of summary.json that may be null: absent or null, none; else a whole number from 0 to
// `hi`, or the file is named as damaged.
std::optional<double> opt_count(const nlohmann::json& j, const char* key, double hi,
                                const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const double v = j[key].is_number() ? j[key].get<double>() : -1;
  if (!(v >= 0 && v <= hi && std::floor(v) == v))
    throw UserError(
        fmt::format("{}: '{}' is {}; expected a whole number from 0 to {} (a "
                    "damaged file?)",
                    path, key, json_text(j[key]).substr(0, 40), hi));
  return v;
}

// Where the run reached its targets: epochs, steps and samples, and the steps that is known to
// within; none past the epoch in progress when the summary was written (a damaged file).
void read_to_target(const nlohmann::json& j, const std::string& path, RunRecord& r) {
  namespace k = summary_key;
  r.epochs_to_target = opt_count(j, k::epochs_to_target, 1e5, path);
  r.steps_to_target = opt_count(j, k::steps_to_target, 0x1p50, path);
  r.samples_to_target = opt_count(j, k::samples_to_target, 0x1p60, path);
  r.target_resolution_steps = opt_count(j, k::target_resolution_steps, 0x1p50, path);
  const auto trained = static_cast<double>(r.steps_per_epoch) * (r.epochs_completed + 1);
  if (r.steps_to_target && r.steps_per_epoch > 0 && *r.steps_to_target > trained)
    throw UserError(fmt::format("{}: 'steps_to_target' is {}, past the {} steps the run can have "
                                "trained (a damaged file?)",
                                path, *r.steps_to_target, trained));
  if (r.target_resolution_steps && *r.target_resolution_steps < 1) r.target_resolution_steps.reset();
  // A target is checked after a step: a run that reached one took a step at least, in an
  // epoch of a step at least (summaries from before steps_per_epoch have none: 0, not checked).
  for (const auto& [key, v] : {std::pair{k::steps_to_target, r.steps_to_target},
                               std::pair{k::epochs_to_target, r.epochs_to_target}})
    if (v && *v < 1)
      throw UserError(fmt::format("{}: '{}' is 0; a run reaches its target after a step at "
                                  "least (a damaged file?)",
                                  path, key));
  if ((r.steps_to_target || r.epochs_to_target) && j.contains(k::steps_per_epoch) &&
      r.steps_per_epoch < 1)
    throw UserError(fmt::format("{}: 'steps_per_epoch' is 0 in a run that reached its target "
                                "(a damaged file?)",
                                path));
}
}  // namespace

// A run folder's own name, also for "runs/x/" and ".".
std::string folder_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (p.empty() || p.filename() == "." || p.filename() == "..")
    p = std::filesystem::weakly_canonical(p.empty() ? "." : p);
  return p.filename().string();
}

namespace {
// What summary.json says that goes into tables as it is: text without control characters or a
// table's '|' (the run id, the folder's name, too), accuracies in [0, 1], times and rates
// finite and >= 0. A file that says otherwise was not written by dtrain.
void check_values(const RunRecord& r, const std::string& path) {
  const auto damaged = [&](const std::string& what) {
    throw UserError(fmt::format("{}: {} (a damaged file?)", path, what));
  };
  // The run's id is its folder's name (a folder copied under another name is that name, not
  // the summary's), shown in tables as it is.
  if (has_control_character(r.run_id) || r.run_id.find('|') != std::string::npos)
    throw UserError(
        fmt::format("{}: the run folder's name holds a control character or '|'; "
                    "rename the folder",
                    path));
  // The experiment's name heads its section, never a cell: a '|' in it (a name the config
  // takes) is text there.
  if (has_control_character(r.experiment)) damaged("'experiment' holds a control character");
  for (const auto& [key, text] : {std::pair{"status", &r.status},
                                  {"group", &r.group},
                                  {"lr_scaling", &r.lr_scaling},
                                  {"reduction", &r.reduction},
                                  {"shuffle", &r.shuffle},
                                  {"sharding", &r.sharding}})
    if (has_control_character(*text) || text->find('|') != std::string::npos)
      damaged(fmt::format("'{}' holds a control character or '|'", key));
  for (const auto& [key, v] : {std::pair{"final_test_accuracy", r.final_test_acc},
                               {"best_test_accuracy", r.best_test_acc}})
    if (v && !(*v >= 0 && *v <= 1)) damaged(fmt::format("'{}' is {}, not in [0, 1]", key, *v));
  for (const auto& [key, v] : {std::pair{"median_epoch_time_s", r.median_epoch_time_s},
                               {"samples_per_s", r.samples_per_s},
                               {"time_to_target_s", r.time_to_target_s}})
    if (v && !(std::isfinite(*v) && *v >= 0 && *v < 1e15))
      damaged(fmt::format("'{}' is {}, not a time or rate", key, *v));
  if (!std::isfinite(r.peak_lr) || !std::isfinite(r.lr)) damaged("an LR that is not finite");
  // A share of a peak: above 1 only where the peak was measured low (the CPU's SGEMM).
  if (r.mfu && !(*r.mfu >= 0 && *r.mfu <= 10))
    damaged(fmt::format("'utilisation.mfu' is {}, not a share of a peak", *r.mfu));
}

// summary.json's text as JSON. dtrain writes a few levels around the config, which nests as
// deep as its blocks do; a deeper file is refused before anything walks it recursively (dumping
// a million nested arrays overflows the stack), and so is a key given twice in one object.
nlohmann::json parse_summary(const std::string& text, const std::string& path) {
  try {
    JsonKeys keys;
    return nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t event,
                                           nlohmann::json& parsed) {
      if (depth > kMaxSummaryDepth)
        throw UserError(fmt::format("{}: nested deeper than {} levels (a damaged file?)", path,
                                    kMaxSummaryDepth));
      if (const std::string key = keys.repeated(event, parsed); !key.empty())
        throw UserError(fmt::format("{}: key '{}' given twice in one object (a damaged file?)",
                                    path, printable(key.substr(0, 40), true)));
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: corrupt JSON: {}", path, json_error_text(e.what())));
  }
}
}  // namespace

RunRecord load_run(const std::string& dir) {
  namespace k = summary_key;
  const std::string path = (std::filesystem::path(dir) / "summary.json").string();
  std::error_code ec;  // a link loop is said by read_own_file, never thrown as a filesystem_error
  if (!std::filesystem::exists(path, ec) && !ec)
    throw UserError(fmt::format("{}: missing (the run may still be running or was killed)", path));
  const nlohmann::json j =
      parse_summary(read_own_file(path, "summary.json", kMaxSummaryBytes), path);
  if (const std::string bad = summary_type_error(j); !bad.empty())
    throw UserError(fmt::format("{}: {} (a damaged file?)", path, bad));
  RunRecord r;
  r.dir = dir;
  try {
    r.run_id = folder_name(dir);
    r.experiment = j.value(k::experiment, std::string());
    r.status = j.value(k::status, std::string("unknown"));
    r.error = j.value(k::error, std::string());
    r.group = j.value(k::group, std::string());
    // Speedup, efficiency and the figures divide by it.
    if (!j.contains(k::gpus)) throw UserError(fmt::format("{}: no 'gpus'", path));
    r.gpus = static_cast<int>(int_in(j, k::gpus, 1, 1 << 20, 1, path));
    // Summaries without the field are version 1 (see run_schema.hpp).
    r.schema_version =
        static_cast<int>(int_in(j, k::schema_version, 1, 1 << 20, kSummaryVersion, path));
    r.simulated = simulated_run(j, r.gpus);
    r.per_replica_batch = int_in(j, k::per_replica_batch, 1, int64_t{1} << 40, 0, path);
    r.global_batch = int_in(j, k::global_batch, 1, int64_t{1} << 50, 0, path);
    r.accumulation_steps = static_cast<int>(int_in(j, k::accumulation_steps, 1, 1 << 20, 1, path));
    r.lr_scaling = j.value(k::lr_scaling, std::string());
    r.reduction = j.value(k::reduction, std::string());
    r.shuffle = j.value(k::shuffle, std::string());
    r.sharding = j.value(k::sharding, std::string());
    r.peak_lr = j.value(k::peak_lr, 0.0);
    r.lr = j.value(k::lr, 0.0);
    r.target_accuracy = j.value(k::target_accuracy, 0.0);
    r.target_loss = j.value(k::target_loss, 0.0);
    r.epochs_completed = static_cast<int>(int_in(j, k::epochs_completed, 0, 100000, 0, path));
    r.steps_per_epoch = int_in(j, k::steps_per_epoch, 0, int64_t{1} << 50, 0, path);
    r.param_count = param_count_of(j, path);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: unexpected content: {}", path, json_error_text(e.what())));
  }
  r.final_test_acc = opt_number(j, k::final_test_accuracy);
  r.best_test_acc = opt_number(j, k::best_test_accuracy);
  r.final_train_loss = opt_number(j, k::final_train_loss);
  r.final_test_loss = opt_number(j, k::final_test_loss);
  r.median_epoch_time_s = opt_number(j, k::median_epoch_time_s);
  r.samples_per_s = opt_number(j, k::samples_per_s);
  r.time_to_target_s = opt_number(j, k::time_to_target_s);
  read_to_target(j, path, r);
  r.busbw_gbps = opt_number(j, k::busbw_gbps);
  r.exposed_exchange_share = opt_number(j, k::exposed_exchange_share);
  r.exposed_input_share = opt_number(j, k::exposed_input_share);
  r.other_cores_max = opt_number(j, k::other_cores_max);
  if (j.contains(k::noise_scale) && j[k::noise_scale].is_object())
    r.noise_b_simple = opt_number(j[k::noise_scale], "b_simple");
  if (r.noise_b_simple && *r.noise_b_simple <= 0) r.noise_b_simple.reset();
  if (j.contains(k::config) && j[k::config].is_object()) r.config = config_values(j[k::config]);
  if (j.contains(k::utilisation) && j[k::utilisation].is_object())
    r.mfu = opt_number(j[k::utilisation], "mfu");
  if (j.contains(k::stragglers)) r.straggler = straggler_text(j[k::stragglers], r.epochs_completed);
  check_values(r, path);
  return r;
}

Comparison compare(const std::vector<RunRecord>& runs, const std::string& baseline) {
  Comparison c;
  if (!runs.empty()) c.experiment = runs.front().experiment;
  const RunRecord* fixed = nullptr;
  if (!baseline.empty()) {
    for (const auto& b : runs) {
      // Two results folders can hold runs of one name (the same tag): which is meant is not
      // for the report to guess.
      if (b.run_id == baseline && fixed)
        throw UserError(
            fmt::format("--baseline {}: two runs have this name ({} and {}); report "
                        "them apart, or copy one to a folder of another name",
                        baseline, fixed->dir, b.dir));
      if (b.run_id == baseline) fixed = &b;
    }
    if (!fixed)
      throw UserError(fmt::format("--baseline {}: no such run among the {} runs of '{}'", baseline,
                                  runs.size(), c.experiment));
  }
  for (const auto& r : runs) {
    if (!r.in_table) continue;
    const RunRecord* base = fixed;
    int fewest = r.gpus;  // the fewest replicas of any run in r's group, finished or not
    for (const auto& b : runs) {
      if (fixed) break;
      if ((b.group != r.group && !b.group_unknown) || b.experiment != r.experiment) continue;
      if (b.gpus > 0) fewest = std::min(fewest, b.gpus);  // 0: running, or not known
      if (b.status == "done" && (!base || b.gpus < base->gpus)) base = &b;
    }
    // Where the group's run of fewest replicas did not finish (it failed, diverged or was
    // stopped), a run with no finished run of fewer replicas has nothing to be compared with:
    // not its own baseline at 1.00x, nor one of more replicas.
    if (!fixed && base && base->gpus > fewest && base->gpus >= r.gpus) base = nullptr;
    ComparisonRow row{r, base ? base->run_id : "", {}, {}, {}};
    if (base && r.status == "done") {
      if (base->samples_per_s && r.samples_per_s && *base->samples_per_s > 0) {
        row.speedup = *r.samples_per_s / *base->samples_per_s;
        row.efficiency = *row.speedup / (static_cast<double>(r.gpus) / base->gpus);
      }
      if (base->final_test_acc && r.final_test_acc)
        row.acc_delta_points = 100 * (*r.final_test_acc - *base->final_test_acc);
    }
    c.rows.push_back(std::move(row));
  }
  return c;
}

std::string to_markdown(const Comparison& c) {
  const auto& cols = columns();
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width;
  for (const auto& col : cols) width.push_back(std::string(col.title).size());
  for (const auto& row : c.rows) {
    std::vector<std::string> line;
    for (size_t i = 0; i < cols.size(); ++i) {
      line.push_back(cols[i].cell(row));
      width[i] = std::max(width[i], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  std::ostringstream out;
  auto emit = [&](const std::vector<std::string>& line) {
    out << "|";
    for (size_t i = 0; i < line.size(); ++i)
      out << " " << fmt::format("{:<{}}", line[i], width[i]) << " |";
    out << "\n";
  };
  std::vector<std::string> head;
  for (const auto& col : cols) head.push_back(col.title);
  emit(head);
  out << "|";
  for (size_t w : width) out << std::string(w + 2, '-') << "|";
  out << "\n";
  for (const auto& line : cells) emit(line);
  // One line per distinct baseline, naming the runs it serves.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& row : c.rows) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == row.baseline; });
    if (it == groups.end()) {
      groups.push_back({row.baseline, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(row.run.run_id);
  }
  out << "\nSpeedup is the ratio of training samples per second; efficiency is speedup divided "
         "by the ratio of replica counts.\n";
  std::vector<std::string> simulated;
  for (const auto& row : c.rows)
    if (row.run.simulated) simulated.push_back(row.run.run_id);
  if (!simulated.empty())
    out << "Simulated on one machine (replicas sharing its CPU cores, or one GPU): "
        << fmt::format("{}", fmt::join(simulated, ", "))
        << ". Their speedup is what simulating N replicas costs here, not what N devices would "
           "give; `dtrain project` predicts that.\n";
  std::vector<std::string> one_epoch;
  for (const auto& row : c.rows)
    if (row.run.epochs_completed == 1 && row.speedup) one_epoch.push_back(row.run.run_id);
  if (!one_epoch.empty())
    out << "One epoch only: " << fmt::format("{}", fmt::join(one_epoch, ", "))
        << ". Such a time includes the start (memory touched for the first time, kernels "
           "generated), which more epochs spread out; speedups from one epoch say little.\n";
  std::vector<std::string> shared;  // runs whose cores other work took (other_cores)
  for (const auto& row : c.rows)
    if (row.run.other_cores_max.value_or(0) >= kOtherCoresWarn)
      shared.push_back(fmt::format("{} ({:.1f} cores)", row.run.run_id, *row.run.other_cores_max));
  if (!shared.empty())
    out << "Other work kept cores of this machine busy during: "
        << fmt::format("{}", fmt::join(shared, ", "))
        << ". Those times are slower than on an idle machine, and the speedups and efficiencies "
           "built on them say more about the machine than about the runs.\n";
  for (const auto& [base, ids] : groups) {
    if (base.empty())
      out << "No finished run to compare with for: " << fmt::format("{}", fmt::join(ids, ", "))
          << ".\n";
    else
      out << "Baseline " << base << " for: " << fmt::format("{}", fmt::join(ids, ", ")) << ".\n";
  }
  return out.str();
}

std::string to_csv(const Comparison& c) {
  const auto& cols = columns();
  std::string out;
  for (size_t i = 0; i < cols.size(); ++i) {
    if (i) out += ",";
    out += csv_escape(cols[i].title);
  }
  out += "\n";
  for (const auto& row : c.rows) {
    for (size_t i = 0; i < cols.size(); ++i) {
      if (i) out += ",";
      out += csv_escape(cols[i].cell(row));
    }
    out += "\n";
  }
  return out;
}

std::string to_json(const Comparison& c) {
  nlohmann::json rows = nlohmann::json::array();
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  for (const auto& row : c.rows) {
    const auto& r = row.run;
    const auto read = [&](auto v) { return r.gpus > 0 ? nlohmann::json(v) : nlohmann::json(); };
    rows.push_back({{"run_id", r.run_id},
                    {"dir", r.dir},
                    {"group", r.group},
                    {"status", r.status},
                    {"error", r.error},
                    {"gpus", read(r.gpus)},
                    {"per_replica_batch", read(r.per_replica_batch)},
                    {"global_batch", read(r.global_batch)},
                    {"lr", read(r.lr)},
                    {"lr_scaling", r.lr_scaling},
                    {"peak_lr", read(r.peak_lr)},
                    {"reduction", r.reduction},
                    {"shuffle", r.shuffle},
                    {"sharding", r.sharding},
                    {"final_test_accuracy", opt(r.final_test_acc)},
                    {"best_test_accuracy", opt(r.best_test_acc)},
                    {"final_train_loss", opt(r.final_train_loss)},
                    {"final_test_loss", opt(r.final_test_loss)},
                    {"median_epoch_time_s", opt(r.median_epoch_time_s)},
                    {"samples_per_s", opt(r.samples_per_s)},
                    {"time_to_target_s", opt(r.time_to_target_s)},
                    {"noise_b_simple", opt(r.noise_b_simple)},
                    {"mfu", opt(r.mfu)},
                    {"straggler", r.straggler},
                    {"busbw_gbps", opt(r.busbw_gbps)},
                    {"exposed_exchange_share", opt(r.exposed_exchange_share)},
                    {"exposed_input_share", opt(r.exposed_input_share)},
                    {"target_accuracy", r.target_accuracy},
                    {"target_loss", r.target_loss},
                    {"baseline", row.baseline},
                    {"speedup", opt(row.speedup)},
                    {"efficiency", opt(row.efficiency)},
                    {"acc_delta_points", opt(row.acc_delta_points)}});
  }
  nlohmann::json j{{"experiment", c.experiment}, {"runs", rows}};
  return json_text(j, 2) + "\n";
}

void check_by_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> valid;
  for (const auto& k : schema_keys()) valid.push_back(k.key);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    if (std::find(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(i), key) !=
        keys.begin() + static_cast<std::ptrdiff_t>(i))
      throw UserError(fmt::format("--by {}: given twice", key));
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    const auto guess = closest_match(key, valid);
    throw UserError(fmt::format("--by {}: unknown config key{}; valid keys: {}", key,
                                guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
                                fmt::join(valid, ", ")));
  }
}

std::map<std::string, std::string> run_config_values(const RunRecord& r) {
  // Written before summary.json carried the config: the resolved YAML has every value.
  auto values = !r.config.empty() ? r.config
                                  : config_values(load_config(
                                        (std::filesystem::path(r.dir) / "config.resolved.yaml")
                                            .string()));
  // A key dtrain gained after the run was written: the run had its default (a new key's
  // default keeps what dtrain did before it), so such a run still joins its seeds' row.
  for (const KeyInfo& k : schema_keys()) values.try_emplace(k.key, k.default_value);
  return values;
}

Stat stat_of(const std::vector<double>& values) {
  Stat s;
  double sum = 0;
  for (double v : values)
    if (std::isfinite(v)) {
      sum += v;
      ++s.n;
    }
  if (s.n == 0) return s;
  s.mean = sum / s.n;
  if (s.n < 2) return s;
  double sq = 0;
  for (double v : values)
    if (std::isfinite(v)) sq += (v - *s.mean) * (v - *s.mean);
  s.sd = std::sqrt(sq / (s.n - 1));
  return s;
}

WelchTest test_of(const Stat& base, const Stat& other, double scale) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto sample = [&](const Stat& s) {
    return Sample{s.mean ? *s.mean * scale : nan, s.sd ? *s.sd * std::abs(scale) : nan, s.n};
  };
  return welch_test(sample(base), sample(other));
}

std::string difference_text(const WelchTest& w, int digits) {
  if (std::isnan(w.diff)) return "-";
  if (w.kind != WelchTest::Kind::welch) return fmt::format("{:+.{}f}", w.diff, digits);
  return fmt::format("{:+.{}f} [{:+.{}f}, {:+.{}f}]", w.diff, digits, w.ci_low, digits,
                     w.ci_high, digits);
}

std::string verdict_text(const WelchTest& w, const char* unit) {
  if (w.kind == WelchTest::Kind::exact)
    return w.distinguishable ? "exact (sd 0), different" : "exact (sd 0), no difference";
  if (w.kind != WelchTest::Kind::welch) return "-";
  const auto p_text = [](double p) {
    return p < 0.001 ? std::string("<0.001") : fmt::format("={:.3g}", p);
  };
  const std::string p =
      w.family > 1 ? fmt::format("p{}, Holm p{} of {}", p_text(w.p), p_text(w.p_holm), w.family)
                   : "p" + p_text(w.p);
  if (w.distinguishable) return p;
  const std::string counts = w.n_a == w.n_b ? fmt::format("{} {}", w.n_a, unit)
                                            : fmt::format("{} and {} {}", w.n_a, w.n_b, unit);
  const std::string more = w.diff == 0 ? std::string("the means are equal")
                           : w.seeds_needed > kSeedsCap
                               ? fmt::format("more than {} needed", kSeedsCap)
                               : fmt::format("{} would resolve it", w.seeds_needed);
  // seeds_needed is for this comparison alone, at 5%: Holm's correction asks for more.
  return fmt::format("{}, not distinguishable at {} ({}{})", p, counts, more,
                     w.family > 1 && w.diff != 0 ? " for this comparison alone" : "");
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

namespace {

const char* test_kind(const WelchTest& w) {
  switch (w.kind) {
    case WelchTest::Kind::welch: return "welch";
    case WelchTest::Kind::exact: return "exact";
    case WelchTest::Kind::too_few: return "too_few";
    case WelchTest::Kind::invalid: break;
  }
  return "invalid";
}

}  // namespace

nlohmann::json test_json(const WelchTest& w) {
  nlohmann::json j = {{"test", test_kind(w)},
                      {"n", {w.n_a, w.n_b}},
                      {"distinguishable", nullptr},
                      {"p", number_or_null(w.p)},
                      {"ci_low", number_or_null(w.ci_low)},
                      {"ci_high", number_or_null(w.ci_high)},
                      {"se", number_or_null(w.se)},
                      {"df", number_or_null(w.df)},
                      {"mdd", number_or_null(w.mdd)},
                      {"seeds_needed", nullptr},
                      {"seeds_needed_over_cap", w.seeds_needed > kSeedsCap},
                      {"family", w.family},
                      {"p_holm", number_or_null(w.p_holm)}};
  if (w.tested()) j["distinguishable"] = w.distinguishable;
  if (w.seeds_needed > 0 && w.seeds_needed <= kSeedsCap) j["seeds_needed"] = w.seeds_needed;
  return j;
}

namespace {

struct AggregateInput {
  const RunRecord* run;
  std::map<std::string, std::string> config;
};

std::string value_or_empty(const std::map<std::string, std::string>& m, const std::string& k) {
  const auto it = m.find(k);
  return it == m.end() ? "" : it->second;
}

// The keys, in schema order, whose values differ between the rows' first runs.
std::vector<std::string> distinguishing_keys(const std::vector<const AggregateInput*>& firsts,
                                             const std::vector<std::string>& by) {
  std::vector<std::string> keys;
  for (const auto& k : schema_keys()) {
    if (std::find(by.begin(), by.end(), k.key) != by.end()) continue;
    const std::string first = value_or_empty(firsts.front()->config, k.key);
    for (const auto* f : firsts)
      if (value_or_empty(f->config, k.key) != first) {
        keys.push_back(k.key);
        break;
      }
  }
  return keys;
}

// Runs that may join a row: finished, with a readable config. The others are named.
std::vector<AggregateInput> aggregate_inputs(const std::vector<RunRecord>& runs,
                                             std::vector<std::string>& left_out) {
  std::vector<AggregateInput> in;
  for (const auto& r : runs) {
    if (r.status != "done" && r.status != "diverged") {
      left_out.push_back(fmt::format("{} ({})", r.run_id, r.status));
      continue;
    }
    try {
      in.push_back({&r, run_config_values(r)});
    } catch (const UserError& e) {
      left_out.push_back(fmt::format("{} (no config: {})", r.run_id, e.what()));
    }
  }
  return in;
}

}  // namespace

Aggregate aggregate(const std::vector<RunRecord>& runs, const std::vector<std::string>& by) {
  Aggregate a;
  if (!runs.empty()) a.experiment = runs.front().experiment;
  a.by = by;
  const auto in = aggregate_inputs(runs, a.left_out);
  // A row is every config value but the --by keys'; rows keep the order of their first run.
  std::vector<std::string> row_keys;
  std::vector<std::vector<const AggregateInput*>> members;
  for (const auto& r : in) {
    std::string key;
    for (const auto& [k, v] : r.config)
      if (std::find(by.begin(), by.end(), k) == by.end()) key += k + '\n' + v + '\n';
    const auto it = std::find(row_keys.begin(), row_keys.end(), key);
    if (it == row_keys.end()) {
      row_keys.push_back(key);
      members.push_back({&r});
    } else {
      members[static_cast<size_t>(it - row_keys.begin())].push_back(&r);
    }
  }
  std::vector<const AggregateInput*> firsts;
  for (const auto& m : members) firsts.push_back(m.front());
  if (!firsts.empty()) a.settings = distinguishing_keys(firsts, by);
  for (const auto& m : members) {
    AggregateRow row;
    for (const auto& k : a.settings) row.settings.push_back(value_or_empty(m.front()->config, k));
    row.by_values.resize(by.size());
    std::vector<double> acc, best, loss, time;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const auto* r : m) {
      row.run_ids.push_back(r->run->run_id);
      for (size_t i = 0; i < by.size(); ++i)
        row.by_values[i].push_back(value_or_empty(r->config, by[i]));
      acc.push_back(r->run->final_test_acc.value_or(nan));
      best.push_back(r->run->best_test_acc.value_or(nan));
      loss.push_back(r->run->final_train_loss.value_or(nan));
      time.push_back(r->run->median_epoch_time_s.value_or(nan));
    }
    row.final_test_acc = stat_of(acc);
    row.best_test_acc = stat_of(best);
    row.final_train_loss = stat_of(loss);
    row.median_epoch_time_s = stat_of(time);
    a.rows.push_back(std::move(row));
  }
  std::vector<WelchTest*> acc_family, loss_family;
  for (size_t i = 1; i < a.rows.size(); ++i) {
    a.rows[i].final_test_acc_test =
        test_of(a.rows[0].final_test_acc, a.rows[i].final_test_acc, 100);
    a.rows[i].final_train_loss_test =
        test_of(a.rows[0].final_train_loss, a.rows[i].final_train_loss, 1);
    acc_family.push_back(&a.rows[i].final_test_acc_test);
    loss_family.push_back(&a.rows[i].final_train_loss_test);
  }
  // Several rows against the first are several chances of a false "different": Holm's
  // correction keeps the chance of any at 5% per column.
  holm_correct(acc_family);
  holm_correct(loss_family);
  return a;
}

namespace {

// One cell of an aggregate row: the text writers (Markdown, CSV) use title and text, the JSON
// writer key and value, so every format shows the same fields.
struct Field {
  std::string title, key, text;
  nlohmann::json value;
};

nlohmann::json opt_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// A mean over fewer of the row's `runs` than all (a diverged run's loss is not finite) says
// over how many: "2.3026 (6 of 12)".
void add_stat(std::vector<Field>& f, const std::string& title, const std::string& key,
              const Stat& s, double scale, const char* spec, const char* unit, size_t runs) {
  const auto text = [&](const std::optional<double>& v) {
    return v ? fmt::format(fmt::runtime(spec), scale * *v) + unit : std::string("-");
  };
  const std::string of =
      s.mean && static_cast<size_t>(s.n) < runs ? fmt::format(" ({} of {})", s.n, runs) : "";
  f.push_back({title + " mean", key + "_mean", text(s.mean) + of, opt_json(s.mean)});
  f.push_back({title + " sd", key + "_sd",
               s.sd ? fmt::format(fmt::runtime(spec), scale * *s.sd) : std::string("-"),
               opt_json(s.sd)});
}

// Rows after the first are tested against it where there are rows to compare and seeds.
bool has_tests(const Aggregate& a) {
  if (a.rows.size() < 2) return false;
  for (const auto& r : a.rows)
    if (r.final_test_acc.n >= 2 || r.final_train_loss.n >= 2) return true;
  return false;
}

// The difference from the first row with its CI, and what the test says, as two columns;
// accuracies in points (the JSON's too: "_diff_points").
void add_test(std::vector<Field>& f, const std::string& title, const std::string& key,
              const WelchTest& w, bool points, bool first) {
  const std::string diff_title =
      title + (points ? " vs first (pts) [95% CI]" : " vs first [95% CI]");
  const std::string diff_key = key + (points ? "_diff_points" : "_diff");
  if (first) {
    f.push_back({diff_title, diff_key, "-", nullptr});
    f.push_back({title + " p", key + "_test", "-", nullptr});
    return;
  }
  f.push_back({diff_title, diff_key, difference_text(w, points ? 2 : 4), number_or_null(w.diff)});
  f.push_back({title + " p", key + "_test", verdict_text(w, "runs"), test_json(w)});
}

std::vector<Field> aggregate_fields(const Aggregate& a, const AggregateRow& r) {
  std::vector<Field> f;
  for (size_t i = 0; i < a.settings.size(); ++i)
    f.push_back({a.settings[i], a.settings[i], r.settings[i], r.settings[i]});
  f.push_back({"runs", "count", std::to_string(r.run_ids.size()), r.run_ids.size()});
  for (size_t i = 0; i < a.by.size(); ++i)
    f.push_back(
        {a.by[i], a.by[i], fmt::format("{}", fmt::join(r.by_values[i], ", ")), r.by_values[i]});
  // Accuracies in percent, their standard deviations in percentage points.
  const bool tests = has_tests(a), first = a.rows.empty() || &r == &a.rows.front();
  const size_t runs = r.run_ids.size();
  add_stat(f, "final test acc", "final_test_accuracy", r.final_test_acc, 100, "{:.2f}", "%", runs);
  if (tests)
    add_test(f, "final test acc", "final_test_accuracy", r.final_test_acc_test, true, first);
  add_stat(f, "best test acc", "best_test_accuracy", r.best_test_acc, 100, "{:.2f}", "%", runs);
  add_stat(f, "final train loss", "final_train_loss", r.final_train_loss, 1, "{:.4f}", "", runs);
  if (tests)
    add_test(f, "final train loss", "final_train_loss", r.final_train_loss_test, false, first);
  add_stat(f, "median epoch s", "median_epoch_time_s", r.median_epoch_time_s, 1, "{:.3f}", "",
           runs);
  f.push_back({"run ids", "run_ids", fmt::format("{}", fmt::join(r.run_ids, ", ")), r.run_ids});
  return f;
}

// Text as one cell of a Markdown table: controls as \xHH (printable; a newline would end the
// row), '|' escaped (it would start another cell), and '\' (it would escape what follows).
// Config values reach --by tables as written.
std::string md_cell(const std::string& text) {
  std::string out;
  for (const char c : printable(text, true)) {
    if (c == '|' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// The titles of a table's columns: those of a row, or of an empty one.
std::vector<std::string> aggregate_titles(const Aggregate& a) {
  AggregateRow empty;
  empty.settings.resize(a.settings.size());
  empty.by_values.resize(a.by.size());
  std::vector<std::string> titles;
  for (const auto& f : aggregate_fields(a, a.rows.empty() ? empty : a.rows.front()))
    titles.push_back(f.title);
  return titles;
}

}  // namespace

std::string to_markdown(const Aggregate& a) {
  std::ostringstream out;
  const auto titles = aggregate_titles(a);
  out << "| " << fmt::format("{}", fmt::join(titles, " | ")) << " |\n|";
  for (size_t i = 0; i < titles.size(); ++i) out << "---|";
  out << "\n";
  for (const auto& row : a.rows) {
    std::vector<std::string> cells;
    for (const auto& f : aggregate_fields(a, row)) cells.push_back(md_cell(f.text));
    out << "| " << fmt::format("{}", fmt::join(cells, " | ")) << " |\n";
  }
  out << fmt::format(
      "\nRuns that differ only in {} form one row: mean and sample standard deviation (sd; "
      "accuracies in percentage points) over its runs; \"(k of n)\" after a mean: over k of "
      "the row's n runs, the others' values not finite (a diverged run's loss).\n",
      fmt::join(a.by, " and "));
  if (has_tests(a))
    out << "Each row after the first is compared with the first by Welch's t-test: the "
           "difference of the means with its 95% confidence interval, and the two-sided p-value; "
           "\"not distinguishable at K runs\" means p >= 0.05 (the corrected p where Holm's "
           "correction applies, below), with the runs per row that would "
           "resolve a difference this size at 95% confidence and 80% power. With more than two "
           "rows, each column's p-values are also Holm-corrected for the number of comparisons "
           "(\"Holm p=... of N\"), and that corrected p decides.\n";
  if (!a.left_out.empty())
    out << fmt::format("Left out: {}.\n",
                       printable(fmt::format("{}", fmt::join(a.left_out, "; "))));
  return out.str();
}

std::string to_csv(const Aggregate& a) {
  std::string out;
  const auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + csv_escape(cells[i]);
    out += "\n";
  };
  line(aggregate_titles(a));
  for (const auto& row : a.rows) {
    std::vector<std::string> cells;
    for (const auto& f : aggregate_fields(a, row)) cells.push_back(f.text);
    line(cells);
  }
  return out;
}

std::string to_json(const Aggregate& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : a.rows) {
    nlohmann::json j = nlohmann::json::object();
    for (auto& f : aggregate_fields(a, row)) j[f.key] = std::move(f.value);
    rows.push_back(std::move(j));
  }
  const nlohmann::json j{{"experiment", a.experiment},
                         {"by", a.by},
                         {"settings", a.settings},
                         {"rows", rows},
                         {"left_out", a.left_out}};
  return json_text(j, 2) + "\n";
}

namespace {
// Whether `dir` has an entry named status, of any kind: a link there (a loop even) marks a run
// folder that the report then names as unreadable, rather than ending the report.
bool has_status_entry(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(dir / "status", ec));
}

// Whether `dir` lies on a file system of the kernel's (/proc, /sys, cgroups): every process
// folder in /proc has a `status` file, which is not a run's.
bool kernel_filesystem(const std::filesystem::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return false;
  for (const auto magic : {PROC_SUPER_MAGIC, SYSFS_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC,
                           DEBUGFS_MAGIC, TRACEFS_MAGIC, SECURITYFS_MAGIC, DEVPTS_SUPER_MAGIC})
    if (st.f_type == static_cast<decltype(st.f_type)>(magic)) return true;
  return false;
}

// The run folders under `root` (hidden folders, links and the kernel's file systems are not
// entered: a report covers the folders under its paths). A folder that cannot be listed is the
// user's to fix, named.
void walk_run_dirs(const std::string& root, std::vector<std::string>& out,
                   std::vector<std::string>* linked) {
  namespace fs = std::filesystem;
  if (kernel_filesystem(root)) return;
  try {
    auto it = fs::recursive_directory_iterator(root);
    for (; it != fs::recursive_directory_iterator(); ++it) {
      const auto& e = *it;
      std::error_code ec;
      if (e.is_symlink() && linked && fs::is_directory(e.path(), ec))
        linked->push_back(e.path().string());
      if (e.is_symlink() || !e.is_directory()) continue;
      if (e.path().filename().string().rfind('.', 0) == 0 || kernel_filesystem(e.path())) {
        it.disable_recursion_pending();  // hidden (.attempts/ and the like), or /proc
        continue;
      }
      if (has_status_entry(e.path())) {
        out.push_back(e.path().string());
        it.disable_recursion_pending();
      } else if (it.depth() >= kMaxFolderDepth) {
        refuse_deep_folder(e.path(), root);
      }
    }
  } catch (const fs::filesystem_error& e) {
    throw UserError(fmt::format("{}: cannot list this folder: {}",
                                e.path1().empty() ? root : e.path1().string(),
                                e.code().message()));
  }
}
}  // namespace

void refuse_run_folder_output(const std::string& path, const std::string& option, bool folder) {
  namespace fs = std::filesystem;
  // What recorder.cpp, the trainer and the telemetry write into a run folder.
  static const char* const kRunFiles[] = {
      "summary.json",  "metrics.csv", "evals.csv",      "log",         "status",
      "overrides.txt", "devices.csv", "checkpoint.bin", "trace.json",  "config.resolved.yaml",
      "classes.txt",   "skipped-files.txt"};
  const fs::path p = fs::path(path).lexically_normal();
  if (folder && has_status_entry(p))
    throw UserError(fmt::format("{} {}: that is a run folder; write elsewhere, so that none of "
                                "the run's files is replaced",
                                option, path));
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string name = p.filename().string();
  if (!folder && has_status_entry(parent) &&
      std::find(std::begin(kRunFiles), std::end(kRunFiles), name) != std::end(kRunFiles))
    throw UserError(fmt::format("{} {}: that is the run's own {} in {}; write elsewhere",
                                option, path, name, parent.string()));
  // What `dtrain run` keeps beside the run folders: a tag's index (which --resume reads) and
  // its comparison table.
  const auto named = [&](std::string_view head, std::string_view tail) {
    return name.size() > head.size() + tail.size() && name.compare(0, head.size(), head) == 0 &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  // Only beside run folders: a file of such a name elsewhere is the user's own output.
  std::error_code ec;
  bool beside_runs = false;
  if (!folder && fs::exists(fs::symlink_status(p, ec)) &&
      (named("index-", ".csv") || named("comparison-", ".md") || named("comparison-", ".csv")))
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end && !beside_runs;
         it.increment(ec))
      beside_runs = it->is_directory(ec) && !it->is_symlink(ec) && has_status_entry(it->path());
  if (beside_runs)
    throw UserError(fmt::format("{} {}: that is {} in {}; write elsewhere", option, path,
                                named("index-", ".csv") ? "the index of a tag's runs, which "
                                                          "--resume reads,"
                                                        : "a tag's comparison table",
                                parent.string()));
}

std::vector<std::string> find_run_dirs(const std::vector<std::string>& paths,
                                       std::vector<std::string>* linked) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;  // a link loop is "not a folder", never a filesystem_error
    if (!fs::is_directory(p, ec))
      throw UserError(fmt::format("{}: {}", p,
                                  fs::exists(p, ec) || ec
                                      ? "not a folder (give a results folder or a run "
                                        "folder)"
                                      : "no such folder"));
    if (has_status_entry(p))
      out.push_back(p);
    else
      walk_run_dirs(p, out, linked);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<EpochRow> load_metrics(const std::string& dir) {
  const MetricsCsv csv = read_metrics_csv(dir);
  // Folders of every dtrain version have these; the columns added since are not needed here.
  const std::vector<std::string_view> names = {"epoch",     "lr",       "train_loss", "train_acc",
                                               "test_loss", "test_acc", "epoch_time_s"};
  csv.require(names);
  std::vector<EpochRow> rows;
  // Every column the file has is read, and so checked: a value no run writes is named.
  for (const EpochMetrics& m : read_epochs(csv, {}))
    rows.push_back({m.epoch, m.lr, m.train_loss, m.train_acc, m.test_loss, m.test_acc,
                    m.epoch_time_s});
  return rows;
}

}  // namespace dtrain
