#pragma once
// How every enum of the config is spelled, and the enums that the compute backends share with
// it (the config spells them in YAML; the backends only switch on them).
//
// Each enum has one table, choices(E), right after its definition: the YAML spellings of its
// values, in the order error messages list them (a value may have a second, older spelling
// after the first; to_string gives the first). The parser, to_yaml, summary.json, error
// messages and to_string all read that table, so an enum costs its definition and its table.
#include <concepts>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtrain {

template <class E>
using EnumTable = std::vector<std::pair<const char*, E>>;

// The YAML spelling of v ("?" for a value its table lacks).
template <class E>
requires std::is_enum_v<E> && requires(E e) {
  { choices(e) } -> std::same_as<const EnumTable<E>&>;
}
const char* to_string(E v) {
  for (const auto& [name, value] : choices(v))
    if (value == v) return name;
  return "?";
}

enum class Activation { relu, tanh, sigmoid, gelu };
// fp32; tf32 (GPU tensor cores, 10-bit mantissa in GEMMs and convolutions); bf16 (GEMM and
// convolution inputs rounded to bfloat16, FP32 accumulation; emulated exactly on the CPU).
enum class Precision { fp32, tf32, bf16 };

inline const EnumTable<Activation>& choices(Activation) {
  static const EnumTable<Activation> names = {{"relu", Activation::relu},
                                              {"tanh", Activation::tanh},
                                              {"sigmoid", Activation::sigmoid},
                                              {"gelu", Activation::gelu}};
  return names;
}

inline const EnumTable<Precision>& choices(Precision) {
  static const EnumTable<Precision> names = {
      {"fp32", Precision::fp32}, {"tf32", Precision::tf32}, {"bf16", Precision::bf16}};
  return names;
}

}  // namespace dtrain
