// The config schema drives the decoder, to_yaml, summary.json's "config", the data identity and
// `report --by`: each test walks schema_keys(), so a key added to the schema is covered.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/config/schema.hpp"
#include "dtrain/data/data.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;
using nlohmann::json;

namespace {

// Keys of dataset: folder alone: the others refuse them (set to other than their default).
bool folder_key(const std::string& key) {
  static const std::set<std::string> keys = {
      "data.shape",      "data.workers",          "data.prefetch",          "data.on_bad_file",
      "data.jpeg_draft", "data.augment.crop_scale", "data.augment.crop_ratio"};
  return keys.count(key) > 0;
}

bool bytes_key(const std::string& key) {
  return key == "data.block_size" || key == "data.validation" || key == "data.exclude" ||
         key == "data.sha256";
}

// Keys of dataset: tokens alone.
bool tokens_key(const std::string& key) {
  return key == "data.vocab_size";
}

// The overrides a key needs beside it: the dataset that reads it (and that dataset's model).
std::vector<Override> context_of(const std::string& key) {
  if (folder_key(key)) return {{"data.dataset", "folder"}};
  if (bytes_key(key))
    return {{"data.dataset", "bytes"}, {"model.type", "gpt"}, {"data.path", "corpus.txt"}};
  if (tokens_key(key))
    return {{"data.dataset", "tokens"}, {"model.type", "gpt"}, {"data.path", "shards"}};
  return {};
}

// A valid value for `k` other than its default, as a command-line override value.
std::string non_default(const KeyInfo& k) {
  if (k.key == "data.shape") return "[1, 8, 8]";  // [C, H, W]
  if (k.key == "data.sha256") return std::string(64, 'a');
  if (k.key == "data.augment.crop_scale" || k.key == "data.augment.crop_ratio")
    return "[0.5, 0.9]";  // [lo, hi]
  switch (k.kind) {
    case KeyKind::text:
      return "other";
    case KeyKind::boolean:
      return k.default_value == "true" ? "false" : "true";
    case KeyKind::choice:
      for (const auto& c : k.choices)
        if (c != k.default_value) return c;
      break;
    case KeyKind::integer: {
      if (k.default_value == "null") return std::to_string(k.lo);
      const int64_t d = std::stoll(k.default_value);
      return std::to_string(d < k.hi ? d + 1 : d - 1);
    }
    case KeyKind::number: {
      const double d = std::stod(k.default_value);
      return fmt::format("{}", d != 0 ? d / 2 : k.min + (k.max - k.min) * 1e-6);
    }
    case KeyKind::int_list:
      return "[3, 5]";
    case KeyKind::number_list:
      return "[0.5]";
    case KeyKind::text_list:
      return "['*.dat', 'sub/*', \"it's\", '[ab]*']";
    case KeyKind::layers:
      return "[{conv: {channels: 4}}, relu, {maxpool: {size: 3}}, {dropout: {p: 0.3}}]";
  }
  FAIL("no non-default value for " << k.key);
  return "";
}

// The base config with key=value (and, for a folder key, data.dataset: folder).
Config with(const std::string& key, const std::string& value) {
  std::vector<Override> o = {{key, value}};
  for (const Override& c : context_of(key)) o.push_back(c);
  return parse_config("name: base\n", "exp.yaml", o);
}

json read_json(const fs::path& p) {
  return json::parse(slurp(p));
}

}  // namespace

TEST_CASE("the schema lists every key once, with its default from the member initialisers",
          "[config][schema]") {
  const auto& keys = schema_keys();
  std::set<std::string> names;
  for (const auto& k : keys) CHECK(names.insert(k.key).second);
  // Every value of the JSON view is a key of the schema, and the other way round.
  const auto values = config_values(Config{});
  CHECK(values.size() == keys.size());
  for (const auto& k : keys) {
    INFO(k.key);
    REQUIRE(values.count(k.key) == 1);
    CHECK(values.at(k.key) == k.default_value);
  }
  CHECK(values.at("train.per_replica_batch") == "64");
  CHECK(values.at("train.global_batch") == "null");
  CHECK(values.at("data.path") == "/usr/share/datasets/fashion-mnist");
}

TEST_CASE("every schema key round-trips through to_yaml and load_config with a non-default value",
          "[config][schema]") {
  const auto defaults = config_values(Config{});
  for (const auto& k : schema_keys()) {
    const std::string value = non_default(k);
    INFO(k.key << "=" << value);
    const Config c = with(k.key, value);
    const auto got = config_values(c);
    CHECK(got.at(k.key) != defaults.at(k.key));
    TempDir tmp("schema");
    const Config back = load_config(tmp.write("resolved.yaml", to_yaml(c)));
    CHECK(config_to_json(back) == config_to_json(c));
    CHECK(to_yaml(back) == to_yaml(c));
  }
}

