#pragma once
// Activations forward and backward: the formulas of math.hpp, one thread per element.
#include "dtrain/backend/cuda/kernels/common.cuh"

namespace dtrain::kernels {
namespace {

__global__ void k_act_fwd(int a, const float* x, float* y, size_t n) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    switch (a) {
      case 0: y[i] = math::relu(v); break;
      case 1: y[i] = math::tanh(v); break;
      case 2: y[i] = math::sigmoid(v); break;
      default: y[i] = math::gelu(v); break;
    }
  }
}

__global__ void k_act_bwd(int a, const float* x, const float* y, const float* dy, float* dx,
                          size_t n) {
  GRID_STRIDE(i, n) {
    switch (a) {
      case 0: dx[i] = math::relu_backward(x[i], dy[i]); break;
      case 1: dx[i] = math::tanh_backward(y[i], dy[i]); break;
      case 2: dx[i] = math::sigmoid_backward(y[i], dy[i]); break;
      default: dx[i] = math::gelu_backward(x[i], dy[i]); break;
    }
  }
}

int act_code(Activation a) {
  switch (a) {
    case Activation::relu: return 0;
    case Activation::tanh: return 1;
    case Activation::sigmoid: return 2;
    case Activation::gelu: return 3;
  }
  return 0;
}

}  // namespace

void activation_forward(Activation a, const float* x, float* y, size_t n, cudaStream_t s) {
  k_act_fwd<<<blocks_for(n), kThreads, 0, s>>>(act_code(a), x, y, n);
}

void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                         size_t n, cudaStream_t s) {
  k_act_bwd<<<blocks_for(n), kThreads, 0, s>>>(act_code(a), x, y, dy, dx, n);
}

}  // namespace dtrain::kernels
