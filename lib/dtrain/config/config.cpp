#include "dtrain/config/config.hpp"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/hash.hpp"
#include "dtrain/base/log.hpp"
#include "dtrain/config/schema.hpp"

namespace dtrain {

namespace {
// Well-formed UTF-8: no stray continuation bytes, no overlong forms, no surrogates.
bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
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

LayerSpec decode_layer(const YAML::Node& n, const std::string& where, const std::string& place,
                       const Source& src);

// The decoder: a schema visitor that reads one YAML mapping, remembers which keys were
// consumed, and rejects the rest.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string prefix, const Source& src)
      : node_(node), prefix_(std::move(prefix)), src_(src) {}

  template <class T>
  void operator()(const Key& k, T& out) {
    if constexpr (std::is_same_v<T, std::string>) {
      text(k, out);
    } else if constexpr (std::is_same_v<T, bool>) {
      scalar(k.name, out, "true or false");
    } else if constexpr (std::is_enum_v<T>) {
      choice(k.name, out, choices(T{}));
    } else if constexpr (std::is_integral_v<T>) {
      integer(k, out);
    } else if constexpr (std::is_floating_point_v<T>) {
      number(k.name, out, k.min, k.max);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      int_list(k.name, out, k.lo, k.hi);
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      number_list(k, out);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      text_list(k, out);
    } else {
      static_assert(std::is_same_v<T, std::vector<LayerSpec>>, "no decoder for this key's type");
      layers(k.name, out);
    }
  }

  template <class S>
  void section(const Key& k, S& s) {
    YAML::Node n = take(k.name);
    if (n && !n.IsNull() && !n.IsMap())
      fail(k.name, n, fmt::format("expected a mapping of keys, got {}", show(n)));
    MapReader r = at(k.name);
    visit(s, r);
    r.finish();
  }

  // A null value leaves a key unset (its default stands), so an override can clear the key a
  // config file gave: `train.global_batch=96 train.per_replica_batch=null`.
  void either(const Key& a, int64_t& first, const Key& b, std::optional<int64_t>& second) {
    seen_.insert(a.name);
    seen_.insert(b.name);
    if (given(a.name)) (*this)(a, first);
    if (given(b.name)) {
      int64_t v = 0;
      (*this)(b, v);
      second = v;
    }
    if (given(a.name) && given(b.name))
      throw UserError(fmt::format("{}: {}: give exactly one of {} and {}, not both", src_.file,
                                  prefix_, a.name, b.name));
  }

  std::string full(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  // The reader of the mapping at `key` (an empty one where there is none), without taking it.
  MapReader at(const std::string& key) const {
    const YAML::Node n = node(key);
    return MapReader(n && n.IsMap() ? n : YAML::Node(), full(key), src_);
  }

  // Read-only lookup: a const operator[] never inserts into the mapping.
  YAML::Node node(const std::string& key) const {
    if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cn = node_;
    return cn[key];
  }

  [[noreturn]] void fail(const std::string& key, const YAML::Node& n,
                         const std::string& msg) const {
    throw UserError(fmt::format("{}: {}: {}", where(key, n), full(key), msg));
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
      const std::string hint =
          key == "<<" ? " (a YAML merge key: dtrain does not merge maps; write the keys out)"
          : guess.empty() ? ""
                          : fmt::format(" (did you mean '{}'?)", guess);
      const auto* ov = override_for(key);
      const std::string loc = ov ? fmt::format("override '{}'", *ov)
                              : kv.first.Mark().is_null()
                                  ? src_.file
                                  : fmt::format("{}:{}", src_.file, kv.first.Mark().line + 1);
      throw UserError(fmt::format("{}: unknown key '{}'{}; valid keys{}: {}", loc, full(key), hint,
                                  prefix_.empty() ? "" : " in '" + prefix_ + "'", valid_list));
    }
  }

 private:
  // The override that set `key`, a key below it or one above it (a mapping or a list given
  // whole, e.g. model.layers=[...]), if any.
  const std::string* override_for(const std::string& key) const {
    const std::string f = full(key);
    for (const auto& [k, text] : src_.overrides)
      if (k == f || k.rfind(f + ".", 0) == 0 || f.rfind(k + ".", 0) == 0 ||
          f.rfind(k + "[", 0) == 0)
        return &text;
    return nullptr;
  }

  std::string where(const std::string& key, const YAML::Node& n) const {
    if (const auto* ov = override_for(key)) return fmt::format("override '{}'", *ov);
    if (n && !n.Mark().is_null()) return fmt::format("{}:{}", src_.file, n.Mark().line + 1);
    return src_.file;
  }

  static std::string show(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
  }

  bool given(const std::string& key) const {
    const YAML::Node n = node(key);
    return n && !n.IsNull();
  }

  // Returns the node for `key` (marking it used), or an undefined node.
  YAML::Node take(const std::string& key) {
    seen_.insert(key);
    return node(key);
  }

  template <class T>
  void scalar(const std::string& key, T& out, const char* type_name) {
    YAML::Node n = take(key);
    if (!n) return;
    if (!n.IsScalar()) fail(key, n, fmt::format("expected {}, got {}", type_name, show(n)));
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      if (!decimal(n.Scalar()))
        fail(key, n,
             fmt::format("expected {}, got {}{}", type_name, show(n), octal_note(n.Scalar())));
    if constexpr (std::is_floating_point_v<T>)
      if (const char* why = beyond_double(n.Scalar()))
        fail(key, n, fmt::format("{} {}", show(n), why));
    try {
      out = n.as<T>();
    } catch (const YAML::Exception&) {
      fail(key, n, fmt::format("expected {}, got {}", type_name, show(n)));
    }
  }

  // Why a number as written has no double, or nullptr: yaml-cpp reads 1e309 as no number at all
  // and 1e-400 as 0, which would train with an LR of 0 without a word.
  static const char* beyond_double(const std::string& t) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(t.c_str(), &end);
    if (errno != ERANGE || end != t.c_str() + t.size()) return nullptr;
    if (std::abs(v) > 1) return "is out of range (a number is at most 1.8e308 in size)";
    return "is too small for a number (the smallest is 2.2e-308; write 0 for zero)";
  }

