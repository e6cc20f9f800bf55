#pragma once
// Internal to src/kernels: the Q8_0 x Q8_0 matmul tiles for x86 CPUs with AVX-512 VNNI
// (vpdpbusd), used by the AVX3 target for num_x >= 2 when the CPU has VNNI. Plain intrinsics in
// their own translation unit: Highway 1.0.3's VNNI target (AVX3_DL) enables flags Zen 4 lacks.
#include <cstddef>
#include <cstdint>

namespace sieve::kernels::vnni {

// True on x86-64 CPUs with AVX-512 F/BW/VL/DQ and VNNI; false elsewhere (never call below then).
bool supported();

// y[i * rows + r] = sum_c w[r][c] * x[i][c] for r in [r_begin, r_end), i < num_x; w in Q8_0,
// x pre-quantized to Q8_0 (q int8 [num_x][cols], d f32 [num_x][cols / 32]); cols % 32 == 0.
// Exact int32 block dot products, one f32 FMA per block (lanes of two blocks per 512-bit op).
struct Q8_0Problem {
  const uint8_t* w;  // rows * row_bytes
  size_t row_bytes;  // cols / 32 * 34
  int64_t rows, cols;
  const int8_t* xq;
  const float* xd;
  float* y;
};
void q8_0_rows(const Q8_0Problem& p, int64_t r_begin, int64_t r_end, int64_t num_x);

// The same product from weights packed by pack_for_matmul() (layout in cpu/pack.h): per group
// of 16 rows and block, 8 vpdpbusd of all 16 rows' weights against a broadcast 4 bytes of x,
// then one conversion and one FMA for the 16 rows. xsum[i][b] = -128 * sum_j xq[i][b][j]
// corrects for the weights' +128 bias. Rows [g_begin * 16, min(rows, g_end * 16)).
struct PackedQ8_0Problem {
  const uint8_t* packed;
  int64_t rows, cols;
  const int8_t* xq;
  const float* xd;
  const int32_t* xsum;  // [num_x][cols / 32]
  float* y;
};
void packed_q8_0_groups(const PackedQ8_0Problem& p, int64_t g_begin, int64_t g_end, int64_t num_x);

}  // namespace sieve::kernels::vnni
