#include "dtrain/config/config.hpp"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "dtrain/base/error.hpp"
#include "dtrain/base/log.hpp"

namespace dtrain {

namespace {
// Well-formed UTF-8: no stray continuation bytes, no overlong forms, no surrogates.
bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    unsigned cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

// The product of `factors`, or -1 where it would pass `cap` (or wrap around) on the way.
int64_t bounded_product(const std::vector<int64_t>& factors, int64_t cap) {
  int64_t p = 1;
  for (const int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p) || p > cap) return -1;
  return p;
}
}  // namespace

namespace {

template <class E>
using EnumTable = std::vector<std::pair<const char*, E>>;

const EnumTable<Precision> kPrecisions = {
    {"fp32", Precision::fp32}, {"tf32", Precision::tf32}, {"bf16", Precision::bf16}};
const EnumTable<Backend> kBackends = {
    {"auto", Backend::auto_}, {"cpu", Backend::cpu}, {"cuda", Backend::cuda}};
const EnumTable<DatasetKind> kDatasets = {{"fashion-mnist", DatasetKind::fashion_mnist},
                                          {"mnist", DatasetKind::mnist},
                                          {"idx", DatasetKind::idx},
                                          {"synthetic", DatasetKind::synthetic}};
const EnumTable<Shuffle> kShuffles = {
    {"sample", Shuffle::sample}, {"batch", Shuffle::batch}, {"none", Shuffle::none}};
const EnumTable<Sharding> kShardings = {{"interleaved", Sharding::interleaved},
                                        {"contiguous", Sharding::contiguous}};
const EnumTable<Activation> kActivations = {{"relu", Activation::relu},
                                            {"tanh", Activation::tanh},
                                            {"sigmoid", Activation::sigmoid},
                                            {"gelu", Activation::gelu}};
const EnumTable<Reduction> kReductions = {{"mean", Reduction::mean}, {"sum", Reduction::sum}};
const EnumTable<OptimizerType> kOptimizers = {
    {"sgd", OptimizerType::sgd}, {"adam", OptimizerType::adam}, {"adamw", OptimizerType::adamw}};
const EnumTable<LrScaling> kScalings = {
    {"none", LrScaling::none}, {"linear", LrScaling::linear}, {"sqrt", LrScaling::sqrt}};
const EnumTable<Schedule> kSchedules = {
    {"constant", Schedule::constant}, {"step", Schedule::step}, {"cosine", Schedule::cosine}};

const EnumTable<ModelType> kModelTypes = {{"mlp", ModelType::mlp},
                                          {"lenet5", ModelType::lenet5},
                                          {"cnn", ModelType::cnn},
                                          {"layers", ModelType::layers}};
const EnumTable<BatchNormMode> kBatchNormModes = {{"local", BatchNormMode::local},
                                                  {"sync", BatchNormMode::sync}};
const EnumTable<LayerType> kLayerTypes = {{"dense", LayerType::dense},
                                          {"conv", LayerType::conv},
                                          {"maxpool", LayerType::maxpool},
                                          {"global_avg_pool", LayerType::global_avg_pool},
                                          {"batchnorm", LayerType::batchnorm},
                                          {"dropout", LayerType::dropout},
                                          {"flatten", LayerType::flatten},
                                          {"relu", LayerType::relu},
                                          {"tanh", LayerType::tanh},
                                          {"sigmoid", LayerType::sigmoid},
                                          {"gelu", LayerType::gelu}};

template <class E>
const char* enum_name(const EnumTable<E>& table, E v) {
  for (const auto& [name, value] : table)
    if (value == v) return name;
  return "?";
}

template <class E>
std::string enum_choices(const EnumTable<E>& table) {
  std::string s;
  for (const auto& [name, value] : table) {
    if (!s.empty()) s += " | ";
    s += name;
  }
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Where a value came from, for error messages: file:line, or the command-line override.
struct Source {
  std::string file;
  std::map<std::string, std::string> overrides;  // full key -> "key=value"
};

// Reads one YAML mapping, remembers which keys were consumed, and rejects the rest.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string prefix, const Source& src)
      : node_(node), prefix_(std::move(prefix)), src_(src) {}

  std::string full(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  // The override that set `key` or a key below it, if any.
  const std::string* override_for(const std::string& key) const {
    const std::string f = full(key);
    for (const auto& [k, text] : src_.overrides)
      if (k == f || k.rfind(f + ".", 0) == 0) return &text;
    return nullptr;
  }

  std::string where(const std::string& key, const YAML::Node& n) const {
    if (const auto* ov = override_for(key)) return fmt::format("override '{}'", *ov);
    if (n && !n.Mark().is_null()) return fmt::format("{}:{}", src_.file, n.Mark().line + 1);
    return src_.file;
  }

  [[noreturn]] void fail(const std::string& key, const YAML::Node& n,
                         const std::string& msg) const {
    throw UserError(fmt::format("{}: {}: {}", where(key, n), full(key), msg));
  }

  static std::string show(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
  }

  // Returns the node for `key` (marking it used), or an undefined node.
  YAML::Node take(const std::string& key) {
    seen_.insert(key);
    return node(key);
  }

  // Read-only lookup: a const operator[] never inserts into the mapping.
  YAML::Node node(const std::string& key) const {
    if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cn = node_;
    return cn[key];
  }

  template <class T>
  void scalar(const std::string& key, T& out, const char* type_name) {
    YAML::Node n = take(key);
    if (!n) return;
    if (!n.IsScalar()) fail(key, n, fmt::format("expected {}, got {}", type_name, show(n)));
    try {
      out = n.as<T>();
    } catch (const YAML::Exception&) {
      fail(key, n, fmt::format("expected {}, got {}", type_name, show(n)));
    }
  }

  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi = INT64_MAX) {
    if (!node(key)) {
      seen_.insert(key);  // absent: the default stands
      return;
    }
    scalar(key, out, "an integer");
    check_range(key, out, lo, hi);
  }
  void integer(const std::string& key, int& out, int64_t lo, int64_t hi = INT32_MAX) {
    int64_t v = out;
    integer(key, v, lo, hi);
    out = static_cast<int>(v);
  }
  void optional_integer(const std::string& key, std::optional<int64_t>& out, int64_t lo) {
    YAML::Node n = node(key);
    if (!n || n.IsNull()) {
      seen_.insert(key);
      return;
    }
    int64_t v = 0;
    integer(key, v, lo);
    out = v;
  }
  void number(const std::string& key, double& out, double lo, double hi) {
    scalar(key, out, "a number");
    if (!(out >= lo && out <= hi)) {
      fail(key, node(key), fmt::format("must be in [{}, {}], got {}", lo, hi, out));
    }
  }
  void boolean(const std::string& key, bool& out) { scalar(key, out, "true or false"); }
  void string(const std::string& key, std::string& out) {
    scalar(key, out, "a string");
    // Strings end up in summary.json and file names: JSON needs UTF-8, folders need no NUL.
    if (!valid_utf8(out) || out.find('\0') != std::string::npos)
      fail(key, node(key), "must be UTF-8 text without NUL bytes");
  }

  template <class E>
  void choice(const std::string& key, E& out, const EnumTable<E>& table) {
    YAML::Node n = take(key);
    if (!n) return;
    if (n.IsScalar()) {
      for (const auto& [name, value] : table) {
        if (n.Scalar() == name) {
          out = value;
          return;
        }
      }
    }
    fail(key, n, fmt::format("expected one of {}, got {}", enum_choices(table), show(n)));
  }

  void int_list(const std::string& key, std::vector<int64_t>& out, int64_t lo) {
    YAML::Node n = take(key);
    if (!n) return;
    if (!n.IsSequence()) fail(key, n, fmt::format("expected a list of integers, got {}", show(n)));
    std::vector<int64_t> v;
    for (const auto& e : n) {
      int64_t x = 0;
      try {
        x = e.as<int64_t>();
      } catch (const YAML::Exception&) {
        fail(key, n, fmt::format("expected a list of integers, found {}", show(e)));
      }
      if (x < lo) fail(key, n, fmt::format("every entry must be >= {}, found {}", lo, x));
      v.push_back(x);
    }
    out = std::move(v);
  }

  MapReader section(const std::string& key) {
    YAML::Node n = take(key);
    if (n && !n.IsNull() && !n.IsMap())
      fail(key, n, fmt::format("expected a mapping of keys, got {}", show(n)));
    return MapReader(n && n.IsMap() ? n : YAML::Node(), full(key), src_);
  }

  // Every key present must have been taken.
  void finish() const {
    if (!node_ || !node_.IsMap()) return;
    std::vector<std::string> valid(seen_.begin(), seen_.end());
    for (const auto& kv : node_) {
      const auto key = kv.first.as<std::string>();
      if (seen_.count(key)) continue;
      const auto guess = closest_match(key, valid);
      std::string valid_list;
      for (const auto& v : valid) valid_list += (valid_list.empty() ? "" : ", ") + v;
      const std::string hint = guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess);
      const auto* ov = override_for(key);
      const std::string loc = ov ? fmt::format("override '{}'", *ov)
                              : kv.first.Mark().is_null()
                                  ? src_.file
                                  : fmt::format("{}:{}", src_.file, kv.first.Mark().line + 1);
      throw UserError(fmt::format("{}: unknown key '{}'{}; valid keys{}: {}", loc, full(key), hint,
                                  prefix_.empty() ? "" : " in '" + prefix_ + "'", valid_list));
    }
  }

