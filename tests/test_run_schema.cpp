// The run folder's schema (run_schema.hpp): metrics.csv's writer and readers follow one table
// of columns, the table and docs/run.md agree; summary.json is written from its field table,
// each value of its declared type, and docs/run.md lists the fields as the table has them.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dtrain/base/error.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/config/schema.hpp"
#include "dtrain/results/recorder.hpp"
#include "dtrain/results/report.hpp"
#include "dtrain/results/run_schema.hpp"
#include "dtrain/results/summary.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;
using nlohmann::json;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Every column a value of its own, each exact in the column's format, and NaN where a column
// can be NaN.
EpochMetrics sample_epoch(int epoch) {
  EpochMetrics m;
  m.epoch = epoch;
  m.lr = 0.123456789;
  m.lr_end = 0.0123456789;
  m.train_loss = 1.25;
  m.train_acc = 0.625;
  m.test_loss = 1.5;
  m.test_acc = 0.5625;
  m.epoch_time_s = 2.5;
  m.samples_per_s = 3072.5;
  m.samples = 7680;
  m.data_s = 0.125;
  m.compute_s = 1.75;
  m.exchange_s = 0.25;
  m.optimizer_s = 0.0625;
  m.eval_s = 0.03125;
  m.rank_busy_min_s = 1.875;
  m.rank_busy_max_s = 2.125;
  m.slowest_rank = 3;
  m.exchange_exposed_s = 0.1875;
  m.noise_b_simple = 123.5;
  m.noise_g2 = kNaN;
  m.noise_trace = 4.75;
  m.exchange_bytes_per_step = 3379360;
  m.busbw_gbps = kNaN;
  return m;
}

// A column's value as a double, whatever its type in EpochMetrics.
double value_of(const EpochMetrics& m, const MetricsColumn& c) {
  return std::visit([&](auto field) { return static_cast<double>(m.*field); }, c.field);
}

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string f; std::getline(ss, f, ',');) out.push_back(f);
  return out;
}

// The column names of docs/run.md's "What a run leaves": the metrics.csv entry of the folder
// listing, up to the summary.json entry, with the remarks in parentheses left out.
std::vector<std::string> documented_columns() {
  const std::string doc = slurp(fs::path(source_dir()) / "docs" / "run.md");
  const size_t from = doc.find("  metrics.csv ");
  const size_t to = doc.find("  summary.json ", from);
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  std::string text = doc.substr(from, to - from);
  text = text.substr(text.find(':') + 1);  // after "one row per epoch:"
  std::string plain;
  int depth = 0;
  for (char ch : text) {
    if (ch == '(') ++depth;
    if (depth == 0) plain += ch == '\n' ? ' ' : ch;
    if (ch == ')') --depth;
  }
  std::vector<std::string> out;
  for (auto name : split(plain)) {
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    out.push_back(name);
  }
  return out;
}

// The fields of docs/run.md's summary.json table, one markdown row each, as the field table
// says they should read.
std::string summary_table_rows() {
  std::string out;
  for (const auto& f : summary_fields())
    out += fmt::format("| `{}` | {}{} | {} | {}{} |\n", f.name, to_string(f.type),
                       f.nullable ? " or null" : "", *f.unit ? f.unit : "-", f.meaning,
                       *f.repeats ? fmt::format(" (repeats `{}`)", f.repeats) : "");
  return out;
}

}  // namespace

