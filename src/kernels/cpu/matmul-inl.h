// One file above the ~800-line guideline on purpose: a Highway per-target kernel family that is
// included once per target, one kernel with the dtype as a policy.
//
// Per-target matmul kernels: y[i][r] = <w[r], x[i]> for a weight matrix w [rows][cols] in
// any DType and activations x [num_x][cols]. Included once per Highway target (toggle guard).
//
// Structure (one kernel for all dtypes, the dtype is a policy):
//   Run()        parallel over tasks of consecutive weight rows (~kTaskBytes of weights per
//                pass over the columns each)
//   RunRows()    inside a task: decode (num_x == 1) runs whole rows, 4 at a time, with a
//                software prefetcher for short rows; prefill walks kPrefillCols column slices
//                and, in each, tiles of kW weight rows x kX activation rows
//   Tile<kW,kX>  register-blocked dot products: each decoded weight vector is used for kX
//                activation rows, each activation vector for kW weight rows
// Two tile kinds:
//   FloatKernel<Row>  F32 / F16 / BF16: weights widened to f32, f32 FMAs. Any cols.
//   QuantKernel<Row>  Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL: activations pre-quantized
//                     to Q8_0; int8 x int8 -> int32 per block (BlockDot), then one f32 FMA per
//                     block with scale d_w * d_x (Q4_1 / Q5_1: plus m_w * s_x, ggml's Q8_1 sum
//                     term f16(d_x * sum(q_x)), made with the activations). cols a multiple of 32.
// On AVX-512 CPUs, F32 / F16 / BF16 prefill of 40 or more activation rows runs as a packed-panel
// GEMM in cpu/matmul_float_avx512.cc; F16 / BF16 weights with their packed copy run there for any
// number of rows (packed_float_groups). On AVX-512 CPUs with VNNI, whole tasks run in intrinsics:
// Q8_0 prefill (num_x >= 2) in cpu/matmul_vnni.cc; Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL decode and
// prefill in cpu/matmul_vnni_small_blocks.cc (Row::kVnniFormat names the layout; from
// kMinSmallBlockGroupRows activation rows in tiles of 16 weight rows).
#if defined(SIEVE_KERNELS_CPU_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIEVE_KERNELS_CPU_MATMUL_INL_H_
#undef SIEVE_KERNELS_CPU_MATMUL_INL_H_
#else
#define SIEVE_KERNELS_CPU_MATMUL_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/blocks.h"
#include "kernels/cpu/matmul_float_avx512.h"
#include "kernels/cpu/matmul_vnni.h"
#include "kernels/cpu/matmul_vnni_small_blocks.h"
#include "kernels/cpu/ops-inl.h"
#include "kernels/cpu/pack.h"
#include "kernels/ops.h"
#include "util/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ----------------------------------------------------------------------------- tiling

// Decode: 4 weight rows per tile = 4 independent FMA chains and 4 prefetch streams.
inline constexpr int kDecodeRowsW = 4;
// Prefill: kPrefillRowsW x 4 accumulators. AVX-512 has 32 vector registers, others 16.
inline constexpr int kPrefillRowsX = 4;
inline constexpr int kPrefillRowsW = HWY_TARGET <= HWY_AVX3 ? 4 : 2;
// A task covers ~this many bytes of weights per pass (decode: whole rows, prefill: one
// column slice): big enough to amortise the task overhead (~0.1 us), small enough to stay in
// L2 while all x tiles pass over it (prefill).
inline constexpr int64_t kTaskBytes = 64 << 10;
inline constexpr int64_t kMaxTaskRows = 64;
// Below this many multiply-adds a matmul runs on the calling thread alone, and below this
// many activations their quantization does (waking the pool costs microseconds).
inline constexpr int64_t kMinParallelMacs = 1 << 16;
inline constexpr int64_t kMinParallelQuantize = 1 << 14;
// Prefill walks the columns in slices of this many, so a tile's activation rows (4 x 4 KiB
// of f32) stay in L1 while the weight rows pass over them. A multiple of 32 and of every
// vector length.
inline constexpr int64_t kPrefillCols = 1024;

// Columns [begin, end) of a tile; `accumulate` adds to y instead of overwriting it.
struct ColumnSlice {
  int64_t begin = 0, end = 0;
  bool accumulate = false;
};

HWY_INLINE void StoreOutput(float* out, float value, bool accumulate) {
  *out = accumulate ? *out + value : value;
}

// Software prefetch for whole-row passes (decode) over short rows. A tile's kW rows are
// adjacent in memory, and so are consecutive tiles: a cursor walks that region linearly
// kPrefetchBytes ahead of the reads, at the rate the tile consumes it. The hardware
// prefetchers do not ramp up on rows of a few KiB: measured single-threaded on a Zen 4 VM,
// Q8_0 11008x4096 decode goes from 11 to 23 GB/s, F16 rows of 4 KiB from 19 to 23 GB/s. On
// rows of 8 KiB and more the cursor runs behind the later rows of the tile and costs 10-25%,
// so those are left to the hardware.
inline constexpr int64_t kPrefetchBytes = 16 << 10;
inline constexpr size_t kPrefetchMaxRowBytes = 8 << 10;

