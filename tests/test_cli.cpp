// End to end: the dtrain binary on small synthetic experiments and on bad input.
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/backend/device.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/results/plots.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;

using namespace dtrain::test;

namespace {

const char* kTiny = R"(name: tiny
gpus: 1
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 512, test_size: 128, shape: [8], classes: 3, noise: 1.0}
model: {hidden: [16]}
train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0.5}
optimizer: {lr: 0.05, base_batch: 16}
)";

}  // namespace

TEST_CASE("command-line mistakes are one line naming the command and its help", "[cli][errors]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run /dev/null --bogus",
       "dtrain: error: run: The following argument was not expected: --bogus; see dtrain run "
       "--help"},
      {"run", "dtrain: error: run: config is required; see dtrain run --help"},
      {"bench-comm --iters abc", "dtrain: error: bench-comm: Could not convert: --iters = abc"},
      {"sweep x.yaml", "dtrain: error: unknown command 'sweep'; valid: run | validate |"},
      {"--bogus", "dtrain: error: unknown option '--bogus' before any command"},
      {"", "dtrain: error: give a command, e.g. dtrain run CONFIG; see dtrain --help"},
  };
  for (const auto& [args, want] : cases) {
    INFO(args);
    const auto r = dtrain_cli(args);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(count_lines(r.out) == 1);
    CHECK(r.out.rfind(want, 0) == 0);
  }
}

TEST_CASE("the run index is valid CSV whatever the name and overrides hold", "[cli]") {
  TempDir s("cli-index");
  const auto cfg = s.write("tiny.yaml", kTiny);
  const auto res = s.path / "res";
  // A name with a quote and a comma, and an override list with commas of its own.
  const auto r = dtrain_cli("run " + cfg + " 'name=a\"b,c' 'model.hidden=[8,4]' --results " +
                            res.string() + " --tag q --quiet");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string csv = slurp(res / "a\"b,c" / "index-q.csv");
  INFO(csv);
  // RFC 4180: split the data row into fields, honouring quotes.
  const std::string row = csv.substr(csv.find('\n') + 1);
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < row.size() && !(row[i] == '\n' && !quoted); ++i) {
    const char ch = row[i];
    if (ch == '"' && quoted && i + 1 < row.size() && row[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += ch;
    }
  }
  REQUIRE(fields.size() == 6);  // run_id,status,gpus,group,overrides,dir
  CHECK(fields[1] == "done");
  CHECK(fields[4].find("name=a\"b,c") != std::string::npos);
  CHECK(fields[4].find("model.hidden=[8,4]") != std::string::npos);
  CHECK(fields[5].find("a\"b,c") != std::string::npos);
}

TEST_CASE("dtrain run writes complete run folders and a comparison table", "[cli]") {
  TempDir s("cli");
  const auto cfg = s.write("tiny.yaml", kTiny);
  const auto res = (s.path / "res").string();
  const auto r = dtrain_cli("run " + cfg + " gpus=1,2,4 --results " + res + " --tag t");
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (int g : {1, 2, 4}) {
    const fs::path run = fs::path(res) / "tiny" / ("t-g" + std::to_string(g));
    CHECK(slurp(run / "status") == "done\n");
    CHECK(slurp(run / "overrides.txt") == "gpus=" + std::to_string(g) + "\n");
    CHECK_THAT(slurp(run / "config.resolved.yaml"), Catch::Contains("gpus: " + std::to_string(g)) &&
                                                        Catch::Contains("lr_scaling: linear"));
    const auto csv = slurp(run / "metrics.csv");
    CHECK_THAT(csv, Catch::StartsWith("epoch,lr,lr_end,train_loss,train_acc,test_loss,test_acc,"
                                      "epoch_time_s,samples_per_s"));
    CHECK(count_lines(csv) == 3);
    const auto j = nlohmann::json::parse(slurp(run / "summary.json"));
    for (const char* key :
         {"final_test_accuracy", "best_test_accuracy", "final_train_loss", "median_epoch_time_s",
          "samples_per_s", "time_to_target_s", "gpus", "global_batch", "backend", "status"})
      CHECK(j.contains(key));
    CHECK(j["gpus"] == g);
    CHECK(j["global_batch"] == 16 * g);
    CHECK(j["peak_lr"].get<double>() == Approx(0.05 * g));
    CHECK(j["status"] == "done");
    CHECK(fs::exists(run / "log"));
  }
  CHECK_THAT(r.out, Catch::Contains("| t-g4") && Catch::Contains("speedup"));
  CHECK(fs::exists(fs::path(res) / "tiny" / "comparison-t.md"));
  // The 2- and 4-replica runs shared this machine's cores: the table says what their speedup is.
  CHECK_THAT(slurp(fs::path(res) / "tiny" / "comparison-t.md"),
             Catch::Contains("Simulated on one machine (replicas sharing its CPU cores, or one "
                             "GPU): t-g2, t-g4."));
  // Runs of one epoch: the table says that their times include the start.
  CHECK_THAT(slurp(fs::path(res) / "tiny" / "comparison-t.md"), !Catch::Contains("One epoch"));
  REQUIRE(
      dtrain_cli("run " + cfg + " gpus=1,2 train.epochs=1 --quiet --results " + res + " --tag o")
          .code == 0);
  CHECK_THAT(slurp(fs::path(res) / "tiny" / "comparison-o.md"),
             Catch::Contains("One epoch only: o-g1, o-g2. Such a time includes the start"));
  CHECK_THAT(slurp(fs::path(res) / "tiny" / "t-g4" / "summary.json"),
             Catch::Contains("\"replica_mode\": \"shared\""));
  CHECK(count_lines(slurp(fs::path(res) / "tiny" / "comparison-t.csv")) == 4);

  // The same command again must not overwrite anything.
  const auto again = dtrain_cli("run " + cfg + " gpus=1 --results " + res + " --tag t");
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Catch::Contains("t-g1: run folder already exists"));
}

