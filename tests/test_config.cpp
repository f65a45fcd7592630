#include <catch2/catch.hpp>
#include <chrono>

#include "dtrain/config/config.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/config/plan.hpp"
#include "helpers.hpp"

using namespace dtrain;

namespace {
std::string error_of(const std::string& yaml, const std::vector<Override>& ov = {}) {
  return dtrain::test::config_error(yaml, ov);
}
}  // namespace

TEST_CASE("defaults fill every key that is not given", "[config]") {
  const Config c = parse_config("name: x\n", "exp.yaml");
  CHECK(c.name == "x");
  CHECK(c.gpus == 1);
  CHECK(c.micro_batch() == 64);
  CHECK(c.global_batch() == 64);
  CHECK(c.data.dataset == DatasetKind::fashion_mnist);
  CHECK(c.data.path == "/usr/share/datasets/fashion-mnist");
  CHECK(c.model.hidden == std::vector<int64_t>{256, 128});
  CHECK(c.optimizer.type == OptimizerType::sgd);
  CHECK(c.train.reduction == Reduction::mean);
  CHECK(c.train.cuda_graph);
  CHECK(c.precision == Precision::fp32);
}

TEST_CASE("the documented example config parses to the values it states", "[config]") {
  const Config c = parse_config(R"(
name: fmnist-mlp
backend: auto
gpus: 4
data:
  dataset: fashion-mnist
  path: /usr/share/datasets/fashion-mnist
  shuffle: sample
  sharding: interleaved
  drop_remainder: true
model:
  type: mlp
  hidden: [256, 128]
  activation: relu
train:
  epochs: 10
  per_replica_batch: 64
  reduction: mean
  accumulation_steps: 1
  seed: 1
  target_accuracy: 0.85
optimizer:
  type: sgd
  lr: 0.05
  base_batch: 64
  momentum: 0.9
  weight_decay: 0.0005
  lr_scaling: linear
  warmup_epochs: 2
  schedule: cosine
)",
                                "exp.yaml");
  CHECK(c.gpus == 4);
  CHECK(c.global_batch() == 256);
  CHECK(c.optimizer.weight_decay == Approx(0.0005));
  CHECK(c.optimizer.schedule == Schedule::cosine);
  CHECK(c.optimizer.warmup_epochs == 2);
}

TEST_CASE("global_batch defines the per-replica batch", "[config]") {
  const Config c =
      parse_config("gpus: 4\ntrain: {global_batch: 256, accumulation_steps: 2}\n", "exp.yaml");
  CHECK(c.micro_batch() == 32);
  CHECK(c.global_batch() == 256);
}

TEST_CASE("overrides replace YAML values - dotted keys reach sections", "[config]") {
  const Config c = parse_config("gpus: 2\noptimizer: {lr: 0.1}\n", "exp.yaml",
                                {{"gpus", "8"}, {"optimizer.lr", "0.4"}, {"model.hidden", "[64]"}});
  CHECK(c.gpus == 8);
  CHECK(c.optimizer.lr == Approx(0.4));
  CHECK(c.model.hidden == std::vector<int64_t>{64});
}

TEST_CASE("resolved YAML reads back to the same config", "[config]") {
  const Config a = parse_config(
      "gpus: 3\ntrain: {global_batch: 96}\noptimizer: {type: adamw}\n"
      "data: {dataset: synthetic, synthetic: {shape: [2, 3]}}\n",
      "exp.yaml");
  const Config b = parse_config(to_yaml(a), "resolved.yaml");
  CHECK(to_yaml(a) == to_yaml(b));
  CHECK(b.global_batch() == 96);
  CHECK(b.optimizer.type == OptimizerType::adamw);
  CHECK(b.data.synthetic.shape == std::vector<int64_t>{2, 3});
  const Config c = parse_config("precision: bf16\ntrain: {cuda_graph: false}\n", "exp.yaml");
  const Config d = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(d.precision == Precision::bf16);
  CHECK_FALSE(d.train.cuda_graph);
}

