// F32 / F16 / BF16 prefill matmul with AVX-512F. See matmul_float_avx512.h; the portable kernels
// (and fewer than 40 activation rows, decode included, which streams the weights and is
// memory-bound) are in matmul-inl.h, the scalar reference in ref/ref_ops.cc.
//
// A GEMM in the BLIS manner. Per column slice of kSliceCols and panel of kPanelRows (32) weight
// rows, the weights are widened to f32 and transposed once into wp[k][32] (16x16 register
// transposes); then every activation tile of up to 14 rows runs the register tile
//   acc[i][v] += broadcast(x[i][k]) * wp[k][16 v .. 16 v + 15]     (i < 14, v < 2)
// 28 accumulators, 2 weight vectors, one broadcast load per activation row: 28 FMAs per 2 vector
// loads and 14 broadcasts, so the loop is bound by the FMA ports, not by widening (once per
// weight, not once per weight and activation tile as in the dot-product tiles) nor by horizontal
// sums (none: the accumulators hold 16 consecutive outputs of one activation row, stored directly
// into y). Measured single-threaded on the Zen VM (f32 FMA peak ~220 GFLOP/s per core): ~210
// GFLOP/s with the weights in cache, ~190 for F16 2048x2048 .. 5632x2048 at 256 rows from DRAM
// (the dot-product tiles: ~145).
#include "kernels/cpu/matmul_float_avx512.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/targets.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge source: false
// (maybe-)uninitialized warnings once inlined.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define SIEVE_AVX512 1
#define SIEVE_AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#else
#define SIEVE_AVX512 0
#endif

namespace sieve::kernels::avx512 {

#if SIEVE_AVX512

// F16C is not asked for: every AVX-512F CPU has it (Intel from Skylake-SP, AMD from Zen 4), and
// clang 14's __builtin_cpu_supports does not know the name.
bool supported() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
}

namespace {

// Columns per slice: the panel wp (kSliceCols * 32 floats, 256 KiB) stays in L2 while the
// activation tiles pass over it; each tile keeps its accumulators in registers for the whole
// slice, so y is read and written once per slice (most matrices have one; measured 4-7% faster
// than slices of 256 columns whose 32 KiB panel stays in L1).
inline constexpr int64_t kSliceCols = 2048;

// Columns [c, c + 16) of a weight row as f32 (masked-off lanes read nothing and are 0).
template <FloatFormat F>
SIEVE_AVX512_ATTR __attribute__((always_inline)) inline __m512 LoadRow(const uint8_t* row,
                                                                       int64_t c, __mmask16 mask) {
  if constexpr (F == FloatFormat::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + c);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(row) + c);
    if constexpr (F == FloatFormat::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// v[j][c] -> v[c][j] for a 16x16 block: pairs of rows, then quads (within 128-bit lanes), then
// the 4x4 matrix of 128-bit lanes.
SIEVE_AVX512_ATTR __attribute__((always_inline)) inline void Transpose16(__m512* v) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_ps(v[j], v[j + 1]);
    t[j + 1] = _mm512_unpackhi_ps(v[j], v[j + 1]);
  }
  // u[4 R + q], lane L: column 4 L + q of rows 4 R .. 4 R + 3.
  __m512 u[16];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const __m512d a = _mm512_castps_pd(t[4 * r]), b = _mm512_castps_pd(t[4 * r + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * r + 2]), d = _mm512_castps_pd(t[4 * r + 3]);
    u[4 * r + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * r + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * r + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * r + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512 s0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x44);
    const __m512 s1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xEE);
    const __m512 s2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x44);
    const __m512 s3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xEE);
    v[q] = _mm512_shuffle_f32x4(s0, s2, 0x88);
    v[4 + q] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
    v[8 + q] = _mm512_shuffle_f32x4(s1, s3, 0x88);
    v[12 + q] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
  }
}

}  // namespace