// Without --tag a command's runs are named by the UTC second it started: a second command in
// that second (taken here by folders made for the next two minutes) gets <second>-2.
TEST_CASE("a command without --tag never collides with one started in the same second", "[cli]") {
  TempDir s("cli-tag");
  const auto cfg = s.write("tiny.yaml", kTiny);
  const fs::path exp = s.path / "res" / "tiny";
  std::vector<std::string> seconds;
  const std::time_t now = std::time(nullptr);
  for (std::time_t t = now; t < now + 120; ++t) {
    std::tm tm{};
    gmtime_r(&t, &tm);
    char tag[32];
    std::strftime(tag, sizeof tag, "%Y%m%d-%H%M%S", &tm);
    seconds.push_back(tag);
    fs::create_directories(exp / (seconds.back() + "-g1"));
  }
  const auto r = dtrain_cli("run " + cfg + " --results " + (s.path / "res").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  int made = 0;
  for (const auto& sec : seconds) made += fs::exists(exp / (sec + "-2-g1") / "summary.json");
  CHECK(made == 1);
  CHECK_THAT(r.out, !Catch::Contains("already exists"));
}

TEST_CASE("an address-space limit too small to start is one line, never a hang", "[cli][errors]") {
#ifdef DTRAIN_TEST_ASAN
  WARN("SKIPPED: AddressSanitizer maps terabytes of shadow memory: no ulimit -v leaves it room");
#else
  // Below about 1 GiB the libraries cannot start: the dynamic loader fails (the CUDA libraries
  // are large), or OpenBLAS cannot start its threads, before dtrain's code runs. Above it,
  // OpenBLAS's worker threads could not take their buffers and waited for ever, and dtrain
  // with them, even for --version. Every limit must end, one way or the other; where dtrain's
  // check speaks, in one line.
  bool refused = false;
  for (int mib = 400; mib <= 2000; mib += 100) {
    const auto r = shell("ulimit -v " + std::to_string(mib * 1024) + " && exec timeout 30 " +
                         dtrain_binary() + " --version");
    INFO(mib << " MiB: exit " << r.code << "\n" << r.out);
    CHECK(r.code != 124);  // timeout: hung
    if (r.code != 2) continue;
    CHECK(count_lines(r.out) == 1);
    CHECK_THAT(r.out, Catch::StartsWith("dtrain: error: the address-space limit (ulimit -v) is " +
                                        std::to_string(mib) + " MiB"));
    refused = true;
  }
  CHECK(refused);
  const auto ample =
      shell("ulimit -v 8388608 && exec timeout 30 " + dtrain_binary() + " --version");
  INFO(ample.out);
  CHECK(ample.code == 0);
#endif
}

TEST_CASE("user mistakes give one line and exit code 2", "[cli][errors]") {
  TempDir s("cli");
  const auto good = s.write("tiny.yaml", kTiny);
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"run " + s.write("bad.yaml", "name: x\ntrain: [1, 2\n"), "bad.yaml:"},
      {"run " + s.write("typo.yaml", "name: x\nmodle: {}\n"), "did you mean 'model'"},
      {"run " + good + " gpus=0", "override 'gpus=0': gpus: must be in [1, 4096], got 0"},
      {"run " + good + " gpus=three", "gpus: expected an integer, got 'three'"},
      {"run " + good + " replicas=", "override 'replicas=': no value after '='"},
      {"run " + good + " data.path=", "(an empty string is \"data.path=''\" in the shell)"},
      {"explain " + good + " --seeds abc",
       "--seeds: 'abc' is not a number; give one from 1 to 100"},
      {"explain " + good + " --seeds 101", "--seeds: 101 is outside 1 to 100"},
      {"run " + good + " gpus=1,,2", "empty value in the comma list"},
      // A value twice, or two that read alike, would train one run twice under two names.
      {"run " + good + " gpus=1,2,1", "override 'gpus=1,2,1': 1 is in the comma list twice"},
      {"validate " + good + " optimizer.lr=0.1,0.10",
       "the comma lists make one run twice (optimizer.lr=0.1 and 0.10 read alike)"},
      // Two values one run folder name: validate refuses what run would.
      {"validate " + good + " \"data.path=" + s.path.string() + "/a b," + s.path.string() +
           "/a_b\"",
       "would share one run folder"},
      // A section given whole after a key inside it would drop that key.
      {"validate " + good + " train.epochs=3 'train={seed: 5}'",
       "override 'train={seed: 5}' replaces the whole train section, so the earlier "
       "train.epochs=... would be lost"},
      {"run " + good + " gpus=3 train.global_batch=32 train.per_replica_batch=null",
       "cannot be split evenly across gpus=3"},
      {"run " + good + " data.dataset=idx data.path=" + s.path.string(),
       "missing train-images-idx3-ubyte"},
      {"run " + good + " train.per_replica_batch=1024", "larger than the 512 training samples"},
      // /proc: every process folder has a status file, none is a run's.
      {"report /proc --out " + (s.path / "proc-report").string(), "no run folders"},
      // In a sweep, the run the mistake is in is named by its swept values.
      {"validate " + good + " train.per_replica_batch=16,1024",
       "the sweep's run per_replica_batch1024: " + good + ": train: global batch 1024"},
      {"validate " + good + " optimizer.lr_scaling=cubic", "expected one of none | linear | sqrt"},
      {"run " + good + " backend=cuda", "backend: cuda, but"},
      {"run " + good + " precision=fp16", "expected one of fp32 | tf32 | bf16"},
      {"run " + good + " data.augment.flip=true", "crops and flips need image data"},
      {"run " + good + " backend=cpu precision=tf32", "the CPU backend has no TF32"},
      {"run " + good + " train.bucket_mb=-1", "bucket_mb"},
      {"run " + good + " devices=[-1]", "devices: every entry must be >= 0"},
      {"run " + good + " --resume", "--resume needs --tag"},
      {"report " + s.path.string(), "no run folders"},
      {"run " + good + " --results /proc/dtrain-cannot-write",
       "cannot create the --results folder"},
      // Data keys' errors name the config file first, in every command that loads data.
      {"run " + good + " data.train_limit=1 --results " + (s.path / "r").string(),
       good + ": train: global batch"},
      {"validate " + good + " data.train_limit=1", good + ": train: global batch"},
      {"run " + (s.path / "nope.yaml").string(), "File does not exist"},
      {"run " + good + " --results ''", "give a path, not an empty string"},
      {"export-images " + good + " --out ''", "give a path, not an empty string"},
      {"report " + s.path.string() + " --out a --out b", "--out: given more than once"},
      {"run " + good + " --tag ''", "--tag: give a tag, not an empty string"},
      {"validate " + good + " optimizer.schedule=cosine optimizer.min_lr=0.05 optimizer.lr=0.025",
       "optimizer.min_lr=0.05 is above optimizer.lr=0.025"},
      {"validate " + good +
           " --no-data data.dataset=folder data.path=/nonexistent "
           "data.shape=[3,100000,100000]",
       "data.shape: every entry must be in [1, 8192], found 100000"},
      {"report " + s.path.string() + " --baseline ''", "give a run id, not an empty string"},
  };
  for (const auto& c : cases) {
    // Runs get a results folder of their own unless the case is about --results or --resume.
    const bool is_run = c.args.rfind("run ", 0) == 0 &&
                        c.args.find("--resume") == std::string::npos &&
                        c.args.find("--results") == std::string::npos;
    const auto r = dtrain_cli(c.args + (is_run ? " --results " + (s.path / "res").string() : ""));
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains(c.expect));
    CHECK(count_lines(r.out) <= 2);
  }
  // A mistake in the config file itself fails every run of a sweep alike: it is the file's,
  // not the first run's.
  const auto typo =
      dtrain_cli("validate " + (s.path / "typo.yaml").string() + " optimizer.lr=0.1,0.2 gpus=1,2");
  CHECK(typo.code == 2);
  CHECK_THAT(typo.out, Catch::Contains("typo.yaml") && !Catch::Contains("the sweep's run"));
  // None of them left a run folder behind.
  CHECK_FALSE(fs::exists(s.path / "res" / "tiny"));
}

