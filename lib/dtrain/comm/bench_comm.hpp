#pragma once
// dtrain bench-comm: the all-reduce (sum of float32, in place) of a host Communicator timed over
// a range of sizes, each result checked, reported the way nccl-tests' all_reduce_perf reports
// NCCL (time, algbw, busbw, #wrong; see nccl-tests doc/PERFORMANCE.md), plus a fit of the ring
// model T(bytes) = a + b * bytes that `dtrain project` reads back as a link.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dtrain/comm/comm.hpp"

namespace dtrain {

// "MIN:MAX" or "SIZE", in bytes with an optional K, M or G suffix (powers of 1024, as
// nccl-tests reads -b and -e): MIN, 2 MIN, 4 MIN, ... up to MAX. Each size must be a multiple of
// 4 bytes (whole float32 elements). Throws UserError naming the input and what is valid.
std::vector<size_t> parse_sizes(const std::string& spec);

// 2(n-1)/n: the share of the buffer each rank sends (and receives) in a ring all-reduce, which
// turns the algorithm bandwidth into the bus bandwidth, comparable across rank counts.
double bus_factor(int ranks);

struct SizeResult {
  size_t bytes = 0, count = 0;
  double time_s = 0;  // median over iterations of the slowest rank's time
  double algbw = 0;   // bytes / time_s, bytes per second
  double busbw = 0;   // algbw * bus_factor(ranks)
  int64_t wrong = 0;  // elements that differ from the exact sum, all ranks, worst iteration
};

struct BenchSettings {
  std::vector<size_t> sizes;
  int iters = 20, warmup = 5;
  // Test hook: this rank adds 1 to one element of its output after every all-reduce, so a test
  // can see a wrong result reported (DTRAIN_BENCH_COMM_CORRUPT=RANK; -1: off).
  int corrupt_rank = -1;
};

// The rank named by DTRAIN_BENCH_COMM_CORRUPT, or -1. Throws UserError for a value that is not
// a rank number.
int corrupt_rank_from_env();

// Every rank of `comm` calls this with the same settings (one thread per rank in-process, one
// process per rank under MPI); each gets the same results back.
std::vector<SizeResult> bench_allreduce(Communicator& comm, const BenchSettings& s);

// Least-squares fit of T(bytes) = a + b * bytes to the measured times, read through the ring
// model T = 2(n-1) alpha + 2(n-1)/n * bytes / busbw. NaN where it cannot be determined (fewer
// than two sizes, times that do not grow with the size).
struct LinkFit {
  double a_s = 0, b_s_per_byte = 0;
  double alpha_s = 0;  // per ring step: a / (2(n-1))
  double busbw = 0;    // bytes per second: 1 / (b * n / (2(n-1)))
};
LinkFit fit_link(const std::vector<SizeResult>& rows, int ranks);

struct BenchReport {
  std::string communicator;  // "in-process", "mpi", ...
  int ranks = 0;
  int iters = 0, warmup = 0;
  std::vector<SizeResult> rows;
  LinkFit fit;
  std::string utc;  // when it ran
  int64_t wrong() const;
};

// One column of a result row. row_cells() is the single place a row is formatted; the text
// table, the Markdown table and the JSON records are all rendered from its cells.
struct Cell {
  std::string key;                                   // JSON key
  std::string title;                                 // column title (first header line)
  std::string unit;                                  // second header line, e.g. "(us)"
  int width = 0;                                     // text column width
  std::string text;                                  // the formatted value
  std::variant<int64_t, double, std::string> value;  // the JSON value
};
std::vector<Cell> row_cells(const SizeResult& r);

std::string to_text(const BenchReport& r);      // nccl-tests-like table and the fit, '#' notes
std::string to_markdown(const BenchReport& r);  // the same as a Markdown document
std::string to_json(const BenchReport& r);

// alpha and busbw of a bench-comm JSON file (its "fit"). Throws UserError naming the file when
// it cannot be read or holds no usable fit.
LinkFit load_bench_fit(const std::string& path);

}  // namespace dtrain
