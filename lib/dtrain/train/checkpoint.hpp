#pragma once
// A run's state at a step boundary, enough to continue it as if it had never stopped: the
// weights, the optimizer's state and step count, BatchNorm's running statistics, every
// replica's random stream, the position in the epoch (the sampler's order is a function of the
// seed and the epoch), the noise-scale averages, and the metrics of the finished epochs. A
// resumed run gives the same bits as an uninterrupted one (timings aside).
//
// The file (checkpoint.bin in the run folder) is binary: a magic line, the fields in order
// (lengths first), then a CRC-32 of everything before it. Decoding checks every length against
// what is left of the file before it allocates, so a truncated or hostile file is an error
// naming the file, never a crash or a huge allocation.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/train/run_types.hpp"

namespace dtrain {

struct Checkpoint {
  std::string config_yaml;  // the resolved config it belongs to (to_yaml)
  int replicas = 0;
  int epoch = 0;            // 0-based epoch to continue
  int64_t step = 0;         // its next step (0: the epoch starts)
  int64_t global_step = 0;  // optimizer steps taken in the run
  std::vector<float> params, opt_m, opt_v, bn_state;
  std::vector<uint64_t> rng;            // 4 words per replica, in rank order
  std::array<double, 4> noise{};        // NoiseScale::save()
  // The epoch in progress: per finished step [loss, correct, local norm, reduced norm, rows],
  // summed over the replicas, and rank 0's phase times so far.
  std::vector<double> partial_stats;
  double partial_lr_first = 0;
  std::array<double, 6> partial_times{};  // data, compute, exchange, exposed, optimizer, total
  std::vector<EpochMetrics> epochs;     // finished epochs
  std::vector<double> step_losses;      // of every finished step
  int64_t launches_per_step = 0;
  std::vector<EvalPoint> evals;         // train.eval_steps: the test set's scorings so far
  uint64_t data_fingerprint = 0;        // DataSplit::fingerprint (0: unknown, an older file)
};

std::string encode_checkpoint(const Checkpoint& c);
// Throws UserError naming `what` (the file) if the bytes are not a whole, intact checkpoint,
// or if a value is out of range whatever the run (check_checkpoint without a run).
Checkpoint decode_checkpoint(const std::string& bytes, const std::string& what);

// What a run can hold, which bounds its checkpoint: file size, counts, positions.
struct CheckpointRun {
  int replicas = 0, epochs = 0;
  int64_t steps = 0;         // optimizer steps per epoch
  int64_t global_batch = 0;  // rows of one step, at most
  int64_t train_size = 0;    // samples of one epoch, at most
  int64_t max_params = 0;    // the model's parameters (at most, where the classes are a bound)
  bool second_moment = false;  // the optimizer keeps one (Adam, AdamW); SGD keeps momentum alone
  uint64_t max_bytes = 0;    // the file: every field at its largest, the config text, the CRC
};
// From the run's config and its data's shape (peek_data_shape: no data is loaded). Throws
// UserError where the model does not fit the data.
CheckpointRun checkpoint_run(const Config& cfg, const DataShape& data);
// Range checks of every decoded value, each refusal (UserError) naming `what` and the field:
// counts whole and within the run (`run`; without one, what a double holds exactly), sums
// finite, times finite and >= 0, accuracies in [0, 1], epoch and step within the run.
void check_checkpoint(const Checkpoint& c, const std::string& what, const CheckpointRun* run);
// Throws UserError where `c` was written by a run on other data than `fingerprint`'s
// (DataSplit::fingerprint; 0 on either side: unknown, not checked). restore_checkpoint checks
// it; a resume checks it first, before it touches the run's folder.
void check_data_unchanged(const Checkpoint& c, uint64_t fingerprint);

// The checkpoint file of a run folder.
std::string checkpoint_path(const std::string& run_dir);
// Writes it atomically and durably (a crash leaves the old file or the new one, never a mix).
void save_checkpoint(const std::string& run_dir, const Checkpoint& c);
// The folder's checkpoint, or nothing if it has none. Throws UserError if it is damaged, if
// it is larger than a checkpoint of `cfg` can be (refused before it is read, naming its size
// and the bound), or if a value is out of range for the run `cfg` describes. Its data's shape
// is `data`'s where the data is loaded, else peeked: for dataset: folder with
// data.on_bad_file: skip, a peek counts files that loading may skip, and the steps per epoch,
// which the checkpoint's position is checked against, can be fewer.
std::optional<Checkpoint> load_checkpoint(const std::string& run_dir, const Config& cfg,
                                          const DataShape* data = nullptr);
// The same, with the run's config read from the folder's config.resolved.yaml.
std::optional<Checkpoint> load_checkpoint(const std::string& run_dir);

}  // namespace dtrain
