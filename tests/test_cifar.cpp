// CIFAR-10 and CIFAR-100 binary files, written here in the exact format (no data can be
// downloaded): read channel-planar with their labels, limits read only what they keep, damaged
// or mismatched files are refused naming the file and the record, and the data joins the
// equivalence contract (N replicas x B against 1 replica x N*B).
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "dtrain/base/error.hpp"
#include "dtrain/data/cifar.hpp"
#include "dtrain/data/data.hpp"
#include "helpers.hpp"

using namespace dtrain;
using namespace dtrain::test;
namespace fs = std::filesystem;

namespace {

// A record: label byte(s), then 3072 pixels whose value encodes (record, channel, position).
std::string record(int coarse, int label, int r, int label_bytes) {
  std::string s;
  if (label_bytes == 2) s += static_cast<char>(coarse);
  s += static_cast<char>(label);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 1024; ++i) s += static_cast<char>((r * 7 + c * 50 + i) % 256);
  return s;
}

// CIFAR-10 files with `per_file` records each (labels cycle through 0-9), in `dir`.
void write_cifar10(const fs::path& dir, int per_file, int test_records) {
  fs::create_directories(dir);
  int r = 0;
  for (int b = 1; b <= 5; ++b) {
    std::string bytes;
    for (int k = 0; k < per_file; ++k, ++r) bytes += record(0, r % 10, r, 1);
    put(dir / ("data_batch_" + std::to_string(b) + ".bin"), bytes);
  }
  std::string test;
  for (int k = 0; k < test_records; ++k) test += record(0, k % 10, 1000 + k, 1);
  put(dir / "test_batch.bin", test);
}

Config cifar_config(const fs::path& dir, int gpus, int64_t batch) {
  Config c = synthetic_config(gpus, batch);
  c.data.dataset = DatasetKind::cifar10;
  c.data.path = dir.string();
  c.model.hidden = {16};
  return c;
}

}  // namespace

TEST_CASE("CIFAR-10 files are read channel-planar with their labels, limits keep the first",
          "[data][cifar]") {
  TempDir d("cifar10");
  write_cifar10(d.path / "cifar-10-batches-bin", 3, 4);  // the archive's folder, found inside
  DataConfig cfg;
  cfg.dataset = DatasetKind::cifar10;
  cfg.path = d.path.string();
  cfg.normalize = Normalize::off;
  const DataSplit s = load_data(cfg, 1);
  REQUIRE(s.train.size() == 15);
  REQUIRE(s.test.size() == 4);
  CHECK(s.train.shape == std::vector<int64_t>{3, 32, 32});
  CHECK(s.train.classes == 10);
  CHECK(s.train.y[12] == 2);  // the files in order: record 12 is batch 5's first
  // Record 4, green channel (c = 1), pixel 10: (4 * 7 + 50 + 10) % 256 = 88.
  CHECK(s.train.x[4 * 3072 + 1024 + 10] == Approx(88 / 255.f));
  CHECK(s.test.x[3 * 3072 + 2 * 1024] == Approx(((1003 * 7 + 100) % 256) / 255.f));
  CHECK(peek_data_shape(cfg).train_size == 15);
  cfg.train_limit = 4;
  cfg.test_limit = 2;
  const DataSplit lim = load_data(cfg, 1);
  CHECK(lim.train.size() == 4);
  CHECK(lim.test.size() == 2);
  CHECK(lim.train.x == std::vector<float>(s.train.x.begin(), s.train.x.begin() + 4 * 3072));
}

TEST_CASE("CIFAR-100 files give the fine label, and CIFAR-100 is not read as CIFAR-10",
          "[data][cifar]") {
  TempDir d("cifar100");
  std::string train, test;
  for (int r = 0; r < 6; ++r) train += record(r % 20, 90 + r, r, 2);
  test += record(3, 42, 0, 2);
  put(d.path / "train.bin", train);
  put(d.path / "test.bin", test);
  DataConfig cfg;
  cfg.dataset = DatasetKind::cifar100;
  cfg.path = d.path.string();
  const DataSplit s = load_data(cfg, 1);
  CHECK(s.train.classes == 100);
  CHECK(s.train.y == std::vector<int32_t>{90, 91, 92, 93, 94, 95});
  CHECK(s.test.y == std::vector<int32_t>{42});
  cfg.dataset = DatasetKind::cifar10;
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("holds CIFAR-100 (train.bin), not CIFAR-10; set data.dataset: "
                             "cifar100"));
}

