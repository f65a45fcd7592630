#include "dtrain/plots.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "dtrain/error.hpp"
#include "dtrain/plan.hpp"
#include "dtrain/recorder.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

std::string num(double v) {
  return std::isfinite(v) ? fmt::format("{:.9g}", v) : "?";
}

// Renders the same plot commands to PNG and SVG.
void render(const std::string& out_dir, const std::string& stem, const std::string& setup,
            const std::string& plot) {
  const fs::path data = fs::path(out_dir) / "data";
  const std::string script_path = (data / (stem + ".gp")).string();
  const std::string png = (fs::path(out_dir) / (stem + ".png")).string();
  const std::string svg = (fs::path(out_dir) / (stem + ".svg")).string();
  const std::string script = fmt::format(
      "set datafile missing '?'\n"
      "set terminal pngcairo size 1100,600 font 'sans,11' noenhanced\n"
      "set output '{}'\n{}\n{}\n"
      "set terminal svg size 1100,600 font 'sans,11' noenhanced\n"
      "set output '{}'\n{}\n{}\nset output\n",
      png, setup, plot, svg, setup, plot);
  write_file_atomic(script_path, script);
  const std::string cmd = fmt::format("gnuplot '{}' 2>&1", script_path);
  if (std::system(cmd.c_str()) != 0)
    DTRAIN_THROW_SYSTEM(fmt::format("gnuplot failed on {}", script_path));
}

std::string series_title(const RunRecord& r) {
  std::string t = fmt::format("{} replica{}", r.gpus, r.gpus == 1 ? "" : "s");
  if (r.status != "done") t += " (" + r.status + ")";
  return t;
}

}  // namespace

bool gnuplot_available() {
  return std::system("command -v gnuplot > /dev/null 2>&1") == 0;
}

