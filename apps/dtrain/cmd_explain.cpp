// dtrain explain: the accuracy gap between a config's 1-replica and N-replica runs, attributed
// one setting at a time. Every rung is a normal `dtrain run` (run_run) with its own tag.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/config/plan.hpp"
#include "dtrain/results/plots.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/train/explain.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;

void setup_explain(CLI::App& app, ExplainOptions& opt) {
  add_config_arguments(app, opt.config, opt.overrides);
  app.add_option("--seeds", opt.seeds, "Runs per rung, with train.seed=1..K (mean and sd)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--order", opt.order,
                 "Order of the rungs after the equivalent, a comma list of global_batch, "
                 "lr_rule, warmup, batchnorm, reduction, sharding, accumulation (settings not "
                 "named follow in this order)");
  app.add_option("--results", opt.results, "Results root, as for `dtrain run`")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--tag", opt.tag, "Name of this explanation (default: UTC date-time)")
      ->check(non_empty("a tag"));
  app.add_flag("--resume", opt.resume,
               "Continue an earlier explain with the same --tag: finished rungs are skipped");
  app.add_flag("-q,--quiet", opt.quiet, "Only warnings, errors and the final table");
}

namespace {

struct RungResult {
  ExplainRung rung;
  std::string tag;
  std::vector<std::string> overrides;  // everything passed to run_run
  std::vector<std::string> run_ids;
  Stat acc, loss, time;
};

std::string utc_tag() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y%m%d-%H%M%S}", tm);
}

// The user's overrides that explain does not set itself on every rung.
std::vector<std::string> other_overrides(const ExplainOptions& opt) {
  const auto& managed = explain_keys();
  std::vector<std::string> out;
  for (const auto& text : opt.overrides) {
    const std::string key = parse_override(text).key;
    if (opt.seeds > 1 && key == "train.seed")
      throw UserError(fmt::format(
          "{}: --seeds {} runs every rung with train.seed=1..{}; give either --seeds or "
          "train.seed",
          text, opt.seeds, opt.seeds));
    if (key == "gpus") continue;
    if (std::find(managed.begin(), managed.end(), key) != managed.end()) continue;
    out.push_back(text);
  }
  return out;
}

// The settings of `c` that draw random numbers per replica (dropout masks, in-memory
// augmentation), so that N x B does not take 1 x NB's steps; a folder's crops and flips are
// keyed by sample and do.
std::vector<std::string> per_replica_draws(const Config& c) {
  std::vector<std::string> keys;
  bool dropout = c.model.dropout > 0;
  for (const LayerSpec& l : c.model.layers) dropout |= l.type == LayerType::dropout && l.p > 0;
  if (dropout) keys.push_back("dropout");
  if (c.data.augment.enabled() && c.data.dataset != DatasetKind::folder)
    keys.push_back("data.augment");
  return keys;
}

std::vector<ExplainRung> plan_rungs(const ExplainOptions& opt, std::string& experiment,
                                    std::vector<std::string>& draws) {
  const auto order = parse_explain_order(opt.order);
  const auto user = plan_runs(opt.config, opt.overrides);
  if (user.size() != 1)
    throw UserError("explain takes one value per key (no comma lists); --seeds K repeats "
                    "each rung with seeds 1..K");
  std::vector<std::string> base_ov;
  for (const auto& text : opt.overrides)
    if (parse_override(text).key != "gpus") base_ov.push_back(text);
  base_ov.push_back("gpus=1");
  const auto base = plan_runs(opt.config, base_ov);
  experiment = user[0].config.name;
  draws = per_replica_draws(user[0].config);
  return plan_explain(base[0].config, user[0].config, order);
}

