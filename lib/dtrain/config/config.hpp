#pragma once
// The experiment configuration: one struct, every default written once (the member
// initialisers below). The keys, their YAML names and valid values are listed once, in
// schema.hpp; config.cpp parses, validates and writes configs through that list.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/kinds.hpp"

namespace YAML {
class Node;
}

namespace dtrain {

// How deep a config may nest (blocks inside blocks); deeper is refused when it is read, and
// whatever repeats a config (summary.json) is read back to this depth plus its own levels.
inline constexpr int kMaxConfigDepth = 64;
// summary.json: a few levels of dtrain's own around the config it repeats.
inline constexpr int kMaxSummaryDepth = kMaxConfigDepth + 8;

enum class Backend { auto_, cpu, cuda };
inline const EnumTable<Backend>& choices(Backend) {
  static const EnumTable<Backend> names = {
      {"auto", Backend::auto_}, {"cpu", Backend::cpu}, {"cuda", Backend::cuda}};
  return names;
}

enum class DatasetKind {
  fashion_mnist,
  mnist,
  idx,
  synthetic,
  cifar10,
  cifar100,
  folder,
  bytes,
  tokens
};
inline const EnumTable<DatasetKind>& choices(DatasetKind) {
  static const EnumTable<DatasetKind> names = {{"fashion-mnist", DatasetKind::fashion_mnist},
                                               {"mnist", DatasetKind::mnist},
                                               {"idx", DatasetKind::idx},
                                               {"synthetic", DatasetKind::synthetic},
                                               {"cifar10", DatasetKind::cifar10},
                                               {"cifar100", DatasetKind::cifar100},
                                               {"folder", DatasetKind::folder},
                                               {"bytes", DatasetKind::bytes},
                                               {"tokens", DatasetKind::tokens}};
  return names;
}
// The datasets of token windows (bytes; llm.c token shards), read by model.type gpt alone.
inline bool token_dataset(DatasetKind k) {
  return k == DatasetKind::bytes || k == DatasetKind::tokens;
}

// What a folder dataset does with a file that cannot be decoded: stop the run naming it, or
// leave it out (found before training, listed in the run folder).
enum class BadFile { fail, skip };
inline const EnumTable<BadFile>& choices(BadFile) {
  static const EnumTable<BadFile> names = {{"fail", BadFile::fail}, {"skip", BadFile::skip}};
  return names;
}

enum class Shuffle { sample, batch, none };
inline const EnumTable<Shuffle>& choices(Shuffle) {
  static const EnumTable<Shuffle> names = {
      {"sample", Shuffle::sample}, {"batch", Shuffle::batch}, {"none", Shuffle::none}};
  return names;
}

enum class Sharding { interleaved, contiguous };
inline const EnumTable<Sharding>& choices(Sharding) {
  static const EnumTable<Sharding> names = {{"interleaved", Sharding::interleaved},
                                            {"contiguous", Sharding::contiguous}};
  return names;
}

enum class Reduction { mean, sum };
inline const EnumTable<Reduction>& choices(Reduction) {
  static const EnumTable<Reduction> names = {{"mean", Reduction::mean}, {"sum", Reduction::sum}};
  return names;
}

enum class OptimizerType { sgd, adam, adamw };
inline const EnumTable<OptimizerType>& choices(OptimizerType) {
  static const EnumTable<OptimizerType> names = {
      {"sgd", OptimizerType::sgd}, {"adam", OptimizerType::adam}, {"adamw", OptimizerType::adamw}};
  return names;
}

enum class LrScaling { none, linear, sqrt };
inline const EnumTable<LrScaling>& choices(LrScaling) {
  static const EnumTable<LrScaling> names = {
      {"none", LrScaling::none}, {"linear", LrScaling::linear}, {"sqrt", LrScaling::sqrt}};
  return names;
}

enum class Schedule { constant, step, cosine };
inline const EnumTable<Schedule>& choices(Schedule) {
  static const EnumTable<Schedule> names = {
      {"constant", Schedule::constant}, {"step", Schedule::step}, {"cosine", Schedule::cosine}};
  return names;
}

// Where warmup starts: `lr` climbs from the given lr to the scaled peak (Goyal et al. 2017: at
// one replica it is flat), `zero` from 0 to the peak (nanoGPT, llm.c, most transformer recipes).
enum class WarmupFrom { lr, zero };
inline const EnumTable<WarmupFrom>& choices(WarmupFrom) {
  static const EnumTable<WarmupFrom> names = {{"lr", WarmupFrom::lr}, {"zero", WarmupFrom::zero}};
  return names;
}

enum class ModelType { mlp, lenet5, cnn, layers, resnet, gpt };
inline const EnumTable<ModelType>& choices(ModelType) {
  static const EnumTable<ModelType> names = {{"mlp", ModelType::mlp},
                                             {"lenet5", ModelType::lenet5},
                                             {"cnn", ModelType::cnn},
                                             {"layers", ModelType::layers},
                                             {"resnet", ModelType::resnet},
                                             {"gpt", ModelType::gpt}};
  return names;
}

enum class BatchNormMode { local, sync };
inline const EnumTable<BatchNormMode>& choices(BatchNormMode) {
  static const EnumTable<BatchNormMode> names = {{"local", BatchNormMode::local},
                                                 {"sync", BatchNormMode::sync}};
  return names;
}

// How in-process replicas hold the model: each its own copy (threads), or one copy of the
// weights and optimizer state for all (shared); auto picks shared for CPU replicas and for
// replicas colocated on one GPU (shares_weights in trainer.hpp).
enum class ReplicaMode { auto_, threads, shared };
inline const EnumTable<ReplicaMode>& choices(ReplicaMode) {
  static const EnumTable<ReplicaMode> names = {{"auto", ReplicaMode::auto_},
                                               {"threads", ReplicaMode::threads},
                                               {"shared", ReplicaMode::shared}};
  return names;
}

enum class LayerType {
  dense,
  conv,
  maxpool,
  global_avg_pool,
  batchnorm,
  dropout,
  flatten,
  relu,
  tanh,
  sigmoid,
  gelu,
  residual
};
inline const EnumTable<LayerType>& choices(LayerType) {
  static const EnumTable<LayerType> names = {
      {"dense", LayerType::dense},         {"conv", LayerType::conv},
      {"maxpool", LayerType::maxpool},     {"global_avg_pool", LayerType::global_avg_pool},
      {"batchnorm", LayerType::batchnorm}, {"dropout", LayerType::dropout},
      {"flatten", LayerType::flatten},     {"relu", LayerType::relu},
      {"tanh", LayerType::tanh},           {"sigmoid", LayerType::sigmoid},
      {"gelu", LayerType::gelu},           {"residual", LayerType::residual}};
  return names;
}

// A residual block's shortcut: the input itself, a 1x1 strided conv (no bias) and BatchNorm,
// or whichever of the two fits the body's output (identity where the shapes match).
enum class Shortcut { auto_, identity, project };
inline const EnumTable<Shortcut>& choices(Shortcut) {
  static const EnumTable<Shortcut> names = {
      {"auto", Shortcut::auto_}, {"identity", Shortcut::identity}, {"project", Shortcut::project}};
  return names;
}

// What follows a residual block's sum (none: the sum itself).
enum class BlockActivation { relu, none, tanh, sigmoid, gelu };
inline const EnumTable<BlockActivation>& choices(BlockActivation) {
  static const EnumTable<BlockActivation> names = {{"relu", BlockActivation::relu},
                                                   {"none", BlockActivation::none},
                                                   {"tanh", BlockActivation::tanh},
                                                   {"sigmoid", BlockActivation::sigmoid},
                                                   {"gelu", BlockActivation::gelu}};
  return names;
}

// The first layers of a ResNet: cifar (3x3 conv, stride 1) or imagenet (7x7 conv, stride 2,
// then a 3x3 max pool of stride 2).
enum class ResnetStem { cifar, imagenet };
inline const EnumTable<ResnetStem>& choices(ResnetStem) {
  static const EnumTable<ResnetStem> names = {{"cifar", ResnetStem::cifar},
                                              {"imagenet", ResnetStem::imagenet}};
  return names;
}

// data.normalize: none (pixels in [0,1]), one mean and std over all features (global), or one
// per channel of C x H x W images (channel).
enum class Normalize { off, global, channel };
// `true` is how configs before per-channel statistics asked for global ones: still read, never
// written (to_string gives the first spelling of a value).
inline const EnumTable<Normalize>& choices(Normalize) {
  static const EnumTable<Normalize> names = {{"global", Normalize::global},
                                             {"channel", Normalize::channel},
                                             {"false", Normalize::off},
                                             {"off", Normalize::off},
                                             {"true", Normalize::global}};
  return names;
}

// What a random crop reads outside the image: zeros, or the image mirrored at its edge
// (without repeating the edge pixel, as numpy's and PyTorch's reflect).
enum class PaddingMode { zero, reflect };
inline const EnumTable<PaddingMode>& choices(PaddingMode) {
  static const EnumTable<PaddingMode> names = {{"zero", PaddingMode::zero},
                                               {"reflect", PaddingMode::reflect}};
  return names;
}

struct SyntheticConfig {
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  std::vector<int64_t> shape = {32};  // per-sample shape, e.g. [784] or [1, 28, 28]
  int classes = 10;
  double noise = 1.0;  // std of the per-sample noise around each class prototype
};

// Training-time augmentation of image data. In-memory images: a random crop from the padded
// image and a flip, drawn from each replica's own random stream. Image files (dataset: folder):
// a random-resized crop to data.shape and a flip, keyed by (seed, epoch, sample), so the same
// for any replica and worker count.
struct AugmentConfig {
  int64_t crop_padding = 0;  // random crop of the original size from the padded image
  PaddingMode padding_mode = PaddingMode::zero;
  bool flip = false;  // random horizontal flip with probability 1/2
  // dataset: folder: the crop's share of the image's area and its aspect ratio (width / height)
  // lie in these ranges (torchvision's RandomResizedCrop defaults).
  std::vector<double> crop_scale = {0.08, 1.0};
  std::vector<double> crop_ratio = {0.75, 4.0 / 3.0};
  bool enabled() const { return crop_padding > 0 || flip; }
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string path = "/usr/share/datasets/fashion-mnist";
  Shuffle shuffle = Shuffle::sample;
  Sharding sharding = Sharding::interleaved;
  bool drop_remainder = true;
  bool sort_by_label = false;  // reorder training data by label (the sharding pitfall)
  // Pixels are scaled to [0,1], then standardised: (x - mean) / std, with the statistics
  // given below or, where none are, the training set's.
  Normalize normalize = Normalize::global;
  // Given statistics in [0,1] pixel units: one per channel (normalize: channel) or one
  // (global). Empty: computed from the training set.
  std::vector<double> mean;
  std::vector<double> stddev;
  int64_t train_limit = 0;  // use only the first N training samples (0 = all)
  int64_t test_limit = 0;   // use only the first N test samples (0 = all)
  SyntheticConfig synthetic;
  AugmentConfig augment;
  // dataset: folder (train/<class>/* and test/<class>/* image files, decoded as they are used).
  std::vector<int64_t> shape = {3, 224, 224};  // [C, H, W] of a sample; C is 1 (grey) or 3 (RGB)
  int workers = 2;                             // decode threads per replica
  int prefetch = 2;                            // batches decoded ahead of the one in use
  BadFile on_bad_file = BadFile::fail;
  // Decode a JPEG at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling, PIL's draft mode)
  // where its crop keeps at least the sample's size: faster on files far larger than the
  // sample, with pixels that differ a little from a whole decode's.
  bool jpeg_draft = false;
  // dataset: bytes (data.path: a text file, or a folder of them read in name order) and tokens
  // (llm.c token shards: one, or a folder of *train* and *val* shards): a sample is a window of
  // block_size + 1 tokens, the model predicting each next token; the last `validation` share of
  // the stream is the test set (a folder of shards: its val shards instead).
  int64_t block_size = 64;
  double validation = 0.1;
  // dataset: bytes: files of a folder left out, by glob patterns (fnmatch) matched against a
  // file's name or its path below data.path, e.g. ["*.dat", "*.u8"].
  std::vector<std::string> exclude;
  // dataset: bytes: the SHA-256 the stream read must have (64 hex digits; empty: not checked),
  // so that a study names the exact corpus it trained on.
  std::string sha256;
  // dataset: tokens: the vocabulary (GPT-2's by default); every token must lie below it.
  int64_t vocab_size = 50257;
};

// One entry of `model.layers` (type: layers). Fields a type does not use stay at defaults.
struct LayerSpec {
  LayerType type = LayerType::relu;
  int64_t units = 0;                                   // dense
  int64_t channels = 0;                                // conv
  int64_t kernel = 3;                                  // conv, maxpool (window)
  int64_t stride = 0;                                  // conv (0 = 1), maxpool (0 = the window)
  int64_t padding = 0;                                 // conv, maxpool
  bool bias = true;                                    // conv
  double p = 0.5;                                      // dropout
  std::vector<LayerSpec> body;                         // residual
  Shortcut shortcut = Shortcut::auto_;                 // residual
  BlockActivation activation = BlockActivation::relu;  // residual
  bool operator==(const LayerSpec&) const = default;
};

struct ModelConfig {
  ModelType type = ModelType::mlp;
  std::vector<int64_t> hidden = {256, 128};  // mlp
  Activation activation = Activation::relu;  // mlp, lenet5, cnn, resnet
  BatchNormMode batchnorm = BatchNormMode::local;
  double dropout = 0.0;           // mlp: after each hidden layer; cnn: before the classifier
  std::vector<LayerSpec> layers;  // type: layers (the classifier layer is appended)
  // resnet: 20, 32, 56, ... (6n+2: CIFAR-style, 3 stages of n basic blocks, widths 16/32/64),
  // or 18 and 34 (4 stages of [2,2,2,2] or [3,4,6,3] blocks, widths 64/128/256/512).
  int64_t depth = 20;
  std::vector<int64_t> widths;  // resnet: one per stage; empty = the depth's standard widths
  ResnetStem stem = ResnetStem::cifar;
  // gpt: pre-LayerNorm transformer blocks (GPT-2's layout; the context is data.block_size, the
  // vocabulary the data's).
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
};

// A step trace (trace.json in the run folder, Chrome's trace-event format): what every rank did
// and when, over `steps` optimizer steps from the 1-based global step `from_step`. 0 steps: off.
struct TraceConfig {
  int64_t from_step = 1;
  int64_t steps = 0;
  bool enabled() const { return steps > 0; }
};

struct TrainConfig {
  int epochs = 10;
  // A config gives at most one of the two. A given global_batch defines the run (the
  // per-replica batch is then global_batch / (gpus x accumulation_steps), see micro_batch());
  // otherwise per_replica_batch does.
  int64_t per_replica_batch = 64;
  std::optional<int64_t> global_batch;
  Reduction reduction = Reduction::mean;
  int accumulation_steps = 1;
  uint64_t seed = 1;
  double target_accuracy = 0.85;  // 0 disables time-to-target
  // A test loss to reach (a language model's yardstick); 0 disables it. With both targets set,
  // the target is reached when both are.
  double target_loss = 0.0;
  int64_t eval_batch = 1000;
  // Also score the test set every this many optimizer steps (0: at each epoch's end only):
  // evals.csv, and the steps and samples to the target to within this many steps.
  int64_t eval_steps = 0;
  // End the run after the epoch in which the target was first reached (a batch-size study's
  // runs need no more).
  bool stop_at_target = false;
  // Multi-process runs: give up on a collective that makes no progress for this long.
  double collective_timeout_s = 300.0;
  // Gradient buckets: each is all-reduced as soon as backward has finished it (0 = one
  // all-reduce after backward). 25 MB is PyTorch DDP's default.
  double bucket_mb = 25.0;
  // CUDA backend: capture the steady-state training step in a CUDA graph and replay it (one
  // launch per step instead of one per kernel). Ignored on the CPU.
  bool cuda_graph = true;
  // Gradient noise scale (McCandlish et al. 2018) from the squared gradient norms before and
  // after the exchange, with more than one replica (with one, from the first micro-batch and the
  // accumulated batch, where accumulation_steps > 1): metrics.csv and summary.json.
  bool noise_scale = true;
  // A checkpoint (checkpoint.bin in the run folder) is written at every epoch's end, when the
  // run is stopped (Ctrl-C, SIGTERM), and every this many optimizer steps (0: not by steps).
  // `dtrain run --resume` continues an unfinished run from it.
  int64_t checkpoint_steps = 0;
  // The cross-entropy target is (1 - eps) one-hot + eps / classes (PyTorch's definition).
  double label_smoothing = 0.0;
  TraceConfig trace;
  // devices.csv: every this many milliseconds, each GPU's NVML readings and the CPU clocks of
  // each replica's thread and of the process (0: off). Observes the run; changes no result.
  int telemetry_ms = 100;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::sgd;
  double lr = 0.05;
  int64_t base_batch = 64;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  // false: BatchNorm's scale and shift and every bias get no weight decay, only weights do.
  bool decay_bn_and_bias = true;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  LrScaling lr_scaling = LrScaling::linear;
  double warmup_epochs = 0.0;
  WarmupFrom warmup_from = WarmupFrom::lr;
  Schedule schedule = Schedule::constant;
  double step_size = 30.0;  // epochs between decays (schedule: step)
  double gamma = 0.1;       // decay factor (schedule: step)
  double min_lr = 0.0;      // floor of the cosine schedule, given for base_batch like lr
  // Clip the reduced gradient to this global L2 norm before the update (0: no clipping). Every
  // rank clips the same all-reduced gradient, so the factor is the same everywhere.
  double grad_clip = 0.0;
};

struct Config {
  std::string name = "experiment";
  Backend backend = Backend::auto_;
  int gpus = 1;
  int threads = 0;               // CPU threads for the whole run; 0 = all hardware threads
  std::vector<int64_t> devices;  // GPU indices to use (cuda); empty = 0, 1, ... gpus-1
  bool colocate = false;         // cuda: allow several replicas per GPU when gpus > devices
  ReplicaMode replicas = ReplicaMode::auto_;  // in-process replicas: see ReplicaMode
  Precision precision = Precision::fp32;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  OptimizerConfig optimizer;