TEST_CASE("dtrain validate accepts the shipped configs", "[cli]") {
  for (const auto& entry : fs::directory_iterator(dtrain::test::source_dir() + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const auto r = dtrain_cli("validate --no-data " + entry.path().string());
    INFO(entry.path() << "\n" << r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("valid"));
  }
}

// Without the data, the model's size comes from the config's shape where the config gives it
// (the same count as with the data), and a folder's classes are said to need the files.
TEST_CASE("validate --no-data --print counts the model from the config's shape", "[cli]") {
  const std::string cfgs = dtrain::test::source_dir() + "/configs/";
  const auto gpt = dtrain_cli("validate --no-data --print " + cfgs + "bytes-gpt.yaml");
  INFO(gpt.out);
  CHECK(gpt.code == 0);
  const auto with_data = dtrain_cli("validate --print " + cfgs + "bytes-gpt.yaml");
  const auto line = [](const std::string& out) {
    const auto at = out.find("# model: ");
    return at == std::string::npos ? std::string("none") : out.substr(at, out.find('\n', at) - at);
  };
  CHECK_THAT(line(gpt.out), Catch::Contains(" parameters; per sample "));
  if (with_data.code == 0) CHECK(line(gpt.out) == line(with_data.out));
  CHECK_THAT(gpt.out, Catch::Contains("# memory: needs the data"));
  TempDir s("cli-nodata");
  const auto folder = s.write("f.yaml", "name: f\ndata: {dataset: folder, path: /nowhere, "
                                        "shape: [3, 8, 8]}\n");
  const auto f = dtrain_cli("validate --no-data --print " + folder);
  CHECK(f.code == 0);
  CHECK_THAT(f.out, Catch::Contains("its size needs the data (folder classes are the files')"));
}

TEST_CASE("configs/bytes-gpt.yaml's pinned corpus is the installed fortunes package", "[cli]") {
  // scripts/install-deps.sh installs it; a machine without it has nothing to check.
  if (!fs::is_directory("/usr/share/games/fortunes")) {
    WARN("no /usr/share/games/fortunes (Debian's fortunes package): not checked");
    return;
  }
  const auto r = dtrain_cli("validate " + dtrain::test::source_dir() + "/configs/bytes-gpt.yaml");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains(
                        "train=36234 test=4026 shape=[65] classes=256 from /usr/share/games/fortunes "
                        "sha256=fbc2d796dde8ea64a51345ce4c18ff486a778a2d2259603987073bedb3fc3cd7"));
}

