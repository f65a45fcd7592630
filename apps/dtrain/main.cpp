// dtrain: data-parallel scaling experiments from YAML files.
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/base/version.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/train/trainer.hpp"

int run_main(int argc, char** argv);

namespace {

// When the first stop signal came (CLOCK_MONOTONIC, ns), 0 before any.
std::atomic<int64_t> g_first_stop_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "on_interrupt must be signal-safe");

// The first SIGINT, SIGTERM or SIGHUP stops the run at a step boundary, with its checkpoint and
// summary. Another a second or more later (Ctrl-C pressed again) ends the process at once; one
// right behind the first is the same request twice (GNU timeout signals dtrain and then its
// process group) and is let go.
void on_interrupt(int signal) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  int64_t first = 0;
  if (g_first_stop_ns.compare_exchange_strong(first, ns)) {
    dtrain::request_stop(signal);
    return;
  }
  if (ns - first < 1'000'000'000) return;
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}
}  // namespace

int main(int argc, char** argv) {
  dtrain::route_stop_signals();  // before any thread: none that computes ever takes a signal
  if (const std::string why = dtrain::address_space_shortfall(); !why.empty()) {
    std::fprintf(stderr, "dtrain: error: %s\n", why.c_str());
    std::fflush(stderr);
    _exit(2);  // not exit(): OpenBLAS's exit handler would wait for its stuck workers
  }
  // Started by mpirun/srun: one replica per process over MPI.
  if (dtrain::mpi::detect().active) {
    try {
      dtrain::mpi::init(&argc, &argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(e.what()).c_str());
      return 2;
    }
  }
  // DTRAIN_FAULT=exit:R (a test facility): rank R ends at once with exit code 3, as a rank that
  // fails by a path that tells no peer would; the others wait for it in their first collective.
  int exit_rank = -1;
  if (const char* f = std::getenv("DTRAIN_FAULT"); !f || std::sscanf(f, "exit:%d", &exit_rank) != 1)
    exit_rank = -1;
  const bool injected = dtrain::mpi::initialized() && dtrain::mpi::rank() == exit_rank;
  const int code = injected ? 3 : run_main(argc, argv);
  // A rank that failed alone would wait in MPI_Finalize for peers that still train (they wait
  // for it in turn, up to the collective timeout): after a grace it ends the job instead.
  // A stop signal ends every rank alike, rank 0 last (it writes the checkpoint): no timer.
  if (code != 0 && !dtrain::stop_requested()) dtrain::mpi::finalize_after_failure(code);
  dtrain::mpi::finalize();
  return code;
}