TEST_CASE("the decoder enforces each key's range and spellings as the schema states them",
          "[config][schema][errors]") {
  int checked = 0;
  for (const auto& k : schema_keys()) {
    std::vector<std::string> bad;
    if (k.kind == KeyKind::integer) {
      if (k.lo > INT64_MIN) bad.push_back(std::to_string(k.lo - 1));
      if (k.hi < INT32_MAX) bad.push_back(std::to_string(k.hi + 1));
    } else if (k.kind == KeyKind::number) {
      bad.push_back(fmt::format("{}", k.min - 1));
      bad.push_back(fmt::format("{}", k.max * 2 + 1));
    } else if (k.kind == KeyKind::choice || k.kind == KeyKind::boolean) {
      bad.push_back("bogus");
    } else if (k.kind == KeyKind::int_list) {
      bad.push_back(fmt::format("[{}]", k.lo - 1));
    } else if (k.kind == KeyKind::number_list) {
      bad.push_back(fmt::format("[{}]", k.min - 1));
      bad.push_back(fmt::format("[{}]", k.max * 2 + 1));
    } else if (k.kind == KeyKind::text_list) {
      bad.push_back("[[a]]");
      bad.push_back("a");
    }
    for (const auto& v : bad) {
      INFO(k.key << "=" << v);
      const auto e = config_error("name: base\n", {{k.key, v}});
      CHECK_THAT(e, Catch::StartsWith("override '" + k.key + "=" + v + "': " + k.key + ": "));
      if (k.kind == KeyKind::choice)
        CHECK_THAT(e, Catch::Contains("expected one of " + k.valid() + ", got 'bogus'"));
      ++checked;
    }
  }
  CHECK(checked > 60);
}

TEST_CASE("data_identity changes with every data key but those acting after the load",
          "[data][schema]") {
  const Config base = with("name", "base");
  const std::string id = data_identity(base.data, base.train.seed);
  int keys = 0;
  for (const auto& k : schema_keys()) {
    if (k.key.rfind("data.", 0) != 0) continue;
    INFO(k.key);
    const Config c = with(k.key, non_default(k));
    // Against the same dataset with the key at its default.
    std::vector<Override> ctx = context_of(k.key);
    const Config same = ctx.empty() ? base : parse_config("name: base\n", "exp.yaml", ctx);
    const std::string against = data_identity(same.data, same.train.seed);
    CHECK((data_identity(c.data, c.train.seed) != against) == !k.after_load);
    ++keys;
  }
  CHECK(keys == 31);
  // The seed draws synthetic data, never files.
  CHECK(data_identity(base.data, 7) == id);
  const Config syn = with("data.dataset", "synthetic");
  CHECK(data_identity(syn.data, 1) != data_identity(syn.data, 2));
}

