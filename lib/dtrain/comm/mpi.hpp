#pragma once
// Multi-process runs: one replica per process, started by mpirun or srun. dtrain finds its rank
// from the launcher's environment, talks MPI, and never starts processes itself.
#include <memory>
#include <string>
#include <vector>

#include "dtrain/comm/comm.hpp"

namespace dtrain::mpi {

struct Launch {
  bool active = false;   // started by a launcher with more than zero processes
  std::string launcher;  // "mpirun (Open MPI)", "srun (Slurm)", "PMI"
  int rank = 0, size = 1, local_rank = 0;
  int local_size = 1;  // processes of this job on this host
};

// Reads the launcher's environment (Open MPI, Slurm, PMI/PMIx); does not touch MPI. Open MPI
// comes first: under mpirun inside a Slurm allocation, the SLURM_* variables describe mpirun's
// own daemons, not the ranks.
Launch detect();

// The number of tasks Slurm placed on node `node` (0-based), from a task-count list such as
// SLURM_STEP_TASKS_PER_NODE ("2,1" or "2(x3),1"); 0 when the list is malformed or too short.
int slurm_tasks_on_node(const std::string& spec, int node);

// The host each rank runs on (MPI_Get_processor_name, gathered at init); "this host" without
// MPI.
std::string host_of(int rank);
// Whether a thread of this process is waiting in an all-reduce (for a watchdog: a process
// stopped by its launcher may be held there).
bool waiting_in_collective();
// The ranks (and hosts) whose data that all-reduce still waits for, "rank 2 (node1), ..."; safe
// from any thread.
std::string waiting_for();
// "0 node0/0, 1 node0/1, 2 node1/0": rank, host and local rank (the launcher's), for the log.
std::string placement();

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
// gives up after `timeout_s` without progress; both throw Aborted naming the rank, and for a
// timeout the ranks (and hosts) whose data never came. The all-reduce is point-to-point
// underneath (each rank owns a chunk: reduce-scatter, then all-gather), so that a rank knows
// exactly which peers it is still waiting for.
// The reduction adds ranks in ascending order, exactly like the in-process communicator, so
// multi-process and in-process runs give bit-identical results.
std::unique_ptr<Communicator> world(double timeout_s);

// The collectives below wait at most this long for the other ranks (train.collective_timeout_s;
// its default until a command sets it), then throw Aborted naming the wait and `key`, the
// setting to change; `before` ends the wait's name (" before training"). MpiComm's timeout
// messages name `key` too.
void set_planning_timeout(double seconds, const std::string& key = "train.collective_timeout_s",
                          const std::string& before = " before training");

// Rank `root` (0 unless given) sends `text` to all ranks (for decisions only rank 0 can take,
// e.g. about files).
void broadcast(std::string& text, int root = 0);

// Collective: each rank gives why it cannot go on ("" if it can); every rank gets
// the lowest such rank's reason ("rank R (host): reason" when R is not 0), or "" when no rank
// has one. For steps before training, where a rank failing alone would leave others waiting.
std::string first_refusal(const std::string& mine);
// MPI_Finalize for a process that ends with `exit_code` (non-zero): when every rank ends alike
// it returns as finalize() does; when the others go on (this rank failed alone), it ends the
// job after kFinalizeGraceS rather than wait for them.
inline constexpr double kFinalizeGraceS = 10.0;
void finalize_after_failure(int exit_code);
// Ends the whole job after a failure, once rank 0 has had the chance to record it: rank 0
// acknowledges to the others, which wait for that (at most `grace_s`: rank 0 records before
// it acknowledges, so this bounds only a rank 0 that is gone or cut off) before MPI_Abort.
// A process whose MPI_Abort cannot reach its launcher (a host cut off) exits by itself
// kAbortGraceS later, so every rank is gone within the collective timeout + grace_s + that.
inline constexpr double kAbortGraceS = 2.0;
[[noreturn]] void end_job_after_failure(int exit_code, double grace_s = 3.0);

}  // namespace dtrain::mpi
