// The projection model of train/project.hpp on closed forms, and `dtrain project` on a tiny run.
#include <catch2/catch.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "dtrain/train/project.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

Link link(double alpha_s, double busbw) {
  return {"test", alpha_s, busbw, "test"};
}

ProjectionInput input(double compute_s, std::vector<double> buckets) {
  ProjectionInput in;
  in.split = {0.001, compute_s, 0.002};
  in.buckets = std::move(buckets);
  in.samples_per_epoch = 6400;
  in.global_batch = 64;
  return in;
}

}  // namespace

TEST_CASE("buckets are cut like GradExchange cuts them, from the end", "[project]") {
  CHECK(bucket_bytes(1000, 0) == std::vector<double>{4000});
  // 1 MiB = 262144 floats; the remainder is the bucket at the start, finished last.
  CHECK(bucket_bytes(300000, 1.0) == std::vector<double>{1048576, (300000 - 262144) * 4.0});
  CHECK(bucket_bytes(0, 25).empty());
}

TEST_CASE("ring all-reduce time: 2(n-1) alpha + 2(n-1)/n bytes / busbw", "[project]") {
  const RingCost c = ring_allreduce(1e6, 4, link(1e-6, 1e9));
  CHECK(c.latency_s == Approx(6e-6));
  CHECK(c.bandwidth_s == Approx(1.5e-3));
  CHECK(ring_allreduce(1e6, 1, link(1e-6, 1e9)).total() == 0);  // nothing to exchange
}

TEST_CASE("zero latency: only bytes cost, however they are bucketed", "[project]") {
  const Link l = link(0, 1e10);
  const double bytes = 4e8, whole = 2.0 * 7 / 8 * bytes / 1e10;  // n = 8
  const auto one = simulate_exchange({bytes}, 0.1, 8, l);
  const auto four = simulate_exchange({1e8, 1e8, 1e8, 1e8}, 0.1, 8, l);
  CHECK(one.total_s == Approx(whole));
  CHECK(four.total_s == Approx(whole));
  CHECK(one.exposed_latency_s == 0);
  CHECK(four.exposed_latency_s == 0);
  // No overlap is possible with one bucket: all of it is exposed.
  CHECK(one.exposed_s == Approx(whole));
  CHECK(one.exposed_bandwidth_s == Approx(whole));
}

TEST_CASE("infinite bandwidth: each bucket costs 2(n-1) alpha", "[project]") {
  const Link l = link(1e-5, std::numeric_limits<double>::infinity());
  const auto t = simulate_exchange({4e6, 4e6, 4e6}, 1.0, 4, l);  // long backward
  CHECK(t.total_s == Approx(3 * 6e-5));
  CHECK(t.exposed_s == Approx(6e-5));  // only the last bucket runs after backward
  CHECK(t.exposed_bandwidth_s == 0);
  auto in = input(1e-4, {4e6, 4e6, 4e6});
  in.split.data_s = in.split.optimizer_s = 0;
  // A short backward: the first bucket is ready after a third of it, the others queue behind
  // it on the link, and all three run on past the end of backward.
  const double bw = 2.0 / 3 * 1e-4;
  const auto row = project_step(in, 4, l);
  CHECK(row.exchange.exposed_s == Approx(bw / 3 + 3 * 6e-5 - bw));
  CHECK(row.bound == Bound::latency);
}

TEST_CASE("perfect overlap: tiny buckets under slow compute expose the last bucket only",
          "[project]") {
  const Link l = link(1e-6, 100e9);
  const std::vector<double> buckets(100, 1e6);
  const double backward = 1.0;  // 10 ms between buckets, each a few tens of microseconds
  const auto t = simulate_exchange(buckets, backward, 8, l);
  const double last = ring_allreduce(1e6, 8, l).total();
  CHECK(t.exposed_s == Approx(last));
  CHECK(t.total_s == Approx(100 * last));
  const auto row = project_step(input(1.5, buckets), 8, l);  // backward = 2/3 of 1.5 s
  CHECK(row.exchange.exposed_s == Approx(last));
  CHECK(row.bound == Bound::compute);
  CHECK(row.efficiency > 0.999);
}

