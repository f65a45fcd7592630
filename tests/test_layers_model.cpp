// Models from presets and layer lists, and the BatchNorm contract across replicas.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/train/trainer.hpp"
#include "gradcheck.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::max_rel_step_diff;
constexpr auto run = dtrain::test::run_config;

namespace {

std::string error_of(const std::string& yaml) {
  return dtrain::test::config_error(yaml, {}, "m.yaml");
}

// A small conv net with BatchNorm after a conv and after a dense layer, on 8x8 images.
Config bn_config(int gpus, int64_t batch, BatchNormMode mode) {
  Config c = test::synthetic_config(gpus, batch);
  c.data.synthetic.shape = {1, 8, 8};
  c.data.synthetic.train_size = 32 * 60;
  c.model = parse_config(R"(model:
  type: layers
  layers:
    - {conv: {channels: 4, kernel: 3, padding: 1}}
    - batchnorm
    - relu
    - {maxpool: {size: 2}}
    - flatten
    - {dense: {units: 16}}
    - batchnorm
    - relu
)",
                         "bn.yaml")
                .model;
  c.model.batchnorm = mode;
  c.optimizer.base_batch = 32;
  return c;
}

}  // namespace

TEST_CASE("a layer list parses, round-trips and builds", "[model][config]") {
  const Config c = parse_config(R"(model:
  type: layers
  batchnorm: sync
  layers:
    - {conv: {channels: 8, kernel: 5, stride: 2, padding: 2}}
    - batchnorm
    - gelu
    - {maxpool: {size: 2}}
    - global_avg_pool
    - {dropout: {p: 0.2}}
    - {dense: {units: 12}}
)",
                                "m.yaml");
  REQUIRE(c.model.layers.size() == 7);
  CHECK(c.model.layers[0].channels == 8);
  CHECK(c.model.layers[0].stride == 2);
  CHECK(c.model.layers[5].p == Approx(0.2));
  const Config back = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(back.model.layers == c.model.layers);
  CHECK(back.model.batchnorm == BatchNormMode::sync);
  auto dev = make_cpu_device();
  const auto m = build_model(*dev, c.model, {3, 16, 16}, 5);
  CHECK_THAT(m->describe(), Catch::Contains("conv(3->8, k5 s2 p2, 8x8) -> batchnorm(8, sync) -> "
                                            "gelu -> maxpool(k2, 4x4) -> global-avg-pool -> "
                                            "dropout(0.2) -> dense(8->12) -> dense(12->5)"));
}

TEST_CASE("presets have the published shapes", "[model]") {
  auto dev = make_cpu_device();
  ModelConfig lenet;
  lenet.type = ModelType::lenet5;
  // conv 6x1x5x5+6, conv 16x6x5x5+16, 400x120+120, 120x84+84, 84x10+10.
  CHECK(build_model(*dev, lenet, {1, 28, 28}, 10)->param_count() == 61706);
  ModelConfig cnn;
  cnn.type = ModelType::cnn;
  const auto m = build_model(*dev, cnn, {1, 28, 28}, 10);
  CHECK_THAT(m->describe(), Catch::Contains("batchnorm(32)") && Catch::Contains("batchnorm(64)") &&
                                Catch::Contains("dense(3136->128)"));
  ModelConfig mlp;
  CHECK(build_model(*dev, mlp, {1, 28, 28}, 10)->param_count() == 235146);
}