TEST_CASE("metrics.csv's header and rows are the table's, as dtrain has always written them",
          "[schema][recorder]") {
  std::string names;
  for (const auto& c : metrics_columns()) names += (names.empty() ? "" : ",") + std::string(c.name);
  CHECK(metrics_csv_header() == names + "\n");
  // The text of the run folders written before the table: a change here changes every folder.
  CHECK(metrics_csv_header() ==
        "epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,epoch_time_s,samples_per_s,"
        "samples,data_s,compute_s,exchange_s,optimizer_s,eval_s,rank_busy_min_s,"
        "rank_busy_max_s,slowest_rank,exchange_exposed_s,noise_b_simple,noise_grad_sq,"
        "noise_trace,exchange_bytes_per_step,busbw_gbps,input_images_per_s,input_busy,"
        "straggler_rank,straggler_phase,straggler_excess,bn_sync_s,other_cores\n");
  EpochMetrics m = sample_epoch(7);
  m.lr = 1.0 / 3;  // digits past each format's precision
  m.epoch_time_s = 2.0 / 3;
  m.samples_per_s = 1e5 / 7;
  m.noise_trace = 1.0 / 7;
  m.busbw_gbps = 12.345678912;
  m.input_images_per_s = 1e4 / 3;
  m.input_busy = 2.0 / 3;
  m.straggler_rank = 2;
  m.straggler_phase = 1;
  m.straggler_excess = 1.0 / 9;
  m.bn_sync_s = 1.0 / 7;
  m.other_cores = 2.0 / 3;
  CHECK(metrics_csv_row(m) ==
        fmt::format("{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.6f},{:.1f},{},{:.6f},{:.6f},"
                    "{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{:.6f},{:.6g},{:.6g},{:.6g},{},{:.6g},"
                    "{:.1f},{:.4f},{},{},{:.4f},{:.6f},{:.2f}\n",
                    m.epoch, m.lr, m.lr_end, m.train_loss, m.train_acc, m.test_loss, m.test_acc,
                    m.epoch_time_s, m.samples_per_s, m.samples, m.data_s, m.compute_s, m.exchange_s,
                    m.optimizer_s, m.eval_s, m.rank_busy_min_s, m.rank_busy_max_s, m.slowest_rank,
                    m.exchange_exposed_s, m.noise_b_simple, m.noise_g2, m.noise_trace,
                    m.exchange_bytes_per_step, m.busbw_gbps, m.input_images_per_s, m.input_busy,
                    m.straggler_rank, m.straggler_phase, m.straggler_excess, m.bn_sync_s,
                    m.other_cores));
  CHECK(split(metrics_csv_row(m)).size() == metrics_columns().size());
  CHECK(&metrics_column("other_cores") == &metrics_columns().back());
  CHECK_THROWS_AS(metrics_column("no_such_column"), std::logic_error);
}

TEST_CASE("a metrics.csv row reads back through every reader to the values written",
          "[schema][report]") {
  TempDir d("schema-rt");
  const std::vector<EpochMetrics> written = {sample_epoch(1), sample_epoch(2)};
  std::string text = metrics_csv_header();
  for (const auto& m : written) text += metrics_csv_row(m);
  put(d.path / "metrics.csv", text);

  // The shared reader: every column.
  const auto back = read_epochs(read_metrics_csv(d.path.string()));
  REQUIRE(back.size() == written.size());
  for (size_t r = 0; r < written.size(); ++r)
    for (const auto& c : metrics_columns()) {
      INFO("row " << r + 1 << " column " << c.name);
      CHECK(same(value_of(back[r], c), value_of(written[r], c)));
    }
  // `dtrain project`'s reading of a cell (metrics_value), column by column.
  const std::string row = metrics_csv_row(written[0]);
  const auto cells = split(row.substr(0, row.size() - 1));
  for (size_t i = 0; i < metrics_columns().size(); ++i) {
    const auto& c = metrics_columns()[i];
    INFO(c.name << " = " << cells[i]);
    const auto v = metrics_value(cells[i]);
    REQUIRE(v);
    CHECK(same(*v, value_of(written[0], c)));
  }
  // The report's reader (curves and plots).
  const auto rows = load_metrics(d.path.string());
  REQUIRE(rows.size() == written.size());
  CHECK(rows[1].epoch == 2);
  CHECK(rows[1].lr == written[1].lr);
  CHECK(rows[1].train_loss == written[1].train_loss);
  CHECK(rows[1].train_acc == written[1].train_acc);
  CHECK(rows[1].test_loss == written[1].test_loss);
  CHECK(rows[1].test_acc == written[1].test_acc);
  CHECK(rows[1].epoch_time_s == written[1].epoch_time_s);
}

