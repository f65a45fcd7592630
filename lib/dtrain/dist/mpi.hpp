#pragma once
// Multi-process runs: one replica per process, started by mpirun or srun. dtrain finds its rank
// from the launcher's environment, talks MPI, and never starts processes itself.
#include <memory>
#include <string>
#include <vector>

#include "dtrain/dist/comm.hpp"

namespace dtrain::mpi {

struct Launch {
  bool active = false;   // started by a launcher with more than zero processes
  std::string launcher;  // "mpirun (Open MPI)", "srun (Slurm)", "PMI"
  int rank = 0, size = 1, local_rank = 0;
};

// Reads the launcher's environment (Open MPI, PMI/PMIx, Slurm); does not touch MPI.
Launch detect();

// True when this build has MPI.
bool available();

// MPI_Init_thread / MPI_Finalize. init() throws SystemError when MPI is not built in.
void init(int* argc, char*** argv);
void finalize();
bool initialized();
int rank();
int size();

// The world communicator. Collectives are non-blocking underneath and polled, so a rank
// notices within milliseconds when another rank reports a failure (Communicator::abort), and
// gives up after `timeout_s` without progress; both throw Aborted naming the rank or the wait.
// The reduction adds ranks in ascending order, exactly like the in-process communicator, so
// multi-process and in-process runs give bit-identical results.
std::unique_ptr<Communicator> world(double timeout_s);

// Rank 0 sends `text` to all ranks (for decisions only rank 0 can take, e.g. about files).
void broadcast(std::string& text);

// Ends the whole job after a failure, once rank 0 has had the chance to record it: rank 0
// acknowledges to the others, which wait for that (at most `grace_s`) before MPI_Abort.
[[noreturn]] void end_job_after_failure(int exit_code, double grace_s = 10.0);

}  // namespace dtrain::mpi
