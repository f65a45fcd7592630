#include "dtrain/results/plots.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/hash.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/results/run_schema.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

std::string num(double v) {
  return std::isfinite(v) ? fmt::format("{:.9g}", v) : "?";
}

// Every file name written into a gnuplot script is one of ours: a slug() of a name plus a fixed
// suffix. Checked here so that no quote, newline or other code can ever get into a script
// that way, whatever slug() becomes.
const std::string& script_name(const std::string& name) {
  const bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-' || ch == '+';
  });
  if (!ok) DTRAIN_THROW_SYSTEM(fmt::format("unsafe file name for a gnuplot script: {}", name));
  return name;
}

// `name` short enough for any file system (255 bytes, with room for a temporary suffix): a long
// one (a long experiment name, many overrides in a group) keeps its start and its end (the
// series and the suffix) around a hash of the whole, so that two long names stay apart.
// A figure's stem is fitted to 140, so that its files (STEM.strings, STEM.gp) fit as they are.
std::string fitted(const std::string& name, size_t max = 160) {
  constexpr size_t kTail = 32;
  if (name.size() <= max) return name;
  return fmt::format("{}-{:016x}-{}", name.substr(0, max - kTail - 18),
                     text_hash(name.data(), name.size()), name.substr(name.size() - kTail));
}

// Writes a data file into `dir`; returns how a script run in `dir` names it.
std::string data_file(const fs::path& dir, const std::string& name, const std::string& text) {
  const std::string file = fitted(name);
  write_file_atomic((dir / script_name(file)).string(), text);
  return "'" + file + "'";
}

// gnuplot on PATH. Relative entries (and the empty one, meaning the current folder) are
// skipped: a report often runs inside a results folder that someone else wrote.
std::string find_gnuplot() {
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "";
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (!dir.empty() && dir[0] == '/') {
      const std::string exe = dir + "/gnuplot";
      std::error_code ec;
      if (fs::is_regular_file(exe, ec) && ::access(exe.c_str(), X_OK) == 0) return exe;
    }
    start = end + 1;
  }
  return "";
}

// ": " and the last line of gnuplot's messages in `log`, where it wrote any (at most 300
// bytes, control characters shown as '?').
std::string last_line_of(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  if (last.empty()) return "";
  if (last.size() > 300) last.resize(300);
  return ": " + printable(last);
}