// Loads the finished runs of one rung and their statistics.
void collect(const ExplainOptions& opt, const std::string& experiment, RungResult& rr) {
  std::vector<double> acc, loss, time;
  for (const auto& r : plan_runs(opt.config, rr.overrides)) {
    const std::string id = run_id(rr.tag, r);
    const fs::path dir = fs::path(opt.results) / experiment / id;
    if (std::error_code ec; !fs::exists(dir / "summary.json", ec) && !ec) continue;
    const RunRecord rec = load_run(dir.string());
    rr.run_ids.push_back(id);
    acc.push_back(rec.final_test_acc.value_or(NAN));
    loss.push_back(rec.final_train_loss.value_or(NAN));
    time.push_back(rec.median_epoch_time_s.value_or(NAN));
  }
  rr.acc = stat_of(acc);
  rr.loss = stat_of(loss);
  rr.time = stat_of(time);
}

std::string stat_cell(const Stat& s, double scale, int digits) {
  if (!s.mean) return "-";
  if (!s.sd) return fmt::format("{:.{}f}", *s.mean * scale, digits);
  return fmt::format("{:.{}f} ± {:.{}f}", *s.mean * scale, digits, *s.sd * scale, digits);
}

// A rung against the one before it (Welch's t-test over the seeds; accuracy in points).
WelchTest acc_test(const RungResult& prev, const RungResult& cur) {
  return test_of(prev.acc, cur.acc, 100);
}
WelchTest loss_test(const RungResult& prev, const RungResult& cur) {
  return test_of(prev.loss, cur.loss, 1);
}

// A test that ran and cannot tell the two apart.
bool not_distinguishable(const WelchTest& w) { return w.tested() && !w.distinguishable; }

// "matches the baseline" when the equivalent's final train loss is the baseline's (within a
// relative 1e-4).
bool equivalent_matches(const RungResult& base, const RungResult& eq) {
  if (!base.loss.mean || !eq.loss.mean) return false;
  const double a = *base.loss.mean, b = *eq.loss.mean;
  return std::abs(a - b) <= 1e-4 * std::max({std::abs(a), std::abs(b), 1e-12});
}

// Not within a relative 1e-4, but not distinguishable over the seeds (Welch's t-test at 95%) in
// loss nor in accuracy: the N-replica sum rounds differently, and over thousands of steps on
// real data that grows past 1e-4.
bool equivalent_within_noise(const RungResult& base, const RungResult& eq) {
  if (!base.loss.mean || !eq.loss.mean) return false;
  const WelchTest dl = loss_test(base, eq), da = acc_test(base, eq);
  return not_distinguishable(dl) &&
         (std::isnan(da.diff) || not_distinguishable(da) || da.diff == 0);
}

}  // namespace

namespace {

const char* kOrderNote =
    "The order of the rungs matters where settings interact: each rung's delta is measured "
    "with the earlier rungs' changes in place (change it with --order, e.g. --order "
    "reduction,global_batch).";

std::string equivalence_line(const std::vector<RungResult>& rs,
                             const std::vector<std::string>& draws) {
  if (!equivalent_matches(rs[0], rs[1]) && !draws.empty() && rs[0].loss.mean && rs[1].loss.mean)
    return fmt::format(
        "The equivalent run is not the baseline's steps here: {} draw{} random numbers per "
        "replica, so N x B and 1 x NB see other masks or crops (final train loss differs by "
        "{:.1e}). To see what the replica count alone costs, explain again with {} off.",
        fmt::join(draws, " and "), draws.size() == 1 ? "s" : "",
        std::abs(*rs[0].loss.mean - *rs[1].loss.mean), fmt::join(draws, " and "));
  if (equivalent_matches(rs[0], rs[1]))
    return "The equivalent run matches the baseline (final train loss within a relative 1e-4): "
           "the replica count alone costs nothing.";
  if (equivalent_within_noise(rs[0], rs[1])) {
    const WelchTest w = loss_test(rs[0], rs[1]);
    const double scale = std::max(std::abs(*rs[0].loss.mean), std::abs(*rs[1].loss.mean));
    return fmt::format(
        "The equivalent run matches the baseline within the seed noise (final train loss "
        "differs by {:.1e}, {:.1e} of it: more than 1e-4, but not distinguishable at {} seeds, "
        "p={:.3g}): the N-replica sum rounds differently and over many steps that shows; the "
        "replica count alone costs nothing measurable.",
        std::abs(w.diff), scale > 0 ? std::abs(w.diff) / scale : 0.0,
        w.n_a == w.n_b ? std::to_string(w.n_a) : fmt::format("{} and {}", w.n_a, w.n_b), w.p);
  }
  if (!rs[0].loss.mean || !rs[1].loss.mean)
    return fmt::format(
        "The {} diverged (no finite final train loss in any seed): nothing to compare; lower "
        "optimizer.lr and explain again.",
        !rs[0].loss.mean && !rs[1].loss.mean ? "baseline and the equivalent run"
        : !rs[0].loss.mean                   ? "baseline"
                                             : "equivalent run");
  if (!loss_test(rs[0], rs[1]).tested()) {
    // One finite loss a side: a sum that rounds differently, grown over the run, looks the same
    // as a step that differs. "Does not match" here would blame the replica count for rounding.
    const double a = *rs[0].loss.mean, b = *rs[1].loss.mean;
    return fmt::format(
        "The equivalent run differs from the baseline by {:.1e} in final train loss (a relative "
        "{:.1e}, more than 1e-4): one finite loss a side ({} and {} seeds) cannot tell the "
        "N-replica sum's rounding, grown over the run, from a step that differs; explain again "
        "with more seeds (--seeds 3) to tell.",
        std::abs(a - b), std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-12}),
        rs[0].loss.n, rs[1].loss.n);
  }
  return "The equivalent run DOES NOT match the baseline (final train loss differs by more "
         "than a relative 1e-4): the N-replica step is not the 1-replica step here.";
}

