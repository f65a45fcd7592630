// Checkpoints: a run continued from any of its checkpoints gives the same bits as one that was
// never stopped; damaged files are refused; Ctrl-C, SIGTERM and SIGKILL (also halfway through
// writing a checkpoint) followed by `dtrain run --resume` lose nothing.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "checkpoint_helpers.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/straggler.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// Two replicas with what has state beyond the weights: momentum or Adam's moments, dropout
// (each replica's random stream), BatchNorm per replica, the noise scale, a short last step.
Config stateful_config(OptimizerType opt) {
  Config c = test::small_image_config(2, 16, 16 * 2 * 12 + 7);  // 12 full steps and a short one
  c.train.epochs = 3;
  c.train.checkpoint_steps = 5;
  c.optimizer.type = opt;
  if (opt != OptimizerType::sgd) c.optimizer.lr = 0.003;
  return c;
}

}  // namespace

TEST_CASE("a run continued from any of its checkpoints gives the same bits", "[checkpoint]") {
  for (auto opt : {OptimizerType::sgd, OptimizerType::adamw}) {
    const Config cfg = stateful_config(opt);
    const DataSplit data = load_data(cfg.data, cfg.train.seed);
    Keep keep;
    const TrainResult full = train(cfg, data, &keep);
    // Every 5 steps (13 a epoch), at the ends of epochs 1 to 3 (before their scoring), and
    // again after the scoring of epochs 1 and 2 where it took longer than the write.
    REQUIRE(keep.all.size() >= 10);
    REQUIRE(keep.all.size() <= 12);
    for (const auto& c : keep.all) {
      INFO(to_string(opt) << ": from epoch " << c.epoch << " step " << c.step);
      CHECK(c.config_yaml == to_yaml(cfg));
      const TrainResult resumed = train(cfg, data, nullptr, &c);
      require_same_numeric_columns(full, resumed);
    }
  }
}

TEST_CASE("a residual run with BatchNorm inside its blocks resumes to the same bits",
          "[checkpoint][residual]") {
  // Per-replica BatchNorm, so each replica's running statistics of every nested BatchNorm
  // (two in an identity block, three with a projection shortcut) must come back.
  Config cfg = stateful_config(OptimizerType::sgd);
  cfg.model = parse_config(R"(model:
  type: layers
  layers:
    - {conv: {channels: 4, padding: 1, bias: false}}
    - batchnorm
    - relu
    - residual:
        body: [{conv: {channels: 4, padding: 1, bias: false}}, batchnorm, relu,
               {conv: {channels: 4, padding: 1, bias: false}}, batchnorm]
    - residual:
        body: [{conv: {channels: 6, stride: 2, padding: 1, bias: false}}, batchnorm, relu,
               {residual: {body: [{conv: {channels: 6, padding: 1}}, batchnorm]}}]
    - global_avg_pool
)",
                           "res.yaml")
                  .model;
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  const TrainResult full = train(cfg, data, &keep);
  REQUIRE(keep.all.size() >= 10);  // 10, or more after a long scoring
  // 2 replicas x [mean, var] of BatchNorms of 4, 4, 4, 6, 6 (nested) and 6 (projection).
  CHECK(keep.all[0].bn_state.size() == 2 * 2 * (4 * 3 + 6 * 3));
  for (const auto& c : keep.all) {
    INFO("from epoch " << c.epoch << " step " << c.step);
    const TrainResult resumed = train(cfg, data, nullptr, &c);
    require_same_numeric_columns(full, resumed);
  }
}

TEST_CASE("a run on Winograd's convolutions resumes to the same bits",
          "[checkpoint][residual][winograd]") {
  // 32 channels, 3x3, stride 1: Winograd's kernels where oneDNN has them (AVX-512).
  Config cfg = stateful_config(OptimizerType::sgd);
  cfg.data.synthetic.shape = {3, 8, 8};
  cfg.model = parse_config(R"(model:
  type: layers
  layers:
    - {conv: {channels: 32, padding: 1, bias: false}}
    - batchnorm
    - relu
    - residual:
        body: [{conv: {channels: 32, padding: 1, bias: false}}, batchnorm, relu,
               {conv: {channels: 32, padding: 1, bias: false}}, batchnorm]
    - global_avg_pool
)",
                           "res.yaml")
                  .model;
  REQUIRE(winograd_suits({32, 8, 8, 32, 3, 1, 1}));
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  const TrainResult full = train(cfg, data, &keep);
  REQUIRE(keep.all.size() >= 10);  // 10, or more after a long scoring
  // Mid-epoch, an epoch's end before its scoring (the largest step), and the last.
  size_t end = 0;
  for (size_t k = 0; k < keep.all.size(); ++k)
    if (keep.all[k].step > keep.all[end].step) end = k;
  for (const size_t k : {size_t{1}, end, keep.all.size() - 1}) {
    const auto& c = keep.all[k];
    INFO("from epoch " << c.epoch << " step " << c.step);
    const TrainResult resumed = train(cfg, data, nullptr, &c);
    require_same_numeric_columns(full, resumed);
  }
}

TEST_CASE("a run with the ResNet recipe's keys resumes to the same bits",
          "[checkpoint][smoothing][decay]") {
  Config cfg = stateful_config(OptimizerType::sgd);
  cfg.data.normalize = Normalize::channel;
  cfg.data.mean = {0.1, -0.0};
  cfg.data.stddev = {1.5, 2.0};
  cfg.data.augment.crop_padding = 2;
  cfg.data.augment.padding_mode = PaddingMode::reflect;
  cfg.train.label_smoothing = 0.1;
  cfg.optimizer.weight_decay = 5e-3;
  cfg.optimizer.decay_bn_and_bias = false;
  // The config a checkpoint carries reads back to itself.
  CHECK(to_yaml(parse_config(to_yaml(cfg), "resolved.yaml")) == to_yaml(cfg));
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  const TrainResult full = train(cfg, data, &keep);
  REQUIRE(keep.all.size() >= 10);  // 10, or more after a long scoring
  for (const auto& c : keep.all) {
    INFO("from epoch " << c.epoch << " step " << c.step);
    const TrainResult resumed = train(cfg, data, nullptr, &c);
    require_same_numeric_columns(full, resumed);
  }
}