  void check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) {
      if (hi == INT64_MAX || hi == INT32_MAX)
        fail(key, node(key), fmt::format("must be >= {}, got {}", lo, v));
      fail(key, node(key), fmt::format("must be in [{}, {}], got {}", lo, hi, v));
    }
  }

 private:
  YAML::Node node_;
  std::string prefix_;
  const Source& src_;
  std::set<std::string> seen_;
};

void apply_override(YAML::Node& root, const Override& ov) {
  YAML::Node value;
  try {
    value = YAML::Load(ov.value);
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("override '{}': value is not valid YAML: {}", ov.text(), e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(ov.key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  YAML::Node cur = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    if (!next || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[parts[i]];
    } else if (!next.IsMap()) {
      throw UserError(fmt::format("override '{}': '{}' is not a section", ov.text(), parts[i]));
    }
    cur.reset(next);  // rebind, not assign: assignment would overwrite the parent's value
  }
  cur[parts.back()] = value;
}

// One layer: either a bare name ("relu") or a one-key mapping ({conv: {channels: 32}}).
LayerSpec decode_layer(const YAML::Node& n, const std::string& where, const Source& src) {
  LayerSpec l;
  std::string name;
  YAML::Node params;
  if (n.IsScalar()) {
    name = n.Scalar();
  } else if (n.IsMap() && n.size() == 1) {
    name = n.begin()->first.as<std::string>();
    params = n.begin()->second;
  } else {
    throw UserError(
        fmt::format("{}:{}: {}: expected a layer name or a one-key mapping such as "
                    "{{conv: {{channels: 32}}}}",
                    src.file, n.Mark().line + 1, where));
  }
  bool found = false;
  for (const auto& [k, v] : kLayerTypes)
    if (name == k) {
      l.type = v;
      found = true;
    }
  if (!found) {
    std::vector<std::string> names;
    for (const auto& [k, v] : kLayerTypes) names.push_back(k);
    const auto guess = closest_match(name, names);
    throw UserError(fmt::format("{}:{}: {}: unknown layer '{}'{}; valid: {}", src.file,
                                n.Mark().line + 1, where, name,
                                guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
                                enum_choices(kLayerTypes)));
  }
  MapReader r(params && params.IsMap() ? params : YAML::Node(YAML::NodeType::Undefined),
              where + "." + name, src);
  if (params && !params.IsNull() && !params.IsMap())
    throw UserError(fmt::format("{}:{}: {}.{}: expected a mapping of parameters", src.file,
                                n.Mark().line + 1, where, name));
  switch (l.type) {
    case LayerType::dense:
      r.integer("units", l.units, 1);
      break;
    case LayerType::conv:
      r.integer("channels", l.channels, 1);
      r.integer("kernel", l.kernel, 1, 64);
      r.integer("stride", l.stride, 0, 64);
      r.integer("padding", l.padding, 0, 64);
      break;
    case LayerType::maxpool:
      l.kernel = 2;
      r.integer("size", l.kernel, 1, 64);
      r.integer("stride", l.stride, 0, 64);
      break;
    case LayerType::dropout:
      r.number("p", l.p, 0.0, 0.99);
      break;
    default:
      break;
  }
  r.finish();
  if (l.type == LayerType::dense && l.units == 0)
    throw UserError(
        fmt::format("{}: {}: dense needs units, e.g. {{dense: {{units: 128}}}}", src.file, where));
  if (l.type == LayerType::conv && l.channels == 0)
    throw UserError(fmt::format("{}: {}: conv needs channels, e.g. {{conv: {{channels: 32}}}}",
                                src.file, where));
  return l;
}

Config decode(const YAML::Node& root, const Source& src) {
  Config c;
  if (root && !root.IsNull() && !root.IsMap())
    throw UserError(fmt::format("{}: expected a mapping of keys at the top level", src.file));
  MapReader top(root, "", src);
  top.string("name", c.name);
  // The name is a folder: visible (report skips hidden ones), short enough for a file system.
  if (c.name.empty() || c.name.find('/') != std::string::npos || c.name.front() == '.' ||
      c.name.size() > 200)
    top.fail("name", top.node("name"),
             "must be a folder name of 1 to 200 bytes without '/', not starting with '.'");
  top.choice("backend", c.backend, kBackends);
  top.choice("precision", c.precision, kPrecisions);
  if (c.precision == Precision::tf32 && c.backend == Backend::cpu)
    top.fail("precision", top.node("precision"),
             "the CPU backend has no TF32; tf32 needs backend: cuda or auto (fp32 and bf16, "
             "emulated, run on the CPU)");
  top.integer("gpus", c.gpus, 1, 4096);
  top.integer("threads", c.threads, 0, 4096);
  top.int_list("devices", c.devices, 0);
  top.boolean("colocate", c.colocate);

  {
    auto d = top.section("data");
    d.choice("dataset", c.data.dataset, kDatasets);
    d.string("path", c.data.path);
    d.choice("shuffle", c.data.shuffle, kShuffles);
    d.choice("sharding", c.data.sharding, kShardings);
    d.boolean("drop_remainder", c.data.drop_remainder);
    d.boolean("sort_by_label", c.data.sort_by_label);
    d.boolean("normalize", c.data.normalize);
    d.integer("train_limit", c.data.train_limit, 0);
    d.integer("test_limit", c.data.test_limit, 0);
    auto s = d.section("synthetic");
    s.integer("train_size", c.data.synthetic.train_size, 1);
    s.integer("test_size", c.data.synthetic.test_size, 1);
    s.int_list("shape", c.data.synthetic.shape, 1);
    s.integer("classes", c.data.synthetic.classes, 2, 100000);
    s.number("noise", c.data.synthetic.noise, 0.0, 1e6);
    s.finish();
    auto a = d.section("augment");
    a.integer("crop_padding", c.data.augment.crop_padding, 0, 64);
    a.boolean("flip", c.data.augment.flip);
    a.finish();
    d.finish();
  }
  {
    auto m = top.section("model");
    m.choice("type", c.model.type, kModelTypes);
    m.int_list("hidden", c.model.hidden, 1);
    m.choice("activation", c.model.activation, kActivations);
    m.choice("batchnorm", c.model.batchnorm, kBatchNormModes);
    m.number("dropout", c.model.dropout, 0.0, 0.99);
    const YAML::Node layers = m.take("layers");
    if (layers && !layers.IsNull()) {
      if (!layers.IsSequence())
        m.fail("layers", layers, "expected a list of layers, e.g. [{conv: {channels: 32}}, relu]");
      for (size_t i = 0; i < layers.size(); ++i)
        c.model.layers.push_back(decode_layer(layers[i], fmt::format("model.layers[{}]", i), src));
    }
    if (c.model.type == ModelType::layers && c.model.layers.empty())
      m.fail("layers", m.node("layers"), "type: layers needs a non-empty list of layers");
    m.finish();
  }
  {
    auto t = top.section("train");
    t.integer("epochs", c.train.epochs, 1, 100000);
    t.optional_integer("per_replica_batch", c.train.per_replica_batch, 1);
    t.optional_integer("global_batch", c.train.global_batch, 1);
    t.choice("reduction", c.train.reduction, kReductions);
    t.integer("accumulation_steps", c.train.accumulation_steps, 1, 1 << 20);
    int64_t seed = static_cast<int64_t>(c.train.seed);
    t.integer("seed", seed, 0);
    c.train.seed = static_cast<uint64_t>(seed);
    t.number("target_accuracy", c.train.target_accuracy, 0.0, 1.0);
    t.integer("eval_batch", c.train.eval_batch, 1);
    t.number("collective_timeout_s", c.train.collective_timeout_s, 1.0, 1e7);
    t.number("bucket_mb", c.train.bucket_mb, 0.0, 1e6);
    t.boolean("cuda_graph", c.train.cuda_graph);
    t.finish();
    if (c.train.per_replica_batch && c.train.global_batch)
      throw UserError(fmt::format(
          "{}: train: give exactly one of per_replica_batch and global_batch, not both", src.file));
  }
  {
    auto o = top.section("optimizer");
    o.choice("type", c.optimizer.type, kOptimizers);
    o.number("lr", c.optimizer.lr, 0.0, 1e6);
    o.integer("base_batch", c.optimizer.base_batch, 1);
    o.number("momentum", c.optimizer.momentum, 0.0, 0.999999);
    o.boolean("nesterov", c.optimizer.nesterov);
    o.number("weight_decay", c.optimizer.weight_decay, 0.0, 10.0);
    o.number("beta1", c.optimizer.beta1, 0.0, 0.999999);
    o.number("beta2", c.optimizer.beta2, 0.0, 0.99999999);
    o.number("eps", c.optimizer.eps, 0.0, 1.0);
    o.choice("lr_scaling", c.optimizer.lr_scaling, kScalings);
    o.number("warmup_epochs", c.optimizer.warmup_epochs, 0.0, 1e6);
    o.choice("schedule", c.optimizer.schedule, kSchedules);
    o.number("step_size", c.optimizer.step_size, 1e-9, 1e6);
    o.number("gamma", c.optimizer.gamma, 0.0, 1.0);
    o.number("min_lr", c.optimizer.min_lr, 0.0, 1e6);
    o.finish();
  }
  top.finish();

  // Cross-field rules. Products of user numbers are checked: none may wrap around.
  constexpr int64_t kMaxBatch = int64_t{1} << 31;
  const auto product = [&](const std::vector<int64_t>& factors, const std::string& what) {
    const int64_t p = bounded_product(factors, kMaxBatch);
    if (p < 0)
      throw UserError(fmt::format("{}: {} is over {}; use smaller values", src.file, what,
                                  kMaxBatch));
    return p;
  };
  const int64_t split = product({c.gpus, c.train.accumulation_steps},
                                "gpus x train.accumulation_steps");
  if (c.train.per_replica_batch)
    product({*c.train.per_replica_batch, c.gpus, c.train.accumulation_steps},
            fmt::format("the global batch (train.per_replica_batch={} x gpus={} x "
                        "accumulation_steps={})",
                        *c.train.per_replica_batch, c.gpus, c.train.accumulation_steps));
  if (c.data.dataset == DatasetKind::synthetic) {
    if (bounded_product(c.data.synthetic.shape, int64_t{1} << 28) < 0)
      throw UserError(fmt::format("{}: data.synthetic.shape: {} features in all is over {}",
                                  src.file, fmt::join(c.data.synthetic.shape, " x "),
                                  int64_t{1} << 28));
  }
  if (c.train.global_batch && *c.train.global_batch % split != 0) {
    const int64_t g = *c.train.global_batch;
    const int64_t lo = std::max<int64_t>(split, g / split * split);
    throw UserError(fmt::format(
        "{}: train.global_batch={} cannot be split evenly across gpus={} x accumulation_steps={}; "
        "use a multiple of {} (e.g. {} or {}), or give train.per_replica_batch instead",
        src.file, g, c.gpus, c.train.accumulation_steps, split, lo, lo + split));
  }
  if (c.optimizer.warmup_epochs > c.train.epochs)
    throw UserError(fmt::format("{}: optimizer.warmup_epochs={} exceeds train.epochs={}", src.file,
                                c.optimizer.warmup_epochs, c.train.epochs));
  return c;
}

}  // namespace

int64_t Config::micro_batch() const {
  const int64_t split = int64_t{gpus} * train.accumulation_steps;
  if (train.global_batch) return *train.global_batch / split;
  return train.per_replica_batch.value_or(64);
}

int64_t Config::global_batch() const {
  return micro_batch() * int64_t{gpus} * train.accumulation_steps;  // validated not to overflow
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the word, and at least one edit allowed.
  if (best_d <= std::max<size_t>(2, word.size() / 3)) return best;
  return "";
}

Override parse_override(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError(
        fmt::format("override '{}': expected key=value, e.g. gpus=4 or optimizer.lr=0.1", text));
  Override o{text.substr(0, eq), text.substr(eq + 1)};
  for (char ch : o.key) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'))
      throw UserError(
          fmt::format("override '{}': key '{}' may contain only letters, digits, '_' "
                      "and '.'",
                      text, o.key));
  }
  if (o.key.front() == '.' || o.key.back() == '.' || o.key.find("..") != std::string::npos)
    throw UserError(fmt::format("override '{}': malformed key '{}'", text, o.key));
  return o;
}

