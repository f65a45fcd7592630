// The CIFAR binary reader (cifar.hpp): every file's size is checked to be whole records before
// any record is used, labels are range-checked, and nothing is allocated beyond what the files
// hold.
#include "dtrain/data/cifar.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "dtrain/base/error.hpp"
#include "dtrain/base/files.hpp"
#include "dtrain/data/data.hpp"

namespace dtrain {

namespace fs = std::filesystem;

namespace {
constexpr int64_t kPixels = 3 * 32 * 32;
// CIFAR-10 has 60000 images and CIFAR-100 60000: a file past 100000 records is not one.
constexpr int64_t kMaxRecords = 100000;

const CifarFormat kCifar10{"CIFAR-10", 1, 10, 0,
                           {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                            "data_batch_4.bin", "data_batch_5.bin"},
                           "test_batch.bin"};
const CifarFormat kCifar100{"CIFAR-100", 2, 100, 20, {"train.bin"}, "test.bin"};

bool holds(const fs::path& dir, const CifarFormat& f) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(dir / f.train_files.front(), ec));
}

const char* archive_folder(const CifarFormat& f) {
  return &f == &kCifar10 ? "cifar-10-batches-bin" : "cifar-100-binary";
}

// The number of records of `path` from its size: a file that is not whole records is refused,
// naming the short record.
int64_t record_count(const std::string& path, const CifarFormat& f) {
  const std::string kind = not_regular_file(path);
  if (!kind.empty())
    throw UserError(fmt::format("{}: {}{}; {}'s binary version has {} and {}", path, kind,
                                kind == "missing" ? "" : ", where a batch file belongs", f.name,
                                fmt::join(f.train_files, ", "), f.test_file));
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) throw UserError(fmt::format("{}: cannot read it: {}", path, ec.message()));
  const int64_t rec = f.record_bytes();
  if (size == 0 || size % rec != 0 || size / rec > kMaxRecords)
    throw UserError(fmt::format(
        "{}: {} bytes is not a {} batch: it must be 1 to {} whole records of {} bytes ({}label "
        "and 3072 pixels){}",
        path, size, f.name, kMaxRecords, rec, f.label_bytes == 2 ? "coarse and fine " : "",
        size % rec ? fmt::format("; record {} is short ({} of {} bytes)", size / rec + 1,
                                 size % rec, rec)
                   : ""));
  return size / rec;
}
}  // namespace

const CifarFormat& cifar_format(DatasetKind kind) {
  if (kind == DatasetKind::cifar100) return kCifar100;
  return kCifar10;
}

std::string cifar_folder(const std::string& path, const CifarFormat& f) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw UserError(fmt::format("data.path: '{}' is not a folder (it must hold the {} files {})",
                                path, f.name, f.train_files.front()));
  for (const fs::path& dir : {fs::path(path), fs::path(path) / archive_folder(f)})
    if (holds(dir, f)) return dir.string();
  const CifarFormat& other = &f == &kCifar10 ? kCifar100 : kCifar10;
  for (const fs::path& dir : {fs::path(path), fs::path(path) / archive_folder(other)})
    if (holds(dir, other))
      throw UserError(fmt::format(
          "data.path: {} holds {} ({}), not {}; set data.dataset: {}", dir.string(), other.name,
          other.train_files.front(), f.name, &other == &kCifar10 ? "cifar10" : "cifar100"));
  throw UserError(fmt::format("data.path: {}: no {} (nor {}/{}); {}'s binary version has {} and "
                              "{}",
                              path, f.train_files.front(), archive_folder(f),
                              f.train_files.front(), f.name, fmt::join(f.train_files, ", "),
                              f.test_file));
}

void parse_cifar_records(const std::string& bytes, const CifarFormat& f, const std::string& what,
                         int64_t limit, Dataset& d) {
  const int64_t rec = f.record_bytes();
  const auto size = static_cast<int64_t>(bytes.size());
  if (size == 0 || size % rec != 0)
    throw UserError(fmt::format("{}: {} bytes is not whole {}-byte {} records", what, size, rec,
                                f.name));
  const int64_t n = limit > 0 ? std::min(limit, size / rec) : size / rec;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  d.x.reserve(d.x.size() + static_cast<size_t>(n * kPixels));
  for (int64_t r = 0; r < n; ++r, p += rec) {
    const int label = p[f.label_bytes - 1];
    if (f.label_bytes == 2 && p[0] >= f.coarse_classes)
      throw UserError(fmt::format("{}: record {}: coarse label {}, but {} has {} (0 to {})", what,
                                  r + 1, p[0], f.name, f.coarse_classes, f.coarse_classes - 1));
    if (label >= f.classes)
      throw UserError(fmt::format("{}: record {}: label {}, but {} has {} classes (0 to {})", what,
                                  r + 1, label, f.name, f.classes, f.classes - 1));
    d.y.push_back(label);
    for (int64_t i = 0; i < kPixels; ++i)
      d.x.push_back(static_cast<float>(p[f.label_bytes + i]) / 255.f);
  }
  d.shape = {3, 32, 32};
  d.classes = f.classes;
}

int64_t cifar_train_size(const std::string& path, const CifarFormat& f) {
  const std::string dir = cifar_folder(path, f);
  int64_t n = 0;
  for (const auto& name : f.train_files) n += record_count((fs::path(dir) / name).string(), f);
  return n;
}

void load_cifar(const std::string& path, const CifarFormat& f, int64_t limit, int64_t test_limit,
                Dataset& train, Dataset& test) {
  const std::string dir = cifar_folder(path, f);
  // Every file is checked (present, whole records) before any is read.
  std::vector<std::string> files;
  for (const auto& name : f.train_files) files.push_back((fs::path(dir) / name).string());
  files.push_back((fs::path(dir) / f.test_file).string());
  for (const auto& file : files) record_count(file, f);
  const int64_t max_bytes = f.record_bytes() * kMaxRecords;
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    const int64_t left = limit > 0 ? limit - train.size() : 0;
    if (limit > 0 && left <= 0) break;
    parse_cifar_records(read_text_file(files[i], fmt::format("{} batch", f.name),
                                       static_cast<size_t>(max_bytes)),
                        f, files[i], left, train);
  }
  parse_cifar_records(read_text_file(files.back(), fmt::format("{} batch", f.name),
                                     static_cast<size_t>(max_bytes)),
                      f, files.back(), test_limit, test);
}

}  // namespace dtrain