// Addresses are integers: the cursor runs past the end of the matrix (prefetches never fault).
class RowPrefetcher {
 public:
  // The tile's rows start at `tile`; each step consumes `step_bytes` of them.
  RowPrefetcher(const void* tile, int64_t step_bytes)
      : base_(reinterpret_cast<uintptr_t>(tile) + kPrefetchBytes),
        next_(base_),
        step_bytes_(static_cast<uintptr_t>(step_bytes)) {}
  // Before step `step` (0, 1, ...): prefetch up to where that step will be, plus the distance.
  HWY_INLINE void Before(int64_t step) {
    const uintptr_t end = base_ + static_cast<uintptr_t>(step + 1) * step_bytes_;
    for (; next_ < end; next_ += 64) hwy::Prefetch(reinterpret_cast<const uint8_t*>(next_));
  }

 private:
  uintptr_t base_;
  uintptr_t next_;
  uintptr_t step_bytes_;
};

HWY_INLINE bool UseRowPrefetcher(const ColumnSlice& slice, int64_t cols, size_t row_bytes) {
  return slice.begin == 0 && slice.end == cols && row_bytes < kPrefetchMaxRowBytes;
}

// ----------------------------------------------------------------------------- weight rows

// Float policies: Load() widens the Lanes(df) values at p to f32; At() one value.
struct F32Row {
  using T = float;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* HWY_RESTRICT p) {
    return hn::LoadU(df, p);
  }
  static HWY_INLINE float At(const T* p) { return *p; }
};
struct F16Row {
  using T = uint16_t;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* HWY_RESTRICT p) {
    return PromoteF16(df, p);
  }
  static HWY_INLINE float At(const T* p) { return f16_to_f32(*p); }
};
struct BF16Row {
  using T = uint16_t;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* HWY_RESTRICT p) {
    return PromoteBF16(df, p);
  }
  static HWY_INLINE float At(const T* p) { return bf16_to_f32(*p); }
};

// ----------------------------------------------------------------------------- int8 blocks

// Dot products of 32-value int8 blocks: the block is kVecs vectors of D8 (int8 lanes), a
// product yields int32 lanes whose total is the dot product.
//   x86 (SSE4, AVX2, AVX-512): pmaddubsw (u8 x s8 -> pairs of i16) + pmaddwd (-> i32), on
//     256-bit vectors from AVX2 up (one block per vector; 512-bit buys nothing here: the
//     per-block scale work dominates). A signed w goes through |w| and sign(x, w).
//     Measured 1.6x faster than widening to int16 (Highway's portable path below).
//   other targets: widen both to int16, ReorderWidenMulAccumulate.
// VNNI (vpdpbusd) is not used here: Highway's AVX3_DL target, whose 1.0.3 flags enable the VEX
// "avxvnni" that Zen 4 and Ice Lake lack (GCC then emits {vex} vpdpbusd: SIGILL). Q8_0 with
// num_x >= 2 on AVX3 CPUs with VNNI runs Q8_0VnniKernel instead (cpu/matmul_vnni.cc), the 4-
// and 5-bit types SmallBlockVnniKernel for any num_x (cpu/matmul_vnni_small_blocks.cc).
// Range: |x| <= 127 (our Q8_0 activations), w in [-128, 127] or unsigned quants in [0, 31]
// (Q4 nibbles, Q5), so the i16 pair sums stay below 2^15 and never saturate.
struct BlockDot {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  using D8 = hn::Full256<int8_t>;
  using D32 = hn::Full256<int32_t>;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  using D8 = hn::Full128<int8_t>;
  using D32 = hn::Full128<int32_t>;
#else
  using D16 = hn::ScalableTag<int16_t>;
  using D8 = hn::Rebind<int8_t, D16>;  // half a vector: widened to D16 before multiplying
  using D32 = hn::Repartition<int32_t, D16>;
#endif
  using DF = hn::Repartition<float, D32>;
  using V8 = hn::Vec<D8>;
  using V32 = hn::Vec<D32>;
  static constexpr size_t kLanes = hn::MaxLanes(D8());
  static constexpr size_t kVecs = kQBlock / kLanes;

  // acc + sum_j w[j] * x[j] as int32 lanes; kSignedW: w in [-128, 127], else in [0, 31].
  template <bool kSignedW>
  static HWY_INLINE V32 Dot(V8 w, V8 x, V32 acc) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
    const V8 u = kSignedW ? hn::Abs(w) : w;  // as u8: |-128| = 128 is right
#if HWY_TARGET <= HWY_AVX2
    const __m256i s = kSignedW ? _mm256_sign_epi8(x.raw, w.raw) : x.raw;
    const __m256i pairs = _mm256_maddubs_epi16(u.raw, s);
    return hn::Add(acc, V32{_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))});
#else
    const __m128i s = kSignedW ? _mm_sign_epi8(x.raw, w.raw) : x.raw;
    return hn::Add(acc, V32{_mm_madd_epi16(_mm_maddubs_epi16(u.raw, s), _mm_set1_epi16(1))});