namespace {

// What every subcommand's options are read into: they live as long as the parse and the run.
struct AllOptions {
  dtrain::cli::RunOptions run;
  dtrain::cli::ValidateOptions validate;
  dtrain::cli::DoctorOptions doctor;
  dtrain::cli::ExplainOptions explain;
  dtrain::cli::ExplainTimeOptions explain_time;
  dtrain::cli::ReportOptions report;
  dtrain::cli::DevicesOptions devices;
  dtrain::cli::BenchCommOptions bench_comm;
  dtrain::cli::ProjectOptions project;
  dtrain::cli::ExportOptions export_images;
  dtrain::cli::BenchInputOptions bench_input;
};

// A subcommand: its CLI11 app (true once given), and what runs it with its options.
struct Command {
  CLI::App* cli;
  std::function<int()> run;
  bool stops_at_step;  // Ctrl-C and SIGTERM stop it where it can leave things whole
};

// Declares subcommand `name` on `app` with `setup`; `run` runs it with the options it read.
template <class Opt>
Command add(CLI::App& app, const char* name, const char* what, Opt& opt,
            void (*setup)(CLI::App&, Opt&), int (*run)(const Opt&), bool stops_at_step = false) {
  CLI::App* cmd = app.add_subcommand(name, what);
  setup(*cmd, opt);
  return {cmd, [run, &opt] { return run(opt); }, stops_at_step};
}

// One line per subcommand: its name, what it does, its options and their setup, its run.
std::vector<Command> add_commands(CLI::App& app, AllOptions& o) {
  using namespace dtrain::cli;
  return {
      add(app, "run",
          "Train one run, or one per value of comma-list overrides, and print the comparison "
          "table",
          o.run, setup_run, run_run, true),
      add(app, "validate", "Check a config (and its data) without training", o.validate,
          setup_validate, run_validate),
      add(app, "doctor",
          "Name the known reasons N replicas train worse than 1, before any training", o.doctor,
          setup_doctor, run_doctor),
      add(app, "explain", "Attribute the accuracy gap of N replicas against 1, one setting per run",
          o.explain, setup_explain, run_explain, true),
      add(app, "explain-time",
          "Attribute the epoch time of N replicas against fewer, one measured term at a time "
          "(also: explain --time)",
          o.explain_time, setup_explain_time, run_explain_time),
      add(app, "report", "Regenerate comparison tables (and figures) from run folders", o.report,
          setup_report, run_report),
      add(app, "devices",
          "List the GPUs (and the CPU) dtrain can use, with driver and library versions", o.devices,
          setup_devices, run_devices),
      add(app, "bench-comm", "Time and check the all-reduce a run would use, over a range of sizes",
          o.bench_comm, setup_bench_comm, run_bench_comm),
      add(app, "project",
          "Project a 1-replica run's step to N GPUs over a link (a model, not a run)", o.project,
          setup_project, run_project),
      add(app, "export-images",
          "Write a config's image data as a folder of PNG or JPEG files (dataset: folder)",
          o.export_images, setup_export, run_export, true),
      add(app, "bench-input",
          "Time the input pipeline of image files (dataset: folder) at each worker count",
          o.bench_input, setup_bench_input, run_bench_input),
  };
}

// CLI11's words for two mistakes, in ours: an option given twice ("--out: At Most 1 required
// but received 2") and a value outside a range, or no number at all ("--seeds: Value abc not
// in range 1 to 100").
std::string in_our_words(std::string what) {
  if (const auto at = what.find(": At Most 1 required but received "); at != std::string::npos)
    return what.substr(0, at) + ": given more than once; give it once";
  const std::string value = ": Value ", range = " not in range ";
  const auto v = what.find(value), r = what.rfind(range);
  if (v == std::string::npos || r == std::string::npos || r < v) return what;
  const std::string option = what.substr(0, v);
  const std::string given = what.substr(v + value.size(), r - v - value.size());
  const std::string bounds = what.substr(r + range.size());
  char* end = nullptr;
  const double x = std::strtod(given.c_str(), &end);
  const bool number = !given.empty() && end == given.c_str() + given.size() && std::isfinite(x);
  return number ? fmt::format("{}: {} is outside {}", option, given, bounds)
                : fmt::format("{}: '{}' is not a number; give one from {}", option, given, bounds);
}

// One line, like every other user mistake, naming the command and where its help is; exit 2.
int report_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::string cmd;
  for (const auto* sub : app.get_subcommands()) cmd = sub->get_name();
  std::string what = dtrain::cli::one_line(in_our_words(e.what()).c_str());
  if (cmd.empty() && argc > 1 && argv[1][0] != '-') {
    std::string names;
    for (const auto* sub : app.get_subcommands({}))
      names += (names.empty() ? "" : " | ") + sub->get_name();
    what = fmt::format(
        "unknown command '{}'; valid: {} (a sweep is `dtrain run` with comma "
        "lists, e.g. gpus=1,2,4)",
        argv[1], names);
  } else if (cmd.empty() && argc > 1) {
    what = fmt::format(
        "unknown option '{}' before any command; give a command first, e.g. "
        "dtrain run CONFIG",
        argv[1]);
  } else if (cmd.empty()) {
    what = "give a command, e.g. dtrain run CONFIG";
  }
  std::fprintf(stderr, "dtrain: error: %s%s%s; see dtrain %s%s--help\n", cmd.c_str(),
               cmd.empty() ? "" : ": ", dtrain::cli::one_line(what.c_str()).c_str(), cmd.c_str(),
               cmd.empty() ? "" : " ");
  return 2;
}

// The exit code when the command line does not come to a command: help, version or a mistake.
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e, argc, argv);
  }
  return std::nullopt;
}

// Under a launcher, a rank whose command line ends before its command (a mistake, or --help on
// one rank's line) says so to the others, which would wait for it at their first collective.
std::optional<int> parse_on_every_rank(CLI::App& app, int argc, char** argv) {
  const auto code = parse(app, argc, argv);
  if (!dtrain::mpi::initialized()) return code;
  const auto chosen = app.get_subcommands();
  const std::string name = code || chosen.empty() ? "" : chosen.front()->get_name();
  std::string first = name;
  dtrain::mpi::broadcast(first);
  const std::string why = dtrain::mpi::first_refusal(
      code ? "its command line ended before the command (its message says why)"
      : name != first
          ? fmt::format("its command is {}, rank 0's {}; every rank runs one", name, first)
          : "");
  if (why.empty() || code) return code;
  if (dtrain::mpi::rank() == 0)
    std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(why.c_str()).c_str());
  return 2;
}

