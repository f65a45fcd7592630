// dtrain export-images: a config's in-memory image data written as a folder dataset (PNG or
// JPEG files in train/<class>/ and test/<class>/), to study input pipelines on data at hand and
// to check that the folder reader trains as the in-memory one does.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/data/image_folder.hpp"

namespace dtrain::cli {

namespace {
// `word` as one word of a POSIX shell command line: as it is where it holds only characters no
// shell treats specially, else in single quotes (a quote inside as '\''), so that a printed
// command run by copy and paste gets the path it names and nothing else.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || (ch && std::strchr("_./=:,+@%-", ch));
  });
  if (plain) return word;
  if (printable(word) != word) {  // a control, a mark that reorders text, invalid UTF-8
    // ANSI-C quoting ($'...', in bash, zsh, ksh and POSIX.1-2024 sh): a control character, and
    // any byte past ASCII (a C1 control, a mark that reorders text), as \xHH, never raw.
    std::string out = "$'";
    for (const char ch : word) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '\'' || ch == '\\')
        out += {'\\', ch};
      else if (u < 0x20 || u >= 0x7f)
        out += fmt::format("\\x{:02x}", u);
      else
        out += ch;
    }
    return out + "'";
  }
  std::string out = "'";
  for (const char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// `value` as the value of a key=value override that reads back as exactly this text: as it is
// where it is plain, else as a YAML double-quoted string (a comma would split it into a sweep
// list, " #" start a comment, a leading '[' make a list, "null" no value).
std::string override_value(const std::string& value) {
  const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || (ch && std::strchr("_./+@-", ch));
  });
  // A leading '-' or '@' means something else to YAML ("-" alone is a list).
  if (plain && value.front() != '-' && value.front() != '@' && value != "null" &&
      value != "Null" && value != "NULL")
    return value;
  std::string out = "\"";
  for (const char ch : value) {
    if (ch == '"' || ch == '\\')
      out += {'\\', ch};
    else if (static_cast<unsigned char>(ch) < 0x20)
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(ch));
    else
      out += ch;
  }
  return out + "\"";
}
// Removes the staging folders in `dir` named `prefix` and a process id whose process is gone:
// what an export killed outright (SIGKILL, a power cut) left behind.
void remove_stale_staging(const std::filesystem::path& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string pid = name.substr(std::min(name.size(), prefix.size()));
    if (name.rfind(prefix, 0) != 0 || pid.empty() || pid.size() > 9 ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::error_code e2;
    if ((::kill(std::stoi(pid), 0) == 0 || errno != ESRCH) || it->is_symlink(e2) ||
        !it->is_directory(e2))
      continue;  // alive (or not ours to tell), or not a folder an export makes
    fs::remove_all(it->path(), e2);
  }
}

// --out as an absolute path without a trailing separator ("." and "dir/.." name the folder
// itself).
std::filesystem::path out_folder(const std::string& out) {
  std::filesystem::path p = std::filesystem::absolute(out).lexically_normal();
  return p.filename().empty() ? p.parent_path() : p;
}

// The tree written into a hidden folder and put in place once whole, so that --out never
// holds part of a dataset: a failure (a full disk) or Ctrl-C removes what was written and
// names it. Into an --out that exists (empty; perhaps a shell's working folder, which a rename
// over it would leave deleted, or a mount point) the tree is written in --out/.export-PID and
// its two splits moved up, train/ last, since a folder dataset needs both; else beside it, in
// .NAME.export-PID, renamed to --out. Either way on --out's file system: a rename never copies.
// The number of images, or -1 where a stop signal ended the export.
int64_t export_whole(const DataSplit& s, const ExportOptions& opt) {
  namespace fs = std::filesystem;
  const fs::path out = out_folder(opt.out);
  std::error_code ec;
  const bool into = fs::is_directory(out, ec);
  const fs::path staging =
      into ? out / fmt::format(".export-{}", ::getpid())
           : out.parent_path() / fmt::format(".{}.export-{}", out.filename().string(), ::getpid());
  try {
    ensure_dir(staging.string(), "export");
    const int64_t n =
        write_image_tree(s.train, s.test, staging.string(),
                         opt.format == "jpeg" ? (opt.quality > 0 ? opt.quality : 95) : 0, opt.side);
    if (into) {
      fs::rename(staging / "test", out / "test", ec);
      if (!ec) fs::rename(staging / "train", out / "train", ec);
      std::error_code e2;
      if (ec) fs::remove_all(out / "test", e2);  // --out was empty: test/ alone is ours
      if (!ec) fs::remove(staging, ec);
    } else {
      fs::rename(staging, out, ec);
    }
    if (ec)
      throw UserError(fmt::format("{}: cannot rename the written tree {} to it: {}",
                                  printable(opt.out), printable(staging.string()), ec.message()));
    return n;
  } catch (const Interrupted&) {
    fs::remove_all(staging, ec);
    fmt::print(stderr, "dtrain: export-images stopped; nothing written at {}\n",
               printable(opt.out));
    return -1;
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}
}  // namespace