TEST_CASE("layer mistakes are reported with the layer and what is valid", "[model][errors]") {
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - {conv2d: {channels: 3}}\n"),
             Catch::Contains("model.layers[0]: unknown layer 'conv2d' (did you mean 'conv'?)"));
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - {conv: {kernel: 3}}\n"),
             Catch::Contains("conv needs channels"));
  CHECK_THAT(error_of("model:\n  type: layers\n  layers:\n    - {dense: {unit: 3}}\n"),
             Catch::Contains("unknown key 'model.layers[0].dense.unit' (did you mean 'units'?)"));
  CHECK_THAT(error_of("model:\n  type: layers\n"), Catch::Contains("needs a non-empty list"));
  CHECK_THAT(error_of("model:\n  type: resnet\n"),
             Catch::Contains("expected one of mlp | lenet5 | cnn | layers"));
  auto dev = make_cpu_device();
  ModelConfig bad =
      parse_config("model: {type: layers, layers: [flatten, {conv: {channels: 2}}]}", "m.yaml")
          .model;
  CHECK_THROWS_WITH(build_model(*dev, bad, {1, 8, 8}, 3), Catch::Contains("conv needs an image"));
  ModelConfig big =
      parse_config("model: {type: layers, layers: [{conv: {channels: 2, kernel: 9}}]}", "m.yaml")
          .model;
  CHECK_THROWS_WITH(build_model(*dev, big, {1, 8, 8}, 3), Catch::Contains("does not fit"));
}

TEST_CASE("sync BatchNorm: 4 replicas x 8 equal 1 replica x 32 step by step", "[bn][equivalence]") {
  const auto one = run(bn_config(1, 32, BatchNormMode::sync));
  const auto four = run(bn_config(4, 8, BatchNormMode::sync));
  REQUIRE(one.step_losses.size() >= 50);
  CHECK(max_rel_step_diff(one, four) < 1e-5);
  CHECK(one.epochs.back().test_acc == Approx(four.epochs.back().test_acc).margin(1e-3));
  // The contract is not vacuous: local statistics (per replica of 8) change the trajectory.
  const auto local = run(bn_config(4, 8, BatchNormMode::local));
  CHECK(max_rel_step_diff(one, local) > 1e-4);
  // At one replica the two modes are the same computation.
  const auto one_local = run(bn_config(1, 32, BatchNormMode::local));
  CHECK(max_rel_step_diff(one, one_local) < 1e-6);
}

TEST_CASE("sync BatchNorm survives a short last batch with empty replicas", "[bn]") {
  Config c = bn_config(4, 8, BatchNormMode::sync);
  c.data.synthetic.train_size = 32 * 10 + 2;  // last global batch: 2 samples for 4 replicas
  c.data.drop_remainder = false;
  const auto r = run(c);
  CHECK(r.status == RunStatus::done);
  CHECK(r.step_losses.size() == 11);
}

TEST_CASE("a layer list that starts with an activation trains, with correct gradients",
          "[model][grad]") {
  // The first layer's backward gets no dx buffer (nothing needs dL/dinput); an activation
  // there used to write through that null pointer.
  for (const char* act : {"relu", "tanh", "sigmoid", "gelu"}) {
    INFO(act);
    const ModelConfig mc =
        parse_config(
            fmt::format("model: {{type: layers, layers: [{}, {{dense: {{units: 5}}}}]}}", act),
            "m.yaml")
            .model;
    auto dev = make_cpu_device();
    auto model = build_model(*dev, mc, {4}, 3);
    model->init(5);
    Rng rng(6);
    const int64_t rows = 5;
    std::vector<float> x(static_cast<size_t>(rows * 4));
    for (auto& v : x) {
      const double m = rng.uniform(0.2, 1.5);  // away from the ReLU kink
      v = static_cast<float>(rng.uniform() < 0.5 ? -m : m);
    }
    const std::vector<int32_t> y = {0, 1, 2, 1, 0};
    REQUIRE(model->param_count() == (4 * 5 + 5) + (5 * 3 + 3));
    test::check_model_gradient(*model, x, y, rows);

    // And a whole data-parallel run with the activation alone before the classifier.
    Config c = test::synthetic_config(2, 32);
    c.model =
        parse_config(fmt::format("model: {{type: layers, layers: [{}]}}", act), "m.yaml").model;
    const auto r = run(c);
    CHECK(r.status == RunStatus::done);
    REQUIRE_FALSE(r.epochs.empty());
    CHECK(std::isfinite(r.epochs.back().train_loss));
    CHECK(r.epochs.back().test_acc > 0.5);  // 4 well-separated classes: a linear model learns
  }
}