const char* kTestNote =
    "Deltas are from the rung before, with the 95% confidence interval of the difference "
    "(Welch's t-test over the seeds) and its two-sided p-value; \"not distinguishable at K "
    "seeds\" means p >= 0.05, with the seeds per rung that would resolve a difference of this "
    "size at 95% confidence and 80% power (with these sds).";

// Whether any rung has the two seeds a test needs.
bool have_tests(const std::vector<RungResult>& rs) {
  for (const auto& r : rs)
    if (!r.rung.skipped && (r.acc.n >= 2 || r.loss.n >= 2)) return true;
  return false;
}

// One rung's row; `prev` is the rung before that ran (null for the baseline).
std::string markdown_row(const std::string& name, const RungResult& r, const RungResult* prev,
                         bool tests) {
  const WelchTest none;
  const WelchTest da = prev ? acc_test(*prev, r) : none, dl = prev ? loss_test(*prev, r) : none;
  std::vector<std::string> cells = {name, r.rung.change, std::to_string(r.run_ids.size()),
                                    stat_cell(r.acc, 100, 2), difference_text(da, 2)};
  if (tests) cells.push_back(verdict_text(da, "seeds"));
  cells.push_back(stat_cell(r.loss, 1, 4));
  cells.push_back(difference_text(dl, 4));
  if (tests) cells.push_back(verdict_text(dl, "seeds"));
  cells.push_back(stat_cell(r.time, 1, 3));
  return fmt::format("| {} |\n", fmt::join(cells, " | "));
}

std::string to_markdown(const std::vector<RungResult>& rs, const std::vector<std::string>& draws) {
  const bool tests = have_tests(rs);
  std::string md = std::string(kOrderNote) + "\n\n" + equivalence_line(rs, draws) + "\n\n";
  md += tests ? "| rung | setting changed | runs | final test acc (%) | delta acc (points) [95% "
                "CI] | acc p | final train loss | delta loss [95% CI] | loss p | median epoch "
                "(s) |\n|---|---|---|---|---|---|---|---|---|---|\n"
              : "| rung | setting changed | runs | final test acc (%) | delta acc (points) | "
                "final train loss | delta loss | median epoch (s) |\n|---|---|---|---|---|---|---|"
                "---|\n";
  const RungResult* prev = nullptr;
  for (size_t k = 0; k < rs.size(); ++k) {
    const auto& r = rs[k];
    const std::string name = fmt::format("{} {}", k, r.rung.name);
    if (r.rung.skipped) {
      md += fmt::format("| {} | {} | 0 |{}\n", name, r.rung.change, tests ? " | | | | | | |"
                                                                           : " | | | | |");
      continue;
    }
    md += markdown_row(name, r, prev, tests);
    prev = &r;
  }
  if (tests) md += fmt::format("\n{}\n", kTestNote);
  return md;
}