TEST_CASE("malformed YAML names the file and line", "[config][errors]") {
  const auto e = error_of("name: x\ngpus: 4\ntrain:\n  epochs: [1, 2\n");
  CHECK_THAT(e, Catch::Contains("exp.yaml:") && Catch::Contains("malformed YAML"));
  const auto e2 = error_of("name: x\n  bad indentation: 1\n");
  CHECK_THAT(e2, Catch::StartsWith("exp.yaml:2: malformed YAML"));
}

TEST_CASE("an unknown key is an error that suggests the closest valid key", "[config][errors]") {
  CHECK_THAT(error_of("name: x\noptimiser:\n  lr: 0.1\n"),
             Catch::Contains("exp.yaml:2: unknown key 'optimiser' (did you mean 'optimizer'?)"));
  CHECK_THAT(error_of("train:\n  epoch: 3\n"),
             Catch::Contains("exp.yaml:2: unknown key 'train.epoch' (did you mean 'epochs'?)"));
  CHECK_THAT(error_of("name: x\n", {{"optimiser.lr", "0.1"}}),
             Catch::StartsWith("override 'optimiser.lr=0.1': unknown key 'optimiser' (did you "
                               "mean 'optimizer'?)"));
  CHECK_THAT(error_of("", {{"train.per_replica_bach", "3"}}),
             Catch::Contains("override 'train.per_replica_bach=3': unknown key") &&
                 Catch::Contains("did you mean 'per_replica_batch'"));
  // Nothing close: the valid keys are listed instead of a guess.
  const auto e = error_of("zzzzzzzz: 1\n");
  CHECK_THAT(e, Catch::Contains("unknown key 'zzzzzzzz'") && Catch::Contains("valid keys"));
  CHECK_THAT(e, !Catch::Contains("did you mean"));
}

TEST_CASE("a wrong type names the key - what was expected and what was found", "[config][errors]") {
  CHECK(error_of("gpus: four\n") == "exp.yaml:1: gpus: expected an integer, got 'four'");
  CHECK(error_of("train:\n  epochs: 2.5\n") ==
        "exp.yaml:2: train.epochs: expected an integer, got '2.5'");
  CHECK_THAT(error_of("data:\n  shuffle: random\n"),
             Catch::Contains("data.shuffle: expected one of sample | batch | none, got 'random'"));
  CHECK_THAT(error_of("model:\n  hidden: 256\n"),
             Catch::Contains("model.hidden: expected a list of integers"));
  CHECK_THAT(error_of("data: 3\n"), Catch::Contains("data: expected a mapping"));
  CHECK_THAT(error_of("train:\n  cuda_graph: sometimes\n"), Catch::Contains("train.cuda_graph"));
  CHECK_THAT(error_of("precision: fp16\n"),
             Catch::Contains("precision: expected one of fp32 | tf32 | bf16"));
  CHECK_THAT(error_of("backend: cpu\nprecision: tf32\n"),
             Catch::Contains("the CPU backend has no TF32"));
}

TEST_CASE("an error inside a list or mapping given by an override names the override",
          "[config][errors]") {
  // model.layers=[...] on the command line: the file has no line of it to point at.
  CHECK_THAT(error_of("model: {type: layers}\n", {{"model.layers", "[relu, bogus]"}}),
             Catch::StartsWith("override 'model.layers=[relu, bogus]': model.layers[1]: unknown "
                               "layer 'bogus'"));
  CHECK_THAT(error_of("model: {type: layers}\n", {{"model.layers", "[{dense: {unitz: 4}}]"}}),
             Catch::StartsWith("override 'model.layers=[{dense: {unitz: 4}}]': unknown key "
                               "'model.layers[0].dense.unitz'"));
  CHECK_THAT(error_of("model: {type: layers}\n", {{"model.layers", "[{conv: {}}]"}}),
             Catch::StartsWith("override 'model.layers=[{conv: {}}]': model.layers[0]: conv "
                               "needs channels"));
  CHECK_THAT(error_of("", {{"data.synthetic", "{train_size: -5}"}}),
             Catch::StartsWith("override 'data.synthetic={train_size: -5}': "
                               "data.synthetic.train_size: must be"));
  // The same mistakes in the file point at their lines.
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - relu\n    - bogus\n"),
             Catch::StartsWith("exp.yaml:5: model.layers[1]: unknown layer 'bogus'"));
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - {conv: {}}\n"),
             Catch::StartsWith("exp.yaml:4: model.layers[0]: conv needs channels"));
}