// Per 16 columns: the tile's rows (up to 14, the rest zero) transposed by Transpose16, each
// column's m values stored with one masked store.
SIEVE_AVX512_ATTR void pack_activations(const float* x, int64_t num_x, int64_t cols, float* xp,
                                        int64_t t_begin, int64_t t_end) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t x0 = tile_begin(num_x, t);
    const int64_t m = tile_begin(num_x, t + 1) - x0;
    const auto rows_mask = static_cast<__mmask16>((1u << m) - 1);
    float* out = xp + x0 * cols;
    for (int64_t c = 0; c < cols; c += 16) {
      const int64_t kn = std::min<int64_t>(16, cols - c);
      const auto mask = static_cast<__mmask16>((1u << kn) - 1);
      __m512 v[16];
#pragma GCC unroll 16
      for (int64_t i = 0; i < 16; ++i)
        v[i] = i < m ? _mm512_maskz_loadu_ps(mask, x + (x0 + i) * cols + c) : _mm512_setzero_ps();
      Transpose16(v);
#pragma GCC unroll 16
      for (int64_t j = 0; j < kn; ++j) _mm512_mask_storeu_ps(out + (c + j) * m, rows_mask, v[j]);
    }
  }
}

namespace {

// Bytes ahead in each row that PackPanel prefetches when the panel is cold.
inline constexpr int64_t kPackPrefetchBytes = 1024;

// Weight rows [r0, r0 + nr) x columns [c0, c0 + klen) -> wp[k][32] as f32; rows past nr are 0.
// `cold`: nothing prefetched the panel (a task's first), so it prefetches each of the 16 rows it
// reads kPackPrefetchBytes ahead (the hardware prefetchers do not keep 16 streams going).
template <FloatFormat F>
SIEVE_AVX512_ATTR void PackPanel(const FloatProblem& p, int64_t r0, int64_t nr, int64_t c0,
                                 int64_t klen, float* wp, bool cold) {
  constexpr int64_t kElemBytes = F == FloatFormat::kF32 ? 4 : 2;
  for (int64_t g = 0; g < kPanelRows; g += 16) {
    for (int64_t kb = 0; kb < klen; kb += 16) {
      const int64_t kn = std::min<int64_t>(16, klen - kb);
      const __mmask16 mask = static_cast<__mmask16>((1u << kn) - 1);
      // One prefetch per row and cache line (16 columns of F16 are half a line).
      if (cold && (kb * kElemBytes) % 64 == 0) {
        for (int64_t j = 0; j < 16 && g + j < nr; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(p.w + (r0 + g + j) * p.row_bytes +
                                                     (c0 + kb) * kElemBytes + kPackPrefetchBytes),
                       _MM_HINT_T0);
        }
      }
      __m512 v[16];
#pragma GCC unroll 16
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t r = g + j;
        v[j] =
            r < nr ? LoadRow<F>(p.w + (r0 + r) * p.row_bytes, c0 + kb, mask) : _mm512_setzero_ps();
      }
      Transpose16(v);
#pragma GCC unroll 16
      for (int64_t j = 0; j < kn; ++j) _mm512_store_ps(wp + (kb + j) * kPanelRows + g, v[j]);
    }
  }
}

