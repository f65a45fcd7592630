// Models from presets and layer lists, and the BatchNorm contract across replicas.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
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

// A small residual network on 3x8x8 images: a stem, an identity block of `width` channels, a
// downsampling block of 2 x width (projection shortcut) and global average pooling; BatchNorm
// inside both blocks, and activation `act` after the stem, inside and after the blocks.
Config residual_config(int gpus, int64_t batch, BatchNormMode mode, int width = 4,
                       const std::string& act = "relu") {
  Config c = test::synthetic_config(gpus, batch);
  c.data.synthetic.shape = {3, 8, 8};
  c.data.synthetic.train_size = 32 * 60;
  c.model = parse_config(fmt::format(R"(model:
  type: layers
  layers:
    - {{conv: {{channels: {0}, kernel: 3, padding: 1, bias: false}}}}
    - batchnorm
    - {2}
    - residual:
        activation: {2}
        body: [{{conv: {{channels: {0}, padding: 1, bias: false}}}}, batchnorm, {2},
               {{conv: {{channels: {0}, padding: 1, bias: false}}}}, batchnorm]
    - residual:
        shortcut: auto
        activation: {2}
        body: [{{conv: {{channels: {1}, stride: 2, padding: 1, bias: false}}}}, batchnorm, {2},
               {{conv: {{channels: {1}, padding: 1, bias: false}}}}, batchnorm]
    - global_avg_pool
)",
                                     width, 2 * width, act),
                         "res.yaml")
                .model;
  c.model.batchnorm = mode;
  c.optimizer.base_batch = 32;
  return c;
}

}  // namespace

TEST_CASE("a residual layer list parses, round-trips and builds", "[model][config][residual]") {
  const Config c = parse_config(R"(model:
  type: layers
  layers:
    - {conv: {channels: 8, padding: 1, bias: false}}
    - residual:
        body: [{conv: {channels: 8, padding: 1, bias: false}}, batchnorm, relu,
               {residual: {body: [{conv: {channels: 8, padding: 1}}], activation: none}}]
        shortcut: identity
        activation: gelu
    - {residual: {body: [{conv: {channels: 16, stride: 2, padding: 1}}], shortcut: project}}
)",
                                "m.yaml");
  REQUIRE(c.model.layers.size() == 3);
  CHECK_FALSE(c.model.layers[0].bias);
  const LayerSpec& r = c.model.layers[1];
  CHECK(r.type == LayerType::residual);
  CHECK(r.shortcut == Shortcut::identity);
  CHECK(r.activation == BlockActivation::gelu);
  REQUIRE(r.body.size() == 4);
  CHECK(r.body[3].body.size() == 1);
  CHECK(r.body[3].activation == BlockActivation::none);
  CHECK(c.model.layers[2].shortcut == Shortcut::project);
  const Config back = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(back.model.layers == c.model.layers);
  auto dev = make_cpu_device();
  const auto m = build_model(*dev, c.model, {3, 8, 8}, 5);
  // conv 8x3x3x3; block 1: 8x8x3x3 + BN 16 + (8x8x3x3 + 8); block 2: 16x8x3x3 + 16 and the
  // projection 16x8 + BN 32; the classifier takes the 16x4x4 map: 256x5 + 5.
  CHECK(m->param_count() == 216 + (576 + 16 + 576 + 8) + (1152 + 16 + 128 + 32) + (256 * 5 + 5));
  CHECK_THAT(m->describe(),
             Catch::Contains("| identity) + gelu") &&
                 Catch::Contains("conv(8->16, k1 s2, 4x4, no bias) -> batchnorm(16))"));
  // Nested BatchNorms are state: the model saves 2 x channels for each of the two.
  CHECK(m->has_batchnorm());
  CHECK(m->download_state().size() == 2 * 8 + 2 * 16);
}