std::vector<std::string> write_plots(const Comparison& c,
                                     const std::map<std::string, std::vector<EpochRow>>& metrics,
                                     const std::string& out_dir) {
  if (!gnuplot_available())
    throw UserError(
        "--plots needs gnuplot; install it with: apt-get install gnuplot-nox "
        "(scripts/install-deps.sh "
        "does)");
  const fs::path data = fs::path(out_dir) / "data";
  fs::create_directories(data);
  const std::string exp = slug(c.experiment.empty() ? "experiment" : c.experiment);
  std::vector<std::string> stems;

  // Groups in order of first appearance.
  std::vector<std::string> groups;
  for (const auto& row : c.rows)
    if (std::find(groups.begin(), groups.end(), row.run.group) == groups.end())
      groups.push_back(row.run.group);

  // 1. Test accuracy and train loss against epoch, one line per replica count, per group.
  for (const auto& g : groups) {
    std::vector<const ComparisonRow*> rows;
    for (const auto& row : c.rows)
      if (row.run.group == g && metrics.count(row.run.dir)) rows.push_back(&row);
    if (rows.empty()) continue;
    std::sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->run.gpus < b->run.gpus; });
    std::string stem = exp + "-curves";
    if (!g.empty()) stem += '-' + slug(g);
    std::string acc_plot = "plot ", loss_plot = "plot ";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i]->run;
      const std::string file = (data / fmt::format("{}-{}.dat", stem, i)).string();
      std::string text = "# epoch test_acc_percent train_loss\n";
      for (const auto& e : metrics.at(r.dir))
        text += fmt::format("{} {} {}\n", e.epoch, num(100 * e.test_acc), num(e.train_loss));
      write_file_atomic(file, text);
      const std::string sep = i ? ", " : "";
      acc_plot += fmt::format("{}'{}' using 1:2 with linespoints lw 2 title '{}'", sep, file,
                              series_title(r));
      loss_plot += fmt::format("{}'{}' using 1:3 with linespoints lw 2 title '{}'", sep, file,
                               series_title(r));
    }
    const std::string title = fmt::format("{}{}", c.experiment, g.empty() ? "" : " (" + g + ")");
    render(out_dir, stem,
           fmt::format("set multiplot layout 1,2 title '{}'\nset grid\nset key bottom right\n"
                       "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'",
                       title),
           acc_plot + "\nset key top right\nset ylabel 'train loss (log scale)'\nset logscale y\n" +
               loss_plot + "\nunset logscale y\nunset multiplot");
    stems.push_back(stem);
  }

  // 2 and 3. Speedup and efficiency against replica count, one line per group.
  std::set<int> all_gpus;
  for (const auto& row : c.rows)
    if (row.speedup) all_gpus.insert(row.run.gpus);
  if (all_gpus.size() >= 2) {
    std::string sp_plot, eff_plot;
    int series = 0;
    // The ideal line starts at the smallest baseline replica count among the rows.
    int base_gpus = 0;
    for (const auto& row : c.rows)
      for (const auto& b : c.rows)
        if (row.speedup && b.run.run_id == row.baseline &&
            (base_gpus == 0 || b.run.gpus < base_gpus))
          base_gpus = b.run.gpus;
    for (const auto& g : groups) {
      std::vector<const ComparisonRow*> rows;
      for (const auto& row : c.rows)
        if (row.run.group == g && row.speedup) rows.push_back(&row);
      if (rows.size() < 2) continue;
      std::sort(rows.begin(), rows.end(),
                [](auto* a, auto* b) { return a->run.gpus < b->run.gpus; });
      const std::string file = (data / fmt::format("{}-scaling-{}.dat", exp, series)).string();
      std::string text = "# replicas speedup efficiency_percent\n";
      for (const auto* r : rows)
        text += fmt::format("{} {} {}\n", r->run.gpus, num(*r->speedup), num(100 * *r->efficiency));
      write_file_atomic(file, text);
      const std::string t = g.empty() ? "measured" : g;
      sp_plot += fmt::format(", '{}' using 1:2 with linespoints lw 2 pt 7 title '{}'", file, t);
      eff_plot += fmt::format(", '{}' using 1:3 with linespoints lw 2 pt 7 title '{}'", file, t);
      ++series;
    }
    if (series > 0) {
      const int lo = *all_gpus.begin(), hi = *all_gpus.rbegin();
      const std::string xaxis = fmt::format(
          "set grid\nset logscale x 2\nset xrange [{}:{}]\nset xlabel 'replicas'\n"
          "set key outside right top\n",
          lo / 1.2, hi * 1.2);
      render(out_dir, exp + "-speedup",
             xaxis + fmt::format("set title '{}: speedup (training samples/s against the "
                                 "baseline)'\nset ylabel 'speedup'\nset logscale y 2",
                                 c.experiment),
             fmt::format("plot x/{} with lines dt 2 lc 'gray' title 'ideal'", base_gpus) + sp_plot);
      render(out_dir, exp + "-efficiency",
             xaxis + fmt::format("set title '{}: scaling efficiency'\nset ylabel 'efficiency "
                                 "(%)'\nset yrange [0:*]",
                                 c.experiment),
             "plot 100 with lines dt 2 lc 'gray' title 'ideal'" + eff_plot);
      stems.push_back(exp + "-speedup");
      stems.push_back(exp + "-efficiency");
    }
  }

  // 4. Final test accuracy over LR x replica count, one heatmap per LR rule and reduction
  //    (runs that differ in anything else would share cells).
  std::set<std::pair<std::string, std::string>> kinds;
  for (const auto& row : c.rows) kinds.insert({row.run.lr_scaling, row.run.reduction});
  for (const auto& [rule, reduction] : kinds) {
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
    if (lrs.size() < 2) continue;
    const std::vector<double> lr_v(lrs.begin(), lrs.end());
    const std::vector<int> g_v(gpus.begin(), gpus.end());
    const std::string stem = exp + "-lr-heatmap-" + slug(rule) + "-" + slug(reduction);
    const std::string file = (data / (stem + ".dat")).string();
    std::string text = "# replica_index lr_index final_test_acc_percent\n";
    for (size_t yi = 0; yi < lr_v.size(); ++yi) {
      for (size_t xi = 0; xi < g_v.size(); ++xi) {
        double acc = std::nan("");
        for (const auto& row : c.rows)
          if (in_kind(row.run) && row.run.lr == lr_v[yi] && row.run.gpus == g_v[xi] &&
              row.run.final_test_acc)
            acc = 100 * *row.run.final_test_acc;
        text += fmt::format("{} {} {}\n", xi, yi, num(acc));
      }
      text += "\n";
    }
    write_file_atomic(file, text);
    std::string xtics, ytics;
    for (size_t i = 0; i < g_v.size(); ++i)
      xtics += fmt::format("{}'{}' {}", i ? ", " : "", g_v[i], i);
    for (size_t i = 0; i < lr_v.size(); ++i)
      ytics += fmt::format("{}'{}' {}", i ? ", " : "", num(lr_v[i]), i);
    render(
        out_dir, stem,
        fmt::format("set title '{}: final test accuracy (%), lr_scaling {}, reduction {}'\n"
                    "set xlabel 'replicas'\nset ylabel 'lr at base batch'\n"
                    "set xtics ({})\nset ytics ({})\nset xrange [-0.5:{}]\nset yrange "
                    "[-0.5:{}]\nset cblabel 'test accuracy (%)'\nset palette defined (0 "
                    "'#b2182b', 50 '#fddbc7', 100 '#2166ac')\nset cbrange [*:*]",
                    c.experiment, rule, reduction, xtics, ytics,
                    static_cast<double>(g_v.size()) - 0.5, static_cast<double>(lr_v.size()) - 0.5),
        fmt::format("plot '{0}' using 1:2:3 with image notitle, '{0}' using "
                    "1:2:(sprintf('%.1f', $3)) with labels font 'sans,12' notitle",
                    file));
    stems.push_back(stem);
  }
  return stems;
}

}  // namespace dtrain