  // Derived (not keys). Products are taken in 64 bits and checked: a config built in code has
  // not been through the decoder's limits, so an overflow throws UserError.
  int64_t micro_batch() const;   // samples per replica per micro-step
  int64_t global_batch() const;  // samples per optimizer step, all replicas and micro-steps
};

// The LR the rule maps `lr` (given for base_batch) to at this global batch: the peak the
// warmup climbs to and the schedule starts from.
double scaled_lr(const OptimizerConfig& o, int64_t global_batch);

// Follows YAML's quotes along an override's value, a character at a time: outside(ch) says
// whether `ch` stands outside quotes (the quote characters themselves count as inside), where
// a comma splits a sweep list and a '#' after a blank starts a comment. As YAML reads them, a
// quote opens a quoted string only where a value starts (first, or after '[', '{', ',' or
// ':'); inside a plain word (it's, O"Brien) it is a character like any other. With
// `anywhere`, every quote opens one: the sweep-list split's rule (name=a"b,c is one name).
class YamlQuotes {
 public:
  explicit YamlQuotes(bool anywhere = false) : anywhere_(anywhere) {}
  bool outside(char ch) {
    // '' inside single quotes is one quote character: the string goes on.
    const bool reopen = closed_single_ && ch == '\'';
    closed_single_ = false;
    if (reopen) {
      quote_ = ch;
      return false;
    }
    if (quote_) {
      if (escaped_)
        escaped_ = false;
      else if (quote_ == '"' && ch == '\\')
        escaped_ = true;  // a backslash escapes inside double quotes, as YAML reads them
      else if (ch == quote_) {
        closed_single_ = ch == '\'';
        quote_ = 0;
      }
      return false;
    }
    const bool starts =
        anywhere_ || last_ == 0 || last_ == '[' || last_ == '{' || last_ == ',' || last_ == ':';
    if ((ch == '"' || ch == '\'') && starts) {
      quote_ = ch;
      last_ = ch;
      return false;
    }
    if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') last_ = ch;
    return true;
  }

 private:
  bool anywhere_;
  char quote_ = 0;
  char last_ = 0;  // the last character outside quotes that is not a blank (0: none yet)
  bool escaped_ = false;
  bool closed_single_ = false;  // the character before closed a single-quoted string
};

// One `key=value` from the command line. `value` is YAML (so `model.hidden=[512,256]` works).
struct Override {
  std::string key;
  std::string value;
  std::string text() const { return key + "=" + value; }
};

// Parse `key=value`; throws UserError naming the text if malformed.
Override parse_override(const std::string& text);

// Load a YAML file, apply overrides, validate. Errors are UserError with file:line and key.
Config load_config(const std::string& path, const std::vector<Override>& overrides = {});
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<Override>& overrides = {});

// Every value in force, defaults included, as YAML that load_config reads back to the same Config.
std::string to_yaml(const Config& c);

// What every process of a launched job must agree on: the config but data.path and threads
// (which may differ between nodes), hashed.
uint64_t launch_fingerprint(const Config& c);

// Closest candidate by edit distance, or "" when nothing is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dtrain