TEST_CASE("a checkpoint of another model or replica count is refused", "[checkpoint]") {
  Config cfg = stateful_config(OptimizerType::sgd);
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  train(cfg, data, &keep);
  REQUIRE(!keep.all.empty());
  Config other = cfg;
  other.model.layers[4].units = 25;
  CHECK(error_of([&] { train(other, data, nullptr, &keep.all[0]); })
            .find("checkpoint: it is of 2 replica(s)") != std::string::npos);
  other = cfg;
  other.gpus = 1;
  other.train.per_replica_batch = 32;
  CHECK(!error_of([&] { train(other, data, nullptr, &keep.all[0]); }).empty());
  // Fields that disagree with the run they are restored into, each named.
  auto refused = [&](Checkpoint c) { return error_of([&] { train(cfg, data, nullptr, &c); }); };
  Checkpoint c = keep.all[0];
  c.global_step += 1;
  CHECK(refused(c).find("checkpoint: its position is not a step of this run") == 0);
  c = keep.all[0];
  c.opt_m.pop_back();
  CHECK(refused(c).find("checkpoint: optimizer state of another run") == 0);
  c = keep.all[0];
  c.bn_state.resize(c.bn_state.size() + 2);
  CHECK(refused(c).find("checkpoint: BatchNorm state of another model") == 0);
}

// The benchmarks' Python reader (scripts/bench/dtrain_checkpoint.py, which the same-start
// checks against PyTorch use) accepts the version this dtrain writes: a version bumped here
// without it would make those checks refuse every checkpoint. Where numpy is at hand, it
// reads one and finds its parameters.
TEST_CASE("the benchmarks' checkpoint reader knows the version written", "[checkpoint]") {
  Config cfg = stateful_config(OptimizerType::adamw);
  Keep keep;
  train(cfg, load_data(cfg.data, cfg.train.seed), &keep);
  const std::string bytes = encode_checkpoint(keep.all.back());
  const std::string header = bytes.substr(0, bytes.find('\n') + 1);  // "dtrain checkpoint N\n"
  const std::string version = header.substr(header.rfind(' ') + 1);
  const std::string reader = slurp(source_dir() + "/scripts/bench/dtrain_checkpoint.py");
  INFO(header);
  CHECK_THAT(reader, Catch::Contains("b\"" + version.substr(0, version.size() - 1) + "\\n\""));
  if (std::system("python3 -c 'import numpy' > /dev/null 2>&1") != 0) {
    WARN("SKIPPED: reading it in Python needs numpy (python3-numpy)");
    return;
  }
  TempDir d("ck-python");
  const std::string path = (d.path / "checkpoint.bin").string();
  std::ofstream(path, std::ios::binary) << bytes;
  const auto r = shell("cd " + source_dir() +
                       "/scripts/bench && python3 -c 'import sys, "
                       "dtrain_checkpoint as c; print(len(c.read_checkpoint(sys.argv[1])"
                       "[\"params\"]))' " +
                       path);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out == std::to_string(keep.all.back().params.size()) + "\n");
}