// Runs `exe ./script` inside `dir` with an argv, never through a shell, its messages (warnings
// such as an empty range where a run has one epoch) into `log`. Returns the exit code,
// 128 + signal when killed, or -1 when it could not be started.
int run_gnuplot(const std::string& exe, const fs::path& dir, const std::string& script,
                const fs::path& log) {
  const std::string cwd = dir.string(), log_file = log.string();
  const std::string arg = "./" + script;  // "./": a name starting with '-' is not an option
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>(arg.c_str()),
                             nullptr};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    unblock_stop_signals_in_child();  // dtrain routes them to a thread of its own
    const int null_in = ::open("/dev/null", O_RDONLY);
    if (null_in >= 0) ::dup2(null_in, 0);
    const int out = ::open(
        log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
    if (out < 0) ::_exit(125);
    ::dup2(out, 1);
    ::dup2(out, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One figure, drawn from data/STEM.gp into data/STEM.png and .svg, then moved next to the
// tables. Its strings (titles and legend entries, which hold experiment, group and status
// names from summary.json) never enter the script: they go to data/STEM.strings, one block
// per string with one byte per line as a decimal code, and the script rebuilds them into
// variables s0, s1, ... with `stats`. gnuplot reads them as numbers, so quotes, backquotes,
// @macros and newlines in a name stay characters.
class Figure {
 public:
  Figure(fs::path dir, const std::string& stem)
      : dir_(std::move(dir)), stem_(script_name(fitted(stem, 140))) {}

  const std::string& stem() const { return stem_; }

  // The gnuplot variable that will hold `s`.
  std::string text(const std::string& s) {
    strings_.push_back(s);
    return fmt::format("s{}", strings_.size() - 1);
  }

  // Renders `setup` and `plot` (gnuplot commands made only of our own text, numbers, data file
  // names and the variables from text()) to PNG and SVG in out_dir. Returns "" or what failed.
  std::string render(const std::string& gnuplot, const fs::path& out_dir, const std::string& setup,
                     const std::string& plot) const {
    std::string codes = "# strings of " + stem_ + ".gp: one block per string, one byte per line\n";
    std::string script = fmt::format(
        "# {0}, drawn by dtrain report; to restyle, edit and run in this folder: gnuplot {0}.gp\n"
        "# Titles are read as data from {0}.strings into s0, s1, ...\n",
        stem_);
    const std::string strings_file = stem_ + ".strings";
    for (size_t k = 0; k < strings_.size(); ++k) {
      if (k) codes += "\n\n";
      codes += "0\n";  // every block has a line, also for an empty string; 0 adds nothing
      for (const char ch : strings_[k]) {
        const auto b = static_cast<unsigned char>(ch);
        // Control characters (other than newline) would make the SVG invalid XML.
        codes += fmt::format("{}\n", (b < 0x20 && b != '\n') || b == 0x7f ? ' ' : b);
      }
      script += fmt::format(
          "s{0} = \"\"\nstats '{1}' index {0} using (s{0} = s{0} . ($1 > 0 ? sprintf(\"%c\", "
          "int($1)) : \"\"), 0) nooutput\n",
          k, strings_file);
    }
    if (!strings_.empty()) data_file(dir_, strings_file, codes);
    const std::string png = stem_ + ".png", svg = stem_ + ".svg";
    script += fmt::format(
        "set datafile missing '?'\n"
        "set terminal pngcairo size 1100,600 font 'sans,11' noenhanced\n"
        "set output '{}'\n{}\n{}\nset output\n"
        "set terminal svg size 1100,600 font 'sans,11' noenhanced\n"
        "set output '{}'\n{}\n{}\nset output\n",
        png, setup, plot, svg, setup, plot);
    const std::string script_file = stem_ + ".gp";
    data_file(dir_, script_file, script);
    std::error_code ec;
    const fs::path log = dir_ / (stem_ + ".log");
    // Ours to replace, whatever stands there (a FIFO would hold gnuplot's open of it).
    for (const auto& f : {fs::path(png), fs::path(svg), log.filename()}) fs::remove(dir_ / f, ec);
    const int rc = run_gnuplot(gnuplot, dir_, script_file, log);
    if (rc != 0)
      return rc == 125 ? fmt::format("gnuplot's log {} cannot be written", log.string())
                       : fmt::format("gnuplot {} on {}{}",
                                     rc < 0 ? "could not be started"
                                            : fmt::format("exited with {}", rc),
                                     (dir_ / script_file).string(), last_line_of(log));
    for (const auto& f : {png, svg}) {
      fs::rename(dir_ / f, out_dir / f, ec);
      if (ec) return fmt::format("gnuplot left no {} ({})", (dir_ / f).string(), ec.message());
    }
    return "";
  }

 private:
  fs::path dir_;
  std::string stem_;
  std::vector<std::string> strings_;
};

std::string series_title(const RunRecord& r) {
  std::string t = fmt::format("{} replica{}", r.gpus, r.gpus == 1 ? "" : "s");
  if (r.status != "done") t += " (" + r.status + ")";
  return t;
}

// A panel with nothing to plot: a note in its middle instead of gnuplot failing on an empty
// range. `what` is our own text.
std::string empty_panel(const std::string& what) {
  return fmt::format(
      "set label 1 '{}' at graph 0.5, 0.5 center\nset xrange [0:1]\nset yrange [0:1]\n"
      "unset xtics\nunset ytics\nplot -1 notitle\n"
      "unset label 1\nset xrange [*:*]\nset yrange [*:*]\nset xtics\nset ytics",
      what);
}

}  // namespace

bool gnuplot_available() {
  return !find_gnuplot().empty();
}

namespace {

// One call of write_plots: where figures go, and what came of each.
struct PlotSet {
  const Comparison& c;
  const std::map<std::string, std::vector<EpochRow>>& metrics;
  std::string gnuplot, out_dir;
  fs::path data;
  std::string exp;  // the experiment's name as a file-name stem
  Plots out;

  void draw(const Figure& f, const std::string& setup, const std::string& plot) {
    const std::string error = f.render(gnuplot, out_dir, setup, plot);
    if (error.empty())
      out.stems.push_back(f.stem());
    else
      out.failures.push_back(fmt::format("figure {} not drawn: {}", f.stem(), error));
  }
  void curves(const std::string& g);
  void scaling(const std::vector<std::string>& groups);
  void heatmap(const std::string& rule, const std::string& reduction);
  void devices(const RunRecord& r);
};

// 1. Test accuracy and train loss against epoch, one line per replica count, per group.
//    A run (a diverged one, say) adds a line only to the panels where it has finite values.
void PlotSet::curves(const std::string& g) {
  std::vector<const ComparisonRow*> rows;
  for (const auto& row : c.rows)
    if (row.run.group == g && metrics.count(row.run.dir)) rows.push_back(&row);
  if (rows.empty()) return;
  std::sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->run.gpus < b->run.gpus; });
  std::string stem = exp + "-curves";
  if (!g.empty()) stem += '-' + slug(g);
  Figure fig(data, stem);
  std::string acc_plot, loss_plot;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i]->run;
    std::string text = "# epoch test_acc_percent train_loss\n";
    bool has_acc = false, has_loss = false;
    for (const auto& e : metrics.at(r.dir)) {
      text += fmt::format("{} {} {}\n", e.epoch, num(100 * e.test_acc), num(e.train_loss));
      has_acc = has_acc || std::isfinite(e.test_acc);
      has_loss = has_loss || (std::isfinite(e.train_loss) && e.train_loss > 0);  // log scale
    }
    const std::string file = data_file(data, fmt::format("{}-{}.dat", stem, i), text);
    // A fixed line type per run keeps its colour the same in both panels.
    const std::string style =
        fmt::format("with linespoints lt {} lw 2 title {}", i + 1, fig.text(series_title(r)));
    if (has_acc)
      acc_plot += fmt::format("{}{} using 1:2 {}", acc_plot.empty() ? "plot " : ", ", file, style);
    if (has_loss)
      loss_plot +=
          fmt::format("{}{} using 1:3 {}", loss_plot.empty() ? "plot " : ", ", file, style);
  }
  if (acc_plot.empty() && loss_plot.empty()) {
    out.notes.push_back(
        fmt::format("figure {} not drawn: no run has a finite test accuracy or train loss", stem));
    return;
  }
  if (acc_plot.empty()) {
    out.notes.push_back(fmt::format("figure {}: no run has a finite test accuracy", stem));
    acc_plot = empty_panel("no finite test accuracy");
  }
  if (loss_plot.empty()) {
    out.notes.push_back(fmt::format("figure {}: no run has a finite, positive train loss", stem));
    loss_plot = empty_panel("no finite train loss");
  } else {
    loss_plot = "set logscale y\n" + loss_plot + "\nunset logscale y";
  }
  const std::string title =
      fig.text(fmt::format("{}{}", c.experiment, g.empty() ? "" : " (" + g + ")"));
  draw(fig,
       fmt::format("set multiplot layout 1,2 title {}\nset grid\nset key bottom right\n"
                   "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'",
                   title),
       acc_plot + "\nset key top right\nset ylabel 'train loss (log scale)'\n" + loss_plot +
           "\nunset multiplot");
}