TEST_CASE("help lists the subcommands and options", "[cli]") {
  const auto top = dtrain_cli("--help");
  CHECK(top.code == 0);
  CHECK_THAT(top.out, Catch::Contains("run") && Catch::Contains("validate"));
  const auto run = dtrain_cli("run --help");
  CHECK(run.code == 0);
  CHECK_THAT(run.out, Catch::Contains("--results") && Catch::Contains("--tag") &&
                          Catch::Contains("overrides"));
}

TEST_CASE("dtrain devices describes the CPU and the GPUs or why there are none", "[cli][cuda]") {
  const dtrain::GpuSystem sys = dtrain::query_gpus();
  const auto text = dtrain_cli("devices");
  CHECK(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("cpu: ") && Catch::Contains("hardware threads"));
  if (sys.gpus.empty())
    CHECK_THAT(text.out, Catch::Contains("no GPU: " + sys.none_reason));
  else
    CHECK_THAT(text.out, Catch::Contains("gpu 0: " + sys.gpus[0].name));
  const auto js = dtrain_cli("devices --json");
  REQUIRE(js.code == 0);
  const auto j = nlohmann::json::parse(js.out);
  CHECK(j["cuda_built"].get<bool>() == dtrain::cuda_built());
  CHECK(j["gpus"].size() == sys.gpus.size());
  CHECK(j["cpu"]["threads"].get<int>() > 0);
  // Winograd's convolutions: said where the convolution in use (the default, or
  // DTRAIN_CPU_CONV's) has them on this CPU (AVX-512), and in the text as in the JSON; never
  // with DTRAIN_CPU_CONV=onednn-direct.
  const bool wino = j["cpu"]["conv_winograd"].get<bool>();
  const dtrain::CpuConv conv = dtrain::cpu_conv_from_env();
  CHECK(wino == (conv == dtrain::CpuConv::onednn &&
                 dtrain::onednn_conv_kernel(conv, {32, 8, 8, 32, 3, 1, 1}, 8).find("wino") !=
                     std::string::npos));
  CHECK((text.out.find("Winograd's where they suit") != std::string::npos) == wino);
  if (dtrain::have_onednn()) {
    const auto direct =
        shell("DTRAIN_CPU_CONV=onednn-direct " + dtrain_binary() + " devices --json");
    REQUIRE(direct.code == 0);
    const auto jd = nlohmann::json::parse(direct.out);
    CHECK(jd["cpu"]["conv"] == "onednn-direct");
    CHECK_FALSE(jd["cpu"]["conv_winograd"].get<bool>());
  }
  // BatchNorm's fused passes: on unless DTRAIN_CPU_FUSE=off, which the text says; another
  // value is the command's error.
  CHECK(j["cpu"]["fuse"].get<bool>() == dtrain::cpu_fuse_from_env());
  const auto unfused = shell("DTRAIN_CPU_FUSE=off " + dtrain_binary() + " devices");
  CHECK(unfused.code == 0);
  CHECK_THAT(unfused.out, Catch::Contains("BatchNorm's passes unfused (DTRAIN_CPU_FUSE=off)"));
  const auto bad = shell("DTRAIN_CPU_FUSE=yes " + dtrain_binary() + " devices");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Catch::Contains("DTRAIN_CPU_FUSE=yes: valid values are on and off"));
  if (dtrain::cuda_built()) CHECK(j["cudnn"].get<std::string>().rfind("9.", 0) == 0);
}