TEST_CASE("a layer's width is bounded, so no parameter count can pass 64 bits",
          "[config][errors]") {
  CHECK(error_of("model:\n  type: resnet\n  widths: [2000000000, 1, 1]\n") ==
        "exp.yaml:3: model.widths: every entry must be in [1, 1048576], found 2000000000");
  CHECK_THAT(error_of("", {{"model.hidden", "[1048577]"}}),
             Catch::Contains("model.hidden: every entry must be in [1, 1048576], found 1048577"));
  CHECK_THAT(
      error_of("model: {type: layers}\n", {{"model.layers", "[{conv: {channels: 4000000}}]"}}),
      Catch::Contains("must be in [1, 1048576], got 4000000"));
  CHECK_THAT(error_of("model: {type: layers}\n", {{"model.layers", "[{dense: {units: 0}}]"}}),
             Catch::Contains("must be in [1, 1048576], got 0"));
  CHECK(error_of("model:\n  hidden: [1048576]\n").empty());  // the bound itself is taken
}

TEST_CASE("gpus must be positive", "[config][errors]") {
  CHECK(error_of("gpus: 0\n") == "exp.yaml:1: gpus: must be in [1, 4096], got 0");
  CHECK(error_of("gpus: -2\n") == "exp.yaml:1: gpus: must be in [1, 4096], got -2");
  CHECK_THAT(error_of("", {{"gpus", "0"}}), Catch::StartsWith("override 'gpus=0': gpus: must be"));
}

TEST_CASE("a batch that cannot be split across replicas is rejected", "[config][errors]") {
  const auto e = error_of("gpus: 3\ntrain: {global_batch: 100}\n");
  CHECK_THAT(e, Catch::Contains("train.global_batch=100 cannot be split evenly across gpus=3"));
  CHECK_THAT(e, Catch::Contains("multiple of 3 (e.g. 99 or 102)"));
  CHECK_THAT(error_of("train: {global_batch: 64, per_replica_batch: 16}\n"),
             Catch::Contains("exactly one of per_replica_batch and global_batch"));
}

TEST_CASE("cross-field and name rules are enforced", "[config][errors]") {
  CHECK_THAT(error_of("train: {epochs: 2}\noptimizer: {warmup_epochs: 3}\n"),
             Catch::Contains("optimizer.warmup_epochs=3 exceeds train.epochs=2; give "
                             "warmup_epochs at most 2") &&
                 Catch::Contains("add optimizer.warmup_epochs=1, or 0 for none"));
  CHECK_THAT(error_of("name: a/b\n"),
             Catch::Contains("exp.yaml:1: name: must be a folder name of 1 to 200 bytes without '/'"));
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - dense\n"),
             Catch::Contains("dense needs units"));
  // Controls outside ASCII too: C1 (U+0085) and a right-to-left override (U+202E); letters
  // outside ASCII are names like any other.
  for (const char* bad : {"name: \"a\\u0085b\"\n", "name: \"exp\\u202Egnp.sh\"\n"})
    CHECK_THAT(error_of(bad), Catch::Contains("name: must not hold control characters"));
  CHECK(error_of("name: \"Gr\\u00fc\\u00dfe-\\u5b9f\\u9a13\"\n").empty());
}

TEST_CASE("a resolved config quotes text that YAML would read as something else",
          "[config]") {
  // dtrain reads every value back as written; other YAML readers take a plain true, no, 123 or
  // 0x10 for a boolean or a number, so such texts are written quoted.
  for (const char* name : {"true", "No", "123", "1e5", "0x10", "null", "~", "-.inf"}) {
    INFO(name);
    const Config c = parse_config(std::string("name: \"") + name + "\"\n", "exp.yaml");
    const std::string yaml = to_yaml(c);
    CHECK_THAT(yaml, Catch::Contains(std::string("name: \"") + name + "\"\n"));
    CHECK(parse_config(yaml, "resolved.yaml").name == name);
  }
  const std::string plain = to_yaml(parse_config("name: exp-1\n", "exp.yaml"));
  CHECK_THAT(plain, Catch::Contains("name: exp-1\n"));
}