// 2 and 3. Speedup and efficiency against replica count, one line per group.
void PlotSet::scaling(const std::vector<std::string>& groups) {
  const auto scalable = [](const ComparisonRow& r) {
    return r.speedup && r.efficiency && std::isfinite(*r.speedup) && *r.speedup > 0 &&
           std::isfinite(*r.efficiency) && r.run.gpus > 0;
  };
  std::set<int> all_gpus;
  for (const auto& row : c.rows)
    if (scalable(row)) all_gpus.insert(row.run.gpus);
  if (all_gpus.size() < 2) return;
  Figure sp(data, exp + "-speedup"), eff(data, exp + "-efficiency");
  std::string sp_plot, eff_plot;
  int series = 0;
  // The ideal line starts at the smallest baseline replica count among the rows.
  int base_gpus = 0;
  for (const auto& row : c.rows)
    for (const auto& b : c.rows)
      if (scalable(row) && b.run.run_id == row.baseline && b.run.gpus > 0 &&
          (base_gpus == 0 || b.run.gpus < base_gpus))
        base_gpus = b.run.gpus;
  if (base_gpus == 0) base_gpus = *all_gpus.begin();
  for (const auto& g : groups) {
    std::vector<const ComparisonRow*> rows;
    for (const auto& row : c.rows)
      if (row.run.group == g && scalable(row)) rows.push_back(&row);
    if (rows.size() < 2) continue;
    std::sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->run.gpus < b->run.gpus; });
    std::string text = "# replicas speedup efficiency_percent\n";
    for (const auto* r : rows)
      text += fmt::format("{} {} {}\n", r->run.gpus, num(*r->speedup), num(100 * *r->efficiency));
    const std::string file = data_file(data, fmt::format("{}-scaling-{}.dat", exp, series), text);
    const std::string t = g.empty() ? "measured" : g;
    sp_plot += fmt::format(", {} using 1:2 with linespoints lw 2 pt 7 title {}", file, sp.text(t));
    eff_plot +=
        fmt::format(", {} using 1:3 with linespoints lw 2 pt 7 title {}", file, eff.text(t));
    ++series;
  }
  if (series > 0) {
    const int lo = *all_gpus.begin(), hi = *all_gpus.rbegin();
    const std::string xaxis = fmt::format(
        "set grid\nset logscale x 2\nset xrange [{}:{}]\nset xlabel 'replicas'\n"
        "set key outside right top\n",
        lo / 1.2, hi * 1.2);
    // Replicas that shared one machine measure what simulating them costs, not N devices.
    const bool simulated = std::any_of(c.rows.begin(), c.rows.end(), [&](const auto& r) {
      return scalable(r) && r.run.simulated;
    });
    const std::string sp_title = sp.text(
        fmt::format("{}: speedup (training samples/s against the baseline{})", c.experiment,
                    simulated ? "; replicas simulated on one machine, not N devices" : ""));
    draw(sp, xaxis + fmt::format("set title {}\nset ylabel 'speedup'\nset logscale y 2", sp_title),
         fmt::format("plot x/{} with lines dt 2 lc 'gray' title 'ideal'", base_gpus) + sp_plot);
    const std::string eff_title = eff.text(c.experiment + ": scaling efficiency");
    draw(eff,
         xaxis +
             fmt::format("set title {}\nset ylabel 'efficiency (%)'\nset yrange [0:*]", eff_title),
         "plot 100 with lines dt 2 lc 'gray' title 'ideal'" + eff_plot);
  } else {
    out.notes.push_back(fmt::format(
        "figures {0}-speedup and {0}-efficiency not drawn: no group has two finished runs "
        "with different replica counts",
        exp));
  }
}