#endif
#else
    const D16 d16;
    V32 odd = hn::Zero(D32());
    const V32 even = hn::ReorderWidenMulAccumulate(D32(), hn::PromoteTo(d16, w),
                                                   hn::PromoteTo(d16, x), acc, odd);
    return hn::RearrangeToOddPlusEven(even, odd);
#endif
  }
};

// Quantized weight policies. Decode() writes the block's 32 weights (column order) as int8
// lanes into q[0 .. kVecs); the weight is that value plus kOffset.
struct Q8_0Row {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true;
  static constexpr int kOffset = 0;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    constexpr size_t kLanes = hn::MaxLanes(D8());
    for (size_t v = 0; v < kQBlock / kLanes; ++v) q[v] = hn::LoadU(d8, block.qs + v * kLanes);
  }
};
// The 32 nibbles of a Q4_0-style qs[16] (byte j: column j low, column j + 16 high) as int8
// lanes 0..15 into q[0 .. 32 / Lanes(d8)).
template <class D8>
HWY_INLINE void DecodeNibbles(D8 d8, const uint8_t* HWY_RESTRICT qs, hn::Vec<D8>* q) {
  constexpr size_t kLanes = hn::MaxLanes(D8());
  const hn::RebindToUnsigned<D8> du8;
  const auto mask = hn::Set(du8, 0xF);
  if constexpr (kLanes <= 16) {
    for (size_t v = 0; v < 16 / kLanes; ++v) {
      const auto bytes = hn::LoadU(du8, qs + v * kLanes);
      q[v] = hn::BitCast(d8, hn::And(bytes, mask));
      q[v + 16 / kLanes] = hn::BitCast(d8, hn::ShiftRight<4>(bytes));
    }
  } else {
#if HWY_TARGET != HWY_SCALAR  // (no Combine there; this branch needs 32 lanes anyway)
    // One vector holds the block: low nibbles -> lower half, high nibbles -> upper half.
    const hn::Half<decltype(du8)> dh;
    const auto bytes = hn::LoadU(dh, qs);
    const auto high = hn::BitCast(
        dh, hn::ShiftRight<4>(hn::BitCast(hn::RepartitionToWide<decltype(dh)>(), bytes)));
    q[0] = hn::BitCast(d8, hn::And(hn::Combine(du8, high, bytes), mask));
#endif
  }
}

// Q5_0 / Q5_1: ORs 0x10 into column j where bit j of qh (32 bits, little endian) is set.
// A mask load per vector (AVX-512: one kmov; AVX2/SSE4: broadcast, shuffle, compare).
template <class D8>
HWY_INLINE void AddFifthBits(D8 d8, const uint8_t* HWY_RESTRICT qh, hn::Vec<D8>* q) {
  constexpr size_t kLanes = hn::MaxLanes(D8());
  const hn::RebindToUnsigned<D8> du8;
  const auto bit4 = hn::Set(du8, 0x10);
  for (size_t v = 0; v < kQBlock / kLanes; ++v) {
    hn::Vec<decltype(du8)> high;
    if constexpr (kLanes % 8 == 0) {
      high = hn::IfThenElseZero(hn::LoadMaskBits(du8, qh + v * kLanes / 8), bit4);
    } else {  // fewer than 8 lanes (HWY_SCALAR): lane by lane
      uint8_t bytes[kLanes];
      for (size_t l = 0; l < kLanes; ++l) {
        const size_t j = v * kLanes + l;
        bytes[l] = static_cast<uint8_t>(((qh[j / 8] >> (j % 8)) & 1) << 4);
      }
      high = hn::LoadU(du8, bytes);
    }
    q[v] = hn::BitCast(d8, hn::Or(hn::BitCast(du8, q[v]), high));
  }
}

// IQ4_NL: indices 0..15 -> kIQ4NLValues, a byte shuffle within each 128-bit block.
template <class D8>
HWY_INLINE void LookUpIQ4NL(D8 d8, hn::Vec<D8>* q) {
  constexpr size_t kLanes = hn::MaxLanes(D8());
  if constexpr (kLanes >= 16) {
    const auto table = hn::LoadDup128(d8, kIQ4NLValues);
    for (size_t v = 0; v < kQBlock / kLanes; ++v) q[v] = hn::TableLookupBytes(table, q[v]);
  } else {  // partial vectors (portable targets): lane by lane
    const hn::RebindToUnsigned<D8> du8;
    for (size_t v = 0; v < kQBlock / kLanes; ++v) {
      uint8_t index[kLanes];
      int8_t value[kLanes];
      hn::StoreU(hn::BitCast(du8, q[v]), du8, index);
      for (size_t l = 0; l < kLanes; ++l) value[l] = kIQ4NLValues[index[l]];
      q[v] = hn::LoadU(d8, value);
    }
  }
}