TEST_CASE("a layer list that starts with an activation runs to the end", "[cli][model]") {
  // It used to validate, then die of a segfault (exit 139) with the run folder left 'running'.
  TempDir s("cli");
  const auto cfg = s.write("tiny.yaml", kTiny);
  const auto res = (s.path / "res").string();
  for (const std::string act : {"relu", "tanh", "gelu", "sigmoid"}) {
    const std::string layers = "model.type=layers 'model.layers=[" + act + "]'";
    const auto v = dtrain_cli("validate " + cfg + " " + layers);
    INFO(v.out);
    CHECK(v.code == 0);
    const auto r = dtrain_cli("run " + cfg + " gpus=1,2 " + layers + " --quiet --results " + res +
                              " --tag " + act);
    INFO(r.out);
    REQUIRE(r.code == 0);
    for (int g : {1, 2}) {
      const fs::path run = fs::path(res) / "tiny" / (act + "-g" + std::to_string(g));
      CHECK(slurp(run / "status") == "done\n");
      const auto j = nlohmann::json::parse(slurp(run / "summary.json"));
      CHECK(j["status"] == "done");
      CHECK_THAT(j["model"].get<std::string>(), Catch::StartsWith(act + " -> dense(8->3)"));
      CHECK(j["final_train_loss"].is_number());
    }
  }
}

