#include <sys/resource.h>
#include <sys/stat.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "dtrain/backend/device.hpp"
#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/base/hash.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/data/data.hpp"
#include "helpers.hpp"

using namespace dtrain;
using dtrain::test::dtrain_cli;
using dtrain::test::error_of;
using dtrain::test::put;
using dtrain::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

std::vector<uint8_t> idx_images(uint32_t count, uint32_t rows, uint32_t cols,
                                uint32_t magic = 0x803) {
  std::vector<uint8_t> b = be32(magic);
  for (uint32_t v : {count, rows, cols}) {
    auto w = be32(v);
    b.insert(b.end(), w.begin(), w.end());
  }
  for (uint32_t i = 0; i < count * rows * cols; ++i) b.push_back(uint8_t(i * 7 % 256));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t count, uint32_t magic = 0x801) {
  std::vector<uint8_t> b = be32(magic);
  auto w = be32(count);
  b.insert(b.end(), w.begin(), w.end());
  for (uint32_t i = 0; i < count; ++i) b.push_back(uint8_t(i % 10));
  return b;
}

void write_raw(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const fs::path& p, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

void write_dataset(const fs::path& dir, uint32_t n_train, uint32_t n_test, bool gz) {
  auto w = gz ? write_gz : write_raw;
  const std::string ext = gz ? ".gz" : "";
  w(dir / ("train-images-idx3-ubyte" + ext), idx_images(n_train, 4, 3));
  w(dir / ("train-labels-idx1-ubyte" + ext), idx_labels(n_train));
  w(dir / ("t10k-images-idx3-ubyte" + ext), idx_images(n_test, 4, 3));
  w(dir / ("t10k-labels-idx1-ubyte" + ext), idx_labels(n_test));
}

// The IDX files in `dir`, as read, without normalisation.
DataConfig raw_idx(const fs::path& dir) {
  DataConfig cfg;
  cfg.dataset = DatasetKind::idx;
  cfg.normalize = Normalize::off;
  cfg.path = dir.string();
  return cfg;
}

}  // namespace

TEST_CASE("IDX files read the same raw and gzip-compressed", "[data]") {
  TempDir raw, gz;
  write_dataset(raw.path, 30, 10, false);
  write_dataset(gz.path, 30, 10, true);
  DataConfig cfg = raw_idx(raw.path);
  const auto a = load_data(cfg, 1);
  cfg.path = gz.path.string();
  const auto b = load_data(cfg, 1);
  CHECK(a.train.size() == 30);
  CHECK(a.test.size() == 10);
  CHECK(a.train.shape == std::vector<int64_t>{1, 4, 3});
  CHECK(a.train.classes == 10);
  CHECK(a.train.x == b.train.x);
  CHECK(a.train.y == b.train.y);
  // Pixel i of the file is (i*7 % 256) / 255.
  CHECK(a.train.x[5] == Approx(35.0 / 255.0));
  CHECK(a.train.y[13] == 3);
}

TEST_CASE("normalisation standardises with training statistics", "[data]") {
  TempDir d;
  write_dataset(d.path, 50, 10, false);
  DataConfig cfg;
  cfg.dataset = DatasetKind::idx;
  cfg.path = d.path.string();
  const auto s = load_data(cfg, 1);
  double sum = 0, sq = 0;
  for (float v : s.train.x) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = static_cast<double>(s.train.x.size());
  CHECK(sum / n == Approx(0.0).margin(1e-5));
  CHECK(sq / n == Approx(1.0).epsilon(1e-4));
}

TEST_CASE("a missing IDX file is named", "[data][errors]") {
  TempDir d;
  write_dataset(d.path, 20, 10, false);
  fs::remove(d.path / "t10k-labels-idx1-ubyte");
  DataConfig cfg;
  cfg.dataset = DatasetKind::idx;
  cfg.path = d.path.string();
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("missing t10k-labels-idx1-ubyte (or t10k-labels-idx1-ubyte.gz)"));
  cfg.path = (d.path / "nope").string();
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }), Catch::Contains("is not a folder"));
}

TEST_CASE("a truncated IDX file is reported with how much is missing", "[data][errors]") {
  TempDir d;
  auto bytes = idx_images(10, 4, 3);
  bytes.resize(bytes.size() - 5);
  write_raw(d.path / "imgs", bytes);
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "imgs").string()); }),
             Catch::Contains("truncated: expected 120 bytes of 10 images"));
  write_gz(d.path / "imgs.gz", bytes);
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "imgs.gz").string()); }),
             Catch::Contains("truncated"));
  write_raw(d.path / "short", {0, 0, 8});
  CHECK_THAT(error_of([&] { read_idx_labels((d.path / "short").string()); }),
             Catch::Contains("truncated"));
}