struct Q4_0Row {
  using Block = BlockQ4_0;
  static constexpr bool kSigned = false;  // nibbles 0..15
  static constexpr int kOffset = -8;
  static constexpr vnni::SmallBlockFormat kVnniFormat = vnni::SmallBlockFormat::kQ4_0;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    DecodeNibbles(d8, block.qs, q);
  }
};
// Policies with a Min(block): the weight is d * (value + kOffset) + Min(block). kVnniFormat:
// the block layout for the AVX-512 VNNI tiles (cpu/matmul_vnni_small_blocks.cc).
struct Q4_1Row {
  using Block = BlockQ4_1;
  static constexpr bool kSigned = false;  // nibbles 0..15
  static constexpr int kOffset = 0;
  static constexpr vnni::SmallBlockFormat kVnniFormat = vnni::SmallBlockFormat::kQ4_1;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    DecodeNibbles(d8, block.qs, q);
  }
  static HWY_INLINE float Min(const Block& block) { return F16ToF32(&block.m); }
};
struct Q5_0Row {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = false;  // 0..31
  static constexpr int kOffset = -16;
  static constexpr vnni::SmallBlockFormat kVnniFormat = vnni::SmallBlockFormat::kQ5_0;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    DecodeNibbles(d8, block.qs, q);
    AddFifthBits(d8, block.qh, q);
  }
};
struct Q5_1Row {
  using Block = BlockQ5_1;
  static constexpr bool kSigned = false;  // 0..31
  static constexpr int kOffset = 0;
  static constexpr vnni::SmallBlockFormat kVnniFormat = vnni::SmallBlockFormat::kQ5_1;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    DecodeNibbles(d8, block.qs, q);
    AddFifthBits(d8, block.qh, q);
  }
  static HWY_INLINE float Min(const Block& block) { return F16ToF32(&block.m); }
};
struct IQ4_NLRow {
  using Block = BlockIQ4_NL;
  static constexpr bool kSigned = true;  // table values -127..113
  static constexpr int kOffset = 0;
  static constexpr vnni::SmallBlockFormat kVnniFormat = vnni::SmallBlockFormat::kIQ4_NL;
  template <class D8>
  static HWY_INLINE void Decode(D8 d8, const Block& block, hn::Vec<D8>* q) {
    DecodeNibbles(d8, block.qs, q);
    LookUpIQ4NL(d8, q);
  }
};

// Whether the weight type has a per-block minimum (Row::Min).
template <class Row>
inline constexpr bool kRowHasMin = requires(const typename Row::Block& block) {
  Row::Min(block);
};

// Whether the weight type has prefill tiles for AVX-512 VNNI (Row::kVnniFormat).
template <class Row>
inline constexpr bool kRowHasVnni = requires {
  Row::kVnniFormat;
};

// ----------------------------------------------------------------------------- tiles

// Float weights: y[x0 + i][r0 + r] for r < kW, i < kX. Per Lanes(df) columns: kW weight
// loads (+ widening), kX activation loads, kW * kX FMAs; the rest (< Lanes) in scalar code.
template <class Row>
struct FloatKernel {
  using T = typename Row::T;
  const uint8_t* w;  // rows * row_bytes bytes
  size_t row_bytes;  // cols * sizeof(T)
  int64_t rows, cols;
  const float* x;  // [num_x][cols]
  float* y;        // [num_x][rows]

  template <int kW, int kX>
  HWY_INLINE void Tile(int64_t r0, int64_t x0, ColumnSlice slice) const {
    const hn::ScalableTag<float> df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    const T* w_rows[kW];
    for (int r = 0; r < kW; ++r) {
      w_rows[r] = reinterpret_cast<const T*>(w + static_cast<size_t>(r0 + r) * row_bytes);
    }
    const float* x_rows[kX];
    for (int i = 0; i < kX; ++i) x_rows[i] = x + (x0 + i) * cols;

    hn::Vec<decltype(df)> acc[kX][kW];
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) acc[i][r] = hn::Zero(df);
    }
    const bool prefetch = UseRowPrefetcher(slice, cols, row_bytes);
    RowPrefetcher prefetcher(w_rows[0], static_cast<int64_t>(kW * N * sizeof(T)));
    int64_t c = slice.begin;
    for (; c + N <= slice.end; c += N) {
      if (prefetch) prefetcher.Before(c / N);
      hn::Vec<decltype(df)> xv[kX];
      for (int i = 0; i < kX; ++i) xv[i] = hn::LoadU(df, x_rows[i] + c);
      for (int r = 0; r < kW; ++r) {
        const auto wv = Row::Load(df, w_rows[r] + c);
        for (int i = 0; i < kX; ++i) acc[i][r] = hn::MulAdd(wv, xv[i], acc[i][r]);
      }
    }
    float tail[kX][kW] = {};
    for (; c < slice.end; ++c) {
      for (int r = 0; r < kW; ++r) {
        const float wc = Row::At(w_rows[r] + c);
        for (int i = 0; i < kX; ++i) tail[i][r] += wc * x_rows[i][c];
      }
    }
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) {
        StoreOutput(&y[(x0 + i) * rows + r0 + r], ReduceSum(df, acc[i][r]) + tail[i][r],
                    slice.accumulate);
      }
    }
  }
};

