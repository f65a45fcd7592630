#pragma once
// Figures of a comparison, drawn by gnuplot (Debian's gnuplot-nox) as PNG and SVG.
#include <map>
#include <string>
#include <vector>

#include "dtrain/results/batch_law.hpp"
#include "dtrain/results/report.hpp"

namespace dtrain {

// Whether a gnuplot executable is on PATH (absolute PATH entries only).
bool gnuplot_available();

struct Plots {
  std::vector<std::string> stems;     // figures drawn (file names without .png/.svg)
  std::vector<std::string> notes;     // one line each: a figure or panel with nothing to draw
  std::vector<std::string> failures;  // one line each: a figure gnuplot could not draw
};

// Writes the figures of one experiment into out_dir: accuracy and loss curves per group,
// speedup and efficiency against replica count, and an LR x replicas heatmap per LR rule and
// reduction when several LRs were run. A figure without finite data is left out with a note;
// the others are still drawn.
// `metrics` maps run folder -> its per-epoch rows. Data files and gnuplot scripts are kept
// in out_dir/data/ so a figure can be restyled by hand (run gnuplot from that folder).
// Security: no string from a run folder, a folder name or the command line is ever written into
// a gnuplot script or a command line; titles travel as data (see plots.cpp), gnuplot runs
// without a shell, and figures are drawn under fixed names in data/ and then moved.
// `stem` starts every file's name (report gives experiments whose names slug alike their own:
// x_, x_-2); empty: the experiment's name as a slug.
Plots write_plots(const Comparison& c, const std::map<std::string, std::vector<EpochRow>>& metrics,
                  const std::string& out_dir, const std::string& stem = "");

// One rung of a `dtrain explain` waterfall: the change in final test accuracy (points) from the
// rung before, and half its 95% confidence interval over the seeds (0 without a test).
struct WaterfallBar {
  std::string label;  // the rung's name: ours, [a-z_0-9]
  double delta = 0, half_ci = 0;
  bool not_distinguishable = false;  // a test ran and p >= 0.05
};

// Draws the waterfall as out_dir/STEM.png and .svg (data and script in out_dir/data/): one bar
// per rung, the confidence interval as error bars where there were seeds, bars not
// distinguishable from the rung before hatched. Returns "" or what failed;
// throws UserError without gnuplot.
std::string draw_waterfall(const std::vector<WaterfallBar>& bars, const std::string& title,
                           const std::string& out_dir, const std::string& stem);

// Draws the batch-size law as out_dir/STEM.png and .svg (data and script in out_dir/data/),
// log-log: the steps to the target at each batch's kept LR, the other LRs' that reached it,
// perfect scaling through the smallest batch (steps halve as the batch doubles), the fit
// S_min (1 + B_noise / B) with S_min and the critical batch B_noise marked, and B_simple.
// Returns "" or what failed (a law with no batch that reached the target: what is missing);
// throws UserError without gnuplot.
std::string draw_batch_law(const BatchLaw& law, const std::string& title,
                           const std::string& out_dir, const std::string& stem);

}  // namespace dtrain
