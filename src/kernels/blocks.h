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

// The other ggml block layouts, byte for byte as GGUF stores them. Values:
//   Q4_1    x[j] = d * q[j] + m            q: 4 bits (byte j: low nibble j, high nibble j + 16)
//   Q5_0    x[j] = d * (q[j] - 16)         q: 4 low bits as Q4_0 + bit j of qh (32-bit LE)
//   Q5_1    x[j] = d * q[j] + m            q: as Q5_0
//   IQ4_NL  x[j] = d * kIQ4NLValues[q[j]]  q: 4 bits as Q4_0
// K-quants: super-blocks of 256 values in sub-blocks of 16 or 32 with small integer scales
// (and mins) that are scaled by the super-block's f16 d (and dmin); kernels/quant_formats.h
// spells out each decoding.
inline constexpr int64_t kQKBlock = 256;  // values per K-quant / IQ4_XS super-block

struct BlockQ4_1 {
  uint16_t d, m;  // f16 scale and minimum
  uint8_t qs[kQBlock / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bits, element j at bit j
  uint8_t qs[kQBlock / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQBlock / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQBlock / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// ggml's kvalues_iq4nl: the 16 levels of IQ4_NL (and IQ4_XS), ascending, non-uniform (denser
// near zero, as weights are distributed).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

struct BlockQ2_K {
  uint8_t scales[kQKBlock / 16];  // per 16 values: low nibble scale, high nibble min
  uint8_t qs[kQKBlock / 4];       // 2-bit quants
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

struct BlockQ3_K {
  uint8_t hmask[kQKBlock / 8];  // high bit of each 3-bit quant
  uint8_t qs[kQKBlock / 4];     // low 2 bits
  uint8_t scales[12];           // 16 6-bit scales, packed
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins, packed
  uint8_t qs[kQKBlock / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKBlock / 8];
  uint8_t qs[kQKBlock / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kQKBlock / 2];  // low 4 bits
  uint8_t qh[kQKBlock / 4];  // high 2 bits
  int8_t scales[kQKBlock / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;                // high 2 bits of the 8 6-bit scales
  uint8_t scales_l[kQKBlock / 64];  // low 4 bits, two per byte
  uint8_t qs[kQKBlock / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Activations for K-quant dot products (ggml's Q8_K): one f32 scale per 256 values and the
// sums of each 16 quants (for the mins).
struct BlockQ8_K {
  float d;
  int8_t qs[kQKBlock];
  int16_t bsums[kQKBlock / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Activations quantized to Q8_0 for the integer matmul, laid out for the SIMD kernels (row i,
// column c, block b = c / 32). 1.125 bytes per value.
struct QuantizedActivations {
  const int8_t* q = nullptr;  // [num_x][cols]
  const float* d = nullptr;   // [num_x][cols / 32]: the block's f16 scale, as f32
  const float* s = nullptr;   // [num_x][cols / 32]: ggml's Q8_1 s, f16(d * sum of the block's q)
                              // with d unrounded (for weight types with a minimum, Q4_1 / Q5_1;
                              // else may be null)
};

}  // namespace sieve::kernels
