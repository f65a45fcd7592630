// dtrain bench-comm: the all-reduce of the communicator a run would use, timed and checked over
// a range of sizes (in-process threads, or MPI under mpirun/srun).
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <system_error>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/comm/bench_comm.hpp"
#include "dtrain/comm/comm.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/results/report.hpp"

namespace dtrain::cli {

namespace fs = std::filesystem;

namespace {

std::string utc_stamp(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format(fmt::runtime(format), tm);
}

// --out PATH writes PATH.json and PATH.md (a .json or .md the user gave is not doubled).
// Without --out, a name of the second, with -2, -3, ... where one of that second exists.
std::string out_stem(const std::string& out) {
  fs::path p(out.empty() ? "results/bench-comm/" + utc_stamp("{:%Y%m%d-%H%M%S}") : out);
  if (p.extension() == ".json" || p.extension() == ".md") p.replace_extension();
  const std::string stem = p.string();
  std::error_code ec;
  const auto taken = [&](const std::string& s) {
    return fs::exists(fs::symlink_status(s + ".json", ec)) ||
           fs::exists(fs::symlink_status(s + ".md", ec));
  };
  if (!out.empty() || !taken(stem)) return stem;
  for (int n = 2; n < 1000; ++n)
    if (!taken(fmt::format("{}-{}", stem, n))) return fmt::format("{}-{}", stem, n);
  return stem;  // refused below as taken
}

// One thread per replica, as `dtrain run` places in-process replicas. A rank that fails aborts
// the group, so the others leave their collective instead of waiting for it forever.
std::vector<SizeResult> bench_in_process(int replicas, const BenchSettings& s) {
  InProcessGroup group(replicas);
  std::vector<SizeResult> rows;
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(replicas));  // no reallocation while threads run
  try {
    for (int r = 0; r < replicas; ++r)
      threads.emplace_back([&, r] {
        try {
          auto comm = group.communicator(r);
          auto mine = bench_allreduce(*comm, s);
          if (r == 0) rows = std::move(mine);
        } catch (...) {
          std::lock_guard lk(mu);
          if (!first) first = std::current_exception();
          group.abort(fmt::format("rank {} failed", r));
        }
      });
  } catch (const std::exception& e) {  // out of threads: those started leave, then say so
    group.abort("a replica's thread could not be started");
    for (auto& t : threads) t.join();
    DTRAIN_THROW_SYSTEM(fmt::format("bench-comm: cannot start the thread of rank {} of {} "
                                    "replicas ({}); fewer --replicas, or raise ulimit -u / -v",
                                    threads.size(), replicas, e.what()));
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  return rows;
}

// One rank per process under mpirun/srun; every rank returns the same rows.
std::vector<SizeResult> bench_mpi(const BenchSettings& s, double timeout_s, std::string& kind) {
  auto comm = mpi::world(timeout_s);
  if (comm->size() < 2)
    throw UserError("bench-comm under a launcher needs at least 2 processes (mpirun -np 2 ...)");
  kind = comm->kind();
  try {
    return bench_allreduce(*comm, s);
  } catch (const std::exception& e) {
    if (!dynamic_cast<const Aborted*>(&e)) comm->abort(e.what());  // release the other ranks
    std::fprintf(stderr, "dtrain: rank %d: bench-comm failed: %s\n", mpi::rank(), e.what());
    mpi::end_job_after_failure(1);
  }
}

}  // namespace

namespace {
// Every replica on this machine (`here`: threads, or processes of this launch on this host)
// holds the largest buffer and its reference: what the machine cannot hold is refused rather
// than met by the out-of-memory killer. "" when it fits.
std::string memory_refusal(const std::string& sizes, const BenchSettings& s, int here) {
  const double largest = static_cast<double>(*std::max_element(s.sizes.begin(), s.sizes.end()));
  const double need = 2 * largest * here;
  const double have = available_host_memory();
  if (have <= 0 || need <= have / 2) return "";
  return fmt::format(
      "--sizes {}: {} replica(s) on this machine x 2 x {:.0f} MiB needs {:.1f} GiB, more than "
      "half of the {:.1f} GiB available; give a smaller MAX or fewer replicas",
      sizes, here, largest / (1 << 20), need / (1 << 30), have / (1 << 30));
}
}  // namespace

void setup_bench_comm(CLI::App& app, BenchCommOptions& opt) {
  app.footer(
      "Under mpirun or srun it times MPI with one rank per process (the process count is the "
      "replica count); otherwise in-process replicas (threads). GPU all-reduce (NCCL) is not "
      "timed here: runs time their own exchange (metrics.csv: exchange_s, exchange_exposed_s). "
      "Exit 1 when any result is wrong.");
  app.add_option("--sizes", opt.sizes,
                 "MIN:MAX in bytes with K, M or G suffixes (powers of 1024); sizes double from "
                 "MIN to MAX")
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "Timed all-reduces per size")->capture_default_str();
  app.add_option("--warmup", opt.warmup, "Untimed all-reduces per size before the timed ones")
      ->capture_default_str();
  app.add_option("--replicas", opt.replicas,
                 "In-process replicas (threads); default 2 (under mpirun or srun: the processes)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--out", opt.out,
                 "Write OUT.json and OUT.md (default: results/bench-comm/<UTC time>)")
      ->check(non_empty());
  app.add_option("--timeout", opt.timeout_s,
                 "Under mpirun or srun: seconds a rank waits for the others in one all-reduce "
                 "before the job ends, naming the rank it waited for")
      ->check(CLI::Range(1.0, 1e7))
      ->capture_default_str();
}