TEST_CASE("summary.json carries the resolved config as the schema's JSON view",
          "[recorder][schema][cli]") {
  TempDir tmp("summary-config");
  const auto cfg = tmp.write("cfg.yaml", tiny_config("sc"));
  const auto r = dtrain_cli("run " + cfg +
                            " gpus=2 train.global_batch=32 "
                            "train.per_replica_batch=null --quiet --tag t --results " +
                            (tmp.path / "res").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const fs::path run = tmp.path / "res" / "sc" / "t-g2";
  const json j = read_json(run / "summary.json");
  REQUIRE(j.contains("config"));
  const Config resolved = load_config((run / "config.resolved.yaml").string());
  CHECK(j["config"] == config_to_json(resolved));
  CHECK(config_values(j["config"]).size() == schema_keys().size());
  CHECK(j["config"]["train"]["per_replica_batch"] == 16);  // in force, from the global batch
  CHECK(j["config"]["train"]["global_batch"] == 32);
  CHECK(j["config"]["data"]["synthetic"]["shape"] == json::array({8}));
  // The keys summary.json had before stay.
  for (const char* key : {"gpus", "per_replica_batch", "global_batch", "seed", "lr_scaling",
                          "final_test_accuracy", "median_epoch_time_s", "status"})
    CHECK(j.contains(key));
}

TEST_CASE("report --by train.seed aggregates runs over seeds", "[report][cli][schema]") {
  TempDir tmp("report-by");
  const auto cfg = tmp.write("cfg.yaml", tiny_config("seeds"));
  const auto res = tmp.path / "res";
  const auto run =
      dtrain_cli("run " + cfg + " train.seed=1,2,3 --quiet --tag t --results " + res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  // The statistics, computed here from the runs' own summary.json files.
  std::vector<double> acc;
  for (const char* id : {"t-g1-seed1", "t-g1-seed2", "t-g1-seed3"})
    acc.push_back(read_json(res / "seeds" / id / "summary.json")["final_test_accuracy"]);
  const double mean = (acc[0] + acc[1] + acc[2]) / 3;
  double sq = 0;
  for (double a : acc) sq += (a - mean) * (a - mean);
  const double sd = std::sqrt(sq / 2);

  const auto check_report = [&](const fs::path& out) {
    const auto r = dtrain_cli("report --by train.seed " + res.string() + " --out " + out.string());
    INFO(r.out);
    REQUIRE(r.code == 0);
    const json j = read_json(out / "seeds-by-train.seed.json");
    REQUIRE(j["rows"].size() == 1);
    const json& row = j["rows"][0];
    CHECK(row["count"] == 3);
    CHECK(row["train.seed"] == json::array({"1", "2", "3"}));
    CHECK(row["final_test_accuracy_mean"].get<double>() == Approx(mean));
    CHECK(row["final_test_accuracy_sd"].get<double>() == Approx(sd));
    CHECK(row["best_test_accuracy_sd"].is_number());
    CHECK_THAT(slurp(out / "seeds-by-train.seed.md"),
               Catch::Contains("| 3 | 1, 2, 3 | " + fmt::format("{:.2f}%", 100 * mean)));
    CHECK(count_lines(slurp(out / "seeds-by-train.seed.csv")) == 2);
    CHECK_THAT(slurp(out / ".manifest"), Catch::Contains("seeds-by-train.seed.json"));
    CHECK_THAT(r.out, Catch::Contains("## seeds, by train.seed"));
  };
  check_report(tmp.path / "r1");
  // Run folders from before summary.json had "config": read from config.resolved.yaml.
  for (const auto& e : fs::directory_iterator(res / "seeds")) {
    if (!fs::exists(e.path() / "summary.json")) continue;
    json s = read_json(e.path() / "summary.json");
    s.erase("config");
    put(e.path() / "summary.json", s.dump(2));
  }
  check_report(tmp.path / "r2");
}

TEST_CASE("report --by train.seed tests each row against the first", "[report][cli][schema]") {
  TempDir tmp("report-by-test");
  const auto cfg = tmp.write("cfg.yaml", tiny_config("seeds"));
  const auto res = tmp.path / "res";
  const auto run = dtrain_cli("run " + cfg +
                              " train.seed=1,2,3 optimizer.lr=0.05,0.4 --quiet --tag t --results " +
                              res.string());
  INFO(run.out);
  REQUIRE(run.code == 0);
  // Each lr's mean and sd of final test accuracy (in points), from the runs' summary.json.
  std::map<std::string, std::vector<double>> acc;
  for (const auto& e : fs::directory_iterator(res / "seeds")) {
    if (!fs::exists(e.path() / "summary.json")) continue;
    const json s = read_json(e.path() / "summary.json");
    acc[s["config"]["optimizer"]["lr"].dump()].push_back(
        100 * s["final_test_accuracy"].get<double>());
  }
  REQUIRE(acc.size() == 2);
  const auto mean_sd = [](const std::vector<double>& v) {
    const double m = (v[0] + v[1] + v[2]) / 3;
    double sq = 0;
    for (double x : v) sq += (x - m) * (x - m);
    return std::pair<double, double>{m, std::sqrt(sq / 2)};
  };
  const auto out = tmp.path / "r";
  const auto r = dtrain_cli("report --by train.seed " + res.string() + " --out " + out.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const json j = read_json(out / "seeds-by-train.seed.json");
  REQUIRE(j["rows"].size() == 2);
  REQUIRE(j["settings"] == json::array({"optimizer.lr"}));
  const json &first = j["rows"][0], &second = j["rows"][1];
  CHECK(first["final_test_accuracy_diff_points"].is_null());
  CHECK(first["final_test_accuracy_test"].is_null());
  const auto lr_of = [](const json& row) {
    return json(std::stod(row["optimizer.lr"].get<std::string>())).dump();
  };
  const auto [ma, sa] = mean_sd(acc.at(lr_of(first)));
  const auto [mb, sb] = mean_sd(acc.at(lr_of(second)));
  const json& t = second["final_test_accuracy_test"];
  INFO(t.dump());
  CHECK(second["final_test_accuracy_diff_points"].get<double>() == Approx(mb - ma));
  CHECK(t["n"] == json::array({3, 3}));
  const double se = std::sqrt(sa * sa / 3 + sb * sb / 3);
  if (se > 0) {
    REQUIRE(t["test"] == "welch");
    CHECK(t["se"].get<double>() == Approx(se));
    CHECK(t["df"].get<double>() ==
          Approx(std::pow(se, 4) / (std::pow(sa, 4) / 18 + std::pow(sb, 4) / 18)));
    CHECK(t["ci_low"].get<double>() < mb - ma);
    CHECK(t["ci_high"].get<double>() > mb - ma);
    CHECK(t["distinguishable"].get<bool>() == (t["p"].get<double>() < 0.05));
  } else {
    CHECK(t["test"] == "exact");
  }
  CHECK(second["final_train_loss_test"]["test"].is_string());
  CHECK(second["final_train_loss_diff"].is_number());
  // The text tables: the difference columns and the note under the table.
  const std::string md = slurp(out / "seeds-by-train.seed.md");
  CHECK_THAT(md, Catch::Contains("| final test acc vs first (pts) [95% CI] | final test acc p |"));
  CHECK_THAT(md, Catch::Contains("compared with the first by Welch's t-test"));
  CHECK_THAT(md, Catch::Contains(fmt::format("| {:+.2f} [", mb - ma)));
  CHECK(count_lines(slurp(out / "seeds-by-train.seed.csv")) == 3);
}

TEST_CASE("report --by an unknown key exits 2 with one line naming it and the valid keys",
          "[report][cli][errors]") {
  TempDir tmp("report-by-bad");
  const auto r = dtrain_cli("report " + tmp.path.string() + " --by train.sed");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK_THAT(r.out, Catch::StartsWith("dtrain: error: --by train.sed: unknown config key (did "
                                      "you mean 'train.seed'?); valid keys: name, backend, gpus"));
  CHECK_THAT(r.out, Catch::Contains("model.batchnorm") && Catch::Contains("optimizer.min_lr"));
}

namespace {

// The rows of docs/config-reference.md's key table: key -> the default the page gives. A row
// may name several keys ("`data.mean`, `data.std`"; "`a.b.x`, `.y`" for a sibling) with one
// default for all or one each.
std::map<std::string, std::string> documented_defaults() {
  std::ifstream in(source_dir() + "/docs/config-reference.md");
  REQUIRE(in);
  const auto ticked = [](const std::string& cell) {
    std::vector<std::string> out;
    for (size_t a = cell.find('`'); a != std::string::npos; a = cell.find('`', a + 1)) {
      const size_t b = cell.find('`', a + 1);
      if (b == std::string::npos) break;
      out.push_back(cell.substr(a + 1, b - a - 1));
      a = b;
    }
    return out;
  };
  std::map<std::string, std::string> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t k_end = line.find(" | ", 2), d_end = line.find(" | ", k_end + 3);
    REQUIRE(d_end != std::string::npos);
    auto keys = ticked(line.substr(2, k_end - 2));
    const auto defaults = ticked(line.substr(k_end + 3, d_end - k_end - 3));
    INFO(line);
    REQUIRE(!keys.empty());
    REQUIRE(defaults.size() <= keys.size());
    REQUIRE((defaults.size() <= 1 || defaults.size() == keys.size()));
    for (size_t i = 0; i < keys.size(); ++i) {
      REQUIRE(!keys[i].empty());
      REQUIRE((i > 0 || keys[i].front() != '.'));  // a sibling needs a key before it
      if (keys[i].front() == '.') keys[i] = keys[i - 1].substr(0, keys[i - 1].rfind('.')) + keys[i];
      // No default in backticks ("(none)"): nothing to compare.
      rows[keys[i]] = defaults.empty() ? "" : defaults[defaults.size() == 1 ? 0 : i];
    }
  }
  return rows;
}

// Equal as written, spaces aside ("[256, 128]"), or as numbers (the schema writes 0.9 as
// 0.90000000000000002).
bool same_default(std::string doc, std::string schema) {
  for (std::string* s : {&doc, &schema}) std::erase(*s, ' ');
  if (doc == schema) return true;
  char* end = nullptr;
  const double a = std::strtod(doc.c_str(), &end);
  if (end == doc.c_str() || *end != '\0') return false;
  const double b = std::strtod(schema.c_str(), &end);
  return end != schema.c_str() && *end == '\0' && a == b;
}

}  // namespace

TEST_CASE("docs/config-reference.md lists every key once, with the schema's default",
          "[schema][docs]") {
  const auto documented = documented_defaults();
  std::set<std::string> keys;
  for (const KeyInfo& k : schema_keys()) {
    keys.insert(k.key);
    INFO(k.key);
    const auto it = documented.find(k.key);
    CHECK(it != documented.end());  // a key the reference does not list
    if (it != documented.end() && !it->second.empty())
      CHECK(same_default(it->second, k.default_value));
  }
  for (const auto& [key, value] : documented) {
    INFO(key);
    CHECK(keys.count(key) == 1);  // the reference lists a key the schema does not have
  }
}
