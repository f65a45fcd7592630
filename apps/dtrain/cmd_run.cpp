#include <fmt/chrono.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/sweep.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/doctor.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;

namespace {

// Rank 0 under a launcher, while a run trains: once a stop signal has gone unanswered for
// 0.7 s while the main thread waits in an all-reduce, records the run as failed from here,
// naming the ranks that all-reduce still waits for. The launcher sends SIGTERM when a host or
// rank is lost and SIGKILL soon after (Open MPI: 1 s later), and Open MPI can hold the main
// thread meanwhile (reporting the lost peer to mpirun), so that the main thread's own record
// (after at most 0.5 s of waiting in a collective) may never come. A run that ends normally,
// or is interrupted in time, is left alone; a later record by the main thread replaces this.
class LastWord {
 public:
  LastWord(RunRecorder* rec, std::string run) : rec_(rec), run_(std::move(run)) {
    if (rec_) thread_ = std::thread([this] { watch(); });
  }
  ~LastWord() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  LastWord(const LastWord&) = delete;
  LastWord& operator=(const LastWord&) = delete;

 private:
  void watch() {
    std::optional<std::chrono::steady_clock::time_point> since;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (done_) return;
      // Only a main thread held in an all-reduce: one that computes or writes (a long step or
      // checkpoint after a plain Ctrl-C) will record the run itself.
      if (!stop_requested() || !mpi::waiting_in_collective()) {
        since.reset();
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (!since) since = now;
      if (now - *since < std::chrono::milliseconds(700)) continue;
      const std::string peers = mpi::waiting_for();
      const std::string why = fmt::format(
          "stopped by a signal while waiting for {} (the launcher is ending the job: a rank or "
          "host was lost, or the job was cancelled)",
          peers.empty() ? "other ranks" : peers);
      if (rec_->fail_if_running(why))
        std::fprintf(stderr, "dtrain: rank 0: run %s failed: %s\n", run_.c_str(), why.c_str());
      return;
    }
  }

  RunRecorder* rec_;
  std::string run_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::string default_tag() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y%m%d-%H%M%S}", tm);
}

std::string data_key(const Config& c) {
  return data_identity(c.data, c.train.seed);
}
}  // namespace

void setup_run(CLI::App& app, RunOptions& opt) {
  app.add_option("config", opt.config, "Experiment YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("overrides", opt.overrides,
                 "key=value overrides of the YAML (dotted keys, e.g. gpus=4 optimizer.lr=0.1); "
                 "a comma list (gpus=1,2,4) runs each value");
  app.add_option("--results", opt.results, "Results root; runs go to RESULTS/<name>/<run-id>/")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--tag", opt.tag,
                 "Run-id prefix shared by this command's runs (default: UTC date-time)")
      ->check(non_empty("a tag"));
  app.add_flag("--resume", opt.resume,
               "Continue an earlier command with the same --tag: finished runs (done or "
               "diverged) are skipped, unfinished ones continue from their checkpoint (or start "
               "over without one; the old folder is kept under .attempts/)");
  app.add_flag("-q,--quiet", opt.quiet, "Only warnings, errors and the final table");
}

namespace {

// Moves an unfinished run folder aside (never deletes it) so the run can start afresh, into
// <experiment>/.attempts/, which must be a real folder: a link there (planted) would move the
// run out of the results tree, and a name taken by anything, a dangling link too, is refused.
// Removes the partial writes (write_file_atomic's NAME.tmp.PID) of a process that died in the
// middle of one: never a whole file, and a checkpoint's can be tens of MB. The caller holds the
// run's lock, so no live process is writing them.
void remove_partial_writes(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> partial;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at == 0 || at + 5 == name.size() ||
        !fs::is_regular_file(it->symlink_status(ec)) ||
        !std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    partial.push_back(it->path());
  }
  for (const fs::path& f : partial)
    if (fs::remove(f, ec)) log().info("resume: removed {}, a write cut short", f.string());
}

std::string move_aside(const std::string& dir, const std::string& why) {
  const fs::path p(dir);
  remove_partial_writes(p);
  const fs::path attic = p.parent_path() / ".attempts";
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(attic, ec)))
    throw UserError(fmt::format("{}: a symbolic link where dtrain keeps earlier attempts; "
                                "refused (remove it, or move it away, to resume)",
                                attic.string()));
  ensure_dir(attic.string(), "attempts");
  fs::path dest;
  for (int n = 1;; ++n) {
    dest = attic / fmt::format("{}.{}", p.filename().string(), n);
    const auto st = fs::symlink_status(dest, ec);
    if (fs::is_symlink(st))
      throw UserError(fmt::format("{}: a symbolic link among the earlier attempts; refused "
                                  "(dtrain never makes one there)",
                                  dest.string()));
    if (!fs::exists(st)) break;
  }
  fs::rename(p, dest, ec);
  if (ec)
    throw UserError(fmt::format("{}: cannot move the unfinished run to {}: {}", dir,
                                dest.string(), ec.message()));
  log().info("resume: {} was {}; moved to {}", dir, why, dest.string());
  return dest.string();
}

