// The GPT and datasets bytes and tokens: the transformer operations against plain loops, the
// whole model's gradient against finite differences, the spine (N x B against 1 x NB, resume to
// the same bits), the token shard reader, and what is refused.
#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_helpers.hpp"
#include "dtrain/backend/device.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/data/text.hpp"
#include "dtrain/nn/model.hpp"
#include "dtrain/nn/transformer.hpp"
#include "dtrain/train/trainer.hpp"
#include "gradcheck.hpp"
#include "helpers.hpp"

using namespace dtrain;
namespace fs = std::filesystem;
using test::random_vec;

namespace {

// Text with structure a small model learns within an epoch: words from a short list, in an
// order drawn from `seed`.
std::string corpus_text(size_t bytes, uint64_t seed) {
  static const char* words[] = {"the ", "replica ", "gradient ", "batch ", "reduces ",
                                "mean ", "of ", "and ", "step.\n", "learning "};
  Rng rng(seed);
  std::string s;
  while (s.size() < bytes) s += words[rng.next() % 10];
  s.resize(bytes);
  return s;
}

Config gpt_config(const std::string& path, int gpus, int64_t batch) {
  Config c;
  c.name = "gpt-test";
  c.backend = Backend::cpu;
  c.gpus = gpus;
  c.threads = 1;
  c.data.dataset = DatasetKind::bytes;
  c.data.path = path;
  c.data.block_size = 16;
  c.data.normalize = Normalize::off;
  c.model.type = ModelType::gpt;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.train.epochs = 1;
  c.train.per_replica_batch = batch;
  c.train.target_accuracy = 0;
  c.optimizer.type = OptimizerType::adamw;
  c.optimizer.lr = 3e-3;
  c.optimizer.base_batch = 32;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.decay_bn_and_bias = false;
  c.optimizer.beta2 = 0.95;
  c.optimizer.warmup_epochs = 0.25;
  c.optimizer.schedule = Schedule::cosine;
  c.optimizer.lr_scaling = LrScaling::none;
  return c;
}

// An llm.c token shard as dev/data/data_common.py's write_datafile writes it: a header of 256
// little-endian int32 (magic, version, token count, zeros), then the tokens as little-endian
// uint16. `count` < 0: the tokens' own.
std::string shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                  int32_t version = 1, int64_t count = -1) {
  std::string s(1024, '\0');
  const int64_t n = count < 0 ? static_cast<int64_t>(tokens.size()) : count;
  const uint32_t h[3] = {static_cast<uint32_t>(magic), static_cast<uint32_t>(version),
                         static_cast<uint32_t>(n)};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 4; ++b)
      s[static_cast<size_t>(4 * i + b)] = static_cast<char>(h[i] >> (8 * b));
  for (uint16_t t : tokens) {
    s += static_cast<char>(t & 0xff);
    s += static_cast<char>(t >> 8);
  }
  return s;
}

// `n` tokens counting up from `first`.
std::vector<uint16_t> counting(uint16_t first, int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(first + i);
  return t;
}

// Causal attention in double, by the definition: per sample and head, softmax over j <= i.
void attention_reference(const std::vector<float>& qkv, int64_t rows, int64_t t, int64_t c,
                         int64_t heads, std::vector<double>& y) {
  const int64_t d = c / heads;
  y.assign(static_cast<size_t>(rows * t * c), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < d; ++k)
            dot += double(qkv[static_cast<size_t>((r * t + i) * 3 * c + h * d + k)]) *
                   qkv[static_cast<size_t>((r * t + j) * 3 * c + c + h * d + k)];
          s[static_cast<size_t>(j)] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t k = 0; k < d; ++k) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += s[static_cast<size_t>(j)] / sum *
                   qkv[static_cast<size_t>((r * t + j) * 3 * c + 2 * c + h * d + k)];
          y[static_cast<size_t>((r * t + i) * c + h * d + k)] = acc;
        }
      }
}

}  // namespace

TEST_CASE("causal attention equals its definition, and rows never see later positions",
          "[gpt]") {
  auto dev = make_cpu_device();
  Rng rng(3);
  // 7 positions, and 70: the CPU's products run in row blocks of 32 (three, the last ragged).
  const int64_t t = GENERATE(7, 70);
  const int64_t rows = 2, c = 12, heads = 3;
  std::vector<float> qkv = random_vec(rng, static_cast<size_t>(rows * t * 3 * c), -2, 2);
  std::vector<float> att(static_cast<size_t>(rows * heads * t * t)), y(static_cast<size_t>(rows * t * c));
  dev->attention_forward(qkv.data(), rows, t, c, heads, att.data(), y.data());
  std::vector<double> want;
  attention_reference(qkv, rows, t, c, heads, want);
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == Approx(want[i]).margin(1e-5));
  for (int64_t p = 0; p < rows * heads; ++p)
    for (int64_t i = 0; i < t; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < t; ++j) {
        const float a = att[static_cast<size_t>((p * t + i) * t + j)];
        if (j > i) CHECK(a == 0.f);
        sum += a;
      }
      CHECK(sum == Approx(1.0).margin(1e-6));
    }
  // Changing the last position's keys and values leaves every earlier output as it was.
  for (int64_t k = c; k < 3 * c; ++k) qkv[static_cast<size_t>((t - 1) * 3 * c + k)] += 1.f;
  std::vector<float> y2(y.size());
  dev->attention_forward(qkv.data(), rows, t, c, heads, att.data(), y2.data());
  CHECK(std::memcmp(y.data(), y2.data(), static_cast<size_t>((t - 1) * c) * sizeof(float)) == 0);
}