TEST_CASE("no overlap: one bucket exposes the whole all-reduce", "[project]") {
  const Link l = link(5e-6, 20e9);
  const double bytes = 100e6;
  auto in = input(0.01, {bytes});
  const auto row = project_step(in, 4, l);
  const double whole = 6 * 5e-6 + 1.5 * bytes / 20e9;
  CHECK(row.exchange.exposed_s == Approx(whole));
  CHECK(row.step_s == Approx(0.001 + 0.01 + 0.002 + whole));
  CHECK(row.bound == Bound::bandwidth);
  CHECK(row.speedup == Approx(4 * 0.013 / row.step_s));
  CHECK(row.efficiency == Approx(row.speedup / 4));
  CHECK(row.exposed_share == Approx(whole / row.step_s));
}

TEST_CASE("one GPU: speedup 1 and nothing exposed, and epochs shrink with the global batch",
          "[project]") {
  auto in = input(0.01, {1e6, 1e6});
  const auto rows = project(in, {1, 2, 4}, link(5e-6, 450e9));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].speedup == 1);
  CHECK(rows[0].exchange.exposed_s == 0);
  CHECK(rows[0].bound == Bound::compute);
  CHECK(rows[0].steps_per_epoch == 100);
  CHECK(rows[1].steps_per_epoch == 50);
  CHECK(rows[2].epoch_s == Approx(25 * rows[2].step_s));
  in.samples_per_epoch = 6401;
  CHECK(steps_per_epoch(in, 4) == 25);  // the short last batch dropped
  in.drop_remainder = false;
  CHECK(steps_per_epoch(in, 4) == 26);
  in.global_batch = 10000;
  CHECK(steps_per_epoch(in, 1) == 1);
  CHECK(std::isnan(project_step(in, 8, link(0, 1e9)).epoch_s) == false);
  in.drop_remainder = true;
  CHECK(std::isnan(project_step(in, 8, link(0, 1e9)).epoch_s));  // batch larger than the epoch
}

TEST_CASE("link presets", "[project]") {
  REQUIRE(find_link_preset("nvlink-h100"));
  CHECK(find_link_preset("nvlink-h100")->busbw == 450e9);
  CHECK(find_link_preset("pcie4")->busbw == 20e9);
  CHECK(find_link_preset("ib-ndr400")->alpha_s == 10e-6);
  CHECK(find_link_preset("ethernet") == nullptr);
}