nlohmann::json stat_json(const Stat& s) {
  nlohmann::json j = {{"n", s.n}, {"mean", nullptr}, {"sd", nullptr}};
  if (s.mean) j["mean"] = *s.mean;
  if (s.sd) j["sd"] = *s.sd;
  return j;
}

// A delta: its "value" and the test's fields (test_json), or null where there is none.
nlohmann::json delta_json(const WelchTest& w) {
  if (std::isnan(w.diff)) return nullptr;
  nlohmann::json j = test_json(w);
  j["value"] = w.diff;
  return j;
}

std::string to_json(const std::string& experiment, int seeds, const std::vector<RungResult>& rs) {
  nlohmann::json rungs = nlohmann::json::array();
  const RungResult* prev = nullptr;
  for (const auto& r : rs) {
    nlohmann::json j = {{"name", r.rung.name},         {"setting", r.rung.setting},
                        {"change", r.rung.change},     {"skipped", r.rung.skipped},
                        {"overrides", r.overrides},    {"tag", r.tag},
                        {"run_ids", r.run_ids},        {"final_test_acc", stat_json(r.acc)},
                        {"final_train_loss", stat_json(r.loss)},
                        {"median_epoch_time_s", stat_json(r.time)}};
    if (!r.rung.skipped) {
      j["delta_acc_points"] = prev ? delta_json(acc_test(*prev, r)) : nullptr;
      j["delta_train_loss"] = prev ? delta_json(loss_test(*prev, r)) : nullptr;
      prev = &r;
    }
    rungs.push_back(std::move(j));
  }
  const nlohmann::json out = {{"experiment", experiment},
                              {"seeds", seeds},
                              {"note", kOrderNote},
                              {"equivalent_matches", equivalent_matches(rs[0], rs[1])},
                              {"equivalent_within_noise", equivalent_within_noise(rs[0], rs[1])},
                              {"rungs", rungs}};
  return json_text(out, 2) + "\n";
}

}  // namespace

// The waterfall figure next to the table, where gnuplot is installed; a figure that cannot be
// drawn is a warning, the table stands without it.
void draw_figure(const std::vector<RungResult>& rs, const std::string& title,
                 const std::string& dir, const std::string& stem) {
  if (!gnuplot_available()) {
    log().info("explain: no gnuplot, so no figure (apt-get install gnuplot-nox)");
    return;
  }
  std::vector<WaterfallBar> bars;
  const RungResult* prev = nullptr;
  for (const auto& r : rs) {
    if (r.rung.skipped) continue;
    if (prev) {
      const WelchTest d = acc_test(*prev, r);
      const double half = d.kind == WelchTest::Kind::welch ? (d.ci_high - d.ci_low) / 2 : 0;
      if (!std::isnan(d.diff))
        bars.push_back({r.rung.name, d.diff, half, not_distinguishable(d)});
    }
    prev = &r;
  }
  if (bars.empty()) return;
  const std::string error = draw_waterfall(bars, title, dir, stem);
  if (error.empty())
    fmt::print("figure: {}.png and .svg\n", printable((fs::path(dir) / stem).string(), true));
  else
    log().warn("explain: figure not drawn: {}", error);
}

