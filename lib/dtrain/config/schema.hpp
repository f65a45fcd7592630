#pragma once
// The config schema: every key once, in the visit() functions below, with its YAML name, the
// member it maps to and its valid values. Defaults are the member initialisers of config.hpp.
// The decoder, to_yaml, the JSON view in summary.json, the key list of `report --by` and the
// data identity are all visitors of these functions, so a key added here reaches all of them.
//
// A visitor V provides:
//   template <class T> void operator()(const Key&, T& member);   // a leaf key
//   template <class S> void section(const Key&, S& section);     // a mapping: visit(section, v)
//   void either(const Key&, int64_t&, const Key&, std::optional<int64_t>&);  // the batch pair
// (with `const` members for the visitors that only read).
#include <concepts>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

// One key: its name and the values it takes. Built as Key("gpus").within(1, 4096).
struct Key {
  const char* name;
  // Integers, and each entry of an integer list, lie in [lo, hi].
  int64_t lo = INT64_MIN;
  int64_t hi = INT64_MAX;
  // Numbers lie in [min, max].
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  // Text keys: nullptr where the value is fine, else what it must be.
  const char* (*rule)(const std::string&) = nullptr;
  // Acts on data once loaded (order, sharding, augmentation): two configs that differ only in
  // such keys load the same data (see data_identity).
  bool after_load = false;

  constexpr explicit Key(const char* n) : name(n) {}
  template <class N>
  constexpr Key within(N a, N b) const {
    Key k = *this;
    if constexpr (std::is_floating_point_v<N>) {
      k.min = a;
      k.max = b;
    } else {
      k.lo = a;
      k.hi = b;
    }
    return k;
  }
  constexpr Key at_least(int64_t a) const {
    Key k = *this;
    k.lo = a;
    return k;
  }
  constexpr Key checked(const char* (*r)(const std::string&)) const {
    Key k = *this;
    k.rule = r;
    return k;
  }
  constexpr Key acts_after_load() const {
    Key k = *this;
    k.after_load = true;
    return k;
  }
};

// The most units, channels or stage width a layer takes (2^20): far past any model trained, and
// small enough that no layer's parameter count or map size can pass 64 bits.
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;

// nullptr for a name that can be the experiment's folder, else what a name must be.
const char* folder_name_rule(const std::string& name);
// nullptr for a usable glob pattern (data.exclude), else what one must be.
const char* glob_rule(const std::string& pattern);
// nullptr for 64 hex digits or an empty text (data.sha256), else what the value must be.
const char* sha256_rule(const std::string& digest);

// `C` is `T` or `const T`: writers visit a const config, the decoder a mutable one.
template <class C, class T>
concept ConfigPart = std::same_as<std::remove_const_t<C>, T>;

template <ConfigPart<SyntheticConfig> C, class V>
void visit(C& s, V& v) {
  v(Key("train_size").at_least(1), s.train_size);
  v(Key("test_size").at_least(1), s.test_size);
  v(Key("shape").at_least(1), s.shape);
  v(Key("classes").within(2, 100000), s.classes);
  v(Key("noise").within(0.0, 1e6), s.noise);
}

template <ConfigPart<AugmentConfig> C, class V>
void visit(C& a, V& v) {
  v(Key("crop_padding").within(0, 64), a.crop_padding);
  v(Key("padding_mode"), a.padding_mode);
  v(Key("flip"), a.flip);
  v(Key("crop_scale").within(1e-6, 1.0), a.crop_scale);
  v(Key("crop_ratio").within(1e-3, 1e3), a.crop_ratio);
}

template <ConfigPart<TraceConfig> C, class V>
void visit(C& t, V& v) {
  v(Key("from_step").within(int64_t{1}, int64_t{1} << 50), t.from_step);
  v(Key("steps").within(0, 1000), t.steps);
}