TEST_CASE("dtrain project reads a 1-replica run folder and prints a row per GPU count",
          "[project][cli]") {
  TempDir t("project");
  const std::string cfg = t.write("p.yaml", R"(name: proj
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 512, test_size: 128, shape: [8], classes: 3, noise: 1.0}
model: {hidden: [16]}
train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0, bucket_mb: 0.0001}
optimizer: {lr: 0.05, base_batch: 16}
)");
  const std::string res = (t.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " gpus=1 --quiet --tag t --results " + res).code == 0);
  const fs::path run = t.path / "res" / "proj" / "t-g1";

  const auto r = dtrain_cli("project " + run.string() + " --gpus 1,2,4,8 --link pcie4");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("a model, not a measurement") != std::string::npos);
  for (const char* row : {"| 1 |", "| 2 |", "| 4 |", "| 8 |"})
    CHECK(r.out.find(row) != std::string::npos);
  CHECK(r.out.find("| 1.00x | 100% |") != std::string::npos);
  const auto j = nlohmann::json::parse(slurp(run / "projection-pcie4.json"));
  REQUIRE(j["rows"].size() == 4);
  CHECK(j["rows"][0]["speedup"].get<double>() == 1.0);
  CHECK(j["params"].get<int>() == 8 * 16 + 16 + 16 * 3 + 3);
  CHECK(j["bucket_bytes"].size() == 8);  // 0.0001 MiB: 26 floats per bucket, 195 floats
  CHECK(fs::exists(run / "projection-pcie4.md"));

  // measured:FILE reads the fit of a bench-comm JSON (written here: a measured fit would
  // depend on the load of the machine).
  const std::string bench = t.write("bench.json", R"({"fit": {"a_s": 2e-5, "b_s_per_byte": 1e-9,
    "alpha_s": 1e-5, "busbw_Bps": 1e9}})");
  const auto m = dtrain_cli("project " + run.string() + " --gpus 1,2 --link measured:" + bench +
                            " --out " + (t.path / "m").string());
  INFO(m.out);
  CHECK(m.code == 0);
  CHECK(m.out.find("alpha 10.00 us per ring step, busbw 1.0 GB/s") != std::string::npos);
  CHECK(fs::exists(t.path / "m.json"));
  // A file that is not JSON, or not one dtrain wrote, is said to be so.
  for (const std::string& text :
       std::vector<std::string>{"", "{\"fit\": ", std::string(100, '[')}) {
    const std::string bad = t.write("bad.json", text);
    const auto b = dtrain_cli("project " + run.string() + " --gpus 1,2 --link measured:" + bad);
    INFO(b.out);
    CHECK(b.code == 2);
    CHECK_THAT(b.out, Catch::Contains("not a measurement dtrain bench-comm wrote"));
  }
  // A measurement whose sums came back wrong timed a broken exchange: refused.
  for (const std::string wrong : {R"("wrong": 5)", R"("rows": [{"bytes": 4096, "wrong": 2}])"}) {
    const std::string broken = t.write("broken.json", R"({"fit": {"a_s": 2e-5, "b_s_per_byte": 1e-9,
      "alpha_s": 1e-5, "busbw_Bps": 1e9}, )" + wrong + "}");
    const auto w = dtrain_cli("project " + run.string() + " --gpus 1,2 --link measured:" + broken);
    INFO(w.out);
    CHECK(w.code == 2);
    CHECK_THAT(w.out, Catch::Contains("all-reduce gave wrong sums"));
  }

  // A one-epoch run's step holds the run's start, a two-epoch run's half of it: said.
  CHECK(r.out.find("One epoch only") == std::string::npos);
  CHECK_THAT(r.out, Catch::Contains("The median of two epochs is their mean"));
  REQUIRE(
      dtrain_cli("run " + cfg + " gpus=1 train.epochs=1 --quiet --tag one --results " + res).code ==
      0);
  const auto one = dtrain_cli("project " + (t.path / "res" / "proj" / "one-g1").string() +
                              " --gpus 1,2 --out " + (t.path / "one").string());
  INFO(one.out);
  CHECK(one.code == 0);
  CHECK_THAT(one.out, Catch::Contains("Measured step at 1 replica (one epoch)") &&
                          Catch::Contains("One epoch only: its time includes the run's start"));

  // A run that did not finish is projected, with its status said.
  CHECK(r.out.find("The run's status is") == std::string::npos);
  auto summary = nlohmann::json::parse(slurp(run / "summary.json"));
  const auto as_status = [&](const std::string& status) {
    summary["status"] = status;
    std::ofstream(run / "summary.json") << summary.dump();
    return dtrain_cli("project " + run.string() + " --gpus 1,2 --out " + (t.path / "s").string());
  };
  const auto stopped = as_status("interrupted");
  INFO(stopped.out);
  CHECK(stopped.code == 0);
  CHECK_THAT(stopped.out, Catch::Contains("The run's status is interrupted: its times are of "
                                          "the epochs it finished."));
  CHECK_THAT(as_status("diverged").out, Catch::Contains("The run's status is diverged: its loss "
                                                        "went non-finite"));
  as_status("done");

  // Given values are checked, even those equal to the defaults' stand-ins.
  const std::string out = " --out " + (t.path / "bad").string();
  for (const auto& [flags, want] : std::vector<std::pair<std::string, std::string>>{
           {"--params 0", "--params: 0 is outside 1 to"},
           {"--gpus 1,2,1", "--gpus: 1 is given twice"},
           {"--bucket-mb -1", "--bucket-mb: -1 is outside 0"},
           {"--bucket-mb 1e-300", "a bucket holds at least one 4-byte gradient"}}) {
    const auto b = dtrain_cli("project " + run.string() + " " + flags + out);
    INFO(flags << ": " << b.out);
    CHECK(b.code == 2);
    CHECK(count_lines(b.out) == 1);
    CHECK(b.out.find(want) != std::string::npos);
  }
  // A damaged metrics.csv (a negative time) is named, not projected.
  std::string csv = slurp(run / "metrics.csv");
  const auto header_end = csv.find('\n');
  std::vector<std::string> names;
  {
    std::stringstream hs(csv.substr(0, header_end));
    for (std::string f; std::getline(hs, f, ',');) names.push_back(f);
  }
  const auto col = static_cast<size_t>(
      std::find(names.begin(), names.end(), "compute_s") - names.begin());
  REQUIRE(col < names.size());
  std::string damaged = csv.substr(0, header_end + 1);
  std::stringstream rows(csv.substr(header_end + 1));
  for (std::string line; std::getline(rows, line);) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    f[col] = "-5";
    for (size_t i = 0; i < f.size(); ++i) damaged += (i ? "," : "") + f[i];
    damaged += "\n";
  }
  std::ofstream(run / "metrics.csv") << damaged;
  const auto neg = dtrain_cli("project " + run.string() + out);
  INFO(neg.out);
  CHECK(neg.code == 2);
  CHECK(neg.out.find("'compute_s' is '-5' in epoch row 1") != std::string::npos);
  // A row cut short, a row gone, or epochs renumbered: named, not projected from fewer epochs.
  const std::string header = csv.substr(0, header_end + 1), body = csv.substr(header_end + 1);
  const std::string first_row = body.substr(0, body.find('\n') + 1);
  const std::string rest = body.substr(first_row.size());
  REQUIRE_FALSE(rest.empty());  // the run has two epochs or more
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {header + first_row.substr(0, first_row.size() / 2) + "\n" + rest, "metrics.csv:2: "},
           {header + rest, "metrics.csv:2: epoch '2' where epoch 1 should be"},
           {header + first_row, "1 epoch rows, but summary.json counts"}}) {
    std::ofstream(run / "metrics.csv") << text;
    const auto cut = dtrain_cli("project " + run.string() + out);
    INFO(cut.out);
    CHECK(cut.code == 2);
    CHECK_THAT(cut.out, Catch::Contains(want));
  }
  std::ofstream(run / "metrics.csv") << csv;
  // A parameter count no run writes: named, never read past or replaced by the description's.
  const std::string text0 = slurp(run / "summary.json");
  for (const std::string v : {"-5", "2762.5", "1e308", "1e13"}) {
    auto edited = nlohmann::json::parse(text0);
    edited["param_count"] = nlohmann::json::parse(v);
    std::ofstream(run / "summary.json") << edited.dump();
    const auto bad = dtrain_cli("project " + run.string() + out);
    INFO(v << "\n" << bad.out);
    CHECK(bad.code == 2);
    CHECK_THAT(bad.out, Catch::Contains("summary.json: 'param_count' is ") &&
                            (Catch::Contains("expected a whole number from 0 to 1000000000000") ||
                             Catch::Contains("dtrain writes an integer")));
  }
  std::ofstream(run / "summary.json") << text0;
}