TEST_CASE("a damaged checkpoint file is an error naming it, never a crash", "[checkpoint]") {
  Config cfg = stateful_config(OptimizerType::adamw);
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  train(cfg, data, &keep);
  const std::string good = encode_checkpoint(keep.all.back());
  CHECK_NOTHROW(decode_checkpoint(good, "f"));
  auto refused = [](const std::string& bytes) {
    return error_of([&] { decode_checkpoint(bytes, "ck.bin"); });
  };
  CHECK(refused("").find("ck.bin: not a usable checkpoint") == 0);
  CHECK(refused(good.substr(0, good.size() / 2)).find("checksum") != std::string::npos);
  std::string flipped = good;
  flipped[flipped.size() / 3] ^= 0x10;
  CHECK(refused(flipped).find("checksum") != std::string::npos);
  // Fields that pass the checksum but not the reader: the checksum is recomputed after each
  // change, so that the checks behind it are the ones tested.
  auto resealed = [](std::string b) {
    b.resize(b.size() - 4);
    const auto crc = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(b.data()),
              static_cast<uInt>(b.size())));
    b.append(reinterpret_cast<const char*>(&crc), sizeof crc);
    return b;
  };
  CHECK_NOTHROW(decode_checkpoint(resealed(good), "f"));
  // The config text's length claims 2^60 bytes: refused before anything is allocated.
  std::string bytes = good;
  const size_t len_at = std::string("dtrain checkpoint 1\n").size();
  const uint64_t claim = uint64_t{1} << 60;
  std::memcpy(bytes.data() + len_at, &claim, sizeof claim);
  CHECK(refused(resealed(bytes)).find("runs past the end") != std::string::npos);
  // Cut inside a field, and a noise-scale step count that is not a whole number.
  CHECK(refused(resealed(good.substr(0, good.size() / 2))).find("ck.bin") == 0);
  Checkpoint odd = keep.all.back();
  odd.noise[3] = std::nan("");
  CHECK(refused(encode_checkpoint(odd)).find("the noise-scale step count is nan") !=
        std::string::npos);
  odd = keep.all.back();
  odd.epochs.pop_back();
  CHECK(refused(encode_checkpoint(odd)).find("inconsistent fields") != std::string::npos);
  // Versions 1 (before the input columns) and 2 (before the straggler's): their epochs are
  // shorter and still read, the columns they lack as for a run that measured none.
  Checkpoint last = keep.all.back();
  REQUIRE(!last.epochs.empty());
  for (EpochMetrics& m : last.epochs) {  // values an older file cannot hold
    m.straggler_rank = 1;
    m.straggler_phase = 2;
    m.straggler_excess = 0.25;
    m.bn_sync_s = 0.5;
  }
  CHECK(decode_checkpoint(encode_checkpoint(last), "v3").epochs.back().straggler_excess == 0.25);
  // epoch_fields: an int, 8 doubles, an int64, 8 doubles, an int, an int64, 4 doubles; then 2
  // doubles (version 2); then 2 ints and a double (version 3); then a double (version 4), which
  // also adds the count of test scorings (none here) after the epochs; then a double (version 7).
  const size_t epoch_v1 = 4 + 8 * 8 + 8 + 8 * 8 + 4 + 8 + 4 * 8;
  const size_t epoch_v2 = epoch_v1 + 16, epoch_v3 = epoch_v2 + 16, epoch_v4 = epoch_v3 + 8;
  const size_t epoch_v7 = epoch_v4 + 8;
  REQUIRE(last.evals.empty());
  // A checkpoint of `version` made from one written now: each epoch cut to that version's
  // fields, and the fields after the epochs it lacks left out (the scorings' count from version
  // 4, the data's fingerprint from version 5).
  const auto as_version = [&](const Checkpoint& c, int version) {
    const std::string now = encode_checkpoint(c);
    const size_t n = c.epochs.size(), first = now.size() - 4 - 8 - 8 - n * epoch_v7;
    const size_t cut = version == 1   ? epoch_v1
                       : version == 2 ? epoch_v2
                       : version == 3 ? epoch_v3
                       : version < 7  ? epoch_v4
                                      : epoch_v7;
    std::string body = now.substr(0, first);
    for (size_t e = 0; e < n; ++e) body += now.substr(first + e * epoch_v7, cut);
    if (version >= 4) body += now.substr(first + n * epoch_v7, 8);
    if (version >= 5) body += now.substr(first + n * epoch_v7 + 8, 8);
    body[std::string("dtrain checkpoint ").size()] = static_cast<char>('0' + version);
    return resealed(body + "abcd");
  };
  CHECK(as_version(last, 7) == encode_checkpoint(last));  // the cut of nothing: the same bytes
  for (const int version : {1, 2, 3}) {
    INFO("version " << version);
    const Checkpoint old = decode_checkpoint(as_version(last, version), "old");
    REQUIRE(old.epochs.size() == last.epochs.size());
    CHECK(old.epochs.back().test_loss == last.epochs.back().test_loss);
    if (version < 3) {
      CHECK(std::isnan(old.epochs.back().input_busy));
      CHECK(old.epochs.back().straggler_rank == -1);
      CHECK(std::isnan(old.epochs.back().straggler_excess));
    }
    CHECK(old.evals.empty());
    CHECK(old.epochs.back().bn_sync_s == 0);
  }
  CHECK(decode_checkpoint(encode_checkpoint(last), "v4").epochs.back().bn_sync_s == 0.5);
  // Version 5's data fingerprint round-trips; a version 4 file (without it) reads as unknown.
  Checkpoint printed = last;
  printed.data_fingerprint = 0x0123456789abcdefULL;
  CHECK(decode_checkpoint(as_version(printed, 5), "v5").data_fingerprint == 0x0123456789abcdefULL);
  const Checkpoint four = decode_checkpoint(as_version(printed, 4), "v4");
  CHECK(four.data_fingerprint == 0);
  CHECK(four.epochs.back().bn_sync_s == 0.5);
  // Version 6: a straggler in every phase round-trips, also from a version 5 file (the last
  // builds before version 6 wrote it so). Version 7: the cores other work kept busy, unknown
  // (NaN) in a version 6 file. A later version is named as such.
  Checkpoint every = printed;
  every.epochs.back().straggler_phase = kEveryPhase;
  every.epochs.back().other_cores = 1.25;
  const std::string v7 = encode_checkpoint(every);
  CHECK(v7.compare(0, 20, "dtrain checkpoint 7\n") == 0);
  CHECK(decode_checkpoint(v7, "v7").epochs.back().other_cores == 1.25);
  const Checkpoint six = decode_checkpoint(as_version(every, 6), "v6");
  CHECK(six.epochs.back().straggler_phase == kEveryPhase);
  CHECK(std::isnan(six.epochs.back().other_cores));
  CHECK(six.data_fingerprint == 0x0123456789abcdefULL);
  CHECK(decode_checkpoint(as_version(every, 5), "v5").epochs.back().straggler_phase == kEveryPhase);
  std::string v8 = v7;
  v8[std::string("dtrain checkpoint ").size()] = '8';
  CHECK(refused(resealed(v8)).find("version 8, from a newer dtrain") != std::string::npos);
  // Version 4's test scorings round-trip; one out of order, or of an accuracy above 1, is
  // refused.
  Checkpoint scored = last;
  scored.evals = {{1, 3, 3, 96, 0.5, 1.25, 0.5}, {1, 13, 13, 400, 1.5, 0.75, 0.75}};
  const Checkpoint back = decode_checkpoint(encode_checkpoint(scored), "v4");
  REQUIRE(back.evals.size() == 2);
  CHECK(back.evals[1].samples == 400);
  CHECK(back.evals[1].test_acc == 0.75);
  CHECK(back.evals[0].train_time_s == 0.5);
  odd = scored;
  std::swap(odd.evals[0], odd.evals[1]);
  CHECK(refused(encode_checkpoint(odd)).find("the global step of test scoring 2") !=
        std::string::npos);
  odd = scored;
  odd.evals[0].test_acc = 1.5;
  CHECK(refused(encode_checkpoint(odd)).find("the test accuracy of test scoring 1") !=
        std::string::npos);
  // Against the run (13 steps an epoch): a step past the epoch's, or a global step that does
  // not follow from the epoch and the step, is refused.
  const CheckpointRun run = checkpoint_run(cfg, peek_data_shape(cfg.data));
  REQUIRE(run.steps == 13);
  CHECK_NOTHROW(check_checkpoint(scored, "ck", &run));
  odd = scored;
  odd.evals[0].step = 14;
  CHECK_THAT(error_of([&] { check_checkpoint(odd, "ck", &run); }),
             Catch::Contains("the step of test scoring 1 is 14"));
  odd = scored;
  odd.evals[1].epoch = 2;  // step 13 of epoch 2 is global step 26
  CHECK_THAT(error_of([&] { check_checkpoint(odd, "ck", &run); }),
             Catch::Contains("test scoring 2 at step 13 of epoch 2 says global step 13, not 26"));
  // A straggler rank past the replicas, or a phase that is none, is refused.
  odd = last;
  odd.epochs.back().straggler_rank = odd.replicas;
  CHECK(refused(encode_checkpoint(odd)).find("straggler rank") != std::string::npos);
  odd = last;
  odd.epochs.back().straggler_phase = kEveryPhase + 1;
  CHECK(refused(encode_checkpoint(odd)).find("straggler phase") != std::string::npos);
  odd.epochs.back().straggler_phase = kEveryPhase;  // a rank slower in every phase: kept
  CHECK(decode_checkpoint(encode_checkpoint(odd), "ck").epochs.back().straggler_phase ==
        kEveryPhase);
}

