#pragma once
// What the checkpoint tests share (tests/test_checkpoint.cpp, and the GPU's in test_cuda.cpp):
// an observer that keeps every checkpoint and a bit-for-bit comparison of two results.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/trainer.hpp"

namespace dtrain::test {

// Keeps every checkpoint, each through the file format (encoded, then decoded).
struct Keep : TrainObserver {
  std::vector<Checkpoint> all;
  void on_checkpoint(const Checkpoint& c) override {
    all.push_back(decode_checkpoint(encode_checkpoint(c), "test"));
  }
};

// The numbers of a result that do not depend on timing, bit for bit.
inline void require_same_numeric_columns(const TrainResult& a, const TrainResult& b) {
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (size_t e = 0; e < a.epochs.size(); ++e) {
    INFO("epoch " << e + 1);
    const auto &x = a.epochs[e], &y = b.epochs[e];
    CHECK(std::memcmp(&x.train_loss, &y.train_loss, sizeof(double)) == 0);
    CHECK(x.train_acc == y.train_acc);
    CHECK(std::memcmp(&x.test_loss, &y.test_loss, sizeof(double)) == 0);
    CHECK(x.test_acc == y.test_acc);
    CHECK(x.lr == y.lr);
    CHECK(x.lr_end == y.lr_end);
    CHECK(x.samples == y.samples);
    CHECK(std::memcmp(&x.noise_b_simple, &y.noise_b_simple, sizeof(double)) == 0);
  }
  REQUIRE(a.step_losses.size() == b.step_losses.size());
  CHECK(std::memcmp(a.step_losses.data(), b.step_losses.data(),
                    a.step_losses.size() * sizeof(double)) == 0);
}

}  // namespace dtrain::test