  // yaml-cpp reads 010 as octal 8 and 0x10 as 16: an integer here is decimal digits with an
  // optional sign and no leading zero, so what is written is what is meant.
  static size_t sign_length(const std::string& t) {
    return !t.empty() && (t[0] == '-' || t[0] == '+') ? 1 : 0;
  }
  static bool decimal(const std::string& t) {
    const size_t d = sign_length(t);
    if (d >= t.size() || (t[d] == '0' && t.size() > d + 1)) return false;
    return std::all_of(t.begin() + static_cast<std::ptrdiff_t>(d), t.end(),
                       [](char c) { return c >= '0' && c <= '9'; });
  }
  static std::string octal_note(const std::string& t) {
    const size_t d = sign_length(t);
    return t.size() > d + 1 && t[d] == '0'
               ? " (no leading zero: YAML may read 010 as octal 8 and 0x10 as 16)"
               : "";
  }

  // Any integer member; its own type bounds the range (an int key cannot take 2^31).
  template <class I>
  void integer(const Key& k, I& out) {
    int64_t hi = k.hi;
    if constexpr (sizeof(I) < sizeof(int64_t))
      hi = std::min<int64_t>(hi, std::numeric_limits<I>::max());
    auto v = static_cast<int64_t>(out);
    if (!node(k.name)) {
      seen_.insert(k.name);  // absent: the default stands
      return;
    }
    // Digits past 64 bits: the key's range, not "expected an integer".
    if (const YAML::Node n = node(k.name); n.IsScalar() && decimal(n.Scalar())) {
      errno = 0;
      std::strtoll(n.Scalar().c_str(), nullptr, 10);
      if (errno == ERANGE) fail(k.name, n, range_words(k.lo, hi, n.Scalar(), n.Scalar()[0] != '-'));
    }
    scalar(k.name, v, "an integer");
    check_range(k.name, v, k.lo, hi);
    out = static_cast<I>(v);
  }

  // What a key takes, for a value `got` outside it (`above`: past its top).
  static std::string range_words(int64_t lo, int64_t hi, const std::string& got, bool above) {
    if (hi != INT64_MAX && hi != INT32_MAX)
      return fmt::format("must be in [{}, {}], got {}", lo, hi, got);
    if (above) return fmt::format("must be at most {}, got {}", hi, got);
    return fmt::format("must be >= {}, got {}", lo, got);
  }

  void check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail(key, node(key), range_words(lo, hi, std::to_string(v), v > hi));
  }

  void number(const std::string& key, double& out, double lo, double hi) {
    scalar(key, out, "a number");
    if (!(out >= lo && out <= hi)) {
      fail(key, node(key), fmt::format("must be in [{}, {}], got {}", lo, hi, out));
    }
  }

  void text(const Key& k, std::string& out) {
    scalar(k.name, out, "a string");
    // Strings end up in summary.json and file names: JSON needs UTF-8, folders need no NUL.
    if (!valid_utf8(out) || out.find('\0') != std::string::npos)
      fail(k.name, node(k.name), "must be UTF-8 text without NUL bytes");
    if (k.rule)
      if (const char* why = k.rule(out)) fail(k.name, node(k.name), why);
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

  void int_list(const std::string& key, std::vector<int64_t>& out, int64_t lo, int64_t hi) {
    YAML::Node n = take(key);
    if (!n) return;
    if (!n.IsSequence()) fail(key, n, fmt::format("expected a list of integers, got {}", show(n)));
    std::vector<int64_t> v;
    for (const auto& e : n) {
      int64_t x = 0;
      if (e.IsScalar() && !decimal(e.Scalar()))
        fail(key, n,
             fmt::format("expected a list of integers, found {}{}", show(e),
                         octal_note(e.Scalar())));
      try {
        x = e.as<int64_t>();
      } catch (const YAML::Exception&) {
        fail(key, n, fmt::format("expected a list of integers, found {}", show(e)));
      }
      if (x < lo && hi == std::numeric_limits<int64_t>::max())
        fail(key, n, fmt::format("every entry must be >= {}, found {}", lo, x));
      if (x < lo || x > hi)
        fail(key, n, fmt::format("every entry must be in [{}, {}], found {}", lo, hi, x));
      v.push_back(x);
    }
    out = std::move(v);
  }

  void number_list(const Key& k, std::vector<double>& out) {
    YAML::Node n = take(k.name);
    if (!n || n.IsNull()) return;
    if (!n.IsSequence())
      fail(k.name, n, fmt::format("expected a list of numbers, got {}", show(n)));
    std::vector<double> v;
    for (const auto& e : n) {
      double x = 0;
      if (const char* why = e.IsScalar() ? beyond_double(e.Scalar()) : nullptr)
        fail(k.name, n, fmt::format("{} {}", show(e), why));
      try {
        x = e.as<double>();
      } catch (const YAML::Exception&) {
        fail(k.name, n, fmt::format("expected a list of numbers, found {}", show(e)));
      }
      if (!(x >= k.min && x <= k.max))
        fail(k.name, n, fmt::format("every entry must be in [{}, {}], found {}", k.min, k.max, x));
      v.push_back(x);
    }
    out = std::move(v);
  }

  void text_list(const Key& k, std::vector<std::string>& out) {
    YAML::Node n = take(k.name);
    if (!n || n.IsNull()) return;
    if (!n.IsSequence())
      fail(k.name, n, fmt::format("expected a list of strings, got {}", show(n)));
    std::vector<std::string> v;
    for (const auto& e : n) {
      if (!e.IsScalar())
        fail(k.name, n, fmt::format("expected a list of strings, found {}", show(e)));
      const std::string& x = e.Scalar();
      if (!valid_utf8(x) || x.find('\0') != std::string::npos)
        fail(k.name, n, "every entry must be UTF-8 text without NUL bytes");
      if (k.rule)
        if (const char* why = k.rule(x)) fail(k.name, n, why);
      v.push_back(x);
    }
    out = std::move(v);
  }

  void layers(const std::string& key, std::vector<LayerSpec>& out) {
    const YAML::Node n = take(key);
    if (!n || n.IsNull()) return;
    if (!n.IsSequence())
      fail(key, n, "expected a list of layers, e.g. [{conv: {channels: 32}}, relu]");
    out.clear();
    for (size_t i = 0; i < n.size(); ++i)
      out.push_back(
          decode_layer(n[i], fmt::format("{}[{}]", full(key), i), where(key, n[i]), src_));
  }

  YAML::Node node_;
  std::string prefix_;
  const Source& src_;
  std::set<std::string> seen_;
};

