#include "dtrain/train/doctor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/comm/mpi.hpp"
#include "dtrain/data/pipeline.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/schedule.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain {

namespace {

// BatchNorm statistics from fewer than 16 samples hurt (Wu & He 2018, Group Normalization,
// figure 1: ResNet-50 on ImageNet loses 1.2 points at 8 samples per GPU and 11 at 2), unless
// the statistic also pools enough positions of a feature map: dtrain's small CNN lost nothing
// measurable at 8 samples x 14 x 14 positions (docs/studies.md), while ResNet-50's last stage
// pools 8 x 7 x 7. So the rule needs both: few samples and few values per statistic.
constexpr int64_t kSmallBnBatch = 16;
constexpr int64_t kSmallBnValues = 1024;
// Linear scaling this far past base_batch wants a warmup (Goyal et al. 2017 warm up over 5
// epochs at 8k; dtrain's own run at 8x without warmup stuck at chance, see
// docs/doctor-explain.md).
constexpr double kFarPastBase = 4.0;

struct Context {
  const Config& cfg;
  const DataSplit* data;
  int64_t global = 0, micro = 0;
  double scale = 1.0;        // global batch / base_batch
  int64_t bn_positions = 0;  // see fewest_bn_positions(); 0 without BatchNorm
  std::vector<Finding> out;

