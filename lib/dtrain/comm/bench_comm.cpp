#include "dtrain/comm/bench_comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/json.hpp"
#include "dtrain/base/version.hpp"

namespace dtrain {

namespace {

const char* const kSizesHelp =
    "give MIN:MAX (or one SIZE) in bytes, each a multiple of 4 with an optional K, M or G "
    "suffix (powers of 1024), e.g. 4K:256M";

// One size of --sizes: digits and an optional K, M or G (either case); "" where it is not one.
size_t parse_size(const std::string& spec, const std::string& s) {
  size_t v = 0;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  size_t mult = 1;
  if (ec == std::errc() && p + 1 == end) {
    switch (*p) {
      case 'k':
      case 'K':
        mult = size_t{1} << 10;
        break;
      case 'm':
      case 'M':
        mult = size_t{1} << 20;
        break;
      case 'g':
      case 'G':
        mult = size_t{1} << 30;
        break;
      default:
        mult = 0;
    }
  } else if (ec != std::errc() || p != end) {
    mult = 0;
  }
  // Sizes past 64 GiB are refused too: every rank holds one such buffer.
  if (mult == 0 || v == 0 || v > (size_t{64} << 30) / mult)
    throw UserError(fmt::format("--sizes '{}': '{}' is not a size; {}", spec, s, kSizesHelp));
  if (v * mult % 4 != 0)
    throw UserError(
        fmt::format("--sizes '{}': {} bytes is not a whole number of float32 "
                    "elements; {}",
                    spec, v * mult, kSizesHelp));
  return v * mult;
}

// Small integers, different for each rank and position, whose float sums over any number of
// ranks a run could have are exact: the reference sum is known without a reduction.
constexpr int kPeriod = 17;
float pattern(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i + 7 * static_cast<size_t>(rank)) % kPeriod) - 8);
}

void fill(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(rank, i);
}

std::array<float, kPeriod> reference(int ranks) {
  std::array<float, kPeriod> ref{};
  for (size_t k = 0; k < ref.size(); ++k)
    for (int r = 0; r < ranks; ++r) ref[k] += pattern(r, k);
  return ref;
}

int64_t count_wrong(const std::vector<float>& buf, const std::array<float, kPeriod>& ref) {
  int64_t wrong = 0;
  size_t k = 0;
  for (float v : buf) {
    wrong += v != ref[k] ? 1 : 0;
    k = k + 1 == ref.size() ? 0 : k + 1;
  }
  return wrong;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// One size on this rank: iters timed all-reduces after warmup; returns this rank's times and
// wrong counts (each iteration starts from a fresh fill, so every result has the same sum).
void time_size(Communicator& comm, const BenchSettings& s, size_t count, std::vector<double>& times,
               std::vector<double>& wrong) {
  const int rank = comm.rank();
  const auto ref = reference(comm.size());
  std::vector<float> buf(count);
  for (int it = 0; it < s.warmup + s.iters; ++it) {
    fill(buf, rank);
    comm.barrier();  // each iteration's clock starts when all are in
    const auto t0 = std::chrono::steady_clock::now();
    comm.allreduce(buf.data(), buf.size(), ReduceOp::sum);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == s.corrupt_rank) buf[count / 2] += 1.0f;  // the test hook (see BenchSettings)
    if (it < s.warmup) continue;
    times[static_cast<size_t>(it - s.warmup)] = t;
    wrong[static_cast<size_t>(it - s.warmup)] = static_cast<double>(count_wrong(buf, ref));
  }
}

std::string gbps(double bytes_per_s) {
  return fmt::format("{:.2f}", bytes_per_s / 1e9);
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json to_json(const Cell& c) {
  return std::visit([](const auto& v) { return nlohmann::json(v); }, c.value);
}

std::string fit_lines(const BenchReport& r, const char* prefix) {
  const LinkFit& f = r.fit;
  if (!std::isfinite(f.a_s) || !std::isfinite(f.busbw))
    return fmt::format(
        "{}fit: not determined (needs at least two sizes whose times grow with "
        "the size)\n",
        prefix);
  return fmt::format(
      "{0}fit T(bytes) = a + b * bytes (least squares on relative residuals): a = {1:.2f} us, "
      "b = {2:.4g} ns/B\n"
      "{0}ring model T = 2(n-1) alpha + 2(n-1)/n * bytes / busbw, n = {3}: alpha = {4:.3f} us "
      "per step, busbw_fit = {5} GB/s\n",
      prefix, f.a_s * 1e6, f.b_s_per_byte * 1e9, r.ranks, f.alpha_s * 1e6, gbps(f.busbw));
}

}  // namespace

std::vector<size_t> parse_sizes(const std::string& spec) {
  const auto colon = spec.find(':');
  const size_t lo = parse_size(spec, spec.substr(0, colon));
  const size_t hi = colon == std::string::npos ? lo : parse_size(spec, spec.substr(colon + 1));
  if (lo > hi)
    throw UserError(fmt::format("--sizes '{}': MIN is larger than MAX; {}", spec, kSizesHelp));
  std::vector<size_t> out;
  for (size_t b = lo; b <= hi; b *= 2) out.push_back(b);
  return out;
}