TEST_CASE("transformer operations give the same bits on 1 and 2 threads", "[gpt]") {
  CpuOptions one, two;
  two.threads = 2;
  auto a = make_cpu_device(one), b = make_cpu_device(two);
  Rng rng(9);
  // Large enough to pass the parallel threshold.
  const int64_t rows = 8, t = 64, c = 64, heads = 4, vocab = 50;
  const auto n = static_cast<size_t>(rows * t * c);
  std::vector<float> tokens(static_cast<size_t>(rows * (t + 1)));
  for (auto& v : tokens) v = static_cast<float>(rng.next() % vocab);
  const auto wte = random_vec(rng, static_cast<size_t>(vocab * c));
  const auto wpe = random_vec(rng, static_cast<size_t>(t * c));
  const auto dy = random_vec(rng, n), gamma = random_vec(rng, static_cast<size_t>(c));
  const auto qkv = random_vec(rng, 3 * n), dy3 = random_vec(rng, n);
  auto run = [&](Device& d) {
    std::vector<float> out(n), dwte(wte.size()), dwpe(wpe.size()), y(n), stats(2 * n / c),
        dx(n), dg(gamma.size()), db(gamma.size()), att(static_cast<size_t>(rows * heads * t * t)),
        ya(n), dqkv(3 * n);
    d.embedding_forward(tokens.data(), t + 1, wte.data(), wpe.data(), rows, t, c, vocab, out.data());
    d.embedding_backward(tokens.data(), t + 1, dy.data(), rows, t, c, vocab, dwte.data(), dwpe.data());
    d.layernorm_forward(out.data(), gamma.data(), gamma.data(), rows * t, c, 1e-5f, y.data(), stats.data());
    d.layernorm_backward(out.data(), dy.data(), gamma.data(), stats.data(), rows * t, c, dx.data(), dg.data(), db.data());
    d.attention_forward(qkv.data(), rows, t, c, heads, att.data(), ya.data());
    d.attention_backward(qkv.data(), att.data(), dy3.data(), rows, t, c, heads, dqkv.data());
    std::vector<float> all;
    for (const auto* v : {&out, &dwte, &dwpe, &y, &stats, &dx, &dg, &db, &att, &ya, &dqkv})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const auto x = run(*a), z = run(*b);
  REQUIRE(x.size() == z.size());
  CHECK(std::memcmp(x.data(), z.data(), x.size() * sizeof(float)) == 0);
}

TEST_CASE("embedding gradients add up per token, and next tokens are the window shifted",
          "[gpt]") {
  auto dev = make_cpu_device();
  const int64_t t = 3, c = 2, vocab = 4;
  // Two windows of t + 1 ids: token 1 occurs three times; 9 is clamped to the last id.
  const std::vector<float> tokens = {1, 2, 1, 3, 1, 0, 9, 2};
  std::vector<float> dy(static_cast<size_t>(2 * t * c));
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i + 1);
  std::vector<float> dwte(static_cast<size_t>(vocab * c)), dwpe(static_cast<size_t>(t * c));
  dev->embedding_backward(tokens.data(), t + 1, dy.data(), 2, t, c, vocab, dwte.data(), dwpe.data());
  // Token 1 at (0, 0), (0, 2), (1, 0): dy rows 0, 2, 3.
  CHECK(dwte[2] == 1 + 5 + 7);
  CHECK(dwte[3] == 2 + 6 + 8);
  CHECK(dwte[6] == 11);  // the clamped 9 is id 3, at (1, 2): dy row 5
  CHECK(dwpe[0] == 1 + 7);
  std::vector<int32_t> labels(static_cast<size_t>(2 * t));
  dev->next_tokens(tokens.data(), t + 1, 2, t, vocab, labels.data());
  CHECK(labels == std::vector<int32_t>{2, 1, 3, 0, 3, 2});
}

TEST_CASE("a GPT's gradient matches finite differences of its next-token loss", "[gpt][grad]") {
  auto dev = make_cpu_device();
  // Through the model: a one-block GPT's every parameter against central differences of its
  // mean next-token loss (the embedding, tied head, LayerNorms, attention and MLP).
  ModelConfig mc;
  mc.type = ModelType::gpt;
  mc.n_layer = 1;
  mc.n_head = 2;
  mc.n_embd = 8;
  const int64_t t = 5, vocab = 7, rows = 3;
  auto model = build_model(*dev, mc, {t + 1}, vocab);
  model->init(4);
  // Weights 4x GPT-2's 0.02, so every term moves the loss measurably (larger ones curve it
  // past what central differences resolve).
  std::vector<float> p(model->params(), model->params() + model->param_count());
  for (auto& v : p) v *= 4.f;
  std::memcpy(model->params(), p.data(), p.size() * sizeof(float));
  Rng rng(8);
  std::vector<float> x(static_cast<size_t>(rows * (t + 1)));
  for (auto& v : x) v = static_cast<float>(rng.next() % vocab);
  const std::vector<int32_t> unused(static_cast<size_t>(rows), 0);
  test::check_model_gradient(*model, x, unused, rows, 2e-3);
}