TEST_CASE("a residual body that cannot be added to its shortcut is refused, naming both",
          "[model][errors][residual]") {
  auto dev = make_cpu_device();
  const auto err = [&](const std::string& layers) {
    const ModelConfig m =
        parse_config("model: {type: layers, layers: [" + layers + "]}", "m.yaml").model;
    return test::error_of([&] { build_model(*dev, m, {4, 8, 8}, 3); });
  };
  // More channels than the input, with an identity shortcut.
  CHECK_THAT(
      err("relu, {residual: {shortcut: identity, body: [{conv: {channels: 8, padding: 1}}]}}"),
      Catch::StartsWith("model.layers[1] (residual): the body's output [8, 8, 8] cannot be "
                        "added to the identity shortcut's [4, 8, 8]"));
  // A body no 1x1 strided projection can match (a 3x3 kernel without padding: 8 -> 6).
  CHECK_THAT(err("{residual: {shortcut: project, body: [{conv: {channels: 4}}]}}"),
             Catch::StartsWith(
                 "model.layers[0] (residual): the body's output [4, 6, 6] cannot be "
                 "added to the projection shortcut's [4, 4, 4] (a 1x1 convolution of stride 2"));
  // A flat body (flatten, dense) has no projection: said so, not as a size mismatch.
  CHECK_THAT(err("{residual: {body: [flatten, {dense: {units: 10}}]}}"),
             Catch::StartsWith("model.layers[0] (residual): the body's output [10] cannot be "
                               "added to a projection shortcut of the input [4, 8, 8]: a "
                               "projection is a 1x1 convolution, of image maps, and the body's "
                               "output is flat"));
  // Inside a nested block, both blocks are named.
  CHECK_THAT(err("{residual: {body: [{residual: {shortcut: identity, body: [{conv: {channels: 2, "
                 "padding: 1}}]}}]}}"),
             Catch::StartsWith("model.layers[0] (residual): body[0] (residual): the body's "
                               "output [2, 8, 8]"));
  // auto picks what fits: both of these build.
  CHECK(err("{residual: {body: [{conv: {channels: 4, padding: 1}}]}}").empty());
  CHECK(err("{residual: {body: [{conv: {channels: 6, stride: 2, padding: 1}}]}}").empty());
  // A side of 1 stays 1 at stride 2: the projection's stride is read from the other side.
  const ModelConfig strip =
      parse_config(
          "model: {type: layers, layers: [{residual: {body: [{conv: {channels: 4, stride: 2, "
          "padding: 1}}]}}]}",
          "m.yaml")
          .model;
  for (const std::vector<int64_t>& in : {std::vector<int64_t>{2, 1, 32}, {2, 32, 1}, {2, 3, 32}})
    CHECK(test::error_of([&] { build_model(*dev, strip, in, 3); }).empty());
  CHECK_THAT(test::config_error("model: {type: layers, layers: [{residual: {body: []}}]}"),
             Catch::Contains("model.layers[0]: residual needs a non-empty body"));
  CHECK_THAT(test::config_error("model: {type: layers, layers: [{residual: {body: [relu], "
                                "shortcut: skip}}]}"),
             Catch::Contains("model.layers[0].residual.shortcut: expected one of auto | identity "
                             "| project"));
}

