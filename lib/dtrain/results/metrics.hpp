#pragma once
// Run-level numbers derived from per-epoch metrics, computed in one place.
#include <optional>
#include <vector>

#include "dtrain/train/run_types.hpp"

namespace dtrain {

struct RunStats {
  double final_test_acc = 0, best_test_acc = 0, final_train_loss = 0, final_test_loss = 0;
  double median_epoch_time_s = 0, median_samples_per_s = 0, total_train_time_s = 0;
  // Training time (evaluation excluded) up to the end of the first epoch that reaches the
  // targets; empty if never reached or no target is set.
  std::optional<double> time_to_target_s;
  std::optional<int> epochs_to_target;
  // Medians over epochs: the exchange's achieved bus bandwidth (NaN with one replica) and the
  // share of the epoch that exchange not hidden by compute took.
  double median_busbw_gbps = 0, median_exposed_share = 0;
  // dataset: folder: the median share of the epoch that steps waited for input (data_s over
  // epoch_time_s); NaN for data held in memory, whose gather is not input waiting.
  double median_input_share = 0;
  // The most cores other work kept busy in an epoch (EpochMetrics::other_cores); NaN where no
  // epoch knows.
  double max_other_cores = 0;
};

RunStats summarize(const std::vector<EpochMetrics>& epochs, const Targets& target);
double median(std::vector<double> v);

}  // namespace dtrain