namespace {
// Peak resident memory of this process so far, in MiB.
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}
std::vector<uint8_t> header(std::initializer_list<uint32_t> words) {
  std::vector<uint8_t> b;
  for (uint32_t w : words) {
    const auto v = be32(w);
    b.insert(b.end(), v.begin(), v.end());
  }
  return b;
}
}  // namespace

TEST_CASE("an IDX header claiming more than the file holds costs no memory", "[data][errors]") {
  TempDir d;
  const double before = peak_rss_mib();
  // 60000 images of 96x96: a 553 MB claim in a 16-byte file, raw and compressed. Small enough
  // that the compressed file passes the memory check (2.2 GB of floats) on any machine these
  // tests run on, so that the read itself is what refuses it; large enough that reading it
  // would show in the RSS check below.
  const auto big = header({0x803, 60000, 96, 96});
  write_raw(d.path / "imgs", big);
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "imgs").string()); }),
             Catch::Contains("truncated: expected 552960000 bytes") &&
                 Catch::Contains("the file holds 0"));
  write_gz(d.path / "imgs.gz", big);
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "imgs.gz").string()); }),
             Catch::Contains("truncated") && Catch::Contains("ended after 0 bytes"));
  // The largest claim a header can make, and a label file claiming 4 billion labels.
  // Compressed, it could hold that much: refused as more than memory holds, before any read.
  write_gz(d.path / "max.gz", header({0x803, 0xffffffffu, 4096, 4096}));
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "max.gz").string()); }),
             Catch::Contains("4294967295 images of 4096x4096 need about") &&
                 Catch::Contains("GiB are available; read fewer with data.train_limit"));
  // With a limit, only the images asked for count.
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "max.gz").string(), 2); }),
             Catch::Contains("truncated"));
  write_gz(d.path / "labels.gz", header({0x801, 0xffffffffu}));
  CHECK_THAT(error_of([&] { read_idx_labels((d.path / "labels.gz").string()); }),
             Catch::Contains("truncated"));
  // The reader reserves at most one 64 MiB chunk before data arrives. (AddressSanitizer's
  // shadow memory and quarantine make RSS no measure of the reader's allocations.)
#ifdef DTRAIN_TEST_ASAN
  WARN("peak memory not checked under AddressSanitizer (" << peak_rss_mib() - before << " MiB)");
#else
  CHECK(peak_rss_mib() - before < 200);
#endif
}

TEST_CASE("train_limit and test_limit read only the samples they keep", "[data]") {
  TempDir d;
  write_dataset(d.path, 30, 10, true);
  DataConfig cfg = raw_idx(d.path);
  const auto all = load_data(cfg, 1);
  cfg.train_limit = 7;
  cfg.test_limit = 3;
  const auto some = load_data(cfg, 1);
  REQUIRE(some.train.size() == 7);
  REQUIRE(some.test.size() == 3);
  // The same first samples, and the classes of every label (so the model keeps its outputs).
  CHECK(std::equal(some.train.x.begin(), some.train.x.end(), all.train.x.begin()));
  CHECK(std::equal(some.train.y.begin(), some.train.y.end(), all.train.y.begin()));
  CHECK(std::equal(some.test.x.begin(), some.test.x.end(), all.test.x.begin()));
  CHECK(some.train.classes == all.train.classes);
  // A file cut short after the kept images still serves them.
  const auto imgs = idx_images(30, 4, 3);
  write_gz(d.path / "train-images-idx3-ubyte.gz",
           std::vector<uint8_t>(imgs.begin(), imgs.begin() + 16 + 7 * 12));
  const auto cut = load_data(cfg, 1);
  CHECK(std::equal(cut.train.x.begin(), cut.train.x.end(), all.train.x.begin()));
}

TEST_CASE("an empty training or test set is refused, naming the file", "[data][errors]") {
  TempDir d;
  write_dataset(d.path, 30, 0, false);
  const DataConfig cfg = raw_idx(d.path);
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("t10k-images-idx3-ubyte: holds no images (0 samples)"));
  write_dataset(d.path, 0, 10, false);
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("train-images-idx3-ubyte: holds no images (0 samples)"));
}