namespace {
// --resume continues an explanation with the seeds it was made with: other seeds would train
// other runs and replace its table. The seeds are in its JSON (or, from older files, the runs of
// its first rung); an explanation not written yet has none to compare.
void refuse_other_seeds(const std::string& json_path, int seeds) {
  const auto text = try_read_own_file(json_path, kMaxSummaryBytes);
  if (!text) return;
  const auto j = parse_json_bounded(*text, 8);  // dtrain writes 4 levels
  int had = 0;
  if (j.is_object() && j.contains("seeds") && j["seeds"].is_number_integer()) {
    had = j["seeds"].get<int>();
  } else if (j.is_object() && j.contains("rungs") && j["rungs"].is_array()) {
    for (const auto& r : j["rungs"])
      if (r.is_object() && r.value("skipped", true) == false && r.contains("run_ids") &&
          r["run_ids"].is_array()) {
        had = static_cast<int>(r["run_ids"].size());
        break;
      }
  }
  if (had > 0 && had != seeds)
    throw UserError(fmt::format("{}: this explanation was made with --seeds {}; --resume "
                                "continues it with the same (--seeds {}), or pick another --tag",
                                json_path, had, had));
}
}  // namespace

int run_explain(const ExplainOptions& opt) {
  if (opt.resume && opt.tag.empty())
    throw UserError("--resume needs --tag: it continues an earlier explain by name");
  const std::string tag = folder_tag(opt.tag, utc_tag());
  std::string experiment;
  std::vector<std::string> draws;
  const auto rungs = plan_rungs(opt, experiment, draws);
  const auto others = other_overrides(opt);
  std::vector<RungResult> results;
  int failed = 0;
  // The replica count is part of every name ("gpus_4"), so an explanation at another N, even
  // under the same --tag, never overwrites this one.
  const std::string name = fmt::format("explain-{}-{}", tag, slug(rungs[1].overrides[0]));
  const std::string base = (fs::path(opt.results) / experiment / name).string();
  // A finished explanation is never overwritten (its runs may differ: other seeds, other keys).
  std::error_code ec;
  if (!opt.resume && fs::exists(fs::symlink_status(base + ".md", ec)))
    throw UserError(fmt::format("{}.md: an explanation under --tag {} at {} exists already; "
                                "pick another --tag, or pass --resume to continue that one",
                                base, tag, rungs[1].overrides[0]));
  if (opt.resume) refuse_other_seeds(base + ".json", opt.seeds);
  for (size_t k = 0; k < rungs.size(); ++k) {
    RungResult rr{rungs[k], fmt::format("{}-rung{}", name, k), others, {}, {}, {}, {}};
    rr.overrides.insert(rr.overrides.end(), rungs[k].overrides.begin(), rungs[k].overrides.end());
    if (opt.seeds > 1) {
      std::vector<int> seeds(opt.seeds);
      for (int s = 0; s < opt.seeds; ++s) seeds[s] = s + 1;
      rr.overrides.push_back(fmt::format("train.seed={}", fmt::join(seeds, ",")));
    }
    if (rr.rung.skipped)
      fmt::print("explain: rung {} ({}): {}\n", k, rr.rung.name, rr.rung.change);
    if (!rr.rung.skipped && !stop_requested()) {
      fmt::print("explain: rung {} ({}): {}\n", k, rr.rung.name, rr.rung.change);
      std::fflush(stdout);
      RunOptions ro{opt.config, rr.overrides, opt.results, rr.tag, opt.resume, opt.quiet, false,
                    tag};
      const int code = run_run(ro);
      if (stop_requested()) return code;  // 130 (Ctrl-C) or 143 (SIGTERM)
      failed += code != 0;
    }
    if (!rr.rung.skipped) collect(opt, experiment, rr);
    results.push_back(std::move(rr));
  }
  const std::string md = to_markdown(results, draws);
  write_file_atomic(base + ".md", md);
  write_file_atomic(base + ".json", to_json(experiment, opt.seeds, results));
  fmt::print("\n## {}: 1 replica against {}\n\n{}\n(written to {}.md and .json)\n", experiment,
             rungs[1].overrides[0], md, printable(base, true));
  draw_figure(results, fmt::format("{}: 1 replica -> {}", experiment, rungs[1].overrides[0]),
              (fs::path(opt.results) / experiment).string(), slug(name));
  return failed ? 1 : 0;
}

}  // namespace dtrain::cli