TEST_CASE("a checkpoint larger than its run can hold is refused before it is read",
          "[checkpoint]") {
  for (auto opt : {OptimizerType::sgd, OptimizerType::adamw}) {
    const Config cfg = stateful_config(opt);
    const DataSplit data = load_data(cfg.data, cfg.train.seed);
    const CheckpointRun run = checkpoint_run(cfg, peek_data_shape(cfg.data));
    CHECK(run.steps == 13);
    CHECK(run.global_batch == 32);
    Keep keep;
    train(cfg, data, &keep);
    // The bound holds every checkpoint the run writes, and is not far above the largest.
    size_t largest = 0;
    for (const auto& c : keep.all) largest = std::max(largest, encode_checkpoint(c).size());
    INFO(to_string(opt) << ": largest " << largest << " bytes, bound " << run.max_bytes);
    CHECK(largest <= run.max_bytes);
    CHECK(run.max_bytes < largest + 16384);
  }
  // A 6 GB file with a valid header (sparse: no disk), in a run folder: refused at once with
  // its size and the bound, through the run's config and through config.resolved.yaml.
  const Config cfg = stateful_config(OptimizerType::sgd);
  TempDir d("ck-huge");
  const std::string path = checkpoint_path(d.path.string());
  put(path, "dtrain checkpoint 1\n");
  fs::resize_file(path, uint64_t{6} << 30);
  put(d.path / "config.resolved.yaml", to_yaml(cfg));
  const uint64_t bound = checkpoint_run(cfg, peek_data_shape(cfg.data)).max_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& e : {error_of([&] { load_checkpoint(d.path.string(), cfg); }),
                               error_of([&] { load_checkpoint(d.path.string()); })}) {
    INFO(e);
    CHECK(e.find(path + ": 6442450944 bytes, more than the " + std::to_string(bound) +
                 " bytes a checkpoint of this run") == 0);
    CHECK(e.find("delete it to start the run over") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  // No config.resolved.yaml beside it: nothing to bound it by, refused as well.
  fs::remove(d.path / "config.resolved.yaml");
  CHECK(error_of([&] { load_checkpoint(d.path.string()); }).find("no config.resolved.yaml") !=
        std::string::npos);
}

TEST_CASE("a checkpoint with a valid CRC but absurd values is refused, naming the field",
          "[checkpoint]") {
  const Config cfg = stateful_config(OptimizerType::adamw);
  const DataSplit data = load_data(cfg.data, cfg.train.seed);
  Keep keep;
  train(cfg, data, &keep);
  // The first checkpoint inside epoch 2: finished epochs, partial sums, times.
  const auto mid = std::find_if(keep.all.begin(), keep.all.end(),
                                [](const Checkpoint& c) { return c.epoch == 1 && c.step > 0; });
  REQUIRE(mid != keep.all.end());
  TempDir d("ck-absurd");
  // Each value through the file: encoded (a fresh, valid CRC), saved, loaded for this run.
  auto refused = [&](const Checkpoint& c) {
    save_checkpoint(d.path.string(), c);
    return error_of([&] { load_checkpoint(d.path.string(), cfg); });
  };
  REQUIRE(refused(*mid).empty());
  const double nan = std::nan("");
  struct Case {
    std::function<void(Checkpoint&)> spoil;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](Checkpoint& c) { c.partial_stats[4] = 1e300; },
       "the row count of partial-epoch step 1 is 1e+300, not a whole number from 0 to 32"},
      {[](Checkpoint& c) { c.partial_stats[5 + 4] = -1; }, "row count of partial-epoch step 2"},
      {[](Checkpoint& c) { c.partial_stats[4] = 31.5; }, "row count of partial-epoch step 1"},
      {[&](Checkpoint& c) { c.partial_stats[1] = nan; }, "correct count of partial-epoch step 1"},
      {[](Checkpoint& c) { c.partial_stats[1] = 33; }, "correct count of partial-epoch step 1"},
      {[&](Checkpoint& c) { c.partial_stats[2] = nan; },
       "a squared gradient norm of partial-epoch step 1 is nan"},
      {[](Checkpoint& c) { c.partial_stats[0] = -3; }, "the loss sum of partial-epoch step 1"},
      {[&](Checkpoint& c) { c.partial_times[1] = nan; },
       "the partial epoch's compute time is nan, not a finite value >= 0"},
      {[](Checkpoint& c) { c.partial_times[5] = -1; }, "the partial epoch's total time is -1"},
      {[&](Checkpoint& c) { c.partial_lr_first = nan; }, "the partial epoch's first learning"},
      {[](Checkpoint& c) { c.epochs[0].test_acc = 1.5; },
       "the test accuracy of finished epoch 1 is 1.5"},
      {[&](Checkpoint& c) { c.epochs[0].train_loss = nan; }, "of finished epoch 1 is nan"},
      {[](Checkpoint& c) { c.epochs[0].samples = 1000000000000; },
       "the samples of finished epoch 1 is 1000000000000"},
      {[](Checkpoint& c) { c.epochs[0].epoch = 7; }, "finished epoch 1 is numbered 7"},
      {[](Checkpoint& c) { c.epochs[0].slowest_rank = 2; }, "slowest rank of finished epoch 1"},
      {[](Checkpoint& c) { c.epochs[0].other_cores = -1; },
       "the cores other work kept busy in finished epoch 1 is -1"},
      {[](Checkpoint& c) { c.epochs[0].other_cores = std::numeric_limits<double>::infinity(); },
       "the cores other work kept busy in finished epoch 1 is inf"},
      {[](Checkpoint& c) { c.step_losses[3] = -0.5; }, "the loss of finished step 4 is -0.5"},
      {[&](Checkpoint& c) { c.noise[0] = std::numeric_limits<double>::infinity(); },
       "the noise-scale averages is inf"},
      {[](Checkpoint& c) { c.opt_v[10] = -1; }, "a negative second moment at parameter 10"},
      {[](Checkpoint& c) { c.launches_per_step = -4; }, "the launches per step is -4"},
      {[](Checkpoint& c) {
         c.epoch = 3;  // past the run's 3 epochs, with as many finished epochs as it claims
         c.epochs.resize(3, c.epochs[0]);
         c.epochs[1].epoch = 2, c.epochs[2].epoch = 3;
       },
       "is not a step of this run (3 epochs of 13 steps, 2 replicas)"},
      {[](Checkpoint& c) {
         c.global_step += 20 - c.step;
         c.step = 20;
         c.partial_stats.resize(20 * 5, 1.0);
       },
       "step 20 of 2 replicas is not a step of this run"},
      // Consistent in itself, refused at load (naming the file) rather than by the replicas.
      {[](Checkpoint& c) { c.global_step += 1; }, "is not epoch 1 x 13 steps + step"},
      {[](Checkpoint& c) { c.opt_m.clear(); }, "optimizer state of another optimizer (0 first"},
      {[](Checkpoint& c) { c.opt_v.clear(); }, "this run's optimizer keeps both"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Checkpoint c = *mid;
    cases[i].spoil(c);
    const std::string e = refused(c);
    INFO("case " << i << ": " << e);
    // Values no run can hold: damaged. Values this run cannot hold, in a file consistent in
    // itself (more samples than its data has, an epoch or step past its own): its data or
    // config may have changed, which the refusal says.
    const bool of_run = i == 12 || i + 5 >= cases.size();
    CHECK(e.find(checkpoint_path(d.path.string()) +
                 (of_run ? ": not a checkpoint of this run as its data and config are now ("
                         : ": not a usable checkpoint (")) == 0);
    CHECK(e.find(cases[i].says) != std::string::npos);
  }
  // A non-finite loss sum is what a diverging run writes: accepted, and the resumed epoch ends
  // diverged, as the run that was never stopped did (not `done` with made-up metrics).
  Checkpoint diverging = *mid;
  diverging.partial_stats[0] = nan;
  diverging.partial_stats[2] = nan;
  REQUIRE(refused(diverging).empty());
  const auto loaded = load_checkpoint(d.path.string(), cfg);
  REQUIRE(loaded);
  const TrainResult r = train(cfg, data, nullptr, &*loaded);
  CHECK(r.status == RunStatus::diverged);
}

