#pragma once
// The batch-size law measured from run folders: for each global batch, the optimizer steps its
// best learning rate took to the target (the mean over the seeds that reached it), the law's
// fit S = S_min (1 + B_noise / B) over those batches (stats.hpp), and beside it the gradient
// noise scale B_simple the same runs measured (McCandlish et al. 2018 find the two within an
// order of magnitude). Shallue et al. (2019) tune the learning rate per batch and keep the
// best, as here.
//
// Steps to target are summary.json's steps_to_target, known to within the steps between two
// scorings of the test set (train.eval_steps, else an epoch's); for run folders written before
// it was there, epochs to target x steps per epoch.
#include <optional>
#include <string>
#include <vector>

#include "dtrain/results/report.hpp"
#include "dtrain/results/stats.hpp"

namespace dtrain {

struct BatchLawRow {
  long long global_batch = 0;
  double lr = 0;              // the peak LR of these runs (in BatchLaw::rows, the one kept)
  int runs = 0, reached = 0;  // of that LR's runs: how many, how many reached the target
  int diverged = 0;           // of that LR's runs, how many ended diverged
  double steps = 0;           // mean steps to target over those that reached it
  double samples = 0;         // steps x global batch
  double resolution = 0;      // the steps are known to within this many (the coarsest run's)
  int lrs_tried = 0;          // LRs run at this batch
  bool kept = false;          // in BatchLaw::tried: this is the LR kept at its batch
};

struct BatchLaw {
  std::vector<BatchLawRow> rows;          // by batch, ascending
  std::vector<long long> never_reached;   // batches where no run reached the target
  std::vector<BatchLawRow> tried;         // every LR at every batch, by batch then LR
  BatchLawFit fit;
  std::optional<double> b_simple;         // the median over the runs that measured it
  double target_accuracy = 0, target_loss = 0;
};

// The runs of the learning rate kept at one global batch: the LR whose runs all reached the
// target in the fewest mean steps (else the one that reached it most often).
struct KeptRuns {
  BatchLawRow row;
  std::vector<const RunRecord*> runs;  // pointing into kept_runs()'s argument
};
struct KeptLrs {
  std::vector<KeptRuns> batches;  // by batch, ascending (where no run reached it too)
  std::vector<BatchLawRow> tried;  // every LR at every batch, by batch then LR
  double target_accuracy = 0, target_loss = 0;
};
// A run that ended by itself (done or diverged): one whose epochs to target count.
bool finished(const RunRecord& r);

// A run's optimizer steps to its target (see above); none where it did not reach it. Throws
// UserError naming the run for a value that is no count.
std::optional<double> steps_to_target(const RunRecord& r);
// The steps that is known to within: target_resolution_steps, else an epoch's.
double resolution_steps(const RunRecord& r);

// From finished runs (done or diverged) of one experiment; runs with another target than the
// first are refused (UserError naming both).
KeptLrs kept_runs(const std::vector<RunRecord>& runs);

// The law over kept_runs()'s choice at each batch.
BatchLaw batch_law(const std::vector<RunRecord>& runs);

// "test accuracy 0.85", "test loss 0.4" or both.
std::string target_text(double accuracy, double loss);

std::string to_markdown(const BatchLaw& law);
std::string to_csv(const BatchLaw& law);
std::string to_json(const BatchLaw& law);

// Every LR tried at every batch (law.tried): its runs, how many reached the target or diverged,
// the mean steps of those that reached it, and whether it is the one kept; whether a rule such
// as linear scaling holds at a batch is read here.
std::string tried_markdown(const BatchLaw& law);
std::string tried_csv(const BatchLaw& law);
std::string tried_json(const BatchLaw& law);

}  // namespace dtrain
