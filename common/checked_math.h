// Integer arithmetic on values a user or another process gave: trial keys (batch sizes, devices,
// nodes, steps), a config.json's shapes, a file's header. Any of them may be as large as their type
// holds, so their products and sums need not fit; signed overflow is undefined behaviour, and a
// product that wraps to 0 turns a later `% product` into SIGFPE.
//
// The shared checks refuse what does not fit (Checked*: nullopt), naming the keys involved; the
// estimates, for which "absurdly large" is an answer, saturate (Saturating*) so an absurd shape
// stays absurd instead of wrapping to a small one.
#ifndef LLMCTL_COMMON_CHECKED_MATH_H_
#define LLMCTL_COMMON_CHECKED_MATH_H_

#include <initializer_list>
#include <limits>
#include <optional>
#include <type_traits>

namespace llmctl {

// a x b, or nullopt when the exact product does not fit in T.
template <typename T>
requires std::is_integral_v<T>
constexpr std::optional<T> CheckedMul(T a, T b) {
  T product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// a + b, or nullopt when the exact sum does not fit in T.
template <typename T>
requires std::is_integral_v<T>
constexpr std::optional<T> CheckedAdd(T a, T b) {
  T sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// The product of every factor, or nullopt when it, or a partial product on the way, does not fit.
template <typename T>
requires std::is_integral_v<T>
constexpr std::optional<T> CheckedProduct(std::initializer_list<T> factors) {
  T product = 1;
  for (T factor : factors) {
    const std::optional<T> next = CheckedMul(product, factor);
    if (!next) return std::nullopt;
    product = *next;
  }
  return product;
}

// a x b, or T's largest value when it does not fit. For non-negative operands (sizes, counts).
template <typename T>
requires std::is_integral_v<T>
constexpr T SaturatingMul(T a, T b) {
  return CheckedMul(a, b).value_or(std::numeric_limits<T>::max());
}

// a + b, or T's largest value when it does not fit. For non-negative operands (sizes, counts).
template <typename T>
requires std::is_integral_v<T>
constexpr T SaturatingAdd(T a, T b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<T>::max());
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CHECKED_MATH_H_
