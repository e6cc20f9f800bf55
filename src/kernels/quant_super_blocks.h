#pragma once
// Internal to src/kernels: the super-block types (256 values; structs in kernels/blocks.h) in
// integer form, shared by dequantization, the scalar reference matmul and the tests.
//
// Every type decodes to x[e] = d * scale[e / 16] * q[e] - dmin * min[e / 16] for e < 256,
// with small integers q, scale, min (types with 32-value sub-blocks repeat each scale twice).
// Element e = 128 h + 32 k + l (h half, k quarter, l < 32) or e = 32 s + i (s sub-block):
//   Q2_K    q = (qs[32h + l] >> 2k) & 3 in [0, 3]; scales[e/16]: low nibble scale, high nibble min
//   Q3_K    q = ((qs[32h + l] >> 2k) & 3) - (bit 4h + k of hmask[l] ? 0 : 4) in [-4, 3];
//           16 6-bit scales minus 32: low 4 bits in nibbles of bytes 0..7 (s < 8 low nibble of
//           byte s, else high nibble of byte s - 8), high 2 bits in bits 2(s/4) of byte 8 + s%4
//   Q4_K    q = nibble of qs[32(e/64) + l]: low for (e % 64) < 32, high otherwise, in [0, 15];
//           8 6-bit scales and mins (per 32): j < 4: scale s[j] & 63, min s[j+4] & 63;
//           j >= 4: scale (s[j+4] & 15) | (s[j-4] >> 6) << 4, min (s[j+4] >> 4) | (s[j] >> 6) << 4
//   Q5_K    Q4_K's q plus 16 * bit (e / 32) of qh[e % 32], in [0, 31]; same scales and mins
//   Q6_K    q = (nibble (k >> 1) of ql[64h + 32(k & 1) + l] | ((qh[32h + l] >> 2k) & 3) << 4) - 32,
//           in [-32, 31]; scale = int8 scales[e / 16]
//   IQ4_XS  q = kIQ4Values[nibble of qs[16s + i % 16]] (low nibble for i < 16) in [-127, 113];
//           scale (per 32) = ((scales_l[s/2] >> 4(s%2)) & 15 | ((scales_h >> 2s) & 3) << 4) - 32
// Activations for these types are Q8_K (BlockQ8_K): per 256 values d = max / -127 for the value
// max of largest magnitude, q = min(127, round_half_even(x * -127 / max)), bsums per 16.
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/ops.h"

namespace sieve::kernels::quant {

struct SuperBlockInts {
  float d = 0.0f, dmin = 0.0f;
  int32_t scales[16] = {};  // per 16 values
  int32_t mins[16] = {};    // per 16 values; zero for the symmetric types
  int32_t q[kQKBlock] = {};
};
// dtype: one of Q2_K .. Q6_K, IQ4_XS; block points at one block of it.
void decode_super_block(DType dtype, const void* block, SuperBlockInts* out);

// 6-bit scale and min j (0..7) of a Q4_K / Q5_K block from its 12 packed scale bytes.
void scale_min_k4(int j, const uint8_t* scales, int* scale, int* min);
// 6-bit scale j (0..15) of a Q3_K block from its 12 packed scale bytes, as stored (0..63; the
// value is this minus 32).
int scale_q3_k(int j, const uint8_t* scales);

// ggml's quantize_row_q8_K_ref for n values (a multiple of 256).
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);

}  // namespace sieve::kernels::quant

namespace sieve::kernels::ref {
// ref::matmul for the super-block types, with ggml's semantics: each x row quantized to Q8_K,
// per super-block d_w * d_x * sum_e scale * q_w * q_x - dmin_w * d_x * sum_s min_s * bsum_s
// with exact integer sums (ref/ref_super_blocks.cc).
void matmul_super_block(const MatrixView& w, const float* x, int64_t num_x, float* y);
}  // namespace sieve::kernels::ref