TEST_CASE("a step estimated from FLOPs: compute at a share of the peak, the update at memory speed",
          "[project]") {
  StepEstimateInput e;
  e.flops_per_sample = 6e9;
  e.samples_per_step = 64;
  e.peak_flops = 1e15;
  e.mfu = 0.5;
  e.params = 1000000;
  e.optimizer_bytes_per_param = 28;
  e.memory_Bps = 2e12;
  const StepSplit s = estimate_step(e);
  CHECK(s.compute_s == Approx(6e9 * 64 / 5e14));
  CHECK(s.optimizer_s == Approx(28e6 / 2e12));
  CHECK(s.data_s == 0);
  REQUIRE(find_gpu_preset("h100-sxm"));
  CHECK(find_gpu_preset("h100-sxm")->memory_Bps == 3.35e12);
  CHECK(find_gpu_preset("h200")->memory_Bps == 4.8e12);
  CHECK(find_gpu_preset("h100") == nullptr);
  CHECK(gpu_preset_names().size() == 5);
}

// An MLP 8 -> 16 -> 3 (195 parameters) trained with AdamW, 2 micro-steps of 16 a step.
constexpr const char* kEstimatedMlp = R"(name: est
data:
  dataset: synthetic
  synthetic: {train_size: 256, test_size: 64, shape: [8], classes: 3}
model: {hidden: [16]}
train: {per_replica_batch: 16, accumulation_steps: 2, bucket_mb: 0}
optimizer: {type: adamw}
)";