TEST_CASE("IDX image sizes whose product would overflow are refused", "[data][errors]") {
  TempDir d;
  write_raw(d.path / "imgs", header({0x803, 1, 0xffffffffu, 0xffffffffu}));
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "imgs").string()); }),
             Catch::Contains("implausible image size 4294967295x4294967295"));
  write_raw(d.path / "zero", header({0x803, 1, 0, 28}));
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "zero").string()); }),
             Catch::Contains("implausible image size 0x28"));
}

TEST_CASE("a data file that is not a regular file is refused at once", "[data][errors]") {
  TempDir d;
  const auto fifo = d.path / "fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a FIFO for reading would block forever without a writer.
  CHECK_THAT(error_of([&] { read_idx_images(fifo.string()); }),
             Catch::Contains("fifo: a FIFO (a data file must be a regular file)"));
  CHECK_THAT(error_of([&] { read_idx_labels(d.path.string()); }),
             Catch::Contains(": a folder (a data file must be a regular file)"));
  // A link to itself is named as such, not as a missing file.
  const auto loop = d.path / "loop";
  fs::create_symlink("loop", loop);
  CHECK_THAT(error_of([&] { read_idx_images(loop.string()); }),
             Catch::Contains("loop: a symbolic link that loops or leads nowhere"));
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "none").string()); }),
             Catch::Contains("none: file not found"));
}

TEST_CASE("a label past the named dataset's ten classes is refused", "[data][errors]") {
  TempDir d;
  write_dataset(d.path, 20, 10, false);
  auto labels = idx_labels(20);
  labels.back() = 10;
  write_raw(d.path / "train-labels-idx1-ubyte", labels);
  DataConfig cfg;
  cfg.path = d.path.string();
  cfg.dataset = DatasetKind::fashion_mnist;
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("labels go up to 10, but fashion-mnist has 10 classes"));
  // A generic IDX dataset takes its class count from its labels.
  cfg.dataset = DatasetKind::idx;
  CHECK(load_data(cfg, 1).train.classes == 11);
}

TEST_CASE("a wrong magic number is reported", "[data][errors]") {
  TempDir d;
  write_raw(d.path / "labels-as-images", idx_labels(10));
  CHECK_THAT(error_of([&] { read_idx_images((d.path / "labels-as-images").string()); }),
             Catch::Contains("not an IDX image file (magic 0x00000801, expected 0x00000803"));
  write_raw(d.path / "imgs", idx_images(2, 2, 2));
  CHECK_THAT(error_of([&] { read_idx_labels((d.path / "imgs").string()); }),
             Catch::Contains("not an IDX label file"));
}

TEST_CASE("image and label counts must match", "[data][errors]") {
  TempDir d;
  write_dataset(d.path, 20, 10, false);
  write_raw(d.path / "train-labels-idx1-ubyte", idx_labels(19));
  DataConfig cfg;
  cfg.dataset = DatasetKind::idx;
  cfg.path = d.path.string();
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::Contains("has 20 images but") && Catch::Contains("has 19 labels"));
}

TEST_CASE("synthetic data is reproducible - sized as asked and learnable in shape", "[data]") {
  SyntheticConfig s;
  s.shape = {2, 3};
  s.classes = 5;
  const auto a = make_synthetic(s, 100, 7, 1);
  const auto b = make_synthetic(s, 100, 7, 1);
  const auto c = make_synthetic(s, 100, 8, 1);
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  CHECK(a.x != c.x);
  CHECK(a.features() == 6);
  CHECK(a.x.size() == 600);
  std::set<int32_t> labels(a.y.begin(), a.y.end());
  CHECK(labels.size() == 5);
}