TEST_CASE("dataset bytes: windows every block_size bytes, the tail for validation", "[gpt][data]") {
  test::TempDir dir("bytes");
  const std::string text = corpus_text(1000, 1);
  test::put(dir.path / "a.txt", text.substr(0, 600));
  test::put(dir.path / "b.txt", text.substr(600));
  test::put(dir.path / ".hidden", "never read");
  DataConfig d;
  d.dataset = DatasetKind::bytes;
  d.path = dir.path.string();
  d.block_size = 10;
  d.validation = 0.1;
  const DataSplit s = load_data(d, 1);
  // 900 training bytes: 89 windows of 11; 100 test bytes: 9.
  REQUIRE(s.train.size() == 89);
  REQUIRE(s.test.size() == 9);
  CHECK(s.train.shape == std::vector<int64_t>{11});
  CHECK(s.train.classes == 256);
  for (int64_t w : {int64_t{0}, int64_t{88}})
    for (int64_t i = 0; i <= 10; ++i)
      CHECK(s.train.x[static_cast<size_t>(w * 11 + i)] ==
            static_cast<float>(static_cast<uint8_t>(text[static_cast<size_t>(w * 10 + i)])));
  CHECK(s.test.x[0] == static_cast<float>(static_cast<uint8_t>(text[900])));
  // y holds each window's last byte, which is no label: no warning of untrained classes.
  CHECK(label_warning(s).empty());
  const DataShape peek = peek_data_shape(d);
  CHECK(peek.train_size == 89);
  CHECK(peek.shape == s.train.shape);
  d.train_limit = 5;
  CHECK(load_data(d, 1).train.size() == 5);
}

TEST_CASE("dataset bytes: data.exclude leaves files out, data.sha256 pins the stream read",
          "[gpt][data]") {
  // FIPS 180-2's example: the SHA-256 of "abc".
  const std::string abc = "abc";
  CHECK(sha256_hex(reinterpret_cast<const uint8_t*>(abc.data()), abc.size()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  test::TempDir dir("bytes-pin");
  const std::string text = corpus_text(1000, 2);
  test::put(dir.path / "a", text.substr(0, 500));
  test::put(dir.path / "a.dat", "binary index");
  test::put(dir.path / "sub" / "b", text.substr(500));
  test::put(dir.path / "sub" / "notes.txt", "left out by its path below the folder");
  const std::string deep = "kept: '*' does not cross a '/'";
  test::put(dir.path / "sub" / "deep" / "kept.txt", deep);
  test::put(dir.path / "skip" / "c", "a whole folder left out");
  fs::create_symlink(dir.path / "a", dir.path / "a.u8");  // a link repeating a text
  DataConfig d;
  d.dataset = DatasetKind::bytes;
  d.path = dir.path.string();
  d.block_size = 10;
  const auto size = [&] { return peek_data_shape(d).train_size; };
  const int64_t all = size();
  d.exclude = {"*.dat", "*.u8", "sub/*.txt", "skip"};
  CHECK(size() < all);
  DataSplit s = load_data(d, 1);
  // What is left is a, sub/b and sub/deep/kept.txt, in path order.
  const std::string stream = text + deep;
  const auto ids = reinterpret_cast<const uint8_t*>(stream.data());
  CHECK(s.sha256 == sha256_hex(ids, stream.size()));
  CHECK_THAT(s.description, Catch::EndsWith("sha256=" + s.sha256));
  CHECK(s.train.x[0] == static_cast<float>(ids[0]));
  const CorpusSplit sp = split_bytes(static_cast<int64_t>(stream.size()), d.validation);
  CHECK(s.test.x[0] == static_cast<float>(ids[sp.train]));
  // A pin that holds loads the same windows, in capitals too; one that does not is refused.
  d.sha256 = s.sha256;
  CHECK(load_data(d, 1).train.x == s.train.x);
  std::transform(d.sha256.begin(), d.sha256.end(), d.sha256.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
  CHECK(load_data(d, 1).train.x == s.train.x);
  d.exclude = {"*.dat", "skip"};
  const std::string e = test::error_of([&] { load_data(d, 1); });
  CHECK_THAT(e, Catch::StartsWith("data.sha256: the "));
  CHECK_THAT(e, Catch::Contains("and the config pins " + s.sha256));
  d.exclude = {"*"};
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }),
             Catch::Contains("holds no files to read as bytes that data.exclude leaves in"));
  // A FIFO (or a link to a device) is not text: named, or left out by data.exclude.
  REQUIRE(::mkfifo((dir.path / "sub" / "pipe").c_str(), 0600) == 0);
  d.exclude = {"*.dat", "*.u8", "sub/*.txt", "skip"};
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }),
             Catch::Contains("/sub/pipe: a FIFO in a text folder; move it out, or list it in "
                             "data.exclude"));
  d.exclude.push_back("sub/pipe");
  CHECK(load_data(d, 1).sha256 == s.sha256);
  // Given as data.path itself, for bytes and for tokens: named for what it is too.
  DataConfig pipe = d;
  pipe.path = (dir.path / "sub" / "pipe").string();
  for (const DatasetKind kind : {DatasetKind::bytes, DatasetKind::tokens}) {
    pipe.dataset = kind;
    CHECK_THAT(test::error_of([&] { load_data(pipe, 1); }),
               Catch::Contains("/sub/pipe' is a FIFO, neither a file nor a folder"));
  }
  fs::remove(dir.path / "sub" / "pipe");
  d.exclude = {"*"};
  // A pattern that leaves nothing out (a typo, most likely) is named; the others are not.
  std::vector<std::string> unmatched;
  corpus_files(d.path, {"*.dat", "*.datt", "sub/*.txt", "sub/*/*.md"}, &unmatched);
  CHECK(unmatched == std::vector<std::string>{"*.datt", "sub/*/*.md"});
  // The keys: bytes alone, with their rules, and round trips through a sweep's override.
  const std::string gpt = "model: {type: gpt}\n";
  const std::string bytes = "data: {dataset: bytes, path: /x, ";
  CHECK_THAT(test::config_error(bytes + "sha256: abc}\n" + gpt),
             Catch::Contains("data.sha256: must be 64 hex digits"));
  CHECK_THAT(test::config_error(bytes + "exclude: ['/etc/*']}\n" + gpt),
             Catch::Contains("data.exclude: patterns match a file's name or its path below"));
  CHECK_THAT(test::config_error(bytes + "exclude: ['']}\n" + gpt),
             Catch::Contains("data.exclude: every pattern must be 1 to 256 bytes"));
  CHECK_THAT(test::config_error(bytes + "exclude: ['*a*a*a*a*a*a*a*a*a']}\n" + gpt),
             Catch::Contains("data.exclude: patterns may hold at most 8 '*'"));
  CHECK_THAT(test::config_error(bytes + "exclude: [\"a\\tb\"]}\n" + gpt),
             Catch::Contains("data.exclude: patterns must not hold control characters"));
  CHECK_THAT(test::config_error(bytes + "exclude: [[a]]}\n" + gpt),
             Catch::Contains("data.exclude: expected a list of strings, found"));
  CHECK_THAT(test::config_error(bytes + "exclude: '*.dat'}\n" + gpt),
             Catch::Contains("data.exclude: expected a list of strings, got"));
  CHECK_THAT(test::config_error("data: {exclude: ['*.dat']}\n"),
             Catch::Contains("data.exclude: only for dataset: bytes"));
  CHECK_THAT(test::config_error("data: {sha256: '" + s.sha256 + "'}\n"),
             Catch::Contains("data.sha256: only for dataset: bytes"));
  CHECK(parse_config(bytes + "exclude: ['*.dat', '*.u8']}\n" + gpt, "exp.yaml").data.exclude ==
        std::vector<std::string>{"*.dat", "*.u8"});
}

