#pragma once
// cuDNN convolution plans: a convolution's descriptors and the algorithms chosen for it.
//
// cuDNN 9 marks the descriptor-based ("legacy") convolution API deprecated in favour of the
// graph API (cudnn_frontend). dtrain uses the legacy API on purpose for now: it is still
// shipped and supported in cuDNN 9, it needs no header-only C++ frontend that Debian does not
// package, and the three calls it takes (forward, backward data, backward filter) map one to
// one onto the Device interface. Moving to the graph API is a contained change inside ConvPlan.
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dtrain/backend/device.hpp"  // ConvGeom

namespace dtrain {

// A plan owns its descriptors: one that fails half-way through (no algorithm, a bad shape)
// releases what it had created.
struct ConvPlan {
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan();
  // x, y, w in the compute type (fp32 or bf16); yf is y as fp32, for the bias.
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, yf = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  bool backward = false;  // whether bwd_data and bwd_filter are chosen (choose_backward)
  size_t workspace = 0;   // bytes, the most any of the chosen algorithms needs
};

// The plan of a convolution of n samples of geometry g in cuDNN's fp32 (FMA, no TF32), tf32 or
// bf16 configuration, with its forward algorithm; choose_backward adds the two backward ones.
// Both throw SystemError where cuDNN cannot plan it.
std::unique_ptr<ConvPlan> make_conv_plan(cudnnHandle_t dnn, const ConvGeom& g, int64_t n, bool tf32,
                                         bool bf16, int rank);
void choose_backward(cudnnHandle_t dnn, ConvPlan& p, const ConvGeom& g, int64_t n, int rank);

}  // namespace dtrain