  void add(const char* rule, std::string message) { out.push_back({rule, std::move(message)}); }
};

// The per-sample input shape: the data's where loaded, else what the config says it will be.
std::vector<int64_t> input_shape(const Context& c) {
  if (c.data) return c.data->train.shape;
  return nominal_shape(c.cfg.data);
}

// The fewest positions any BatchNorm pools per channel and sample, from the shape engine; 0
// without BatchNorm, or where the model does not fit the input (validate names why).
int64_t fewest_bn_positions(const Context& c) {
  try {
    const int classes = c.data ? c.data->train.classes : 10;  // the classifier's width only
    const auto p = model_size(c.cfg.model, input_shape(c), classes).batchnorm_positions;
    return p.empty() ? 0 : *std::min_element(p.begin(), p.end());
  } catch (const UserError&) {
    return 0;
  }
}

// Training samples per epoch, where known without reading files.
int64_t train_size(const Context& c) {
  if (c.data) return c.data->train.size();
  const DataConfig& d = c.cfg.data;
  if (d.dataset == DatasetKind::synthetic)
    return d.train_limit > 0 ? std::min(d.train_limit, d.synthetic.train_size)
                             : d.synthetic.train_size;
  return 0;
}

// The fraction of neighbouring training samples with the same label: about 1/classes for
// shuffled data, near 1 for data stored class by class.
double label_runs(const Dataset& d) {
  if (d.size() < 2) return 0;
  int64_t same = 0;
  for (size_t i = 1; i < d.y.size(); ++i) same += d.y[i] == d.y[i - 1];
  return static_cast<double>(same) / static_cast<double>(d.size() - 1);
}

// What `sum` does depends on the optimizer. SGD (with or without momentum) is linear in the
// gradient: sum at (lr, wd) is mean at (N x lr, wd / N), an N-fold step. Adam and AdamW divide
// by the gradient's own scale: sum is mean but for eps (N x smaller relative to the gradient)
// and, for adam, whose weight decay is added to the gradient, a decay N x weaker. Measured on
// Fashion-MNIST at 2 replicas with adam: 85.10% with mean, 85.20% with sum.
void check_reduction(Context& c) {
  const Config& cfg = c.cfg;
  if (cfg.train.reduction != Reduction::sum || cfg.gpus < 2) return;
  const OptimizerConfig& o = cfg.optimizer;
  const bool decay = o.weight_decay > 0;
  if (o.type == OptimizerType::sgd) {
    c.add("sum-reduction",
          fmt::format("train.reduction: sum adds the gradients of {0} replicas, and sgd's step "
                      "follows the gradient's scale, so every step is {0}x the 1-replica step on "
                      "top of the LR rule (sum at lr is mean at {0}x lr{1}; unless optimizer.lr "
                      "was already divided by {0}); fix: train.reduction: mean",
                      cfg.gpus, decay ? " with weight_decay / " + std::to_string(cfg.gpus) : ""));
    return;
  }
  const bool coupled = o.type == OptimizerType::adam && decay;
  c.add("sum-reduction",
        fmt::format("train.reduction: sum adds the gradients of {0} replicas, but {1} divides "
                    "each step by the gradient's own scale, so its steps stay nearly those of "
                    "mean, not {0}x larger (only eps acts {0}x smaller{2}); with sgd it would "
                    "be {0}x the step; fix: train.reduction: mean",
                    cfg.gpus, to_string(o.type),
                    coupled ? fmt::format(", and weight_decay, which adam adds to the gradient, "
                                          "{}x weaker: sum is mean with weight_decay / {}",
                                          cfg.gpus, cfg.gpus)
                            : ""));
}

void check_lr_rule(Context& c) {
  const OptimizerConfig& o = c.cfg.optimizer;
  const bool sgd = o.type == OptimizerType::sgd;
  // sgd follows the linear rule (Goyal et al. 2017), adam and adamw a square-root one.
  if (o.lr_scaling == LrScaling::none && c.scale > 1.0)
    c.add("unscaled-lr",
          fmt::format("the global batch {} is {:g}x optimizer.base_batch {} but lr_scaling: none "
                      "keeps lr {:g}, so an epoch makes {:g}x fewer steps at the same lr, where "
                      "{} would give each {}; fix: optimizer.lr_scaling: {}",
                      c.global, c.scale, o.base_batch, o.lr, c.scale, to_string(o.type),
                      sgd ? fmt::format("{:g}x the lr (the linear rule)", c.scale)
                          : fmt::format("{:.3g}x the lr (the square-root rule)",
                                        std::sqrt(c.scale)),
                      sgd ? "linear (with warmup) or sqrt" : "sqrt"));
  if (o.lr_scaling == LrScaling::linear && c.scale >= kFarPastBase && o.warmup_epochs <= 0)
    c.add("linear-no-warmup",
          fmt::format("linear scaling multiplies lr by {:g} (global batch {} over base_batch {}) "
                      "from the first step, with no warmup; fix: optimizer.warmup_epochs: 2 to 5, "
                      "or lr_scaling: sqrt",
                      c.scale, c.global, o.base_batch));
  if (o.lr_scaling == LrScaling::linear && c.scale > 1.0 && o.type != OptimizerType::sgd)
    c.add("linear-adam",
          fmt::format("optimizer.type: {} with lr_scaling: linear; adaptive optimizers follow a "
                      "square-root rule, not a linear one; fix: optimizer.lr_scaling: sqrt",
                      to_string(o.type)));
  // dtrain's default warmup climbs from lr to the scaled peak: with no scaling rule it climbs
  // nowhere, at every replica count, though a recipe's warmup (nanoGPT's) meant one from 0.
  if (o.warmup_epochs > 0 && o.lr_scaling == LrScaling::none && o.warmup_from == WarmupFrom::lr)
    c.add("flat-warmup",
          fmt::format("optimizer.warmup_epochs {:g} climbs from lr {:g} to the same lr "
                      "(lr_scaling: none scales nothing), so it changes no LR{}; fix: "
                      "optimizer.warmup_from: zero for a warmup from 0, or warmup_epochs: 0",
                      o.warmup_epochs, o.lr,
                      o.schedule == Schedule::constant
                          ? ""
                          : fmt::format(" and only starts the {} schedule {:g} epochs late",
                                        to_string(o.schedule), o.warmup_epochs)));
  if (warmup_ramps(o, c.global) && o.warmup_epochs > c.cfg.train.epochs / 5.0)
    c.add("long-warmup",
          fmt::format("optimizer.warmup_epochs {:g} is more than a fifth of train.epochs {}, so "
                      "much of the run trains below its peak lr; fix: warmup_epochs at most {:g}",
                      o.warmup_epochs, c.cfg.train.epochs, c.cfg.train.epochs / 5.0));
}

// Gradient clipping acts on the reduced gradient. Summed over N replicas its norm is up to N
// times the mean's, so a threshold tuned at 1 replica clips the N-replica run far harder: a
// pitfall of its own beside sum-reduction's N-fold step (one fix mends both). Averaged, the
// norm also changes with the global batch (E|g_B|^2 = |G|^2 + tr(S) / B, McCandlish et al.
// 2018, appendix A), but by how much depends on the run: docs/doctor-explain.md says so, and no
// rule guesses it.
void check_clipping(Context& c) {
  const Config& cfg = c.cfg;
  const double clip = cfg.optimizer.grad_clip;
  if (clip <= 0 || cfg.train.reduction != Reduction::sum || cfg.gpus < 2) return;
  c.add("clip-across-n",
        fmt::format("optimizer.grad_clip {:g} clips the sum of {} replicas' gradients, whose norm "
                    "is up to {}x the mean's, so it cuts harder than at 1 replica; fix: "
                    "train.reduction: mean",
                    clip, cfg.gpus, cfg.gpus));
}

// Labels that leave outputs untrained or ask for classes the training set lacks: one byte of
// 200 among labels 0-9 builds a 201-way output layer without a word.
void check_labels(Context& c) {
  if (!c.data) return;
  const std::string w = label_warning(*c.data);
  if (!w.empty()) c.add("sparse-labels", w);
}

void check_data_order(Context& c) {
  const DataConfig& d = c.cfg.data;
  if (d.shuffle == Shuffle::sample) return;
  const double runs = c.data ? label_runs(c.data->train) : 0.0;
  if (!d.sort_by_label && runs <= 0.5) return;
  const std::string how =
      d.sort_by_label
          ? "data.sort_by_label orders the training set by label"
          : fmt::format("{:.0f}% of neighbouring training samples share a label", 100 * runs);
  c.add("ordered-data",
        fmt::format("{}, and data.shuffle: {} keeps the stored order inside each batch{}; fix: "
                    "data.shuffle: sample",
                    how, to_string(d.shuffle),
                    d.sharding == Sharding::contiguous && c.cfg.gpus > 1
                        ? ", while sharding: contiguous gives each replica a slice of few classes"
                        : ""));
}

void check_batchnorm(Context& c) {
  if (c.bn_positions == 0) return;
  const Config& cfg = c.cfg;
  const int64_t per_stat =
      cfg.model.batchnorm == BatchNormMode::sync ? c.micro * cfg.gpus : c.micro;
  if (per_stat < kSmallBnBatch && per_stat * c.bn_positions < kSmallBnValues)
    c.add("small-bn-batch",
          fmt::format("BatchNorm statistics come from {} samples x {} positions = {} values "
                      "(model.batchnorm: {}, {} per replica); below {} samples and {} values "
                      "they are noisy and accuracy drops; fix: model.batchnorm: sync, or a larger "
                      "per-replica batch",
                      per_stat, c.bn_positions, per_stat * c.bn_positions,
                      to_string(cfg.model.batchnorm), c.micro, kSmallBnBatch, kSmallBnValues));
  if (cfg.train.accumulation_steps > 1)
    c.add("accumulation-bn",
          fmt::format("train.accumulation_steps: {} with BatchNorm: its statistics come from each "
                      "micro-batch of {}, not from the global batch {}; fix: fewer accumulation "
                      "steps, or a model without BatchNorm",
                      cfg.train.accumulation_steps, c.micro, c.global));
}

void check_dropped(Context& c) {
  const int64_t n = train_size(c);
  if (!c.cfg.data.drop_remainder || n <= 0 || c.global <= 0) return;
  const int64_t dropped = n % c.global;
  // With a per-sample shuffle other samples are dropped each epoch: only a large share matters.
  // With a fixed order the same samples are never seen at all.
  const bool fixed = c.cfg.data.shuffle != Shuffle::sample;
  if (dropped == 0 || (!fixed && dropped * 100 < n)) return;
  c.add("dropped-samples",
        fmt::format("data.drop_remainder drops {} of {} training samples every epoch (global batch "
                    "{}; {}); fix: data.drop_remainder: false, or a global batch that divides {}",
                    dropped, n, c.global,
                    fixed ? "the same ones every epoch" : "different ones each epoch", n));
}

// Not accuracy but speed: more kernel threads than cores take turns on them. On 2 cores the
// quickstart MLP at 1 replica took 0.40 s per epoch with threads: 2, 2.04 s with 16 and 7.35 s
// with 64 (results/readme-examples/threads.md). In one process `threads` is the total its
// replicas share; under a launcher every process on a host takes `threads` of its cores. GPU
// replicas are one host thread each, whatever `threads` says.
void check_threads(Context& c) {
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  const mpi::Launch l = mpi::detect();
  const int procs = l.active ? std::max(1, l.local_size) : 1;
  if (cores <= 0 || c.cfg.backend == Backend::cuda) return;
  const auto s = [](int64_t n) { return n == 1 ? "" : "s"; };
  if (procs > cores) {  // every process has one thread at least, whatever `threads` says
    c.add("oversubscribed-threads",
          fmt::format("{} processes on this host share its {} core{}, each with a thread at "
                      "least, so they take turns and every step is slower, not faster; fix: at "
                      "most {} process{} per host (more hosts, or fewer replicas)",
                      procs, cores, s(cores), cores, cores == 1 ? "" : "es"));
    return;
  }
  // threads: 0 shares the cores out (train_rank: cores / processes, at least 1).
  const int each = c.cfg.threads > 0 ? c.cfg.threads : std::max(1, cores / procs);
  const int64_t total = static_cast<int64_t>(each) * procs;
  if (total <= cores) return;
  const std::string who =
      procs == 1 ? fmt::format("threads: {} is", c.cfg.threads)
                 : fmt::format(
                       "threads: {} in each of the {} processes on this host is {} threads "
                       "in all, and that is",
                       c.cfg.threads, procs, total);
  c.add("oversubscribed-threads",
        fmt::format("{} more than the {} core{} of this machine, so the kernels' threads take "
                    "turns on them and every step is slower, not faster; fix: threads: 0 (the "
                    "cores shared out) or at most {}",
                    who, cores, s(cores), cores / procs));
}

// Not the replicas but the config: a model key the chosen type does not read is dropped
// without a word (model.layers written, but type: mlp trains the preset). Only values that
// differ from the defaults count: a resolved config writes every key whatever the type, and a
// sweep over model.type keeps the other types' keys in its file.
void check_model_keys(Context& c) {
  const ModelConfig& m = c.cfg.model;
  const ModelConfig d;
  const std::string type = to_string(m.type);
  std::vector<std::string> ignored;
  if (m.type != ModelType::mlp && m.hidden != d.hidden) ignored.emplace_back("model.hidden");
  if (m.type != ModelType::layers && !m.layers.empty()) ignored.emplace_back("model.layers");
  if ((m.type == ModelType::lenet5 || m.type == ModelType::layers || m.type == ModelType::resnet) &&
      m.dropout != d.dropout)
    ignored.emplace_back("model.dropout");
  if ((m.type == ModelType::layers || m.type == ModelType::gpt) && m.activation != d.activation)
    ignored.emplace_back("model.activation");
  if (m.type != ModelType::gpt) {
    if (m.n_layer != d.n_layer) ignored.emplace_back("model.n_layer");
    if (m.n_head != d.n_head) ignored.emplace_back("model.n_head");
    if (m.n_embd != d.n_embd) ignored.emplace_back("model.n_embd");
  }
  if (m.type != ModelType::resnet) {
    if (m.depth != d.depth) ignored.emplace_back("model.depth");
    if (m.widths != d.widths) ignored.emplace_back("model.widths");
    if (m.stem != d.stem) ignored.emplace_back("model.stem");
  }
  // A model without BatchNorm (the shape engine finds none) has no statistics to keep local
  // or synchronise.
  if (c.bn_positions == 0 && m.batchnorm != d.batchnorm) ignored.emplace_back("model.batchnorm");
  if (ignored.empty()) return;
  c.add("ignored-model-key",
        fmt::format("{} {} set, but model.type {} does not read {}, so the run trains without "
                    "{}; fix: the model.type that reads {} (hidden: mlp; layers: layers; "
                    "depth, widths, stem: resnet; n_layer, n_head, n_embd: gpt; dropout: mlp, cnn "
                    "or gpt, or dropout layers in model.layers; activation: the image "
                    "presets, or activation layers in model.layers; batchnorm: a model with "
                    "BatchNorm, such as resnet), or remove {}",
                    fmt::join(ignored, ", "), ignored.size() == 1 ? "is" : "are", type,
                    ignored.size() == 1 ? "it" : "them", ignored.size() == 1 ? "it" : "them",
                    ignored.size() == 1 ? "it" : "them", ignored.size() == 1 ? "it" : "them"));
}

// GPU replicas: the input threads (on the CPU) make fewer images a second than the step (on
// the GPU) consumes, so the step waits for its batch for the difference (prefetching hides a
// slower pipeline's jitter, not its rate).
void check_input_wait(Context& c, const InputProbe& p) {
  const double need = static_cast<double>(p.samples_per_step) / p.step_s;
  if (p.decode_per_s >= need) return;
  const double per_worker = p.decode_per_s / p.workers;
  const auto enough = static_cast<int>(std::ceil(need / per_worker));
  c.add("input-bound",
        fmt::format("the input threads decode {:.0f} images/s per replica (data.workers: {}, "
                    "measured), but a step consumes {:.0f} samples/s per replica ({} samples in "
                    "{:.1f} ms, measured on data in memory), so steps will wait for their "
                    "batch about {:.0f}% of the time; fix: data.workers: {} if each thread keeps "
                    "its {:.0f} images/s{}, or cheaper images (smaller files, fewer pixels)",
                    p.decode_per_s, p.workers, need, p.samples_per_step, 1e3 * p.step_s,
                    100 * (1 - p.decode_per_s / need), enough, per_worker,
                    p.cores > 0 && enough * c.cfg.gpus > p.cores
                        ? fmt::format(" and the host's {} cores have room for {} x {} threads",
                                      p.cores, c.cfg.gpus, enough)
                        : ""));
}

// CPU replicas: decoding and the step share the same cores, so the step does not wait for
// input as much as it runs slower; more workers cannot help past the cores. Fires when decoding
// is more than a fifth of the CPU work of a sample.
void check_input_cores(Context& c, const InputProbe& p) {
  const double step_core_s = p.step_s * p.step_threads /
                             static_cast<double>(p.samples_per_step * c.cfg.gpus);
  const double decode_core_s = p.workers / p.decode_per_s;
  const double share = decode_core_s / (decode_core_s + step_core_s);
  if (share <= 0.2) return;
  c.add("input-bound",
        fmt::format("decoding takes {:.2f} ms of a core per image (data.workers: {}, {:.0f} "
                    "images/s measured) and the step {:.2f} ms per sample ({} threads); on the "
                    "CPU both share this machine's {} cores, so decoding is {:.0f}% of the work "
                    "and an epoch takes about {:.1f}x as long as on data in memory, whatever "
                    "data.workers says; fix: images stored nearer the size trained (decoding "
                    "grows with the pixels in the file){}; OMP_WAIT_POLICY=passive in the "
                    "environment, so that the step's threads sleep instead of spinning while "
                    "they wait and leave their core to the decoding (it slows runs on data in "
                    "memory: docs/studies.md measures both); or GPU replicas, whose step "
                    "overlaps the decoding",
                    1e3 * decode_core_s, p.workers, p.decode_per_s, 1e3 * step_core_s,
                    p.step_threads, p.cores, 100 * share, 1 + decode_core_s / step_core_s,
                    c.cfg.data.jpeg_draft
                        ? ""
                        : " or, for JPEG files at least twice the size trained, data.jpeg_draft: "
                          "true (decoded at 1/2 to 1/8 of their size)"));
}

void check_input(Context& c, const InputProbe& p) {
  if (p.step_s <= 0 || p.decode_per_s <= 0 || p.workers <= 0) return;
  if (p.on_gpu)
    check_input_wait(c, p);
  else if (p.step_threads > 0)
    check_input_cores(c, p);
}

}  // namespace

