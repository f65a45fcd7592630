#pragma once
#include <string>

#include "dtrain/config.hpp"

namespace dtrain::test {

// A small synthetic experiment that trains in well under a second.
inline Config synthetic_config(int gpus, int64_t per_replica_batch) {
  Config c;
  c.name = "test";
  c.gpus = gpus;
  c.threads = 1;
  c.data.dataset = DatasetKind::synthetic;
  c.data.synthetic.train_size = 128 * 60;
  c.data.synthetic.test_size = 512;
  c.data.synthetic.shape = {16};
  c.data.synthetic.classes = 4;
  c.data.synthetic.noise = 2.0;
  c.model.hidden = {32, 16};
  c.train.epochs = 1;
  c.train.per_replica_batch = per_replica_batch;
  c.train.target_accuracy = 0;
  c.optimizer.lr = 0.05;
  c.optimizer.base_batch = 128;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.lr_scaling = LrScaling::none;
  return c;
}

// Relative difference with a floor on the denominator.
inline double rel_diff(double a, double b) {
  const double d = std::abs(a - b);
  const double s = std::max({std::abs(a), std::abs(b), 1e-12});
  return d / s;
}

// Path of the built dtrain binary and the source tree (set by CMake).
inline std::string dtrain_binary() {
  return DTRAIN_BINARY;
}
inline std::string source_dir() {
  return DTRAIN_SOURCE_DIR;
}

}  // namespace dtrain::test