// Runs the command; what it throws becomes one line and the exit code: 2 for a user mistake, 1
// for anything else.
int run_command(const Command& cmd) {
  try {
    return cmd.run();
  } catch (const dtrain::UserError& e) {
    dtrain::clear_progress();
    // Every rank sees the same mistake; one line is enough.
    if (dtrain::mpi::rank() == 0)
      std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be walked (a loop of links, no permission): named, in
    // one line, as a user's mistake.
    dtrain::clear_progress();
    if (dtrain::mpi::rank() == 0)
      std::fprintf(stderr, "dtrain: error: %s: %s\n",
                   dtrain::cli::one_line(e.path1().empty() ? "a path" : e.path1().c_str()).c_str(),
                   dtrain::cli::one_line(e.code().message().c_str()).c_str());
    return 2;
  } catch (const dtrain::StorageError& e) {
    dtrain::clear_progress();
    // A full disk: named, not a bug.
    std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 1;
  } catch (const dtrain::SystemError& e) {
    // A failure of the machine or a library (CUDA, NCCL, MPI, threads), typed and placed
    // (file:line, rank): an error, not a bug of dtrain's.
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 1;
  } catch (const dtrain::Aborted& e) {
    // Another rank failed, or did not answer within train.collective_timeout_s: the job's
    // situation, named by the rank that saw it, not a bug.
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 1;
  } catch (const std::system_error& e) {
    // stdout's reader gone (SIGPIPE is ignored while a run trains): ended as that signal
    // would have ended it, after everything was recorded.
    if (e.code() == std::errc::broken_pipe) return 128 + SIGPIPE;
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: internal error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc& e) {
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: error: %s\n", dtrain::cli::failure_text(e).c_str());
    return 1;
  } catch (const dtrain::Interrupted& e) {
    // Ctrl-C or SIGTERM where no run was under way to record it (while the data were read or
    // checked): the exit code says which signal.
    dtrain::clear_progress();
    if (dtrain::mpi::rank() == 0)
      std::fprintf(stderr, "dtrain: stopped (%s)\n", dtrain::cli::one_line(e.what()).c_str());
    return dtrain::stop_exit_code();
  } catch (const std::exception& e) {
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: internal error: %s\n", dtrain::cli::one_line(e.what()).c_str());
    return 1;
  }
}

// Started by mpirun or srun, only `run` (one replica per process), `bench-comm` (the launched
// processes' all-reduce) and `devices` (each node's) do what a launch means; the others would
// each run once per process, writing the same files at once. 2 for those, 0 otherwise.
int refuse_under_launcher(const std::string& name) {
  if (!dtrain::mpi::initialized() || name == "run" || name == "bench-comm" || name == "devices")
    return 0;
  if (dtrain::mpi::rank() == 0)
    std::fprintf(stderr,
                 "dtrain: error: %s runs once, not one per process: start it without mpirun or "
                 "srun (only run, bench-comm and devices are launched)\n",
                 name.c_str());
  return 2;
}
}  // namespace

namespace {

// `dtrain explain --time RUN RUN` is `dtrain explain-time RUN RUN`: the words of the question.
std::vector<char*> explain_time_alias(int argc, char** argv) {
  static char explain_time[] = "explain-time";
  std::vector<char*> args(argv, argv + argc);
  if (args.size() < 2 || std::strcmp(args[1], "explain") != 0) return args;
  const auto time = std::find_if(args.begin() + 2, args.end(),
                                 [](const char* a) { return std::strcmp(a, "--time") == 0; });
  if (time == args.end()) return args;
  args.erase(time);
  args[1] = explain_time;
  return args;
}

}  // namespace

int run_main(int argc, char** argv) {
  CLI::App app{
      "dtrain: run data-parallel training experiments from YAML and compare 1 replica against N.\n"
      "Examples:\n"
      "  dtrain run configs/quickstart.yaml\n"
      "  dtrain run configs/quickstart.yaml gpus=1,2,4 optimizer.lr_scaling=sqrt\n"
      "  dtrain validate configs/pitfall-sum-reduction.yaml\n"
      "  dtrain doctor configs/quickstart.yaml gpus=8\n"
      "  dtrain explain configs/quickstart.yaml gpus=8 --seeds 3\n"
      "  dtrain report results/pitfalls --plots",
      "dtrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("dtrain ") + dtrain::kVersion + " (" + dtrain::kGitSha + ")");
  AllOptions options;
  const std::vector<Command> commands = add_commands(app, options);
  std::vector<char*> args = explain_time_alias(argc, argv);
  if (const auto code = parse_on_every_rank(app, static_cast<int>(args.size()), args.data()))
    return *code;
  for (const auto& cmd : commands) {
    if (!*cmd.cli) continue;
    if (const int code = refuse_under_launcher(cmd.cli->get_name())) return code;
    // `run` (and explain, which runs it) stops at a step boundary and records what it has;
    // export-images removes the tree it was writing. The other commands write nothing
    // half-done, so Ctrl-C and SIGTERM end them at once.
    if (cmd.stops_at_step) {
      std::signal(SIGINT, on_interrupt);
      std::signal(SIGTERM, on_interrupt);
      std::signal(SIGHUP, on_interrupt);  // a closed terminal or a dropped ssh session
      // Output to a pipe whose reader left (`dtrain run ... | head`) fails; it does not end the
      // training (the records are the run's output), and the table at the end says it below.
      std::signal(SIGPIPE, SIG_IGN);
    }
    return run_command(cmd);
  }
  return 0;
}
