// measure_gpu (gpu.hpp): the launch-latency and SGEMM floors of a GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>  // cudaMalloc of typed pointers

#include <algorithm>
#include <vector>

#include "dtrain/backend/cuda/kernels.hpp"
#include "dtrain/backend/gpu.hpp"
#include "dtrain/backend/gpu_check.hpp"

namespace dtrain {

namespace {

// Errors name rank 0: the floors are measured before any replica exists.
constexpr int kRank = 0;

float median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Launch latency: 1000 empty kernels back to back, timed by events, 20 times (after one that
// warms up); the median in microseconds per launch.
double launch_floor_us(cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
  std::vector<float> per;
  for (int rep = 0; rep < 21; ++rep) {
    DT_CUDA(cudaEventRecord(a, s), kRank);
    kernels::empty_kernels(1000, s);
    DT_CUDA(cudaEventRecord(b, s), kRank);
    DT_CUDA(cudaEventSynchronize(b), kRank);
    float ms = 0;
    DT_CUDA(cudaEventElapsedTime(&ms, a, b), kRank);
    if (rep > 0) per.push_back(ms);  // the first warms up
  }
  return median_of(per);  // ms per 1000 launches = us per launch
}

// TFLOP/s of cuBLAS's SGEMM on n x n operands x and y (median of 5 after a warm-up).
double sgemm_tflops(cublasHandle_t h, cudaStream_t s, cudaEvent_t a, cudaEvent_t b, int n,
                    const float* x, const float* y, float* z) {
  const float one = 1.f, zero = 0.f;
  std::vector<float> ms_list;
  for (int rep = 0; rep < 6; ++rep) {
    DT_CUDA(cudaEventRecord(a, s), kRank);
    DT_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, n, y, n, &zero, z, n),
              kRank);
    DT_CUDA(cudaEventRecord(b, s), kRank);
    DT_CUDA(cudaEventSynchronize(b), kRank);
    float ms = 0;
    DT_CUDA(cudaEventElapsedTime(&ms, a, b), kRank);
    if (rep > 0) ms_list.push_back(ms);
  }
  return 2.0 * n * double(n) * n / (median_of(ms_list) * 1e-3) / 1e12;
}

}  // namespace

GpuFloors measure_gpu(int index) {
  GpuFloors f;
  DT_CUDA(cudaSetDevice(index), kRank);
  cudaStream_t s = nullptr;
  DT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), kRank);
  cudaEvent_t a = nullptr, b = nullptr;
  DT_CUDA(cudaEventCreate(&a), kRank);
  DT_CUDA(cudaEventCreate(&b), kRank);
  f.launch_us = launch_floor_us(s, a, b);
  // SGEMM throughput on 8192^3, FP32 and TF32.
  const int n = 8192;
  float *x = nullptr, *y = nullptr, *z = nullptr;
  DT_CUDA(cudaMalloc(&x, sizeof(float) * n * n), kRank);
  DT_CUDA(cudaMalloc(&y, sizeof(float) * n * n), kRank);
  DT_CUDA(cudaMalloc(&z, sizeof(float) * n * n), kRank);
  const size_t nn = static_cast<size_t>(n) * n;
  kernels::fill_uniform(x, nn, 1, s);
  DT_CUDA(cudaGetLastError(), kRank);
  kernels::fill_uniform(y, nn, 2, s);
  DT_CUDA(cudaGetLastError(), kRank);
  cublasHandle_t h = nullptr;
  DT_CUBLAS(cublasCreate(&h), kRank);
  DT_CUBLAS(cublasSetStream(h, s), kRank);
  for (bool tf32 : {false, true}) {
    // FP32: cuBLAS's default math, what PyTorch uses with TF32 off (pedantic math may be
    // slower and buys nothing for a floor).
    DT_CUBLAS(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), kRank);
    (tf32 ? f.sgemm_tf32_tflops : f.sgemm_fp32_tflops) = sgemm_tflops(h, s, a, b, n, x, y, z);
  }
  cublasDestroy(h);
  cudaFree(x);
  cudaFree(y);
  cudaFree(z);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return f;
}

}  // namespace dtrain