TEST_CASE("YAML the config reader does not take is named for what it is", "[config][errors]") {
  CHECK_THAT(error_of("name: m\ntrain:\n  <<: {epochs: 1}\n"),
             Catch::Contains("unknown key 'train.<<' (a YAML merge key: dtrain does not merge "
                             "maps; write the keys out)"));
  const std::string deep = std::string(3000, '[') + std::string(3000, ']');
  CHECK_THAT(error_of("model: {layers: " + deep + "}\n"),
             Catch::Contains("nested more than 64 levels deep"));
  CHECK_THAT(error_of("name: m\n", {parse_override("gpus=2\n---\nname: e")}),
             Catch::Contains("holds more than one YAML document"));
  // A comment on a command line would cut the value short without a word (data.path=/a #b
  // read /a): refused, with the quoting that keeps it.
  // A quote inside a plain word is a character, not the start of a quoted string.
  for (const std::string v : {"/data/a #b", "#b", "[1, 2] # two", "x\t#y", "a\n#b", "/a/it's #b",
                              "O\"Brien #x", "a \"b #c\""})
    CHECK_THAT(error_of("name: m\n", {parse_override("data.path=" + v)}),
               Catch::Contains("'#' there starts a YAML comment") &&
                   Catch::Contains("e.g. data.path='\"/data/set #2\"'"));
  // Inside quotes, or not after a blank, '#' is part of the value.
  CHECK(parse_config("name: m\n", "m.yaml", {parse_override("data.path='/data/a #b'")}).data.path ==
        "/data/a #b");
  CHECK(parse_config("name: m\n", "m.yaml", {parse_override("data.path=\"a #b\"")}).data.path ==
        "a #b");
  CHECK(parse_config("name: m\n", "m.yaml", {parse_override("data.path=/data/a#b")}).data.path ==
        "/data/a#b");
  CHECK(parse_config("name: m\ndata: {dataset: bytes, path: x}\nmodel: {type: gpt}\n", "m.yaml",
                     {parse_override("data.exclude=['a #b', \"c #d\"]")})
            .data.exclude == std::vector<std::string>{"a #b", "c #d"});
  CHECK(parse_config("name: m\n", "m.yaml", {parse_override("data.path=/a/it's")}).data.path ==
        "/a/it's");
  // A sweep list splits at commas outside quotes, any quote opening them (name=a"b,c is one).
  CHECK(split_values("'a,b',c") == std::vector<std::string>{"'a,b'", "c"});
  CHECK(split_values("a\"b,c") == std::vector<std::string>{"a\"b,c"});
}

TEST_CASE("override syntax errors are clear", "[config][errors]") {
  CHECK_THROWS_WITH(parse_override("gpus"),
                    Catch::Contains("expected key=value") && !Catch::Contains("joined by commas"));
  CHECK_THROWS_WITH(parse_override("2"),
                    Catch::Contains("expected key=value") &&
                        Catch::Contains("joined by commas, e.g. --workers 1,2"));
  CHECK_THROWS_WITH(parse_override("a..b=1"), Catch::Contains("malformed key"));
  CHECK_THROWS_AS(parse_override("=3"), UserError);
}

TEST_CASE("a run id fits in a file name, however long the swept value", "[config][plan]") {
  PlannedRun r;
  r.config.gpus = 2;
  r.label = "hidden" + std::string(300, '4');
  const std::string id = run_id("t", r);
  CHECK(id.size() == 249);
  CHECK(id.rfind("t-g2-hidden444", 0) == 0);
  PlannedRun other = r;
  other.label.back() = '5';  // differs only past the cut
  CHECK(run_id("t", other) != id);
  CHECK(run_id("t", other).size() == 249);
  CHECK(run_id("t", r) == id);  // the same for every command that plans it
  r.label = "lr0.1";
  CHECK(run_id("t", r) == "t-g2-lr0.1");
}

