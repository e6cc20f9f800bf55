#pragma once
// Internal to src/kernels: the F32 / F16 / BF16 prefill matmul (many activation rows) for x86
// CPUs with AVX-512F, used by the AVX3 target. Plain intrinsics in their own translation unit
// (like matmul_vnni.cc): a packed-panel GEMM with a broadcast-activation register tile, which the
// portable dot-product tiles of matmul-inl.h cannot express.
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace sieve::kernels::avx512 {

// True on x86-64 CPUs with AVX-512 F/BW/VL/DQ and F16C; false elsewhere (never call below then).
bool supported();

enum class FloatFormat { kF32, kF16, kBF16 };

// The activations, repacked once per matmul so the tiles broadcast them from contiguous memory:
// tile t holds rows [tile_begin(t), tile_begin(t + 1)), at most kTileRows and as even as can be
// (64 rows: 4 x 13 + 12, not 4 x 14 + 8, whose 16 accumulators would not fill the FMA pipes),
// stored at tile_begin(t) * cols as [cols][rows of the tile] (column-major within the tile).
inline constexpr int64_t kTileRows = 14;
inline int64_t num_activation_tiles(int64_t num_x) { return (num_x + kTileRows - 1) / kTileRows; }
inline int64_t tile_begin(int64_t num_x, int64_t t) {
  const int64_t n = num_activation_tiles(num_x);
  return t * (num_x / n) + std::min(t, num_x % n);
}
// Tiles [t_begin, t_end) of x [num_x][cols] into xp (num_x * cols floats).
void pack_activations(const float* x, int64_t num_x, int64_t cols, float* xp, int64_t t_begin,
                      int64_t t_end);

// F16 / BF16 weights packed by pack_for_matmul() (cpu/pack.h): groups of kPackedGroupRows rows (the
// last one padded with zero rows), each group column by column: element (r, c) at
// (r / kPackedGroupRows * cols + c) * kPackedGroupRows + r % kPackedGroupRows, in the file's
// 2-byte format. Decode then reads one sequential stream per thread (row-major F16 from DRAM: ~15
// GB/s per core with 4 rows' streams, where one stream reads ~25).
inline constexpr int64_t kPackedGroupRows = 64;

// y[i * rows + r] = sum_c w[r][c] * x[i][c] for r in [r_begin, r_end), i < num_x, with x packed
// by pack_activations. f32 products and sums (FMA); each weight is widened to f32 once per call.
// r_begin a multiple of kPanelRows.
inline constexpr int64_t kPanelRows = 32;
struct FloatProblem {
  FloatFormat format;
  const uint8_t* w;  // rows * row_bytes, or packed as above (packed_float_groups)
  size_t row_bytes;  // cols * (4 or 2)
  int64_t rows, cols;
  const float* xp;  // pack_activations(x)
  int64_t num_x;
  float* y;  // [num_x][rows]
};
void float_rows(const FloatProblem& p, int64_t r_begin, int64_t r_end);

// The same product from packed weights (p.w) and x as it is ([num_x][cols], p.xp unused), for
// groups [g_begin, g_end), any number of activation rows: per column, the group's 4 weight
// vectors widened once and an FMA with each of up to 6 broadcast activations. Each output sums
// its terms in column order whatever num_x, so a row's result is the same bits alone and in any
// batch. From packed weights this beats float_rows at every num_x (no transposed panel to build:
// one thread, F16 4096x4096 x 256 rows, 102-111 against 89-99 GFLOP/s; x 64 99-105 against 80-93).
void packed_float_groups(const FloatProblem& p, const float* x, int64_t g_begin, int64_t g_end);

}  // namespace sieve::kernels::avx512
