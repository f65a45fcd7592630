#pragma once
// CIFAR-10 and CIFAR-100 in their binary versions (Krizhevsky 2009; the format as described at
// https://www.cs.toronto.edu/~kriz/cifar.html): files of whole records, each the label byte(s)
// (CIFAR-100: the coarse label, then the fine one) and 3072 pixel bytes, the red, green and
// blue planes of a 32x32 image, each in row order. dtrain reads the files the user brings.
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config/config.hpp"

namespace dtrain {

struct Dataset;

struct CifarFormat {
  const char* name;                      // "CIFAR-10"
  int label_bytes;                       // 1, or 2 (coarse, fine)
  int classes;                           // of the label used (CIFAR-100: the fine label)
  int coarse_classes;                    // the coarse label's range where there is one
  std::vector<std::string> train_files;  // in the order their records are used
  std::string test_file;
  int64_t record_bytes() const { return label_bytes + 3072; }
};
const CifarFormat& cifar_format(DatasetKind kind);  // cifar10 or cifar100

// The folder holding the format's files: `path`, or the folder the official archive unpacks
// to inside it (cifar-10-batches-bin, cifar-100-binary). UserError naming what is missing, and
// the other format where its files are there instead.
std::string cifar_folder(const std::string& path, const CifarFormat& f);

// Appends the first `limit` records of `bytes` (0: all), the contents of the file `what`, to
// `d`: pixels scaled to [0, 1], channel-planar (C x H x W), and the label. The whole content must
// be whole records with labels in range (UserError naming the file and the record number).
void parse_cifar_records(const std::string& bytes, const CifarFormat& f, const std::string& what,
                         int64_t limit, Dataset& d);

// The training files' records (at most `limit`, 0: all) and the test file's (`test_limit`).
void load_cifar(const std::string& path, const CifarFormat& f, int64_t limit, int64_t test_limit,
                Dataset& train, Dataset& test);
// Training records in the folder's files, from their sizes (nothing read).
int64_t cifar_train_size(const std::string& path, const CifarFormat& f);

}  // namespace dtrain