// 4. Final test accuracy over LR x replica count for one LR rule and reduction.
void PlotSet::heatmap(const std::string& rule, const std::string& reduction) {
  auto in_kind = [&](const RunRecord& r) {
    return r.lr_scaling == rule && r.reduction == reduction;
  };
  std::set<double> lrs;
  std::set<int> gpus;
  for (const auto& row : c.rows)
    if (in_kind(row.run)) {
      lrs.insert(row.run.lr);
      gpus.insert(row.run.gpus);
    }
  if (lrs.size() < 2) return;
  const std::vector<double> lr_v(lrs.begin(), lrs.end());
  const std::vector<int> g_v(gpus.begin(), gpus.end());
  const std::string stem = exp + "-lr-heatmap-" + slug(rule) + "-" + slug(reduction);
  std::string text = "# replica_index lr_index final_test_acc_percent\n", missing;
  bool any = false;
  for (size_t yi = 0; yi < lr_v.size(); ++yi) {
    for (size_t xi = 0; xi < g_v.size(); ++xi) {
      double acc = std::nan("");
      for (const auto& row : c.rows)
        if (in_kind(row.run) && row.run.lr == lr_v[yi] && row.run.gpus == g_v[xi] &&
            row.run.final_test_acc)
          acc = 100 * *row.run.final_test_acc;
      text += fmt::format("{} {} {}\n", xi, yi, num(acc));
      if (std::isfinite(acc))
        any = true;
      else
        missing += fmt::format("{} {}\n", xi, yi);
    }
    text += "\n";
  }
  if (!any) {
    out.notes.push_back(fmt::format("figure {} not drawn: no run has a final test accuracy", stem));
    return;
  }
  Figure fig(data, stem);
  const std::string file = data_file(data, stem + ".dat", text);
  std::string xtics, ytics;
  for (size_t i = 0; i < g_v.size(); ++i)
    xtics += fmt::format("{}'{}' {}", i ? ", " : "", g_v[i], i);
  for (size_t i = 0; i < lr_v.size(); ++i)
    ytics += fmt::format("{}'{}' {}", i ? ", " : "", num(lr_v[i]), i);
  std::string plot = fmt::format(
      "plot {0} using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder fc palette "
      "notitle, {0} using 1:2:(sprintf('%.1f', $3)) with labels font 'sans,12' notitle",
      file);
  if (!missing.empty())
    plot += fmt::format(
        ", {} using 1:2:('no result') with labels font 'sans,10' textcolor 'gray40' notitle",
        data_file(data, stem + "-missing.dat", missing));
  const std::string title = fig.text(fmt::format(
      "{}: final test accuracy (%), lr_scaling {}, reduction {}", c.experiment, rule, reduction));
  draw(fig,
       fmt::format("set title {}\n"
                   "set xlabel 'replicas'\nset ylabel 'lr at base batch'\n"
                   "set xtics ({})\nset ytics ({})\nset xrange [-0.5:{}]\nset yrange "
                   "[-0.5:{}]\nset cblabel 'test accuracy (%)'\nset palette defined (0 "
                   "'#b2182b', 50 '#fddbc7', 100 '#2166ac')\nset cbrange [*:*]",
                   title, xtics, ytics, static_cast<double>(g_v.size()) - 0.5,
                   static_cast<double>(lr_v.size()) - 0.5),
       plot);
}

}  // namespace