namespace {
// Notes whether a YAML document holds anything but null.
struct DocumentContent : YAML::EventHandler {
  bool content = false;
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { content = true; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    content = true;
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    content = true;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    content = true;
  }
  void OnMapEnd() override {}
};

// yaml-cpp reads a double quote left open at the end of a file as a string that runs to the
// end of the file. A double-quoted scalar must find its closing quote in the text.
void check_quote_closed(const YAML::Node& scalar, const std::string& text,
                        const std::string& source_name) {
  const auto pos = static_cast<size_t>(std::max(0, scalar.Mark().pos));
  if (scalar.Mark().is_null() || pos >= text.size() || text[pos] != '"') return;
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\') ++i;
    else if (text[i] == '"') return;
  }
  throw UserError(fmt::format("{}:{}: a quoted string is not closed before the end of the file",
                              source_name, scalar.Mark().line + 1));
}

// One walk over the parsed tree: bounded depth, every key of every mapping a plain name (YAML's
// complex keys, `? [a, b]: 1`, have no meaning in a config), every quoted string closed.
void check_tree(const YAML::Node& n, const std::string& text, const std::string& source_name,
                int depth = 0) {
  if (depth > 64)
    throw UserError(fmt::format("{}:{}: nested more than 64 levels deep", source_name,
                                n.Mark().line + 1));
  if (n.IsMap()) {
    for (const auto& kv : n) {
      if (!kv.first.IsScalar())
        throw UserError(fmt::format("{}:{}: a key must be a plain name, not a {}", source_name,
                                    kv.first.Mark().line + 1,
                                    kv.first.IsMap() ? "mapping" : "list or null"));
      check_quote_closed(kv.first, text, source_name);
      check_tree(kv.second, text, source_name, depth + 1);
    }
  } else if (n.IsSequence()) {
    for (const auto& v : n) check_tree(v, text, source_name, depth + 1);
  } else if (n.IsScalar()) {
    check_quote_closed(n, text, source_name);
  }
}
}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<Override>& overrides) {
  YAML::Node root;
  try {
    // At most two documents are looked at: yaml-cpp's LoadAll loops forever on some malformed
    // input (found by fuzzing), and a second document is all that needs finding.
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    DocumentContent first, second;
    parser.HandleNextDocument(first);
    if (parser.HandleNextDocument(second) && second.content)
      throw UserError(fmt::format("{}: holds more than one YAML document (separated by '---'); "
                                  "a config is one document",
                                  source_name));
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("{}:{}: malformed YAML: {}", source_name, e.mark.line + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("{}: malformed YAML: {}", source_name, e.msg));
  }
  check_tree(root, yaml_text, source_name);
  if (!root || root.IsNull())
    log().warn("{} holds no settings: every value not overridden is a default", source_name);
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  Source src{source_name, {}};
  for (const auto& ov : overrides) {
    if (!root.IsMap())
      throw UserError(fmt::format("{}: expected a mapping of keys at the top level", source_name));
    apply_override(root, ov);
    src.overrides[ov.key] = ov.text();
  }
  return decode(root, src);
}