// Quantized weights against Q8_0 activations. Per 32-column block and weight row: one block
// decode (shared by the kX activation rows); per activation row BlockDot::kVecs int8 dot
// products into int32 lanes (Q4_0 / Q5_0: plus kOffset * x per lane, computed once per
// activation block), one int->float conversion and one FMA with d_w * d_x; with a minimum
// (Q4_1 / Q5_1) one scalar FMA m_w * x.s per block more.
template <class Row>
struct QuantKernel {
  using Block = typename Row::Block;
  const uint8_t* w;  // rows * row_bytes bytes
  size_t row_bytes;  // cols / 32 * sizeof(Block)
  int64_t rows, cols;
  QuantizedActivations x;
  float* y;  // [num_x][rows]

  template <int kW, int kX>
  HWY_INLINE void Tile(int64_t r0, int64_t x0, ColumnSlice slice) const {
    using Dot = BlockDot;
    const typename Dot::D8 d8;
    const typename Dot::D32 d32;
    const typename Dot::DF df;
    constexpr size_t kVecs = Dot::kVecs;
    const int64_t num_blocks = cols / kQBlock;

    const Block* w_rows[kW];
    for (int r = 0; r < kW; ++r) {
      w_rows[r] = reinterpret_cast<const Block*>(w + static_cast<size_t>(r0 + r) * row_bytes);
    }
    const int8_t* xq[kX];
    const float* xd[kX];
    for (int i = 0; i < kX; ++i) {
      xq[i] = x.q + (x0 + i) * cols;
      xd[i] = x.d + (x0 + i) * num_blocks;
    }

    hn::Vec<decltype(df)> acc[kX][kW];
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) acc[i][r] = hn::Zero(df);
    }
    constexpr bool kHasMin = kRowHasMin<Row>;
    float min_acc[kX][kW] = {};  // sum over blocks of m_w * x.s (kHasMin)
    const bool prefetch = UseRowPrefetcher(slice, cols, row_bytes);
    RowPrefetcher prefetcher(w_rows[0], kW * sizeof(Block));
    for (int64_t b = slice.begin / kQBlock; b < slice.end / kQBlock; ++b) {
      if (prefetch) prefetcher.Before(b);
      // The activation blocks, loaded once for the kW weight rows.
      hn::Vec<decltype(d8)> xv[kX][kVecs];
      for (int i = 0; i < kX; ++i) {
        for (size_t v = 0; v < kVecs; ++v)
          xv[i][v] = hn::LoadU(d8, xq[i] + b * kQBlock + v * Dot::kLanes);
      }
      // Weights stored as value - kOffset: subtract kOffset * x per lane, so that every int32
      // lane holds its exact partial dot product (no cancellation after the float conversion).
      hn::Vec<decltype(d32)> offset[kX];
      for (int i = 0; i < kX; ++i) {
        offset[i] = hn::Zero(d32);
        if constexpr (Row::kOffset != 0) {
          const auto k = hn::Set(d8, static_cast<int8_t>(-Row::kOffset));
          for (size_t v = 0; v < kVecs; ++v)
            offset[i] = Dot::template Dot<false>(k, xv[i][v], offset[i]);
          offset[i] = hn::Neg(offset[i]);
        }
      }
      for (int r = 0; r < kW; ++r) {
        const Block& block = w_rows[r][b];
        hn::Vec<decltype(d8)> wq[kVecs];
        Row::Decode(d8, block, wq);
        const float d_w = F16ToF32(&block.d);  // (reads into qs: fine, blocks are >= 18 bytes)
        for (int i = 0; i < kX; ++i) {
          auto sum = offset[i];
          for (size_t v = 0; v < kVecs; ++v)
            sum = Dot::template Dot<Row::kSigned>(wq[v], xv[i][v], sum);
          acc[i][r] = hn::MulAdd(hn::ConvertTo(df, sum), hn::Set(df, d_w * xd[i][b]), acc[i][r]);
        }
        if constexpr (kHasMin) {
          const float m_w = Row::Min(block);
          for (int i = 0; i < kX; ++i) min_acc[i][r] += m_w * x.s[(x0 + i) * num_blocks + b];
        }
      }
    }
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) {
        StoreOutput(&y[(x0 + i) * rows + r0 + r], ReduceSum(df, acc[i][r]) + min_acc[i][r],
                    slice.accumulate);
      }
    }
  }
};

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
// Q8_0 on AVX-512 CPUs with VNNI (vnni::supported()): whole tasks run in cpu/matmul_vnni.cc.
struct Q8_0VnniKernel {
  vnni::Q8_0Problem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::q8_0_rows(problem, r_begin, r_end, num_x);
  }
};
// Q8_0 packed by pack_for_matmul(), same CPUs: tasks of whole 16-row groups.
struct PackedQ8_0VnniKernel {
  static constexpr int64_t kRowAlign = 16;
  vnni::PackedQ8_0Problem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::packed_q8_0_groups(problem, r_begin / kRowAlign, (r_end + kRowAlign - 1) / kRowAlign,
                             num_x);
  }
};
#endif

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL on AVX-512 CPUs with VNNI (measured single-threaded on the
// Zen 4 VM, decode 4096x11008 .. 11008x4096: 1.3-1.9x the QuantKernel tiles' GB/s).
struct SmallBlockVnniKernel {
  vnni::SmallBlockProblem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::small_block_rows(problem, r_begin, r_end, num_x);
  }
};
// The same types packed by pack_for_matmul(), any num_x: tasks of whole 16-row groups.
struct PackedSmallBlockVnniKernel {
  static constexpr int64_t kRowAlign = 16;
  vnni::SmallBlockProblem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::packed_small_block_groups(problem, r_begin / kRowAlign,
                                    (r_end + kRowAlign - 1) / kRowAlign, num_x);
  }
};
// Unpacked, from kMinSmallBlockGroupRows activation rows on: tasks of whole 16-row groups,
// each group's weights decoded once per column slice for all activation rows.
struct SmallBlockGroupVnniKernel {
  static constexpr int64_t kRowAlign = 16;
  vnni::SmallBlockProblem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::small_block_groups(problem, r_begin / kRowAlign, (r_end + kRowAlign - 1) / kRowAlign,
                             num_x);
  }
};
// Measured single-threaded on the Zen 4 VM (4096x4096), GFLOP/s rows vs groups: Q4_0 2 rows
// 75 / 64-79, 3: 94 / 98, 4: 102 / 137, 64: 179 / 350; Q5_1 3 rows 63 / 58, 4: 75 / 82.
inline constexpr int64_t kMinSmallBlockGroupRows = 4;
#endif

