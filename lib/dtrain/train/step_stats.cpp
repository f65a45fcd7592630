#include "dtrain/train/step_stats.hpp"

#include <algorithm>

namespace dtrain {

StepStats::StepStats(Device& dev, int64_t steps) : device_(&dev), steps_(steps) {
  graph_.resize(dev, kDev);
  dev_.resize(dev, static_cast<size_t>(std::max<int64_t>(1, steps * kDev)));
}

void StepStats::begin_epoch() {
  host_.assign(static_cast<size_t>(steps_ * kHost), 0.0);
  device_->zero(dev_.data(), dev_.size() * sizeof(double));
}

void StepStats::clear_graph_row() {
  device_->zero(graph_.data(), kDev * sizeof(double));
}

void StepStats::keep_graph_row(int64_t s) {
  device_->copy(dev_.data() + s * kDev, graph_.data(), kDev * sizeof(double));
}

void StepStats::pull(int64_t steps) {
  std::vector<double> host(static_cast<size_t>(steps) * kDev);
  device_->download(host.data(), dev_.data(), host.size() * sizeof(double));
  for (size_t s = 0; s < static_cast<size_t>(steps); ++s)
    for (size_t k : {kLoss, kCorrect, kLocalNorm, kReducedNorm})
      host_[s * kHost + k] = host[s * kDev + k];
}

void StepStats::finish_epoch(Communicator& comm) {
  pull(steps_);
  comm.allreduce(host_.data(), host_.size(), ReduceOp::sum);
}

std::vector<double> StepStats::reduced_first(Communicator& comm, int64_t steps) {
  pull(steps);
  std::vector<double> part(host_.begin(),
                           host_.begin() + static_cast<std::ptrdiff_t>(steps * kHost));
  comm.allreduce(part.data(), part.size(), ReduceOp::sum);
  return part;
}

void StepStats::restore_first(const std::vector<double>& reduced) {
  const size_t steps = reduced.size() / kHost;
  std::vector<double> dev(steps * kDev);
  for (size_t s = 0; s < steps; ++s) {
    for (size_t k : {kLoss, kCorrect, kLocalNorm, kReducedNorm})
      dev[s * kDev + k] = reduced[s * kHost + k];
    host_[s * kHost + kRows] = reduced[s * kHost + kRows];
  }
  device_->upload(dev_.data(), dev.data(), dev.size() * sizeof(double));
}

}  // namespace dtrain
