// dtrain: data-parallel scaling experiments from YAML files.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/base/stop.hpp"
#include "dtrain/base/version.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/train/trainer.hpp"

int run_main(int argc, char** argv);

namespace {

void on_interrupt(int signal) {
  dtrain::request_stop(signal);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
  std::signal(SIGTERM, SIG_DFL);
}
}  // namespace

int main(int argc, char** argv) {
  // Started by mpirun/srun: one replica per process over MPI.
  if (dtrain::mpi::detect().active) {
    try {
      dtrain::mpi::init(&argc, &argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtrain: error: %s\n", e.what());
      return 2;
    }
  }
  const int code = run_main(argc, argv);
  dtrain::mpi::finalize();
  return code;
}

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

  // One line per subcommand: its name, what it does, its options and their setup.
  const auto add = [&app](const char* name, const char* what, auto& opt, auto setup) {
    CLI::App* cmd = app.add_subcommand(name, what);
    setup(*cmd, opt);
    return cmd;
  };
  dtrain::cli::RunOptions run_opt;
  dtrain::cli::ValidateOptions validate_opt;
  dtrain::cli::DoctorOptions doctor_opt;
  dtrain::cli::ExplainOptions explain_opt;
  dtrain::cli::ReportOptions report_opt;
  dtrain::cli::DevicesOptions devices_opt;
  dtrain::cli::BenchCommOptions bench_comm_opt;
  dtrain::cli::ProjectOptions project_opt;
  auto* run_cmd = add("run",
                      "Train one run, or one per value of comma-list overrides, and print the "
                      "comparison table",
                      run_opt, dtrain::cli::setup_run);
  auto* validate_cmd = add("validate", "Check a config (and its data) without training",
                           validate_opt, dtrain::cli::setup_validate);
  auto* doctor_cmd =
      add("doctor", "Name the known reasons N replicas train worse than 1, before any training",
          doctor_opt, dtrain::cli::setup_doctor);
  auto* explain_cmd =
      add("explain", "Attribute the accuracy gap of N replicas against 1, one setting per run",
          explain_opt, dtrain::cli::setup_explain);
  auto* report_cmd = add("report", "Regenerate comparison tables (and figures) from run folders",
                         report_opt, dtrain::cli::setup_report);
  auto* devices_cmd =
      add("devices", "List the GPUs (and the CPU) dtrain can use, with driver and library versions",
          devices_opt, dtrain::cli::setup_devices);
  auto* bench_comm_cmd =
      add("bench-comm", "Time and check the all-reduce a run would use, over a range of sizes",
          bench_comm_opt, dtrain::cli::setup_bench_comm);
  auto* project_cmd =
      add("project", "Project a 1-replica run's step to N GPUs over a link (a model, not a run)",
          project_opt, dtrain::cli::setup_project);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other user mistake, naming the command and where its help is.
    std::string cmd;
    for (const auto* sub : app.get_subcommands()) cmd = sub->get_name();
    std::string what = e.what();
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
                 cmd.empty() ? "" : ": ", what.c_str(), cmd.c_str(), cmd.empty() ? "" : " ");
    return 2;
  }

  // Only `run` stops at a step boundary and records what it has; the other commands write
  // nothing half-done, so Ctrl-C and SIGTERM end them at once.
  if (*run_cmd || *explain_cmd) {
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
  }
  try {
    if (*run_cmd) return dtrain::cli::run_run(run_opt);
    if (*validate_cmd) return dtrain::cli::run_validate(validate_opt);
    if (*doctor_cmd) return dtrain::cli::run_doctor(doctor_opt);
    if (*explain_cmd) return dtrain::cli::run_explain(explain_opt);
    if (*report_cmd) return dtrain::cli::run_report(report_opt);
    if (*devices_cmd) return dtrain::cli::run_devices(devices_opt);
    if (*bench_comm_cmd) return dtrain::cli::run_bench_comm(bench_comm_opt);
    if (*project_cmd) return dtrain::cli::run_project(project_opt);
  } catch (const dtrain::UserError& e) {
    dtrain::clear_progress();
    // Every rank sees the same mistake; one line is enough.
    if (dtrain::mpi::rank() == 0) std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 2;
  } catch (const dtrain::StorageError& e) {
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());  // a full disk: named, not a bug
    return 1;
  } catch (const std::exception& e) {
    dtrain::clear_progress();
    std::fprintf(stderr, "dtrain: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