TEST_CASE("dtrain project says when one replica cannot fit the GPU it names", "[project][cli]") {
  TempDir t("project-fit");
  const std::string cfg = t.write("e.yaml", kEstimatedMlp);
  const std::string out = (t.path / "p").string();
  const auto r = dtrain_cli("project " + cfg + " --gpu h100-sxm --gpus 1 --out " + out);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(std::ifstream(out + ".json"));
  // AdamW: weights, gradients, m and v (195 parameters); outputs and their gradients (16 + 3
  // floats a sample in the MLP's layers, and any the model keeps besides) for 16 samples.
  CHECK(j["estimate"]["fits"] == true);
  CHECK(j["estimate"]["gpu_memory_bytes"] == 80e9);
  CHECK(j["estimate"]["replica_memory_bytes"].get<double>() >= 16.0 * 195 + 4.0 * 19 * 2 * 16);
  CHECK_THAT(r.out, !Catch::Contains("Does not fit"));
  // 10^10 parameters with AdamW: 160 GB of fp32 state, past an H200's 141 GB: projected, and
  // said not to fit.
  const auto big = dtrain_cli("project " + cfg + " model.hidden=[100000,100000] --gpu h200 " +
                              "--gpus 1 --out " + out);
  INFO(big.out);
  REQUIRE(big.code == 0);
  CHECK_THAT(big.out, Catch::Contains("Does not fit: one replica needs at least 160."));
  CHECK_THAT(big.out, Catch::Contains("more than the h200's 141 GB"));
  CHECK(nlohmann::json::parse(std::ifstream(out + ".json"))["estimate"]["fits"] == false);
}

