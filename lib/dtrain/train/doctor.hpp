#pragma once
// dtrain doctor: the known reasons an N-replica run trains worse than the 1-replica run, read
// from a config (and its data) before any training, and one that makes any run slower than it
// need be (more threads than cores). Each finding is one line: what is wrong, why it matters,
// and the fix. docs/doctor-explain.md ("dtrain doctor: the pitfalls it names before training")
// gives each rule's source or the dtrain measurement behind it.
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"

namespace dtrain {

struct Finding {
  std::string rule;     // a stable name, e.g. "sum-reduction"
  std::string message;  // "<what and why>; fix: <what to change>"
};

// What `dtrain doctor` measures on this machine for dataset: folder, per replica: the images
// per second its input threads decode and augment (data.workers of them, alone), and the time
// of a training step (micro-batch x accumulation samples per replica), timed on in-memory data
// of the same shape with every other setting of the run. On GPUs a pipeline slower than the
// step makes it wait; on the CPU both share the cores, and the rule says what that costs.
struct InputProbe {
  int workers = 0;
  double decode_per_s = 0;
  double step_s = 0;  // all the replicas of the process, on `step_threads` CPU threads or GPUs
  int64_t samples_per_step = 0;
  bool on_gpu = false;   // the step ran on GPUs (decoding overlaps it), else on the CPU
  int step_threads = 0;  // CPU: the threads the step ran on, all replicas together
  int cores = 0;         // of this machine
};
// Decodes a few batches and trains two short epochs (three steps each; the second is timed).
InputProbe probe_input(const Config& cfg, const DataSplit& data);

// Every rule that fires for `cfg`, each saying what holds for the configured optimizer (sgd,
// with or without momentum, against adam and adamw, whose steps are invariant to the
// gradient's scale but for eps and adam's weight decay). `data` (may be null) adds the rules
// that need the data: samples dropped per epoch, label-ordered training data, sparse labels.
// `probe` (may be null) adds the rule that needs measurements: input-bound.
std::vector<Finding> diagnose(const Config& cfg, const DataSplit* data,
                              const InputProbe* probe = nullptr);

// "doctor: [rule] message", the line `dtrain doctor` prints and `dtrain run` logs.
std::string to_line(const Finding& f);

// The rule names, in the order diagnose checks them.
const std::vector<std::string>& doctor_rules();

}  // namespace dtrain
