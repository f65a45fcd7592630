#include "dtrain/results/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain {

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

RunStats summarize(const std::vector<EpochMetrics>& epochs, const Targets& target) {
  RunStats s;
  if (epochs.empty()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.final_test_acc = s.best_test_acc = s.final_train_loss = s.final_test_loss = nan;
    s.median_epoch_time_s = s.median_samples_per_s = nan;
    s.median_busbw_gbps = s.median_exposed_share = s.median_input_share = nan;
    s.max_other_cores = nan;
    return s;
  }
  std::vector<double> times, rates, busbw, exposed, input;
  double elapsed = 0;
  s.max_other_cores = std::numeric_limits<double>::quiet_NaN();
  for (const auto& e : epochs) {
    if (std::isfinite(e.other_cores))
      s.max_other_cores = std::isnan(s.max_other_cores)
                              ? e.other_cores
                              : std::max(s.max_other_cores, e.other_cores);
    times.push_back(e.epoch_time_s);
    rates.push_back(e.samples_per_s);
    if (std::isfinite(e.busbw_gbps)) busbw.push_back(e.busbw_gbps);
    if (e.epoch_time_s > 0) exposed.push_back(e.exchange_exposed_s / e.epoch_time_s);
    if (e.epoch_time_s > 0 && std::isfinite(e.input_images_per_s))
      input.push_back(e.data_s / e.epoch_time_s);
    elapsed += e.epoch_time_s;
    s.best_test_acc = std::max(s.best_test_acc, e.test_acc);
    if (!s.time_to_target_s && target.reached(e)) {
      s.time_to_target_s = elapsed;
      s.epochs_to_target = e.epoch;
    }
  }
  s.total_train_time_s = elapsed;
  s.final_test_acc = epochs.back().test_acc;
  s.final_train_loss = epochs.back().train_loss;
  s.final_test_loss = epochs.back().test_loss;
  s.median_epoch_time_s = median(times);
  s.median_samples_per_s = median(rates);
  s.median_busbw_gbps = median(busbw);
  s.median_exposed_share = median(exposed);
  s.median_input_share = median(input);
  return s;
}

}  // namespace dtrain