// The checkpoint of an unfinished run folder that this run can continue from: none if it has
// none or it belongs to another config (then the run starts over, and says so).
// The folder's own config is compared first (a folder of another config, or whose config no
// longer reads, starts over), then the checkpoint is read with the bounds of this command's.
// One of this config on other data than `data`'s is refused (UserError), the folder untouched.
std::optional<Checkpoint> resumable(const std::string& dir, const Config& cfg,
                                    const DataSplit& data) {
  const std::string want = resume_identity(to_yaml(cfg));
  const auto had =
      try_read_own_file((fs::path(dir) / "config.resolved.yaml").string(), kMaxResolvedConfigBytes);
  std::error_code ec;
  const bool saved = fs::exists(fs::symlink_status(checkpoint_path(dir), ec));
  std::optional<Checkpoint> c;
  // The loaded data's shape, not a peek's: the files that data.on_bad_file: skip passed over
  // change the steps per epoch that the checkpoint's position is checked against.
  const DataShape shape{data.train.shape, data.train.classes, data.train.size()};
  if (saved && had && resume_identity(*had) == want) c = load_checkpoint(dir, cfg, &shape);
  if (saved && (!c || resume_identity(c->config_yaml) != want)) {
    const auto [was, now] = first_difference(c     ? resume_identity(c->config_yaml)
                                             : had ? resume_identity(*had)
                                                   : "",
                                             want);
    log().warn(
        "resume: the checkpoint in {} is of another config (it has '{}', this command "
        "asks for '{}'); the run starts over",
        dir, was, now);
    return std::nullopt;
  }
  if (c) check_data_unchanged(*c, data.fingerprint);
  return c;
}

// A checkpoint that an earlier --resume of this run moved aside with its folder but did not
// copy whole into the new one (killed, or the disk full, while writing it): the newest one
// under <experiment>/.attempts/<run>.N/ that this run can continue from, and its folder. Such
// a checkpoint is removed from there once it is copied, so one that is still there is progress
// that the run's own folder lacks. A damaged one is named and passed over.
std::optional<std::pair<Checkpoint, std::string>> kept_checkpoint(const std::string& dir,
                                                                  const Config& cfg,
                                                                  const DataSplit& data) {
  const fs::path run(dir), attic = run.parent_path() / ".attempts";
  const std::string head = run.filename().string() + ".";
  std::vector<std::pair<long, fs::path>> found;
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(attic, ec))) return std::nullopt;
  for (fs::directory_iterator it(attic, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string n = name.substr(std::min(name.size(), head.size()));
    if (name.rfind(head, 0) != 0 || n.empty() || n.size() > 9 ||
        !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        !it->is_directory(ec) || it->is_symlink(ec) ||
        !fs::exists(fs::symlink_status(checkpoint_path(it->path().string()), ec)))
      continue;
    found.emplace_back(std::stol(n), it->path());
  }
  std::sort(found.rbegin(), found.rend());  // the newest attempt first
  const std::string want = resume_identity(to_yaml(cfg));
  for (const auto& [n, path] : found) {
    const auto had =
        try_read_own_file((path / "config.resolved.yaml").string(), kMaxResolvedConfigBytes);
    if (!had || resume_identity(*had) != want) continue;  // an attempt of another config
    try {
      if (auto c = resumable(path.string(), cfg, data))
        return std::pair{std::move(*c), path.string()};
    } catch (const UserError& e) {
      log().warn("resume: passed over the checkpoint in {}: {}", path.string(), e.what());
    }
  }
  return std::nullopt;
}

// "" if the finished run in `dir` was run with `cfg`, else why --resume cannot reuse it.
std::string differs_from_finished(const std::string& dir, const Config& cfg) {
  const auto had = try_read_own_file((fs::path(dir) / "config.resolved.yaml").string(),
                                     kMaxResolvedConfigBytes);
  return config_differs(dir, had, cfg);
}

struct IndexRow {
  std::string id, status, group, overrides, dir;
  int gpus = 0;
};

// The rows an earlier command of this tag wrote to the experiment's index (read once, before
// this command writes it), each a plain run folder name, one row per run. Our own file only.
std::vector<IndexRow> read_index(const std::string& path) {
  std::vector<IndexRow> rows;
  const auto old = try_read_own_file(path, kMaxIndexBytes);
  if (!old) return rows;
  const auto records = parse_csv(*old);
  for (size_t k = 1; k < records.size(); ++k) {
    const auto& f = records[k];
    if (f.size() != 6 || folder_name_rule(f[0]) != nullptr) continue;
    const bool seen =
        std::any_of(rows.begin(), rows.end(), [&](const IndexRow& o) { return o.id == f[0]; });
    if (seen) continue;  // one row per run
    IndexRow r{f[0], f[1], f[3], f[4], f[5]};
    r.gpus = static_cast<int>(std::clamp(std::strtol(f[2].c_str(), nullptr, 10), 0L, 1L << 20));
    // A row left `running` by a command killed outright (SIGKILL, a lost node): its folder
    // says what became of it (interrupted when no process holds it any more).
    if (r.status == "running") {
      const std::string now = read_run_status((fs::path(path).parent_path() / r.id).string());
      if (!now.empty()) r.status = now;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// The index of this tag: the earlier rows with this command's in their place, and this
// command's other runs after them (a --resume of part of a sweep keeps the rest listed).
std::vector<IndexRow> merge_index(std::vector<IndexRow> all, const std::vector<IndexRow>& rows) {
  for (const auto& r : rows) {
    auto same =
        std::find_if(all.begin(), all.end(), [&](const IndexRow& o) { return o.id == r.id; });
    if (same != all.end())
      *same = r;
    else
      all.push_back(r);
  }
  return all;
}

void write_index(const std::string& path, const std::vector<IndexRow>& rows) {
  std::string csv = "run_id,status,gpus,group,overrides,dir\n";
  for (const auto& r : rows)
    csv += fmt::format("{},{},{},{},{},{}\n", csv_escape(r.id), csv_escape(r.status), r.gpus,
                       csv_escape(r.group), csv_escape(r.overrides), csv_escape(r.dir));
  write_file_atomic(path, csv);
}

// The run folders of an index, for the comparison table: every run of the tag, not only this
// command's; a folder that is a link is not followed out of the tree.
std::vector<std::string> index_dirs(const fs::path& exp, const std::vector<IndexRow>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    const fs::path dir = exp / r.id;  // never the dir column: it is not needed
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(dir, ec))) out.push_back(dir.string());
  }
  return out;
}