TEST_CASE("dataset bytes and model gpt: what cannot work is refused in one line", "[gpt][data]") {
  test::TempDir dir("bytes-bad");
  test::put(dir.path / "small.txt", std::string(40, 'a'));
  fs::create_directories(dir.path / "empty");
  DataConfig d;
  d.dataset = DatasetKind::bytes;
  d.block_size = 16;
  d.path = (dir.path / "missing").string();
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::Contains("does not exist"));
  d.path = (dir.path / "empty").string();
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::Contains("holds no files"));
  // A link to nothing inside a corpus folder is named, not skipped.
  test::put(dir.path / "linked" / "a.txt", std::string(4096, 'a'));
  fs::create_symlink(dir.path / "nowhere.txt", dir.path / "linked" / "b.txt");
  d.path = (dir.path / "linked").string();
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }),
             Catch::Contains((dir.path / "linked" / "b.txt").string() + ": cannot be read"));
  // A file that holds more than its size says (a kernel file, which says 0): never read past it.
  test::put(dir.path / "kernel" / "a.txt", std::string(4096, 'a'));
  fs::create_symlink("/proc/self/status", dir.path / "kernel" / "b.txt");
  d.path = (dir.path / "kernel").string();
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }),
             Catch::Contains("b.txt: holds more bytes than its size says (0)"));
  // One that holds less than its size said (a file cut while read; here a sysfs file, whose
  // size says a page): named, not read as a shorter corpus.
  const fs::path sysfs = "/sys/devices/system/cpu/online";
  std::error_code ec;
  if (fs::exists(sysfs, ec) && fs::file_size(sysfs, ec) > test::slurp(sysfs).size() && !ec) {
    test::put(dir.path / "shrunk" / "a.txt", std::string(4096, 'a'));
    fs::create_symlink(sysfs, dir.path / "shrunk" / "b.txt");
    d.path = (dir.path / "shrunk").string();
    CHECK_THAT(test::error_of([&] { load_data(d, 1); }),
               Catch::Contains("b.txt: cut short while read: "));
  }
  d.path = (dir.path / "small.txt").string();
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::Contains("data.validation"));
  d.block_size = 64;
  CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::Contains("lower data.block_size"));
  const std::string gpt = "model: {type: gpt}\n";
  CHECK_THAT(test::config_error(gpt), Catch::Contains("data.dataset: model.type gpt reads token windows"));
  const std::string bytes = "data: {dataset: bytes, path: /x}\n";
  CHECK_THAT(test::config_error(bytes), Catch::Contains("is read by model.type gpt"));
  CHECK_THAT(test::config_error(bytes + "model: {type: gpt}\n"), Catch::Equals(""));
  // No accuracy target for a language model unless the file sets one.
  CHECK(parse_config(bytes + "model: {type: gpt}\n", "exp.yaml").train.target_accuracy == 0);
  CHECK(parse_config(bytes + "model: {type: gpt}\ntrain: {target_accuracy: 0.5}\n", "exp.yaml")
            .train.target_accuracy == 0.5);
  CHECK_THAT(test::config_error("data: {dataset: bytes}\nmodel: {type: gpt}\n"),
             Catch::Contains("data.path: dataset: bytes needs data.path"));
  CHECK_THAT(test::config_error(bytes + "model: {type: gpt, n_embd: 30, n_head: 4}\n"),
             Catch::Contains("model.n_head: 4 heads do not divide model.n_embd (30)"));
  CHECK_THAT(test::config_error("data: {dataset: bytes, path: /x, normalize: global}\nmodel: {type: gpt}\n"),
             Catch::Contains("only false (or off)"));
  for (const char* off : {"off", "false"})
    CHECK(parse_config("data: {dataset: bytes, path: /x, normalize: " + std::string(off) +
                           "}\nmodel: {type: gpt}\n",
                       "exp.yaml")
              .data.normalize == Normalize::off);
  CHECK_THAT(test::config_error("data: {block_size: 32}\n"), Catch::Contains("only for dataset: bytes"));
  ModelConfig mc;
  mc.type = ModelType::gpt;
  mc.n_embd = 30;
  mc.n_head = 4;
  CHECK_THAT(test::error_of([&] { build_layers(mc, {17}, 256); }),
             Catch::Contains("model.n_embd (30) must be a multiple of model.n_head (4)"));
  mc.n_embd = 32;
  CHECK_THAT(test::error_of([&] { build_layers(mc, {1, 28, 28}, 10); }),
             Catch::Contains("windows of token ids"));
  // A GPT no machine holds: the memory estimate names the GPT's own keys to lower.
  test::put(dir.path / "big.txt", std::string(100000, 'b'));  // 87 windows of 1025
  const std::string big = (dir.path / "big.yaml").string();
  test::put(big, "data: {dataset: bytes, path: " + (dir.path / "big.txt").string() +
                     ", block_size: 1024}\nmodel: {type: gpt, n_layer: 24, n_head: 16, "
                     "n_embd: 2048}\ntrain: {per_replica_batch: 64}\n");
  const auto r = test::dtrain_cli("validate " + big);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("GiB available; lower model.n_embd, model.n_layer, "
                                    "data.block_size, train.per_replica_batch"));
}

