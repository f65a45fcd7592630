#pragma once
// bfloat16 rounding shared by the CPU and CUDA backends. `precision: bf16` rounds the inputs of
// every GEMM and convolution to bfloat16 (round to nearest, ties to even: what CUDA's
// __float2bfloat16_rn does) and accumulates in fp32, as PyTorch's autocast does; master
// weights, optimizer state, activations between layers and every reduction stay fp32.
// Convolution outputs (and their input and weight gradients) are rounded to bfloat16 once
// more, because cuDNN's bfloat16 convolutions write bfloat16 tensors.
#include <cstdint>
#include <cstring>

#include "dtrain/base/hash.hpp"  // DTRAIN_HD

namespace dtrain {

// The nearest bfloat16 value of x, as a float (ties to even; NaN stays NaN; values beyond the
// largest bfloat16 become infinities).
DTRAIN_HD inline float round_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u) {  // inf stays; NaN stays NaN (quiet bit kept)
    if (u & 0x007fffffu) u |= 0x00400000u;
    u &= 0xffff0000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
  float y = 0;
  std::memcpy(&y, &u, sizeof(y));
  return y;
}

}  // namespace dtrain
