#include "dtrain/results/run_schema.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"

namespace dtrain {

namespace {
using M = EpochMetrics;
}  // namespace

const std::vector<MetricsColumn>& metrics_columns() {
  // Losses, accuracies and learning rates keep 9 significant digits, times are to the
  // microsecond, throughput to a tenth of a sample, the noise scale and busbw 6 digits.
  static const std::vector<MetricsColumn> cols = {
      {"epoch", &M::epoch, "{}", "", "the epoch, from 1"},
      {"lr", &M::lr, "{:.9g}", "", "learning rate at the epoch's first step"},
      {"lr_end", &M::lr_end, "{:.9g}", "", "learning rate at its last step"},
      {"train_loss", &M::train_loss, "{:.9g}", "", "mean training loss over the epoch"},
      {"train_acc", &M::train_acc, "{:.9g}", "fraction", "training accuracy over the epoch"},
      {"test_loss", &M::test_loss, "{:.9g}", "", "loss on the test set after the epoch"},
      {"test_acc", &M::test_acc, "{:.9g}", "fraction", "accuracy on the test set after the epoch"},
      {"epoch_time_s", &M::epoch_time_s, "{:.6f}", "s",
       "wall time of the training steps, evaluation excluded"},
      {"samples_per_s", &M::samples_per_s, "{:.1f}", "samples/s", "training throughput"},
      {"samples", &M::samples, "{}", "samples", "training samples of the epoch, all replicas"},
      {"data_s", &M::data_s, "{:.6f}", "s", "rank 0's time fetching batches"},
      {"compute_s", &M::compute_s, "{:.6f}", "s", "rank 0's forward and backward time"},
      {"exchange_s", &M::exchange_s, "{:.6f}", "s", "rank 0's gradient exchange time"},
      {"optimizer_s", &M::optimizer_s, "{:.6f}", "s", "rank 0's optimizer step time"},
      {"eval_s", &M::eval_s, "{:.6f}", "s", "time of the test-set evaluation"},
      {"rank_busy_min_s", &M::rank_busy_min_s, "{:.6f}", "s",
       "least busy time (data, compute, optimizer) of any rank"},
      {"rank_busy_max_s", &M::rank_busy_max_s, "{:.6f}", "s", "most busy time of any rank"},
      {"slowest_rank", &M::slowest_rank, "{}", "", "the rank with the most busy time"},
      {"exchange_exposed_s", &M::exchange_exposed_s, "{:.6f}", "s",
       "the part of exchange_s that compute did not hide"},
      {"noise_b_simple", &M::noise_b_simple, "{:.6g}", "samples",
       "gradient noise scale B_simple so far; nan where not measured"},
      {"noise_grad_sq", &M::noise_g2, "{:.6g}", "", "its squared true-gradient norm estimate"},
      {"noise_trace", &M::noise_trace, "{:.6g}", "", "its gradient covariance trace estimate"},
      {"exchange_bytes_per_step", &M::exchange_bytes_per_step, "{}", "bytes",
       "bytes all-reduced per optimizer step"},
      {"busbw_gbps", &M::busbw_gbps, "{:.6g}", "GB/s",
       "bus bandwidth of the exchange (nccl-tests' busbw); nan with one replica"},
      {"input_images_per_s", &M::input_images_per_s, "{:.1f}", "images/s",
       "images decoded per second by all replicas' input threads; nan for data in memory"},
      {"input_busy", &M::input_busy, "{:.4f}", "fraction",
       "share of the input threads' time spent decoding; nan for data in memory"},
      {"straggler_rank", &M::straggler_rank, "{}", "",
       "the rank named as the epoch's straggler (busy time per phase, waits excluded); -1: none"},
      {"straggler_phase", &M::straggler_phase, "{}", "",
       "its phase: 0 data, 1 forward, 2 backward, 3 exchange, 4 optimizer, 5 all (every phase "
       "alike: the rank itself is slower); -1: none"},
      {"straggler_excess", &M::straggler_excess, "{:.4f}", "fraction",
       "its median excess over the other ranks' median in that phase, beyond its own pace (for "
       "5: its pace); nan: none"},
      {"bn_sync_s", &M::bn_sync_s, "{:.6f}", "s",
       "model.batchnorm: sync: rank 0's time in the BatchNorm statistics' exchanges over the "
       "replicas, part of compute_s; 0 without"},
      {"other_cores", &M::other_cores, "{:.2f}", "cores",
       "cores that other work kept busy, on average over the epoch, on the CPUs the run may use "
       "; nan: unknown (an epoch under 0.25 s, replicas as processes under mpirun or srun)"},
  };
  return cols;
}

const MetricsColumn& metrics_column(std::string_view name) {
  for (const auto& c : metrics_columns())
    if (name == c.name) return c;
  throw std::logic_error(fmt::format("metrics.csv has no column '{}'", name));
}

namespace {
// A CSV header and row from a table of columns (MetricsColumn, EvalColumn): each column's name,
// and its member of the record in the column's format.
template <class Columns>
std::string csv_header_of(const Columns& cols) {
  std::string s;
  for (const auto& c : cols) s += (s.empty() ? "" : ",") + std::string(c.name);
  return s + "\n";
}

template <class Columns, class Record>
std::string csv_row_of(const Columns& cols, const Record& r) {
  std::string s;
  for (const auto& c : cols) {
    if (!s.empty()) s += ',';
    std::visit([&](auto field) { s += fmt::format(fmt::runtime(c.format), r.*field); }, c.field);
  }
  return s + "\n";
}
}  // namespace

std::string metrics_csv_header() { return csv_header_of(metrics_columns()); }

std::string metrics_csv_row(const EpochMetrics& m) { return csv_row_of(metrics_columns(), m); }

const std::vector<EvalColumn>& eval_columns() {
  using P = EvalPoint;
  static const std::vector<EvalColumn> cols = {
      {"epoch", &P::epoch, "{}", "", "the epoch in progress, or just finished (1-based)"},
      {"step", &P::step, "{}", "", "optimizer steps of that epoch done"},
      {"global_step", &P::global_step, "{}", "", "optimizer steps of the run done"},
      {"samples", &P::samples, "{}", "", "training samples of the run seen"},
      {"train_time_s", &P::train_time_s, "{:.6f}", "s",
       "training time so far, evaluation excluded"},
      {"test_loss", &P::test_loss, "{:.6f}", "", "mean test loss"},
      {"test_acc", &P::test_acc, "{:.6f}", "", "test accuracy (0 to 1)"},
  };
  return cols;
}

std::string evals_csv_header() { return csv_header_of(eval_columns()); }

std::string evals_csv_row(const EvalPoint& p) { return csv_row_of(eval_columns(), p); }

std::optional<double> metrics_value(const std::string& cell) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(cell.c_str(), &end);
  if (!cell.empty() && end == cell.c_str() + cell.size() && errno == 0)
    return std::isfinite(v) ? v : std::numeric_limits<double>::quiet_NaN();
  // Out of range ("1e999") is no number, but a damaged spelling of nan or inf still says one.
  if (cell.find("nan") != std::string::npos || cell.find("inf") != std::string::npos)
    return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

std::optional<size_t> MetricsCsv::find(std::string_view name) const {
  const auto it = std::find(header.begin(), header.end(), name);
  if (it == header.end()) return std::nullopt;
  return static_cast<size_t>(it - header.begin());
}

void MetricsCsv::require(const std::vector<std::string_view>& names,
                         std::string_view advice) const {
  for (const auto name : names)
    if (!find(name)) throw UserError(fmt::format("{}: no column '{}'{}", path, name, advice));
}

namespace {
// At most `most` + 1 cells: a row with more is refused anyway, and a line of commas is not made
// into millions of strings first.
std::vector<std::string> split_cells(const std::string& line, size_t most) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string cell; out.size() <= most && std::getline(ss, cell, ',');) out.push_back(cell);
  return out;
}