// factor * (the sum of each 32-value block's q), int32 per block.
inline std::vector<int32_t> ScaledBlockSums(const std::vector<int8_t>& q, int32_t factor) {
  std::vector<int32_t> sums(q.size() / kQBlock);
  for (size_t k = 0; k < sums.size(); ++k) {
    int32_t sum = 0;
    for (int64_t j = 0; j < kQBlock; ++j) sum += q[k * kQBlock + j];
    sums[k] = factor * sum;
  }
  return sums;
}

// ----------------------------------------------------------------------------- driver

// Weight rows [r_begin, r_end) x activation rows [x0, x0 + kX): full kW tiles, then single rows.
template <int kW, int kX, class Kernel>
HWY_INLINE void TileRows(const Kernel& kernel, int64_t r_begin, int64_t r_end, int64_t x0,
                         ColumnSlice slice) {
  int64_t r = r_begin;
  for (; r + kW <= r_end; r += kW) kernel.template Tile<kW, kX>(r, x0, slice);
  for (; r < r_end; ++r) kernel.template Tile<1, kX>(r, x0, slice);
}

// The last num_x_left < kPrefillRowsX activation rows: one TileRows<kPrefillRowsW, num_x_left>.
template <int kX, class Kernel>
HWY_INLINE void TileRowsRemainder(const Kernel& kernel, int64_t r_begin, int64_t r_end, int64_t x0,
                                  int64_t num_x_left, ColumnSlice slice) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) {
      TileRows<kPrefillRowsW, kX>(kernel, r_begin, r_end, x0, slice);
    } else {
      TileRowsRemainder<kX - 1>(kernel, r_begin, r_end, x0, num_x_left, slice);
    }
  }
}

// Weight rows [r_begin, r_end) x all activation rows. Decode: one pass over whole rows.
// Prefill: column slices outer, then x tiles, then weight rows: the task's weights
// (kTaskBytes) come from DRAM once and are re-read from L2 for every x tile, the x tile's
// slice stays in L1.
template <class Kernel>
HWY_NOINLINE void RunRows(const Kernel& kernel, int64_t r_begin, int64_t r_end, int64_t num_x) {
  if constexpr (requires { kernel.Rows(r_begin, r_end, num_x); }) {
    kernel.Rows(r_begin, r_end, num_x);  // a kernel with its own tiling
  } else if (num_x == 1) {
    TileRows<kDecodeRowsW, 1>(kernel, r_begin, r_end, 0, ColumnSlice{0, kernel.cols, false});
  } else {
    for (int64_t c0 = 0; c0 < kernel.cols; c0 += kPrefillCols) {
      const ColumnSlice slice{c0, std::min(kernel.cols, c0 + kPrefillCols), c0 != 0};
      int64_t x0 = 0;
      for (; x0 + kPrefillRowsX <= num_x; x0 += kPrefillRowsX) {
        TileRows<kPrefillRowsW, kPrefillRowsX>(kernel, r_begin, r_end, x0, slice);
      }
      if (x0 < num_x)
        TileRowsRemainder<kPrefillRowsX - 1>(kernel, r_begin, r_end, x0, num_x - x0, slice);
    }
  }
}