TEST_CASE("an older metrics.csv without the newer columns still reads, and damage is named",
          "[schema][report]") {
  TempDir d("schema-old");
  // As the first versions wrote it: nine columns, a diverged epoch's -nan.
  put(d.path / "metrics.csv",
      "epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,epoch_time_s,samples_per_s\n"
      "1,0.1,0.1,0.9,0.6,0.8,0.62,1.0,1000\n"
      "\n"
      "2,0.1,0.1,-nan,0.8,inf,0.7,1.0,1000\n");
  const auto rows = load_metrics(d.path.string());
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].test_acc == 0.62);
  CHECK(std::isnan(rows[1].train_loss));
  CHECK(std::isnan(rows[1].test_loss));  // non-finite values are NaN
  const MetricsCsv csv = read_metrics_csv(d.path.string());
  CHECK(csv.find("samples_per_s") == 8u);
  CHECK_FALSE(csv.find("compute_s"));
  const auto all = read_epochs(csv);
  CHECK(all[1].samples_per_s == 1000);
  CHECK(all[1].compute_s == 0);  // absent: EpochMetrics' default
  CHECK(std::isnan(all[1].busbw_gbps));
  CHECK_THROWS_WITH(csv.require({"compute_s"}, "; rerun it"),
                    Catch::Contains("metrics.csv: no column 'compute_s'; rerun it"));

  // A column every reader needs is missing; a row with a cell too many; a cell that is text.
  put(d.path / "metrics.csv", "epoch,lr\n1,0.0\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains("no column 'train_loss'"));
  put(d.path / "metrics.csv", metrics_csv_header() + metrics_csv_row(sample_epoch(1)) + "1,2\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains(":3: 2 cells, header has 31"));
  CHECK(read_metrics_csv(d.path.string(), RaggedRows::skip).rows.size() == 1);
  put(d.path / "metrics.csv",
      "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n"
      "1,0.1,abc,0.5,0.5,0.5,1\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains(":2: 'abc' is not a number"));
  // A NUL and a long cell in an error line: escaped, and cut at 40 characters.
  const std::string cell = std::string("\0x", 2) + std::string(100, '7');
  put(d.path / "metrics.csv", "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n"
                              "1,0.1," + cell + ",0.5,0.5,0.5,1\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()),
                    Catch::EndsWith(":2: '\\x00x" + std::string(38, '7') + "...' is not a number"));
  // Values that no run writes: an accuracy past 1, a negative loss, time or LR, a time of ages
  // (inf and -inf read as nan, as a run that diverged writes them).
  const std::string cols = "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n";
  for (const auto& [row, said] : std::vector<std::pair<std::string, std::string>>{
           {"1,0.1,0.5,0.5,0.5,7.5,1\n", "test_acc '7.5' is no value a run writes (a fraction"},
           {"1,0.1,-3,0.5,0.5,0.5,1\n", "train_loss '-3' is no value a run writes (at least 0)"},
           {"1,0.1,0.5,0.5,0.5,0.5,-2\n", "epoch_time_s '-2' is no value a run writes"},
           {"1,0.1,0.5,0.5,0.5,0.5,1e308\n", "epoch_time_s '1e308' is no value"},
           {"1,-0.1,0.5,0.5,0.5,0.5,1\n", "lr '-0.1' is no value a run writes"}}) {
    put(d.path / "metrics.csv", cols + row);
    CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains(":2: " + said));
  }
  // The columns beyond the seven the figures draw are read, and so checked, too.
  for (const auto& [column, value, said] : std::vector<std::array<std::string, 3>>{
           {"compute_s", "hello", "'hello' is not a number"},
           {"compute_s", "-5", "compute_s '-5' is no value a run writes"},
           {"samples", "-1", "samples '-1' is no value a run writes"},
           {"samples_per_s", "-5", "samples_per_s '-5' is no value a run writes"}}) {
    put(d.path / "metrics.csv", metrics_csv_header() + metrics_csv_row(sample_epoch(1)));
    MetricsCsv edited = read_metrics_csv(d.path.string());
    edited.rows[0][*edited.find(column)] = value;
    std::string text = metrics_csv_header();
    for (size_t i = 0; i < edited.rows[0].size(); ++i) text += (i ? "," : "") + edited.rows[0][i];
    put(d.path / "metrics.csv", text + "\n");
    CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains(":2: " + said));
  }
  // What a run can write: a diverged loss, a time not measured, a negative noise estimate
  // (B_simple = trace / |G|^2, whose trace estimate may come out below 0), read by any reader.
  put(d.path / "metrics.csv", cols + "1,0.1,nan,0.1,inf,0.1,nan\n");
  CHECK(std::isnan(load_metrics(d.path.string()).front().train_loss));
  put(d.path / "metrics.csv", metrics_csv_header() + metrics_csv_row(sample_epoch(1)));
  MetricsCsv noisy = read_metrics_csv(d.path.string());
  noisy.rows[0][*noisy.find("noise_b_simple")] = "-512.5";
  CHECK(read_epochs(noisy).front().noise_b_simple == -512.5);
  // Epochs that no run writes: out of order, repeated, skipped, or not a whole number in range.
  const std::string head = "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n";
  for (const auto& [body, line] : std::vector<std::pair<std::string, std::string>>{
           {"2,0,0,0,0,0,0\n", ":2: epoch '2' where epoch 1 belongs"},
           {"1,0,0,0,0,0,0\n1,0,0,0,0,0,0\n", ":3: epoch '1' where epoch 2 belongs"},
           {"1,0,0,0,0,0,0\n3,0,0,0,0,0,0\n", ":3: epoch '3' where epoch 2 belongs"},
           {"1e300,0,0,0,0,0,0\n", ":2: epoch '1e300' where epoch 1 belongs"},
           {"1.4,0,0,0,0,0,0\n", ":2: epoch '1.4' where epoch 1 belongs"}}) {
    put(d.path / "metrics.csv", head + body);
    CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains(line));
  }
  put(d.path / "metrics.csv", head + "1,0,0,0,0,0,0\n2,0,0,0,0,0,0\n");
  CHECK(load_metrics(d.path.string()).size() == 2);
  CHECK_FALSE(metrics_value("1e999"));
  CHECK_FALSE(metrics_value("1.5x"));
  CHECK_FALSE(metrics_value(""));
  // Hostile sizes: more rows than epochs a run can have, more columns than dtrain writes.
  std::string rows_file = "epoch,lr,train_loss,train_acc,test_loss,test_acc,epoch_time_s\n";
  for (int i = 0; i <= 100000; ++i) rows_file += "1,0,0,0,0,0,0\n";
  put(d.path / "metrics.csv", rows_file);
  CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains("more than 100000 rows"));
  std::string wide = "epoch";
  for (int i = 0; i < 100; ++i) wide += ",c" + std::to_string(i);
  put(d.path / "metrics.csv", wide + "\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()),
                    Catch::Contains("more than 64 columns; dtrain writes 31"));
  fs::remove(d.path / "metrics.csv");
  CHECK_THROWS_WITH(load_metrics(d.path.string()), Catch::Contains("metrics.csv: missing"));
}