// A cell as an error line shows it: control characters (a NUL would end the line) as \xNN, and
// at most 40 characters of a long one.
std::string shown_cell(const std::string& cell) {
  const std::string out = printable(cell.substr(0, 40), /*hex=*/true);
  return cell.size() > 40 ? out + "..." : out;
}

// A whole-number column takes the value where it fits; a damaged one keeps the default.
template <class T>
void set_value(T& to, double v) {
  if constexpr (std::is_integral_v<T>) {
    if (std::isfinite(v) && std::abs(v) < 9e15 &&
        std::abs(v) <= static_cast<double>(std::numeric_limits<T>::max()))
      to = static_cast<T>(std::llround(v));
  } else {
    to = v;
  }
}
// What no run writes in `c`, said as what is valid; "" where `v` may be there. Accuracies are
// fractions; times are finite and not negative (nan: not measured); counts and rates are not
// negative (a rate over a zero time is inf); losses not negative (inf and nan: a run that
// diverged). The noise scale's estimates and the ranks may be negative.
std::string implausible(const MetricsColumn& c, double v) {
  const std::string_view name = c.name, unit = c.unit;
  // Not finite (nan, inf): a diverged run's losses, columns not measured, and older folders'
  // way of saying either.
  if (std::isnan(v) || name.rfind("noise_", 0) == 0) return "";  // estimates: any sign
  if (name == "train_acc" || name == "test_acc")
    return v >= 0 && v <= 1 ? "" : "a fraction from 0 to 1";
  if (unit == "s") return v >= 0 && v < 1e9 ? "" : "seconds, at least 0";
  if (name == "lr" || name == "lr_end") return v >= 0 && std::isfinite(v) ? "" : "at least 0";
  if (name == "train_loss" || name == "test_loss" || unit == "samples" || unit == "bytes" ||
      unit == "samples/s" || unit == "images/s" || unit == "GB/s" || name == "input_busy")
    return v >= 0 ? "" : "at least 0";
  return "";
}
}  // namespace