// y[i][0 .. 32) (masks m0, m1 for the two halves) += or = sum_k xp[k][i] * wp[k][..], i < M.
template <int M>
SIEVE_AVX512_ATTR void Tile(const float* xp, const float* wp, int64_t klen, float* y, int64_t ldy,
                            __mmask16 m0, __mmask16 m1, bool accumulate) {
  __m512 acc[M][2];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    acc[i][0] = accumulate ? _mm512_maskz_loadu_ps(m0, y + i * ldy) : _mm512_setzero_ps();
    acc[i][1] = accumulate ? _mm512_maskz_loadu_ps(m1, y + i * ldy + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < klen; ++k) {
    const __m512 w0 = _mm512_load_ps(wp + k * kPanelRows);
    const __m512 w1 = _mm512_load_ps(wp + k * kPanelRows + 16);
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      const __m512 b = _mm512_set1_ps(xp[k * M + i]);
      acc[i][0] = _mm512_fmadd_ps(b, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(b, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, float*, int64_t, __mmask16, __mmask16,
                        bool);
template <size_t... M>
constexpr auto MakeTiles(std::index_sequence<M...>) {
  return std::array<TileFn, sizeof...(M)>{&Tile<static_cast<int>(M) + 1>...};
}
// kTiles[m - 1]: the tile of m activation rows.
constexpr auto kTiles = MakeTiles(std::make_index_sequence<kTileRows>());

// Prefetches the cache lines of weight rows [r0, r0 + nr) x columns [c0, c1) into L2 (a panel
// is 128 KiB of F16: L1 would evict them before use), a share at a time: Next() issues the next
// `per_call` lines. Measured 3-7% faster than no prefetch or prefetch into L1.
class PanelPrefetcher {
 public:
  PanelPrefetcher(const FloatProblem& p, int64_t r0, int64_t nr, int64_t c0, int64_t c1,
                  int64_t calls)
      : p_(p), r0_(r0), nr_(nr) {
    const int64_t elem = static_cast<int64_t>(p.row_bytes) / p.cols;
    begin_ = c0 * elem / 64 * 64;
    lines_ = c1 > c0 ? (c1 * elem - begin_ + 63) / 64 : 0;
    per_call_ = (nr * lines_ + calls - 1) / std::max<int64_t>(1, calls);
  }
  SIEVE_AVX512_ATTR void Next() {
    for (int64_t k = 0; k < per_call_ && row_ < nr_; ++k) {
      _mm_prefetch(
          reinterpret_cast<const char*>(p_.w + (r0_ + row_) * p_.row_bytes + begin_ + line_ * 64),
          _MM_HINT_T1);
      if (++line_ == lines_) line_ = 0, ++row_;
    }
  }

 private:
  const FloatProblem& p_;
  int64_t r0_, nr_, begin_ = 0, lines_ = 0, per_call_ = 0, row_ = 0, line_ = 0;
};

template <FloatFormat F>
SIEVE_AVX512_ATTR void Rows(const FloatProblem& p, int64_t r_begin, int64_t r_end) {
  // 256 KiB per thread, on the heap: as a thread_local array it would sit in every thread's
  // static TLS block (carved from each thread's stack, whatever the thread does).
  static thread_local std::vector<float> buffer;
  if (buffer.empty()) buffer.resize(kSliceCols * kPanelRows + 16);
  float* wp =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
  const int64_t num_tiles = num_activation_tiles(p.num_x);
  for (int64_t c0 = 0; c0 < p.cols; c0 += kSliceCols) {
    const int64_t klen = std::min(kSliceCols, p.cols - c0);
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kPanelRows) {
      const int64_t nr = std::min(kPanelRows, r_end - r0);
      PackPanel<F>(p, r0, nr, c0, klen, wp, r0 == r_begin && c0 == 0);
      // The next panel's weights come from DRAM while the tiles run on this one: the same rows'
      // next slice, or the next rows' first.
      const bool last_panel = r0 + kPanelRows >= r_end;
      const int64_t next_c0 = last_panel ? c0 + kSliceCols : c0;
      const int64_t next_r0 = last_panel ? r_begin : r0 + kPanelRows;
      PanelPrefetcher prefetcher(p, next_r0, std::min(kPanelRows, r_end - next_r0), next_c0,
                                 std::min(p.cols, next_c0 + kSliceCols), num_tiles);
      const auto m0 = static_cast<__mmask16>(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
      const auto m1 = static_cast<__mmask16>(nr >= 32   ? 0xFFFF
                                             : nr <= 16 ? 0
                                                        : (1u << (nr - 16)) - 1);
      for (int64_t t = 0; t < num_tiles; ++t) {
        prefetcher.Next();
        const int64_t x0 = tile_begin(p.num_x, t);
        const int64_t m = tile_begin(p.num_x, t + 1) - x0;
        kTiles[m - 1](p.xp + x0 * p.cols + c0 * m, wp, klen, p.y + x0 * p.rows + r0, p.rows, m0, m1,
                      c0 != 0);
      }
    }
  }
}

// fn.template operator()<F>() for the format's F.
template <class Fn>
SIEVE_AVX512_ATTR void WithFormat(FloatFormat format, const Fn& fn) {
  switch (format) {
    case FloatFormat::kF32:
      return fn.template operator()<FloatFormat::kF32>();
    case FloatFormat::kF16:
      return fn.template operator()<FloatFormat::kF16>();
    case FloatFormat::kBF16:
      return fn.template operator()<FloatFormat::kBF16>();
  }
}

}  // namespace

void float_rows(const FloatProblem& p, int64_t r_begin, int64_t r_end) {
  WithFormat(p.format, [&]<FloatFormat F>() SIEVE_AVX512_ATTR { Rows<F>(p, r_begin, r_end); });
}

namespace {

// Packed group g x activation rows [x0, x0 + kX): per column, the group's 4 weight vectors
// against each row's broadcast activation, into 4 kX accumulators (24 at most, with the 4
// weight vectors and the broadcast in the 32 registers). The group is one sequential stream;
// whether software prefetch helps the hardware's depends on the CPU (packed_float_prefetch_bytes).
template <FloatFormat F, int kX>
SIEVE_AVX512_ATTR void PackedColumns(const FloatProblem& p, const float* x, int64_t g, int64_t x0) {
  constexpr int64_t kElemBytes = F == FloatFormat::kF32 ? 4 : 2;
  constexpr int64_t kColumnBytes = kPackedGroupRows * kElemBytes;
  constexpr int kVecs = kPackedGroupRows / 16;
  const uint8_t* column = p.w + g * p.cols * kColumnBytes;
  const float* x_rows[kX];
  for (int i = 0; i < kX; ++i) x_rows[i] = x + (x0 + i) * p.cols;
  __m512 acc[kX][kVecs];
#pragma GCC unroll 8
  for (int i = 0; i < kX; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  const int64_t prefetch = packed_float_prefetch_bytes();
  for (int64_t c = 0; c < p.cols; ++c, column += kColumnBytes) {
    if (prefetch > 0) {
#pragma GCC unroll 4
      for (int64_t line = 0; line < kColumnBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(column + prefetch + line), _MM_HINT_T1);
    }
    __m512 w[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) w[v] = LoadRow<F>(column, 16 * v, 0xFFFF);
#pragma GCC unroll 8
    for (int i = 0; i < kX; ++i) {
      const __m512 b = _mm512_set1_ps(x_rows[i][c]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_fmadd_ps(b, w[v], acc[i][v]);
    }
  }
  const int64_t rows_left = p.rows - g * kPackedGroupRows;
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    const int64_t n = std::clamp<int64_t>(rows_left - 16 * v, 0, 16);
    const auto mask = static_cast<__mmask16>((1u << n) - 1);
#pragma GCC unroll 8
    for (int i = 0; i < kX; ++i)
      _mm512_mask_storeu_ps(p.y + (x0 + i) * p.rows + g * kPackedGroupRows + 16 * v, mask,
                            acc[i][v]);
  }
}

// The last num_x_left < kX activation rows as one PackedColumns.
template <FloatFormat F, int kX>
SIEVE_AVX512_ATTR void PackedColumnsRemainder(const FloatProblem& p, const float* x, int64_t g,
                                              int64_t x0, int64_t num_x_left) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) return PackedColumns<F, kX>(p, x, g, x0);
    PackedColumnsRemainder<F, kX - 1>(p, x, g, x0, num_x_left);
  }
}

// Prefill from packed groups: a slice of a group's columns is widened to f32 once ([c][64] in a
// per-thread buffer that stays in L2) and every tile of activation rows then reads it there, so
// each weight is widened once per matmul instead of once per 6 activation rows (vcvtph2ps runs
// on an FMA port on Intel cores: 4 per 24 FMAs). The FMAs and their column order are
// PackedColumns', a slice's sums carried to the next through y, so the bits are the same as
// there (PackedFloatRowsEqualAloneAndInAnyBatch). Measured (kernels_bench
// SuperBlocks/Prefill/F16/4096x4096/packed/x256, 2 threads, Xeon with a 346 GFLOP/s f32 peak):
// see docs/performance.md.
inline constexpr int64_t kWidenMinRows = 12;
inline constexpr int64_t kWidenSliceCols = 1024;

template <int kX>
SIEVE_AVX512_ATTR void WidenedColumns(const FloatProblem& p, const float* x, const float* wf,
                                      int64_t g, int64_t x0, int64_t c0, int64_t n) {
  constexpr int kVecs = kPackedGroupRows / 16;
  const float* x_rows[kX];
  for (int i = 0; i < kX; ++i) x_rows[i] = x + (x0 + i) * p.cols + c0;
  const int64_t rows_left = p.rows - g * kPackedGroupRows;
  __mmask16 masks[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const int64_t m = std::clamp<int64_t>(rows_left - 16 * v, 0, 16);
    masks[v] = static_cast<__mmask16>((1u << m) - 1);
  }
  float* y = p.y + x0 * p.rows + g * kPackedGroupRows;
  __m512 acc[kX][kVecs];
#pragma GCC unroll 8
  for (int i = 0; i < kX; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      acc[i][v] =
          c0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(masks[v], y + i * p.rows + 16 * v);
    }
  }
  for (int64_t c = 0; c < n; ++c, wf += kPackedGroupRows) {
    __m512 w[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) w[v] = _mm512_load_ps(wf + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < kX; ++i) {
      const __m512 b = _mm512_set1_ps(x_rows[i][c]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_fmadd_ps(b, w[v], acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
#pragma GCC unroll 8
    for (int i = 0; i < kX; ++i)
      _mm512_mask_storeu_ps(y + i * p.rows + 16 * v, masks[v], acc[i][v]);
  }
}

template <int kX>
SIEVE_AVX512_ATTR void WidenedColumnsRemainder(const FloatProblem& p, const float* x,
                                               const float* wf, int64_t g, int64_t x0, int64_t c0,
                                               int64_t n, int64_t num_x_left) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) return WidenedColumns<kX>(p, x, wf, g, x0, c0, n);
    WidenedColumnsRemainder<kX - 1>(p, x, wf, g, x0, c0, n, num_x_left);
  }
}