// yaml-cpp reads a double quote left open at the end of a file as a string that runs to the
// end of the file. A double-quoted scalar must find its closing quote in the text.
void check_quote_closed(const YAML::Node& scalar, const std::string& text,
                        const std::string& source_name) {
  const auto pos = static_cast<size_t>(std::max(0, scalar.Mark().pos));
  if (scalar.Mark().is_null() || pos >= text.size() || text[pos] != '"') return;
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\')
      ++i;
    else if (text[i] == '"')
      return;
  }
  throw UserError(fmt::format("{}:{}: a quoted string is not closed before the end of the file",
                              source_name, scalar.Mark().line + 1));
}

// One walk over the parsed tree: bounded depth, every key of every mapping a plain name (YAML's
// complex keys, `? [a, b]: 1`, have no meaning in a config), every quoted string closed.
struct TreeWalk {
  const std::string& text;
  const std::string& source_name;
  int64_t nodes = 0;
};

// Aliases let a few hundred bytes stand for billions of values ("billion laughs"); a config
// has a few dozen, so the walk stops long before that.
constexpr int64_t kMaxConfigNodes = 100000;

void check_tree(const YAML::Node& n, TreeWalk& w, int depth = 0) {
  if (depth > kMaxConfigDepth)
    throw UserError(fmt::format("{}:{}: nested more than {} levels deep", w.source_name,
                                n.Mark().line + 1, kMaxConfigDepth));
  if (++w.nodes > kMaxConfigNodes)
    throw UserError(fmt::format(
        "{}: holds more than {} values (counting what its aliases repeat); a config has a few "
        "dozen",
        w.source_name, kMaxConfigNodes));
  if (n.IsMap()) {
    std::map<std::string, int> seen;  // key -> line
    for (const auto& kv : n) {
      if (!kv.first.IsScalar())
        throw UserError(fmt::format("{}:{}: a key must be a plain name, not a {}", w.source_name,
                                    kv.first.Mark().line + 1,
                                    kv.first.IsMap() ? "mapping" : "list or null"));
      check_quote_closed(kv.first, w.text, w.source_name);
      const int line = kv.first.Mark().line + 1;
      const auto [at, fresh] = seen.emplace(kv.first.Scalar(), line);
      if (!fresh)
        throw UserError(
            fmt::format("{}:{}: duplicate key '{}' (first given on line {}); give "
                        "each key once",
                        w.source_name, line, kv.first.Scalar(), at->second));
      check_tree(kv.second, w, depth + 1);
    }
  } else if (n.IsSequence()) {
    for (const auto& v : n) check_tree(v, w, depth + 1);
  } else if (n.IsScalar()) {
    check_quote_closed(n, w.text, w.source_name);
  }
}

bool holds_second_document(const std::string& text);  // below, beside its event handler

// Where a YAML comment starts in an override's value ('#' first or after a blank, outside
// quotes), or npos. In a file a comment is seen; on a command line it would silently cut a
// value short: data.path=/a #b would read /a.
static size_t comment_start(const std::string& value) {
  YamlQuotes quotes;
  for (size_t i = 0; i < value.size(); ++i)
    if (quotes.outside(value[i]) && value[i] == '#' &&
        (i == 0 || std::isspace(static_cast<unsigned char>(value[i - 1]))))
      return i;
  return std::string::npos;
}

void apply_override(YAML::Node& root, const Override& ov) {
  YAML::Node value;
  try {
    // A leading '%' would make a YAML directive of the line: such a value is the text itself.
    if (!ov.value.empty() && ov.value[0] == '%') {
      value = YAML::Node(ov.value);
    } else {
      if (comment_start(ov.value) != std::string::npos)
        throw UserError(fmt::format(
            "override '{}': '#' there starts a YAML comment, which would drop the rest of the "
            "value; leave the comment out, or write the value as a quoted YAML string inside "
            "the shell's quotes, e.g. data.path='\"/data/set #2\"'",
            ov.text()));
      // As in a file: a second document ('---') would otherwise be dropped without a word.
      if (holds_second_document(ov.value))
        throw UserError(fmt::format("override '{}': holds more than one YAML document "
                                    "(separated by '---'); give one value",
                                    ov.text()));
      value = YAML::Load(ov.value);
    }
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("override '{}': value is not valid YAML: {}", ov.text(), e.msg));
  }
  const std::string where = fmt::format("override '{}'", ov.text());
  TreeWalk walk{ov.value, where};
  check_tree(value, walk);
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
// `where` is its key (model.layers[2]), `place` where it was written (file:line, or the override).
LayerSpec decode_layer(const YAML::Node& n, const std::string& where, const std::string& place,
                       const Source& src) {
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
        fmt::format("{}: {}: expected a layer name or a one-key mapping such as "
                    "{{conv: {{channels: 32}}}}",
                    place, where));
  }
  bool found = false;
  for (const auto& [k, v] : choices(LayerType{}))
    if (name == k) {
      l.type = v;
      found = true;
    }
  if (!found) {
    std::vector<std::string> names;
    for (const auto& [k, v] : choices(LayerType{})) names.push_back(k);
    const auto guess = closest_match(name, names);
    throw UserError(fmt::format("{}: {}: unknown layer '{}'{}; valid: {}", place, where, name,
                                guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
                                enum_choices(choices(LayerType{}))));
  }
  // LayerSpec::kernel serves conv (3 by default) and maxpool, whose window defaults to 2.
  if (l.type == LayerType::maxpool) l.kernel = 2;
  MapReader r(params && params.IsMap() ? params : YAML::Node(YAML::NodeType::Undefined),
              where + "." + name, src);
  if (params && !params.IsNull() && !params.IsMap())
    throw UserError(fmt::format("{}: {}.{}: expected a mapping of parameters", place, where, name));
  visit(l, r);
  r.finish();
  if (l.type == LayerType::dense && l.units == 0)
    throw UserError(
        fmt::format("{}: {}: dense needs units, e.g. {{dense: {{units: 128}}}}", place, where));
  if (l.type == LayerType::conv && l.channels == 0)
    throw UserError(
        fmt::format("{}: {}: conv needs channels, e.g. {{conv: {{channels: 32}}}}", place, where));
  if (l.type == LayerType::residual && l.body.empty())
    throw UserError(
        fmt::format("{}: {}: residual needs a non-empty body, e.g. {{residual: {{body: [{{conv: "
                    "{{channels: 16, padding: 1}}}}, batchnorm]}}}}",
                    place, where));
  return l;
}