// .bin files that the two words do not name (another case, another pattern) are left out, and
// said so: a shard misnamed would otherwise be missing from the stream without a word.
TEST_CASE("dataset tokens: .bin files named neither train nor val are left out, said so",
          "[gpt][data][cli]") {
  test::TempDir dir("tokens-left-out");
  const fs::path shards = dir.path / "shards";
  test::put(shards / "x_train_000001.bin", shard(counting(1000, 50)));
  test::put(shards / "x_val_000000.bin", shard(counting(2000, 21)));
  test::put(shards / "x_TRAIN_000002.bin", shard(counting(1050, 30)));
  test::put(shards / "other.bin", shard(counting(1050, 30)));
  test::put(shards / "x_train_000003.BIN", shard(counting(1050, 30)));
  const std::string cfg =
      dir.write("t.yaml", "name: t\ndata: {dataset: tokens, path: " + shards.string() +
                              ", block_size: 10, vocab_size: 3000}\nmodel: {type: gpt, n_layer: 1, "
                              "n_head: 2, n_embd: 32}\ntrain: {per_replica_batch: 2}\n");
  const auto r = test::dtrain_cli("validate " + cfg);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("train=4 ") &&
                        Catch::Contains("3 .bin files in '" + shards.string() +
                                        "' left out, named neither *train*.bin nor *val*.bin "
                                        "(lower case): other.bin, x_TRAIN_000002.bin, "
                                        "x_train_000003.BIN"));
}

TEST_CASE("dataset tokens: a folder's train shards, then its val shards, in name order",
          "[gpt][data]") {
  test::TempDir dir("tokens");
  // Written out of order; the names order them. What is not a *train* or *val* .bin is not read.
  test::put(dir.path / "fineweb_train_000002.bin", shard(counting(1050, 30)));
  test::put(dir.path / "fineweb_train_000001.bin", shard(counting(1000, 50)));
  test::put(dir.path / "fineweb_val_000000.bin", shard(counting(2000, 21)));
  test::put(dir.path / ".fineweb_train_000000.bin", "hidden: never read");
  test::put(dir.path / "notes_train.txt", "not a shard");
  test::put(dir.path / "sub" / "fineweb_train_000000.bin", "a sub-folder: never read");
  DataConfig d;
  d.dataset = DatasetKind::tokens;
  d.path = dir.path.string();
  d.block_size = 10;
  d.vocab_size = 3000;
  const DataSplit s = load_data(d, 1);
  // 80 training tokens as one stream: 7 windows of 11, the fifth crossing into the second
  // shard; 21 val tokens: 2.
  REQUIRE(s.train.size() == 7);
  REQUIRE(s.test.size() == 2);
  CHECK(s.train.shape == std::vector<int64_t>{11});
  CHECK(s.train.classes == 3000);
  CHECK(s.test.classes == 3000);
  for (int64_t w = 0; w < 7; ++w)
    for (int64_t i = 0; i <= 10; ++i)
      CHECK(s.train.x[static_cast<size_t>(w * 11 + i)] == static_cast<float>(1000 + w * 10 + i));
  for (int64_t w = 0; w < 2; ++w)
    for (int64_t i = 0; i <= 10; ++i)
      CHECK(s.test.x[static_cast<size_t>(w * 11 + i)] == static_cast<float>(2000 + w * 10 + i));
  CHECK(s.train.y[4] == 1050);  // the window's last token, from the second shard
  const DataShape peek = peek_data_shape(d);
  CHECK(peek.train_size == 7);
  CHECK(peek.classes == 3000);
  CHECK(peek.shape == s.train.shape);
  CHECK(nominal_shape(d) == s.train.shape);
  d.train_limit = 3;
  CHECK(load_data(d, 1).train.size() == 3);
  CHECK(peek_data_shape(d).train_size == 3);
  // Limits keep the first windows, the same as without them.
  d.test_limit = 1;
  const DataSplit full = load_data(
      [&] {
        DataConfig all = d;
        all.train_limit = all.test_limit = 0;
        return all;
      }(),
      1);
  const DataSplit kept = load_data(d, 1);
  REQUIRE(kept.train.size() == 3);
  REQUIRE(kept.test.size() == 1);
  CHECK(std::equal(kept.train.x.begin(), kept.train.x.end(), full.train.x.begin()));
  CHECK(std::equal(kept.test.x.begin(), kept.test.x.end(), full.test.x.begin()));
}