InputProbe probe_input(const Config& cfg, const DataSplit& data) {
  InputProbe p;
  p.workers = cfg.data.workers;
  p.samples_per_step = cfg.micro_batch() * cfg.train.accumulation_steps;
  if (!data.train.files) return p;
  p.decode_per_s = measure_input_rate(data.train, cfg.data, cfg.data.workers, cfg.data.prefetch,
                                      cfg.micro_batch(), 3 * p.samples_per_step);
  // The same run on in-memory data of the same shape: its steps wait for no decoding.
  Config t = cfg;
  constexpr int64_t kSteps = 3;
  t.data = DataConfig{};
  t.data.dataset = DatasetKind::synthetic;
  t.data.synthetic.shape = data.train.shape;
  t.data.synthetic.classes = std::max(2, data.train.classes);
  t.data.synthetic.train_size = cfg.global_batch() * kSteps;
  t.data.synthetic.test_size = std::max<int64_t>(1, cfg.gpus);
  t.train.epochs = 2;
  t.train.checkpoint_steps = 0;
  t.train.target_accuracy = 0;
  t.optimizer.warmup_epochs = 0;
  const TrainResult r = train(t, load_data(t.data, t.train.seed), nullptr);
  p.on_gpu = r.info.backend == "cuda";
  p.cores = static_cast<int>(std::thread::hardware_concurrency());
  p.step_threads = t.threads > 0 ? std::min(t.threads, std::max(1, p.cores)) : p.cores;
  if (r.epochs.size() == 2) {  // the first epoch sets things up
    const EpochMetrics& e = r.epochs.back();
    p.step_s = (e.epoch_time_s - e.data_s) / kSteps;
  }
  return p;
}