// Rules that span keys, checked once every key has been read. Products of user numbers are
// checked: none may wrap around.
void check_batches(const Config& c, const Source& src) {
  constexpr int64_t kMaxBatch = int64_t{1} << 31;
  const auto product = [&](const std::vector<int64_t>& factors, const std::string& what) {
    const int64_t p = bounded_product(factors, kMaxBatch);
    if (p < 0)
      throw UserError(
          fmt::format("{}: {} is over {}; use smaller values", src.file, what, kMaxBatch));
    return p;
  };
  const int64_t split =
      product({c.gpus, c.train.accumulation_steps}, "gpus x train.accumulation_steps");
  if (!c.train.global_batch)
    product({c.train.per_replica_batch, c.gpus, c.train.accumulation_steps},
            fmt::format("the global batch (train.per_replica_batch={} x gpus={} x "
                        "accumulation_steps={})",
                        c.train.per_replica_batch, c.gpus, c.train.accumulation_steps));
  if (c.train.global_batch && *c.train.global_batch % split != 0) {
    const int64_t g = *c.train.global_batch;
    const int64_t lo = std::max<int64_t>(split, g / split * split);
    throw UserError(fmt::format(
        "{}: train.global_batch={} cannot be split evenly across gpus={} x accumulation_steps={}; "
        "use a multiple of {} (e.g. {} or {}), or give train.per_replica_batch instead",
        src.file, g, c.gpus, c.train.accumulation_steps, split, lo, lo + split));
  }
}

// model.type resnet: a depth with a known block layout, and one width per stage.
void check_resnet(const ModelConfig& m, const MapReader& r) {
  const bool imagenet_depth =
      m.depth == 18 || m.depth == 34 || m.depth == 50 || m.depth == 101 || m.depth == 152;
  if (!imagenet_depth && (m.depth - 2) % 6 != 0)
    r.fail("depth", r.node("depth"),
           fmt::format("resnet depth {} has no block layout; valid: 18, 34 (basic blocks), 50, "
                       "101, 152 (bottleneck blocks; 4 stages), or 6n+2 such as 20, 32, 44, 56, "
                       "110 (3 stages)",
                       m.depth));
  const size_t stages = imagenet_depth ? 4 : 3;  // widths: a bottleneck's inner width
  if (!m.widths.empty() && m.widths.size() != stages)
    r.fail("widths", r.node("widths"),
           fmt::format("resnet depth {} has {} stages, so widths needs {} entries, got {}", m.depth,
                       stages, stages, m.widths.size()));
}

// The channels of the data's C x H x W samples (0: not images), from the config alone.
int64_t image_channels(const DataConfig& d, int64_t* h, int64_t* w) {
  std::vector<int64_t> shape = {1, 28, 28};  // Fashion-MNIST, MNIST and IDX files
  if (d.dataset == DatasetKind::synthetic) shape = d.synthetic.shape;
  if (d.dataset == DatasetKind::cifar10 || d.dataset == DatasetKind::cifar100) shape = {3, 32, 32};
  if (d.dataset == DatasetKind::folder) shape = d.shape;
  if (shape.size() != 3) return 0;
  *h = shape[1];
  *w = shape[2];
  return shape[0];
}

// A [lo, hi] range key of data.augment.
void check_range(const std::vector<double>& v, const char* key, const MapReader& a) {
  if (v.size() != 2 || v[0] > v[1])
    a.fail(key, a.node(key), "needs two numbers [lo, hi] with lo <= hi");
}

// dataset: folder: a [C, H, W] shape of 1 or 3 channels, crops drawn by scale and ratio (not by
// padding); the folder keys are refused with other datasets, whose shape comes from their data.
void check_folder(const DataConfig& d, const MapReader& r) {
  const MapReader a = r.at("augment");
  if (d.dataset != DatasetKind::folder) {
    // Set to other than the default (config.resolved.yaml writes every key).
    const DataConfig def;
    const std::pair<const char*, bool> set[] = {{"shape", d.shape != def.shape},
                                                {"workers", d.workers != def.workers},
                                                {"prefetch", d.prefetch != def.prefetch},
                                                {"on_bad_file", d.on_bad_file != def.on_bad_file},
                                                {"jpeg_draft", d.jpeg_draft != def.jpeg_draft}};
    for (const auto& [key, differs] : set)
      if (differs) r.fail(key, r.node(key), "only for dataset: folder (image files decoded as used)");
    const std::pair<const char*, bool> aug[] = {
        {"crop_scale", d.augment.crop_scale != def.augment.crop_scale},
        {"crop_ratio", d.augment.crop_ratio != def.augment.crop_ratio}};
    for (const auto& [key, differs] : aug)
      if (differs)
        a.fail(key, a.node(key), "only for dataset: folder (in-memory images crop by padding)");
    return;
  }
  if (d.shape.size() != 3 || (d.shape[0] != 1 && d.shape[0] != 3))
    r.fail("shape", r.node("shape"),
           "needs [C, H, W] with C 1 (grey) or 3 (RGB), e.g. [3, 224, 224]");
  // Every image is decoded and scaled to it, and the normalisation statistics read them all
  // before the memory check can speak: bounded as synthetic data is. (The schema's 8192 a side
  // keeps a [C, H, W] of 1 or 3 channels under this; it stays as the rule's statement.)
  if (bounded_product(d.shape, int64_t{1} << 28) < 0)
    r.fail("shape", r.node("shape"),
           fmt::format("{} values a sample is over {} (3 x 8192 x 8192 fits)",
                       fmt::join(d.shape, " x "), int64_t{1} << 28));
  if (d.augment.crop_padding > 0)
    a.fail("crop_padding", a.node("crop_padding"),
           "a folder dataset crops with data.augment.crop_scale and crop_ratio instead");
  check_range(d.augment.crop_scale, "crop_scale", a);
  check_range(d.augment.crop_ratio, "crop_ratio", a);
}