TEST_CASE("resnet presets have the standard parameter counts", "[model][residual]") {
  const auto params = [](const std::string& overrides_yaml, std::vector<int64_t> shape,
                         int classes) {
    const ModelConfig m =
        parse_config("model: {type: resnet, " + overrides_yaml + "}", "r.yaml").model;
    return model_size(m, shape, classes).params;
  };
  // CIFAR ResNet-20/56 (He et al. 2016: 0.27M and 0.85M; projection shortcuts where the shape
  // changes, so 2752 and 2752 more than the zero-padding option A's 269722 and 853018).
  CHECK(params("depth: 20", {3, 32, 32}, 10) == 272474);
  CHECK(params("depth: 56", {3, 32, 32}, 10) == 855770);
  // ResNet-18 and -34, CIFAR variant (3x3 stem, no max pool): 11.17M and 21.28M.
  CHECK(params("depth: 18", {3, 32, 32}, 10) == 11173962);
  CHECK(params("depth: 34", {3, 32, 32}, 10) == 21282122);
  // ResNet-18 with the ImageNet stem and 1000 classes: torchvision's 11689512.
  CHECK(params("depth: 18, stem: imagenet", {3, 224, 224}, 1000) == 11689512);
  // Bottleneck blocks: torchvision's ResNet-50 (25557032) and ResNet-101 (44549160).
  CHECK(params("depth: 50, stem: imagenet", {3, 224, 224}, 1000) == 25557032);
  CHECK(params("depth: 101, stem: imagenet", {3, 224, 224}, 1000) == 44549160);
  // FLOPs per sample (2 per multiply-add of convolutions and GEMMs): the quickstart MLP exactly
  // (784-256-128-10; backward skips the first layer's input gradient), and ResNet-50 at 224
  // within 0.5% of the 4.09 GMACs usually quoted for torchvision's (the same 56x56 maps after
  // the stem's padded max pool).
  const ModelSize mlp = model_size(parse_config("model: {hidden: [256, 128]}", "m.yaml").model,
                                   {784}, 10);
  CHECK(mlp.forward_flops == 2.0 * (784 * 256 + 256 * 128 + 128 * 10));
  CHECK(mlp.backward_flops == 2.0 * mlp.forward_flops - 2.0 * 784 * 256);
  const ModelSize r50 = model_size(
      parse_config("model: {type: resnet, depth: 50, stem: imagenet}", "r.yaml").model,
      {3, 224, 224}, 1000);
  CHECK(r50.forward_flops / 2 == Approx(4.09e9).epsilon(0.005));
  const auto stem = build_layers(
      parse_config("model: {type: resnet, depth: 50, stem: imagenet}", "r.yaml").model,
      {3, 224, 224}, 1000);
  // conv, batchnorm with its ReLU fused (fuse_batchnorm_relu), maxpool
  CHECK(stem[1]->describe() == "batchnorm(64) -> relu");
  CHECK(stem[2]->describe() == "maxpool(k3, pad 1, 56x56)");
  // Widths override the standard ones: 8/16/32 on Fashion-MNIST.
  CHECK(params("depth: 20, widths: [8, 16, 32]", {1, 28, 28}, 10) < 272474 / 3);
  CHECK_THAT(test::config_error("model: {type: resnet, depth: 21}"),
             Catch::Contains("model.depth: resnet depth 21 has no block layout"));
  CHECK_THAT(test::config_error("model: {type: resnet, depth: 18, widths: [16, 32, 64]}"),
             Catch::Contains("model.widths: resnet depth 18 has 4 stages, so widths needs 4"));
  auto dev = make_cpu_device();
  const ModelConfig r20 = parse_config("model: {type: resnet}", "r.yaml").model;
  const auto m = build_model(*dev, r20, {3, 32, 32}, 10);
  CHECK_THAT(m->describe(), Catch::StartsWith("conv(3->16, k3 p1, 32x32, no bias) -> batchnorm(16) "
                                              "-> relu -> residual(") &&
                                Catch::Contains("global-avg-pool -> dense(64->10)"));
}

TEST_CASE("gpt has GPT-2's parameter count and FLOPs at GPT-2 124M's shape", "[model][gpt]") {
  // GPT-2 small: 12 layers, 12 heads, width 768, context 1024, GPT-2's 50257 tokens, the head
  // tied: 124,439,808 parameters (wte 38.6M, wpe 0.79M, 12 blocks of 7.09M, the last LayerNorm).
  ModelConfig m;
  m.type = ModelType::gpt;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  const ModelSize s = model_size(m, {1025}, 50257);
  CHECK(s.params == 124439808);
  // Forward multiply-adds per window: per position the dense layers (12 x 7,077,888) and the
  // head (768 x 50257), and per layer the two attention products, 2 x 1024 x 768 per position.
  const double per_position = 12.0 * 7077888 + 768.0 * 50257 + 12.0 * 2 * 1024 * 768;
  CHECK(s.forward_flops == Approx(2 * 1024 * per_position));
  // Backward: twice the forward (the embedding, first, has no GEMM to skip).
  CHECK(s.backward_flops == Approx(2 * s.forward_flops));
  CHECK(s.batchnorm_positions.empty());
}