TEST_CASE("docs/run.md lists metrics.csv's columns as the table has them", "[schema][docs]") {
  std::vector<std::string> table;
  for (const auto& c : metrics_columns()) table.push_back(c.name);
  CHECK(documented_columns() == table);
}

TEST_CASE("summary.json holds the declared fields, and its repeated values are the config's",
          "[schema][recorder]") {
  TempDir d("schema-summary");
  const Config cfg = synthetic_config(2, 16);
  const std::string dir = (d.path / "x" / "t-g2").string();
  {
    set_verbosity(true);  // the recorder's log lines are not this test's output
    RunRecorder rec(dir, "t-g2", "", cfg, {});
    RunInfo info;
    info.model = "mlp (100 parameters)";
    info.param_count = 100;
    info.steps_per_epoch = 4;
    rec.on_start(info);
    rec.on_epoch(sample_epoch(1));
    TrainResult r;
    r.info = info;
    r.epochs = {sample_epoch(1)};
    rec.finish(r);
    set_verbosity(false);
  }
  const json j = json::parse(slurp(fs::path(dir) / "summary.json"));
  std::set<std::string> declared;
  for (const auto& f : summary_fields()) {
    INFO(f.name);
    CHECK(declared.insert(f.name).second);  // declared once
    if (f.always) CHECK(j.contains(f.name));
    if (*f.repeats == '\0') continue;
    // "a.b" is config.a.b
    std::string ptr = "/" + std::string(f.repeats);
    std::replace(ptr.begin(), ptr.end(), '.', '/');
    CHECK(j[f.name] == j["config"][json::json_pointer(ptr)]);
  }
  for (const auto& [key, value] : j.items()) {
    INFO(key);
    CHECK(declared.count(key) == 1);  // a field the table does not declare
  }
  CHECK_FALSE(j.contains(summary_key::schema_version));  // version 1 has none
  const RunRecord back = load_run(dir);
  CHECK(back.schema_version == kSummaryVersion);
  CHECK(back.gpus == 2);
  CHECK(back.param_count == 100);
}

