// dtrain's own CUDA kernels, one operation family per kernels/*.cuh (kernels and launchers
// together, as llm.c arranges them), compiled by nvcc in this one translation unit. Host code
// reaches them through the launchers declared in kernels.hpp.
#include "dtrain/backend/cuda/kernels.hpp"
#include "dtrain/backend/cuda/kernels/activation.cuh"
#include "dtrain/backend/cuda/kernels/attention.cuh"
#include "dtrain/backend/cuda/kernels/batchnorm.cuh"
#include "dtrain/backend/cuda/kernels/bf16_convert.cuh"
#include "dtrain/backend/cuda/kernels/bias.cuh"
#include "dtrain/backend/cuda/kernels/dropout.cuh"
#include "dtrain/backend/cuda/kernels/elementwise.cuh"
#include "dtrain/backend/cuda/kernels/embedding.cuh"
#include "dtrain/backend/cuda/kernels/gather_augment.cuh"
#include "dtrain/backend/cuda/kernels/layernorm.cuh"
#include "dtrain/backend/cuda/kernels/measure.cuh"
#include "dtrain/backend/cuda/kernels/norms.cuh"
#include "dtrain/backend/cuda/kernels/optimizer.cuh"
#include "dtrain/backend/cuda/kernels/pool.cuh"
#include "dtrain/backend/cuda/kernels/softmax_xent.cuh"