TEST_CASE("dataset tokens: one shard is split as bytes are, its tail for validation",
          "[gpt][data]") {
  test::TempDir dir("tokens-one");
  test::put(dir.path / "tiny.bin", shard(counting(0, 100)));
  DataConfig d;
  d.dataset = DatasetKind::tokens;
  d.path = (dir.path / "tiny.bin").string();
  d.block_size = 10;
  d.validation = 0.2;
  d.vocab_size = 300;
  const DataSplit s = load_data(d, 1);
  // 80 training tokens: 7 windows; 20 test tokens: 1, from token 80.
  REQUIRE(s.train.size() == 7);
  REQUIRE(s.test.size() == 1);
  CHECK(s.train.x[66] == 60.f);
  CHECK(s.test.x[0] == 80.f);
  CHECK(s.test.x[10] == 90.f);
  CHECK(s.train.classes == 300);
  CHECK(peek_data_shape(d).train_size == 7);
  // One file split by data.validation: a test limit reads its test windows from token 80 on.
  d.train_limit = 2;
  d.test_limit = 1;
  const DataSplit few = load_data(d, 1);
  REQUIRE(few.train.size() == 2);
  REQUIRE(few.test.size() == 1);
  CHECK(few.train.x[21] == 20.f);
  CHECK(few.test.x[0] == 80.f);
  CHECK(few.test.x[10] == 90.f);
  // They read the tokens of the windows they keep, no more: a token the vocabulary refuses
  // between them (index 50) is never read.
  std::vector<uint16_t> odd = counting(0, 100);
  odd[50] = 999;
  test::put(dir.path / "odd.bin", shard(odd));
  d.path = (dir.path / "odd.bin").string();
  CHECK(load_data(d, 1).test.x[0] == 80.f);
  d.train_limit = d.test_limit = 0;
  CHECK_THROWS_WITH(load_data(d, 1), Catch::Contains("token 999 at index 50 is not below"));
  d.path = (dir.path / "tiny.bin").string();
  // The largest token the vocabulary holds is read; one more is refused (below).
  test::put(dir.path / "edge.bin", shard(counting(280, 20)));
  d.path = (dir.path / "edge.bin").string();
  d.block_size = 1;
  CHECK(load_data(d, 1).test.x.back() == 299.f);
}

TEST_CASE("dataset tokens: a file that is not a version-1 llm.c shard is refused, naming it",
          "[gpt][data]") {
  test::TempDir dir("tokens-bad");
  const std::vector<uint16_t> t = counting(0, 40);
  const std::string good = shard(t);
  std::vector<uint16_t> over = t;
  over[2] = 300;
  const std::pair<std::string, std::string> cases[] = {
      {good.substr(0, 1000), "shorter than its header of 1024 bytes"},
      {std::string(2000, 'a'), "not an llm.c token shard (magic 1633771873, expected 20240520)"},
      {shard(t, 20240520, 2),
       "version 2; dtrain reads version 1 (uint16 tokens), not yet version 2"},
      {shard(t, 20240520, 7), "llm.c token shard version 7"},
      {good.substr(0, good.size() - 1), "cut short: its header claims 40 tokens, 1104 bytes"},
      {good + "xy", "2 bytes follow the 40 tokens its header claims"},
      {shard({}), "the shard holds no tokens"},
      {shard(t, 20240520, 1, 0x80000000LL),
       "the shard holds no tokens (its header says -2147483648)"},
      {shard(over), "token 300 at index 2 is not below data.vocab_size (300)"},
  };
  DataConfig d;
  d.dataset = DatasetKind::tokens;
  d.block_size = 2;
  d.vocab_size = 300;
  int i = 0;
  for (const auto& [bytes, message] : cases) {
    const fs::path p = dir.path / fmt::format("case{}.bin", i++);
    test::put(p, bytes);
    d.path = p.string();
    INFO(message);
    CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::StartsWith(p.string() + ": "));
    CHECK_THAT(test::error_of([&] { load_data(d, 1); }), Catch::Contains(message));
  }
  // The headers are checked before any token is read: peek refuses what load refuses.
  d.path = (dir.path / "case4.bin").string();
  CHECK_THAT(test::error_of([&] { peek_data_shape(d); }), Catch::Contains("cut short"));
}

