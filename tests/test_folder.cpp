// dataset: folder: trees of JPEG and PNG files the tests write themselves; the listing, the
// bad-file policy, the input pipeline's determinism at any worker count, and the equivalence
// and resume contracts with images decoded as they are used.
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint_helpers.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/data/image_folder.hpp"
#include "dtrain/data/pipeline.hpp"
#include "dtrain/train/trainer.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

// A fresh folder under the temporary directory, removed at the end of the test.
struct TempTree {
  fs::path dir;
  explicit TempTree(const std::string& name) {
    dir = fs::temp_directory_path() / fmt::format("dtrain-folder-{}-{}", name, ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempTree() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// Learnable 3-channel images: the synthetic task's clusters squashed into [0, 1].
DataSplit image_split(int64_t train, int64_t test, int64_t side) {
  SyntheticConfig s;
  s.train_size = train;
  s.test_size = test;
  s.shape = {3, side, side};
  s.classes = 4;
  s.noise = 1.0;
  DataSplit d;
  d.train = make_synthetic(s, train, 7, 1);
  d.test = make_synthetic(s, test, 7, 2);
  for (Dataset* x : {&d.train, &d.test})
    for (float& v : x->x) v = 1.f / (1.f + std::exp(-v));
  return d;
}

// A tree of `train` + `test` images (JPEG at quality 90 where `jpeg`, else PNG).
void write_tree(const fs::path& dir, int64_t train, int64_t test, bool jpeg = false) {
  const DataSplit d = image_split(train, test, 12);
  write_image_tree(d.train, d.test, dir.string(), jpeg ? 90 : 0);
}

Config folder_config(const fs::path& dir, int gpus, int64_t batch) {
  Config c = synthetic_config(gpus, batch);
  c.data.dataset = DatasetKind::folder;
  c.data.path = dir.string();
  c.data.shape = {3, 8, 8};
  c.data.normalize = Normalize::channel;
  c.data.augment.flip = true;
  c.data.augment.crop_scale = {0.5, 1.0};
  c.data.workers = 2;
  c.model.hidden = {32};
  return c;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("a folder tree is listed: classes sorted, files sorted, hidden names left out",
          "[folder]") {
  TempTree t("list");
  write_tree(t.dir, 40, 12);
  write_bytes(t.dir / "train" / ".hidden" / "x.png", "not an image");
  write_bytes(t.dir / "train" / "0" / ".DS_Store", "junk");
  // A subfolder belongs to its class; a link to a folder (here a loop) is not followed.
  // (The image is picked before the subfolder exists: a listing's order is the file system's.)
  const fs::path image = fs::directory_iterator(t.dir / "train" / "1")->path();
  fs::create_directories(t.dir / "train" / "1" / "more");
  fs::copy_file(image, t.dir / "train" / "1" / "more" / "copy.png");
  fs::create_directory_symlink(t.dir / "train", t.dir / "train" / "2" / "loop");
  const FolderListing l = list_image_folder(t.dir.string(), BadFile::fail);
  CHECK(l.classes == std::vector<std::string>{"0", "1", "2", "3"});
  CHECK(l.train.size() == 41);
  CHECK(l.test.size() == 12);
  CHECK(std::is_sorted(l.train_y.begin(), l.train_y.end()));
  std::set<std::string> seen(l.train.begin(), l.train.end());
  CHECK(seen.count("train/1/more/copy.png") == 1);
  for (const auto& p : l.train) CHECK(p.find(".DS_Store") == std::string::npos);
  CHECK(l.skipped.empty());
}

TEST_CASE("folder: what is not a tree of classes is refused with the path", "[folder]") {
  TempTree t("bad-tree");
  auto refused = [&](const std::string& want) {
    try {
      list_image_folder(t.dir.string(), BadFile::fail);
      FAIL("accepted");
    } catch (const UserError& e) {
      CHECK_THAT(e.what(), Catch::Contains(want));
    }
  };
  refused("train: no such folder");
  write_bytes(t.dir / "train", "x");
  refused("train: not a folder");
  fs::remove(t.dir / "train");
  fs::create_directories(t.dir / "train");
  refused("holds no class folders");
  write_tree(t.dir, 40, 8);
  fs::create_directories(t.dir / "train" / "9");
  refused("train/9: holds no image files");
  fs::remove(t.dir / "train" / "9");
  write_bytes(t.dir / "test" / "zebra" / "a.png", "x");
  refused("class 'zebra' is not among the training classes");
}

TEST_CASE("folder: bad files fail naming the path, or are skipped and listed", "[folder]") {
  TempTree t("bad-files");
  write_tree(t.dir, 24, 8);
  write_bytes(t.dir / "train" / "0" / "empty.png", "");
  write_bytes(t.dir / "train" / "1" / "text.jpg", "this is not an image at all");
  const std::string png = [&] {
    std::ifstream in(
        t.dir / "train" / "2" / fs::directory_iterator(t.dir / "train" / "2")->path().filename(),
        std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  write_bytes(t.dir / "train" / "2" / "cut.png", png.substr(0, png.size() / 2));
  fs::create_symlink("self.png", t.dir / "train" / "3" / "self.png");  // a link loop
  // fail: the listing stops at the first entry it can see is bad.
  try {
    list_image_folder(t.dir.string(), BadFile::fail);
    FAIL("accepted");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("empty.png: empty file") ||
                             Catch::Contains("self.png: cannot be read"));
  }
  // skip: the listing leaves out what it can see; decoding everything finds the rest.
  FolderListing l = list_image_folder(t.dir.string(), BadFile::skip);
  CHECK(l.skipped.size() == 2);
  drop_undecodable(l, t.dir.string(), 3, 3);
  REQUIRE(l.skipped.size() == 4);
  CHECK(l.train.size() == 24);
  std::string all;
  for (const auto& s : l.skipped) all += s + "\n";
  CHECK_THAT(all, Catch::Contains("text.jpg: not a JPEG or PNG file"));
  CHECK_THAT(all, Catch::Contains("cut.png"));
  // Through load_data, the skipped files travel with the data.
  Config c = folder_config(t.dir, 1, 8);
  c.data.on_bad_file = BadFile::skip;
  const DataSplit d = load_data(c.data, 1);
  CHECK(d.skipped.size() == 4);
  CHECK(d.train.size() == 24);
  CHECK(d.class_names.size() == 4);
  // A split whose every file is skipped says so, with the first reason, at listing and at
  // decoding.
  TempTree bad("all-bad");
  write_bytes(bad.dir / "train" / "a" / "1.png", "");
  write_bytes(bad.dir / "test" / "a" / "2.png", "not an image");
  CHECK_THAT(error_of([&] { list_image_folder(bad.dir.string(), BadFile::skip); }),
             Catch::Contains("train: no usable image file (1 left out by data.on_bad_file: "
                             "skip; the first: ") &&
                 Catch::Contains("1.png: empty file (0 bytes))"));
  write_bytes(bad.dir / "train" / "a" / "1.png", "not an image either");
  Config cb = folder_config(bad.dir, 1, 8);
  cb.data.on_bad_file = BadFile::skip;
  CHECK_THAT(error_of([&] { load_data(cb.data, 1); }),
             Catch::Contains("train: no usable image file (1 left out") &&
                 Catch::Contains("1.png: not a JPEG or PNG file"));
}

// A valid PNG of the tree cut to its first `keep` bytes: its header reads, its pixels do not.
std::string cut_png(const fs::path& class_dir, size_t keep) {
  return slurp(*fs::directory_iterator(class_dir)).substr(0, keep);
}

TEST_CASE("folder: what is not an image is refused before training, naming it", "[folder]") {
  TempTree t("before-training");
  write_tree(t.dir, 24, 8);
  Config c = folder_config(t.dir, 1, 8);
  // Files whose names are not images' are no samples; a BMP is an image dtrain cannot decode.
  write_bytes(t.dir / "train" / "1" / "notes.txt", "about class 1");
  write_bytes(t.dir / "train" / "1" / "Thumbs.db", std::string(64, '\0'));
  const DataSplit with_notes = load_data(c.data, 1);
  CHECK(with_notes.other_files == 2);
  CHECK(with_notes.train.size() == 24);
  CHECK_THAT(with_notes.description, Catch::Contains("(2 other files left out"));
  write_bytes(t.dir / "train" / "1" / "scan.BMP", "BM not decodable here");
  CHECK_THAT(error_of([&] { load_data(c.data, 1); }),
             Catch::Contains("scan.BMP: not a JPEG or PNG file"));
  fs::remove(t.dir / "train" / "1" / "scan.BMP");
  // A training file that is no image, and a test file cut short past its header: both would
  // otherwise be met only after some training (the test file after a whole epoch).
  write_bytes(t.dir / "train" / "1" / "zz-text.png", "this is not an image at all");
  CHECK_THAT(error_of([&] { load_data(c.data, 1); }),
             Catch::Contains("zz-text.png: not a JPEG or PNG file") &&
                 Catch::Contains("found before training"));
  fs::remove(t.dir / "train" / "1" / "zz-text.png");
  const fs::path test_class = *fs::directory_iterator(t.dir / "test");
  write_bytes(test_class / "zz-cut.png", cut_png(test_class, 60));
  CHECK_THAT(error_of([&] { load_data(c.data, 1); }), Catch::Contains("zz-cut.png"));
  fs::remove(test_class / "zz-cut.png");
  // A JPEG whose frame header lies past its first 16 KiB (a large comment segment first) is
  // an image: its header is looked for in the whole file.
  Image grey;
  grey.width = grey.height = 4;
  grey.channels = 3;
  grey.pixels.assign(48, 128);
  const std::vector<uint8_t> enc = encode_jpeg(grey, 90);
  const std::string jpeg(enc.begin(), enc.end());
  std::string big = jpeg.substr(0, 2);
  for (int i = 0; i < 2; ++i) big += std::string("\xFF\xFE\xFF\xF0", 4) + std::string(0xFFEE, 'c');
  big += jpeg.substr(2);
  write_bytes(t.dir / "train" / "1" / "zz-big.jpg", big);
  CHECK_NOTHROW(load_data(c.data, 1));
  // validate loads the data as run does: it refuses what run would.
  write_bytes(test_class / "zz-cut.png", cut_png(test_class, 60));
  TempDir d("before-training-cli");
  const fs::path cfg = d.path / "f.yaml";
  std::ofstream(cfg) << "name: f\nthreads: 1\ndata: {dataset: folder, path: " << t.dir.string()
                     << ", shape: [3, 8, 8]}\nmodel: {hidden: [8]}\n";
  const auto v = dtrain_cli("validate " + cfg.string());
  CHECK(v.code == 2);
  CHECK_THAT(v.out, Catch::Contains("zz-cut.png"));
}

TEST_CASE("folder: a file that does not decode stops training, naming it", "[folder]") {
  TempTree t("decode-fail");
  write_tree(t.dir, 24, 8);
  // Its header reads (the check before training passes it); its pixels do not.
  write_bytes(t.dir / "train" / "1" / "zz-cut.png", cut_png(t.dir / "train" / "1", 100));
  Config c = folder_config(t.dir, 1, 8);
  c.data.normalize = Normalize::off;  // the statistics would meet the file first otherwise
  try {
    run_config(c);
    FAIL("trained");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("zz-cut.png: "));
  }
  // Through dtrain run: one line and exit 2, the run marked failed, and its log ends with why.
  TempDir d("decode-fail-cli");
  const fs::path cfg = d.path / "f.yaml";
  std::ofstream(cfg) << "name: f\nthreads: 1\ndata: {dataset: folder, path: " << t.dir.string()
                     << ", shape: [3, 8, 8], normalize: false}\nmodel: {hidden: [8]}\n"
                        "train: {epochs: 1, per_replica_batch: 8}\n";
  const fs::path res = d.path / "res";
  const auto r = dtrain_cli("run " + cfg.string() + " --quiet --tag t --results " + res.string());
  INFO(r.out);
  CHECK(r.code == 2);
  const fs::path run = res / "f" / "t-g1";
  CHECK(slurp(run / "status") == "failed\n");
  const std::string log = slurp(run / "log");
  REQUIRE(log.size() > 2);
  CHECK_THAT(log.substr(log.rfind('\n', log.size() - 2) + 1),
             Catch::Contains("error run t-g1 failed: ") && Catch::Contains("zz-cut.png: "));
}

TEST_CASE("the input pipeline gives the same batches at any worker and prefetch count",
          "[folder][determinism]") {
  TempTree t("pipeline");
  write_tree(t.dir, 60, 10, /*jpeg=*/true);
  Config c = folder_config(t.dir, 1, 8);
  const DataSplit d = load_data(c.data, 1);
  const int64_t f = d.train.features();
  auto batches = [&](int workers, int prefetch, int64_t epoch) {
    ImagePipeline p(d.train.files, d.train.y, workers, prefetch, 7);
    std::vector<float> all;
    std::vector<int32_t> labels;
    p.start(
        9,
        [](int64_t b, std::vector<int64_t>& out) {
          for (int64_t i = 0; i < 7; ++i) out.push_back((b * 13 + i * 5) % 60);
        },
        epoch, 1);
    for (int b = 0; b < 9; ++b) {
      const auto batch = p.next();
      REQUIRE(batch.rows == 7);
      all.insert(all.end(), batch.x, batch.x + 7 * f);
      labels.insert(labels.end(), batch.y, batch.y + 7);
    }
    CHECK(p.decoded() >= 63);
    return std::pair{all, labels};
  };
  const auto ref = batches(1, 1, 0);
  for (auto [w, pf] : {std::pair{2, 1}, std::pair{4, 3}, std::pair{8, 8}}) {
    INFO(w << " workers, prefetch " << pf);
    const auto got = batches(w, pf, 0);
    CHECK(got.first == ref.first);  // bit for bit
    CHECK(got.second == ref.second);
  }
  CHECK(batches(2, 2, 1).first != ref.first);  // another epoch, other crops
  for (size_t i = 0; i < 7; ++i) CHECK(ref.second[i] == d.train.y[(i * 5) % 60]);
}

// Decoded pixels are bounded over all workers: with a cap of 1000 bytes, eight threads asking
// 400 each hold at most two at once; one larger than the cap goes ahead alone.
TEST_CASE("the decode budget bounds the pixels held at once, and lets one large image pass",
          "[folder]") {
  DecodeBudget b(1000);
  std::atomic<int64_t> now{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        const DecodeBudget::Hold h(b, 400);
        const int64_t mine = now += 400;
        for (int64_t m = most.load(); mine > m && !most.compare_exchange_weak(m, mine);) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        now -= 400;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(b.peak() <= 800);
  CHECK(most.load() <= 800);
  { const DecodeBudget::Hold alone(b, 5000); }
  CHECK(b.peak() == 5000);
  // A wait that its pipeline cancels ends at once (DecodeCancelled), while the budget is held.
  {
    const DecodeBudget::Hold big(b, 900);
    std::atomic<bool> cancel{false};
    std::atomic<bool> gave_up{false};
    std::thread waiter([&] {
      try {
        const DecodeBudget::Hold h(b, 400, &cancel);
      } catch (const DecodeCancelled&) {
        gave_up = true;
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(gave_up.load());  // still waiting: 900 + 400 would pass 1000
    const auto t0 = std::chrono::steady_clock::now();
    cancel = true;
    waiter.join();
    CHECK(gave_up.load());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  }
  // make_sample draws on the process's budget: a 12x12 RGB PNG holds 432 bytes.
  TempTree t("budget");
  write_tree(t.dir, 60, 10);
  const DataSplit d = load_data(folder_config(t.dir, 1, 4).data, 1);
  std::vector<float> x(static_cast<size_t>(d.train.features()));
  make_sample(*d.train.files, 0, 0, 1, x.data());
  CHECK(DecodeBudget::process().peak() >= 12 * 12 * 3);
}

TEST_CASE("the input pipeline stops early, restarts, and reports a failed sample in order",
          "[folder]") {
  TempTree t("pipeline-stop");
  write_tree(t.dir, 30, 6);
  const DataSplit d = load_data(folder_config(t.dir, 1, 8).data, 1);
  ImagePipeline p(d.train.files, d.train.y, 3, 4, 5);
  auto plan = [](int64_t b, std::vector<int64_t>& out) {
    for (int64_t i = 0; i < 5; ++i) out.push_back((b * 5 + i) % 30);
  };
  p.start(100, plan, 0, 1);
  p.next();
  p.start(3, plan, 1, 1);  // the rest of the first sequence is dropped
  for (int b = 0; b < 3; ++b) CHECK(p.next().rows == 5);
  CHECK_THROWS_AS(p.next(), SystemError);  // past the end of the sequence
  // A plan that names a sample out of range fails that batch, not the process.
  p.start(
      2, [](int64_t b, std::vector<int64_t>& out) { out.push_back(b == 1 ? 1000 : 0); }, 0, 1);
  CHECK(p.next().rows == 1);
  CHECK_THROWS(p.next());
  p.stop();
}

TEST_CASE("folder: 4 replicas x 16 equal 1 replica x 64 with crops and flips, step by step",
          "[folder][equivalence]") {
  TempTree t("equivalence");
  const bool jpeg = GENERATE(false, true);  // JPEG: windows decoded, not whole images
  INFO((jpeg ? "JPEG" : "PNG"));
  write_tree(t.dir, 64 * 12, 64, jpeg);
  Config one = folder_config(t.dir, 1, 64);
  Config four = folder_config(t.dir, 4, 16);
  four.data.workers = 1;  // and any worker count: the crops are keyed by sample
  one.train.epochs = four.train.epochs = 2;
  const DataSplit d = load_data(one.data, 1);
  const TrainResult a = train(one, d, nullptr);
  const TrainResult b = train(four, d, nullptr);
  REQUIRE(a.step_losses.size() == 24);
  CHECK(max_rel_step_diff(a, b) < 1e-5);
  CHECK(a.epochs.back().test_acc == Approx(b.epochs.back().test_acc).margin(1e-3));
  CHECK(a.step_losses.back() < 0.8 * a.step_losses.front());  // it learns
}

TEST_CASE("folder: a run continued from any of its checkpoints gives the same bits",
          "[folder][checkpoint]") {
  TempTree t("resume");
  const bool jpeg = GENERATE(false, true);
  INFO((jpeg ? "JPEG" : "PNG"));
  write_tree(t.dir, 16 * 2 * 6 + 5, 32, jpeg);
  Config c = folder_config(t.dir, 2, 16);
  c.data.drop_remainder = false;
  c.train.epochs = 2;
  c.train.checkpoint_steps = 4;
  const DataSplit d = load_data(c.data, c.train.seed);
  Keep keep;
  const TrainResult full = train(c, d, &keep);
  REQUIRE(keep.all.size() >= 3);
  for (const auto& ck : keep.all) {
    INFO("from epoch " << ck.epoch << " step " << ck.step);
    // Loaded afresh, as by a new process: its first reads of a JPEG decode to the file's end,
    // where the uninterrupted run's later reads stopped at the crop.
    require_same_numeric_columns(full, train(c, load_data(c.data, c.train.seed), nullptr, &ck));
  }
}

TEST_CASE("folder: a run that skipped a bad file continues from its checkpoint", "[folder]") {
  // The listing counts 201 files, of which one does not decode: loading skips it, and an epoch
  // has 5 steps of 40 where the listing alone would say 6. The checkpoint's position is checked
  // against the 5.
  TempTree t("resume-skip");
  write_tree(t.dir, 198, 16);  // and one more below, in each of a fifth and a sixth class
  const fs::path one = *fs::directory_iterator(t.dir / "train" / "0");
  write_bytes(t.dir / "train" / "0" / "zz-cut.png", slurp(one).substr(0, 100));
  // A class whose folder name holds a newline: one line of classes.txt, the byte as \x0a; and
  // one whose name is those four characters, written apart from it (its backslash as \\).
  write_bytes(t.dir / "train" / "x\ny" / "a.png", slurp(one));
  write_bytes(t.dir / "train" / "x\\x0ay" / "a.png", slurp(one));
  const std::string cfg = (t.dir / "run.yaml").string();
  put(cfg, fmt::format("name: skip\ngpus: 2\ndata: {{dataset: folder, path: {}, shape: [3, 8, 8], "
                       "on_bad_file: skip, drop_remainder: false}}\nmodel: {{type: mlp, hidden: "
                       "[16]}}\ntrain: {{epochs: 2, per_replica_batch: 20, checkpoint_steps: 1}}"
                       "\noptimizer: {{type: sgd, lr: 0.05}}\n",
                       t.dir.string()));
  const std::string run =
      dtrain_binary() + " run " + cfg + " -q --results " + (t.dir / "res").string() + " --tag ";
  REQUIRE(shell(run + "whole").code == 0);
  const auto cut = shell("DTRAIN_FAULT=0:7 " + run + "cut");  // epoch 2, step 2
  REQUIRE(cut.code != 0);
  // With other decode threads and prefetch, which change no sample.
  const auto resumed = shell(run + "cut --resume data.workers=1 data.prefetch=3");
  INFO(resumed.out);
  REQUIRE(resumed.code == 0);
  CHECK_THAT(resumed.out, Catch::Contains("skipped"));
  const fs::path exp = t.dir / "res" / "skip";
  CHECK(slurp(exp / "whole-g2" / "classes.txt") == "0\n1\n2\n3\nx\\x0ay\nx\\\\x0ay\n");
  CHECK(numeric_columns(exp / "cut-g2" / "metrics.csv") ==
        numeric_columns(exp / "whole-g2" / "metrics.csv"));
}

TEST_CASE("folder: limits keep every class, and statistics come from the images", "[folder]") {
  TempTree t("limits");
  write_tree(t.dir, 80, 20);
  Config c = folder_config(t.dir, 1, 8);
  c.data.train_limit = 8;
  c.data.test_limit = 4;
  const DataSplit d = load_data(c.data, 1);
  REQUIRE(d.train.size() == 8);
  CHECK(d.test.size() == 4);
  CHECK(std::set<int32_t>(d.train.y.begin(), d.train.y.end()).size() == 4);
  CHECK(peek_data_shape(c.data).train_size == 8);
  CHECK(peek_data_shape(c.data).classes == 4);
  // Squashed clusters sit near 0.5 on average; a measured std is neither 0 nor 1.
  for (size_t ch = 0; ch < 3; ++ch) {
    CHECK(d.train.files->mean[ch] == Approx(0.5).margin(0.15));
    CHECK(d.train.files->inv_std[ch] > 1.5f);
  }
  c.data.mean = {0.25};
  c.data.stddev = {0.5};
  c.data.normalize = Normalize::global;
  const DataSplit g = load_data(c.data, 1);
  CHECK(g.test.files->mean == std::vector<float>(3, 0.25f));
  CHECK(g.test.files->inv_std == std::vector<float>(3, 2.f));
}

TEST_CASE("folder: statistics of large images are measured in bounded memory", "[folder]") {
  TempTree t("stats-memory");
  write_tree(t.dir, 24, 8);
  const fs::path cfg = t.dir / "b.yaml";
  std::ofstream(cfg) << "name: b\nthreads: 1\ndata: {dataset: folder, path: " << t.dir.string()
                     << ", shape: [3, 8, 8], normalize: channel}\nmodel: {hidden: [8]}\n"
                        "train: {epochs: 1, per_replica_batch: 4}\n";
  // 24 images of 3 x 2048 x 2048 floats, 48 MiB each, on 4 workers: 16 at a time were 768 MiB,
  // 5 at a time (256 MiB at most) are 240 MiB.
  const auto [code, mib] =
      dtrain_peak_mib({"validate", cfg.string(), "data.shape=[3,2048,2048]", "data.workers=4"});
  CHECK(code == 0);
#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_FOLDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_FOLDER_ASAN 1
#endif
#endif
#ifdef DTRAIN_FOLDER_ASAN  // the dtrain under test is built alike
  WARN("peak memory not checked under AddressSanitizer (" << mib << " MiB)");
#else
  CHECK(mib < 640);
#endif
}

TEST_CASE("folder: a tree of 100000 files is listed within 10 seconds", "[folder][slow]") {
  TempTree t("many");
  for (int c = 0; c < 100; ++c) {
    const fs::path dir = t.dir / "train" / fmt::format("c{:02}", c);
    fs::create_directories(dir);
    for (int i = 0; i < 1000; ++i) std::ofstream(dir / fmt::format("{:04}.png", i)) << 'x';
  }
  fs::create_directories(t.dir / "test" / "c00");
  std::ofstream(t.dir / "test" / "c00" / "a.png") << 'x';
  const auto t0 = std::chrono::steady_clock::now();
  const FolderListing l = list_image_folder(t.dir.string(), BadFile::fail);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(l.train.size() == 100000);
  CHECK(l.classes.size() == 100);
  CHECK(l.train_y.back() == 99);
  WARN("listed 100000 files in " << s << " s");
  CHECK(s < 10.0);
}

TEST_CASE("folder: a JPEG cut short is named on its first read, whatever its crop", "[folder]") {
  TempTree t("cut-jpeg");
  Image img{64, 64, 3, {}};
  for (int64_t i = 0; i < 64 * 64 * 3; ++i)
    img.pixels.push_back(static_cast<uint8_t>((i * 37 + (i / 192) * 11) % 251));
  const std::vector<uint8_t> jpeg = encode_jpeg(img, 90);
  write_bytes(t.dir / "train" / "0" / "whole.jpg", std::string(jpeg.begin(), jpeg.end()));
  write_bytes(t.dir / "train" / "0" / "cut.jpg",
              std::string(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() * 3 / 4)));
  ImageFiles f;
  f.root = t.dir.string();
  f.paths = {"train/0/whole.jpg", "train/0/cut.jpg"};
  f.shape = {3, 8, 8};
  f.mean = {0, 0, 0};
  f.inv_std = {1, 1, 1};
  f.crop_scale = {0.08, 0.08};
  f.crop_ratio = {1, 1};
  // An epoch whose crop of sample 1 lies in the top rows, which the cut file still holds.
  int64_t epoch = -1;
  for (int64_t e = 0; e < 200 && epoch < 0; ++e) {
    const CropBox b = random_resized_crop(64, 64, 0.08, 0.08, 1, 1, false, sample_key(7, e, 1));
    const PixelRect r = resample_reads(64, 64, b, 8, 8);
    if (r.y0 + r.height <= 24) epoch = e;
  }
  REQUIRE(epoch >= 0);
  std::vector<float> first(3 * 8 * 8), again(first.size());
  CHECK_THAT(error_of([&] { make_sample(f, 1, epoch, 7, first.data()); }),
             Catch::Contains("cut.jpg: JPEG data cut short or corrupt"));
  // An intact file's later reads stop at the crop's last row and give the first read's bits.
  for (int64_t e = 0; e < 4; ++e) {
    ImageFiles fresh = f;
    fresh.whole_reads = std::make_shared<WholeReads>();
    make_sample(fresh, 0, e, 7, first.data());
    CHECK(fresh.whole_reads->contains(fresh.full_path(0)));
    make_sample(fresh, 0, e, 7, again.data());
    CHECK(first == again);
  }
}

TEST_CASE("folder: data loaded for one run serves another with its own crops and flips",
          "[folder]") {
  TempTree t("transform-reuse");
  write_tree(t.dir, 24, 8, true);
  Config a = folder_config(t.dir, 1, 8);
  Config b = a;
  b.data.augment.flip = false;
  b.data.augment.crop_scale = {1.0, 1.0};
  b.data.jpeg_draft = true;
  // One identity, so a sweep over these keys loads the data once and trains each on it.
  REQUIRE(data_identity(a.data, a.train.seed) == data_identity(b.data, b.train.seed));
  const DataSplit loaded_for_a = load_data(a.data, a.train.seed);
  const TrainResult reused = train(b, loaded_for_a);
  const TrainResult own = train(b, load_data(b.data, b.train.seed));
  CHECK(reused.step_losses == own.step_losses);
  CHECK(train(a, loaded_for_a).step_losses != own.step_losses);
  // The files as loaded are left as they were.
  CHECK((loaded_for_a.train.files->flip && !loaded_for_a.train.files->jpeg_draft));
}

TEST_CASE("folder: data.jpeg_draft decodes large JPEGs smaller, close to the whole decode",
          "[folder]") {
  TempTree t("draft");
  // A smooth 512 x 384 photograph-like image: gradients and a soft pattern.
  Image img{512, 384, 3, {}};
  for (int64_t y = 0; y < 384; ++y)
    for (int64_t x = 0; x < 512; ++x) {
      img.pixels.push_back(static_cast<uint8_t>(x / 2));
      img.pixels.push_back(static_cast<uint8_t>(y * 2 / 3));
      img.pixels.push_back(static_cast<uint8_t>(128 + 100 * std::sin(double(x + y) / 23)));
    }
  const std::vector<uint8_t> jpeg = encode_jpeg(img, 90);
  write_bytes(t.dir / "train" / "0" / "a.jpg", std::string(jpeg.begin(), jpeg.end()));
  ImageFiles f;
  f.root = t.dir.string();
  f.paths = {"train/0/a.jpg"};
  f.shape = {3, 24, 24};
  f.mean = {0, 0, 0};
  f.inv_std = {1, 1, 1};
  f.crop_scale = {0.5, 1.0};
  f.crop_ratio = {0.75, 4.0 / 3};
  f.flip = true;
  ImageFiles draft = f;
  draft.jpeg_draft = true;
  for (bool train : {true, false}) {
    f.train = draft.train = train;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<float> whole(3 * 24 * 24), small(whole.size());
      make_sample(f, 0, epoch, 7, whole.data());
      make_sample(draft, 0, epoch, 7, small.data());
      double diff = 0;
      for (size_t i = 0; i < whole.size(); ++i) diff += std::abs(whole[i] - small[i]);
      diff /= static_cast<double>(whole.size());
      INFO("train " << train << ", epoch " << epoch << ": mean |difference| " << diff);
      CHECK(diff > 0);        // decoded smaller (8x: crops of 256 and more pixels to 24)
      CHECK(diff < 2.0 / 255);  // within two grey levels on average
    }
  }
}

TEST_CASE("folder: data.jpeg_draft is refused for in-memory data", "[folder]") {
  CHECK_THAT(config_error("data: {jpeg_draft: true}\n"),
             Catch::Contains("data.jpeg_draft: only for dataset: folder"));
}

// export-images writes an in-memory data set as a tree and says how to train on it: the shape
// it names is the files' own (resampled to --side), and that command validates.
TEST_CASE("export-images names the shape of the files it wrote, and that command validates",
          "[folder][cli]") {
  TempTree t("export");
  const fs::path cfg = t.dir / "s.yaml";
  std::ofstream(cfg) << "name: s\nthreads: 1\ndata: {dataset: synthetic, synthetic: "
                        "{shape: [3, 6, 6], classes: 3, train_size: 12, test_size: 6}}\n"
                        "model: {type: cnn}\ntrain: {per_replica_batch: 4}\n";
  const fs::path out = t.dir / "tree";
  const auto r = dtrain_cli("export-images " + cfg.string() + " --out " + out.string() +
                            " --side 8");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("18 images (12 train, 6 test) as png files; train on them") &&
                        Catch::Contains("'data.shape=[3,8,8]'"));
  const auto v = dtrain_cli("validate " + cfg.string() + " data.dataset=folder data.path=" +
                            out.string() + " 'data.shape=[3,8,8]'");
  INFO(v.out);
  CHECK(v.code == 0);
  CHECK_THAT(v.out, Catch::Contains("shape=[3,8,8]"));
  // A config that crops with padding (folders crop by scale and ratio instead): the printed
  // command turns the padding off, so that it validates as printed.
  const fs::path padded = t.dir / "p.yaml";
  std::ofstream(padded) << "name: p\nthreads: 1\ndata: {dataset: synthetic, synthetic: "
                           "{shape: [3, 6, 6], classes: 3, train_size: 12, test_size: 6}, "
                           "augment: {crop_padding: 2}}\nmodel: {type: cnn}\n"
                           "train: {per_replica_batch: 4}\n";
  const auto p = dtrain_cli("export-images " + padded.string() + " --out " +
                            (t.dir / "ptree").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const size_t pat = p.out.find("dtrain run ") + std::string("dtrain run ").size();
  const auto pv = shell(dtrain_binary() + " validate " +
                        p.out.substr(pat, p.out.find('\n', pat) - pat));
  INFO(pv.out);
  CHECK(pv.code == 0);
  CHECK_THAT(p.out, Catch::Contains(" data.augment.crop_padding=0\n"));
  // A folder whose name a shell would read as code: the printed command quotes it, and run by a
  // shell as printed (validate for run) it names that folder and runs nothing else.
  // Its commas, " #" and quotes reach the override parser inside YAML quotes: no sweep list, no
  // comment.
  const fs::path odd = t.dir / "im g$(touch PWN);'x', #\"q\\";
  const auto e = dtrain_cli("export-images " + cfg.string() + " --out \"" + t.dir.string() +
                            "/im g\\$(touch PWN);'x', #\\\"q\\\\\"");
  INFO(e.out);
  REQUIRE(e.code == 0);
  REQUIRE(fs::is_directory(odd));
  const size_t at = e.out.find("dtrain run ");
  REQUIRE(at != std::string::npos);
  std::string line = e.out.substr(at + std::string("dtrain run ").size());
  line = line.substr(0, line.find('\n'));
  const auto again = shell("cd " + t.dir.string() + " && " + dtrain_binary() + " validate " + line);
  INFO(line << "\n" << again.out);
  CHECK(again.code == 0);
  CHECK_FALSE(fs::exists(t.dir / "PWN"));
  // Control characters (an escape, a newline) and a mark that reorders text never reach the
  // terminal raw: the folder as \xHH, the command in $'...', which a shell reads back.
  const std::string ctl = "c\x1b[2J\nd\xe2\x80\xae";
  const fs::path ctl_cfg = t.dir / ("s" + ctl + ".yaml");
  fs::copy_file(cfg, ctl_cfg);
  const fs::path ctl_out = t.dir / ("tree" + ctl);
  const auto c =
      dtrain_cli("export-images '" + ctl_cfg.string() + "' --out '" + ctl_out.string() + "'");
  INFO(c.out);
  REQUIRE(c.code == 0);
  std::stringstream lines(c.out);
  for (std::string l; std::getline(lines, l);) CHECK_FALSE(has_control_character(l));
  CHECK_THAT(c.out, Catch::Contains("dtrain run $'" + t.dir.string() +
                                    "/sc\\x1b[2J\\x0ad\\xe2\\x80\\xae.yaml'"));
  const size_t from = c.out.find("dtrain run ") + std::string("dtrain run ").size();
  put(t.dir / "again.sh",
      dtrain_binary() + " validate " + c.out.substr(from, c.out.find('\n', from) - from) + "\n");
  const auto back = shell("cd " + t.dir.string() + " && bash again.sh");
  INFO(back.out);
  CHECK(back.code == 0);
  CHECK_THAT(back.out, Catch::Contains("train=12 test=6 shape=[3,6,6]") &&
                           Catch::Contains("/treec\\x1b[2J\\x0ad\\xe2\\x80\\xae)"));
}

// export-images writes into a hidden folder beside --out and renames it once whole: a write
// that fails (a file-size limit here, as a full disk would) or Ctrl-C leaves neither --out nor
// the hidden folder, and says so.
TEST_CASE("export-images leaves no partial tree when a write fails or Ctrl-C stops it",
          "[folder][cli]") {
  TempTree t("export-fail");
  const fs::path cfg = t.dir / "s.yaml";
  std::ofstream(cfg) << "name: s\nthreads: 1\ndata: {dataset: synthetic, synthetic: "
                        "{shape: [3, 32, 32], classes: 3, train_size: 8000, test_size: 6}}\n"
                        "model: {type: cnn}\ntrain: {per_replica_batch: 4}\n";
  const fs::path out = t.dir / "tree";
  const auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(t.dir)) n += e.path().filename() != "s.yaml";
    return n;
  };
  // Noise PNGs of 32x32x3 are over 2 KiB each: the first write past the limit fails (EFBIG,
  // with SIGXFSZ ignored as a shell's trap leaves it).
  const auto big = shell("trap '' XFSZ; ulimit -f 2; " + dtrain_binary() + " export-images " +
                         cfg.string() + " --out " + out.string() + " data.synthetic.train_size=60");
  INFO(big.out);
  CHECK(big.code == 1);
  CHECK_THAT(big.out, Catch::Contains("cannot write") && Catch::Contains("too large"));
  CHECK(leftovers() == 0);
  // A JPEG quality for PNG files would be ignored: refused.
  const auto q =
      dtrain_cli("export-images " + cfg.string() + " --out " + out.string() + " --quality 50");
  CHECK(q.code == 2);
  CHECK_THAT(q.out, Catch::Contains("--quality: only for --format jpeg"));
  CHECK(leftovers() == 0);
  // Into the working folder, empty: the tree lands in it (not in a folder renamed over it).
  fs::create_directories(t.dir / "here");
  const auto here =
      shell("cd " + (t.dir / "here").string() + " && " + dtrain_binary() + " export-images " +
            cfg.string() + " --out . data.synthetic.train_size=30");
  INFO(here.out);
  CHECK(here.code == 0);
  CHECK(fs::is_directory(t.dir / "here" / "train"));
  CHECK(fs::is_directory(t.dir / "here" / "test"));
  fs::remove_all(t.dir / "here");
  CHECK(leftovers() == 0);
  // What an export killed outright left (its process gone: no pid reaches 999999999), in an
  // empty --out and beside one, is removed; the tree is written inside an --out that exists
  // (a mount point's parent may be another file system, or not writable).
  fs::create_directories(t.dir / "into" / ".export-999999999" / "train" / "0");
  fs::create_directories(t.dir / ".into.export-999999999" / "train");
  fs::create_directories(t.dir / ".into.export-1x");  // not a staging name: kept
  const auto into = dtrain_cli("export-images " + cfg.string() + " --out " +
                               (t.dir / "into").string() + " data.synthetic.train_size=30");
  INFO(into.out);
  CHECK(into.code == 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(t.dir / "into"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"test", "train"});
  CHECK_FALSE(fs::exists(t.dir / ".into.export-999999999"));
  CHECK(fs::exists(t.dir / ".into.export-1x"));
  fs::remove_all(t.dir / "into");
  fs::remove_all(t.dir / ".into.export-1x");
  CHECK(leftovers() == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = "exec " + dtrain_binary() + " export-images " + cfg.string() +
                            " --out " + out.string() + " > " + (t.dir / "log").string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Stopped once the hidden tree holds files.
  bool writing = false;
  for (int i = 0; i < 3000 && !writing; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const auto& e : fs::directory_iterator(t.dir))
      if (e.path().filename().string().rfind(".tree.export-", 0) == 0 &&
          fs::exists(e.path() / "train"))
        writing = true;
  }
  REQUIRE(writing);
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  const std::string log = slurp(t.dir / "log");
  INFO(log);
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 130));
  CHECK_THAT(log, Catch::Contains("export-images stopped; nothing written at"));
  fs::remove(t.dir / "log");
  CHECK(leftovers() == 0);
}

TEST_CASE("folder: Ctrl-C stops the check of every file at once, not when it ends",
          "[folder][cli]") {
  // 2,000 links to one 512 x 512 noise PNG: a check (data.on_bad_file: skip decodes every
  // file) of many seconds on one worker; before the fix it ran to its end after a Ctrl-C.
  TempTree t("check-stop");
  Image img{512, 512, 3, std::vector<uint8_t>(size_t{512} * 512 * 3)};
  uint32_t x = 12345;
  for (uint8_t& v : img.pixels) v = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  const std::vector<uint8_t> png = encode_png(img);
  fs::create_directories(t.dir / "img");
  write_bytes(t.dir / "img" / "a.png", std::string(png.begin(), png.end()));
  for (const char* split : {"train", "test"}) {
    for (int c = 0; c < 2; ++c) {
      const fs::path dir = t.dir / split / std::to_string(c);
      fs::create_directories(dir);
      for (int i = 0; i < (split == std::string("train") ? 1000 : 2); ++i)
        fs::create_symlink(t.dir / "img" / "a.png", dir / fmt::format("{:04}.png", i));
    }
  }
  const std::string cfg = (t.dir / "run.yaml").string();
  put(cfg, fmt::format("name: stop\ndata: {{dataset: folder, path: {}, shape: [3, 16, 16], "
                       "on_bad_file: skip, workers: 1}}\nmodel: {{type: mlp, hidden: [8]}}\n"
                       "train: {{epochs: 1, per_replica_batch: 8}}\n",
                       t.dir.string()));
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = "exec " + dtrain_binary() + " run " + cfg + " --results " +
                            (t.dir / "res").string() + " > " + (t.dir / "log").string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Signalled once it is loading the data (its handlers are set before it logs that).
  bool loading = false;
  for (int i = 0; i < 3000 && !loading; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    loading =
        fs::exists(t.dir / "log") && slurp(t.dir / "log").find("loading data") != std::string::npos;
  }
  REQUIRE(loading);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGINT);
  const auto sent = std::chrono::steady_clock::now();
  int st = 0;
  waitpid(pid, &st, 0);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  INFO(slurp(t.dir / "log"));
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 130));
  CHECK(took < 5.0);
}

