#pragma once
// One replica's per-step sums over an epoch. Per step the device adds kDev values (loss sum,
// correct predictions, and for the noise scale the squared gradient norms before and after the
// exchange) and the host counts the step's rows; the host reads the device's values once, at
// the epoch's end (a checkpoint inside the epoch reads the finished steps' too), so that no step
// waits for the device. Summed over the ranks the host's kHost values per step are the epoch's
// losses, accuracy and noise-scale inputs.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/backend/device.hpp"
#include "dtrain/comm/comm.hpp"

namespace dtrain {

class StepStats {
 public:
  // The values of a step, at these offsets of its row: the first kDev on the device, all kHost
  // on the host.
  static constexpr size_t kLoss = 0, kCorrect = 1, kLocalNorm = 2, kReducedNorm = 3, kRows = 4;
  static constexpr size_t kDev = 4, kHost = 5;

  StepStats() = default;
  // Rows for `steps` steps on `dev` (and one for a graph step), which must outlive this.
  StepStats(Device& dev, int64_t steps);

  // A new epoch: every sum zero, on the device and on the host.
  void begin_epoch();
  // Where step s's device values go: its own row, or for a CUDA-graph step the one row the
  // graph was captured with (graph_row; keep_graph_row then copies it to step s's).
  double* device_row(int64_t s, bool in_graph) {
    return in_graph ? graph_.data() : dev_.data() + s * kDev;
  }
  // Zeroes the graph row (a graph step's sums start from zero; queued in the graph).
  void clear_graph_row();
  void keep_graph_row(int64_t s);
  // Counts `rows` more rows of step s (on the host: the device does not know them).
  void add_rows(int64_t s, double rows) { host_[static_cast<size_t>(s) * kHost + kRows] += rows; }

  // The epoch's end: the device's sums of every step to the host (the epoch's only wait for the
  // device), then summed over the ranks (collective).
  void finish_epoch(Communicator& comm);
  // Step s's kHost values (summed over the ranks once finish_epoch has run).
  const double* host_row(int64_t s) const { return host_.data() + static_cast<size_t>(s) * kHost; }

  // A checkpoint inside the epoch (collective): the first `steps` steps' values, summed over the
  // ranks as at the epoch's end, which pulls them again with the later steps.
  std::vector<double> reduced_first(Communicator& comm, int64_t steps);
  // A resumed epoch, on rank 0 (after begin_epoch): the first steps' values as reduced_first
  // gave them (kHost per step). The other ranks keep zeros, which the epoch's reduction adds to
  // the same bits.
  void restore_first(const std::vector<double>& reduced);

 private:
  // Copies the device's values of the first `steps` steps to the host rows.
  void pull(int64_t steps);

  Device* device_ = nullptr;
  int64_t steps_ = 0;
  Buffer<double> graph_;      // a graph step's sums, at the address it was captured with
  Buffer<double> dev_;        // kDev per step, on the device all epoch
  std::vector<double> host_;  // kHost per step
};

}  // namespace dtrain