double bus_factor(int ranks) {
  return ranks > 0 ? 2.0 * (ranks - 1) / ranks : 0.0;
}

int corrupt_rank_from_env() {
  const char* v = std::getenv("DTRAIN_BENCH_COMM_CORRUPT");
  if (!v || !*v) return -1;
  const std::string s(v);
  int rank = -1;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), rank);
  if (ec != std::errc() || p != s.data() + s.size() || rank < 0)
    throw UserError(
        fmt::format("DTRAIN_BENCH_COMM_CORRUPT='{}': give a rank number (a test "
                    "hook: that rank perturbs its results)",
                    s));
  return rank;
}

std::vector<SizeResult> bench_allreduce(Communicator& comm, const BenchSettings& s) {
  const int n = comm.size();
  const auto iters = static_cast<size_t>(s.iters);
  std::vector<SizeResult> out;
  for (const size_t bytes : s.sizes) {
    std::vector<double> times(iters), wrong(iters);
    time_size(comm, s, bytes / sizeof(float), times, wrong);
    // Every rank's times and wrong counts reach every rank (each rank fills its own slots, the
    // sum adds zeros elsewhere), so all ranks report the same numbers.
    std::vector<double> all(iters * static_cast<size_t>(n + 1), 0.0);
    std::copy(times.begin(), times.end(), all.begin() + static_cast<long>(iters * comm.rank()));
    std::copy(wrong.begin(), wrong.end(), all.begin() + static_cast<long>(iters * n));
    comm.allreduce(all.data(), all.size(), ReduceOp::sum);
    std::vector<double> slowest(iters, 0.0);
    double worst = 0;
    for (size_t i = 0; i < iters; ++i) {
      for (int r = 0; r < n; ++r) slowest[i] = std::max(slowest[i], all[iters * r + i]);
      worst = std::max(worst, all[iters * n + i]);
    }
    SizeResult res;
    res.bytes = bytes;
    res.count = bytes / sizeof(float);
    res.time_s = median(slowest);
    res.algbw = static_cast<double>(bytes) / res.time_s;
    res.busbw = res.algbw * bus_factor(n);
    res.wrong = static_cast<int64_t>(worst);
    out.push_back(res);
  }
  return out;
}

LinkFit fit_link(const std::vector<SizeResult>& rows, int ranks) {
  // Weights 1/T^2 fit relative residuals: an unweighted fit would be decided by the largest
  // sizes alone and leave the latency, which only the small sizes show, to their noise.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& r : rows) {
    if (!(r.time_s > 0)) continue;
    const double w = 1.0 / (r.time_s * r.time_s), x = static_cast<double>(r.bytes);
    sw += w, sx += w * x, sy += w * r.time_s, sxx += w * x * x, sxy += w * x * r.time_s;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LinkFit f{nan, nan, nan, nan};
  const double det = sw * sxx - sx * sx;
  if (rows.size() < 2 || ranks < 2 || !(det > 0)) return f;
  f.b_s_per_byte = (sw * sxy - sx * sy) / det;
  f.a_s = (sy - f.b_s_per_byte * sx) / sw;
  if (f.a_s < 0) {  // a negative latency means none measurable: fit the line through zero
    f.a_s = 0;
    f.b_s_per_byte = sxy / sxx;
  }
  f.alpha_s = f.a_s / (2.0 * (ranks - 1));
  f.busbw = f.b_s_per_byte > 0 ? 1.0 / (f.b_s_per_byte / bus_factor(ranks)) : nan;
  return f;
}

int64_t BenchReport::wrong() const {
  int64_t w = 0;
  for (const auto& r : rows) w += r.wrong;
  return w;
}

std::vector<Cell> row_cells(const SizeResult& r) {
  const auto bytes = static_cast<int64_t>(r.bytes), count = static_cast<int64_t>(r.count);
  return {
      {"size_bytes", "size", "(B)", 12, fmt::format("{}", bytes), bytes},
      {"count", "count", "(elements)", 12, fmt::format("{}", count), count},
      {"type", "type", "", 6, "float", std::string("float")},
      {"time_us", "time", "(us)", 10, fmt::format("{:.2f}", r.time_s * 1e6), r.time_s * 1e6},
      {"algbw_GBps", "algbw", "(GB/s)", 8, gbps(r.algbw), r.algbw / 1e9},
      {"busbw_GBps", "busbw", "(GB/s)", 8, gbps(r.busbw), r.busbw / 1e9},
      {"wrong", "#wrong", "", 7, fmt::format("{}", r.wrong), r.wrong},
  };
}