TEST_CASE("validate builds every model shape and estimates its memory before any run starts",
          "[cli][errors][memory]") {
  TempDir t("whole");
  const auto cfg = t.path / "img.yaml";
  put(cfg,
      "name: img\nthreads: 1\n"
      "data: {dataset: synthetic, synthetic: {train_size: 512, test_size: 128, shape: [1, 8, 8], "
      "classes: 3}}\n"
      "model: {type: layers, layers: [{conv: {channels: 4, kernel: 3}}, flatten]}\n"
      "train: {epochs: 1, per_replica_batch: 16, target_accuracy: 0}\n");
  const std::string res = " --results " + (t.path / "res").string();
  // A 9x9 kernel on 8x8 maps: one line naming the layer, before any run folder exists.
  const std::string k9 = " 'model.layers=[{conv: {channels: 4, kernel: 9}}, flatten]'";
  auto r = dtrain_cli("validate " + cfg.string() + k9);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.find("model.layers[0] (conv)") != std::string::npos);
  r = dtrain_cli("run " + cfg.string() + " gpus=1,2" + k9 + res);
  CHECK(r.code == 2);
  CHECK_FALSE(std::filesystem::exists(t.path / "res" / "img"));
  // A residual body that cannot be added to its shortcut: one line naming the block and both
  // shapes.
  r = dtrain_cli("validate " + cfg.string() +
                 " 'model.layers=[{conv: {channels: 4, padding: 1}}, {residual: {shortcut: "
                 "identity, body: [{conv: {channels: 8, padding: 1}}]}}]'");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK_THAT(r.out, Catch::Contains("model.layers[1] (residual): the body's output [8, 8, 8] "
                                    "cannot be added to the identity shortcut's [4, 8, 8]"));
  // A hidden layer no machine holds: the estimate names the keys to lower.
  r = dtrain_cli("validate " + cfg.string() + " model.type=mlp 'model.hidden=[1048576,1048576]'");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.find("GiB available") != std::string::npos);
  CHECK(r.out.find("model.hidden") != std::string::npos);
  // Replicas sharing weights: the estimate counts one copy, and says so.
  r = dtrain_cli("validate " + cfg.string() +
                 " model.type=mlp 'model.hidden=[1048576,1048576]' gpus=4");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.find("GiB of shared weights and optimizer state + 4 replicas x") !=
        std::string::npos);
  // Large synthetic samples: the batch and the model are refused before any sample is drawn
  // (three samples of 3x4096x4096 take 600 MB and about 15 s to draw).
  const auto start = std::chrono::steady_clock::now();
  r = dtrain_cli("validate " + cfg.string() + " data.synthetic.shape=[3,4096,4096] " +
                 "data.synthetic.train_size=2 data.synthetic.test_size=1");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK_THAT(r.out, Catch::Contains("global batch 16") && Catch::Contains("larger than the 2"));
  r = dtrain_cli("validate " + cfg.string() + " data.synthetic.shape=[3,4096,4096] " +
                 "data.synthetic.train_size=32 data.synthetic.test_size=1 model.type=mlp " +
                 "'model.hidden=[1048576]'");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("GiB available") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  // A batch or evaluation chunk larger than the data needs no more memory than the data.
  r = dtrain_cli("run " + cfg.string() +
                 " model.type=mlp train.per_replica_batch=100000000 data.drop_remainder=false "
                 "train.eval_batch=100000000 --quiet" + res);
  INFO(r.out);
  CHECK(r.code == 0);
}