TEST_CASE("summary.json's fields are written from the table, each of its declared type",
          "[schema][recorder]") {
  std::set<std::string> declared;
  for (const auto& f : summary_fields()) CHECK(declared.insert(f.name).second);

  // A 1-replica CPU run with no epochs: every number a null where the run has none.
  const Config one = synthetic_config(1, 16);
  RunInfo bare;
  const std::vector<EpochMetrics> none;
  const RunStats no_stats = summarize(none, Targets{});
  SummarySource first(one, bare, none, no_stats);
  first.status = "failed";
  const json a = summary_json(first);
  // A GPU-like run of two replicas that has every optional field.
  RunInfo full;
  full.launches_per_step = 42;
  full.cuda_graph = "on";
  full.cuda_graph_steps = 7;
  full.replica_mode = "processes";
  full.placement = "rank 0: host0/0";
  full.peak_device_mib = {{0, 512.5}, {1, 500.0}};
  full.backend = "cpu";  // stragglers are looked for on the CPU only
  std::vector<EpochMetrics> epochs = {sample_epoch(1)};
  epochs[0].straggler_rank = 1;
  epochs[0].straggler_phase = 2;
  epochs[0].straggler_excess = 0.5;
  const RunStats stats = summarize(epochs, Targets{0.5, 0});
  Config two = synthetic_config(2, 16);
  two.data.dataset = DatasetKind::bytes;  // a language model's bits per byte
  SummarySource second(two, full, epochs, stats);
  second.error = "stopped";
  const json b = summary_json(second);

  for (const auto& f : summary_fields()) {
    INFO(f.name);
    if (f.always) {
      REQUIRE(a.contains(f.name));
      CHECK(has_declared_type(f, a[f.name]));
    } else {
      CHECK_FALSE(a.contains(f.name));  // an optional field the bare run has no value for
    }
    REQUIRE(b.contains(f.name));
    CHECK(has_declared_type(f, b[f.name]));
  }
  CHECK(a.size() < b.size());
  for (const auto& [key, value] : b.items()) CHECK(declared.count(key) == 1);
  CHECK(a["final_test_accuracy"].is_null());
  CHECK(b["final_test_accuracy"] == 0.5625);
  CHECK(b["epochs_to_target"] == 1);
  CHECK(b["peak_device_mib"]["cuda:0"] == 512.5);
  CHECK(b["stragglers"][0]["rank"] == 1);
  CHECK(b["exchange_bytes_per_step"] == 0);
  CHECK(b["final_test_bits_per_byte"].get<double>() == Approx(1.5 / std::log(2.0)));
}

TEST_CASE("docs/run.md lists summary.json's fields as the table has them", "[schema][docs]") {
  const std::string doc = slurp(fs::path(source_dir()) / "docs" / "run.md");
  const std::string rows = summary_table_rows();
  INFO("docs/run.md should hold these rows:\n" << rows);
  CHECK(doc.find(rows) != std::string::npos);
}

TEST_CASE("evals.csv: its header is the table's, and docs/run.md lists its columns", "[schema][docs]") {
  std::vector<std::string> names;
  for (const auto& c : eval_columns()) names.push_back(c.name);
  CHECK(evals_csv_header() == fmt::format("{}\n", fmt::join(names, ",")));
  EvalPoint p;
  p.epoch = 2;
  p.step = 7;
  p.global_step = 20;
  p.samples = 1280;
  p.train_time_s = 1.5;
  p.test_loss = 0.25;
  p.test_acc = 0.875;
  CHECK(evals_csv_row(p) == "2,7,20,1280,1.500000,0.250000,0.875000\n");
  // The folder listing's entry, its lines joined.
  std::string doc = slurp(fs::path(source_dir()) / "docs" / "run.md");
  const size_t at = doc.find("  evals.csv ");
  REQUIRE(at != std::string::npos);
  std::string entry = doc.substr(at, doc.find("  classes.txt", at) - at);
  std::string flat;
  for (char ch : entry)
    if (ch != '\n' && !(ch == ' ' && !flat.empty() && flat.back() == ' ')) flat += ch;
  CHECK_THAT(flat, Catch::Contains(fmt::format("{}", fmt::join(names, ", "))));
}