std::string to_text(const BenchReport& r) {
  std::string s = fmt::format(
      "# dtrain bench-comm: all-reduce, sum of float32 in place, {} communicator, {} ranks\n"
      "# warmup {}, iters {}; time: median over iterations of the slowest rank; "
      "busbw = algbw * 2(n-1)/n\n#\n",
      r.communicator, r.ranks, r.warmup, r.iters);
  std::string title = "#", unit = "#";
  for (const auto& c : row_cells(SizeResult{})) {
    // The first column gives up one character to the '#' that starts the header lines.
    const int w = title.size() == 1 ? c.width - 1 : c.width + 1;
    title += fmt::format("{:>{}}", c.title, w);
    unit += fmt::format("{:>{}}", c.unit, w);
  }
  unit.erase(unit.find_last_not_of(' ') + 1);
  s += title + "\n" + unit + "\n";
  for (const auto& row : r.rows) {
    std::string line;
    for (const auto& c : row_cells(row)) line += fmt::format("{:>{}}", c.text, c.width + 1);
    s += line.substr(1) + "\n";
  }
  s += fit_lines(r, "# ");
  s += fmt::format("# wrong elements: {}\n", r.wrong());
  return s;
}

std::string to_markdown(const BenchReport& r) {
  std::string s = fmt::format(
      "# dtrain bench-comm\n\nAll-reduce, sum of float32 in place, {} communicator, {} ranks, "
      "{} ({}). Warmup {}, iters {}; time is the median over iterations of the slowest rank; "
      "busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md).\n\n",
      r.communicator, r.ranks, r.utc, kGitSha, r.warmup, r.iters);
  std::string head = "|", rule = "|";
  for (const auto& c : row_cells(SizeResult{})) {
    head += fmt::format(" {}{} |", c.title, c.unit.empty() ? "" : " " + c.unit);
    rule += "---|";
  }
  s += head + "\n" + rule + "\n";
  for (const auto& row : r.rows) {
    s += "|";
    for (const auto& c : row_cells(row)) s += " " + c.text + " |";
    s += "\n";
  }
  return s + "\n" + fit_lines(r, "") + fmt::format("\nWrong elements: {}.\n", r.wrong());
}

std::string to_json(const BenchReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json j;
    for (const auto& c : row_cells(row)) j[c.key] = to_json(c);
    rows.push_back(j);
  }
  const nlohmann::json j = {{"tool", "dtrain bench-comm"},
                            {"dtrain_version", kVersion},
                            {"git_sha", kGitSha},
                            {"utc", r.utc},
                            {"communicator", r.communicator},
                            {"ranks", r.ranks},
                            {"op", "sum"},
                            {"type", "float"},
                            {"warmup", r.warmup},
                            {"iters", r.iters},
                            {"rows", rows},
                            {"fit",
                             {{"a_s", number_or_null(r.fit.a_s)},
                              {"b_s_per_byte", number_or_null(r.fit.b_s_per_byte)},
                              {"alpha_s", number_or_null(r.fit.alpha_s)},
                              {"busbw_Bps", number_or_null(r.fit.busbw)}}},
                            {"wrong", r.wrong()}};
  return json_text(j, 2) + "\n";
}

LinkFit load_bench_fit(const std::string& path) {
  // dtrain writes 3 levels.
  const auto j = parse_json_bounded(read_text_file(path, "bench-comm JSON file"), 8);
  if (j.is_discarded())
    throw UserError(
        fmt::format("{}: not a measurement dtrain bench-comm wrote (not JSON, nested "
                    "deeper than 8 levels, or a key given twice); write one with "
                    "dtrain bench-comm --out FILE",
                    path));
  const auto number = [&](const char* key) {
    if (!j.is_object() || !j.contains("fit") || !j["fit"].is_object() || !j["fit"].contains(key) ||
        !j["fit"][key].is_number())
      return std::numeric_limits<double>::quiet_NaN();
    return j["fit"][key].get<double>();
  };
  // A measurement whose sums came back wrong timed a broken exchange: no link to project with.
  int64_t wrong = j.is_object() && j.contains("wrong") && j["wrong"].is_number()
                      ? static_cast<int64_t>(std::min(j["wrong"].get<double>(), 1e18))
                      : 0;
  if (j.is_object() && j.contains("rows") && j["rows"].is_array())
    for (const auto& row : j["rows"])
      if (row.is_object() && row.contains("wrong") && row["wrong"].is_number() &&
          !(row["wrong"].get<double>() <= 0))
        wrong = std::max<int64_t>(wrong, 1);
  if (wrong != 0)
    throw UserError(fmt::format(
        "{}: this measurement's all-reduce gave wrong sums (\"wrong\" is not 0): its times "
        "are of a broken exchange; measure again and check the communicator first",
        path));
  LinkFit f{number("a_s"), number("b_s_per_byte"), number("alpha_s"), number("busbw_Bps")};
  // Bounds of any real link: latency under a second, bandwidth between 1 kB/s and 1 PB/s.
  if (!(f.alpha_s >= 0 && f.alpha_s < 1) || !(f.busbw >= 1e3 && f.busbw <= 1e15))
    throw UserError(fmt::format(
        "{}: no usable fit (fit.alpha_s and fit.busbw_Bps) in this file; write one with "
        "dtrain bench-comm --out FILE over at least two sizes",
        path));
  return f;
}

}  // namespace dtrain