TEST_CASE("a residual network with sync BatchNorm: 4 replicas x 8 equal 1 replica x 32",
          "[equivalence][residual][bn]") {
  const auto one = run(residual_config(1, 32, BatchNormMode::sync));
  const auto four = run(residual_config(4, 8, BatchNormMode::sync));
  REQUIRE(one.step_losses.size() == 60);
  CHECK(max_rel_step_diff(one, four) < 1e-5);
  CHECK(one.epochs.back().test_acc == Approx(four.epochs.back().test_acc).margin(1e-3));
  CHECK(one.step_losses.back() < 0.8 * one.step_losses.front());  // it learns
  // Not vacuous: per-replica statistics inside the blocks change the trajectory.
  const auto local = run(residual_config(4, 8, BatchNormMode::local));
  CHECK(max_rel_step_diff(one, local) > 1e-4);
}

TEST_CASE("with Winograd's convolutions 4 replicas x 8 equal 1 replica x 32",
          "[equivalence][residual][winograd]") {
  // 32 and 64 channels: the stride-1 3x3 convolutions are Winograd's where oneDNN has it
  // (AVX-512), whose roundings are larger than the direct kernels' and whose blocking follows
  // the batch. GELU in place of ReLU: with ReLUs, a rounding difference that moves an input
  // across 0 changes a gradient outright, which at 32 and 64 channels happens within a few
  // steps with any kernels (measured: 2e-5 by step 4 with Winograd's, 0.25 by step 60 with
  // direct ones); a smooth network keeps N x B and 1 x NB to rounding.
  const ConvGeom g{32, 8, 8, 32, 3, 1, 1};
  INFO("oneDNN's kernel: " << onednn_conv_kernel(CpuOptions::default_cpu_conv(), g, 8));
  CHECK(winograd_suits(g));
  const auto one = run(residual_config(1, 32, BatchNormMode::sync, 32, "gelu"));
  const auto four = run(residual_config(4, 8, BatchNormMode::sync, 32, "gelu"));
  REQUIRE(one.step_losses.size() == 60);
  // Measured: up to 4.7e-6 with Winograd's kernels, 2.1e-6 with direct ones, 2.2e-6 with
  // im2col; Winograd rounds about 3x coarser (see "Winograd's convolutions run where ...").
  CHECK(max_rel_step_diff(one, four) < 2e-5);
  CHECK(one.step_losses.back() < 0.8 * one.step_losses.front());
  // Not vacuous: per-replica statistics change the steps by far more.
  const auto local = run(residual_config(4, 8, BatchNormMode::local, 32, "gelu"));
  CHECK(max_rel_step_diff(one, local) > 1e-3);
}

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
  CHECK_THAT(error_of("model:\n  type: vgg\n"),
             Catch::Contains("expected one of mlp | lenet5 | cnn | layers | resnet"));
  auto dev = make_cpu_device();
  ModelConfig bad =
      parse_config("model: {type: layers, layers: [flatten, {conv: {channels: 2}}]}", "m.yaml")
          .model;
  CHECK_THROWS_WITH(build_model(*dev, bad, {1, 8, 8}, 3), Catch::Contains("conv needs an image"));
  ModelConfig big =
      parse_config("model: {type: layers, layers: [{conv: {channels: 2, kernel: 9}}]}", "m.yaml")
          .model;
  CHECK_THROWS_WITH(build_model(*dev, big, {1, 8, 8}, 3), Catch::Contains("does not fit"));
  // A max pool padded by more than half its window: a window could hold no input.
  ModelConfig padded =
      parse_config("model: {type: layers, layers: [{maxpool: {size: 2, padding: 2}}]}", "m.yaml")
          .model;
  CHECK_THROWS_WITH(build_model(*dev, padded, {1, 8, 8}, 3),
                    Catch::Contains("maxpool: padding 2 is more than half the window 2"));
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