Config load_config(const std::string& path, const std::vector<Override>& overrides) {
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("{}: cannot open config file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << c.name;
  e << YAML::Key << "backend" << YAML::Value << to_string(c.backend);
  e << YAML::Key << "gpus" << YAML::Value << c.gpus;
  e << YAML::Key << "threads" << YAML::Value << c.threads;
  e << YAML::Key << "devices" << YAML::Value << YAML::Flow << c.devices;
  e << YAML::Key << "colocate" << YAML::Value << c.colocate;
  e << YAML::Key << "precision" << YAML::Value << to_string(c.precision);

  e << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "dataset" << YAML::Value << to_string(c.data.dataset);
  e << YAML::Key << "path" << YAML::Value << c.data.path;
  e << YAML::Key << "shuffle" << YAML::Value << to_string(c.data.shuffle);
  e << YAML::Key << "sharding" << YAML::Value << to_string(c.data.sharding);
  e << YAML::Key << "drop_remainder" << YAML::Value << c.data.drop_remainder;
  e << YAML::Key << "sort_by_label" << YAML::Value << c.data.sort_by_label;
  e << YAML::Key << "normalize" << YAML::Value << c.data.normalize;
  e << YAML::Key << "train_limit" << YAML::Value << c.data.train_limit;
  e << YAML::Key << "test_limit" << YAML::Value << c.data.test_limit;
  e << YAML::Key << "synthetic" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "train_size" << YAML::Value << c.data.synthetic.train_size;
  e << YAML::Key << "test_size" << YAML::Value << c.data.synthetic.test_size;
  e << YAML::Key << "shape" << YAML::Value << YAML::Flow << c.data.synthetic.shape;
  e << YAML::Key << "classes" << YAML::Value << c.data.synthetic.classes;
  e << YAML::Key << "noise" << YAML::Value << c.data.synthetic.noise;
  e << YAML::EndMap;
  e << YAML::Key << "augment" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "crop_padding" << YAML::Value << c.data.augment.crop_padding;
  e << YAML::Key << "flip" << YAML::Value << c.data.augment.flip;
  e << YAML::EndMap << YAML::EndMap;

  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "type" << YAML::Value << to_string(c.model.type);
  e << YAML::Key << "hidden" << YAML::Value << YAML::Flow << c.model.hidden;
  e << YAML::Key << "activation" << YAML::Value << to_string(c.model.activation);
  e << YAML::Key << "batchnorm" << YAML::Value << to_string(c.model.batchnorm);
  e << YAML::Key << "dropout" << YAML::Value << c.model.dropout;
  if (!c.model.layers.empty()) {
    e << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const auto& l : c.model.layers) {
      e << YAML::Flow << YAML::BeginMap << YAML::Key << to_string(l.type) << YAML::Value
        << YAML::BeginMap;
      switch (l.type) {
        case LayerType::dense:
          e << YAML::Key << "units" << YAML::Value << l.units;
          break;
        case LayerType::conv:
          e << YAML::Key << "channels" << YAML::Value << l.channels << YAML::Key << "kernel"
            << YAML::Value << l.kernel << YAML::Key << "stride" << YAML::Value << l.stride
            << YAML::Key << "padding" << YAML::Value << l.padding;
          break;
        case LayerType::maxpool:
          e << YAML::Key << "size" << YAML::Value << l.kernel << YAML::Key << "stride"
            << YAML::Value << l.stride;
          break;
        case LayerType::dropout:
          e << YAML::Key << "p" << YAML::Value << l.p;
          break;
        default:
          break;
      }
      e << YAML::EndMap << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  e << YAML::EndMap;

  e << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "epochs" << YAML::Value << c.train.epochs;
  // Both batch sizes are resolved; only the one that defines the run is written as a key.
  if (c.train.global_batch)
    e << YAML::Key << "global_batch" << YAML::Value << *c.train.global_batch;
  else
    e << YAML::Key << "per_replica_batch" << YAML::Value << c.micro_batch();
  e << YAML::Comment(fmt::format("per-replica micro-batch {}, global batch {}", c.micro_batch(),
                                 c.global_batch()));
  e << YAML::Key << "reduction" << YAML::Value << to_string(c.train.reduction);
  e << YAML::Key << "accumulation_steps" << YAML::Value << c.train.accumulation_steps;
  e << YAML::Key << "seed" << YAML::Value << c.train.seed;
  e << YAML::Key << "target_accuracy" << YAML::Value << c.train.target_accuracy;
  e << YAML::Key << "eval_batch" << YAML::Value << c.train.eval_batch;
  e << YAML::Key << "collective_timeout_s" << YAML::Value << c.train.collective_timeout_s;
  e << YAML::Key << "bucket_mb" << YAML::Value << c.train.bucket_mb;
  e << YAML::Key << "cuda_graph" << YAML::Value << c.train.cuda_graph;
  e << YAML::EndMap;

  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "type" << YAML::Value << to_string(c.optimizer.type);
  e << YAML::Key << "lr" << YAML::Value << c.optimizer.lr;
  e << YAML::Key << "base_batch" << YAML::Value << c.optimizer.base_batch;
  e << YAML::Key << "momentum" << YAML::Value << c.optimizer.momentum;
  e << YAML::Key << "nesterov" << YAML::Value << c.optimizer.nesterov;
  e << YAML::Key << "weight_decay" << YAML::Value << c.optimizer.weight_decay;
  e << YAML::Key << "beta1" << YAML::Value << c.optimizer.beta1;
  e << YAML::Key << "beta2" << YAML::Value << c.optimizer.beta2;
  e << YAML::Key << "eps" << YAML::Value << c.optimizer.eps;
  e << YAML::Key << "lr_scaling" << YAML::Value << to_string(c.optimizer.lr_scaling);
  e << YAML::Key << "warmup_epochs" << YAML::Value << c.optimizer.warmup_epochs;
  e << YAML::Key << "schedule" << YAML::Value << to_string(c.optimizer.schedule);
  e << YAML::Key << "step_size" << YAML::Value << c.optimizer.step_size;
  e << YAML::Key << "gamma" << YAML::Value << c.optimizer.gamma;
  e << YAML::Key << "min_lr" << YAML::Value << c.optimizer.min_lr;
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

const char* to_string(Backend v) {
  return enum_name(kBackends, v);
}
const char* to_string(Precision v) {
  return enum_name(kPrecisions, v);
}
const char* to_string(DatasetKind v) {
  return enum_name(kDatasets, v);
}
const char* to_string(Shuffle v) {
  return enum_name(kShuffles, v);
}
const char* to_string(Sharding v) {
  return enum_name(kShardings, v);
}
const char* to_string(Activation v) {
  return enum_name(kActivations, v);
}
const char* to_string(Reduction v) {
  return enum_name(kReductions, v);
}
const char* to_string(OptimizerType v) {
  return enum_name(kOptimizers, v);
}
const char* to_string(LrScaling v) {
  return enum_name(kScalings, v);
}
const char* to_string(Schedule v) {
  return enum_name(kSchedules, v);
}
const char* to_string(ModelType v) {
  return enum_name(kModelTypes, v);
}
const char* to_string(BatchNormMode v) {
  return enum_name(kBatchNormModes, v);
}
const char* to_string(LayerType v) {
  return enum_name(kLayerTypes, v);
}

}  // namespace dtrain