// data.mean and data.std: one per channel, or one for global statistics; reflect padding
// smaller than the image.
void check_data(const DataConfig& d, const MapReader& r) {
  check_folder(d, r);
  int64_t h = 0, w = 0;
  const int64_t channels = image_channels(d, &h, &w);
  if (d.normalize == Normalize::channel && channels == 0)
    r.fail("normalize", r.node("normalize"),
           "channel needs image data with a [c, h, w] shape (this data is flat); use global");
  const size_t want = d.normalize == Normalize::channel ? static_cast<size_t>(channels) : 1;
  for (const auto* key : {"mean", "std"}) {
    const auto& v = std::string(key) == "mean" ? d.mean : d.stddev;
    if (v.empty()) continue;
    if (d.normalize == Normalize::off)
      r.fail(key, r.node(key), "given, but data.normalize is false; give normalize: channel");
    if (v.size() != want)
      r.fail(key, r.node(key),
             fmt::format("needs {} entr{} (normalize: {}, {} channel{}), got {}", want,
                         want == 1 ? "y" : "ies", to_string(d.normalize), channels,
                         channels == 1 ? "" : "s", v.size()));
  }
  const int64_t pad = d.augment.crop_padding;
  if (d.augment.padding_mode == PaddingMode::reflect && channels > 0 && (pad >= h || pad >= w)) {
    const MapReader a = r.at("augment");
    a.fail("crop_padding", a.node("crop_padding"),
           fmt::format("reflect padding needs crop_padding below the image's height and width "
                       "({} x {}), got {}",
                       h, w, pad));
  }
}

// The token datasets (bytes, tokens) hold token ids: never normalised (off unless the file
// says otherwise, which is refused below), and read by model.type gpt alone, which reads
// nothing else.
void resolve_tokens(Config& c, const MapReader& top) {
  if (!token_dataset(c.data.dataset)) return;
  if (!top.at("data").node("normalize")) c.data.normalize = Normalize::off;
  // A language model's next-token accuracy never nears the images' 0.85: no accuracy target
  // unless the file sets one (train.target_loss is the yardstick).
  if (!top.at("train").node("target_accuracy")) c.train.target_accuracy = 0;
}

// The keys of the token datasets, refused elsewhere when set to other than their default
// (config.resolved.yaml writes every key).
void check_token_keys(const DataConfig& data, const MapReader& d) {
  const DataConfig def;
  if (data.dataset != DatasetKind::tokens && data.vocab_size != def.vocab_size)
    d.fail("vocab_size", d.node("vocab_size"),
           data.dataset == DatasetKind::bytes
               ? "only for dataset: tokens (dataset: bytes has a vocabulary of 256)"
               : "only for dataset: tokens");
  if (data.dataset != DatasetKind::bytes) {
    if (data.exclude != def.exclude)
      d.fail("exclude", d.node("exclude"), "only for dataset: bytes (files of a folder left out)");
    if (data.sha256 != def.sha256)
      d.fail("sha256", d.node("sha256"), "only for dataset: bytes (the corpus's checksum)");
  }
  if (token_dataset(data.dataset)) return;
  if (data.block_size != def.block_size)
    d.fail("block_size", d.node("block_size"), "only for dataset: bytes or tokens");
  if (data.validation != def.validation)
    d.fail("validation", d.node("validation"), "only for dataset: bytes or tokens");
}

void check_tokens(const Config& c, const MapReader& top) {
  const MapReader d = top.at("data");
  const bool tokens = token_dataset(c.data.dataset);
  if (c.model.type == ModelType::gpt && !tokens)
    d.fail("dataset", d.node("dataset"),
           fmt::format("model.type gpt reads token windows: dataset: bytes or tokens (got {})",
                       to_string(c.data.dataset)));
  check_token_keys(c.data, d);
  if (c.model.type == ModelType::gpt && c.model.n_embd % c.model.n_head != 0) {
    const MapReader m = top.at("model");
    m.fail("n_head", m.node("n_head"),
           fmt::format("{} heads do not divide model.n_embd ({}); give a divisor of it",
                       c.model.n_head, c.model.n_embd));
  }
  if (!tokens) return;
  const std::string name = to_string(c.data.dataset);
  // The default path is Fashion-MNIST's folder, which bytes would read as text.
  if (!d.node("path"))
    d.fail("path", d.node("path"),
           fmt::format("dataset: {} needs data.path: {}", name,
                       c.data.dataset == DatasetKind::bytes
                           ? "a text file, or a folder of files"
                           : "a folder of llm.c token shards, or one shard"));
  if (c.model.type != ModelType::gpt) {
    const MapReader m = top.at("model");
    m.fail("type", m.node("type"),
           fmt::format("dataset: {} is read by model.type gpt (got {})", name,
                       to_string(c.model.type)));
  }
  if (c.data.normalize != Normalize::off)
    d.fail("normalize", d.node("normalize"),
           fmt::format("dataset: {} holds token ids: only false (or off)", name));
  if (c.data.sort_by_label)
    d.fail("sort_by_label", d.node("sort_by_label"),
           fmt::format("dataset: {} has no labels to sort by", name));
  if (c.data.augment.enabled())
    d.fail("augment", d.node("augment"),
           fmt::format("dataset: {} takes no image augmentation", name));
}