template <FloatFormat F>
SIEVE_AVX512_ATTR void WidenedGroups(const FloatProblem& p, const float* x, int64_t g_begin,
                                     int64_t g_end) {
  constexpr int kX = 6;
  constexpr int64_t kElemBytes = F == FloatFormat::kF32 ? 4 : 2;
  constexpr int64_t kColumnBytes = kPackedGroupRows * kElemBytes;
  constexpr int kVecs = kPackedGroupRows / 16;
  // 256 KiB per thread, on the heap (as Rows' panel).
  static thread_local std::vector<float> buffer;
  if (buffer.empty()) buffer.resize(kWidenSliceCols * kPackedGroupRows + 16);
  float* wf =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* group = p.w + g * p.cols * kColumnBytes;
    for (int64_t c0 = 0; c0 < p.cols; c0 += kWidenSliceCols) {
      const int64_t n = std::min(kWidenSliceCols, p.cols - c0);
      const uint8_t* column = group + c0 * kColumnBytes;
      for (int64_t c = 0; c < n; ++c, column += kColumnBytes) {
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) {
          _mm512_store_ps(wf + c * kPackedGroupRows + 16 * v, LoadRow<F>(column, 16 * v, 0xFFFF));
        }
      }
      int64_t x0 = 0;
      for (; x0 + kX <= p.num_x; x0 += kX) WidenedColumns<kX>(p, x, wf, g, x0, c0, n);
      WidenedColumnsRemainder<kX - 1>(p, x, wf, g, x0, c0, n, p.num_x - x0);
    }
  }
}

