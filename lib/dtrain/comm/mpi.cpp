#include "dtrain/comm/mpi.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/base/stop.hpp"

#ifdef DTRAIN_HAVE_MPI
#include <mpi.h>
#endif

namespace dtrain::mpi {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    return fallback;
  }
}
}  // namespace

int slurm_tasks_on_node(const std::string& spec, int node) {
  // Entries "C" or "C(xR)", comma-separated: C tasks on each of R nodes.
  size_t at = 0;
  int seen = 0;
  while (at < spec.size()) {
    const size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    int count = 0, repeat = 1;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d(x%d%c", &count, &repeat, &tail) == 3 && tail == ')') {
    } else if (std::sscanf(item.c_str(), "%d%c", &count, &tail) == 1) {
      repeat = 1;
    } else {
      return 0;
    }
    if (count < 0 || repeat < 1) return 0;
    if (node < seen + repeat) return node >= seen ? count : 0;
    seen += repeat;
    at = end + 1;
  }
  return 0;
}

Launch detect() {
  Launch l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun (Open MPI)";
    l.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    l.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_STEP_ID") &&
             (!std::getenv("PMI_SIZE") ||
              env_int("PMI_RANK", -1) == env_int("SLURM_PROCID", -2))) {
    // Inside an srun job step (sbatch alone sets SLURM_PROCID too, but no step). srun sets no
    // PMI_SIZE under PMIx, so this comes before the PMI branch; but a launcher of its own
    // inside an allocation (MPICH's or Intel MPI's mpiexec) starts its ranks from srun-started
    // proxies, whose SLURM_* describe the proxy: there PMI_RANK differs from SLURM_PROCID.
    l.launcher = "srun (Slurm)";
    l.size = env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", env_int("SLURM_NPROCS", 1)));
    l.rank = env_int("SLURM_PROCID", 0);
    l.local_rank = env_int("SLURM_LOCALID", 0);
    const char* per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!per_node) per_node = std::getenv("SLURM_TASKS_PER_NODE");
    l.local_size = per_node ? slurm_tasks_on_node(per_node, env_int("SLURM_NODEID", 0)) : 0;
    if (l.local_size < 1) l.local_size = 1;
  } else if (std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
    l.launcher = "PMI";
    l.size = env_int("PMI_SIZE", 1);
    l.rank = env_int("PMI_RANK", env_int("PMIX_RANK", 0));
    l.local_rank = env_int("MPI_LOCALRANKID", 0);
    l.local_size = std::max(1, env_int("MPI_LOCALNRANKS", 1));
  } else {
    return l;
  }
  l.active = true;
  return l;
}

#ifdef DTRAIN_HAVE_MPI

#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    const int mpi_rc_ = (call);                                                            \
    if (mpi_rc_ != MPI_SUCCESS) {                                                          \
      char mpi_msg_[MPI_MAX_ERROR_STRING];                                                 \
      int mpi_len_ = 0;                                                                    \
      MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                      \
      throw ::dtrain::SystemError(fmt::format("{} failed: {}", #call, mpi_msg_), __FILE__, \
                                  __LINE__, ::dtrain::mpi::rank());                        \
    }                                                                                      \
  } while (0)