template <ConfigPart<DataConfig> C, class V>
void visit(C& d, V& v) {
  v(Key("dataset"), d.dataset);
  v(Key("path"), d.path);
  v(Key("shuffle").acts_after_load(), d.shuffle);
  v(Key("sharding").acts_after_load(), d.sharding);
  v(Key("drop_remainder").acts_after_load(), d.drop_remainder);
  v(Key("sort_by_label"), d.sort_by_label);
  v(Key("normalize"), d.normalize);
  v(Key("mean").within(0.0, 1.0), d.mean);
  v(Key("std").within(1e-6, 1e3), d.stddev);
  v(Key("train_limit").at_least(0), d.train_limit);
  v(Key("test_limit").at_least(0), d.test_limit);
  v.section(Key("synthetic"), d.synthetic);
  v.section(Key("augment").acts_after_load(), d.augment);
  v(Key("shape").within(1, 8192), d.shape);
  v(Key("workers").within(1, 256).acts_after_load(), d.workers);
  v(Key("prefetch").within(1, 64).acts_after_load(), d.prefetch);
  v(Key("on_bad_file"), d.on_bad_file);
  v(Key("jpeg_draft").acts_after_load(), d.jpeg_draft);
  v(Key("block_size").within(1, 8192), d.block_size);
  v(Key("validation").within(0.0, 0.5), d.validation);
  v(Key("exclude").checked(glob_rule), d.exclude);
  v(Key("sha256").checked(sha256_rule), d.sha256);
  v(Key("vocab_size").within(2, 1000000), d.vocab_size);
}

// The parameters of one entry of model.layers; which ones depends on its type.
template <ConfigPart<LayerSpec> C, class V>
void visit(C& l, V& v) {
  switch (l.type) {
    case LayerType::dense:
      v(Key("units").within<int64_t>(1, kMaxWidth), l.units);
      break;
    case LayerType::conv:
      v(Key("channels").within<int64_t>(1, kMaxWidth), l.channels);
      v(Key("kernel").within(1, 64), l.kernel);
      v(Key("stride").within(0, 64), l.stride);
      v(Key("padding").within(0, 64), l.padding);
      v(Key("bias"), l.bias);
      break;
    case LayerType::maxpool:
      v(Key("size").within(1, 64), l.kernel);
      v(Key("stride").within(0, 64), l.stride);
      v(Key("padding").within(0, 32), l.padding);
      break;
    case LayerType::dropout:
      v(Key("p").within(0.0, 0.99), l.p);
      break;
    case LayerType::residual:
      v(Key("body"), l.body);
      v(Key("shortcut"), l.shortcut);
      v(Key("activation"), l.activation);
      break;
    default:
      break;
  }
}

template <ConfigPart<ModelConfig> C, class V>
void visit(C& m, V& v) {
  v(Key("type"), m.type);
  v(Key("hidden").within<int64_t>(1, kMaxWidth), m.hidden);
  v(Key("activation"), m.activation);
  v(Key("batchnorm"), m.batchnorm);
  v(Key("dropout").within(0.0, 0.99), m.dropout);
  v(Key("layers"), m.layers);
  v(Key("depth").within(8, 1000), m.depth);
  v(Key("widths").within<int64_t>(1, kMaxWidth), m.widths);
  v(Key("stem"), m.stem);
  v(Key("n_layer").within(1, 1000), m.n_layer);
  v(Key("n_head").within(1, 1024), m.n_head);
  v(Key("n_embd").within(1, 65536), m.n_embd);
}

template <ConfigPart<TrainConfig> C, class V>
void visit(C& t, V& v) {
  v(Key("epochs").within(1, 100000), t.epochs);
  // Exactly one of the two defines the run; the other follows from gpus x accumulation_steps.
  v.either(Key("per_replica_batch").at_least(1), t.per_replica_batch,
           Key("global_batch").at_least(1), t.global_batch);
  v(Key("reduction"), t.reduction);
  v(Key("accumulation_steps").within(1, 1 << 20), t.accumulation_steps);
  v(Key("seed").at_least(0), t.seed);
  v(Key("target_accuracy").within(0.0, 1.0), t.target_accuracy);
  v(Key("target_loss").within(0.0, 1e6), t.target_loss);
  v(Key("eval_batch").at_least(1), t.eval_batch);
  v(Key("eval_steps").at_least(0), t.eval_steps);
  v(Key("stop_at_target"), t.stop_at_target);
  v(Key("collective_timeout_s").within(1.0, 1e7), t.collective_timeout_s);
  v(Key("bucket_mb").within(0.0, 1e6), t.bucket_mb);
  v(Key("cuda_graph"), t.cuda_graph);
  v(Key("noise_scale"), t.noise_scale);
  v(Key("checkpoint_steps").at_least(0), t.checkpoint_steps);
  v(Key("label_smoothing").within(0.0, 0.999), t.label_smoothing);
  v.section(Key("trace"), t.trace);
  v(Key("telemetry_ms").within(0, 3600000), t.telemetry_ms);
}