namespace {
// `bytes` as one gzip member (gzwrite's own framing).
std::vector<uint8_t> gz_member(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> out(compressBound(static_cast<uLong>(bytes.size())) + 64);
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  z.next_in = const_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
std::vector<uint8_t> operator+(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST_CASE("gzip IDX files: concatenated members read on, trailing garbage is refused",
          "[data][errors]") {
  TempDir d;
  const auto imgs = idx_images(10, 4, 3), labels = idx_labels(10);
  const auto img_path = (d.path / "imgs.gz").string(), lab_path = (d.path / "labels.gz").string();
  const auto raw = read_idx_images([&] {
    write_raw(d.path / "imgs", imgs);
    return (d.path / "imgs").string();
  }());
  // Legal gzip: the payload split over two members, and an empty member after it.
  const std::vector<uint8_t> head(imgs.begin(), imgs.begin() + 50);
  const std::vector<uint8_t> rest(imgs.begin() + 50, imgs.end());
  write_raw(img_path, gz_member(head) + gz_member(rest) + gz_member({}));
  CHECK(read_idx_images(img_path).pixels == raw.pixels);
  // Bytes after the gzip stream that are not a gzip member: refused, naming the file.
  for (const std::vector<uint8_t>& junk :
       {std::vector<uint8_t>{'g', 'a', 'r', 'b', 'a', 'g', 'e'}, std::vector<uint8_t>(512, 0),
        std::vector<uint8_t>{0x1f}}) {
    write_raw(img_path, gz_member(imgs) + junk);
    CHECK_THAT(error_of([&] { read_idx_images(img_path); }),
               Catch::StartsWith(img_path + ": " + std::to_string(junk.size()) +
                                 " bytes of trailing garbage after the gzip stream ends"));
    write_raw(lab_path, gz_member(labels) + junk);
    CHECK_THAT(error_of([&] { read_idx_labels(lab_path); }),
               Catch::StartsWith(lab_path + ": ") && Catch::Contains("trailing garbage"));
  }
  // A payload longer than its header says: refused, compressed (in the same member or in one
  // after it) and raw.
  write_raw(img_path, gz_member(imgs + std::vector<uint8_t>{7}));
  CHECK_THAT(error_of([&] { read_idx_images(img_path); }),
             Catch::StartsWith(img_path + ": more data than its header claims"));
  write_raw(img_path, gz_member(imgs) + gz_member({1, 2, 3}));
  CHECK_THAT(error_of([&] { read_idx_images(img_path); }),
             Catch::Contains("more data than its header claims"));
  write_raw(d.path / "labels", labels + std::vector<uint8_t>{3});
  CHECK_THAT(error_of([&] { read_idx_labels((d.path / "labels").string()); }),
             Catch::Contains("labels: more data than its header claims: bytes follow the 10 "
                             "labels"));
  // Whole content, but the member's trailer (CRC and size) cut off: truncated, not accepted.
  for (size_t drop : {size_t{8}, size_t{3}}) {
    auto no_trailer = gz_member(labels);
    no_trailer.resize(no_trailer.size() - drop);
    write_raw(lab_path, no_trailer);
    CHECK_THAT(error_of([&] { read_idx_labels(lab_path); }),
               Catch::Contains("ends without its trailer"));
  }
  // A gzip stream cut inside a member says so.
  auto cut = gz_member(imgs);
  cut.resize(cut.size() - 12);
  write_raw(img_path, cut);
  CHECK_THAT(error_of([&] { read_idx_images(img_path); }),
             Catch::Contains("truncated") && Catch::Contains("the gzip stream is cut short"));
  // Damaged compressed data.
  auto flipped = gz_member(imgs);
  flipped[flipped.size() / 2] ^= 0xff;
  write_raw(img_path, flipped);
  CHECK_THAT(error_of([&] { read_idx_images(img_path); }), Catch::StartsWith(img_path + ": "));
  // With a limit only the images asked for are read: the rest of the file is not looked at.
  write_raw(img_path, gz_member(imgs) + std::vector<uint8_t>{'x'});
  CHECK(read_idx_images(img_path, 4).count == 10);
}

TEST_CASE("synthetic data larger than memory is refused before anything is allocated",
          "[data][errors]") {
  DataConfig cfg;
  cfg.dataset = DatasetKind::synthetic;
  cfg.synthetic.train_size = 1000000000000;  // 10^12 samples of 32 features: 143 TiB
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::StartsWith("data.synthetic: 1000000000000 training and 1024 test samples of "
                               "32 features need about ") &&
                 Catch::Contains("GiB are available; lower data.synthetic.train_size"));
  // A shape whose product would overflow 64 bits.
  cfg.synthetic.train_size = 10;
  cfg.synthetic.shape = {int64_t{1} << 32, int64_t{1} << 32};
  CHECK_THAT(error_of([&] { load_data(cfg, 1); }),
             Catch::StartsWith("data.synthetic.shape: [4294967296, 4294967296] is not a sample "
                               "shape of at most 2^40 features"));
  CHECK_THAT(error_of([&] { make_synthetic(cfg.synthetic, 1, 1, 1); }),
             Catch::Contains("at most 2^40 features"));
  // A limit keeps memory to the samples kept, and they are the first samples of the full set.
  cfg.synthetic.shape = {8};
  cfg.synthetic.train_size = 1000000000000;
  cfg.train_limit = 100;
  cfg.normalize = Normalize::off;
  const DataSplit some = load_data(cfg, 1);
  CHECK(some.train.size() == 100);
  const Dataset all = make_synthetic(cfg.synthetic, 300, 1, 1);
  CHECK(std::equal(some.train.x.begin(), some.train.x.end(), all.x.begin()));
  CHECK(std::equal(some.train.y.begin(), some.train.y.end(), all.y.begin()));
}

TEST_CASE("a container's memory limit counts as the memory there is", "[data][memory]") {
  TempDir d("cgroup");
  const auto root = d.path.string();
  const auto files = [&](const fs::path& dir,
                         const std::vector<std::pair<std::string, std::string>>& f) {
    fs::create_directories(dir);
    for (const auto& [name, text] : f) put(dir / name, text);
  };
  // cgroup v2: a 4 GiB limit on the job's slice, 1 GiB used of which 256 MiB is inactive page
  // cache; the process's own cgroup has no limit ("max"), its parent the tightest.
  const double gib = 1 << 30;
  files(d.path / "job.slice", {{"memory.max", "4294967296\n"},
                               {"memory.current", "1073741824\n"},
                               {"memory.stat", "anon 805306368\ninactive_file 268435456\n"}});
  files(d.path / "job.slice" / "step", {{"memory.max", "max\n"},
                                        {"memory.current", "1073741824\n"},
                                        {"memory.stat", "inactive_file 0\n"}});
  CHECK(cgroup_memory_room("0::/job.slice/step\n", root) == Approx(3.25 * gib));
  // No limit at any level, or no memory controller named: no room given.
  put(d.path / "job.slice" / "memory.max", "max\n");
  CHECK(cgroup_memory_room("0::/job.slice/step\n", root) < 0);
  CHECK(cgroup_memory_room("3:cpu:/x\n", root) < 0);
  // cgroup v1: the memory controller's own mount; a container sees its cgroup as the mount's
  // root, so the path named is not below it. A limit near 2^63 is no limit.
  files(d.path / "memory", {{"memory.limit_in_bytes", "2147483648\n"},
                            {"memory.usage_in_bytes", "1610612736\n"},
                            {"memory.stat", "cache 9\ntotal_inactive_file 536870912\n"}});
  CHECK(cgroup_memory_room("9:pids:/\n4:memory:/docker/abc\n", root) == Approx(1.0 * gib));
  put(d.path / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(cgroup_memory_room("4:cpuacct,memory:/docker/abc\n", root) < 0);
  // Usage past the limit leaves no room, never a negative one.
  put(d.path / "memory" / "memory.limit_in_bytes", "536870912\n");
  CHECK(cgroup_memory_room("4:memory:/\n", root) == 0);
  // This machine's own reading is a number the checks can use.
  CHECK(available_host_memory() > 0);
}

TEST_CASE("folders nested past 64 levels are refused by every walk, naming the folder",
          "[data][cli]") {
  TempDir d("deep");
  fs::path deep = d.path / "tree";
  for (int i = 0; i < 70; ++i) deep /= "d";
  fs::create_directories(deep);
  put(d.path / "tree" / "a.txt", "some text to train on, some text to train on\n");
  // A results root to report, a text corpus, an image folder's class.
  const auto r = dtrain_cli("report " + (d.path / "tree").string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("folders nest more than 64 levels below"));
  put(d.path / "g.yaml",
      "name: g\nthreads: 1\ndata: {dataset: bytes, path: " + (d.path / "tree").string() +
          ", block_size: 8}\nmodel: {type: gpt, n_layer: 1, n_head: 1, "
          "n_embd: 8}\ntrain: {epochs: 1, per_replica_batch: 2}\n");
  const auto g = dtrain_cli("validate " + (d.path / "g.yaml").string());
  INFO(g.out);
  CHECK(g.code == 2);
  CHECK_THAT(g.out, Catch::Contains("folders nest more than 64 levels below"));
  for (const char* split : {"train", "test"}) fs::create_directories(d.path / "img" / split / "c");
  fs::rename(d.path / "tree", d.path / "img" / "train" / "c" / "tree");
  put(d.path / "i.yaml",
      "name: i\nthreads: 1\ndata: {dataset: folder, path: " + (d.path / "img").string() +
          ", shape: [3, 8, 8]}\nmodel: {hidden: "
          "[8]}\ntrain: {epochs: 1, per_replica_batch: 2}\n");
  const auto f = dtrain_cli("validate " + (d.path / "i.yaml").string());
  INFO(f.out);
  CHECK(f.code == 2);
  CHECK_THAT(f.out, Catch::Contains("folders nest more than 64 levels below"));
}

TEST_CASE("dtrain validate and run refuse oversized synthetic data in one line", "[data][cli]") {
  TempDir d("synthetic-huge");
  const std::string cfg = (d.path / "s.yaml").string();
  put(cfg,
      "name: s\nthreads: 1\ndata: {dataset: synthetic, synthetic: {train_size: 1000000000000, "
      "test_size: 64, shape: [8], classes: 3}}\nmodel: {hidden: [8]}\n"
      "train: {epochs: 1, per_replica_batch: 16}\n");
  const std::string res = (d.path / "res").string();
  for (const std::string& args : {"validate " + cfg, "run " + cfg + " --results " + res}) {
    const auto r = dtrain_cli(args);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("internal error") == std::string::npos);
    CHECK(r.out.find("dtrain: error: " + cfg +
                     ": data.synthetic: 1000000000000 training and 64 "
                     "test samples") != std::string::npos);
  }
  const auto r = dtrain_cli("validate " + cfg);
  CHECK(test::count_lines(r.out) == 1);
}

TEST_CASE("labels are described compactly, and sparse ones are warned about", "[data]") {
  DataSplit d;
  for (int c = 0; c < 10; ++c) d.train.y.insert(d.train.y.end(), 6000, c);
  d.train.classes = d.test.classes = 10;
  d.test.y = {0, 5, 9};
  CHECK(describe_labels(d.train) == "0-9 (6000 each)");
  CHECK(label_warning(d).empty());
  d.train.y.push_back(200);
  d.train.y.push_back(3);
  d.train.classes = d.test.classes = 201;
  CHECK(describe_labels(d.train) == "0-9 (6000 to 6001 each) and 200 (1)");
  d.test.y = {0, 12, 12, 13, 250};
  const std::string w = label_warning(d);
  CHECK(w == "the training labels are 0-9 (6000 to 6001 each) and 200 (1); of the model's 201 "
             "outputs (labels 0 to 200), 190 belong to no training sample and are never trained; "
             "the test set has labels the training set lacks, 12-13 (1 to 2 each) and 250 (1), "
             "which the model can never predict; fix: labels numbered 0 to K-1 without gaps, "
             "every one in the training set");
  // A rare label beside common ones is named apart.
  d.train.y.push_back(10);
  CHECK(describe_labels(d.train) == "0-9 (6000 to 6001 each), 10 (1) and 200 (1)");
  d.train.y.pop_back();
  // Labels in many runs (every other one of 0 to 99): the first 8, a count, the last.
  Dataset gappy;
  for (int32_t c = 0; c < 100; c += 2) gappy.y.push_back(c);
  CHECK(describe_labels(gappy) ==
        "0 (1), 2 (1), 4 (1), 6 (1), 8 (1), 10 (1), 12 (1), 14 (1), 41 more runs and 98 (1)");
  // A label only the test set has, with no gap in the training labels.
  d.train.classes = d.test.classes = 10;
  d.train.y.pop_back(), d.train.y.pop_back();
  d.test.y = {0, 9, 10};
  CHECK(label_warning(d).find("the test set has labels the training set lacks, 10 (1)") !=
        std::string::npos);
}

TEST_CASE("validate and doctor warn about sparse IDX labels, naming them", "[data][cli]") {
  TempDir d("sparse-labels");
  write_dataset(d.path, 30, 10, true);
  auto labels = idx_labels(30);
  labels.back() = 200;  // one byte of 200 among 0-9
  write_gz(d.path / "train-labels-idx1-ubyte.gz", labels);
  const std::string cfg = (d.path / "s.yaml").string();
  put(cfg, "name: s\nthreads: 1\ndata: {dataset: idx, path: " + d.path.string() +
               "}\nmodel: {hidden: [8]}\ntrain: {epochs: 1, per_replica_batch: 10}\n");
  const auto v = dtrain_cli("validate " + cfg);
  INFO(v.out);
  CHECK(v.code == 0);
  CHECK(v.out.find("[sparse-labels] the training labels are 0-9 (2 to 3 each) and 200 (1); of "
                   "the model's 201 outputs") != std::string::npos);
  const auto doc = dtrain_cli("doctor " + cfg);
  INFO(doc.out);
  CHECK(doc.code == 0);
  CHECK(doc.out.find("doctor: [sparse-labels] the training labels are 0-9") != std::string::npos);
}

TEST_CASE("sort_by_label orders samples by class and keeps pairs together", "[data]") {
  SyntheticConfig s;
  s.shape = {3};
  auto d = make_synthetic(s, 200, 3, 1);
  const auto orig = d;
  sort_by_label(d);
  CHECK(std::is_sorted(d.y.begin(), d.y.end()));
  // Every (features, label) pair of the original is still present.
  std::multiset<std::pair<float, int32_t>> before, after;
  for (int64_t i = 0; i < orig.size(); ++i) {
    before.insert({orig.x[static_cast<size_t>(i * 3)], orig.y[static_cast<size_t>(i)]});
    after.insert({d.x[static_cast<size_t>(i * 3)], d.y[static_cast<size_t>(i)]});
  }
  CHECK(before == after);
}

TEST_CASE("the packaged Fashion-MNIST loads when installed", "[data][fmnist]") {
  DataConfig cfg;
  cfg.path = test::fmnist_dir();
  if (!fs::exists(cfg.path + "/train-images-idx3-ubyte.gz")) {
    WARN("SKIPPED: dataset-fashion-mnist is not installed (no " << cfg.path << ")");
    return;
  }
  const auto s = load_data(cfg, 1);
  // Every image the file's header counts: the packaged set's 60000, or the first of them that
  // a copy carried to a GPU machine keeps (scripts/build-portable.sh fits it into what may
  // travel there).
  unsigned char h[8] = {};
  gzFile f = gzopen((cfg.path + "/train-images-idx3-ubyte.gz").c_str(), "rb");
  REQUIRE(f != nullptr);
  REQUIRE(gzread(f, h, sizeof h) == static_cast<int>(sizeof h));
  gzclose(f);
  const int64_t count = (int64_t{h[4]} << 24) | (h[5] << 16) | (h[6] << 8) | h[7];
  CHECK(s.train.size() == count);
  if (std::getenv("DTRAIN_TEST_DATA"))
    CHECK((count >= 30000 && count <= 60000));
  else
    CHECK(count == 60000);
  CHECK(s.test.size() == 10000);
  CHECK(s.train.shape == std::vector<int64_t>{1, 28, 28});
  CHECK(s.train.classes == 10);
}

TEST_CASE("augmentation crops within the padding and flips horizontally", "[data][augment]") {
  const int64_t f = 40, rows = 50;
  std::vector<float> orig(static_cast<size_t>(rows * f));
  for (size_t i = 0; i < orig.size(); ++i) orig[i] = 1.f + static_cast<float>(i % f);
  auto dev = make_cpu_device({2, CpuOptions::default_cpu_conv()});
  std::vector<float> x(orig.size());
  dev->augment(orig.data(), x.data(), rows, 2, 4, 5, 0, false, false, 3);
  CHECK(x == orig);  // nothing asked, nothing changed

  // Every augmented sample must be one of the (2p+1)^2 shifts, flipped or not, of its input.
  dev->augment(orig.data(), x.data(), rows, 2, 4, 5, 1, false, true, 3);
  int flipped = 0, shifted = 0;
  for (int64_t n = 0; n < rows; ++n) {
    bool matched = false;
    for (int fl = 0; fl < 2 && !matched; ++fl)
      for (int64_t di = -1; di <= 1 && !matched; ++di)
        for (int64_t dj = -1; dj <= 1 && !matched; ++dj) {
          bool same = true;
          for (int64_t c = 0; c < 2 && same; ++c)
            for (int64_t i = 0; i < 4 && same; ++i)
              for (int64_t j = 0; j < 5 && same; ++j) {
                const int64_t si = i + di, sj = (fl ? 4 - j : j) + dj;
                const float want = (si >= 0 && si < 4 && sj >= 0 && sj < 5)
                                       ? orig[static_cast<size_t>(n * f + (c * 4 + si) * 5 + sj)]
                                       : 0.f;
                same = x[static_cast<size_t>(n * f + (c * 4 + i) * 5 + j)] == want;
              }
          if (same) {
            matched = true;
            flipped += fl;
            shifted += (di != 0 || dj != 0);
          }
        }
    CHECK(matched);
  }
  CHECK(flipped > 10);  // about half
  CHECK(flipped < 40);
  CHECK(shifted > 20);  // about 8 in 9
  // The same seed gives the same batch; another seed another one.
  std::vector<float> again(orig.size()), other(orig.size());
  dev->augment(orig.data(), again.data(), rows, 2, 4, 5, 1, false, true, 3);
  dev->augment(orig.data(), other.data(), rows, 2, 4, 5, 1, false, true, 4);
  CHECK(again == x);
  CHECK(other != x);
}

TEST_CASE("reflect padding mirrors the image at its edges without repeating them",
          "[data][augment]") {
  // numpy.pad(mode="reflect") of [a b c d] by 3: d c b | a b c d | c b a.
  for (const auto& [s, want] : std::vector<std::pair<int64_t, int64_t>>{
           {-3, 3}, {-2, 2}, {-1, 1}, {0, 0}, {3, 3}, {4, 2}, {5, 1}, {6, 0}})
    CHECK(reflect_index(s, 4) == want);
  const int64_t f = 40, rows = 200, pad = 3;  // 2 x 4 x 5, pad below both sides
  std::vector<float> orig(static_cast<size_t>(rows * f));
  for (size_t i = 0; i < orig.size(); ++i) orig[i] = 1.f + static_cast<float>(i % f);
  auto dev = make_cpu_device({2, CpuOptions::default_cpu_conv()});
  std::vector<float> x(orig.size()), zero(orig.size());
  dev->augment(orig.data(), x.data(), rows, 2, 4, 5, pad, true, true, 3);
  dev->augment(orig.data(), zero.data(), rows, 2, 4, 5, pad, false, true, 3);
  int padded = 0;
  for (int64_t n = 0; n < rows; ++n) {
    const AugmentDraw a = augment_draw(3, n, pad, true);  // the same draw as zero padding's
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          const int64_t si = i + a.di, sj = (a.flip ? 4 - j : j) + a.dj;
          const auto at = static_cast<size_t>(n * f + (c * 4 + i) * 5 + j);
          const int64_t ri = si < 0 ? -si : si > 3 ? 6 - si : si;
          const int64_t rj = sj < 0 ? -sj : sj > 4 ? 8 - sj : sj;
          CHECK(x[at] == orig[static_cast<size_t>(n * f + (c * 4 + ri) * 5 + rj)]);
          const bool outside = si < 0 || si > 3 || sj < 0 || sj > 4;
          CHECK(zero[at] == (outside ? 0.f : x[at]));  // inside, both read the same pixel
          padded += outside;
        }
  }
  CHECK(padded > 1000);  // most samples read the padding somewhere
}

TEST_CASE("per-channel normalisation uses each channel's statistics or the given ones",
          "[data][normalize]") {
  // Two samples of 2 x 1 x 2: channel 0 holds 0.1..0.4, channel 1 holds 0.8 (a constant).
  DataSplit s;
  s.train.shape = s.test.shape = {2, 1, 2};
  s.train.x = {0.1f, 0.2f, 0.8f, 0.8f, 0.3f, 0.4f, 0.8f, 0.8f};
  s.train.y = {0, 1};
  s.test.x = {0.25f, 0.25f, 0.9f, 0.7f};
  s.test.y = {0};
  DataConfig cfg;
  cfg.normalize = Normalize::channel;
  DataSplit c = s;
  normalize(cfg, c);
  const double sd0 = std::sqrt(0.0125);  // of 0.1, 0.2, 0.3, 0.4
  CHECK(c.train.x[0] == Approx((0.1 - 0.25) / sd0).epsilon(1e-5));
  CHECK(c.train.x[5] == Approx((0.4 - 0.25) / sd0).epsilon(1e-5));
  CHECK(c.train.x[2] == Approx(0).margin(1e-6));  // a constant channel: centred, not blown up
  CHECK(c.test.x[0] == Approx(0).margin(1e-6));
  // One statistic over all features instead (the old behaviour, `true`): channel 0 is not
  // centred on its own.
  cfg.normalize = Normalize::global;
  DataSplit g = s;
  normalize(cfg, g);
  CHECK(std::abs(g.train.x[0] + g.train.x[1] + g.train.x[4] + g.train.x[5]) > 1);
  // Given statistics, one per channel, as the recipes quote them.
  cfg.normalize = Normalize::channel;
  cfg.mean = {0.5, 0.4};
  cfg.stddev = {0.25, 0.2};
  DataSplit given = s;
  normalize(cfg, given);
  CHECK(given.train.x[0] == static_cast<float>((double(0.1f) - 0.5) / 0.25));
  CHECK(given.test.x[2] == static_cast<float>((double(0.9f) - 0.4) / 0.2));
  // A count that does not match the data's channels (a file of other images) is refused.
  cfg.mean = {0.5, 0.4, 0.3};
  CHECK(error_of([&] { normalize(cfg, given); }) ==
        "data.mean: needs 2 entries (one per channel), got 3");
  cfg.mean.clear();
  cfg.stddev.clear();
  DataSplit flat = s;
  flat.train.shape = flat.test.shape = {4};
  CHECK_THAT(error_of([&] { normalize(cfg, flat); }),
             Catch::StartsWith("data.normalize: channel needs image data"));
}