TEST_CASE("summary.json's to-target fields agree: a scoring between steps sets them all",
          "[schema][evals]") {
  Config cfg = synthetic_config(1, 16);
  cfg.train.target_accuracy = 0.8;
  cfg.train.eval_steps = 100;
  RunInfo info;
  info.steps_per_epoch = 400;
  // Reached at step 300 of epoch 1, lost again by the epoch's end (0.79).
  std::vector<EpochMetrics> epochs = {sample_epoch(1)};
  epochs[0].test_acc = 0.79;
  epochs[0].epoch_time_s = 4;
  const RunStats stats = summarize(epochs, Targets{0.8, 0});
  REQUIRE_FALSE(stats.time_to_target_s);
  SummarySource src(cfg, info, epochs, stats);
  src.evals = {{1, 100, 100, 1600, 1.0, 0.9, 0.7}, {1, 300, 300, 4800, 3.0, 0.6, 0.81},
               {1, 400, 400, 6400, 4.0, 0.62, 0.79}};
  const json j = summary_json(src);
  CHECK(j["steps_to_target"] == 300);
  CHECK(j["samples_to_target"] == 4800);
  CHECK(j["time_to_target_s"] == 3.0);
  CHECK(j["epochs_to_target"] == 1);
  CHECK(j["target_resolution_steps"] == 100);
  // Without scorings between steps: the epoch's end, which did not reach it.
  src.evals.clear();
  cfg.train.eval_steps = 0;
  const json k = summary_json(src);
  CHECK(k["steps_to_target"].is_null());
  CHECK(k["time_to_target_s"].is_null());
  CHECK(k["target_resolution_steps"] == 400);
}

#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_SCHEMA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_SCHEMA_ASAN 1
#endif
#endif

TEST_CASE("a metrics.csv row or a summary.json past what dtrain writes costs no memory",
          "[schema][report][errors]") {
  const auto peak_mib = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / 1024.0;
  };
  const double before = peak_mib();
  TempDir d("schema-hostile");
  // 32 MiB of commas in one row: not 32 million cells before the count is compared.
  put(d.path / "metrics.csv",
      metrics_csv_header() + "1" + std::string(size_t{32} << 20, ',') + "\n");
  CHECK_THROWS_WITH(load_metrics(d.path.string()),
                    Catch::Contains(":2: more cells, header has 31"));
  // 32 MiB of '[': not 32 million nested arrays before the depth is seen. The status file
  // still tells a resume what the run is.
  put(d.path / "summary.json", std::string(size_t{32} << 20, '['));
  put(d.path / "status", "done\n");
  CHECK(read_run_status(d.path.string(), false) == "done");
  CHECK_THROWS_WITH(load_run(d.path.string()), Catch::Contains("nested deeper than"));
  CHECK(parse_json_bounded("[[[1]]]", 3) == json::parse("[[[1]]]"));
  CHECK(parse_json_bounded("[[[[1]]]]", 3).is_discarded());
  CHECK(parse_json_bounded("{\"a\": ", 3).is_discarded());
  // A key given twice in one object: the parser would keep the last without a word.
  CHECK(parse_json_bounded("{\"a\": 1, \"b\": {\"a\": 2}}", 3)["b"]["a"] == 2);
  CHECK(parse_json_bounded("{\"a\": 1, \"b\": 2, \"a\": 3}", 3).is_discarded());
  put(d.path / "summary.json", "{\"gpus\": 2, \"status\": \"done\", \"gpus\": 8}");
  CHECK_THROWS_WITH(load_run(d.path.string()),
                    Catch::Contains("key 'gpus' given twice in one object"));
#ifdef DTRAIN_SCHEMA_ASAN
  WARN("peak memory not checked under AddressSanitizer (" << peak_mib() - before << " MiB)");
#else
  CHECK(peak_mib() - before < 400);
#endif
}

TEST_CASE("printable text hides controls, reordering marks and invalid UTF-8, nothing else",
          "[errors]") {
  CHECK(printable("plain ascii, 1.5e-3 | ok") == "plain ascii, 1.5e-3 | ok");
  CHECK(printable("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");  // other scripts stay
  CHECK(printable("a\nb\x1b[2Jc\x7f") == "a?b?[2Jc?");
  // C1 controls (U+009B is a terminal's CSI), right-to-left overrides: one '?' a byte.
  CHECK(printable("a\xc2\x9b"
                  "2J") == "a??2J");
  CHECK(printable("x\xe2\x80\xaey") == "x???y");
  CHECK(printable("x\xe2\x81\xa6y") == "x???y");
  // Invalid UTF-8: a lone continuation byte, a cut sequence, an overlong form, a surrogate.
  CHECK(printable("\x80"
                  "a\xc3") == "?a?");
  CHECK(printable("\xc0\xaf") == "??");
  CHECK(printable("\xed\xa0\x80") == "???");
  CHECK(printable("a\xc2\x9b", /*hex=*/true) == "a\\xc2\\x9b");
  CHECK(printable(std::string("n\0l", 3), true) == "n\\x00l");
}
