#include "dtrain/train/trace_window.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "dtrain/train/rank_gather.hpp"

namespace dtrain {

std::chrono::steady_clock::time_point common_clock_origin(Communicator& comm) {
  using Steady = std::chrono::steady_clock;
  double meet = 0;
  comm.allreduce(&meet, 1, ReduceOp::sum);
  const auto left = Steady::now();
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const double host = static_cast<double>(std::hash<std::string>{}(name)&0xffffffffu);
  std::vector<double> v = {host, static_cast<double>(left.time_since_epoch().count())};
  if (comm.rank() != 0) v = {0, 0};
  comm.allreduce(v.data(), v.size(), ReduceOp::sum);
  if (v[0] == host) return Steady::time_point(Steady::duration(static_cast<Steady::rep>(v[1])));
  return left;
}

void TraceWindow::start(int64_t global_step) {
  started_at_ = global_step;
  written_ = global_step >= cfg_.from_step + cfg_.steps - 1;
}

void TraceWindow::after_epoch(Communicator& comm, StepTrace& trace, int64_t global_step,
                              TrainObserver* observer) {
  if (!cfg_.enabled() || global_step < cfg_.from_step || written_) return;
  written_ = global_step >= cfg_.from_step + cfg_.steps - 1;
  write(comm, trace, observer, global_step);
}

void TraceWindow::write(Communicator& comm, StepTrace& trace, TrainObserver* observer,
                        int64_t global_step) {
  const auto replicas = static_cast<size_t>(comm.size());
  const std::vector<double> mine = trace.take();
  // Ranks may hold different counts: pad to the largest with empty (NaN) spans.
  std::vector<double> counts(replicas, 0.0);
  counts[static_cast<size_t>(comm.rank())] = static_cast<double>(mine.size());
  comm.allreduce(counts.data(), counts.size(), ReduceOp::sum);
  const auto most = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  if (most == 0) return;  // nothing new: the file stays as it is
  std::vector<double> padded(most, std::nan(""));
  std::copy(mine.begin(), mine.end(), padded.begin());
  const std::vector<double> all = gather(comm, padded);
  if (comm.rank() != 0) return;
  ranks_.resize(replicas);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const auto n = static_cast<size_t>(counts[r]);
    const std::vector<TraceSpan> spans = unpack_spans(all.data() + r * most, n);
    ranks_[r].insert(ranks_[r].end(), spans.begin(), spans.end());
  }
  // A run resumed inside the window holds the steps since; the stopped attempt's trace.json
  // (moved aside to .attempts/) holds those before.
  const int64_t first = std::max(cfg_.from_step, started_at_ + 1);
  const std::string earlier =
      first > cfg_.from_step
          ? fmt::format(
                " (resumed at step {}: steps {} to {} are in the stopped attempt's "
                "trace.json, under .attempts/)",
                first, cfg_.from_step, first - 1)
          : "";
  if (observer)
    observer->on_trace(trace_json(
        ranks_, fmt::format("dtrain {} replicas, steps {} to {}{}", replicas, first,
                            std::min(global_step, cfg_.from_step + cfg_.steps - 1), earlier)));
}

}  // namespace dtrain