TEST_CASE("hostile inputs to the newer commands end with one line and exit 2", "[cli][errors]") {
  TempDir t("hostile2");
  const auto cfg = t.path / "t.yaml";
  put(cfg, tiny_config("t"));
  // A FIFO where a config belongs: refused at once instead of blocking on open.
  const auto fifo = t.path / "fifo.yaml";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* cmd : {"validate ", "doctor ", "explain "}) {
    const auto r = shell("timeout 20 " + dtrain_binary() + " " + cmd + fifo.string() + " gpus=2");
    INFO(cmd << r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("not a regular file") != std::string::npos);
  }
  const std::string res = " --results " + (t.path / "res").string();
  // A batch validate refuses is an error for doctor too, not a pitfall.
  auto r = dtrain_cli("doctor " + cfg.string() + " train.per_replica_batch=100000");
  CHECK(r.code == 2);
  // --seeds and train.seed together.
  r = dtrain_cli("explain " + cfg.string() + " gpus=2 train.seed=5 --seeds 2" + res);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("give either --seeds or train.seed") != std::string::npos);
  // bench-comm: more memory than the machine, more iterations than allowed.
  CHECK(dtrain_cli("bench-comm --sizes 64G:64G --out " + (t.path / "b").string()).code == 2);
  CHECK(dtrain_cli("bench-comm --sizes 4K:4K --iters 2000000 --out " + (t.path / "b").string())
            .code == 2);
  // project: sizes that would make an unbounded bucket list.
  REQUIRE(dtrain_cli("run " + cfg.string() + " --tag p --quiet" + res).code == 0);
  const std::string run = (t.path / "res" / "t" / "p-g1").string();
  for (const char* bad : {" --params 9223372036854775807", " --bucket-mb -5", " --bucket-mb nan",
                          " --params 1000000000 --bucket-mb 0.000004"}) {
    r = dtrain_cli("project " + run + bad);
    INFO(bad << r.out);
    CHECK(r.code == 2);
  }
  // report: names that slug the same keep their own tables.
  REQUIRE(dtrain_cli("run " + cfg.string() + " 'name=x{' --tag a --quiet" + res).code == 0);
  REQUIRE(dtrain_cli("run " + cfg.string() + " 'name=x}' --tag a --quiet" + res).code == 0);
  r = dtrain_cli("report " + (t.path / "res").string() + " --out " + (t.path / "rep").string());
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(t.path / "rep" / "x_.md"));
  CHECK(std::filesystem::exists(t.path / "rep" / "x_-2.md"));
  // And their own figures: each experiment's curves under its own stem.
  if (dtrain::gnuplot_available()) {
    const auto plots = t.path / "rep-plots";
    r = dtrain_cli("report " + (t.path / "res").string() + " --plots --out " + plots.string());
    CHECK(r.code == 0);
    int first = 0, second = 0;
    for (const auto& f : std::filesystem::directory_iterator(plots)) {
      const std::string n = f.path().filename().string();
      first += n.rfind("x_-curves", 0) == 0 && f.path().extension() == ".png";
      second += n.rfind("x_-2-curves", 0) == 0 && f.path().extension() == ".png";
    }
    CHECK(first == 1);
    CHECK(second == 1);
  }
  CHECK(dtrain_cli("report " + (t.path / "res").string() + " --by train.seed --by train.seed")
            .code == 2);
  // A file where a results folder belongs, an empty sample shape, and a value that YAML would
  // read as a directive: each named.
  r = dtrain_cli("report " + cfg.string());
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("not a folder (give a results folder"));
  r = dtrain_cli("validate " + cfg.string() + " 'data.synthetic.shape=[]'");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("data.synthetic.shape: give a sample's shape"));
  r = dtrain_cli("validate " + cfg.string() + " 'model.activation=%s%n'");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("%s%n"));
  CHECK(r.out.find("got nothing") == std::string::npos);
}

TEST_CASE("a quiet run quiets the terminal, not the run folder's log", "[cli]") {
  TempDir t("quiet-log");
  const auto cfg = t.path / "t.yaml";
  put(cfg, tiny_config("t"));
  const auto r = dtrain_cli("run " + cfg.string() + " --quiet --tag q --results " +
                            (t.path / "res").string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("info") == std::string::npos);
  const std::string log = slurp(t.path / "res" / "t" / "q-g1" / "log");
  CHECK(log.find(" info epoch ") != std::string::npos);
  CHECK(log.find("per replica x") != std::string::npos);
  // A tag is its folders' name as given: 'c%1' and 'c$1' would otherwise both be c_1, and a
  // --resume of one continue the other's runs.
  for (const std::string tag : {"'a b'", "'c%1'", "'c$1'", "'{}'"}) {
    const auto a = dtrain_cli("run " + cfg.string() + " --quiet --tag " + tag + " --results " +
                              (t.path / "res").string());
    INFO(tag << "\n" << a.out);
    CHECK(a.code == 2);
    CHECK(count_lines(a.out) == 1);
    CHECK_THAT(a.out, Catch::Contains("holds letters, digits and . _ - + only"));
  }
  CHECK_FALSE(std::filesystem::exists(t.path / "res" / "t" / "c_1-g1"));
}

TEST_CASE("a loop of symbolic links where a folder belongs is one line naming it, exit 2",
          "[cli][errors][report]") {
  TempDir t("link-loop");
  std::filesystem::create_symlink(t.path / "loopB", t.path / "loopA");
  std::filesystem::create_symlink(t.path / "loopA", t.path / "loopB");
  const std::string loop = (t.path / "loopA").string();
  for (const std::string& args : {"report " + loop, "explain-time " + loop + " " + loop}) {
    const auto r = shell("timeout 20 " + dtrain_binary() + " " + args + " 2>&1");
    INFO(args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK(count_lines(r.out) == 1);
    CHECK(r.out.find("loopA") != std::string::npos);
    CHECK(r.out.find("internal error") == std::string::npos);
  }
}

TEST_CASE("a sweep of a billion runs is refused at once, before any is planned",
          "[cli][errors][sweep]") {
  TempDir t("bigsweep");
  const auto cfg = t.path / "t.yaml";
  put(cfg, tiny_config("t"));
  std::string list;
  for (int i = 1; i <= 1000; ++i) list += (i > 1 ? "," : "") + std::to_string(i);
  const auto start = std::chrono::steady_clock::now();
  const auto r = dtrain_cli("validate " + cfg.string() + " train.seed=" + list +
                            " train.epochs=" + list + " train.eval_batch=" + list);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.find("more than 10000 runs (1000 train.seed x 1000 train.epochs x 1000 "
                   "train.eval_batch)") != std::string::npos);
  CHECK(s < 10);
}