namespace {

std::string slow_config(const TempDir& d, int epochs = 60) {
  return d.write("ck.yaml",
                 "name: ck\nbackend: cpu\nthreads: 1\ngpus: 2\n"
                 "data:\n  dataset: synthetic\n  synthetic: {train_size: 4000, test_size: 200, "
                 "shape: [32], classes: 4, noise: 1.5}\n"
                 "model: {hidden: [64, 32], dropout: 0.2}\n"
                 "train: {epochs: " +
                     std::to_string(epochs) +
                     ", per_replica_batch: 8, target_accuracy: 0, "
                     "checkpoint_steps: 40}\n"
                 "optimizer: {lr: 0.02, base_batch: 16, momentum: 0.9, warmup_epochs: 1, "
                 "schedule: cosine}\n");
}

// The metrics of `cfg` run to the end without a stop: what every stopped and resumed run of it
// must reproduce, bit for bit.
std::string reference_metrics(const TempDir& d, const std::string& cfg) {
  const auto ref = (d.path / "ref").string();
  REQUIRE(dtrain_cli("run " + cfg + " --results " + ref + " --tag t --quiet").code == 0);
  return numeric_columns(fs::path(ref) / "ck" / "t-g2" / "metrics.csv");
}

// Starts dtrain with `args` in the background (after `launcher`, e.g. mpirun), its output to
// `out`; returns its pid.
pid_t start(const std::string& args, const std::string& env = "", const std::string& launcher = "",
            const std::string& out = "/dev/null") {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd =
        env + " exec " + launcher + dtrain_binary() + " " + args + " > " + out + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits until `metrics` has at least `rows` epochs (or the process ended); true if it has.
bool wait_rows(const fs::path& metrics, int rows, pid_t pid) {
  for (int i = 0; i < 3000; ++i) {
    if (count_lines(slurp(metrics)) > rows) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Whether SIGINT, SIGTERM and SIGHUP are all blocked ("blocked"), none ("unblocked") or some
// of them, in the main thread ("main") and in each other thread of `pid` by its name.
std::map<std::string, std::string> stop_signal_masks(pid_t pid) {
  std::map<std::string, std::string> out;
  const fs::path tasks = fs::path("/proc") / std::to_string(pid) / "task";
  for (const auto& t : fs::directory_iterator(tasks)) {
    std::string name = slurp(t.path() / "comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    if (t.path().filename() == std::to_string(pid)) name = "main";
    std::istringstream status(slurp(t.path() / "status"));
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("SigBlk:", 0) == 0) {
        const unsigned long long blk = std::stoull(line.substr(7), nullptr, 16);
        const bool i = blk >> (SIGINT - 1) & 1, te = blk >> (SIGTERM - 1) & 1,
                   h = blk >> (SIGHUP - 1) & 1;
        out[name] = i && te && h ? "blocked" : !i && !te && !h ? "unblocked" : "some of them";
      }
  }
  return out;
}

// Row `row` (1: the first after the header) of a CSV text's column `name`.
std::string csv_cell(const std::string& csv, int row, const std::string& name) {
  std::stringstream in(csv);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    rows.emplace_back();
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) rows.back().push_back(cell);
  }
  REQUIRE(static_cast<int>(rows.size()) > row);
  const auto at = std::find(rows[0].begin(), rows[0].end(), name);
  REQUIRE(at != rows[0].end());
  return rows[static_cast<size_t>(row)].at(static_cast<size_t>(at - rows[0].begin()));
}

int exit_code(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("Ctrl-C, SIGTERM and SIGHUP stop at a step, and --resume continues to the same bits",
          "[checkpoint][cli]") {
  TempDir d("ck-signal");
  const std::string cfg = slow_config(d);
  const std::string want = reference_metrics(d, cfg);
  // SIGHUP: the terminal closed, an ssh session dropped.
  for (const auto& [sig, code] :
       {std::pair{SIGINT, 130}, std::pair{SIGTERM, 143}, std::pair{SIGHUP, 129}}) {
    INFO("signal " << sig);
    const auto res = (d.path / ("r" + std::to_string(sig))).string();
    const fs::path run = fs::path(res) / "ck" / "t-g2";
    const auto out = d.path / ("out" + std::to_string(sig));
    const pid_t pid = start("run " + cfg + " --results " + res + " --tag t", "", "", out.string());
    REQUIRE(wait_rows(run / "metrics.csv", 3, pid));
    // The stop signals are blocked in the threads that compute (the main one here) and taken
    // by a thread of dtrain's own: a signal frame on a thread inside oneDNN's sgemm kernels
    // would be written into the heap.
    const auto masks = stop_signal_masks(pid);
    CHECK(masks.at("main") == "blocked");
    CHECK(masks.at("dtrain-signals") == "unblocked");
    kill(pid, sig);
    // SIGTERM twice, as GNU timeout sends it (to dtrain, then its process group): one request,
    // not a second one that ends the process before its summary. 50 ms apart, so that the
    // first is handled before the second arrives (two pending ones would merge into one).
    if (sig == SIGTERM) {
      ::usleep(50'000);
      kill(pid, sig);
    }
    CHECK(exit_code(pid) == code);
    // The log says how to continue, with the tag the command needs.
    CHECK(slurp(out).find("to continue: the same command with --resume --tag t") !=
          std::string::npos);
    CHECK(slurp(run / "status") == "interrupted\n");
    CHECK(slurp(run / "summary.json").find("\"status\": \"interrupted\"") != std::string::npos);
    REQUIRE(fs::exists(run / "checkpoint.bin"));
    const auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("resume: continuing at epoch") != std::string::npos);
    CHECK(numeric_columns(run / "metrics.csv") == want);
    CHECK(!fs::exists(run / "checkpoint.bin"));  // done: nothing left to resume
  }
}

namespace {

// A 6,000-byte text and a one-layer GPT config on it for `gpus` replicas (a global batch of
// 16): what the resume-on-changed-data tests train, change and restore.
struct TextRun {
  std::string text;
  fs::path corpus;
  std::string cfg;
};
TextRun text_run(const TempDir& d, int gpus) {
  TextRun g;
  for (int i = 0; g.text.size() < 6000; ++i)
    g.text += "replica " + std::to_string(i % 97) + " reduces. ";
  g.corpus = d.path / "corpus.txt";
  put(g.corpus, g.text);
  g.cfg = d.write("g.yaml", "name: g\nthreads: 1\ngpus: " + std::to_string(gpus) +
                                "\ndata: {dataset: bytes, path: " + g.corpus.string() +
                                ", block_size: 16}\nmodel: {type: gpt, n_layer: 1, n_head: 2, "
                                "n_embd: 16}\ntrain: {epochs: 3, per_replica_batch: " +
                                std::to_string(16 / gpus) + "}\n");
  return g;
}

}  // namespace

// A run stopped by a fault after its first epoch, its text then changed under it: --resume
// refuses to continue on other data (the same length, other bytes) and keeps the checkpoint,
// or names the data when the change makes the checkpoint impossible (a shorter text); with
// the text back, --resume continues to the bits of a run never stopped.
TEST_CASE("a resume refuses data that changed since the run started, and keeps the checkpoint",
          "[checkpoint][cli]") {
  TempDir d("ck-data");
  const TextRun g = text_run(d, 1);
  const auto& [text, corpus, cfg] = g;
  const auto ref = (d.path / "ref").string(), res = (d.path / "res").string();
  const auto first = dtrain_cli("run " + cfg + " --results " + ref + " --tag t");
  REQUIRE(first.code == 0);
  const std::string want = numeric_columns(fs::path(ref) / "g" / "t-g1" / "metrics.csv");
  const auto per = first.out.find(" steps/epoch");
  REQUIRE(per != std::string::npos);
  const long steps = std::stol(first.out.substr(first.out.rfind(' ', per - 1) + 1));
  REQUIRE(steps > 2);
  const fs::path run = fs::path(res) / "g" / "t-g1";
  // A fault in the second epoch: the first epoch's checkpoint stays.
  const auto faulty = shell("DTRAIN_FAULT=0:" + std::to_string(steps + 2) + " " +
                            dtrain_binary() + " run " + cfg + " --results " + res + " --tag t 2>&1");
  REQUIRE(faulty.code == 1);
  REQUIRE(fs::exists(run / "checkpoint.bin"));
  std::string other = text;
  std::reverse(other.begin(), other.end());
  put(corpus, other);
  auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("the data has changed since the run started"));
  // One line, the refusal: the run did not fail (it continues once the data is back).
  CHECK(r.out.find("the data has changed") == r.out.rfind("the data has changed"));
  CHECK_THAT(r.out, !Catch::Contains("failed"));
  CHECK(fs::exists(run / "checkpoint.bin"));
  put(corpus, text.substr(0, 3000));
  r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("if the data changed since the run started, restore it"));
  CHECK(fs::exists(run / "checkpoint.bin"));
  // Refused before the folder was touched: no earlier attempt was moved aside.
  CHECK(!fs::exists(fs::path(res) / "g" / ".attempts"));
  put(corpus, text);
  r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  // The first epoch's checkpoint: written when its steps were done, before its scoring, and
  // again after it where the scoring took longer than the write.
  CHECK_THAT(r.out,
             Catch::Contains("resume: continuing at epoch 1, step " + std::to_string(steps)) ||
                 Catch::Contains("resume: continuing at epoch 2, step 0"));
  CHECK(numeric_columns(run / "metrics.csv") == want);
}

// A resume copies the checkpoint into the run's new folder before the old copy goes; killed
// while writing that copy, the next resume continues from the copy kept under .attempts/.
// A sweep stopped in its first run: the table names the runs it lacks and how to run them.
// Scoring a large test set can take far longer than an epoch's training. The epoch's steps are
// saved before it, a stop ends it between chunks, and a kill there loses no step.
TEST_CASE("a stop while an epoch is scored ends at once, and loses no step", "[checkpoint][cli]") {
  TempDir d("ck-eval");
  // 4 steps of training, then about 120 GFLOP of scoring in chunks of 128 samples.
  const std::string cfg =
      d.write("ck.yaml",
              "name: ck\nbackend: cpu\nthreads: 1\ngpus: 2\n"
              "data:\n  dataset: synthetic\n  synthetic: {train_size: 256, test_size: 48000, "
              "shape: [256], classes: 4, noise: 1.5}\n"
              "model: {hidden: [1024, 1024]}\n"
              "train: {epochs: 2, per_replica_batch: 32, target_accuracy: 0, eval_batch: 128}\n"
              "optimizer: {lr: 0.02, base_batch: 64, momentum: 0.9}\n");
  const std::string want = reference_metrics(d, cfg);
  const auto ref_metrics = slurp(d.path / "ref" / "ck" / "t-g2" / "metrics.csv");
  for (const int sig : {SIGTERM, SIGKILL}) {
    INFO("signal " << sig);
    const auto res = (d.path / ("r" + std::to_string(sig))).string();
    const fs::path run = fs::path(res) / "ck" / "t-g2";
    const pid_t pid = start("run " + cfg + " --results " + res + " --tag t");
    // The first checkpoint is written when epoch 1's steps are done, before its scoring.
    bool saved = false;
    for (int i = 0; i < 6000 && !saved; ++i) {
      saved = fs::exists(run / "checkpoint.bin");
      if (!saved) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(saved);
    const auto t0 = std::chrono::steady_clock::now();
    kill(pid, sig);
    CHECK(exit_code(pid) == 128 + sig);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(count_lines(slurp(run / "metrics.csv")) <= 1);  // stopped before epoch 1's row
    if (sig == SIGTERM) {
      CHECK(slurp(run / "status") == "interrupted\n");
      // Within a few chunks, not the whole test set: well under one epoch's scoring.
      const double scoring = std::stod(csv_cell(ref_metrics, 1, "eval_s"));
      INFO("stopped in " << took << " s; a scoring took " << scoring << " s");
      if (scoring > 0.5)  // long enough to tell the two apart (a fast CPU may score sooner)
        CHECK(took < 0.5 * scoring);
      else
        WARN("scoring took " << scoring << " s: too short to time the stop against");
    }
    REQUIRE(fs::exists(run / "checkpoint.bin"));
    const auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("resume: continuing at epoch 1, step 4"));
    CHECK(numeric_columns(run / "metrics.csv") == want);
  }
  // A fault in epoch 2's steps: epoch 1's scoring took far longer than its checkpoint's write,
  // so the checkpoint was written again after it, and the resume does not score epoch 1 again.
  const auto res = (d.path / "fault").string();
  const auto failed = shell("DTRAIN_FAULT=0:6 " + dtrain_binary() + " run " + cfg + " --results " +
                            res + " --tag t");
  INFO(failed.out);
  REQUIRE(failed.code == 1);
  const auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("resume: continuing at epoch 2, step 0"));
  CHECK(numeric_columns(fs::path(res) / "ck" / "t-g2" / "metrics.csv") == want);
}