// bench-input times the pipeline at each worker count, one row each; batch buffers that
// cannot fit are refused before any file is read.
TEST_CASE("bench-input gives a row per worker count and refuses buffers beyond memory",
          "[folder][cli]") {
  TempTree t("bench-input");
  write_tree(t.dir, 24, 8);
  TempDir d("bench-input-cli");
  const fs::path cfg = d.path / "b.yaml";
  std::ofstream(cfg) << "name: b\nthreads: 1\ndata: {dataset: folder, path: " << t.dir.string()
                     << ", shape: [3, 8, 8]}\nmodel: {hidden: [8]}\n"
                        "train: {epochs: 1, per_replica_batch: 4}\n";
  const auto r = dtrain_cli("bench-input " + cfg.string() + " --workers 1 --workers 2 " +
                            "--images 16 --repeats 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("|       1 |") && Catch::Contains("|       2 |"));
  const auto twice = dtrain_cli("bench-input " + cfg.string() + " --workers 1,2 --workers 1");
  CHECK(twice.code == 2);
  CHECK_THAT(twice.out, Catch::Contains("--workers: 1 is given twice"));
  // An override after --workers stays an override (CLI11 would take it as a second value).
  const auto after = dtrain_cli("bench-input " + cfg.string() + " --workers 1 data.workers=9 " +
                                "--images 16 --repeats 1 'data.shape=[3,6,6]'");
  INFO(after.out);
  CHECK(after.code == 0);
  CHECK_THAT(after.out, Catch::Contains("shape=[3,6,6]"));
  // 1000 images of 3 x 2^13 x 2^13 floats (near the 2^28 values a sample may have), 3 buffers:
  // about 2.2 TiB.
  const auto big = dtrain_cli("bench-input " + cfg.string() + " 'data.shape=[3,8192,8192]' " +
                              "train.per_replica_batch=1000 --workers 1 --images 4");
  INFO(big.out);
  CHECK(big.code == 2);
  CHECK_THAT(big.out, Catch::Contains("GiB of buffers; this machine has"));
  // validate counts the training pipeline's batches too: 65 of 24 images of 3 x 8192 x 8192
  // floats, about 1.2 TiB, where the model needs far less.
  const auto ahead =
      dtrain_cli("validate " + cfg.string() + " 'data.shape=[3,8192,8192]' " +
                 "data.normalize=false train.per_replica_batch=24 " + "data.prefetch=64");
  INFO(ahead.out);
  CHECK(ahead.code == 2);
  CHECK_THAT(ahead.out, Catch::Contains("GiB of decoded image batches at data.prefetch 64") &&
                            Catch::Contains("lower model.hidden (or the layers' units and "
                                            "channels), data.prefetch, "));
}
