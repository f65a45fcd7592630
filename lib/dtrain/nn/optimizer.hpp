#pragma once
// Optimizers over a model's flat parameter buffer. The learning rate is passed per step, so the
// schedule lives in one place (schedule.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "dtrain/config/config.hpp"
#include "dtrain/backend/device.hpp"

namespace dtrain {

// A run of a model's flat parameter buffer: [offset, offset + count).
struct ParamRange {
  int64_t offset = 0, count = 0;
  bool operator==(const ParamRange&) const = default;
};

class Optimizer {
 public:
  // `weights`: the ranges of the flat buffer that are weights (Model::weight_ranges), which
  // alone get weight decay when cfg.decay_bn_and_bias is false; unused otherwise.
  Optimizer(Device& d, const OptimizerConfig& cfg, size_t n,
            const std::vector<ParamRange>& weights = {});
  void step(float* params, const float* grads, double lr);
  // The update of step number `t` (1-based) on device `d` (whose memory holds the buffers),
  // leaving steps_taken() alone: step() is update(dev, ..., steps_taken() + 1). For replicas
  // that share this optimizer, whichever of them runs the update. With cfg.grad_clip > 0 the
  // update reads a clipped copy of `grads` (the gradients themselves stay as they are, for
  // the noise scale that reads them after the update).
  void update(Device& d, float* params, const float* grads, double lr, int64_t t);
  // update() in parts, for replicas that share this optimizer and each update a part of the
  // weights: once the gradients are whole, one rank calls prepare() (with cfg.grad_clip > 0,
  // the norm of the whole and the clipped copy), then every rank update_part() on its part
  // [lo, hi); together they give update()'s bits (elementwise updates).
  void prepare(Device& d, const float* grads);
  void update_part(Device& d, float* params, const float* grads, double lr, int64_t t, size_t lo,
                   size_t hi);
  bool prepares() const { return cfg_.grad_clip > 0; }  // whether prepare() does anything
  int64_t steps_taken() const { return t_; }
  // The state a checkpoint keeps: the step count and the moments (m: SGD's momentum or Adam's
  // first moment; v: Adam's second, empty for SGD), on the device.
  void set_steps_taken(int64_t t) { t_ = t; }
  Buffer<float>& first_moment() { return m_; }
  Buffer<float>& second_moment() { return v_; }
  size_t size() const { return n_; }

 private:
  Device& dev_;
  OptimizerConfig cfg_;
  size_t n_;
  int64_t t_ = 0;
  Buffer<float> m_, v_;
  Buffer<float> clipped_;   // grad_clip > 0: the gradients the update reads
  Buffer<double> sumsq_;    // their squared norm before clipping, on the device
  // The buffer in order, cut where the decay changes: one segment (all decayed) unless only
  // weights decay. Elementwise updates per segment give the bits of one update over all.
  struct Segment {
    size_t offset, count;
    bool decay;
  };
  std::vector<Segment> segments_;
};

}  // namespace dtrain
