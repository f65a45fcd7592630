#include <fmt/chrono.h>
#include <fmt/format.h>

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
#include <sstream>
#include <thread>

#include "commands.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/report.hpp"
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
      ->capture_default_str();
  app.add_option("--tag", opt.tag,
                 "Run-id prefix shared by this command's runs (default: UTC date-time)");
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
std::string move_aside(const std::string& dir, const std::string& why) {
  const fs::path p(dir);
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

// A resolved config as --resume compares it: without `replicas`, which never changes a bit of
// the results (and which run folders written before the key existed lack). Text that does not
// read as a config is compared as it is.
std::string resume_identity(const std::string& yaml) {
  try {
    Config c = parse_config(yaml, "config.resolved.yaml");
    c.replicas = ReplicaMode::auto_;
    return to_yaml(c);
  } catch (const UserError&) {
    return yaml;
  }
}

// The checkpoint of an unfinished run folder that this run can continue from: none if it has
// none or it belongs to another config (then the run starts over, and says so).
// The folder's own config is compared first (a folder of another config, or whose config no
// longer reads, starts over), then the checkpoint is read with the bounds of this command's.
std::optional<Checkpoint> resumable(const std::string& dir, const Config& cfg) {
  const std::string want = resume_identity(to_yaml(cfg));
  const auto had =
      try_read_own_file((fs::path(dir) / "config.resolved.yaml").string(), kMaxConfigBytes);
  std::error_code ec;
  const bool saved = fs::exists(fs::symlink_status(checkpoint_path(dir), ec));
  std::optional<Checkpoint> c;
  if (saved && had && resume_identity(*had) == want) c = load_checkpoint(dir, cfg);
  if (saved && (!c || resume_identity(c->config_yaml) != want)) {
    log().warn("resume: the checkpoint in {} is of another config; the run starts over", dir);
    return std::nullopt;
  }
  return c;
}

// "" if the finished run in `dir` was run with `cfg`, else why --resume cannot reuse it.
std::string differs_from_finished(const std::string& dir, const Config& cfg) {
  const auto had = try_read_own_file((fs::path(dir) / "config.resolved.yaml").string(),
                                     kMaxConfigBytes);
  if (!had)
    return fmt::format("{}: --resume: this finished run has no config.resolved.yaml to compare "
                       "with; pick a new --tag",
                       dir);
  const std::string want = resume_identity(to_yaml(cfg));
  if (resume_identity(*had) == want) return "";
  // Name the first line that differs (a key of the resolved config), or the end of one.
  std::istringstream a(resume_identity(*had)), b(want);
  std::string la, lb;
  for (;;) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a) la = "(end of file)";
    if (!more_b) lb = "(end of file)";
    if (!more_a || !more_b || la != lb) break;
  }
  const auto trim = [](std::string& t) {
    t.erase(0, t.find_first_not_of(' '));
  };
  trim(la);
  trim(lb);
  return fmt::format(
      "{}: --resume: this run finished with another config (it has '{}', this command asks "
      "for '{}'); pick a new --tag to run the changed experiment",
      dir, la, lb);
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
bool finished_meanwhile(bool leader, bool multi, const std::string& status,
                        const std::string& dir, const Config& cfg) {
  std::string verdict = "0";
  if (leader && (status == "done" || status == "diverged")) {
    const std::string why = differs_from_finished(dir, cfg);
    verdict = why.empty() ? "1" : "E" + why;
  }
  if (multi) mpi::broadcast(verdict);
  if (verdict[0] == 'E') throw UserError(verdict.substr(1));
  if (verdict == "1")
    log().info("resume: {} was finished by another command meanwhile ({}); skipped", dir, status);
  return verdict == "1";
}

}  // namespace

