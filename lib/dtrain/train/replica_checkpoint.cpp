#include "dtrain/train/replica_checkpoint.hpp"

#include <fmt/format.h>

#include <bit>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/train/rank_gather.hpp"

namespace dtrain {

namespace {

// Every rank's random stream (4 words) and BatchNorm statistics (a word per float's bits), in
// rank order on rank 0 (collective); `per_rank` gets the words of one rank.
std::vector<uint64_t> gather_rank_state(const ReplicaState& r, size_t& per_rank) {
  std::vector<uint64_t> mine(4);
  r.rng.get_state(mine.data());
  const std::vector<float> bn = r.model.download_state();
  for (float v : bn) mine.push_back(std::bit_cast<uint32_t>(v));
  per_rank = mine.size();
  return gather_words(r.comm, mine);
}

// An optimizer moment to the host and back (an optimizer without it has an empty buffer).
void download_moment(const ReplicaState& r, Buffer<float>& b, std::vector<float>& out) {
  if (b.size() == 0) return;
  out.resize(r.opt.size());
  r.dev.download(out.data(), b.data(), out.size() * sizeof(float));
}
void upload_moment(const ReplicaState& r, Buffer<float>& b, const std::vector<float>& in) {
  if (b.size() == 0) return;
  if (in.size() != r.opt.size()) throw UserError("checkpoint: optimizer state of another run");
  r.dev.upload(b.data(), in.data(), in.size() * sizeof(float));
}

// Throws UserError where `c` is not of this run: its data, its sizes, then its position.
void check_of_this_run(const ReplicaState& r, const Checkpoint& c) {
  check_data_unchanged(c, r.data_fingerprint);
  const auto n = static_cast<size_t>(r.model.param_count());
  const int replicas = r.comm.size();
  if (c.replicas != replicas || c.params.size() != n)
    throw UserError(fmt::format(
        "checkpoint: it is of {} replica(s) and {} parameters, this run has {} and {}; delete "
        "checkpoint.bin to start the run over",
        c.replicas, c.params.size(), replicas, n));
  const int64_t steps = r.steps;
  if (c.epoch >= r.cfg.train.epochs || c.step > steps || (c.step > 0) != !c.partial_stats.empty() ||
      c.partial_stats.size() != static_cast<size_t>(c.step) * StepStats::kHost ||
      c.step_losses.size() != static_cast<size_t>(c.epoch) * static_cast<size_t>(steps) ||
      c.global_step != static_cast<int64_t>(c.epoch) * steps + c.step)
    throw UserError("checkpoint: its position is not a step of this run");
}

}  // namespace

std::optional<Checkpoint> collect_checkpoint(const ReplicaState& r, const RunPosition& at,
                                             const PartialEpoch* partial,
                                             const TrainResult* record) {
  size_t per = 0;
  const std::vector<uint64_t> all = gather_rank_state(r, per);
  // The finished steps' sums, reduced over the ranks as at the epoch's end.
  std::vector<double> part;
  if (partial && at.step > 0) part = r.stats.reduced_first(r.comm, at.step);
  if (!record) return std::nullopt;
  Checkpoint c;
  c.config_yaml = to_yaml(r.cfg);
  c.replicas = r.comm.size();
  c.epoch = at.epoch;
  c.step = at.step;
  c.global_step = at.global_step;
  c.params.resize(static_cast<size_t>(r.model.param_count()));
  r.dev.download(c.params.data(), r.model.params(), c.params.size() * sizeof(float));
  download_moment(r, r.opt.first_moment(), c.opt_m);
  download_moment(r, r.opt.second_moment(), c.opt_v);
  for (int rank = 0; rank < c.replicas; ++rank) {
    const auto* w = all.data() + static_cast<size_t>(rank) * per;
    c.rng.insert(c.rng.end(), w, w + 4);
    for (size_t i = 4; i < per; ++i)
      c.bn_state.push_back(std::bit_cast<float>(static_cast<uint32_t>(w[i])));
  }
  c.noise = r.noise.save();
  c.partial_stats = std::move(part);
  if (partial) {
    c.partial_lr_first = partial->lr_first;
    c.partial_times = partial->times;
  }
  c.epochs = record->epochs;
  c.step_losses = record->step_losses;
  c.evals = record->evals;
  c.launches_per_step = record->info.launches_per_step;
  c.data_fingerprint = r.data_fingerprint;
  return c;
}

RunPosition restore_checkpoint(const ReplicaState& r, const Checkpoint& c, TrainResult* record) {
  check_of_this_run(r, c);
  const auto rank = static_cast<size_t>(r.comm.rank());
  if (!r.shared_weights || rank == 0) {  // shared weights: one copy, restored once
    r.dev.upload(r.model.params(), c.params.data(), c.params.size() * sizeof(float));
    upload_moment(r, r.opt.first_moment(), c.opt_m);
    upload_moment(r, r.opt.second_moment(), c.opt_v);
    r.opt.set_steps_taken(c.global_step);
  }
  const size_t per_bn = c.bn_state.size() / static_cast<size_t>(r.comm.size());
  const auto* bn = c.bn_state.data() + per_bn * rank;
  r.model.upload_state(std::vector<float>(bn, bn + per_bn));
  r.rng.set_state(c.rng.data() + 4 * rank);
  r.noise.restore(c.noise);
  if (record) {
    record->epochs = c.epochs;
    record->step_losses = c.step_losses;
    record->evals = c.evals;
    record->info.launches_per_step = c.launches_per_step;
  }
  return {c.epoch, c.step, c.global_step};
}

PartialEpoch restore_partial_epoch(const ReplicaState& r, const Checkpoint& c) {
  // Already reduced: rank 0 holds the sums and the others zeros, which the epoch's reduction
  // adds to the same bits.
  if (r.comm.rank() == 0) r.stats.restore_first(c.partial_stats);
  return {c.partial_lr_first, c.partial_times};
}

}  // namespace dtrain