// Splits the weight rows into tasks of ~kTaskBytes of weights per pass (a whole row for
// decode, a kPrefillCols slice for prefill) and runs them on the pool (the calling thread takes
// part), or all on the calling thread when the matmul is small. The task size is also the
// cache blocking, so it is the same with one thread.
template <class Kernel>
void Run(const Kernel& kernel, int64_t num_x, ThreadPool& pool) {
  const int64_t rows = kernel.rows;
  if (rows <= 0 || num_x <= 0) return;
  int64_t rows_w = num_x == 1 ? kDecodeRowsW : kPrefillRowsW;
  if constexpr (requires { Kernel::kRowAlign; }) rows_w = Kernel::kRowAlign;
  const int64_t pass_cols = num_x == 1 ? kernel.cols : std::min(kernel.cols, kPrefillCols);
  const int64_t pass_bytes = std::max<int64_t>(
      1, static_cast<int64_t>(kernel.row_bytes) * pass_cols / std::max<int64_t>(1, kernel.cols));
  int64_t rows_per_task = std::clamp<int64_t>(kTaskBytes / pass_bytes, 1, kMaxTaskRows);
  if constexpr (requires { Kernel::kTaskRows; }) rows_per_task = Kernel::kTaskRows;
  const bool parallel = pool.num_threads() > 1 && rows * kernel.cols * num_x >= kMinParallelMacs;
  if (parallel) {
    // At least ~4 tasks per thread, for balance on small matrices.
    const int64_t balanced = (rows + 4 * pool.num_threads() - 1) / (4 * pool.num_threads());
    rows_per_task = std::min(rows_per_task, balanced);
  }
  rows_per_task = (rows_per_task + rows_w - 1) / rows_w * rows_w;  // whole tiles
  const int64_t num_tasks = (rows + rows_per_task - 1) / rows_per_task;
  const auto run_tasks = [&](int64_t begin, int64_t end) HWY_ATTR {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r_begin = task * rows_per_task;
      RunRows(kernel, r_begin, std::min(rows, r_begin + rows_per_task), num_x);
    }
  };
  if (parallel && num_x == 1) {
    // Decode streams from DRAM: each thread walks one contiguous run of tasks in order, which
    // keeps the hardware prefetchers on long linear streams, and takes over the end of the
    // other's run when it finishes first (a vCPU slowed by its neighbour is not waited for).
    pool.parallel_for_shares(num_tasks, run_tasks);
  } else if (parallel) {
    // Prefill tasks are cache-blocked and uneven: handed out one at a time.
    pool.parallel_for(num_tasks, run_tasks, 1);
  } else {
    run_tasks(0, num_tasks);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
// F32 / F16 / BF16 prefill on AVX-512 CPUs: whole tasks run in cpu/matmul_float_avx512.cc.
struct FloatAvx512Kernel {
  static constexpr int64_t kRowAlign = avx512::kPanelRows;
  // Tasks of 4 panels: each panel's weights are prefetched while the tiles run on the one
  // before, so only a task's first comes from DRAM unannounced.
  static constexpr int64_t kTaskRows = 4 * avx512::kPanelRows;
  avx512::FloatProblem problem;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t) const {
    avx512::float_rows(problem, r_begin, r_end);
  }
};
// F16 / BF16 weights packed by pack_for_matmul(), any number of activation rows: tasks of whole
// packed groups.
struct PackedFloatAvx512Kernel {
  static constexpr int64_t kRowAlign = avx512::kPackedGroupRows;
  avx512::FloatProblem problem;
  const float* x;
  size_t row_bytes;
  int64_t rows, cols;
  void Rows(int64_t r_begin, int64_t r_end, int64_t) const {
    avx512::packed_float_groups(problem, x, r_begin / kRowAlign,
                                (r_end + kRowAlign - 1) / kRowAlign);
  }
};
// From this many activation rows on. Below, the dot-product tiles are faster: the packing
// streams the weights at about half their rate, which the fewer FMAs per weight do not hide
// (measured single-threaded, F16 4096x4096: 0.5x at 8 rows, even at 32, 1.15x at 48, 1.25x at 64).
inline constexpr int64_t kMinFloatAvx512Rows = 40;

template <class Row>
inline constexpr avx512::FloatFormat kFloatFormat =
    std::is_same_v<Row, F32Row>   ? avx512::FloatFormat::kF32
    : std::is_same_v<Row, F16Row> ? avx512::FloatFormat::kF16
                                  : avx512::FloatFormat::kBF16;
#endif