void check_rules(const Config& c, const MapReader& top, const Source& src) {
  if (c.precision == Precision::tf32 && c.backend == Backend::cpu)
    top.fail("precision", top.node("precision"),
             "the CPU backend has no TF32; tf32 needs backend: cuda or auto (fp32 and bf16, "
             "emulated, run on the CPU)");
  if (c.model.type == ModelType::layers && c.model.layers.empty()) {
    const MapReader m = top.at("model");
    m.fail("layers", m.node("layers"), "type: layers needs a non-empty list of layers");
  }
  if (c.model.type == ModelType::resnet) check_resnet(c.model, top.at("model"));
  check_batches(c, src);
  if (c.data.dataset == DatasetKind::synthetic) {
    if (c.data.synthetic.shape.empty())
      throw UserError(fmt::format("{}: data.synthetic.shape: give a sample's shape, e.g. [64] "
                                  "(features) or [3, 32, 32] (images), not []",
                                  src.file));
    if (bounded_product(c.data.synthetic.shape, int64_t{1} << 28) < 0)
      throw UserError(fmt::format("{}: data.synthetic.shape: {} features in all is over {}",
                                  src.file, fmt::join(c.data.synthetic.shape, " x "),
                                  int64_t{1} << 28));
  }
  check_data(c.data, top.at("data"));
  check_tokens(c, top);
  if (c.optimizer.warmup_epochs > c.train.epochs)
    throw UserError(fmt::format(
        "{}: optimizer.warmup_epochs={} exceeds train.epochs={}; give "
        "warmup_epochs at most {} (a shorter run takes a shorter warmup: "
        "add optimizer.warmup_epochs={}, or 0 for none)",
        src.file, c.optimizer.warmup_epochs, c.train.epochs, c.train.epochs, c.train.epochs / 2.0));
  // The floor scales with lr (schedule.cpp): above lr it would be above every run's peak.
  if (c.optimizer.schedule == Schedule::cosine && c.optimizer.min_lr > c.optimizer.lr)
    throw UserError(fmt::format("{}: optimizer.min_lr={} is above optimizer.lr={}; the cosine "
                                "falls from the peak to min_lr (both given for base_batch and "
                                "scaled alike), so give min_lr at most {}",
                                src.file, c.optimizer.min_lr, c.optimizer.lr, c.optimizer.lr));
  if (c.train.stop_at_target && c.train.target_accuracy <= 0 && c.train.target_loss <= 0)
    throw UserError(fmt::format("{}: train.stop_at_target needs a target: train.target_accuracy "
                                "or train.target_loss above 0",
                                src.file));
}

Config decode(const YAML::Node& root, const Source& src) {
  Config c;
  if (root && !root.IsNull() && !root.IsMap())
    throw UserError(fmt::format("{}: expected a mapping of keys at the top level", src.file));
  MapReader top(root, "", src);
  visit(c, top);
  top.finish();
  resolve_tokens(c, top);
  check_rules(c, top, src);
  return c;
}

}  // namespace

// Whether a text value must be written quoted to read back as this text: yaml-cpp writes "a\r"
// plain, which reads back as "a"; and another YAML reader takes a plain true, no, null, 123 or
// 0x10 for a boolean, a null or a number, not for the name it is.
namespace {
bool needs_quotes(const std::string& v) {
  if (v.empty() || has_control_character(v)) return true;
  static const char* const kWords[] = {"true", "false", "yes", "no", "on", "off", "y", "n",
                                       "null", "~"};
  std::string lower = v;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* w : kWords)
    if (lower == w) return true;
  char* end = nullptr;
  std::strtod(v.c_str(), &end);  // numbers, and inf and nan spelled as C reads them
  if (end == v.c_str() + v.size()) return true;
  return lower == ".inf" || lower == "-.inf" || lower == "+.inf" || lower == ".nan" ||
         lower.rfind("0x", 0) == 0 || lower.rfind("0o", 0) == 0;
}
}  // namespace

const char* folder_name_rule(const std::string& name) {
  // The name is a folder: visible (report skips hidden ones), short enough for a file system.
  if (name.empty() || name.find('/') != std::string::npos || name.front() == '.' ||
      name.size() > 200)
    return "must be a folder name of 1 to 200 bytes without '/', not starting with '.'";
  if (has_control_character(name))
    return "must not hold control characters (a tab, newline or carriage return makes a folder "
           "that no listing shows as it is; nor right-to-left or other reordering marks)";
  return nullptr;
}

const char* glob_rule(const std::string& pattern) {
  if (pattern.empty() || pattern.size() > 256)
    return "every pattern must be 1 to 256 bytes, e.g. '*.dat'";
  if (pattern.front() == '/')
    return "patterns match a file's name or its path below data.path: give 'sub/*.txt', not an "
           "absolute path";
  if (has_control_character(pattern)) return "patterns must not hold control characters";
  // glibc's fnmatch backtracks: a pattern of many stars can take exponential time.
  if (std::count(pattern.begin(), pattern.end(), '*') > 8)
    return "patterns may hold at most 8 '*'";
  return nullptr;
}

const char* sha256_rule(const std::string& digest) {
  const bool hex = std::all_of(digest.begin(), digest.end(), [](char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
  });
  if (!digest.empty() && (digest.size() != 64 || !hex))
    return "must be 64 hex digits (what sha256sum prints), or empty to check nothing";
  return nullptr;
}

namespace {
// A product of config numbers in 64 bits, for a config built in code (decoded ones are checked
// against smaller limits already).
int64_t checked_product(const std::vector<int64_t>& factors, const char* what) {
  const int64_t p = bounded_product(factors, INT64_MAX);
  if (p < 1)
    throw UserError(
        fmt::format("{} ({}) is not a positive 64-bit integer", what, fmt::join(factors, " x ")));
  return p;
}
}  // namespace