TEST_CASE("damaged CIFAR files are refused naming the file and the record", "[data][cifar]") {
  TempDir d("cifar-bad");
  const fs::path dir = d.path / "c";
  DataConfig cfg;
  cfg.dataset = DatasetKind::cifar10;
  cfg.path = dir.string();
  auto refused = [&] { return error_of([&] { load_data(cfg, 1); }); };
  write_cifar10(dir, 2, 2);
  // A short last record.
  put(dir / "data_batch_3.bin", record(0, 1, 0, 1) + record(0, 2, 1, 1).substr(0, 100));
  CHECK_THAT(refused(), Catch::Contains("data_batch_3.bin: 3173 bytes is not a CIFAR-10 batch") &&
                            Catch::Contains("record 2 is short (100 of 3073 bytes)"));
  // A label out of range, in the second record.
  put(dir / "data_batch_3.bin", record(0, 1, 0, 1) + record(0, 10, 1, 1));
  CHECK_THAT(refused(), Catch::Contains("data_batch_3.bin: record 2: label 10, but CIFAR-10 has "
                                        "10 classes (0 to 9)"));
  // Even when a limit would not reach it: the labels of what is read are checked, the sizes of
  // every file.
  write_cifar10(dir, 2, 2);
  fs::remove(dir / "data_batch_5.bin");
  cfg.train_limit = 1;
  CHECK_THAT(refused(), Catch::Contains("data_batch_5.bin: missing"));
  put(dir / "data_batch_5.bin", "");
  CHECK_THAT(refused(), Catch::Contains("data_batch_5.bin: 0 bytes is not a CIFAR-10 batch"));
  // Something other than a file in a batch's place is named for what it is (never opened: a
  // FIFO would block).
  fs::remove(dir / "data_batch_5.bin");
  REQUIRE(::mkfifo((dir / "data_batch_5.bin").c_str(), 0600) == 0);
  CHECK_THAT(refused(), Catch::Contains("data_batch_5.bin: a FIFO, where a batch file belongs"));
  fs::remove(dir / "data_batch_5.bin");
  fs::create_symlink("data_batch_5.bin", dir / "data_batch_5.bin");
  CHECK_THAT(refused(), Catch::Contains("data_batch_5.bin: a symbolic link that loops or leads "
                                        "nowhere"));
  fs::remove(dir / "data_batch_5.bin");
  fs::create_directory(dir / "data_batch_5.bin");
  CHECK_THAT(refused(), Catch::Contains("data_batch_5.bin: a folder, where"));
  fs::remove(dir / "data_batch_5.bin");
  fs::create_symlink("gone.bin", dir / "data_batch_1.bin.link");
  fs::remove(dir / "data_batch_1.bin");
  fs::rename(dir / "data_batch_1.bin.link", dir / "data_batch_1.bin");
  CHECK_THAT(refused(), Catch::Contains("data_batch_1.bin: a symbolic link that loops"));
  // No files at all, and a path that is a file.
  cfg.path = (d.path / "empty").string();
  fs::create_directories(cfg.path);
  CHECK_THAT(refused(), Catch::Contains("no data_batch_1.bin"));
  put(d.path / "file", "x");
  cfg.path = (d.path / "file").string();
  CHECK_THAT(refused(), Catch::Contains("is not a folder"));
  // The parser alone: a coarse label out of range in CIFAR-100.
  Dataset out;
  CHECK_THAT(error_of([&] {
               parse_cifar_records(record(20, 5, 0, 2), cifar_format(DatasetKind::cifar100), "f",
                                   0, out);
             }),
             Catch::Contains("f: record 1: coarse label 20, but CIFAR-100 has 20 (0 to 19)"));
}

TEST_CASE("dtrain validate on CIFAR files: one line for a user mistake", "[data][cifar][cli]") {
  TempDir d("cifar-cli");
  write_cifar10(d.path / "c10", 4, 4);
  const std::string cfg = d.write("c.yaml", tiny_config("c") + "backend: cpu\n");
  auto r = dtrain_cli("validate " + cfg + " data.dataset=cifar10 data.path=" +
                      (d.path / "c10").string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("train=20 test=4 shape=[3,32,32] classes=10"));
  r = dtrain_cli("validate " + cfg + " data.dataset=cifar100 data.path=" +
                 (d.path / "c10").string());
  CHECK(r.code == 2);
  CHECK(count_lines(r.out) == 1);
  CHECK_THAT(r.out, Catch::Contains("set data.dataset: cifar10"));
}

TEST_CASE("CIFAR data: 2 replicas x 8 equal 1 replica x 16 step by step",
          "[equivalence][cifar]") {
  TempDir d("cifar-eq");
  write_cifar10(d.path, 32, 20);
  const auto one = run_config(cifar_config(d.path, 1, 16));
  const auto two = run_config(cifar_config(d.path, 2, 8));
  REQUIRE(one.step_losses.size() == 10);
  CHECK(max_rel_step_diff(one, two) < 1e-5);
}

TEST_CASE("a CIFAR run stopped by a failure resumes from its checkpoint to the same bits",
          "[checkpoint][cifar][cli]") {
  TempDir d("cifar-resume");
  write_cifar10(d.path / "c10", 32, 20);
  const std::string cfg = d.write(
      "c.yaml", "name: c\nbackend: cpu\nthreads: 1\ngpus: 2\n"
                "data: {dataset: cifar10, path: " + (d.path / "c10").string() +
                    ", augment: {crop_padding: 2, flip: true}}\n"
                    "model: {hidden: [16]}\n"
                    "train: {epochs: 3, per_replica_batch: 8, target_accuracy: 0, "
                    "checkpoint_steps: 4}\n"
                    "optimizer: {lr: 0.02, base_batch: 16, momentum: 0.9}\n");
  const auto ref = (d.path / "ref").string(), res = (d.path / "res").string();
  REQUIRE(dtrain_cli("run " + cfg + " --results " + ref + " --tag t --quiet").code == 0);
  // Fails at step 17 (epoch 2), after checkpoints; --resume reads the checkpoint back through
  // its bound (which counts the CIFAR files' records) and finishes the run.
  REQUIRE(shell("DTRAIN_FAULT=1:17 " + dtrain_binary() + " run " + cfg + " --results " + res +
                " --tag t --quiet")
              .code == 1);
  const auto r = dtrain_cli("run " + cfg + " --results " + res + " --tag t --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume: continuing at epoch") != std::string::npos);
  CHECK(numeric_columns(fs::path(res) / "c" / "t-g2" / "metrics.csv") ==
        numeric_columns(fs::path(ref) / "c" / "t-g2" / "metrics.csv"));
}
