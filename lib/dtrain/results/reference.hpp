#pragma once
// Reference convergence points, after MLPerf Training's procedure (the rcp_checker of
// mlcommons/logging): at each global batch of a study, the runs of the learning rate
// batch_law() keeps give their epochs to the target; the olympic mean of those (the fastest and
// the slowest left out) and their standard deviation are the reference at that batch, and
// between two batches of the study both are interpolated linearly in the batch. Any run can
// then be judged against the reference at its own global batch: did it need more epochs to the
// target than runs of the study's recipe do?
//
// MLPerf leaves one run out at each end of every reference (of 10 to 20); here that is done
// where a batch has at least 5 runs, so that at least 3 remain for a spread. Epochs to target
// are steps to target over steps per epoch (batch_law.hpp's steps_to_target), known only to
// within the steps between two scorings of the test set (an epoch's, unless train.eval_steps
// is set): the verdict widens its interval by that much.
#include <optional>
#include <string>
#include <vector>

#include "dtrain/results/report.hpp"

namespace dtrain {

struct ReferencePoint {
  long long global_batch = 0;
  double peak_lr = 0;        // the learning rate kept at this batch (0 where interpolated)
  int runs = 0, kept = 0;    // that LR's runs, and those the mean and sd are over
  double mean_epochs = 0;    // the olympic mean of the epochs to target
  double sd_epochs = 0;      // their sample standard deviation
  bool interpolated = false;
};

struct Reference {
  std::vector<ReferencePoint> points;  // by batch, ascending
  // Batches of the study left out of the reference, each with why ("2 of 3 runs did not reach
  // the target").
  std::vector<std::string> left_out;
  std::vector<long long> left_out_batches;  // their global batches
  double target_accuracy = 0, target_loss = 0;
};

// From finished runs of one experiment (a batch-size study; runs of different targets are
// refused, as batch_law() does). A batch is left out where a kept run did not reach the target.
Reference reference_points(const std::vector<RunRecord>& runs);

// The reference at `global_batch`: the study's own point, or one interpolated between its two
// neighbours; none outside the study's batches, at a batch it left out, or across one (the
// study could not say what happens there).
std::optional<ReferencePoint> reference_at(const Reference& ref, long long global_batch);

enum class Convergence {
  within,        // inside the reference's 95% prediction interval for one run
  slower,        // more epochs to the target than that interval allows
  faster,        // fewer
  not_reached,   // the run never reached the target
  other_target,  // the run measured to another target than the study's
  no_reference,  // its global batch lies outside the study's
};
const char* to_string(Convergence c);

struct ReferenceCheck {
  std::string run_id, dir;
  int gpus = 0;
  long long global_batch = 0;
  std::optional<double> epochs;      // to the target
  std::optional<ReferencePoint> at;  // the reference at its batch
  // The interval one run of the reference's recipe falls in 95 times in 100: mean -+ t(0.975,
  // kept - 1) sd sqrt(1 + 1/kept), widened at each end by the run's resolution (in epochs: the
  // steps between two scorings of its test set over its steps per epoch), and never below 0.
  double resolution = 0;
  double low = 0, high = 0;
  Convergence verdict = Convergence::no_reference;
};

// Each finished run judged against the reference at its global batch.
std::vector<ReferenceCheck> check_against(const Reference& ref,
                                          const std::vector<RunRecord>& runs);

std::string to_markdown(const Reference& ref);
std::string to_csv(const Reference& ref);
std::string to_json(const Reference& ref);
std::string checks_markdown(const Reference& ref, const std::vector<ReferenceCheck>& checks);
std::string checks_csv(const std::vector<ReferenceCheck>& checks);
std::string checks_json(const std::vector<ReferenceCheck>& checks);

}  // namespace dtrain
