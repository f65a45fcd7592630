// What several subcommands share: the config arguments, tags and loading each data set once.
#include <fmt/format.h>

#include <filesystem>
#include <new>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/train/trainer.hpp"  // check_plan

namespace dtrain::cli {

void add_config_arguments(CLI::App& app, std::string& config, std::vector<std::string>& overrides) {
  app.add_option("config", config, "Experiment YAML file")->required()->check(CLI::ExistingFile);
  app.add_option("overrides", overrides, "key=value overrides, as for `dtrain run`");
}

std::string one_line(const char* what) {
  return printable(what);
}

std::string failure_text(const std::exception& e) {
  // An allocation the estimates before training did not foresee, or a limit (ulimit -v, a
  // cgroup) below what the machine reports available.
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of memory (an allocation failed); a smaller batch, model or input (data.shape, "
           "data.block_size) needs "
           "less, and `dtrain validate` shows the estimate";
  return e.what();
}

void require_file_stem(const std::string& stem, const std::string& given) {
  namespace fs = std::filesystem;
  const fs::path p(stem);
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == ".." || (!given.empty() && given.back() == '/'))
    throw UserError(
        fmt::format("--out {}: a folder, not a file name; give FOLDER/NAME (NAME.json "
                    "and NAME.md are written)",
                    given));
}

CLI::Validator non_empty(const char* what) {
  return CLI::Validator(
      [what](std::string& v) {
        return v.empty() ? fmt::format("give {}, not an empty string", what) : std::string();
      },
      "", "NON_EMPTY");
}

std::string folder_tag(const std::string& given, const std::string& fallback) {
  if (given.empty()) return fallback;
  if (has_control_character(given)) {
    const std::string shown = printable(given, /*hex=*/true);
    throw UserError(fmt::format("--tag '{}': control characters are not allowed in a tag (it "
                                "names run folders)",
                                shown));
  }
  // The tag starts every run folder's name: visible to report, short enough for a file system.
  if (given.front() == '.' || given.size() > 100)
    throw UserError(fmt::format("--tag '{}': give 1 to 100 characters, not starting with '.'",
                                printable(given.substr(0, 120))));
  // A tag is every run folder's name as given: rewriting 'c%1' and 'c$1' alike would make two
  // tags one, and a --resume of either continue the other's runs.
  const std::string tag = slug(given);
  if (tag != given)
    throw UserError(
        fmt::format("--tag '{}': a tag names run folders, so it holds letters, "
                    "digits and . _ - + only (e.g. '{}')",
                    printable(given), tag));
  return tag;
}

namespace {

// "data.path: ...", "train: global batch ...": about keys of the file the user wrote, which the
// line names first.
[[noreturn]] void rethrow_naming_config(const std::string& config_path, const UserError& e) {
  const std::string what = e.what();
  // A message about the config's keys (not one naming a data file of its own): said of the file.
  for (const char* section : {"data", "train", "model", "optimizer", "precision", "replicas"}) {
    const std::string s = section;
    if (what.rfind(s, 0) == 0 && what.size() > s.size() &&
        (what[s.size()] == '.' || what[s.size()] == ':' || what[s.size()] == ' '))
      throw UserError(fmt::format("{}: {}", config_path, what));
  }
  throw;  // called inside the handler: the exception as it was
}

}  // namespace

DataSplit load_config_data(const std::string& config_path, const Config& c) {
  try {
    // Synthetic data's sizes and shape are the config's own: a batch or a model that cannot
    // run is refused before any sample is drawn (a minute and gigabytes for large shapes).
    if (c.data.dataset == DatasetKind::synthetic) check_plan(c, synthetic_outline(c.data));
    return load_data(c.data, c.train.seed);
  } catch (const UserError& e) {
    rethrow_naming_config(config_path, e);
  }
}

void check_config_plan(const std::string& config_path, const Config& c, const DataSplit& d) {
  try {
    check_plan(c, d);
  } catch (const UserError& e) {
    rethrow_naming_config(config_path, e);
  }
}

const DataSplit& DataCache::get(const Config& c) {
  const std::string key = data_identity(c.data, c.train.seed);
  if (key != key_) {
    data_ = load_config_data(config_, c);
    key_ = key;
  }
  return data_;
}

}  // namespace dtrain::cli