TEST_CASE("an evaluation chunk never takes more memory than training", "[model][memory]") {
  // The MLP keeps a few hundred floats per sample: train.eval_batch as given.
  CHECK(eval_chunk_rows(1000, 64, 10000, 400) == 1000);
  // ResNet-18 on 3x32x32 keeps 7.8 MiB per sample: 256 MiB hold 32 rows, fewer than the
  // micro-batch, so the chunk is the micro-batch.
  const int64_t resnet18 = 2045000;
  CHECK(eval_chunk_rows(1000, 128, 10000, resnet18) == 128);
  // One MiB per sample: 256 rows fit in 256 MiB, more than a micro-batch of 128.
  CHECK(eval_chunk_rows(1000, 128, 10000, 262144) == 256);
  // Never more than eval_batch or the test set, at least one row.
  CHECK(eval_chunk_rows(100, 128, 10000, resnet18) == 100);
  CHECK(eval_chunk_rows(1000, 128, 50, 400) == 50);
  CHECK(eval_chunk_rows(1000, 128, 0, 400) == 1);
  CHECK(eval_chunk_rows(1000, 0, 10000, int64_t{1} << 40) == 1);
  // N replicas hold their chunks at once: 256 MiB shared out, never below the micro-batch, and
  // never more than a replica's slice of the test set.
  CHECK(eval_chunk_rows(1000, 1, 10000, 262144, 32) == 8);  // 8 MiB each
  CHECK(eval_chunk_rows(1000, 16, 10000, 262144, 32) == 16);
  CHECK(eval_chunk_rows(1000, 1, 10000, 400, 32) == 313);  // 10,000 / 32, rounded up
  CHECK(eval_chunk_rows(1000, 1, 10, 400, 32) == 1);
}

// The probe that found it: 32 replicas of 1 sample each held 32 chunks of up to 256 MiB during
// evaluation (8.8 GB, against 0.56 GB for 1 x 32). Now their chunks share one budget: the peak
// stays within a small multiple of the one-replica run's.
TEST_CASE("evaluation memory does not grow with the replica count", "[model][memory][cli]") {
  TempDir d("eval-memory");
  const std::string text = std::string(200000, 'a') + std::string(200000, 'b');
  put(d.path / "corpus.txt", text);
  const std::string cfg = d.write(
      "g.yaml", "name: g\nbackend: cpu\nthreads: 1\ndata: {dataset: bytes, path: " +
                    (d.path / "corpus.txt").string() +
                    ", block_size: 64, validation: 0.5, train_limit: 64}\n"
                    "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 64}\n"
                    "train: {epochs: 1, per_replica_batch: 1, target_accuracy: 0}\n"
                    "optimizer: {type: adamw, lr: 0.001}\n");
  const std::string res = (d.path / "res").string();
  const auto one = dtrain_peak_mib({"run", cfg, "gpus=1", "train.per_replica_batch=32", "--tag",
                                    "one", "--results", res, "--quiet"});
  const auto many =
      dtrain_peak_mib({"run", cfg, "gpus=32", "--tag", "many", "--results", res, "--quiet"});
  REQUIRE(one.first == 0);
  REQUIRE(many.first == 0);
  INFO("peak MiB: 1 x 32 " << one.second << ", 32 x 1 " << many.second);
#ifdef DTRAIN_TEST_ASAN
  WARN("peak memory not compared under AddressSanitizer");
#else
  CHECK(many.second < 2.5 * one.second);
#endif
}

