#pragma once
// Figures of a comparison, drawn by gnuplot (Debian's gnuplot-nox) as PNG and SVG.
#include <map>
#include <string>
#include <vector>

#include "dtrain/report.hpp"

namespace dtrain {

bool gnuplot_available();

// Writes the figures of one experiment into out_dir and returns their stems (file names
// without .png/.svg): accuracy and loss curves per group, speedup and efficiency against
// replica count, and an LR x replicas heatmap per LR rule and reduction when several LRs
// were run.
// `metrics` maps run folder -> its per-epoch rows. Data files and gnuplot scripts are kept
// in out_dir/data/ so a figure can be restyled by hand.
std::vector<std::string> write_plots(const Comparison& c,
                                     const std::map<std::string, std::vector<EpochRow>>& metrics,
                                     const std::string& out_dir);

}  // namespace dtrain