TEST_CASE("a FIFO in a run folder is named as unreadable and never waited on", "[cli][errors][report]") {
  TempDir t("fifo-run");
  const auto run = t.path / "exp" / "r1";
  std::filesystem::create_directories(run);
  put(run / "status", "done\n");
  REQUIRE(::mkfifo((run / "summary.json").c_str(), 0600) == 0);
  const auto r = shell("timeout 20 " + dtrain_binary() + " report " + t.path.string() +
                       " --out " + (t.path / "rep").string() + " 2>&1");
  INFO(r.out);
  CHECK(r.code == 1);  // a run could not be read; the report of the rest is written
  CHECK(r.out.find("summary.json: not a regular file") != std::string::npos);
  CHECK(r.out.find("unreadable (done)") != std::string::npos);
}

// A FIFO where a run's lock file or a figure's gnuplot log belongs: refused or replaced at once,
// never opened and waited on.
TEST_CASE("a FIFO where a lock file or a figure's log belongs is never waited on",
          "[cli][errors][report]") {
  TempDir t("fifo-lock");
  const auto cfg = t.path / "t.yaml";
  put(cfg, tiny_config("t"));
  const std::string res = " --results " + (t.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg.string() + " --tag a --quiet" + res).code == 0);
  const auto lock = t.path / "res" / "t" / ".b-g1.lock";
  REQUIRE(::mkfifo(lock.c_str(), 0600) == 0);
  auto r =
      shell("timeout 20 " + dtrain_binary() + " run " + cfg.string() + " --tag b" + res + " 2>&1");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("the run's lock file is not a regular file"));
  // A run folder whose status says running: report asks its lock whether a process holds it.
  const auto run = t.path / "res" / "t" / "a-g1";
  put(run / "status", "running\n");
  std::filesystem::remove(run / "summary.json");
  std::filesystem::remove(t.path / "res" / "t" / ".a-g1.lock");
  REQUIRE(::mkfifo((t.path / "res" / "t" / ".a-g1.lock").c_str(), 0600) == 0);
  r = shell("timeout 20 " + dtrain_binary() + " report " + (t.path / "res").string() + " --out " +
            (t.path / "rep").string() + " 2>&1");
  INFO(r.out);
  CHECK(r.code != 124);
  if (!dtrain::gnuplot_available()) return;
  REQUIRE(dtrain_cli("run " + cfg.string() + " --tag c --quiet" + res).code == 0);
  const auto data = t.path / "plots" / "data";
  std::filesystem::create_directories(data);
  REQUIRE(::mkfifo((data / "t-curves.log").c_str(), 0600) == 0);
  r = shell("timeout 60 " + dtrain_binary() + " report " +
            (t.path / "res" / "t" / "c-g1").string() + " --plots --out " +
            (t.path / "plots").string() + " 2>&1");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(std::filesystem::is_regular_file(data / "t-curves.log"));
}

TEST_CASE("an oversized config file and a dense layer past the width bound are one-line errors",
          "[cli][errors]") {
  TempDir t("oversized");
  const auto cfg = t.path / "t.yaml";
  put(cfg, tiny_config("t") + "# " + std::string(size_t{2} << 20, 'x') + "\n");
  auto r = dtrain_cli("validate " + cfg.string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK(r.out.find("more than the 1048576 bytes a config file may have") != std::string::npos);
  put(cfg, tiny_config("t"));
  r = dtrain_cli("validate " + cfg.string() + " 'model.hidden=[4000000000, 4000000000]'");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("model.hidden: every entry must be in [1, 1048576], found 4000000000") !=
        std::string::npos);
  // Inside the bounds, a dense layer after a wide map can still pass 64 bits: named, not built.
  r = dtrain_cli("validate --no-data " + cfg.string() +
                 " 'data.synthetic.shape=[1,8192,8192]' model.type=layers 'model.layers=[{conv: "
                 "{channels: 1048576, kernel: 1}}, flatten, {dense: {units: 1048576}}]'");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("model.layers[2] (dense): a dense layer of 70368744177664 x 1048576 weights "
                   "is too large") != std::string::npos);
}