template <ConfigPart<OptimizerConfig> C, class V>
void visit(C& o, V& v) {
  v(Key("type"), o.type);
  v(Key("lr").within(0.0, 1e6), o.lr);
  v(Key("base_batch").at_least(1), o.base_batch);
  v(Key("momentum").within(0.0, 0.999999), o.momentum);
  v(Key("nesterov"), o.nesterov);
  v(Key("weight_decay").within(0.0, 10.0), o.weight_decay);
  v(Key("decay_bn_and_bias"), o.decay_bn_and_bias);
  v(Key("beta1").within(0.0, 0.999999), o.beta1);
  v(Key("beta2").within(0.0, 0.99999999), o.beta2);
  v(Key("eps").within(0.0, 1.0), o.eps);
  v(Key("lr_scaling"), o.lr_scaling);
  v(Key("warmup_epochs").within(0.0, 1e6), o.warmup_epochs);
  v(Key("warmup_from"), o.warmup_from);
  v(Key("schedule"), o.schedule);
  v(Key("step_size").within(1e-9, 1e6), o.step_size);
  v(Key("gamma").within(0.0, 1.0), o.gamma);
  v(Key("min_lr").within(0.0, 1e6), o.min_lr);
  v(Key("grad_clip").within(0.0, 1e6), o.grad_clip);
}

// The order here is the order of config.resolved.yaml.
template <ConfigPart<Config> C, class V>
void visit(C& c, V& v) {
  v(Key("name").checked(folder_name_rule), c.name);
  v(Key("backend"), c.backend);
  v(Key("gpus").within(1, 4096), c.gpus);
  v(Key("threads").within(0, 4096), c.threads);
  v(Key("devices").at_least(0), c.devices);
  v(Key("colocate"), c.colocate);
  v(Key("replicas"), c.replicas);
  v(Key("precision"), c.precision);
  v.section(Key("data"), c.data);
  v.section(Key("model"), c.model);
  v.section(Key("train"), c.train);
  v.section(Key("optimizer"), c.optimizer);
}

// What the schema says about one key, for `report --by` and the tests.
enum class KeyKind {
  text,
  boolean,
  integer,
  number,
  choice,
  int_list,
  number_list,
  text_list,
  layers
};
struct KeyInfo {
  std::string key;  // dotted, e.g. "train.seed"
  KeyKind kind = KeyKind::text;
  std::string default_value;                              // as config_values() writes it
  int64_t lo = INT64_MIN, hi = INT64_MAX;                 // integers and integer-list entries
  double min = -std::numeric_limits<double>::infinity();  // numbers and number-list entries
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // the YAML spellings of a choice
  bool optional = false;             // may be null (unset)
  bool after_load = false;
  std::string valid() const;  // "an integer in [1, 4096]", "sgd | adam | adamw", ...
};

// Every key of the schema, in config.resolved.yaml's order.
const std::vector<KeyInfo>& schema_keys();

// The resolved config as JSON, nested by section like config.resolved.yaml; the batch pair
// holds the per-replica batch in force and the global batch as given (null when not given).
nlohmann::json config_to_json(const Config& c);

// A config's values by dotted key ("train.seed" -> "1"): text as it is, everything else as
// JSON. The second form reads config_to_json's output (summary.json's "config").
std::map<std::string, std::string> config_values(const Config& c);
std::map<std::string, std::string> config_values(const nlohmann::json& view);

}  // namespace dtrain