void setup_export(CLI::App& app, ExportOptions& opt) {
  add_config_arguments(app, opt.config, opt.overrides);
  app.add_option("--out", opt.out, "The folder to write (must not exist, or be empty)")
      ->required()
      ->check(non_empty());
  app.add_option("--format", opt.format, "png (lossless) or jpeg")
      ->check(CLI::IsMember({"png", "jpeg"}));
  app.add_option("--quality", opt.quality, "JPEG quality (default 95)")->check(CLI::Range(1, 100));
  app.add_option("--side", opt.side, "Resample each image to SIDE x SIDE pixels first")
      ->check(CLI::Range(1, 8192));
}

int run_export(const ExportOptions& opt) {
  const auto runs = plan_runs(opt.config, opt.overrides);
  DataConfig data = runs.front().config.data;
  if (data.dataset == DatasetKind::folder)
    throw UserError(
        fmt::format("{}: data.dataset is folder already; export-images writes "
                    "in-memory datasets (fashion-mnist, cifar10, synthetic, ...)",
                    opt.config));
  if (opt.quality > 0 && opt.format != "jpeg")
    throw UserError("--quality: only for --format jpeg (PNG files are lossless)");
  namespace fs = std::filesystem;
  std::error_code ec;
  // What an earlier export, killed outright, left in --out or beside it.
  const fs::path out = out_folder(opt.out);
  if (fs::is_directory(out, ec)) remove_stale_staging(out, ".export-");
  remove_stale_staging(out.parent_path(), "." + out.filename().string() + ".export-");
  if (fs::exists(opt.out, ec) && !(fs::is_directory(opt.out, ec) && fs::is_empty(opt.out, ec)))
    throw UserError(fmt::format("--out: '{}' exists and is not an empty folder", opt.out));
  data.normalize = Normalize::off;  // pixels in [0, 1], as stored
  data.sort_by_label = false;
  const DataSplit s = load_data(data, runs.front().config.train.seed);
  log().info("export: writing {} images ({} train, {} test){} as {} files",
             s.train.size() + s.test.size(), s.train.size(), s.test.size(),
             opt.side > 0 ? fmt::format(" resampled to {0}x{0}", opt.side) : "", opt.format);
  const int64_t n = export_whole(s, opt);
  if (n < 0) return stop_exit_code();
  // The shape of the files written: resampled to --side where it is given.
  std::vector<int64_t> shape = s.train.shape;
  if (opt.side > 0 && shape.size() == 3) shape[1] = shape[2] = opt.side;
  // A folder dataset crops by scale and ratio: padded crops of the config are turned off.
  const bool padded = data.augment.crop_padding > 0;
  fmt::print(
      "{}: {} images ({} train, {} test) as {} files; train on them with\n"
      "  dtrain run {} data.dataset=folder {} 'data.shape=[{}]'{}\n",
      printable(opt.out, true), n, s.train.size(), s.test.size(), opt.format,
      shell_word(opt.config), shell_word("data.path=" + override_value(opt.out)),
      fmt::join(shape, ","), padded ? " data.augment.crop_padding=0" : "");
  return 0;
}

}  // namespace dtrain::cli