TEST_CASE("the memory estimate counts outputs for an evaluation chunk, gradients for a batch",
          "[model][memory]") {
  Config c = test::synthetic_config(1, 16);
  c.train.eval_batch = 40;
  const DataSplit data = load_data(c.data, c.train.seed);
  const ModelSize m = model_size(c.model, data.train.shape, data.train.classes);
  const ReplicaBytes b = replica_bytes(c, data);
  const int64_t rows = std::min<int64_t>(40, data.test.size());
  CHECK(b.rows == std::max<int64_t>(16, rows));
  CHECK(b.activations == Approx(4.0 * (static_cast<double>(m.activations_per_sample) *
                                           static_cast<double>(b.rows + 16) +
                                       static_cast<double>(data.train.features() * b.rows))));
  CHECK(b.params == Approx(4.0 * static_cast<double>(m.params) * 3));  // SGD: momentum
}

TEST_CASE("a ResNet on oneDNN keeps its maps in channel blocks and matches NCHW",
          "[model][residual][blocks]") {
  if (!have_onednn()) {
    WARN("SKIPPED: this dtrain was built without oneDNN");
    return;
  }
  const ModelConfig cfg =
      parse_config("model: {type: resnet, depth: 8, widths: [16, 32, 64]}", "r.yaml").model;
  auto dnn = make_cpu_device({2, CpuConv::onednn}), ref = make_cpu_device({1, CpuConv::im2col});
  // The plan: the stem's convolution writes blocks, BatchNorm, ReLU and the blocks keep them,
  // global average pooling takes them back to NCHW for the classifier.
  auto layers = build_layers(cfg, {3, 16, 16}, 10);
  const MapLayout out = plan_layouts(*dnn, layers, MapLayout{});
  CHECK(out.block == 0);
  CHECK(layers[0]->layout_in().block == 0);  // the images
  const int64_t block = layers[1]->layout_in().block;
  CHECK((block == 8 || block == 16));
  CHECK(layers[1]->layout_in().c == 16);
  CHECK(layers.back()->layout_in().block == 0);                   // dense, after the pool
  CHECK(layers[layers.size() - 2]->layout_in().block == block);  // the pool
  CHECK(plan_layouts(*ref, layers, MapLayout{}).block == 0);
  CHECK(layers[1]->layout_in().block == 0);  // im2col: NCHW throughout

  // One training step's logits and gradients, then evaluation's logits (running statistics),
  // in blocks and in NCHW; and a BatchNorm after flatten, whose features are a map's channels
  // and positions: it gets them in NCHW order, so its parameters mean the same on every device.
  const ModelConfig flat = parse_config(
      "model: {type: layers, layers: [{conv: {channels: 16, padding: 1}}, relu, flatten, "
      "batchnorm]}", "f.yaml").model;
  for (const ModelConfig* c : {&cfg, &flat}) {
    Rng rng(5);
    const int64_t rows = 6;
    const auto x = test::random_vec(rng, rows * 3 * 16 * 16);
    std::vector<int32_t> labels{0, 3, 9, 2, 2, 7};
    std::vector<std::vector<float>> logits, grads, evals;
    for (Device* d : {dnn.get(), ref.get()}) {
      auto m = build_model(*d, *c, {3, 16, 16}, 10);
      m->init(11);
      const float* l = m->forward(x.data(), rows);
      logits.emplace_back(l, l + rows * 10);
      double stats[2] = {0, 0};
      m->loss_backward(labels.data(), rows, 1.f / rows, stats);
      grads.emplace_back(m->grads(), m->grads() + m->param_count());
      l = m->forward(x.data(), rows, /*train=*/false);
      evals.emplace_back(l, l + rows * 10);
    }
    INFO((c == &cfg ? "resnet" : "conv, flatten, batchnorm"));
    CHECK(test::rel_error(logits[0], logits[1]) < 1e-4);
    CHECK(test::rel_error(grads[0], grads[1]) < 1e-3);
    CHECK(test::rel_error(evals[0], evals[1]) < 1e-4);
  }
}

