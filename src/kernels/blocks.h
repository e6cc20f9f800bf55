#pragma once
// Internal to src/kernels: the ggml block structs and the layout of quantized activations.
#include <cstdint>

namespace sieve::kernels {

inline constexpr int64_t kQBlock = 32;  // values per Q8_0 / Q4_0 block

struct BlockQ8_0 {
  uint16_t d;          // f16 scale
  int8_t qs[kQBlock];  // x[j] = d * qs[j]
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
  uint16_t d;               // f16 scale
  uint8_t qs[kQBlock / 2];  // x[j] = d * ((qs[j] & 0xF) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
};
static_assert(sizeof(BlockQ4_0) == 18);

// Activations quantized to Q8_0 for the integer matmul, laid out for the SIMD kernels (row i,
// column c, block b = c / 32). 1.125 bytes per value.
struct QuantizedActivations {
  const int8_t* q = nullptr;  // [num_x][cols]
  const float* d = nullptr;   // [num_x][cols / 32]: the block's f16 scale, as f32
};

}  // namespace sieve::kernels