namespace {

constexpr int kTagAbort = 7301;
constexpr int kTagAck = 7302;
constexpr int kTagScatter = 7303;
constexpr int kTagGather = 7304;
bool g_initialized = false;
int g_rank = 0, g_size = 1;
std::vector<std::string> g_hosts;  // per rank
std::vector<int> g_local_ranks;    // per rank, as the launcher numbered them on their host
std::atomic<bool> g_waiting{false};  // inside MpiComm::wait_all
// A wait before training gave up on a silent rank: the job ends at once (it will not come).
std::atomic<bool> g_planning_gave_up{false};
// What sets the waits' timeout, for the messages, and what the waits before it are before.
std::string g_timeout_key = "train.collective_timeout_s";
std::string g_planning_before = " before training";
// Per rank: whether the all-reduce in progress still waits for its data. Atomics, so that a
// watchdog thread can name the missing ranks while the main thread is held inside MPI.
std::unique_ptr<std::atomic<char>[]> g_pending;

std::string who(int r) {
  if (r >= 0 && static_cast<size_t>(r) < g_hosts.size())
    return fmt::format("rank {} ({})", r, g_hosts[static_cast<size_t>(r)]);
  return fmt::format("rank {}", r);
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

class MpiComm final : public Communicator {
 public:
  explicit MpiComm(double timeout_s) : timeout_s_(timeout_s) {}
  int rank() const override { return g_rank; }
  int size() const override { return g_size; }
  std::string kind() const override { return "mpi"; }

  void allreduce(float* data, size_t n, ReduceOp op) override { reduce(data, n, op); }
  void allreduce(double* data, size_t n, ReduceOp op) override { reduce(data, n, op); }

  void abort(const std::string& why) override {
    // Tell every other rank, without blocking on any of them (one may be dead).
    const std::string text = fmt::format("{} failed: {}", who(g_rank), why);
    std::vector<MPI_Request> reqs;
    for (int r = 0; r < g_size; ++r) {
      if (r == g_rank) continue;
      MPI_Request req;
      if (MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, r, kTagAbort,
                    MPI_COMM_WORLD, &req) == MPI_SUCCESS)
        reqs.push_back(req);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  // Owner-computes all-reduce with the in-process communicator's arithmetic: rank r receives
  // chunk r of every rank's buffer, adds them in rank order, and sends the reduced chunk back
  // to everyone. The traffic is that of reduce-scatter + all-gather; point-to-point messages
  // (not MPI_Ialltoallv) let a rank that waits too long name the peers it is waiting for.
  template <class T>
  void reduce(T* data, size_t n, ReduceOp op) {
    const int p = g_size;
    if (p == 1) return;
    const auto lo = [&](int r) { return n * static_cast<size_t>(r) / static_cast<size_t>(p); };
    // No chunk is larger than n/p rounded up: checked before anything is posted.
    const size_t largest = (n + static_cast<size_t>(p) - 1) / static_cast<size_t>(p);
    if (largest > static_cast<size_t>(std::numeric_limits<int>::max()))
      DTRAIN_THROW_SYSTEM(
          fmt::format("all-reduce chunks of {} elements are too large for MPI", largest));
    const auto count = [&](int r) { return static_cast<int>(lo(r + 1) - lo(r)); };
    const int mine = count(g_rank);
    const CancelOnUnwind cancel{*this};
    std::vector<T>& recv = scratch<T>();
    recv.resize(static_cast<size_t>(mine) * static_cast<size_t>(p));
    start_exchange();
    for (int q = 0; q < p; ++q) {
      if (q == g_rank) continue;
      post_recv(recv.data() + static_cast<size_t>(q) * static_cast<size_t>(mine), mine, q,
                kTagScatter);
      post_send(data + lo(q), count(q), q, kTagScatter);
    }
    std::copy(data + lo(g_rank), data + lo(g_rank) + mine,
              recv.data() + static_cast<size_t>(g_rank) * static_cast<size_t>(mine));
    wait_all("gradient all-reduce (reduce-scatter)");
    T* out = data + lo(g_rank);
    const T inv = T(1) / static_cast<T>(p);
    for (int i = 0; i < mine; ++i) {
      T acc = recv[static_cast<size_t>(i)];
      for (int q = 1; q < p; ++q)
        acc += recv[static_cast<size_t>(q) * static_cast<size_t>(mine) + static_cast<size_t>(i)];
      if (op == ReduceOp::mean) acc *= inv;
      out[i] = acc;
    }
    start_exchange();
    for (int q = 0; q < p; ++q) {
      if (q == g_rank) continue;
      post_recv(data + lo(q), count(q), q, kTagGather);
      post_send(out, mine, q, kTagGather);
    }
    wait_all("gradient all-reduce (all-gather)");
  }

  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::is_same_v<T, float>)
      return scratch_f_;
    else
      return scratch_d_;
  }

  void start_exchange() {
    reqs_.clear();
    peer_.clear();
    is_recv_.clear();
    for (int q = 0; q < g_size; ++q) g_pending[q].store(0, std::memory_order_relaxed);
  }
  template <class T>
  void post_recv(T* buf, int n, int from, int tag) {
    reqs_.emplace_back();
    MPI_CHECK(MPI_Irecv(buf, n, mpi_type<T>(), from, tag, MPI_COMM_WORLD, &reqs_.back()));
    peer_.push_back(from);
    is_recv_.push_back(1);
    g_pending[from].store(1, std::memory_order_relaxed);
  }
  template <class T>
  void post_send(const T* buf, int n, int to, int tag) {
    reqs_.emplace_back();
    MPI_CHECK(MPI_Isend(buf, n, mpi_type<T>(), to, tag, MPI_COMM_WORLD, &reqs_.back()));
    peer_.push_back(to);
    is_recv_.push_back(0);
  }

  // The peers whose data has not arrived (else: whose copy was not delivered), by rank.
  std::string pending_peers() const {
    if (const std::string from = waiting_for(); !from.empty()) return "nothing from " + from;
    std::string to;
    for (size_t i = 0; i < reqs_.size(); ++i)  // one send per peer, posted in rank order
      if (reqs_[i] != MPI_REQUEST_NULL && !is_recv_[i])
        to += (to.empty() ? "" : ", ") + who(peer_[i]);
    return to.empty() ? "all messages done" : "nothing delivered to " + to;
  }

  [[noreturn]] void give_up(const std::string& why) { throw Aborted(why); }

  // Whatever leaves reduce() by an exception (giving up, or an MPI error) first cancels and
  // frees the requests still posted: they point into buffers that the unwinding frees, and a
  // late message must not land there.
  struct CancelOnUnwind {
    MpiComm& comm;
    const int uncaught = std::uncaught_exceptions();
    ~CancelOnUnwind() {
      if (std::uncaught_exceptions() <= uncaught) return;
      for (auto& r : comm.reqs_) {
        if (r == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    }
  };

  // Marks the calling thread as waiting in a collective (waiting_in_collective()).
  struct Waiting {
    Waiting() { g_waiting = true; }
    ~Waiting() { g_waiting = false; }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
  };

  // Polls the posted requests, watching for a failure report from another rank, a stop
  // request (Ctrl-C, or SIGTERM from the launcher when a rank died) and the timeout.
  void wait_all(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    const Waiting waiting;
    int spins = 0;
    for (;;) {
      bool done = true;
      for (size_t i = 0; i < reqs_.size(); ++i) {
        if (reqs_[i] == MPI_REQUEST_NULL) continue;
        int one = 0;
        MPI_CHECK(MPI_Test(&reqs_[i], &one, MPI_STATUS_IGNORE));
        done = done && one;
        if (one && is_recv_[i]) g_pending[peer_[i]].store(0, std::memory_order_relaxed);
      }
      if (done) return;
      int flag = 0;
      MPI_Status st;
      MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTagAbort, MPI_COMM_WORLD, &flag, &st));
      if (flag) {
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string text(static_cast<size_t>(len), '\0');
        MPI_Recv(text.data(), len, MPI_CHAR, st.MPI_SOURCE, kTagAbort, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        give_up(text);
      }
      const auto now = std::chrono::steady_clock::now();
      // A stop request (Ctrl-C reaches every rank) lets the collective finish, so that all
      // ranks stop together at their next vote and save the run; one still pending kStopGraceS
      // after the stop (or after it began, if later) has a peer that is gone (the launcher is
      // ending the job).
      if (stop_requested()) {
        if (!stop_seen_) stop_seen_ = now;
        const auto since = std::max(start, *stop_seen_);
        if (std::chrono::duration<double>(now - since).count() > kStopGraceS)
          give_up(fmt::format("{}: stopped while waiting in the {}, {} (interrupted, or the "
                              "launcher is ending the job because another rank died)",
                              who(g_rank), what, pending_peers()));
      }
      const double waited = std::chrono::duration<double>(now - start).count();
      if (waited > timeout_s_)
        give_up(
            fmt::format("{}: {} for {:.0f} s in the {} (hung, gone, or cut off from "
                        "this rank; {})",
                        who(g_rank), pending_peers(), waited, what, g_timeout_key));
      // Spin briefly for latency, then yield the core: ranks may share few cores.
      if (++spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  static constexpr double kStopGraceS = 0.5;
  std::optional<std::chrono::steady_clock::time_point> stop_seen_;
  double timeout_s_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> peer_;
  std::vector<char> is_recv_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

}  // namespace

bool available() {
  return true;
}

void init(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  g_initialized = true;
  // Errors come back as codes (and become exceptions) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_size));
  // Every rank's host, for messages that name the one that stopped answering.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> all(static_cast<size_t>(MPI_MAX_PROCESSOR_NAME) * static_cast<size_t>(g_size));
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD));
  g_hosts.clear();
  for (int r = 0; r < g_size; ++r) {
    const char* h = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    g_hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  int local = detect().local_rank;
  g_pending = std::make_unique<std::atomic<char>[]>(static_cast<size_t>(g_size));
  for (int q = 0; q < g_size; ++q) g_pending[q] = 0;
  g_local_ranks.assign(static_cast<size_t>(g_size), 0);
  MPI_CHECK(MPI_Allgather(&local, 1, MPI_INT, g_local_ranks.data(), 1, MPI_INT, MPI_COMM_WORLD));
}

std::atomic<bool> g_finalized{false};  // MPI_Finalize returned: nothing may call MPI after

void finalize() {
  if (g_initialized) MPI_Finalize();
  g_initialized = false;
  g_finalized = true;
}

namespace {
// MPI_Abort asks the launcher to end every process; on a host that is cut off it may wait for
// an answer that never comes (PMIx under srun does), so this process ends itself.
[[noreturn]] void abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
    std::_Exit(exit_code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}
}  // namespace

void finalize_after_failure(int exit_code) {
  if (!g_initialized || g_size == 1) return finalize();
  // A silent rank before training: MPI_Finalize would wait for it too. Rank 0 has recorded
  // the failure; the others wait for its word (or a moment, where rank 0 is the silent one).
  if (g_planning_gave_up) end_job_after_failure(exit_code);
  // From a thread of its own, since MPI_Finalize holds the main one (Open MPI's MPI_Abort may
  // be called from any thread; the job is ending either way).
  // DTRAIN_FINALIZE_GRACE_S (0-3600) sets the grace: a test of the net, a slow file system.
  double grace = kFinalizeGraceS;
  if (const char* g = std::getenv("DTRAIN_FINALIZE_GRACE_S")) {
    char* end = nullptr;
    const double s = std::strtod(g, &end);
    if (end != g && *end == '\0' && s >= 0 && s <= 3600)
      grace = s;
    else  // not 0 s (the job ended at once) for a typo: the default, and why
      fmt::print(stderr, "dtrain: DTRAIN_FINALIZE_GRACE_S='{}' is not 0 to 3600 seconds; {} s\n",
                 printable(g, true), kFinalizeGraceS);
  }
  std::thread([exit_code, grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    if (!g_finalized) abort_job(exit_code);
  }).detach();
  finalize();
}

bool initialized() {
  return g_initialized;
}
int rank() {
  return g_rank;
}
int size() {
  return g_size;
}
bool waiting_in_collective() {
  return g_waiting;
}
std::string waiting_for() {
  std::string out;
  for (int q = 0; g_pending && q < g_size; ++q)
    if (g_pending[q].load(std::memory_order_relaxed)) out += (out.empty() ? "" : ", ") + who(q);
  return out;
}
std::string host_of(int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < g_hosts.size())
    return g_hosts[static_cast<size_t>(rank)];
  return "this host";
}
std::string placement() {
  std::string out;
  for (size_t r = 0; r < g_hosts.size() && r < g_local_ranks.size(); ++r) {
    if (r == 16) return out + ", ...";
    out += fmt::format("{}{} {}/{}", r ? ", " : "", r, g_hosts[r], g_local_ranks[r]);
  }
  return out;
}

std::unique_ptr<Communicator> world(double timeout_s) {
  return std::make_unique<MpiComm>(timeout_s);
}

namespace {
double g_planning_timeout_s = 300;  // train.collective_timeout_s's default

// Waits for one collective of the steps before and between runs, posted nonblocking: a rank
// that hangs there (stopped, or stuck on a file system) would otherwise hold the others in a
// blocking call for ever. Gives up after the planning timeout, naming it (Aborted); the
// failure path then ends the job.
void wait_planning(MPI_Request& req, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > g_planning_timeout_s) {
      g_planning_gave_up = true;
      throw Aborted(
          fmt::format("{}: waited {:.0f} s for the other ranks in the {}{} (one hung, gone, "
                      "or cut off; {})",
                      who(g_rank), waited, what, g_planning_before, g_timeout_key));
    }
    // Planning waits on other ranks' file work: yield the core after a short spin.
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
}  // namespace

void set_planning_timeout(double seconds, const std::string& key, const std::string& before) {
  g_timeout_key = key;
  g_planning_before = before;
  if (seconds > 0) g_planning_timeout_s = seconds;
}

void broadcast(std::string& text, int root) {
  // A 64-bit length, then chunks an int can count (a checkpoint may pass 2 GiB).
  uint64_t len = text.size();
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(&len, 1, MPI_UINT64_T, root, MPI_COMM_WORLD, &req));
  wait_planning(req, "broadcast of rank 0's decisions");
  text.resize(static_cast<size_t>(len));
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  for (uint64_t at = 0; at < len; at += kChunk) {
    const auto n = static_cast<int>(std::min(kChunk, len - at));
    MPI_CHECK(MPI_Ibcast(text.data() + at, n, MPI_CHAR, root, MPI_COMM_WORLD, &req));
    wait_planning(req, "broadcast of rank 0's decisions");
  }
}

std::string first_refusal(const std::string& mine) {
  const int candidate = mine.empty() ? g_size : g_rank;
  int first = g_size;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req));
  wait_planning(req, "check that every rank can go on");
  if (first == g_size) return "";
  std::string text = first == g_rank ? mine.substr(0, 4096) : "";  // one line's worth
  broadcast(text, first);
  return first == 0 ? text : fmt::format("{}: {}", who(first), text);
}