TEST_CASE("dtrain project estimates a config's step for a GPU it names, marked as estimated",
          "[project][cli]") {
  TempDir t("project-estimate");
  // An MLP 8 -> 16 -> 3: 195 parameters; 2 x 176 FLOPs forward, 2 x 176 for the weights'
  // gradients and 2 x 48 for the hidden layer's input gradient: 800 a sample.
  const std::string cfg = t.write("e.yaml", kEstimatedMlp);
  const std::string out = (t.path / "p").string();
  const auto r = dtrain_cli("project " + cfg + " --gpu h100-sxm --mfu 0.5 --gpus 1,4 --out " + out);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("(its step estimated for one h100-sxm, fp32)"));
  CHECK_THAT(r.out, Catch::Contains("not measured"));
  const auto j = nlohmann::json::parse(std::ifstream(out + ".json"));
  CHECK(j["step_basis"] == "estimated from FLOPs (not measured)");
  CHECK(j["params"] == 195);
  CHECK(j["estimate"]["flops_per_sample"] == 800.0);
  CHECK(j["estimate"]["peak_tflops"] == 67.0);
  CHECK(j["step_1_replica_s"]["compute"].get<double>() == Approx(800.0 * 32 / (67e12 * 0.5)));
  CHECK(j["step_1_replica_s"]["optimizer"].get<double>() == Approx(195.0 * 28 / 3.35e12));
  CHECK(j["step_1_replica_s"]["data"] == 0.0);
  CHECK(j["global_batch_1"] == 32);
  CHECK(j["samples_per_epoch"] == 256);
  CHECK(j["backward_fraction"].get<double>() == Approx(448.0 / 800));  // the model's own share
  // Overrides change the config as for run: bf16's peak, then a given backward share.
  const auto bf16 = dtrain_cli("project " + cfg + " precision=bf16 --gpu h100-sxm --gpus 1 " +
                               "--backward-fraction 0.5 --out " + out);
  INFO(bf16.out);
  REQUIRE(bf16.code == 0);
  const auto jb = nlohmann::json::parse(std::ifstream(out + ".json"));
  CHECK(jb["estimate"]["peak_tflops"] == 989.4);
  CHECK(jb["estimate"]["config"] == cfg + " precision=bf16");
  CHECK(jb["backward_fraction"] == 0.5);
  CHECK(j["rows"][1]["gpus"] == 4);
  CHECK(j["rows"][1]["steps_per_epoch"] == 2);
  // A GPU count whose global batch outgrows the 256 samples: no epoch there, and the table
  // says why (a run would be refused).
  const auto wide = dtrain_cli("project " + cfg + " --gpu h100-sxm --gpus 1,32,4,16 --out " + out);
  INFO(wide.out);
  REQUIRE(wide.code == 0);
  CHECK_THAT(wide.out, Catch::Contains("Epoch n/a: from 16 GPUs on, the global batch (32 x N) is "
                                       "larger than the 256 training samples"));
  CHECK_THAT(r.out, !Catch::Contains("Epoch n/a"));
  // Data that is not here: the step still, no epoch.
  const std::string away = t.write("a.yaml", "name: away\ndata: {path: /nowhere}\n");
  const auto a = dtrain_cli("project " + away + " --gpu a100 --out " + out);
  INFO(a.out);
  REQUIRE(a.code == 0);
  CHECK_THAT(a.out, Catch::Contains("No epoch time: the data is not here"));
  CHECK(nlohmann::json::parse(std::ifstream(out + ".json"))["rows"][0]["epoch_s"].is_null());
  // What cannot work: an unknown GPU, an MFU past 1, --gpu on a run folder, --mfu alone.
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {cfg + " --gpu h100", "--gpu 'h100': give one of h100-sxm"},
           {cfg + " --gpu h200 --mfu 1.5", "--mfu 1.5"},
           {cfg + " --gpu h200 --mfu 1e-300", "from 0.0001 to 1"},
           {cfg + " --gpu h200 model.hidden=[1000000,1000000]", "make the model smaller"},
           {t.path.string() + " --gpu h200", "a run folder has its measured step"},
           {cfg + " --mfu 0.3", "--mfu requires --gpu"},
           {cfg + " --gpu h200 --params 1000", "--params: with --gpu the parameters are"},
           {cfg + " gpus=1,2 --gpu h200", "overrides make 2 runs"},
           {cfg + " --gpu h200 train.per_replica_batch=300", "larger than the 256 training"},
           {t.path.string() + " precision=bf16", "overrides change a config, with --gpu"},
           {cfg + " --gpu h200 --backward-fraction -1", "give a share of compute in (0, 1]"},
           {cfg + " --gpu h200 --backward-fraction 0", "give a share of compute in (0, 1]"},
           {cfg + " --gpu h200 --backward-fraction 0.5x", "give a share of compute in (0, 1]"},
           {cfg + " --gpu h200 --out ''", "give a path, not an empty string"}}) {
    const auto bad = dtrain_cli("project " + args);
    INFO(args << "\n" << bad.out);
    CHECK(bad.code == 2);
    CHECK_THAT(bad.out, Catch::Contains(expect));
  }
}

TEST_CASE("dtrain project refuses a config, a multi-replica run and an unknown link",
          "[project][cli]") {
  TempDir t("project-bad");
  const std::string cfg = t.write("c.yaml", "name: x\n");
  const auto c = dtrain_cli("project " + cfg);
  CHECK(c.code == 2);
  CHECK(count_lines(c.out) == 1);
  CHECK(c.out.find("gpus=1") != std::string::npos);
  CHECK(c.out.find("--gpu h100-sxm|") != std::string::npos);

  const std::string tiny = t.write("p.yaml", R"(name: proj
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 256, test_size: 64, shape: [8], classes: 3, noise: 1.0}
model: {hidden: [8]}
train: {epochs: 1, per_replica_batch: 16, target_accuracy: 0}
)");
  const std::string res = (t.path / "res").string();
  REQUIRE(dtrain_cli("run " + tiny + " gpus=2 --quiet --tag t --results " + res).code == 0);
  const auto two = dtrain_cli("project " + (t.path / "res" / "proj" / "t-g2").string());
  CHECK(two.code == 2);
  CHECK(two.out.find("gpus=2") != std::string::npos);

  const auto link = dtrain_cli("project " + cfg + " --link ethernet");
  CHECK(link.code == 2);
  CHECK(count_lines(link.out) == 1);
  CHECK(link.out.find("nvlink-h100") != std::string::npos);
  const auto missing = dtrain_cli("project " + cfg + " --link measured:" + cfg + ".json");
  CHECK(missing.code == 2);
  CHECK(count_lines(missing.out) == 1);
}