// After this process took a run's lock under --resume: another command may have finished the
// run since this one planned it. Then it is skipped if it is this experiment (true), and refused
// if it is another; under a launcher rank 0's answer holds for every rank.
// A run folder's status as --resume acts on it: a finished one whose summary.json cannot be
// read (removed, damaged) counts as unfinished, so that it runs again, its folder kept under
// .attempts/, rather than be skipped and left out of the table without a word.
std::string resume_status(const std::string& dir, bool held_here, bool warn) {
  const std::string status = read_run_status(dir, held_here);
  if (!run_finished(status)) return status;
  try {
    load_run(dir);
  } catch (const UserError& e) {
    if (warn)
      log().warn("resume: {} says {}, but {}; it runs again (this folder kept under .attempts/)",
                 dir, status, e.what());
    return "";
  }
  return status;
}

bool finished_meanwhile(bool leader, bool multi, const std::string& status,
                        const std::string& dir, const Config& cfg) {
  std::string verdict = "0";
  if (leader && run_finished(status)) {
    const std::string why = differs_from_finished(dir, cfg);
    verdict = why.empty() ? "1" : "E" + why;
  }
  if (multi) mpi::broadcast(verdict);
  if (verdict[0] == 'E') throw UserError(verdict.substr(1));
  if (verdict == "1")
    log().info("resume: {} was finished by another command meanwhile ({}); skipped", dir, status);
  return verdict == "1";
}

// One command's runs as planned: the same on every rank, but for what rank 0 alone reads of
// the results folder (and then shares).
struct Sweep {
  bool multi = false;  // under mpirun/srun: one replica per process
  bool leader = true;  // rank 0, or the only process: it alone touches the results folder
  std::string tag;
  std::vector<PlannedRun> runs;
  std::vector<std::string> dirs;  // each run's folder
  std::vector<bool> skip;         // finished already, under --resume
  std::vector<IndexRow> index;    // each run's row in its experiment's index, status current
};

// The tag of a command that gives none: the UTC second it started, or where a command started
// in the same second has it (a run folder or an index of its name exists), the first free of
// <second>-2, -3, ...; rank 0's under a launcher (the ranks may straddle a second). Checked,
// not reserved: two commands started in one second may still meet, and the second is then
// refused with nothing overwritten.
std::string unused_default_tag(const RunOptions& opt, const Sweep& s) {
  const std::string second = default_tag();
  std::string tag = second;
  const auto taken = [&](const std::string& t) {
    return std::any_of(s.runs.begin(), s.runs.end(), [&](const PlannedRun& r) {
      const fs::path experiment = fs::path(opt.results) / r.config.name;
      std::error_code ec;
      return fs::exists(fs::symlink_status(experiment / run_id(t, r), ec)) ||
             fs::exists(fs::symlink_status(experiment / ("index-" + t + ".csv"), ec));
    });
  };
  std::string refusal;  // every rank refuses with the leader, none waits for it
  for (int n = 2; s.leader && refusal.empty() && taken(tag); ++n)
    if (n == 1000)
      refusal = fmt::format("{}: 999 tags of this second are taken; give --tag", opt.results);
    else
      tag = fmt::format("{}-{}", second, n);
  if (s.multi) {
    mpi::broadcast(tag);
    mpi::broadcast(refusal);
  }
  if (!refusal.empty()) throw UserError(refusal);
  return tag;
}

// Under a launcher every process reads the config and its command line itself. A rank given
// another file or override (a stale copy on one node, a typo on one command line) would fail
// alone here, or plan other runs, while the others wait at their first collective: every
// rank compares its plan with rank 0's, and all refuse with the first rank's reason.
void agree_on_plan(const RunOptions& opt, const Sweep& s, std::string refusal) {
  std::string plan = fmt::format("{} {}\n", opt.resume, s.tag);
  for (const auto& r : s.runs) plan += fmt::format("{:016x}\n", launch_fingerprint(r.config));
  std::string first = plan;
  mpi::broadcast(first);
  if (refusal.empty() && plan != first)
    refusal = fmt::format(
        "its config, overrides, --tag or --resume plan other runs than rank 0's (only "
        "data.path and threads may differ); start every rank with the same command line");
  refusal = mpi::first_refusal(refusal);
  if (!refusal.empty()) throw UserError(refusal);
}

