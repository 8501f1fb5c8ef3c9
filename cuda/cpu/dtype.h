// float <-> bfloat16 / float16 conversions for the CPU kernels (round to nearest even), written
// out so that the kernels do not depend on compiler support for _Float16 or __bf16.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/params.h"

namespace jax_dash::cpu {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN, keep sign
  const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return bits_to_float(sign | 0x7F800000 | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_f16(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7E00;
  if (magnitude >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {
    // Subnormal half: round magnitude / 2^-24 to the nearest integer, ties to even.
    const float scaled = std::ldexp(magnitude, 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t abs_bits = bits & 0x7FFFFFFF;
  const uint32_t rounding_bias = 0xFFF + ((abs_bits >> 13) & 1);
  const uint32_t rounded = abs_bits + rounding_bias;
  return sign | static_cast<uint16_t>(((rounded >> 23) - 112) << 10 | ((rounded >> 13) & 0x3FF));
}

inline float load_element(const void* base, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[index];
    case DType::kFloat16: return f16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.0f;
}

inline void store_element(void* base, int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[index] = value; return;
    case DType::kFloat16: static_cast<uint16_t*>(base)[index] = float_to_f16(value); return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); return;
  }
}

}  // namespace jax_dash::cpu