const std::vector<std::string>& doctor_rules() {
  static const std::vector<std::string> rules = {
      "sum-reduction",     "unscaled-lr",     "linear-no-warmup", "linear-adam",
      "flat-warmup",       "long-warmup",     "clip-across-n",    "ordered-data",
      "small-bn-batch",    "accumulation-bn", "dropped-samples",  "oversubscribed-threads",
      "ignored-model-key", "sparse-labels",   "input-bound"};
  return rules;
}

std::vector<Finding> diagnose(const Config& cfg, const DataSplit* data, const InputProbe* probe) {
  Context c{cfg, data, 0, 0, 1.0, 0, {}};
  c.global = cfg.global_batch();
  c.micro = cfg.micro_batch();
  c.scale = static_cast<double>(c.global) / static_cast<double>(cfg.optimizer.base_batch);
  c.bn_positions = fewest_bn_positions(c);
  check_reduction(c);
  check_lr_rule(c);
  check_clipping(c);
  check_data_order(c);
  check_batchnorm(c);
  check_dropped(c);
  check_threads(c);
  check_model_keys(c);
  check_labels(c);
  if (probe) check_input(c, *probe);
  return std::move(c.out);
}

std::string to_line(const Finding& f) {
  return fmt::format("doctor: [{}] {}", f.rule, f.message);
}

}  // namespace dtrain