TEST_CASE("a run's group is the same whatever order its overrides were given in",
          "[config][plan]") {
  test::TempDir d("group-order");
  const std::string cfg = d.write("g.yaml",
                                  "name: g\ndata:\n  dataset: synthetic\n"
                                  "  synthetic: {train_size: 256, test_size: 32, shape: [8], "
                                  "classes: 2}\ntrain: {epochs: 3}\n");
  const auto a = plan_runs(cfg, {"train.epochs=2", "optimizer.lr=0.2", "gpus=1"});
  const auto b = plan_runs(cfg, {"gpus=1,4", "optimizer.lr=0.2", "train.epochs=2"});
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 2);
  CHECK(a[0].group == "lr0.2-epochs2");  // optimizer.lr before train.epochs
  CHECK(b[0].group == a[0].group);
  CHECK(b[1].group == a[0].group);
  // The swept keys' label keeps the order given: it names folders a sweep already wrote.
  const auto c = plan_runs(cfg, {"train.epochs=2,3", "optimizer.lr=0.1,0.2"});
  CHECK(c[1].label == "epochs2-lr0.2");
  CHECK(c[1].group == "lr0.2-epochs2");
}

TEST_CASE("comma lists split outside brackets", "[config][plan]") {
  CHECK(split_values("1,2,4") == std::vector<std::string>{"1", "2", "4"});
  CHECK(split_values("[512,256],[64]") == std::vector<std::string>{"[512,256]", "[64]"});
  CHECK(split_values("0.1") == std::vector<std::string>{"0.1"});
  // Quoted values keep their commas, and an escaped quote does not end a double-quoted one.
  CHECK(split_values(R"("a,b",'c,d')") == std::vector<std::string>{R"("a,b")", "'c,d'"});
  CHECK(split_values(R"("a\",b",c)") == std::vector<std::string>{R"("a\",b")", "c"});
  CHECK(split_values(R"('it''s,x',y)") == std::vector<std::string>{"'it''s,x'", "y"});
}

TEST_CASE("closest_match finds typos and ignores unrelated words", "[config]") {
  CHECK(closest_match("lr_scalling", {"lr", "lr_scaling", "schedule"}) == "lr_scaling");
  CHECK(closest_match("qqqqqqqqqq", {"lr", "schedule"}).empty());
}

TEST_CASE("YAML that is not one plain config is refused with one line", "[config][errors]") {
  // Complex keys: a list or a mapping where a name belongs, at the top and inside a section.
  CHECK(error_of("? [a, b]\n: 1\n") == "exp.yaml:1: a key must be a plain name, not a list or null");
  CHECK(error_of("train:\n  ? {x: 1}\n  : 2\n") ==
        "exp.yaml:2: a key must be a plain name, not a mapping");
  CHECK_THAT(error_of("model:\n  layers:\n    - {? [k]: 1}\n"),
             Catch::Contains("a key must be a plain name"));
  // A second document would be ignored silently.
  CHECK(error_of("name: a\n---\nname: b\n") ==
        "exp.yaml: holds more than one YAML document (separated by '---'); a config is one "
        "document");
  CHECK(error_of("---\nname: a\n---\n") == "");  // markers alone make no second document
  // Found by fuzzing: yaml-cpp's LoadAll never returns on this.
  const auto started = std::chrono::steady_clock::now();
  (void)error_of("# Quickstart: thK Fashion-MNIST MLP accumurmup_ep2chs: 2\n  ,schedule: cosine\n");
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  // A quote left open at the end of the file (yaml-cpp reads it as a string to the end).
  CHECK(error_of("name: x\nbackend: \"cpu\n") ==
        "exp.yaml:2: a quoted string is not closed before the end of the file");
  CHECK_THAT(error_of("name: 'x"), Catch::Contains("malformed YAML"));
  // Nesting deep enough to exhaust the stack is refused, not followed.
  CHECK(error_of("train: " + std::string(100, '[') + std::string(100, ']') + "\n") ==
        "exp.yaml:1: nested more than 64 levels deep");
  // Valid configs stay valid: a quote closed on the last line, a comment after the last key.
  CHECK(error_of("name: \"x\"") == "");
  CHECK(error_of("name: x # \"an open quote in a comment\n") == "");
}

TEST_CASE("aliases that expand to billions of values are refused at once", "[config][errors]") {
  // Eleven levels of ten aliases each: a 600-byte file that stands for 10^11 values.
  std::string laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    laughs += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) laughs += (k ? ", *a" : "*a") + std::to_string(i - 1);
    laughs += "]\n";
  }
  const auto started = std::chrono::steady_clock::now();
  CHECK_THAT(error_of(laughs), Catch::StartsWith("exp.yaml: holds more than 100000 values"));
  // The same inside an override's value.
  std::string value = "[&b0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]";
  for (int i = 1; i < 12; ++i) {
    value += ", &b" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) value += (k ? ", *b" : "*b") + std::to_string(i - 1);
    value += "]";
  }
  value += "]";
  CHECK_THAT(error_of("", {{"model.hidden", value}}),
             Catch::StartsWith("override 'model.hidden=") &&
                 Catch::Contains("holds more than 100000 values"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  // A few aliases, as people use them, still work.
  CHECK(error_of("model: {hidden: &h [32, 16]}\ndata: {dataset: synthetic, synthetic: "
                 "{shape: *h}}\n") == "");
}

TEST_CASE("a key given twice is an error naming both lines", "[config][errors]") {
  CHECK(error_of("name: x\ntrain: {epochs: 2}\ntrain: {epochs: 5}\n") ==
        "exp.yaml:3: duplicate key 'train' (first given on line 2); give each key once");
  CHECK(error_of("train:\n  epochs: 2\n  per_replica_batch: 8\n  epochs: 7\n") ==
        "exp.yaml:4: duplicate key 'epochs' (first given on line 2); give each key once");
  CHECK_THAT(error_of("", {{"data.synthetic", "{train_size: 8, train_size: 9}"}}),
             Catch::StartsWith("override 'data.synthetic={train_size: 8, train_size: 9}':1: "
                               "duplicate key 'train_size'"));
}

TEST_CASE("a NUL byte anywhere in a config is refused with its line", "[config][errors]") {
  CHECK(error_of(std::string("name: x\nbackend: cpu\nname2: a\0b\n", 32)) ==
        "exp.yaml:3: holds a NUL byte; a config is UTF-8 text");
}

TEST_CASE("integers are decimal: a leading zero or 0x is refused, not read as octal or hex",
          "[config][errors]") {
  CHECK(error_of("train: {epochs: 010}\n") ==
        "exp.yaml:1: train.epochs: expected an integer, got '010' (no leading "
        "zero: YAML may read 010 as octal 8 and 0x10 as 16)");
  CHECK_THAT(error_of("", {{"train.epochs", "0x10"}}),
             Catch::Contains("expected an integer, got '0x10' (no leading zero"));
  CHECK_THAT(error_of("model: {hidden: [64, 016]}\n"),
             Catch::Contains("model.hidden: expected a list of integers, found '016' (no "
                             "leading zero"));
  // Plain decimal, signed or zero, still reads.
  const Config c = parse_config("train: {epochs: 10, seed: 0}\ngpus: +2\n", "exp.yaml");
  CHECK(c.train.epochs == 10);
  CHECK(c.train.seed == 0);
  CHECK(c.gpus == 2);
  // Digits past 64 bits name the key's range, not a type.
  CHECK(error_of("gpus: 9223372036854775808\n") ==
        "exp.yaml:1: gpus: must be in [1, 4096], got 9223372036854775808");
  CHECK_THAT(error_of("", {{"train.seed", "18446744073709551615"}}),
             Catch::Contains("train.seed: must be at most 9223372036854775807, got "
                             "18446744073709551615"));
  CHECK_THAT(error_of("train: {seed: -99999999999999999999}\n"),
             Catch::Contains("train.seed: must be >= 0, got -99999999999999999999"));
}

TEST_CASE("a number beyond a double's range is refused, not read as 0 or as no number",
          "[config][errors]") {
  CHECK(error_of("optimizer: {lr: 1e-400}\n") ==
        "exp.yaml:1: optimizer.lr: '1e-400' is too small for a number (the smallest is "
        "2.2e-308; write 0 for zero)");
  CHECK_THAT(error_of("optimizer: {lr: 1e309}\n"),
             Catch::Contains("optimizer.lr: '1e309' is out of range"));
  CHECK_THAT(error_of("", {{"optimizer.lr", "-1e400"}}),
             Catch::Contains("'-1e400' is out of range"));
  CHECK_THAT(error_of("data: {normalize: channel, mean: [0.5, 1e-999, 0.5]}\n"),
             Catch::Contains("'1e-999' is too small for a number"));
  // Within range, however small or large, a number reads as written.
  const Config c = parse_config("optimizer: {lr: 1e-300, weight_decay: 0}\n", "exp.yaml");
  CHECK(c.optimizer.lr == 1e-300);
  CHECK(c.optimizer.weight_decay == 0);
}

TEST_CASE("products of user numbers are checked before they can wrap around", "[config][errors]") {
  CHECK_THAT(error_of("gpus: 2\ntrain: {per_replica_batch: 4611686018427387904}\n"),
             Catch::Contains("the global batch (train.per_replica_batch=4611686018427387904 x "
                             "gpus=2 x accumulation_steps=1) is over 2147483648"));
  CHECK_THAT(error_of("gpus: 4096\ntrain: {per_replica_batch: 1, accumulation_steps: 1048576}\n"),
             Catch::Contains("gpus x train.accumulation_steps is over"));
  CHECK_THAT(
      error_of("data: {dataset: synthetic, synthetic: {shape: [4294967296, 4294967296]}}\n"),
      Catch::Contains("data.synthetic.shape: 4294967296 x 4294967296 features in all is over"));
  // Large but sound values still pass.
  CHECK(error_of("gpus: 1024\ntrain: {per_replica_batch: 1024, accumulation_steps: 16}\n") == "");
}

TEST_CASE("names and paths are UTF-8 text and names are visible folder names", "[config][errors]") {
  // Raw bytes that are not UTF-8 (a Latin-1 e-acute; a lone 0xff).
  CHECK(error_of("name: caf\xe9\n") == "exp.yaml:1: name: must be UTF-8 text without NUL bytes");
  CHECK_THAT(error_of("data: {path: /tmp/x\xff}\n"),
             Catch::Contains("data.path: must be UTF-8 text without NUL bytes"));
  CHECK_THAT(error_of("name: \"a\\0b\"\n"), Catch::Contains("without NUL bytes"));
  CHECK(error_of("name: \"caf\\u00e9 \\u5b9e\\u9a8c\"\n") == "");  // UTF-8 is fine
  CHECK_THAT(error_of("name: .hidden\n"), Catch::Contains("not starting with '.'"));
  CHECK_THAT(error_of("name: " + std::string(201, 'x') + "\n"),
             Catch::Contains("1 to 200 bytes"));
  CHECK(error_of("name: " + std::string(200, 'x') + "\n") == "");
}

TEST_CASE("the per-replica batch default is a member initialiser, used until a batch is given",
          "[config]") {
  const Config d;
  CHECK(d.train.per_replica_batch == 64);
  CHECK_FALSE(d.train.global_batch);
  CHECK(d.micro_batch() == 64);
  // A given global batch defines the run; null clears a per-replica batch the file gave.
  const Config g = parse_config("gpus: 4\ntrain: {per_replica_batch: 8}\n", "exp.yaml",
                                {{"train.global_batch", "64"}, {"train.per_replica_batch", "null"}});
  CHECK(g.micro_batch() == 16);
  CHECK(g.global_batch() == 64);
  CHECK_THAT(to_yaml(g), Catch::Contains("global_batch: 64") &&
                             !Catch::Contains("per_replica_batch:"));
}

TEST_CASE("batch products are taken in 64 bits and checked", "[config][errors]") {
  // 65536 x 65536 passes 2^31: an int product would wrap, the 64-bit one does not.
  Config c;
  c.gpus = 65536;
  c.train.accumulation_steps = 65536;
  c.train.per_replica_batch = 1;
  CHECK(c.global_batch() == int64_t{1} << 32);
  c.train.global_batch = int64_t{1} << 33;
  CHECK(c.micro_batch() == 2);
  // Past 64 bits is an error, not a wrapped number.
  c.train.global_batch.reset();
  c.train.per_replica_batch = int64_t{1} << 40;
  CHECK_THROWS_WITH(c.global_batch(), Catch::Contains("is not a positive 64-bit integer"));
  c.gpus = 0;
  c.train.global_batch = 64;
  CHECK_THROWS_AS(c.micro_batch(), UserError);
  // The decoder holds the default batch to the same limit as a given one.
  CHECK_THAT(error_of("gpus: 4096\ntrain: {accumulation_steps: 65536}\n"),
             Catch::Contains("the global batch (train.per_replica_batch=64 x gpus=4096 x "
                             "accumulation_steps=65536) is over 2147483648"));
}

TEST_CASE("data.normalize reads true as global, and mean and std match the channels",
          "[config][normalize]") {
  const auto cfg = [](const std::string& yaml) { return parse_config(yaml, "exp.yaml"); };
  CHECK(cfg("data: {normalize: true}\n").data.normalize == Normalize::global);
  CHECK(cfg("data: {normalize: false}\n").data.normalize == Normalize::off);
  const Config c = cfg(
      "data: {dataset: cifar10, normalize: channel, mean: [0.4914, 0.4822, 0.4465], "
      "std: [0.2470, 0.2435, 0.2616]}\n");
  CHECK(c.data.normalize == Normalize::channel);
  CHECK(c.data.mean == std::vector<double>{0.4914, 0.4822, 0.4465});
  CHECK(c.data.stddev == std::vector<double>{0.2470, 0.2435, 0.2616});
  CHECK(parse_config(to_yaml(c), "resolved.yaml").data.stddev == c.data.stddev);
  CHECK_THAT(to_yaml(cfg("data: {normalize: true}\n")), Catch::Contains("normalize: global"));
  CHECK(error_of("data: {dataset: cifar10, normalize: channel, mean: [0.5, 0.5]}\n") ==
        "exp.yaml:1: data.mean: needs 3 entries (normalize: channel, 3 channels), got 2");
  CHECK(error_of("data: {normalize: global, std: [0.5, 0.5]}\n") ==
        "exp.yaml:1: data.std: needs 1 entry (normalize: global, 1 channel), got 2");
  CHECK(error_of("data: {normalize: false, mean: [0.5]}\n") ==
        "exp.yaml:1: data.mean: given, but data.normalize is false; give normalize: channel");
  CHECK_THAT(error_of("data: {dataset: synthetic, normalize: channel}\n"),
             Catch::StartsWith("exp.yaml:1: data.normalize: channel needs image data"));
  CHECK_THAT(error_of("data: {std: [0]}\n"),
             Catch::StartsWith("exp.yaml:1: data.std: every entry must be in [1e-06, 1000]"));
  CHECK_THAT(error_of("data: {mean: 0.5}\n"),
             Catch::StartsWith("exp.yaml:1: data.mean: expected a list of numbers"));
}

TEST_CASE("reflect padding below the image size, and label smoothing below 1", "[config][errors]") {
  CHECK(parse_config("data: {dataset: cifar10, augment: {crop_padding: 4, padding_mode: reflect}}",
                     "exp.yaml")
            .data.augment.padding_mode == PaddingMode::reflect);
  CHECK(error_of("data: {dataset: cifar10, augment: {crop_padding: 32, padding_mode: reflect}}\n") ==
        "exp.yaml:1: data.augment.crop_padding: reflect padding needs crop_padding below the "
        "image's height and width (32 x 32), got 32");
  // Zero padding has no such limit.
  CHECK_NOTHROW(parse_config("data: {augment: {crop_padding: 40}}\n", "exp.yaml"));
  CHECK(error_of("train: {label_smoothing: 1}\n") ==
        "exp.yaml:1: train.label_smoothing: must be in [0, 0.999], got 1");
}