namespace {

std::string gnuplot_or_throw() {
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    throw UserError(
        "figures need gnuplot; install it with: apt-get install gnuplot-nox "
        "(scripts/install-deps.sh does)");
  return gnuplot;
}

}  // namespace

std::string draw_waterfall(const std::vector<WaterfallBar>& bars, const std::string& title,
                           const std::string& out_dir, const std::string& stem) {
  const std::string gnuplot = gnuplot_or_throw();
  const fs::path data = fs::path(out_dir) / "data";
  fs::create_directories(data);
  Figure f(data, stem);
  // Columns: position, delta, half the 95% CI, 1 for a bar not distinguishable from the rung
  // before; tic labels are rung names (our own identifiers, checked), placed in the script by
  // position.
  std::string rows = "# rung delta_points half_ci_points not_distinguishable\n", tics;
  for (size_t i = 0; i < bars.size(); ++i) {
    rows += fmt::format("{} {} {} {}\n", i, num(bars[i].delta), num(bars[i].half_ci),
                        bars[i].not_distinguishable ? 1 : 0);
    tics += fmt::format("{}'{}' {}", i ? ", " : "", script_name(bars[i].label), i);
  }
  const std::string file = data_file(data, f.stem() + ".dat", rows);
  const std::string setup = fmt::format(
      "set title {}\nset ylabel 'change in final test accuracy (points) from the rung before'\n"
      "set xtics ({}) rotate by -30\nset xrange [-0.6:{}]\nset grid ytics\n"
      "set style fill solid 0.7 border -1\nset boxwidth 0.6\nset key top right\n"
      "set xzeroaxis lt -1",
      f.text(title), tics, num(static_cast<double>(bars.size()) - 0.4));
  const std::string plot = fmt::format(
      "plot {0} using 1:($4 > 0 ? NaN : $2) with boxes lc rgb '#3465a4' title 'change', "
      "{0} using 1:($4 > 0 ? $2 : NaN) with boxes fs pattern 4 lc rgb '#888a85' "
      "title 'not distinguishable (p >= 0.05)', "
      "{0} using 1:2:3 with yerrorbars lc rgb 'black' pt 0 title '95% CI'",
      file);
  return f.render(gnuplot, out_dir, setup, plot);
}