TEST_CASE("dataset tokens: folders, sizes and keys that cannot work are refused in one line",
          "[gpt][data]") {
  test::TempDir dir("tokens-folders");
  const std::string ok = shard(counting(0, 40));
  test::put(dir.path / "no-val" / "x_train.bin", ok);
  test::put(dir.path / "no-train" / "x_val.bin", ok);
  test::put(dir.path / "both" / "x_train.bin", ok);
  test::put(dir.path / "both" / "x_val.bin", ok);
  test::put(dir.path / "both" / "train_val.bin", ok);
  test::put(dir.path / "short" / "x_train.bin", ok);
  test::put(dir.path / "short" / "x_val.bin", shard(counting(0, 4)));
  DataConfig d;
  d.dataset = DatasetKind::tokens;
  d.block_size = 8;
  const auto error = [&](const fs::path& p) {
    d.path = p.string();
    return test::error_of([&] { load_data(d, 1); });
  };
  CHECK_THAT(error(dir.path / "missing"), Catch::Contains("does not exist (dataset: tokens"));
  fs::create_symlink("self", dir.path / "self");
  CHECK_THAT(error(dir.path / "self"),
             Catch::Contains("self' is a symbolic link that loops or leads nowhere (dataset: "
                             "tokens"));
  CHECK_THAT(error(dir.path / "no-val"),
             Catch::Contains("holds no validation shards: llm.c token shards (*.bin) whose name "
                             "contains 'val'"));
  CHECK_THAT(error(dir.path / "no-train"),
             Catch::Contains("holds no training shards: llm.c token shards (*.bin) whose name "
                             "contains 'train'"));
  CHECK_THAT(error(dir.path / "both"),
             Catch::Contains("'train_val.bin' is named both train and val"));
  // A FIFO named as a shard: named, never opened.
  test::put(dir.path / "fifo" / "x_val.bin", ok);
  REQUIRE(::mkfifo((dir.path / "fifo" / "x_train.bin").c_str(), 0600) == 0);
  CHECK_THAT(error(dir.path / "fifo"),
             Catch::Contains("x_train.bin: is a FIFO, where a token shard (a regular file) is "
                             "named"));
  fs::create_directories(dir.path / "dangling");
  fs::create_symlink(dir.path / "nowhere.bin", dir.path / "dangling" / "x_train.bin");
  CHECK_THAT(error(dir.path / "dangling"),
             Catch::Contains((dir.path / "dangling" / "x_train.bin").string() +
                             ": cannot be read"));
  CHECK_THAT(error(dir.path / "short"),
             Catch::Contains("the val shards of '" + (dir.path / "short").string() +
                             "' hold 4 tokens, no window of data.block_size + 1 = 9 tokens"));
  d.validation = 0.2;
  CHECK_THAT(error(dir.path / "short"),
             Catch::Contains("data.validation: 0.2 splits a single shard file"));
  d.validation = 0.1;
  CHECK_THAT(error(dir.path / "no-val" / "x_train.bin"),
             Catch::Contains("data.validation: 0.1 of '"));
  // Past 2^31 tokens from the headers alone (the files are sparse: nothing is read or held).
  for (const char* name : {"a_train.bin", "b_train.bin"}) {
    const fs::path p = dir.path / "huge" / name;
    test::put(p, shard({}, 20240520, 1, 0x7fffffff));
    fs::resize_file(p, 1024 + 2 * uint64_t{0x7fffffff});
  }
  test::put(dir.path / "huge" / "a_val.bin", ok);
  CHECK_THAT(error(dir.path / "huge"),
             Catch::Contains("pass 2147483648 tokens (2^31) at " +
                             (dir.path / "huge" / "b_train.bin").string()));
}

TEST_CASE("dataset tokens: data.vocab_size is its own, and tokens are read by gpt alone",
          "[gpt][data]") {
  const std::string tokens = "data: {dataset: tokens, path: /x, vocab_size: 300}\n";
  CHECK_THAT(test::config_error(tokens + "model: {type: gpt}\n"), Catch::Equals(""));
  CHECK_THAT(test::config_error(tokens),
             Catch::Contains("model.type: dataset: tokens is read by model.type gpt (got mlp)"));
  CHECK_THAT(test::config_error("data: {vocab_size: 300}\n"),
             Catch::Contains("data.vocab_size: only for dataset: tokens"));
  CHECK_THAT(test::config_error("data: {dataset: bytes, path: /x, vocab_size: 300}\n"
                                "model: {type: gpt}\n"),
             Catch::Contains("dataset: bytes has a vocabulary of 256"));
  CHECK_THAT(test::config_error("data: {dataset: tokens, path: /x, vocab_size: 1}\n"
                                "model: {type: gpt}\n"),
             Catch::Contains("data.vocab_size"));
  const std::pair<const char*, const char*> refused[] = {
      {"normalize: global", "data.normalize: dataset: tokens holds token ids: only false (or off)"},
      {"sort_by_label: true", "data.sort_by_label: dataset: tokens has no labels to sort by"},
      {"augment: {flip: true}", "data.augment: dataset: tokens takes no image augmentation"}};
  for (const auto& [bad, message] : refused)
    CHECK_THAT(test::config_error(fmt::format("data: {{dataset: tokens, path: /x, {}}}\n"
                                              "model: {{type: gpt}}\n",
                                              bad)),
               Catch::Contains(message));
  CHECK_THAT(test::config_error("data: {validation: 0.2}\n"),
             Catch::Contains("only for dataset: bytes or tokens"));
  // Resolved with normalize off, as bytes are.
  const Config c = parse_config(tokens + "model: {type: gpt}\n", "exp.yaml", {});
  CHECK(c.data.normalize == Normalize::off);
  CHECK(c.data.vocab_size == 300);
  CHECK(parse_config("name: x\n", "exp.yaml", {}).data.vocab_size == 50257);
}

TEST_CASE("gpt: 4 replicas x 8 equal 1 replica x 32 with AdamW, warmup and cosine, step by step",
          "[gpt][equivalence]") {
  test::TempDir dir("gpt-eq");
  test::put(dir.path / "corpus.txt", corpus_text(16 * 32 * 10 + 200, 2));
  Config one = gpt_config((dir.path / "corpus.txt").string(), 1, 32);
  Config four = gpt_config(one.data.path, 4, 8);
  const DataSplit d = load_data(one.data, 1);
  const TrainResult a = train(one, d, nullptr);
  const TrainResult b = train(four, d, nullptr);
  REQUIRE(a.step_losses.size() == 9);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
  CHECK(a.epochs.back().test_loss == Approx(b.epochs.back().test_loss).epsilon(1e-5));
  // It learns: the mean next-byte loss falls from about log(256).
  CHECK(a.step_losses.front() > 4.5);
  CHECK(a.step_losses.back() < a.step_losses.front() - 0.3);
}