int64_t Config::micro_batch() const {
  if (!train.global_batch) return train.per_replica_batch;
  return *train.global_batch /
         checked_product({gpus, train.accumulation_steps}, "gpus x train.accumulation_steps");
}

int64_t Config::global_batch() const {
  return checked_product({micro_batch(), gpus, train.accumulation_steps},
                         "per-replica batch x gpus x train.accumulation_steps");
}

double scaled_lr(const OptimizerConfig& o, int64_t global_batch) {
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(o.base_batch);
  switch (o.lr_scaling) {
    case LrScaling::none:
      return o.lr;
    case LrScaling::linear:
      return o.lr * ratio;
    case LrScaling::sqrt:
      return o.lr * std::sqrt(ratio);
  }
  return o.lr;
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
  if (eq == std::string::npos || eq == 0) {
    // A bare number is most often an option's second value: `--workers 1 2`.
    const bool number = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                          text[0] == '.' || text[0] == '-');
    throw UserError(fmt::format(
        "override '{}': expected key=value, e.g. gpus=4 or optimizer.lr=0.1{}", text,
        number ? " (an option takes its values joined by commas, e.g. --workers 1,2)" : ""));
  }
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

// Whether `text` holds a second YAML document with content. At most two documents are looked
// at: yaml-cpp's LoadAll loops forever on some malformed input (found by fuzzing), and a
// second document is all that needs finding.
bool holds_second_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentContent first, second;
  parser.HandleNextDocument(first);
  return parser.HandleNextDocument(second) && second.content;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<Override>& overrides) {
  // yaml-cpp reads a NUL byte as the end of a string and goes on: the rest of the value would
  // be lost, or worse, become part of a folder name.
  if (const size_t nul = yaml_text.find('\0'); nul != std::string::npos)
    throw UserError(
        fmt::format("{}:{}: holds a NUL byte; a config is UTF-8 text", source_name,
                    1 + std::count(yaml_text.begin(),
                                   yaml_text.begin() + static_cast<std::ptrdiff_t>(nul), '\n')));
  YAML::Node root;
  try {
    if (holds_second_document(yaml_text))
      throw UserError(
          fmt::format("{}: holds more than one YAML document (separated by '---'); "
                      "a config is one document",
                      source_name));
    root = YAML::Load(yaml_text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own guard, far past kMaxConfigDepth
    throw UserError(fmt::format("{}:{}: nested more than {} levels deep", source_name,
                                e.mark.line + 1, kMaxConfigDepth));
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("{}:{}: malformed YAML: {}", source_name, e.mark.line + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("{}: malformed YAML: {}", source_name, e.msg));
  }
  TreeWalk walk{yaml_text, source_name};
  check_tree(root, walk);
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
  return parse_config(read_text_file(path, "config file", size_t{1} << 20), path, overrides);
}

namespace {

// Writes config.resolved.yaml: a schema visitor over a const config.
class YamlWriter {
 public:
  YamlWriter(YAML::Emitter& e, const Config& root) : e_(e), root_(root) {}

  template <class T>
  void operator()(const Key& k, const T& v) {
    if constexpr (std::is_same_v<T, std::vector<LayerSpec>>) {
      if (!v.empty()) layers(k, v);  // an empty list is the default: no key at all
    } else {
      e_ << YAML::Key << k.name << YAML::Value;
      if constexpr (std::is_enum_v<T>)
        e_ << to_string(v);
      else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
        e_ << YAML::Flow << v;
      else if constexpr (std::is_same_v<T, std::vector<double>>) {
        e_ << YAML::Flow << YAML::BeginSeq;
        for (const double x : v) number(x);
        e_ << YAML::EndSeq;
      } else if constexpr (std::is_same_v<T, double>)
        number(v);
      else if constexpr (std::is_same_v<T, std::vector<std::string>>)
        texts(v);
      else if constexpr (std::is_same_v<T, std::string>)
        e_ << (needs_quotes(v) ? YAML::DoubleQuoted : YAML::Auto) << v;
      else
        e_ << v;
    }
  }

  template <class S>
  void section(const Key& k, const S& s) {
    e_ << YAML::Key << k.name << YAML::Value << YAML::BeginMap;
    visit(s, *this);
    e_ << YAML::EndMap;
  }

  void either(const Key& a, const int64_t&, const Key& b, const std::optional<int64_t>& second) {
    // Both batch sizes are resolved; only the one that defines the run is written as a key.
    if (second)
      e_ << YAML::Key << b.name << YAML::Value << *second;
    else
      e_ << YAML::Key << a.name << YAML::Value << root_.micro_batch();
    e_ << YAML::Comment(fmt::format("per-replica micro-batch {}, global batch {}",
                                    root_.micro_batch(), root_.global_batch()));
  }

 private:
  // A text list in flow style, each entry quoted where yaml-cpp would misread it plain.
  void texts(const std::vector<std::string>& v) {
    e_ << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) e_ << (needs_quotes(x) ? YAML::DoubleQuoted : YAML::Auto) << x;
    e_ << YAML::EndSeq;
  }

  void layers(const Key& k, const std::vector<LayerSpec>& list) {
    e_ << YAML::Key << k.name << YAML::Value << YAML::BeginSeq;
    for (const auto& l : list) {
      e_ << YAML::Flow << YAML::BeginMap << YAML::Key << to_string(l.type) << YAML::Value
         << YAML::BeginMap;
      visit(l, *this);
      e_ << YAML::EndMap << YAML::EndMap;
    }
    e_ << YAML::EndSeq;
  }

  // A number as its shortest text that reads back as the same double (0.9, not yaml-cpp's
  // 0.90000000000000002).
  void number(double x) {
    if (std::isfinite(x))
      e_ << fmt::format("{}", x);
    else
      e_ << x;
  }

  YAML::Emitter& e_;
  const Config& root_;
};

// The JSON view (summary.json's "config"): the same keys and nesting as the YAML.
class JsonWriter {
 public:
  JsonWriter(nlohmann::json& out, const Config& root) : out_(out), root_(root) {}

  template <class T>
  void operator()(const Key& k, const T& v) {
    if constexpr (std::is_enum_v<T>) {
      out_[k.name] = to_string(v);
    } else if constexpr (std::is_same_v<T, std::vector<LayerSpec>>) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& l : v) {
        nlohmann::json params = nlohmann::json::object(), entry = nlohmann::json::object();
        JsonWriter w(params, root_);
        visit(l, w);
        entry[to_string(l.type)] = std::move(params);
        list.push_back(std::move(entry));
      }
      out_[k.name] = std::move(list);
    } else {
      out_[k.name] = v;
    }
  }

  template <class S>
  void section(const Key& k, const S& s) {
    nlohmann::json sub = nlohmann::json::object();
    JsonWriter w(sub, root_);
    visit(s, w);
    out_[k.name] = std::move(sub);
  }

  // The per-replica batch in force, whichever key defined it; the global batch as given.
  void either(const Key& a, const int64_t&, const Key& b, const std::optional<int64_t>& second) {
    out_[a.name] = root_.micro_batch();
    out_[b.name] = second ? nlohmann::json(*second) : nlohmann::json(nullptr);
  }

 private:
  nlohmann::json& out_;
  const Config& root_;
};