TEST_CASE("a sweep stopped early names the runs its table lacks", "[checkpoint][cli]") {
  TempDir d("ck-sweep-stop");
  const std::string cfg = slow_config(d);
  const auto res = (d.path / "r").string();
  const pid_t pid = start("run " + cfg + " optimizer.lr=0.02,0.04 --results " + res + " --tag t");
  REQUIRE(wait_rows(fs::path(res) / "ck" / "t-g2-lr0.02" / "metrics.csv", 2, pid));
  kill(pid, SIGTERM);
  CHECK(exit_code(pid) == 143);
  const std::string md = slurp(fs::path(res) / "ck" / "comparison-t.md");
  INFO(md);
  CHECK_THAT(md, Catch::Contains("| t-g2-lr0.02 ") &&
                     Catch::Contains("Not in this table, with no summary yet: t-g2-lr0.04 "
                                     "(pending)") &&
                     Catch::Contains("`--resume --tag t` runs them"));
}

TEST_CASE("kill -9 while a resume copies its checkpoint: the next resume continues from it",
          "[checkpoint][cli]") {
  TempDir d("ck-copy");
  const std::string cfg = slow_config(d);
  const std::string want = reference_metrics(d, cfg);
  const auto res = (d.path / "r").string();
  const fs::path run = fs::path(res) / "ck" / "t-g2";
  const std::string args = "run " + cfg + " --results " + res + " --tag t";
  const pid_t first = start(args);
  REQUIRE(wait_rows(run / "metrics.csv", 4, first));
  kill(first, SIGKILL);
  CHECK(exit_code(first) == 137);
  const pid_t copy = start(args + " --resume", "DTRAIN_CRASH_IN_CHECKPOINT=1");
  CHECK(exit_code(copy) == 137);
  CHECK_FALSE(fs::exists(run / "checkpoint.bin"));
  const auto r = dtrain_cli(args + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("has no checkpoint; continuing from the checkpoint kept in") &&
                        Catch::Contains("resume: continuing at epoch"));
  CHECK(numeric_columns(run / "metrics.csv") == want);
  for (const auto& e : fs::directory_iterator(fs::path(res) / "ck" / ".attempts"))
    CHECK_FALSE(fs::exists(e.path() / "checkpoint.bin"));
  // Killed after the old folder was moved aside and before the new one was made (a rename
  // away, as the resume's own): the folder is gone, the checkpoint kept beside it is found.
  const std::string args_u = "run " + cfg + " --results " + res + " --tag u";
  const fs::path run_u = fs::path(res) / "ck" / "u-g2";
  const pid_t third = start(args_u);
  REQUIRE(wait_rows(run_u / "metrics.csv", 4, third));
  kill(third, SIGKILL);
  CHECK(exit_code(third) == 137);
  fs::rename(run_u, fs::path(res) / "ck" / ".attempts" / "u-g2.1");
  const auto gone = dtrain_cli(args_u + " --resume");
  INFO(gone.out);
  REQUIRE(gone.code == 0);
  CHECK_THAT(gone.out, Catch::Contains("is gone (a resume moved it aside and stopped); "
                                       "continuing from the checkpoint kept in"));
  CHECK_THAT(gone.out, !Catch::Contains("starts from the beginning"));
  CHECK(numeric_columns(run_u / "metrics.csv") == want);
}