template <FloatFormat F>
SIEVE_AVX512_ATTR void PackedGroups(const FloatProblem& p, const float* x, int64_t g_begin,
                                    int64_t g_end) {
  if (p.num_x >= kWidenMinRows) return WidenedGroups<F>(p, x, g_begin, g_end);
  constexpr int kX = 6;
  for (int64_t g = g_begin; g < g_end; ++g) {
    int64_t x0 = 0;
    for (; x0 + kX <= p.num_x; x0 += kX) PackedColumns<F, kX>(p, x, g, x0);
    PackedColumnsRemainder<F, kX - 1>(p, x, g, x0, p.num_x - x0);
  }
}

}  // namespace

void packed_float_groups(const FloatProblem& p, const float* x, int64_t g_begin, int64_t g_end) {
  WithFormat(p.format,
             [&]<FloatFormat F>() SIEVE_AVX512_ATTR { PackedGroups<F>(p, x, g_begin, g_end); });
}

#else  // not x86-64 with GCC/Clang

bool supported() { return false; }
void pack_activations(const float*, int64_t, int64_t, float*, int64_t, int64_t) {}
void float_rows(const FloatProblem&, int64_t, int64_t) {}
void packed_float_groups(const FloatProblem&, const float*, int64_t, int64_t) {}

#endif

}  // namespace sieve::kernels::avx512