// Lists the keys, with defaults taken from a default-constructed Config.
class KeyLister {
 public:
  KeyLister(std::vector<KeyInfo>& out, std::string prefix,
            const std::map<std::string, std::string>& defaults, bool after_load)
      : out_(out), prefix_(std::move(prefix)), defaults_(defaults), after_load_(after_load) {}

  template <class T>
  void operator()(const Key& k, const T&) {
    KeyInfo i = info(k);
    if constexpr (std::is_same_v<T, std::string>) {
      i.kind = KeyKind::text;
    } else if constexpr (std::is_same_v<T, bool>) {
      i.kind = KeyKind::boolean;
    } else if constexpr (std::is_enum_v<T>) {
      i.kind = KeyKind::choice;
      for (const auto& [name, value] : choices(T{})) i.choices.push_back(name);
    } else if constexpr (std::is_integral_v<T>) {
      i.kind = KeyKind::integer;
      if constexpr (sizeof(T) < sizeof(int64_t))
        i.hi = std::min<int64_t>(i.hi, std::numeric_limits<T>::max());
    } else if constexpr (std::is_floating_point_v<T>) {
      i.kind = KeyKind::number;
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      i.kind = KeyKind::int_list;
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      i.kind = KeyKind::number_list;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      i.kind = KeyKind::text_list;
    } else {
      i.kind = KeyKind::layers;
    }
    out_.push_back(std::move(i));
  }

  template <class S>
  void section(const Key& k, const S& s) {
    KeyLister sub(out_, prefix_ + k.name + ".", defaults_, after_load_ || k.after_load);
    visit(s, sub);
  }

  void either(const Key& a, const int64_t& first, const Key& b, const std::optional<int64_t>&) {
    (*this)(a, first);
    KeyInfo i = info(b);
    i.kind = KeyKind::integer;
    i.optional = true;
    out_.push_back(std::move(i));
  }

 private:
  KeyInfo info(const Key& k) const {
    KeyInfo i;
    i.key = prefix_ + k.name;
    const auto it = defaults_.find(i.key);
    if (it != defaults_.end()) i.default_value = it->second;
    i.lo = k.lo;
    i.hi = k.hi;
    i.min = k.min;
    i.max = k.max;
    i.after_load = after_load_ || k.after_load;
    return i;
  }

  std::vector<KeyInfo>& out_;
  std::string prefix_;
  const std::map<std::string, std::string>& defaults_;
  bool after_load_;
};

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix + it.key();
    if (it->is_object())
      flatten(*it, key + ".", out);
    else
      out[key] = it->is_string() ? it->get<std::string>() : it->dump();
  }
}

}  // namespace

std::string to_yaml(const Config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  YamlWriter w(e, c);
  visit(c, w);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

uint64_t launch_fingerprint(const Config& c) {
  Config same = c;
  same.data.path.clear();
  same.threads = 0;
  const std::string text = to_yaml(same);
  return text_hash(text.data(), text.size());
}

nlohmann::json config_to_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  JsonWriter w(j, c);
  visit(c, w);
  return j;
}

std::map<std::string, std::string> config_values(const nlohmann::json& view) {
  std::map<std::string, std::string> out;
  if (view.is_object()) flatten(view, "", out);
  return out;
}

std::map<std::string, std::string> config_values(const Config& c) {
  return config_values(config_to_json(c));
}

const std::vector<KeyInfo>& schema_keys() {
  static const std::vector<KeyInfo> keys = [] {
    const Config defaults;
    const auto values = config_values(defaults);
    std::vector<KeyInfo> out;
    KeyLister lister(out, "", values, false);
    visit(defaults, lister);
    return out;
  }();
  return keys;
}

std::string KeyInfo::valid() const {
  switch (kind) {
    case KeyKind::text:
      return "text";
    case KeyKind::boolean:
      return "true | false";
    case KeyKind::choice:
      return fmt::format("{}", fmt::join(choices, " | "));
    case KeyKind::integer: {
      const std::string range = hi == INT64_MAX || hi == INT32_MAX
                                    ? fmt::format("an integer >= {}", lo)
                                    : fmt::format("an integer in [{}, {}]", lo, hi);
      return optional ? range + ", or null" : range;
    }
    case KeyKind::number:
      return fmt::format("a number in [{}, {}]", min, max);
    case KeyKind::int_list:
      return fmt::format("a list of integers >= {}", lo);
    case KeyKind::number_list:
      return fmt::format("a list of numbers in [{}, {}]", min, max);
    case KeyKind::text_list:
      return "a list of texts";
    case KeyKind::layers:
      return "a list of layers";
  }
  return "";
}

}  // namespace dtrain