TEST_CASE("kill -9 at any point, even inside a checkpoint write, then --resume: same bits",
          "[checkpoint][cli]") {
  TempDir d("ck-kill");
  const std::string cfg = slow_config(d);
  const std::string want = reference_metrics(d, cfg);
  const auto res = (d.path / "r").string();
  const fs::path run = fs::path(res) / "ck" / "t-g2";
  // Killed three times at different epochs, then halfway through writing a checkpoint, each
  // time resumed; the last resume runs to the end.
  int kills = 0;
  for (int rows : {1, 6, 15}) {
    const pid_t pid = start("run " + cfg + " --results " + res + " --tag t" +
                            (kills ? " --resume" : ""));
    if (!wait_rows(run / "metrics.csv", rows, pid)) break;
    kill(pid, SIGKILL);
    CHECK(exit_code(pid) == 137);
    // The run's log holds its lines up to the kill: each is written as it is logged.
    CHECK_THAT(slurp(run / "log"),
               Catch::Contains(kills ? "resume: continuing at epoch" : "  model "));
    ++kills;
  }
  CHECK(kills == 3);
  const pid_t pid = start("run " + cfg + " --results " + res + " --tag t --resume",
                          "DTRAIN_CRASH_IN_CHECKPOINT=4");
  CHECK(exit_code(pid) == 137);
  CHECK(slurp(run / "status") == "running\n");  // as a crash leaves it; nobody holds it
  const auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(numeric_columns(run / "metrics.csv") == want);
  // Every attempt is kept aside, none of them with a checkpoint any more.
  int attempts = 0;
  for (const auto& e : fs::directory_iterator(fs::path(res) / "ck" / ".attempts")) {
    ++attempts;
    CHECK(!fs::exists(e.path() / "checkpoint.bin"));
  }
  CHECK(attempts == 4);
}

