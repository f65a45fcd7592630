#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/results/batch_law.hpp"
#include "dtrain/results/plots.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/reference.hpp"
#include "dtrain/results/report.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;

namespace {
using RunsByExperiment = std::map<std::string, std::vector<RunRecord>>;

// The replica count a run folder's config.resolved.yaml (written as the run starts) asks for;
// 0 where that file is missing or unreadable.
int started_gpus(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.resolved.yaml").string();
  try {
    const auto text = try_read_own_file(path, kMaxResolvedConfigBytes);
    return text ? parse_config(*text, path).gpus : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// Whether two run folders hold the same summary.json, byte for byte (a copy of one run).
bool same_summary(const std::string& a, const std::string& b) {
  const auto text = [](const std::string& dir) {
    return try_read_own_file((fs::path(dir) / "summary.json").string(), kMaxSummaryBytes);
  };
  const auto x = text(a);
  return x && x == text(b);
}

// Reads every run folder; a broken run is reported, named, and does not stop the others.
RunsByExperiment read_runs(const std::vector<std::string>& dirs, int& unreadable) {
  RunsByExperiment by_experiment;
  for (const auto& d : dirs) {
    try {
      auto r = load_run(d);
      auto& runs = by_experiment[r.experiment];
      // A second folder of one run (a copy, a backup passed with the study) would count as
      // another seed: the same run id and the same summary, byte for byte, count once.
      const auto same = std::find_if(runs.begin(), runs.end(), [&](const RunRecord& o) {
        return o.run_id == r.run_id && o.status.rfind("unreadable", 0) != 0 &&
               same_summary(o.dir, d);
      });
      if (same != runs.end()) {
        std::fprintf(stderr, "dtrain: warning: %s is a copy of %s (run %s of %s, the same "
                             "summary); counted once\n",
                     one_line(d.c_str()).c_str(), one_line(same->dir.c_str()).c_str(),
                     r.run_id.c_str(), r.experiment.c_str());
        continue;
      }
      runs.push_back(std::move(r));
    } catch (const UserError& e) {
      RunRecord r;
      r.dir = d;
      // Folder names go into tables and the terminal: without control characters or '|'.
      const auto cell = [](std::string text) {
        text = one_line(text.c_str());
        std::replace(text.begin(), text.end(), '|', '?');
        return text;
      };
      r.run_id = cell(folder_name(d));
      r.experiment = cell(fs::path(d).parent_path().filename().string());
      const std::string st = read_run_status(d);
      std::error_code ec;
      const bool summary = fs::exists(fs::symlink_status(fs::path(d) / "summary.json", ec));
      if (st == "running" && !summary) {
        // A run still training (its process holds the lock): listed as such, not a failure.
        r.status = st;
      } else {
        ++unreadable;
        std::fprintf(stderr, "dtrain: warning: %s\n", one_line(e.what()).c_str());
        r.status = st.empty() ? "unreadable" : "unreadable (" + st + ")";
        r.error = e.what();
        // Its replica count from the config it started with, so that a killed run of fewer
        // replicas is no run of more replicas' reason to be its own baseline at 1.00x.
        r.gpus = started_gpus(d);
        r.group_unknown = true;
      }
      by_experiment[r.experiment].push_back(std::move(r));
    }
  }
  return by_experiment;
}

// A previous report in the same place is replaced as a whole: the files it listed go first.
void remove_previous_report(const std::string& out, const fs::path& manifest) {
  const auto listed = try_read_own_file(manifest.string(), kMaxIndexBytes);
  if (!listed) return;
  std::istringstream old(*listed);
  // The manifest lies in a folder that may come from elsewhere: only plain files (or links)
  // directly in `out` are removed, never a folder.
  for (std::string f; std::getline(old, f);) {
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos) continue;
    std::error_code ec;
    const auto st = fs::symlink_status(fs::path(out) / f, ec);
    if (!ec && (fs::is_regular_file(st) || fs::is_symlink(st))) fs::remove(fs::path(out) / f, ec);
  }
  fs::remove_all(fs::path(out) / "data");
}

// What went wrong in an experiment's report, each counted for the exit code (1) and its line.
struct ReportTrouble {
  int figures = 0;  // figures gnuplot could not draw
  int metrics = 0;  // runs whose metrics.csv is missing or damaged (their curves left out)
  ReportTrouble& operator+=(const ReportTrouble& o) {
    figures += o.figures;
    metrics += o.metrics;
    return *this;
  }
};

// Draws the figures of one experiment.
ReportTrouble write_figures(const Comparison& cmp, const std::string& stem_name,
                            const std::string& out, std::string& index,
                            std::vector<std::string>& written) {
  std::map<std::string, std::vector<EpochRow>> metrics;
  int unreadable = 0;
  for (const auto& row : cmp.rows) {
    // Unreadable, or still training (no summary yet): no curves.
    if (row.run.status.rfind("unreadable", 0) == 0 || row.run.status == "running") continue;
    try {
      const auto& m = metrics[row.run.dir] = load_metrics(row.run.dir);
      // A file cut short (a copy that stopped, a disk that filled) or with rows the summary does
      // not count: said, not drawn as if it matched.
      if (static_cast<int64_t>(m.size()) != row.run.epochs_completed)
        std::fprintf(stderr,
                     "dtrain: warning: %s/metrics.csv: %zu epoch rows, but summary.json counts "
                     "%d finished epochs; the curves show what the file holds\n",
                     one_line(row.run.dir.c_str()).c_str(), m.size(), row.run.epochs_completed);
    } catch (const UserError& e) {
      std::fprintf(stderr, "dtrain: warning: %s\n", one_line(e.what()).c_str());
      ++unreadable;
    }
  }
  const Plots plots = write_plots(cmp, metrics, out, stem_name);
  for (const auto& s : plots.stems) {
    index += fmt::format("\n![{0}]({0}.png)\n", s);
    written.push_back(s + ".png");
    written.push_back(s + ".svg");
  }
  // Figures with nothing to draw are skipped, not fatal; a gnuplot failure is reported like an
  // unreadable run: the rest is written and the exit code says 1.
  for (const auto& n : plots.notes) {
    std::fprintf(stderr, "dtrain: note: %s\n", n.c_str());
    index += "\n" + n + ".\n";
  }
  for (const auto& f : plots.failures) {
    std::fprintf(stderr, "dtrain: warning: %s\n", f.c_str());
    index += "\n" + f + ".\n";
  }
  return {static_cast<int>(plots.failures.size()), unreadable};
}

// --batch-law --plots: the law's figure as STEM.png and .svg; returns 1 where gnuplot failed.
int write_law_figure(const BatchLaw& law, const std::string& name, const std::string& stem,
                     const std::string& out, std::string& index,
                     std::vector<std::string>& written) {
  if (law.rows.empty()) {  // nothing to draw: said, as for the other figures
    const std::string note = fmt::format("figure {}: no batch reached the target", stem);
    std::fprintf(stderr, "dtrain: note: %s\n", note.c_str());
    index += "\n" + note + ".\n";
    return 0;
  }
  const std::string error =
      draw_batch_law(law, name + ": steps to the target against the global batch", out, stem);
  if (!error.empty()) {
    std::fprintf(stderr, "dtrain: warning: figure %s not drawn: %s\n", stem.c_str(),
                 error.c_str());
    index += fmt::format("\nfigure {} not drawn: {}.\n", stem, error);
    return 1;
  }
  index += fmt::format("\n![{0}]({0}.png)\n", stem);
  written.push_back(stem + ".png");
  written.push_back(stem + ".svg");
  return 0;
}

// One table as FILE.md, .csv and .json under `out`, printed, and linked from the index.
void write_tables(const std::string& title, const std::string& file, const std::string& md,
                  const std::string& csv, const std::string& json, const std::string& out,
                  std::string& index, std::vector<std::string>& written) {
  const std::string stem = (fs::path(out) / file).string();
  write_file_atomic(stem + ".md", "# " + title + "\n\n" + md);
  write_file_atomic(stem + ".csv", csv);
  write_file_atomic(stem + ".json", json);
  for (const char* ext : {".md", ".csv", ".json"}) written.push_back(file + ext);
  fmt::print("\n## {}\n\n{}", title, md);
  index +=
      fmt::format("\n## {}\n\n{}\nTables: [{}.md]({}.md), [{}.csv]({}.csv), [{}.json]({}.json)\n",
                  title, md, file, file, file, file, file, file);
}

// The `--by` table of one experiment, beside its comparison table.
void write_aggregate(const std::string& name, const std::string& stem_name,
                     const std::vector<RunRecord>& runs, const std::vector<std::string>& by,
                     const std::string& out, std::string& index,
                     std::vector<std::string>& written) {
  const Aggregate agg = aggregate(runs, by);
  write_tables(fmt::format("{}, by {}", name, fmt::join(by, " and ")),
               stem_name + "-by-" + slug(fmt::format("{}", fmt::join(by, "+"))), to_markdown(agg),
               to_csv(agg), to_json(agg), out, index, written);
}

// Writes one experiment's tables (and figures) as STEM.*.
// `ref`: the reference convergence points its runs are judged against (--reference), or null.
ReportTrouble write_experiment(const std::string& name, const std::string& stem_name,
                               const std::vector<RunRecord>& runs, const ReportOptions& opt,
                               const Reference* ref, const std::string& out, std::string& index,
                               std::vector<std::string>& written) {
  bool has_baseline = false;
  for (const auto& r : runs) has_baseline = has_baseline || r.run_id == opt.baseline;
  const auto cmp = compare(runs, has_baseline ? opt.baseline : "");
  const std::optional<BatchLaw> law =  // refused (runs of other targets) before anything is written
      opt.batch_law ? std::optional<BatchLaw>(batch_law(runs)) : std::nullopt;
  write_tables(name, stem_name, to_markdown(cmp), to_csv(cmp), to_json(cmp), out, index, written);
  if (!opt.by.empty()) write_aggregate(name, stem_name, runs, opt.by, out, index, written);
  if (law) {
    write_tables(name + ", batch-size law", stem_name + "-batch-law", to_markdown(*law),
                 to_csv(*law), to_json(*law), out, index, written);
    write_tables(name + ", every learning rate tried", stem_name + "-batch-law-lrs",
                 tried_markdown(*law), tried_csv(*law), tried_json(*law), out, index, written);
    const Reference own = reference_points(runs);
    write_tables(name + ", reference convergence points", stem_name + "-reference",
                 to_markdown(own), to_csv(own), to_json(own), out, index, written);
  }
  ReportTrouble trouble;
  if (law && opt.plots)
    trouble.figures = write_law_figure(*law, name, stem_name + "-batch-law", out, index, written);
  if (ref) {
    const auto checks = check_against(*ref, runs);
    write_tables(name + ", against the reference", stem_name + "-vs-reference",
                 checks_markdown(*ref, checks), checks_csv(checks), checks_json(checks), out,
                 index, written);
  }
  if (opt.plots) trouble += write_figures(cmp, stem_name, out, index, written);
  return trouble;
}

// --reference: each experiment's reference convergence points from the study's runs of the
// same experiment, built before anything is written (a study without the experiment, or with
// runs of different targets, is refused).
std::map<std::string, Reference> read_references(const std::string& study,
                                                 const RunsByExperiment& checked,
                                                 int& unreadable) {
  std::map<std::string, Reference> refs;
  if (study.empty()) return refs;
  const RunsByExperiment runs = read_runs(find_run_dirs({study}), unreadable);
  for (const auto& [name, mine] : checked) {
    const auto it = runs.find(name);
    if (it == runs.end()) {
      std::vector<std::string> names;
      for (const auto& [n, rs] : runs) names.push_back("'" + n + "'");
      throw UserError(fmt::format("--reference {}: no runs of experiment '{}' (it has {})", study,
                                  name, names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
    }
    const Reference ref = reference_points(it->second);
    if (!(ref.target_accuracy > 0) && !(ref.target_loss > 0))
      throw UserError(fmt::format(
          "--reference {}: its runs of '{}' set no target (train.target_accuracy or "
          "train.target_loss), so they have no epochs to a target to compare with; give a study "
          "whose runs set one",
          study, name));
    refs.emplace(name, ref);
  }
  return refs;
}
// Links to folders are not followed: named, so that runs behind one are not missed unsaid.
void note_linked_folders(const std::vector<std::string>& linked) {
  if (linked.empty()) return;
  std::vector<std::string> names;
  for (size_t i = 0; i < linked.size() && i < 3; ++i) names.push_back(printable(linked[i]));
  fmt::print(stderr,
             "dtrain: report: {} link{} to a folder not followed ({}{}); give a link as a path "
             "to include the runs behind it\n",
             linked.size(), linked.size() == 1 ? "" : "s", fmt::join(names, ", "),
             linked.size() > 3 ? ", ..." : "");
}

}  // namespace

void setup_report(CLI::App& app, ReportOptions& opt) {
  app.add_option("paths", opt.paths,
                 "Run folders, experiment folders or results roots (searched recursively)")
      ->required();
  app.add_option("--out", opt.out, "Where to write the report (default: FIRST_PATH/report)")
      ->check(non_empty());
  app.add_option("--baseline", opt.baseline,
                 "Run id to compare every run of its experiment with (default: the finished run "
                 "with the fewest replicas among those with the same overrides but gpus)")
      ->check(non_empty("a run id"));
  app.add_flag("--plots", opt.plots, "Also draw PNG and SVG figures (needs gnuplot)");
  app.add_option("--by", opt.by,
                 "Config key to aggregate over, e.g. train.seed (repeatable): runs that differ "
                 "only in it form one row, with the mean and standard deviation of their results")
      ->allow_extra_args(false);
  app.add_flag("--batch-law", opt.batch_law,
               "Steps to the target against the global batch: each batch's best LR, the fit "
               "S = S_min (1 + B_noise / B) and the measured noise scale B_simple, and the "
               "reference convergence points (epochs to target per batch, MLPerf's procedure)");
  app.add_option("--reference", opt.reference,
                 "A batch-size study's folder (run with --batch-law's sweep): judge each run's "
                 "epochs to the target against the study's at the run's global batch")
      ->check([](const std::string& s) {
        return s.empty() ? std::string("give the folder of a batch-size study") : std::string();
      });
}

int run_report(const ReportOptions& opt) {
  // Before anything is written: a missing gnuplot or an unknown key is the user's to fix, not a
  // half report.
  if (opt.plots && !gnuplot_available())
    throw UserError(
        "--plots needs gnuplot; install it with: apt-get install gnuplot-nox "
        "(scripts/install-deps.sh does)");
  check_by_keys(opt.by);
  std::vector<std::string> linked;
  const auto dirs = find_run_dirs(opt.paths, &linked);
  note_linked_folders(linked);
  if (dirs.empty())
    throw UserError(fmt::format("no run folders (folders with a 'status' file) under {}",
                                fmt::join(opt.paths, ", ")));
  const std::string out =
      opt.out.empty() ? (fs::path(opt.paths.front()) / "report").string() : opt.out;
  refuse_run_folder_output(out, "--out", /*folder=*/true);

  int unreadable = 0;
  ReportTrouble trouble;
  const RunsByExperiment by_experiment = read_runs(dirs, unreadable);
  if (!opt.baseline.empty()) {
    bool found = false;
    for (const auto& [name, runs] : by_experiment)
      for (const auto& r : runs) found = found || r.run_id == opt.baseline;
    if (!found)
      throw UserError(fmt::format("--baseline {}: no such run under {}", opt.baseline,
                                  fmt::join(opt.paths, ", ")));
  }

  // A study's unreadable run is named and counted like the report's own (exit 1).
  const std::map<std::string, Reference> refs =
      read_references(opt.reference, by_experiment, unreadable);

  ensure_dir(out, "report");
  const fs::path manifest = fs::path(out) / ".manifest";
  remove_previous_report(out, manifest);
  std::vector<std::string> written = {"index.md"};
  std::string index = "# dtrain report\n\nRegenerated from " + std::to_string(dirs.size()) +
                      " run folders under " + fmt::format("{}", fmt::join(opt.paths, ", ")) + ".\n";
  // Names that differ but slug the same ("x{" and "x}") get their own files: x_, x_-2, ...; an
  // experiment named index gets index-2 (index.md is the overview's), one named ".." _..
  // (never a hidden file).
  std::map<std::string, int> stems = {{"index", 1}};
  for (const auto& [name, runs] : by_experiment) {
    std::string base = slug(name);
    if (base.empty() || base.front() == '.') base = "_" + base;
    const int n = ++stems[base];
    const std::string stem_name = n == 1 ? base : fmt::format("{}-{}", base, n);
    const auto ref = refs.find(name);
    trouble += write_experiment(name, stem_name, runs, opt,
                                ref == refs.end() ? nullptr : &ref->second, out, index, written);
  }
  write_file_atomic((fs::path(out) / "index.md").string(), index);
  write_file_atomic(manifest.string(), fmt::format("{}\n", fmt::join(written, "\n")));
  fmt::print("\n(report written to {}/)\n", printable(out, true));
  if (unreadable)
    std::fprintf(stderr, "dtrain: %d run folder%s could not be read; see the warnings above\n",
                 unreadable, unreadable == 1 ? "" : "s");
  if (trouble.metrics)
    std::fprintf(stderr,
                 "dtrain: %d run%s metrics.csv could not be read (curves left out); see the "
                 "warnings above\n",
                 trouble.metrics, trouble.metrics == 1 ? "'s" : "s'");
  if (trouble.figures)
    std::fprintf(stderr, "dtrain: %d figure%s could not be drawn; see the warnings above\n",
                 trouble.figures, trouble.figures == 1 ? "" : "s");
  return unreadable || trouble.metrics || trouble.figures ? 1 : 0;
}

}  // namespace dtrain::cli