int run_run(const RunOptions& opt) {
  // Under mpirun/srun every process runs this function; rank 0 alone touches the results folder.
  const bool multi = mpi::initialized();
  const bool leader = !multi || mpi::rank() == 0;
  set_verbosity(opt.quiet || !leader);
  if (opt.resume && opt.tag.empty())
    throw UserError("--resume needs --tag: it continues the runs of an earlier command by name");
  const std::string tag = folder_tag(opt.tag, default_tag());
  const auto runs = plan_runs(opt.config, opt.overrides);

  if (multi)
    for (const auto& r : runs)
      if (r.config.gpus != mpi::size())
        throw UserError(fmt::format(
            "gpus={} but the launcher started {} processes; dtrain runs one replica per "
            "process, so set gpus={} or start {} processes",
            r.config.gpus, mpi::size(), mpi::size(), r.config.gpus));

  // Everything that can be checked is checked before the first step of the first run.
  std::vector<std::string> dirs;
  std::vector<bool> skip(runs.size(), false);
  std::vector<IndexRow> index;
  std::string fs_error;
  for (size_t i = 0; i < runs.size() && fs_error.empty(); ++i) {
    const auto& r = runs[i];
    const auto dir = (fs::path(opt.results) / r.config.name / run_id(tag, r)).string();
    for (const auto& d : dirs)
      if (d == dir) throw UserError(fmt::format("two runs of this command map to {}", dir));
    const std::string status = read_run_status(dir);
    if (leader && fs::exists(dir)) {
      if (!opt.resume)
        fs_error = fmt::format(
            "{}: run folder already exists; runs are never overwritten (pick another --tag or "
            "--results folder, or pass --resume)",
            dir);
      else if (const long pid = RunLock::holder(dir))
        fs_error = fmt::format(
            "{}: another dtrain process{} is writing this run; wait for it to finish", dir,
            pid > 0 ? fmt::format(" (pid {})", pid) : "");
      skip[i] = status == "done" || status == "diverged";
      // A finished run is only reused for the same experiment, never for a changed one.
      if (skip[i] && fs_error.empty()) fs_error = differs_from_finished(dir, r.config);
    }
    std::string ov;
    for (const auto& o : r.overrides) ov += (ov.empty() ? "" : " ") + o.text();
    index.push_back(
        {run_id(tag, r), skip[i] ? status : "pending", r.group, ov, dir, r.config.gpus});
    dirs.push_back(dir);
  }
  if (multi) {
    // Rank 0's view of the results folder decides for everyone.
    std::string decision = fs_error.empty() ? "" : "E" + fs_error;
    if (decision.empty())
      for (bool b : skip) decision += b ? '1' : '0';
    mpi::broadcast(decision);
    if (!decision.empty() && decision[0] == 'E')
      fs_error = decision.substr(1);
    else
      for (size_t i = 0; i < skip.size(); ++i) skip[i] = decision[i] == '1';
  }
  if (!fs_error.empty()) throw UserError(fs_error);
  // One data set in memory at a time: a sweep over data settings (train_limit, seeds of
  // synthetic data) would otherwise hold a copy per value. Every run's plan is checked before the
  // first starts, each data set loaded once for that; a run whose data differs from the one
  // before it loads its own again.
  std::unique_ptr<DataSplit> held;
  std::string held_key;
  auto data_for = [&](const Config& c) -> const DataSplit& {
    const std::string key = data_key(c);
    if (!held || held_key != key) {
      held.reset();
      log().info("loading data ({})", to_string(c.data.dataset));
      held = std::make_unique<DataSplit>(load_data(c.data, c.train.seed));
      held_key = key;
    }
    return *held;
  };
  {
    std::map<std::string, std::vector<size_t>> by_data;  // the runs of each data set
    std::string first_key;
    for (size_t i = 0; i < runs.size(); ++i)
      if (!skip[i]) {
        by_data[data_key(runs[i].config)].push_back(i);
        if (first_key.empty()) first_key = data_key(runs[i].config);
      }
    // The first run's data last, so that it stays loaded for that run.
    std::vector<std::string> order;
    for (const auto& [key, ids] : by_data)
      if (key != first_key) order.push_back(key);
    if (!first_key.empty()) order.push_back(first_key);
    for (const auto& key : order)
      for (size_t i : by_data[key]) check_plan(runs[i].config, data_for(runs[i].config));
  }
  // One index per experiment: every run of the tag with its current status, the earlier
  // commands' rows read once here.
  const auto index_path = [&](const std::string& name) {
    return (fs::path(opt.results) / name / ("index-" + tag + ".csv")).string();
  };
  std::map<std::string, std::vector<IndexRow>> earlier_rows;
  if (leader)
    for (const auto& r : runs)
      if (!earlier_rows.count(r.config.name))
        earlier_rows[r.config.name] = read_index(index_path(r.config.name));
  const auto tag_index = [&](const std::string& name) {
    std::vector<IndexRow> mine;
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].config.name == name) mine.push_back(index[i]);
    return merge_index(earlier_rows[name], mine);
  };
  auto save_index = [&] {
    if (!leader) return;
    for (const auto& exp : earlier_rows) {
      ensure_dir((fs::path(opt.results) / exp.first).string(), "results");
      write_index(index_path(exp.first), tag_index(exp.first));
    }
  };
  save_index();

  int failed = 0, skipped = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    if (stop_requested()) break;
    if (skip[i]) {
      log().info("resume: {} is {} already; skipped", run_id(tag, r), index[i].status);
      ++skipped;
      continue;
    }
    // Held for the whole run: no other command writes, moves or resumes this folder meanwhile,
    // and every decision about the folder is taken under it, from what it holds now.
    std::unique_ptr<RunLock> lock;
    std::unique_ptr<RunRecorder> rec;
    std::unique_ptr<Communicator> comm;
    std::optional<Checkpoint> resume_from;
    // The leader's setup is inside the try as well: under mpirun a leader that fails here (a
    // full disk, say) must end the job, not leave the other ranks waiting in a collective.
    try {
      std::string earlier;
      if (leader) {
        lock = std::make_unique<RunLock>(dirs[i]);
        earlier = read_run_status(dirs[i], /*held_here=*/true);
      }
      if (opt.resume && finished_meanwhile(leader, multi, earlier, dirs[i], r.config)) {
        index[i].status = earlier;
        ++skipped;
        save_index();
        continue;
      }
      // A run whose data differs from the one before it loads its own; a failure there is
      // this run's, recorded like any other.
      const DataSplit& data = data_for(r.config);
      std::string attempt;
      if (leader && opt.resume && fs::exists(dirs[i])) {
        resume_from = resumable(dirs[i], r.config);  // a damaged one stops here, nothing moved
        attempt = move_aside(dirs[i], earlier.empty() ? "incomplete" : earlier);
      }
      if (multi) {  // every rank continues from rank 0's checkpoint
        std::string bytes = resume_from ? encode_checkpoint(*resume_from) : "";
        mpi::broadcast(bytes);
        if (!leader && !bytes.empty()) resume_from = decode_checkpoint(bytes, "rank 0's checkpoint");
      }
      if (runs.size() > 1) log().info("=== run {}/{} ===", i + 1, runs.size());
      if (leader)
        rec =
            std::make_unique<RunRecorder>(dirs[i], run_id(tag, r), r.group, r.config, r.overrides);
      if (rec && resume_from) {
        rec->resume(*resume_from);  // saved in the new folder before the old copy goes
        std::error_code ec;
        fs::remove(checkpoint_path(attempt), ec);
      }
      // The known pitfalls of this config, in the run's log (dtrain doctor prints the same).
      if (leader)
        for (const auto& f : diagnose(r.config, &data)) log().warn("{}", to_line(f));
      index[i].status = "running";
      save_index();
      TrainResult result;
      const Checkpoint* from = resume_from ? &*resume_from : nullptr;
      if (multi) {
        comm = mpi::world(r.config.train.collective_timeout_s);
        const LastWord last_word(rec.get(), run_id(tag, r));
        result = train_rank(r.config, data, *comm, rec.get(), from);
      } else {
        result = train(r.config, data, rec.get(), from);
      }
      if (rec) rec->finish(result);
      index[i].status = result.status == RunStatus::diverged ? "diverged" : "done";
    } catch (const Interrupted& e) {
      // Every rank stopped at the same step, after the checkpoint was written.
      if (rec) {
        rec->interrupt(e.what());
        log().warn("to continue: the same command with --resume --tag {}",
                   opt.resume_tag.empty() ? tag : opt.resume_tag);
      }
      index[i].status = "interrupted";
      save_index();
      break;
    } catch (const std::exception& e) {
      // Rank 0 records the failure first: when a peer died, the launcher is about to kill
      // every rank, and telling the others may take a moment.
      if (rec) rec->fail(e.what());
      // Failed before this command wrote the folder (another process holds it, a damaged
      // checkpoint, a run finished meanwhile with another config): the folder's own status
      // stands; a run with no folder yet failed here.
      const std::string on_disk =
          !rec && leader ? read_run_status(dirs[i], /*held_here=*/lock != nullptr) : "";
      index[i].status = on_disk.empty() ? "failed" : on_disk;
      ++failed;
      save_index();
      const bool remote = dynamic_cast<const Aborted*>(&e) != nullptr;
      if (multi && comm && !remote) comm->abort(e.what());  // then tell the other ranks
      if (multi) {
        // A rank's failure ends the job: rank 0 has recorded it; every process exits now.
        std::fprintf(stderr, "dtrain: rank %d: run %s failed: %s\n", mpi::rank(),
                     run_id(tag, r).c_str(), e.what());
        mpi::end_job_after_failure(1);
      }
      log().error("run {} failed: {}", run_id(tag, r), e.what());
      if (dynamic_cast<const UserError*>(&e)) throw;
    }
    save_index();
  }
  if (!leader) return stop_requested() ? stop_exit_code() : 0;
  if (skipped) log().info("resume: {} of {} runs were already finished", skipped, runs.size());

  // The table is regenerated from the run folders, grouped by experiment.
  std::map<std::string, std::vector<RunRecord>> by_experiment;
  for (const auto& exp : earlier_rows) {
    const std::string& name = exp.first;
    for (const auto& d : index_dirs(fs::path(opt.results) / name, tag_index(name))) {
      if (!fs::exists(fs::path(d) / "summary.json")) continue;
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
  for (const auto& [name, records] : by_experiment) {
    const auto cmp = compare(records);
    const std::string base = (fs::path(opt.results) / name / ("comparison-" + tag)).string();
    write_file_atomic(base + ".md", to_markdown(cmp));
    write_file_atomic(base + ".csv", to_csv(cmp));
    if (opt.print_table)
      fmt::print("\n## {}\n\n{}\n(written to {}.md and .csv)\n", name, to_markdown(cmp), base);
  }
  if (stop_requested()) {
    log().warn("interrupted");
    return stop_exit_code();
  }
  return failed ? 1 : 0;
}

}  // namespace dtrain::cli