void end_job_after_failure(int exit_code, double grace_s) {
  if (g_rank == 0) {
    char ack = 1;
    std::vector<MPI_Request> reqs;
    for (int r = 1; r < g_size; ++r) {
      MPI_Request req;
      if (MPI_Isend(&ack, 1, MPI_CHAR, r, kTagAck, MPI_COMM_WORLD, &req) == MPI_SUCCESS)
        reqs.push_back(req);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } else {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    int flag = 0;
    while (!flag && std::chrono::steady_clock::now() < until) {
      MPI_Iprobe(0, kTagAck, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
      if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  abort_job(exit_code);
}

#else  // no MPI in this build

bool available() {
  return false;
}
void init(int*, char***) {
  throw UserError(
      "this dtrain was built without MPI but was started by a launcher (mpirun/srun); install "
      "libopenmpi-dev and rebuild");
}
void finalize() {}
void finalize_after_failure(int) {}
bool initialized() {
  return false;
}
int rank() {
  return 0;
}
int size() {
  return 1;
}
std::string host_of(int) {
  return "this host";
}
bool waiting_in_collective() {
  return false;
}
std::string waiting_for() {
  return "";
}
std::string placement() {
  return "";
}
std::unique_ptr<Communicator> world(double) {
  DTRAIN_THROW_SYSTEM("MPI is not built in");
}
void set_planning_timeout(double, const std::string&, const std::string&) {}
void broadcast(std::string&, int) {}
std::string first_refusal(const std::string& mine) {
  return mine;
}
void end_job_after_failure(int exit_code, double) {
  std::_Exit(exit_code);
}

#endif

}  // namespace dtrain::mpi