namespace {

// The batch-size law's vertical markers (the fitted critical batch, B_simple) and its fit's
// curves, as gnuplot commands of our own text and numbers; titles through `f`.
std::pair<std::string, std::string> law_fit_lines(const BatchLaw& law, Figure& f) {
  std::string setup, plot;
  const auto marker = [&](double b, const char* colour, const std::string& what) {
    setup += fmt::format(
        "\nset arrow from {0}, graph 0 to {0}, graph 1 nohead dt 3 lw 2 lc rgb '{1}'", num(b),
        colour);
    plot += fmt::format(", NaN with lines dt 3 lw 2 lc rgb '{}' title {}", colour, f.text(what));
  };
  const BatchLawFit& fit = law.fit;
  if (fit.ok) {
    plot += fmt::format(
        ", {0} * (1 + {1} / x) with lines lw 2 lc rgb '#cc0000' title {2}, {0} with lines dt 4 "
        "lc rgb '#cc0000' title {3}",
        num(fit.s_min), num(fit.b_noise),
        f.text(fmt::format("fit S = S_min (1 + B_noise / B), rms misfit {:.1f}%",
                           100 * fit.rms_relative)),
        f.text(fmt::format("S_min = {:.1f} steps", fit.s_min)));
    if (fit.b_noise > 0)
      marker(fit.b_noise, "#cc0000", fmt::format("B_noise (critical batch) = {:.0f}", fit.b_noise));
  }
  if (law.b_simple && *law.b_simple > 0)
    marker(*law.b_simple, "#4e9a06", fmt::format("B_simple (noise scale) = {:.0f}", *law.b_simple));
  return {setup, plot};
}

}  // namespace

std::string draw_batch_law(const BatchLaw& law, const std::string& title,
                           const std::string& out_dir, const std::string& stem) {
  if (law.rows.empty()) return "no batch reached the target: nothing to draw";
  const std::string gnuplot = gnuplot_or_throw();
  const fs::path data = fs::path(out_dir) / "data";
  fs::create_directories(data);
  Figure f(data, stem);
  std::string kept = "# global_batch steps_to_target (the LR kept, mean of its runs)\n";
  double lo = 0, hi = 0, floor = law.fit.ok ? law.fit.s_min : 0;  // batches; the fewest steps
  for (const BatchLawRow& r : law.rows) {
    const auto b = static_cast<double>(r.global_batch);
    kept += fmt::format("{} {}\n", num(b), num(r.steps));
    lo = lo > 0 ? std::min(lo, b) : b;
    hi = std::max(hi, b);
    floor = floor > 0 ? std::min(floor, r.steps) : r.steps;
  }
  std::string others =
      "# global_batch steps_to_target (an LR not kept, its runs that reached it)\n";
  int n_others = 0;
  for (const BatchLawRow& t : law.tried)
    if (!t.kept && t.reached > 0 && t.global_batch > 0 && t.steps > 0) {
      others += fmt::format("{} {}\n", t.global_batch, num(t.steps));
      floor = std::min(floor, t.steps);
      ++n_others;
    }
  // The markers (B_noise, B_simple) inside the range too.
  for (const double b : {law.fit.ok ? law.fit.b_noise : 0.0, law.b_simple.value_or(0.0)})
    if (b > 0 && std::isfinite(b)) lo = std::min(lo, b), hi = std::max(hi, b);
  const std::string kept_file = data_file(data, f.stem() + ".dat", kept);
  const BatchLawRow& first = law.rows.front();
  std::string plot = fmt::format(
      "plot {} using 1:2 with linespoints pt 7 ps 1.5 lw 2 lc rgb '#3465a4' title {}, "
      "{} * {} / x with lines dt 2 lc rgb 'black' title {}",
      kept_file, f.text("steps to the target at the best LR of each batch"),
      num(first.steps), num(static_cast<double>(first.global_batch)),
      f.text("perfect scaling: steps halve as the batch doubles"));
  if (n_others > 0)
    plot += fmt::format(", {} using 1:2 with points pt 6 ps 1.2 lc rgb '#888a85' title {}",
                        data_file(data, f.stem() + "-other-lrs.dat", others),
                        f.text("other LRs that reached the target"));
  const auto [markers, fit_plot] = law_fit_lines(law, f);
  const std::string setup = fmt::format(
      "set title {}\nset logscale xy\nset xrange [{}:{}]\nset yrange [{}:*]\nset samples 400\n"
      "set grid\nset key top right\nset xlabel 'global batch (samples per optimizer step)'\n"
      "set ylabel 'optimizer steps to the target'{}",
      f.text(title), num(lo / 1.5), num(hi * 1.5), num(floor / 2), markers);
  return f.render(gnuplot, out_dir, setup, plot + fit_plot);
}