TEST_CASE("a residual block's BatchNorm tail gives the bits of BatchNorm, sum and ReLU apart",
          "[model][residual][fusion]") {
  // The same network twice: each block's body ends with BatchNorm, which then adds the shortcut
  // and applies the block's activation in its own passes (BatchNorm::become_tail), or ends with
  // an identity (a 1x1 max pool) after BatchNorm, which leaves the block its separate passes.
  // The first block is the first layer (no input gradient; its identity shortcut arrives in
  // NCHW, its body's output in channel blocks on oneDNN); the second projects. Two training
  // steps, then evaluation, bit for bit, with a ReLU and with no activation.
  const auto config = [](const std::string& act, bool tail) {
    const std::string end = tail ? "" : ", {maxpool: {size: 1, stride: 1}}";
    return parse_config(fmt::format(R"(model:
  type: layers
  layers:
    - residual:
        activation: {0}
        body: [{{conv: {{channels: 16, padding: 1, bias: false}}}}, batchnorm, relu,
               {{conv: {{channels: 16, padding: 1, bias: false}}}}, batchnorm{1}]
    - residual:
        activation: {0}
        body: [{{conv: {{channels: 32, stride: 2, padding: 1, bias: false}}}}, batchnorm, relu,
               {{conv: {{channels: 32, padding: 1, bias: false}}}}, batchnorm{1}]
    - global_avg_pool
)",
                                    act, end),
                        "tail.yaml")
        .model;
  };
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(make_cpu_device({1, CpuConv::im2col}));                     // NCHW
  if (have_onednn()) devices.push_back(make_cpu_device({2, CpuConv::onednn}));  // blocks
  Rng rng(8);
  const int64_t rows = 5;
  const auto x = test::random_vec(rng, rows * 16 * 8 * 8);
  const std::vector<int32_t> labels{1, 0, 9, 4, 4};
  for (const std::string act : {"relu", "none"})
    for (auto& d : devices) {
      INFO(act << ", " << d->name());
      std::vector<std::vector<float>> out[2];
      for (bool tail : {true, false}) {
        auto m = build_model(*d, config(act, tail), {16, 8, 8}, 10);
        m->init(3);
        auto& o = out[tail ? 0 : 1];
        for (int step = 0; step < 2; ++step) {
          m->zero_grads();
          const float* l = m->forward(x.data(), rows);
          o.emplace_back(l, l + rows * 10);
          double stats[2] = {0, 0};
          m->loss_backward(labels.data(), rows, 1.f / rows, stats);
          o.emplace_back(m->grads(), m->grads() + m->param_count());
          // A plain step on the weights, so that the second step starts elsewhere.
          float* p = m->params();
          for (int64_t i = 0; i < m->param_count(); ++i) p[i] -= 0.1f * m->grads()[i];
        }
        const float* l = m->forward(x.data(), rows, /*train=*/false);
        o.emplace_back(l, l + rows * 10);
      }
      REQUIRE(out[0].size() == out[1].size());
      for (size_t k = 0; k < out[0].size(); ++k) {
        INFO("output " << k);
        CHECK(test::rel_error(out[0][k], out[1][k]) == 0.0);
      }
      // Not vacuous: the gradients are not zero.
      double largest = 0;
      for (float g : out[0][1]) largest = std::max(largest, std::abs(double(g)));
      CHECK(largest > 1e-4);
    }
}

TEST_CASE("a model has the device prepare every convolution, nested blocks' too",
          "[model][residual]") {
  auto d = make_cpu_device({1, CpuConv::im2col});
  const ModelConfig cfg =
      parse_config("model: {type: resnet, depth: 8, widths: [16, 32, 64]}", "r.yaml").model;
  auto m = build_model(*d, cfg, {3, 16, 16}, 10);
  // ResNet-8: the stem's, two in each of the three blocks, and two projection shortcuts'.
  CHECK(m->plan_convs(8, true) == 9);
  CHECK(m->plan_convs(32, false) == 9);
  const ModelConfig mlp = parse_config("model: {type: mlp, hidden: [32]}", "m.yaml").model;
  CHECK(build_model(*d, mlp, {1, 28, 28}, 10)->plan_convs(8, true) == 0);
}