TEST_CASE("under mpirun, Ctrl-C saves the run on every rank and --resume continues it",
          "[checkpoint][mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("ck-mpi");
  // 200 epochs, about 6 s under mpirun here: at 60 (under 2 s) a loaded machine once let the
  // run finish before mpirun had passed the signal on.
  const std::string cfg = slow_config(d, 200);
  const auto ref = (d.path / "ref").string();
  REQUIRE(dtrain_cli("run " + cfg + " --results " + ref + " --tag t --quiet").code == 0);
  const auto res = (d.path / "r").string();
  const fs::path run = fs::path(res) / "ck" / "t-g2";
  const std::string args = "run " + cfg + " --results " + res + " --tag t";
  // mpirun turns Ctrl-C into SIGTERM for every rank (Open MPI's documented behaviour).
  const pid_t pid = start(args, "", mpirun(2));
  REQUIRE(wait_rows(run / "metrics.csv", 3, pid));
  kill(pid, SIGINT);
  exit_code(pid);  // mpirun's own code for a job it was told to stop (1 in Open MPI 4.1)
  CHECK(slurp(run / "status") == "interrupted\n");
  REQUIRE(fs::exists(run / "checkpoint.bin"));
  const auto r = shell(mpirun(2) + dtrain_binary() + " " + args + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume: continuing at epoch") != std::string::npos);
  CHECK(numeric_columns(run / "metrics.csv") ==
        numeric_columns(fs::path(ref) / "ck" / "t-g2" / "metrics.csv"));
}

// Rank 0 alone reads the checkpoint and the data; under a launcher its refusal must reach every
// rank, so that the job ends with the refusal's one line and exit 2 rather than an abort.
TEST_CASE("under mpirun, a resume on changed data is one line and exit 2, and waits for the data",
          "[checkpoint][mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir d("ck-mpi-data");
  const TextRun g = text_run(d, 2);
  const auto& [text, corpus, cfg] = g;
  const auto ref = (d.path / "ref").string(), res = (d.path / "res").string();
  const std::string launch = mpirun(2) + dtrain_binary() + " run " + cfg;
  const auto first = shell(launch + " --results " + ref + " --tag t");
  INFO(first.out);
  REQUIRE(first.code == 0);
  const auto per = first.out.find(" steps/epoch");
  REQUIRE(per != std::string::npos);
  const long steps = std::stol(first.out.substr(first.out.rfind(' ', per - 1) + 1));
  const fs::path run = fs::path(res) / "g" / "t-g2";
  const auto faulty = shell("DTRAIN_FAULT=0:" + std::to_string(steps + 2) + " " + launch +
                            " --results " + res + " --tag t");
  REQUIRE(faulty.code != 0);
  REQUIRE(fs::exists(run / "checkpoint.bin"));
  std::string other = text;
  std::reverse(other.begin(), other.end());
  put(corpus, other);
  auto r = shell(launch + " --results " + res + " --tag t --resume");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("the data has changed since the run started") != std::string::npos);
  CHECK(r.out.find("the data has changed") == r.out.rfind("the data has changed"));
  CHECK(fs::exists(run / "checkpoint.bin"));
  CHECK(!fs::exists(fs::path(res) / "g" / ".attempts"));
  put(corpus, text);
  r = shell(launch + " --results " + res + " --tag t --resume");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out,
             Catch::Contains("resume: continuing at epoch 1, step " + std::to_string(steps)) ||
                 Catch::Contains("resume: continuing at epoch 2, step 0"));
  CHECK(numeric_columns(run / "metrics.csv") ==
        numeric_columns(fs::path(ref) / "g" / "t-g2" / "metrics.csv"));
}

TEST_CASE("an interrupted explain says the tag that continues it, and that tag does",
          "[checkpoint][explain]") {
  TempDir d("ck-explain");
  const std::string cfg = slow_config(d, 30);
  const auto res = (d.path / "r").string();
  const auto out = d.path / "out";
  const std::string args = "explain " + cfg + " --results " + res + " --tag e";
  const pid_t pid = start(args, "", "", out.string());
  // Stop it inside the first rung, a few epochs in.
  const fs::path rung0 = fs::path(res) / "ck" / "explain-e-gpus_2-rung0-g1";
  REQUIRE(wait_rows(rung0 / "metrics.csv", 3, pid));
  kill(pid, SIGINT);
  CHECK(exit_code(pid) == 130);
  const std::string said = slurp(out);
  INFO(said);
  CHECK(said.find("to continue: the same command with --resume --tag e\n") != std::string::npos);
  const auto r = dtrain_cli(args + " --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(slurp(rung0 / "status") == "done\n");
  CHECK(r.out.find("resume: continuing at epoch") != std::string::npos);
  // Continued in place: no second explanation named after the first one's rung.
  for (const auto& e : fs::directory_iterator(fs::path(res) / "ck"))
    CHECK(e.path().filename().string().rfind("explain-explain", 0) != 0);
}

TEST_CASE("the checkpoint bound counts BatchNorm state inside residual blocks", "[checkpoint]") {
  Config c = test::small_image_config(2, 16, 16 * 2 * 6);
  c.train.epochs = 2;
  c.train.checkpoint_steps = 3;
  c.model = parse_config(R"(model:
  type: layers
  layers:
    - {conv: {channels: 4, padding: 1, bias: false}}
    - residual:
        body: [{conv: {channels: 1024, kernel: 1, bias: false}}, batchnorm, relu,
               {conv: {channels: 4, kernel: 1, bias: false}}, batchnorm]
    - global_avg_pool
)",
                         "r.yaml")
                .model;
  const DataSplit data = load_data(c.data, c.train.seed);
  Keep keep;
  train(c, data, &keep);
  REQUIRE(!keep.all.empty());
  const CheckpointRun run = checkpoint_run(c, peek_data_shape(c.data));
  for (const auto& k : keep.all) CHECK(encode_checkpoint(k).size() <= run.max_bytes);
}