template <class Row>
void MatmulFloat(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
  if (packed_bytes(w) != nullptr && avx512::supported()) {
    const size_t bytes = row_bytes(w.dtype, w.cols);
    const PackedFloatAvx512Kernel kernel{{.format = kFloatFormat<Row>,
                                          .w = packed_bytes(w),
                                          .row_bytes = bytes,
                                          .rows = w.rows,
                                          .cols = w.cols,
                                          .xp = nullptr,
                                          .num_x = num_x,
                                          .y = y},
                                         x,
                                         bytes,
                                         w.rows,
                                         w.cols};
    return Run(kernel, num_x, pool);
  }
  if (num_x >= kMinFloatAvx512Rows && w.rows > 0 && w.cols > 0 && avx512::supported()) {
    const auto xp = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(num_x * w.cols));
    const int64_t num_tiles = avx512::num_activation_tiles(num_x);
    const auto pack = [&](int64_t begin, int64_t end) HWY_ATTR {
      avx512::pack_activations(x, num_x, w.cols, xp.get(), begin, end);
    };
    if (num_tiles > 1 && pool.num_threads() > 1 && num_x * w.cols >= kMinParallelQuantize) {
      pool.parallel_for(num_tiles, pack);
    } else {
      pack(0, num_tiles);
    }
    const size_t bytes = row_bytes(w.dtype, w.cols);
    const FloatAvx512Kernel kernel{{kFloatFormat<Row>, static_cast<const uint8_t*>(w.data), bytes,
                                    w.rows, w.cols, xp.get(), num_x, y},
                                   bytes,
                                   w.rows,
                                   w.cols};
    return Run(kernel, num_x, pool);
  }
#endif
  const FloatKernel<Row> kernel{
      static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, w.cols), w.rows, w.cols, x, y};
  Run(kernel, num_x, pool);
}

// x is quantized to Q8_0 first (as ggml does): num_x * cols * 1.125 bytes of scratch (+ 4 bytes
// per block of sums for weights with a minimum), ~20 ns per 32 values, parallel over x rows
// when there are many.
template <class Row>
void MatmulQuant(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  const int64_t num_blocks = w.cols / kQBlock;
  std::vector<int8_t> q(static_cast<size_t>(num_x * w.cols));
  std::vector<float> d(static_cast<size_t>(num_x * num_blocks));
  std::vector<float> sums(kRowHasMin<Row> ? static_cast<size_t>(num_x * num_blocks) : 0);
  const auto quantize_rows = [&](int64_t begin, int64_t end) HWY_ATTR {
    for (int64_t i = begin; i < end; ++i) {
      QuantizeRowQ8_0(x + i * w.cols, num_blocks, q.data() + i * w.cols, d.data() + i * num_blocks,
                      kRowHasMin<Row> ? sums.data() + i * num_blocks : nullptr);
    }
  };
  if (num_x > 1 && pool.num_threads() > 1 && num_x * w.cols >= kMinParallelQuantize) {
    pool.parallel_for(num_x, quantize_rows);
  } else {
    quantize_rows(0, num_x);
  }
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
  if constexpr (std::is_same_v<Row, Q8_0Row>) {
    if (packed_bytes(w) != nullptr && vnni::supported()) {
      // The weights' +128 bias times each activation block's sum, subtracted up front.
      const std::vector<int32_t> xsum = ScaledBlockSums(q, -128);
      const PackedQ8_0VnniKernel kernel{
          {packed_bytes(w), w.rows, w.cols, q.data(), d.data(), xsum.data(), y},
          row_bytes(w.dtype, w.cols),
          w.rows,
          w.cols};
      return Run(kernel, num_x, pool);
    }
    if (num_x >= 2 && vnni::supported()) {
      const size_t bytes = row_bytes(w.dtype, w.cols);
      const Q8_0VnniKernel kernel{
          {static_cast<const uint8_t*>(w.data), bytes, w.rows, w.cols, q.data(), d.data(), y},
          bytes,
          w.rows,
          w.cols};
      return Run(kernel, num_x, pool);
    }
  }
#endif
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3
  if constexpr (kRowHasVnni<Row>) {
    if (vnni::supported()) {
      const size_t bytes = row_bytes(w.dtype, w.cols);
      vnni::SmallBlockProblem problem{Row::kVnniFormat,
                                      static_cast<const uint8_t*>(w.data),
                                      bytes,
                                      w.rows,
                                      w.cols,
                                      q.data(),
                                      d.data(),
                                      sums.data(),
                                      y};
      const bool packed = packed_bytes(w) != nullptr;
      if (packed || num_x >= kMinSmallBlockGroupRows) {
        constexpr int32_t kOffset = vnni::level_offset(Row::kVnniFormat);
        const std::vector<int32_t> offset_sums =
            kOffset != 0 ? ScaledBlockSums(q, kOffset) : std::vector<int32_t>();
        problem.offset_sums = offset_sums.data();
        if (packed) {
          problem.w = packed_bytes(w);
          return Run(PackedSmallBlockVnniKernel{problem, bytes, w.rows, w.cols}, num_x, pool);
        }
        return Run(SmallBlockGroupVnniKernel{problem, bytes, w.rows, w.cols}, num_x, pool);
      }
      return Run(SmallBlockVnniKernel{problem, bytes, w.rows, w.cols}, num_x, pool);
    }
  }
#endif
  const QuantKernel<Row> kernel{static_cast<const uint8_t*>(w.data),
                                row_bytes(w.dtype, w.cols),
                                w.rows,
                                w.cols,
                                QuantizedActivations{q.data(), d.data(), sums.data()},
                                y};
  Run(kernel, num_x, pool);
}

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SIEVE_KERNELS_CPU_MATMUL_INL_H_ toggle