int run_bench_comm(const BenchCommOptions& opt) {
  BenchSettings s;
  s.sizes = parse_sizes(opt.sizes);
  s.iters = opt.iters;
  s.warmup = opt.warmup;
  if (s.iters < 1 || s.warmup < 0 || s.iters > 1000000 || s.warmup > 1000000)
    throw UserError(
        fmt::format("--iters {} --warmup {}: give 1 to 10^6 timed iterations and 0 to 10^6 "
                    "warmup iterations",
                    opt.iters, opt.warmup));
  const bool multi = mpi::initialized();
  if (multi) mpi::set_planning_timeout(opt.timeout_s, "bench-comm --timeout", "");
  if (multi && opt.replicas != 0 && opt.replicas != mpi::size())
    throw UserError(fmt::format(
        "--replicas {}: under mpirun or srun each of the {} processes is one replica; drop "
        "--replicas, or start {} processes",
        opt.replicas, mpi::size(), opt.replicas));
  const int replicas = opt.replicas == 0 ? 2 : opt.replicas;
  if (!multi && (replicas < 2 || replicas > 1024))
    throw UserError(
        fmt::format("--replicas {}: give 2 to 1024 (one replica has nothing to "
                    "exchange)",
                    replicas));
  std::string refusal = memory_refusal(opt.sizes, s, multi ? mpi::detect().local_size : replicas);
  // Hosts differ in memory and process count: one host's refusal stops every rank.
  if (multi) refusal = mpi::first_refusal(refusal);
  if (!refusal.empty()) throw UserError(refusal);
  s.corrupt_rank = corrupt_rank_from_env();
  BenchReport rep;
  rep.communicator = "in-process";
  rep.ranks = multi ? mpi::size() : replicas;
  rep.iters = s.iters;
  rep.warmup = s.warmup;
  rep.utc = utc_stamp("{:%Y-%m-%dT%H:%M:%SZ}");
  const std::string stem = out_stem(opt.out);
  require_file_stem(stem, opt.out);
  for (const char* ext : {".md", ".json"}) {
    refuse_run_folder_output(stem + ext, "--out", /*folder=*/false);
    // A measurement is of its moment and cannot be made again: never written over.
    std::error_code ec;
    if (fs::exists(fs::symlink_status(stem + ext, ec)))
      throw UserError(
          fmt::format("--out {}: {}{} exists; a measurement is never written over "
                      "(give another --out, or remove it)",
                      opt.out, stem, ext));
  }
  if (!multi || mpi::rank() == 0)  // a folder that cannot be made fails before the timing
    ensure_dir(fs::absolute(stem).parent_path().string(), "bench-comm output");
  rep.rows = multi ? bench_mpi(s, opt.timeout_s, rep.communicator) : bench_in_process(replicas, s);
  rep.fit = fit_link(rep.rows, rep.ranks);
  const int64_t wrong = rep.wrong();
  if (multi && mpi::rank() != 0) return wrong ? 1 : 0;
  fmt::print("{}", to_text(rep));
  write_file_atomic(stem + ".json", to_json(rep));
  write_file_atomic(stem + ".md", to_markdown(rep));
  fmt::print("# written to {}.json and {}.md\n", printable(stem, true), printable(stem, true));
  if (wrong) {
    std::fprintf(stderr,
                 "dtrain: bench-comm: %lld wrong element%s: the %s all-reduce did not return "
                 "the exact sum\n",
                 static_cast<long long>(wrong), wrong == 1 ? "" : "s", rep.communicator.c_str());
    return 1;
  }
  return 0;
}

}  // namespace dtrain::cli