// What a metrics.csv dtrain wrote can hold: a row per epoch (train.epochs is at most 100000)
// and a few dozen columns. A file past either is not one of dtrain's, and is refused before its
// cells, kept as text, take more memory than the file itself (a 64 MiB file of "0,0,0,0" rows
// would otherwise hold about 1.4 GB of strings).
constexpr size_t kMaxMetricsColumns = 64;
constexpr size_t kMaxMetricsRows = 100000;

MetricsCsv read_metrics_csv(const std::string& dir, RaggedRows ragged) {
  MetricsCsv csv;
  csv.path = (std::filesystem::path(dir) / "metrics.csv").string();
  std::error_code ec;  // a link loop is said by read_own_file, never thrown as a filesystem_error
  if (!std::filesystem::exists(csv.path, ec) && !ec)
    throw UserError(fmt::format("{}: missing", csv.path));
  std::istringstream in(read_own_file(csv.path, "metrics.csv", kMaxMetricsBytes));
  std::string line;
  if (!std::getline(in, line)) throw UserError(fmt::format("{}: empty", csv.path));
  csv.header = split_cells(line, kMaxMetricsColumns);
  if (csv.header.size() > kMaxMetricsColumns)
    throw UserError(fmt::format("{}: more than {} columns; dtrain writes {}", csv.path,
                                kMaxMetricsColumns, metrics_columns().size()));
  for (int line_no = 2; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    if (csv.rows.size() == kMaxMetricsRows)
      throw UserError(fmt::format("{}: more than {} rows, more epochs than a run can have",
                                  csv.path, kMaxMetricsRows));
    auto cells = split_cells(line, csv.header.size());
    if (cells.size() != csv.header.size()) {
      if (ragged == RaggedRows::skip) continue;
      throw UserError(
          fmt::format("{}:{}: {} cells, header has {}", csv.path, line_no,
                      cells.size() > csv.header.size() ? "more" : std::to_string(cells.size()),
                      csv.header.size()));
    }
    csv.rows.push_back(std::move(cells));
    csv.lines.push_back(line_no);
  }
  return csv;
}

std::vector<EpochMetrics> read_epochs(const MetricsCsv& csv,
                                      const std::vector<std::string_view>& names) {
  std::vector<std::pair<const MetricsColumn*, size_t>> at;  // column, its index in the file
  for (const auto& c : metrics_columns()) {
    const bool wanted =
        names.empty() || std::find(names.begin(), names.end(), c.name) != names.end();
    if (const auto i = csv.find(c.name); wanted && i) at.emplace_back(&c, *i);
  }
  std::vector<EpochMetrics> out;
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    EpochMetrics m;
    for (const auto& [col, i] : at) {
      const auto v = metrics_value(csv.rows[r][i]);
      if (!v)
        throw UserError(fmt::format("{}:{}: '{}' is not a number", csv.path, csv.lines[r],
                                    shown_cell(csv.rows[r][i])));
      if (const std::string valid = implausible(*col, *v); !valid.empty())
        throw UserError(fmt::format("{}:{}: {} '{}' is no value a run writes ({})", csv.path,
                                    csv.lines[r], col->name, shown_cell(csv.rows[r][i]), valid));
      std::visit([&](auto field) { set_value(m.*field, *v); }, col->field);
    }
    out.push_back(m);
  }
  // dtrain writes a row per finished epoch, 1, 2, 3, ...: anything else was edited or damaged,
  // and would draw a curve that doubles back or a table of epochs no run had.
  const auto epoch = csv.find("epoch");
  const bool read = names.empty() || std::find(names.begin(), names.end(), "epoch") != names.end();
  for (size_t r = 0; epoch && read && r < out.size(); ++r)
    if (out[r].epoch != static_cast<int>(r) + 1 ||
        metrics_value(csv.rows[r][*epoch]) != static_cast<double>(r + 1))  // 1.4 is no epoch
      throw UserError(fmt::format("{}:{}: epoch '{}' where epoch {} belongs (a row per epoch, "
                                  "from 1 up)",
                                  csv.path, csv.lines[r], shown_cell(csv.rows[r][*epoch]), r + 1));
  return out;
}

}  // namespace dtrain
