#pragma once
// The enums that the compute backends share with the config (the config spells them in YAML;
// the backends only switch on them).
namespace dtrain {

enum class Activation { relu, tanh, sigmoid, gelu };
// fp32; tf32 (GPU tensor cores, 10-bit mantissa in GEMMs and convolutions); bf16 (GEMM and
// convolution inputs rounded to bfloat16, FP32 accumulation; emulated exactly on the CPU).
enum class Precision { fp32, tf32, bf16 };

const char* to_string(Activation v);
const char* to_string(Precision v);

}  // namespace dtrain