TEST_CASE("gpt: replicas with their own weights, gradients sent in buckets during backward "
          "and 2 accumulation steps equal 1 x 32",
          "[gpt][equivalence]") {
  // The tied head adds to the token embedding's gradient first, which the embedding finishes
  // last: a bucket that holds it must not leave before both.
  test::TempDir dir("gpt-buckets");
  test::put(dir.path / "corpus.txt", corpus_text(16 * 32 * 6 + 200, 5));
  Config one = gpt_config((dir.path / "corpus.txt").string(), 1, 32);
  Config two = gpt_config(one.data.path, 2, 8);
  two.train.accumulation_steps = 2;
  two.replicas = ReplicaMode::threads;
  two.train.bucket_mb = 0.004;  // about 1,000 floats: a dozen buckets
  const DataSplit d = load_data(one.data, 1);
  const TrainResult a = train(one, d, nullptr), b = train(two, d, nullptr);
  REQUIRE(a.step_losses.size() == 5);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
}

TEST_CASE("gpt: clipping by the global norm holds N x B = 1 x NB, and it engages",
          "[gpt][equivalence]") {
  test::TempDir dir("gpt-clip");
  test::put(dir.path / "corpus.txt", corpus_text(16 * 32 * 6 + 200, 4));
  Config one = gpt_config((dir.path / "corpus.txt").string(), 1, 32);
  // SGD: Adam's update is nearly blind to a gradient scale that changes slowly.
  one.optimizer.type = OptimizerType::sgd;
  one.optimizer.lr = 0.5;
  one.optimizer.momentum = 0.9;
  one.optimizer.grad_clip = 0.05;  // below the first steps' norms
  Config four = one;
  four.gpus = 4;
  four.train.per_replica_batch = 8;
  Config loose = one;
  loose.optimizer.grad_clip = 0;
  const DataSplit d = load_data(one.data, 1);
  const TrainResult a = train(one, d, nullptr), b = train(four, d, nullptr);
  const TrainResult c = train(loose, d, nullptr);
  REQUIRE(a.step_losses.size() == 5);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
  CHECK(test::max_rel_step_diff(a, c) > 1e-3);
}

TEST_CASE("gpt on llm.c token shards: 2 replicas x 8 equal 1 replica x 16, step by step",
          "[gpt][equivalence]") {
  test::TempDir dir("gpt-tokens-eq");
  // The words of corpus_text as tokens: its bytes, each space the token 299 of a vocabulary
  // of 300; two training shards and one val shard.
  const size_t cut = 16 * 16 * 8 + 1;  // 128 windows of 17, every 16 tokens; 4 to test
  const std::string text = corpus_text(cut + 16 * 4 + 1, 5);
  std::vector<uint16_t> t;
  for (char ch : text) t.push_back(ch == ' ' ? 299 : static_cast<uint8_t>(ch));
  const auto part = [&](size_t lo, size_t hi) {
    return std::vector<uint16_t>(t.begin() + static_cast<int64_t>(lo),
                                 t.begin() + static_cast<int64_t>(hi));
  };
  test::put(dir.path / "words_train_000001.bin", shard(part(0, 1000)));
  test::put(dir.path / "words_train_000002.bin", shard(part(1000, cut)));
  test::put(dir.path / "words_val_000000.bin", shard(part(cut, t.size())));
  Config one = gpt_config(dir.path.string(), 1, 16);
  one.data.dataset = DatasetKind::tokens;
  one.data.vocab_size = 300;
  Config two = one;
  two.gpus = 2;
  two.train.per_replica_batch = 8;
  const DataSplit d = load_data(one.data, 1);
  REQUIRE(d.train.size() == 128);
  REQUIRE(d.test.size() == 4);
  CHECK(d.train.classes == 300);
  const TrainResult a = train(one, d, nullptr);
  const TrainResult b = train(two, d, nullptr);
  REQUIRE(a.step_losses.size() == 8);
  CHECK(test::max_rel_step_diff(a, b) < 1e-5);
  CHECK(a.epochs.back().test_loss == Approx(b.epochs.back().test_loss).epsilon(1e-5));
  // It learns: the mean next-token loss falls from about log(300).
  CHECK(a.step_losses.front() > 5.0);
  CHECK(a.step_losses.back() < a.step_losses.front() - 0.3);
}

TEST_CASE("gpt: a run continued from any of its checkpoints gives the same bits",
          "[gpt][checkpoint]") {
  test::TempDir dir("gpt-resume");
  test::put(dir.path / "corpus.txt", corpus_text(16 * 16 * 8 + 300, 3));
  Config c = gpt_config((dir.path / "corpus.txt").string(), 2, 8);
  c.data.drop_remainder = false;
  c.train.epochs = 2;
  c.train.checkpoint_steps = 3;
  const DataSplit d = load_data(c.data, c.train.seed);
  test::Keep keep;
  const TrainResult full = train(c, d, &keep);
  REQUIRE(keep.all.size() >= 3);
  for (const auto& ck : keep.all) {
    INFO("from epoch " << ck.epoch << " step " << ck.step);
    test::require_same_numeric_columns(full, train(c, d, nullptr, &ck));
  }
}