namespace {

// One device's samples from devices.csv: seconds since the file's first sample, utilisation
// and (GPUs) memory used.
struct DeviceSeries {
  std::vector<double> t, util, mem_mib;
};

// A device name as dtrain writes it (process, replicaN, gpuN), or "" for anything else.
std::string device_name(const std::string& cell) {
  const auto tail = [&](const std::string& head) {
    return cell.size() > head.size() && cell.size() <= head.size() + 6 &&
           cell.compare(0, head.size(), head) == 0 &&
           std::all_of(cell.begin() + static_cast<long>(head.size()), cell.end(),
                       [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return cell == "process" || tail("replica") || tail("gpu") ? cell : "";
}

inline constexpr size_t kMaxDevicesBytes = size_t{256} << 20;  // a day at 100 ms, 20 devices
inline constexpr size_t kMaxDeviceSeries = 64;                   // lines in one figure

// devices.csv of a run folder by device ("replica3"; a process or GPU with its rank, "gpu0 on
// rank 1", since every process has its own); rows that are not dtrain's (a damaged file) are
// passed over. A file that cannot be read as the run's own (a link, too large) draws nothing:
// `why` says so.
std::map<std::string, DeviceSeries> read_devices(const std::string& dir, std::string& why) {
  std::map<std::string, DeviceSeries> out;
  const fs::path path = fs::path(dir) / "devices.csv";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return out;
  std::string text;
  try {
    text = read_own_file(path.string(), "devices.csv", kMaxDevicesBytes);
  } catch (const UserError& e) {
    why = e.what();
    return out;
  }
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // the header
  // Whole: dtrain's first column, and the line ended.
  const bool header = text.find('\n') != std::string::npos && line.rfind("unix_time_s,", 0) == 0;
  double t0 = std::numeric_limits<double>::quiet_NaN();
  size_t passed_over = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; cells.size() < 8 && std::getline(ss, c, ',');) cells.push_back(c);
    std::string name = cells.size() < 7 ? "" : device_name(cells[3]);
    const auto t = name.empty() ? std::nullopt : metrics_value(cells[0]);
    const auto util = name.empty() ? std::nullopt : metrics_value(cells[4]);
    const auto rank = name.empty() ? std::nullopt : metrics_value(cells[2]);
    if (name.empty() || !t || !util || !rank || !std::isfinite(*t) || !std::isfinite(*util) ||
        *rank < 0 || *rank > 1e6) {
      passed_over += !line.empty();
      continue;
    }
    if (name.rfind("replica", 0) != 0)
      name += fmt::format(" on rank {}", static_cast<int>(*rank));
    if (!out.count(name) && out.size() >= kMaxDeviceSeries) {
      why = fmt::format("more than {} devices: the rest are not drawn", kMaxDeviceSeries);
      continue;
    }
    if (!std::isfinite(t0)) t0 = *t;
    const auto mem = metrics_value(cells[6]);
    DeviceSeries& s = out[name];
    s.t.push_back(*t - t0);
    s.util.push_back(*util);
    s.mem_mib.push_back(mem && std::isfinite(*mem) ? *mem : std::nan(""));
  }
  // Said, not drawn silently short (a damaged file). A whole header alone is a run shorter than
  // one sampling period: nothing to draw, nothing wrong.
  if (why.empty() && out.empty() && (passed_over > 0 || !header))
    why = fmt::format("{}: no sample dtrain wrote in it; nothing drawn", path.string());
  else if (why.empty() && passed_over)
    why = fmt::format("{}: {} row(s) not dtrain's passed over", path.string(), passed_over);
  return out;
}

}  // namespace

// 5. What each device did over time: utilisation, and GPU memory where there are GPUs.
void PlotSet::devices(const RunRecord& r) {
  std::string why;
  const auto series = read_devices(r.dir, why);
  const std::string stem = exp + "-devices-" + slug(r.run_id);
  if (!why.empty()) out.notes.push_back(fmt::format("figure {}: {}", stem, why));
  if (series.empty()) return;
  Figure fig(data, stem);
  std::string util_plot, mem_plot;
  int i = 0;
  for (const auto& [name, s] : series) {
    std::string text = "# seconds util_percent mem_used_mib\n";
    bool mem = false;
    for (size_t k = 0; k < s.t.size(); ++k) {
      text += fmt::format("{} {} {}\n", num(s.t[k]), num(s.util[k]), num(s.mem_mib[k]));
      mem = mem || std::isfinite(s.mem_mib[k]);
    }
    const std::string file = data_file(data, fmt::format("{}-{}.dat", stem, i), text);
    const std::string style =
        fmt::format("with lines lt {} lw 2 title {}", i + 1, fig.text(name));
    util_plot += fmt::format("{}{} using 1:2 {}", util_plot.empty() ? "plot " : ", ", file, style);
    if (mem)
      mem_plot += fmt::format("{}{} using 1:3 {}", mem_plot.empty() ? "plot " : ", ", file, style);
    ++i;
  }
  const std::string title = fig.text(c.experiment + " " + r.run_id + ": devices over time");
  const std::string layout = mem_plot.empty() ? "1,1" : "1,2";
  draw(fig,
       fmt::format("set multiplot layout {} title {}\nset grid\nset key bottom right\n"
                   "set xlabel 'seconds'\nset ylabel 'busy (%)'\nset yrange [0:*]",
                   layout, title),
       util_plot + (mem_plot.empty() ? "" : "\nset ylabel 'GPU memory used (MiB)'\n" + mem_plot) +
           "\nunset multiplot");
}

Plots write_plots(const Comparison& c, const std::map<std::string, std::vector<EpochRow>>& metrics,
                  const std::string& out_dir, const std::string& stem) {
  const std::string gnuplot = gnuplot_or_throw();
  const fs::path data = fs::path(out_dir) / "data";
  fs::create_directories(data);
  PlotSet set{c,       metrics, gnuplot,
              out_dir, data,
              stem.empty() ? slug(c.experiment.empty() ? "experiment" : c.experiment) : stem,
              {}};

  // Groups in order of first appearance.
  std::vector<std::string> groups;
  for (const auto& row : c.rows)
    if (std::find(groups.begin(), groups.end(), row.run.group) == groups.end())
      groups.push_back(row.run.group);
  for (const auto& g : groups) set.curves(g);
  set.scaling(groups);
  // One heatmap per LR rule and reduction (runs that differ in anything else would share
  // cells). One box per cell with a value, so a grid with holes (or a single column) still
  // draws.
  std::set<std::pair<std::string, std::string>> kinds;
  for (const auto& row : c.rows) kinds.insert({row.run.lr_scaling, row.run.reduction});
  for (const auto& [rule, reduction] : kinds) set.heatmap(rule, reduction);
  for (const auto& row : c.rows) set.devices(row.run);
  return std::move(set.out);
}

}  // namespace dtrain