// DTRAIN_FAULT=stall:R (a test facility): rank R of a launched job stops before the ranks
// compare their plans, as one stuck on a file system would, until a signal ends it; the others
// give up after train.collective_timeout_s.
void stall_if_asked(bool multi) {
  int rank = -1;
  const char* f = std::getenv("DTRAIN_FAULT");
  if (!multi || !f || std::sscanf(f, "stall:%d", &rank) != 1 || rank != mpi::rank()) return;
  while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// The runs of this command, checked against the launcher's process count.
Sweep plan_sweep(const RunOptions& opt) {
  // Under mpirun/srun every process runs this command; rank 0 alone touches the results folder.
  Sweep s;
  s.multi = mpi::initialized();
  s.leader = !s.multi || mpi::rank() == 0;
  set_verbosity(opt.quiet || !s.leader);
  std::string refusal;
  try {
    if (opt.resume && opt.tag.empty())
      throw UserError("--resume needs --tag: it continues the runs of an earlier command by name");
    s.runs = plan_runs(opt.config, opt.overrides);
    // The steps before and between runs wait for the other ranks as long as training does.
    double timeout = 0;
    for (const auto& r : s.runs) timeout = std::max(timeout, r.config.train.collective_timeout_s);
    mpi::set_planning_timeout(timeout);
    stall_if_asked(s.multi);
    s.tag = folder_tag(opt.tag, "");
    // Before the data loads: a --results that cannot be a folder is said at once.
    if (s.leader) ensure_dir(opt.results, "--results");
  } catch (const UserError& e) {
    if (!s.multi) throw;
    refusal = e.what();
  }
  if (s.multi) agree_on_plan(opt, s, refusal);
  if (s.tag.empty()) s.tag = unused_default_tag(opt, s);
  if (s.multi)
    for (const auto& r : s.runs)
      if (r.config.gpus != mpi::size())
        throw UserError(fmt::format(
            "{}: gpus={} but the launcher started {} process{}; dtrain runs one replica per "
            "process, so set gpus={} or start {} process{}",
            opt.config, r.config.gpus, mpi::size(), mpi::size() == 1 ? "" : "es", mpi::size(),
            r.config.gpus, r.config.gpus == 1 ? "" : "es"));
  return s;
}

// A run's row in its experiment's index before any run starts.
IndexRow index_row(const std::string& tag, const PlannedRun& r, const std::string& dir,
                   const std::string& status) {
  std::string ov;
  for (const auto& o : r.overrides) ov += (ov.empty() ? "" : " ") + o.text();
  return {run_id(tag, r), status, r.group, ov, dir, r.config.gpus};
}

// Whether an earlier --resume moved run folder `dir` aside (<experiment>/.attempts/<run>.N).
bool moved_aside(const std::string& dir) {
  const fs::path run(dir), attic = run.parent_path() / ".attempts";
  const std::string head = run.filename().string() + ".";
  std::error_code ec;
  for (fs::directory_iterator it(attic, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(head, 0) == 0) return true;
  return false;
}

// Each run's folder, and what rank 0 finds there: a finished run that --resume skips, or why
// the command is refused (returned, "" if it is not). Everything that can be checked is checked
// before the first step of the first run; the first refusal ends the planning.
std::string plan_folders(const RunOptions& opt, Sweep& s) {
  std::string refusal;
  bool any_found = false;
  s.skip.assign(s.runs.size(), false);
  for (size_t i = 0; i < s.runs.size() && refusal.empty(); ++i) {
    const auto& r = s.runs[i];
    const auto dir = (fs::path(opt.results) / r.config.name / run_id(s.tag, r)).string();
    check_distinct(dir, s.dirs);
    const std::string status =
        opt.resume && s.leader ? resume_status(dir, false, /*warn=*/true) : read_run_status(dir);
    FolderFound found;
    if (s.leader && fs::exists(dir)) found = {true, status, opt.resume ? RunLock::holder(dir) : 0};
    const FolderPlan plan = plan_folder(dir, found, opt.resume);
    s.skip[i] = plan.skip;
    if (plan.skip && s.leader) repair_status_file(dir, status);
    refusal = plan.compare ? differs_from_finished(dir, r.config) : plan.refusal;
    s.index.push_back(index_row(s.tag, r, dir, s.skip[i] ? status : "pending"));
    s.dirs.push_back(dir);
    any_found = any_found || found.exists || moved_aside(dir);
  }
  // Not an error (a sweep may be resumed before its first run started), but a typo in --tag or
  // --results would otherwise train everything again without a word.
  if (opt.resume && s.leader && !any_found && refusal.empty()) {
    const fs::path exp = fs::path(opt.results) / s.runs.front().config.name;
    std::vector<std::string> ids;  // the tag's runs of earlier commands, by their index
    bool planned = false;          // one of this command's runs among them, never started
    for (const IndexRow& r : read_index((exp / ("index-" + s.tag + ".csv")).string())) {
      if (ids.size() < 8) ids.push_back(r.id);
      for (const auto& run : s.runs) planned = planned || r.id == run_id(s.tag, run);
    }
    if (planned)
      log().info(
          "--resume: the earlier command of --tag {} ended before its first run "
          "started; every run starts from the beginning",
          s.tag);
    else if (ids.empty())
      log().warn("--resume: no run of --tag {} in {} yet; every run starts from the beginning",
                 s.tag, exp.string());
    else
      log().warn(
          "--resume: none of this command's runs is among those of --tag {} in {} ({}); "
          "a run's id names its swept values, so give the same comma lists to resume "
          "those; these runs start from the beginning",
          s.tag, exp.string(), fmt::join(ids, ", "));
  }
  return refusal;
}

// Rank 0's view of the results folder decides for everyone: its refusal, or the runs it skips.
void share_decisions_across_ranks(Sweep& s, std::string& refusal) {
  if (!s.multi) return;
  std::string decisions = encode_decisions(refusal, s.skip);
  mpi::broadcast(decisions);
  decode_decisions(decisions, refusal, s.skip);
}

// One data set in memory at a time: a sweep over data settings (train_limit, seeds of
// synthetic data) would otherwise hold a copy per value. A run whose data differs from the one
// before it loads its own again.
class HeldData {
 public:
  explicit HeldData(std::string config_path) : config_(std::move(config_path)) {}
  const std::string& config() const { return config_; }
  const DataSplit& get(const Config& c) {
    const std::string key = data_key(c);
    if (!held_ || key_ != key) {
      held_.reset();
      log().info("loading data ({})", to_string(c.data.dataset));
      held_ = std::make_unique<DataSplit>(load_config_data(config_, c));
      key_ = key;
    }
    return *held_;
  }

 private:
  std::string config_;
  std::unique_ptr<DataSplit> held_;
  std::string key_;
};

// Collective: why this rank's data differ from rank 0's (each run's fingerprint, in run order),
// or "". Where this rank loaded nothing (it failed), its own reason is the one given.
std::string other_data_than_rank0(const std::vector<uint64_t>& fingerprints) {
  std::string mine;
  for (uint64_t f : fingerprints) mine += fmt::format("{:016x}\n", f);
  std::string first = mine;
  mpi::broadcast(first);
  for (size_t i = 0; i < fingerprints.size() && first.size() == mine.size(); ++i) {
    const std::string theirs = first.substr(17 * i, 16), own = mine.substr(17 * i, 16);
    if (fingerprints[i] != 0 && theirs != own && theirs != std::string(16, '0'))
      return fmt::format(
          "data: this rank loaded other data than rank 0 (fingerprint {} "
          "against rank 0's {}); every rank must read the same files: check "
          "data.path on every node",
          own, theirs);
  }
  return "";
}

// Every run's plan is checked before the first starts, each data set loaded once for that: the
// first run's data last, so that it stays loaded for that run.
void check_plans(const Sweep& s, HeldData& data) {
  std::map<std::string, std::vector<size_t>> by_data;  // the runs of each data set
  std::string first_key;
  for (size_t i = 0; i < s.runs.size(); ++i)
    if (!s.skip[i]) {
      by_data[data_key(s.runs[i].config)].push_back(i);
      if (first_key.empty()) first_key = data_key(s.runs[i].config);
    }
  std::vector<std::string> order;
  for (const auto& [key, ids] : by_data)
    if (key != first_key) order.push_back(key);
  if (!first_key.empty()) order.push_back(first_key);
  std::string refusal;
  std::vector<uint64_t> fingerprints(s.runs.size(), 0);  // 0: not loaded
  try {
    for (const auto& key : order)
      for (size_t i : by_data[key]) {
        const DataSplit& d = data.get(s.runs[i].config);
        fingerprints[i] = d.fingerprint;
        try {
          check_config_plan(data.config(), s.runs[i].config, d);
        } catch (const UserError& e) {
          rethrow_for_run(s.runs[i], s.runs.size(), e);
        }
      }
  } catch (const UserError& e) {
    if (!s.multi) throw;
    refusal = e.what();
  } catch (const fs::filesystem_error& e) {  // a data.path that cannot be walked
    if (!s.multi) throw;
    refusal = fmt::format("{}: {}", e.path1().string(), e.code().message());
  } catch (const Interrupted& e) {  // Ctrl-C or SIGTERM while the files were checked
    if (!s.multi) throw;
    refusal = "\x02" + std::string(e.what());
  } catch (const std::exception& e) {  // out of memory, a failing device: not a user's mistake
    if (!s.multi) throw;
    refusal = "\x01" + failure_text(e);
  }
  // Under a launcher each process loads its own data: a node without the files would fail
  // alone while the others wait for it, and one with other files would train on other samples.
  // Every rank stops with the first rank's reason.
  if (s.multi) {
    const std::string other = other_data_than_rank0(fingerprints);
    if (refusal.empty()) refusal = other;
    refusal = mpi::first_refusal(refusal);
  }
  const size_t mark = refusal.find('\x01');
  if (mark != std::string::npos)
    DTRAIN_THROW_SYSTEM(refusal.erase(mark, 1));  // exit 1, as where it happened
  // Every rank stops as the one that was interrupted, with the signal's exit code.
  if (const size_t stop = refusal.find('\x02'); stop != std::string::npos)
    throw Interrupted(refusal.erase(stop, 1));
  if (!refusal.empty()) throw UserError(refusal);
}

// One index per experiment: every run of the tag with its current status (the sweep's rows),
// the earlier commands' rows read once, when this is made. Rank 0's alone.
class TagIndex {
 public:
  static constexpr double kIndexLockWaitS = 30;
  TagIndex(const std::string& results, const Sweep& s) : results_(results), s_(s) {
    if (s.leader)
      for (const auto& r : s.runs)
        if (!earlier_.count(r.config.name))
          earlier_[r.config.name] = read_index(path(r.config.name));
  }
  std::vector<std::string> experiments() const {
    std::vector<std::string> names;
    for (const auto& exp : earlier_) names.push_back(exp.first);
    return names;
  }
  // Read again each time: another command of the tag (a --resume of another part of the
  // sweep) may have written its rows since; the file as read at the start where it is gone.
  std::vector<IndexRow> rows(const std::string& name) const {
    std::vector<IndexRow> mine;
    for (size_t i = 0; i < s_.runs.size(); ++i)
      if (s_.runs[i].config.name == name) mine.push_back(s_.index[i]);
    std::vector<IndexRow> now = read_index(path(name));
    return merge_index(now.empty() ? earlier_.at(name) : std::move(now), mine);
  }
  // Under the index's lock: two commands of the tag saving at once would each write the rows
  // it read before the other's write, and one's rows would be lost.
  void save() const {
    if (!s_.leader) return;
    for (const auto& exp : earlier_) {
      ensure_dir((fs::path(results_) / exp.first).string(), "--results");
      const FileLock lock(path(exp.first), kIndexLockWaitS);
      if (!lock.held())
        log().warn(
            "{}: another dtrain command has held this index for {:g} s (stopped?); "
            "saving it without the lock",
            printable(path(exp.first), true), kIndexLockWaitS);
      write_index(path(exp.first), rows(exp.first));
    }
  }

 private:
  std::string path(const std::string& name) const {
    return (fs::path(results_) / name / ("index-" + s_.tag + ".csv")).string();
  }
  std::string results_;
  const Sweep& s_;
  std::map<std::string, std::vector<IndexRow>> earlier_;
};

// What one run holds while it trains, released (in reverse order) once its row is saved. The
// lock, held for the whole run: no other command writes, moves or resumes this folder
// meanwhile, and every decision about the folder is taken under it, from what it holds now.
struct RunHold {
  std::string earlier;  // the folder's status when the lock was taken (rank 0)
  std::unique_ptr<RunLock> lock;
  std::unique_ptr<RunRecorder> rec;
  std::unique_ptr<Communicator> comm;
  std::optional<Checkpoint> resume_from;
};

// Rank 0 takes run i's folder and looks again: true if another command finished the run
// since this one planned it (under --resume; then it is skipped).
bool finished_since_planned(const RunOptions& opt, Sweep& s, size_t i, RunHold& h) {
  if (s.leader) {
    h.lock = std::make_unique<RunLock>(s.dirs[i]);
    h.earlier = opt.resume ? resume_status(s.dirs[i], /*held_here=*/true, /*warn=*/false)
                           : read_run_status(s.dirs[i], /*held_here=*/true);
  }
  if (!opt.resume || !finished_meanwhile(s.leader, s.multi, h.earlier, s.dirs[i], s.runs[i].config))
    return false;
  s.index[i].status = h.earlier;
  if (s.leader) repair_status_file(s.dirs[i], h.earlier);
  return true;
}

// A refusal that every rank of a launched job raised together (rank 0 decided and told the
// others): the command ends with its one line and exit 2 on every rank, no job abort.
class RefusedOnEveryRank : public UserError {
 public:
  using UserError::UserError;
};

// Under --resume rank 0 moves an unfinished folder aside, with the checkpoint this run
// continues from if it has one, and every rank continues from rank 0's; then the run's
// folder is made.
void open_folder(const RunOptions& opt, const Sweep& s, size_t i, const DataSplit& data,
                 RunHold& h) {
  const auto& r = s.runs[i];
  std::string attempt, refusal, kept_in;
  // A folder that is gone may have been moved aside by a resume killed before it made the
  // new one: the checkpoint kept there is looked for all the same.
  const bool exists = s.leader && opt.resume && fs::exists(s.dirs[i]);
  if (s.leader && opt.resume) {
    // A damaged checkpoint, or one of other data, stops here: nothing is moved. Under a
    // launcher every rank learns why and stops with the same one line (exit 2), rather than
    // rank 0 alone, which would abort the job.
    try {
      if (exists) h.resume_from = resumable(s.dirs[i], r.config, data);
      std::error_code ec;
      if (!h.resume_from && !fs::exists(fs::symlink_status(checkpoint_path(s.dirs[i]), ec)))
        if (auto kept = kept_checkpoint(s.dirs[i], r.config, data)) {
          h.resume_from = std::move(kept->first);
          kept_in = kept->second;
          log().info("resume: {} {}; continuing from the checkpoint kept in {}", s.dirs[i],
                     exists ? "has no checkpoint" : "is gone (a resume moved it aside and stopped)",
                     kept_in);
        }
    } catch (const UserError& e) {
      if (!s.multi) throw;
      refusal = e.what();
    }
    if (refusal.empty() && exists) attempt = move_aside(s.dirs[i], unfinished_as(h.earlier));
  }
  if (s.multi) {  // every rank continues from rank 0's checkpoint, or stops with its refusal
    std::string bytes = !refusal.empty()  ? "R" + refusal
                        : h.resume_from ? "C" + encode_checkpoint(*h.resume_from)
                                        : "";
    mpi::broadcast(bytes);
    if (!bytes.empty() && bytes[0] == 'R') throw RefusedOnEveryRank(bytes.substr(1));
    if (!s.leader && !bytes.empty()) {
      bytes.erase(0, 1);  // in place: a checkpoint may be most of the memory
      h.resume_from = decode_checkpoint(bytes, "rank 0's checkpoint");
    }
  }
  if (s.runs.size() > 1) log().info("=== run {}/{} ===", i + 1, s.runs.size());
  if (s.leader)
    h.rec =
        std::make_unique<RunRecorder>(s.dirs[i], run_id(s.tag, r), r.group, r.config, r.overrides);
  if (h.rec && h.resume_from) {
    h.rec->resume(*h.resume_from);  // saved in the new folder before the old copy goes
    h.rec->carry(attempt, "trace.json");
    h.rec->carry(attempt, "devices.csv");
    std::error_code ec;
    fs::remove(checkpoint_path(attempt), ec);
    if (!kept_in.empty()) fs::remove(checkpoint_path(kept_in), ec);
  }
}

// Trains run i in its open folder, its status in the index `running` meanwhile.
void train_in_folder(Sweep& s, size_t i, const DataSplit& data, RunHold& h, const TagIndex& index) {
  const auto& r = s.runs[i];
  // The known pitfalls of this config, in the run's log (dtrain doctor prints the same).
  if (s.leader)
    for (const auto& f : diagnose(r.config, &data)) log().warn("{}", to_line(f));
  s.index[i].status = "running";
  index.save();
  TrainResult result;
  const Checkpoint* from = h.resume_from ? &*h.resume_from : nullptr;
  if (s.multi) {
    h.comm = mpi::world(r.config.train.collective_timeout_s);
    const LastWord last_word(h.rec.get(), run_id(s.tag, r));
    result = train_rank(r.config, data, *h.comm, h.rec.get(), from);
  } else {
    result = train(r.config, data, h.rec.get(), from);
  }
  if (h.rec) h.rec->finish(result);
  s.index[i].status = result.status == RunStatus::diverged ? "diverged" : "done";
}

// Every rank stopped at the same step, after the checkpoint was written.
void record_interrupt(const RunOptions& opt, Sweep& s, size_t i, const RunHold& h,
                      const Interrupted& e) {
  if (h.rec) {
    h.rec->interrupt(e.what());
    log().warn("to continue: the same command with --resume --tag {}",
               opt.resume_tag.empty() ? s.tag : opt.resume_tag);
  }
  s.index[i].status = "interrupted";
}

// Run i failed on this process. Rank 0 records the failure first: when a peer died, the
// launcher is about to kill every rank, and telling the others may take a moment. Under a
// launcher the job ends here.
void record_failure(Sweep& s, size_t i, const RunHold& h, const TagIndex& index,
                    const std::exception& e) {
  if (h.rec) {
    // The log, the file a user opens first, ends with why: a user's mistake reaches the
    // terminal from main() alone, anything else through log() below.
    if (dynamic_cast<const UserError*>(&e))
      h.rec->log_error(fmt::format("run {} failed: {}", run_id(s.tag, s.runs[i]), e.what()));
    h.rec->fail(failure_text(e));
  }
  const bool remote = dynamic_cast<const Aborted*>(&e) != nullptr;
  const bool everyone = dynamic_cast<const RefusedOnEveryRank*>(&e) != nullptr;
  // A user's mistake ends the command with its one line (main prints it); anything else is
  // this run's failure, said before the index is written (a full disk may fail that too), and
  // the command goes on to the next run. A rank of a multi-process job says it below.
  if (!dynamic_cast<const UserError*>(&e) && !(s.multi && !everyone))
    log().error("run {} failed: {}", run_id(s.tag, s.runs[i]), failure_text(e));
  // Failed before this command wrote the folder (another process holds it, a damaged
  // checkpoint, a run finished meanwhile with another config): the folder's own status
  // stands; a run with no folder yet failed here.
  const std::string on_disk =
      !h.rec && s.leader ? read_run_status(s.dirs[i], /*held_here=*/h.lock != nullptr) : "";
  s.index[i].status = on_disk.empty() ? "failed" : on_disk;
  index.save();
  // Tell the others.
  if (s.multi && h.comm && !remote && !everyone) h.comm->abort(failure_text(e));
  if (s.multi && !everyone) {
    // A rank's failure ends the job: rank 0 has recorded it; every process exits now.
    std::fprintf(stderr, "dtrain: rank %d: run %s failed: %s\n", mpi::rank(),
                 run_id(s.tag, s.runs[i]).c_str(), failure_text(e).c_str());
    mpi::end_job_after_failure(1);
  }
}

enum class Outcome { trained, skipped, failed, interrupted };

// Run i from taking its folder to its row saved in the index; a user mistake ends the command.
Outcome train_one(const RunOptions& opt, Sweep& s, size_t i, HeldData& data,
                  const TagIndex& index) {
  RunHold h;
  Outcome outcome = Outcome::trained;
  // The leader's setup is inside the try as well: under mpirun a leader that fails here (a
  // full disk, say) must end the job, not leave the other ranks waiting in a collective.
  try {
    if (finished_since_planned(opt, s, i, h)) {
      index.save();
      return Outcome::skipped;
    }
    // A run whose data differs from the one before it loads its own; a failure there is
    // this run's, recorded like any other.
    const DataSplit& d = data.get(s.runs[i].config);
    open_folder(opt, s, i, d, h);
    train_in_folder(s, i, d, h, index);
  } catch (const Interrupted& e) {
    record_interrupt(opt, s, i, h, e);
    index.save();
    return Outcome::interrupted;
  } catch (const std::exception& e) {
    record_failure(s, i, h, index, e);
    if (dynamic_cast<const UserError*>(&e)) throw;
    outcome = Outcome::failed;
  }
  index.save();
  return outcome;
}

struct Tally {
  int failed = 0, skipped = 0;
  bool whole = true;  // every run reached its end: a stop asked for after it interrupted none
};

// DTRAIN_FAULT=term-after:K (a test facility): a SIGTERM once run K of the command has ended,
// as one arriving while it wrote its results would; returns when dtrain has taken it.
void term_if_asked(size_t i) {
  int k = -1;
  const char* f = std::getenv("DTRAIN_FAULT");
  if (!f || std::sscanf(f, "term-after:%d", &k) != 1 || k < 0 || static_cast<size_t>(k) != i)
    return;
  ::kill(::getpid(), SIGTERM);  // to the process: dtrain's signal thread takes it
  for (int n = 0; n < 200 && !stop_requested(); ++n)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// The runs in order, until the first interrupted one (or a stop between two).
Tally train_each_run(const RunOptions& opt, Sweep& s, HeldData& data, const TagIndex& index) {
  Tally t;
  for (size_t i = 0; i < s.runs.size(); ++i) {
    if (s.skip[i]) {  // finished already: a stop leaves nothing of it to do
      log().info("resume: {} is {} already; skipped", run_id(s.tag, s.runs[i]), s.index[i].status);
      ++t.skipped;
      continue;
    }
    if (stop_requested()) {
      t.whole = false;
      break;
    }
    const Outcome o = train_one(opt, s, i, data, index);
    if (o == Outcome::skipped) ++t.skipped;
    if (o == Outcome::failed) ++t.failed;
    if (o == Outcome::interrupted) {
      t.whole = false;
      break;
    }
    term_if_asked(i);
  }
  return t;
}

// Every run of the tag with a summary, read back from its folder, by experiment.
std::map<std::string, std::vector<RunRecord>> read_records(const std::string& results,
                                                           const TagIndex& index) {
  std::map<std::string, std::vector<RunRecord>> by_experiment;
  for (const auto& name : index.experiments()) {
    for (const auto& d : index_dirs(fs::path(results) / name, index.rows(name))) {
      // A link loop in its place is no filesystem_error: load_run names it.
      if (std::error_code ec; !fs::exists(fs::path(d) / "summary.json", ec) && !ec) continue;
      try {
        auto rec = load_run(d);
        // The table goes to this experiment's folder, whatever a summary claims to be.
        if (rec.experiment != name)
          throw UserError(fmt::format("its summary.json names experiment '{}', not '{}'",
                                      rec.experiment, name));
        by_experiment[name].push_back(std::move(rec));
      } catch (const UserError& e) {  // an earlier command's run, damaged since: not this one's
        log().warn("comparison: {} left out: {}", d, e.what());
      }
    }
  }
  return by_experiment;
}

// The runs of the tag in experiment `name` that have no row in its table (not started, or
// stopped before their first summary), as a note under it: "" where every run has one.
std::string missing_runs_note(const TagIndex& index, const std::string& results,
                              const std::string& name, const std::vector<RunRecord>& records,
                              const std::string& tag) {
  const fs::path exp = fs::path(results) / name;
  std::vector<std::string> missing;
  for (const IndexRow& r : index.rows(name))
    if (std::error_code ec; !fs::is_symlink(fs::symlink_status(exp / r.id, ec)) &&
                            std::none_of(records.begin(), records.end(),
                                         [&](const RunRecord& rec) { return rec.run_id == r.id; }))
      missing.push_back(fmt::format("{} ({})", r.id, r.status.empty() ? "pending" : r.status));
  if (missing.empty()) return "";
  return fmt::format(
      "Not in this table, with no summary yet: {}; `dtrain run` with the same "
      "config and overrides and `--resume --tag {}` runs them.\n",
      fmt::join(missing, ", "), tag);
}

// `records` and, without a row of their own, the runs of the index that have none (killed
// before their summary): a run of fewer replicas that did not finish leaves the runs of more
// without a baseline, rather than each its own at 1.00x.
std::vector<RunRecord> with_unlisted(std::vector<RunRecord> records, const TagIndex& index,
                                     const std::string& name) {
  for (const IndexRow& row : index.rows(name)) {
    if (std::any_of(records.begin(), records.end(),
                    [&](const RunRecord& r) { return r.run_id == row.id; }))
      continue;
    RunRecord r;
    r.run_id = row.id;
    r.experiment = name;
    r.group = row.group;
    r.gpus = row.gpus;
    r.status = row.status.empty() ? "pending" : row.status;
    r.in_table = false;
    records.push_back(std::move(r));
  }
  return records;
}

// The table is regenerated from the run folders, grouped by experiment.
void write_tables(const RunOptions& opt, const std::string& tag, const TagIndex& index) {
  for (const auto& [name, records] : read_records(opt.results, index)) {
    const auto cmp = compare(with_unlisted(records, index, name));
    const std::string md =
        to_markdown(cmp) + missing_runs_note(index, opt.results, name, records, tag);
    const std::string base = (fs::path(opt.results) / name / ("comparison-" + tag)).string();
    write_file_atomic(base + ".md", md);
    write_file_atomic(base + ".csv", to_csv(cmp));
    if (opt.print_table)
      fmt::print("\n## {}\n\n{}\n(written to {}.md and .csv)\n", name, md, printable(base, true));
  }
}

}  // namespace

int run_run(const RunOptions& opt) {
  Sweep s = plan_sweep(opt);
  std::string refusal = plan_folders(opt, s);
  share_decisions_across_ranks(s, refusal);
  if (!refusal.empty()) throw UserError(refusal);
  HeldData data(opt.config);
  check_plans(s, data);
  const TagIndex index(opt.results, s);
  index.save();
  const Tally t = train_each_run(opt, s, data, index);
  if (!s.leader) return stop_requested() && !t.whole ? stop_exit_code() : 0;
  if (t.skipped)
    log().info("resume: {} of {} runs were already finished", t.skipped, s.runs.size());
  write_tables(opt, s.tag, index);
  if (stop_requested() && !t.whole) {
    log().warn("interrupted");
    return stop_exit_code();
  }
  // A stop that came while the last run wrote its results interrupted nothing: every run has
  // its end, and --resume would find nothing to do.
  if (stop_requested())
    log().warn("stop asked for after every run had finished: nothing to resume");
  return t.failed ? 1 : 0;
}

}  // namespace dtrain::cli
