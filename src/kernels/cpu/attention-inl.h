// One file above the ~800-line guideline on purpose: a Highway per-target kernel family that is
// included once per target; its tile walk, online softmax and observation passes share state.
//
// Per-target paged attention kernels (FlashAttention-2 style). Included once per Highway target
// (toggle guard). The work split is cpu/attention_plan.cc; the scalar reference is
// paged_attention_ref.cc.
//
// One task (cpu/attention.h) = query rows [r0, r1) x kv heads [h0, h1) x keys [k0, k1). Its
// query vectors are staged once, pre-scaled, into a zero-padded [vectors][dp] buffer; vector
// b * per_head + r * group + g is row r0 + r of query head (h0 + b) * group + g. The keys are
// walked in tiles of kTileKeys; a unit of work is one tile of one kv head, in the order
// (tile 0, h0), (tile 0, h0 + 1), ..., (tile 1, h0), ... so that a decode task sweeps each page
// through all its heads. A tile is a few runs, one per page it touches (a run's K rows are
// contiguous). Per unit, for the per_head = (r1 - r0) * group query vectors of that kv head:
//
//   QK       S[m][t] = q_m · k_t        QkTile<kM, 4>: kM query vectors x 4 keys, lanes along
//                                       head_dim; Reduce4 folds the 4 accumulators of a query
//                                       into its 4 scores (3 shuffle + add levels, not 4
//                                       horizontal sums)
//   softmax  mask keys > position (-inf); per m: new max, alpha = exp(old max - new max),
//            P = exp(S - new max) (vector Exp over the tile), sum = sum * alpha + sum(P)
//   PV       acc[m] = alpha[m] * acc[m] + P[m] · V    PvTile<kM, kC>: kM query vectors x kC
//                                       vectors of head_dim, each V load used kM times
//
// Long jobs (prefill chunks: more than kAttentionInvariantRows rows) on f32 / f16 pools with
// AVX-512 take a faster variant of the same steps, whose sums run in another order: 128-key
// tiles (kLongTileKeys), QK with the keys along the lanes (QkKeysInLanes: the tile's K
// transposed once, no horizontal sums), the scores' exp by ExpOfScores, P·V 6 query vectors at
// a time (f16 V widened once per tile). Decode and verification rows never take it, so they
// stay the same bits alone and in any batch. With AttentionQuery::prefill_dots on an
// AVX512-BF16 CPU, the tile's P·V (and Q·K) run as bf16 dot products instead (Bf16Unit,
// cpu/attention_bf16.h).
//
// Short jobs (decode, verification: row-invariant plans) on f32 / f16 pools take whole chunks
// instead of tiles (AttendChunks): all the scores of a task's piece of keys, one softmax step,
// then P·V; QK as above (QkTile), the exp by ExpOfScores.
//
// At the end: out = acc / sum, row_max = max, lse = max + log(sum); or, for a split task, the
// (max, sum, acc) state goes to a partial slot and MergeSplits combines the slots:
//   max = max_j max_j,  w_j = exp(max_j - max),  sum = sum_j w_j sum_j,
//   out = sum_j w_j acc_j / sum
//
// Quantized pools (kQ8_0 / kQ4_1, layout in paged_attention.h): the staged queries are rounded to
// Q8_0 blocks (block_kv_query). Row-invariant jobs (decode, verification) on AVX3 with VNNI run
// QK and PV of a unit in cpu/attention_vnni.cc (int8 scores straight from the K rows, V widened
// in registers; the queries quantized and laid out once per task), in another order: head by
// head, in tiles of 2-4 pages with software prefetch (RunTask). Otherwise each unit first
// dequantizes its tile's K and V rows (SIMD, DequantizeKvRow) into two per-thread
// [tile keys][head_dim] buffers and runs the above on them as one run, long jobs with keys in
// lanes as f16 pools do; the rest is the f32 path. The dequantization costs ~2-3 vector ops per
// Lanes values per unit, shared by all query vectors of the kv head. (Long jobs took the VNNI
// path until 2026-12-06: its P·V widens each V row again for every set of 4 query vectors, and
// eval-32k's 16k prefill on q8 pages ran 1.6x as long as on f16 ones.)
//
// Cost per unit and query vector: 2 * tile keys * head_dim FMAs + one Exp per tile vector.
// Memory: scratch of vectors * (2 * dp + tp + 3) floats per thread (~40 KiB at 32 vectors,
// head_dim 128), + 2 * kTileKeys * head_dim floats for quantized pools (32 KiB at 128).
#if defined(SIEVE_KERNELS_CPU_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIEVE_KERNELS_CPU_ATTENTION_INL_H_
#undef SIEVE_KERNELS_CPU_ATTENTION_INL_H_
#else
#define SIEVE_KERNELS_CPU_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_vnni.h"
#include "kernels/cpu/matmul_vnni.h"
#include "kernels/cpu/ops-inl.h"
#include "kernels/cpu/targets.h"
#include "kernels/cpu/transpose16x16.h"
#include "kernels/paged_attention.h"
#include "util/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace attention {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Keys per online-softmax step: 2 pages of 16; K and V tiles of 16 KiB each at head_dim 128.
inline constexpr int64_t kTileKeys = 32;
// Long jobs (not row-invariant) on f32 / f16 pools where keys go in lanes (kKeysInLanes): up to
// 8-page tiles, so the online softmax's per-tile work (maxima, rescale factors, acc rescaling) is
// paid once per 128 keys (64 before: the 57M model's dense 16k prefill 11.54-11.69 -> 10.90-11.13
// s, 2-core Xeon; scratch per thread then ~300 KiB at 256 query vectors, head_dim 64). At
// head_dim 128 the transposed tile would pass L1 (LongTileKeys): 64 keys (attention_bench
// Prefill/AVX3/n:2048 227-231 GFLOP/s with 128, 241-245 with 64).
inline constexpr int64_t kLongTileKeys = 128;
// At most this many runs (pages) per tile: a page of one slot makes one run per key.
inline constexpr int64_t kMaxRuns = kLongTileKeys;
// Register tiles. AVX-512 has 32 vector registers, the other targets 16:
//   QK: kQkRows x 4 accumulators + 4 key vectors + 1 query vector
//   PV: kPvRows x kPvChunks accumulators + kPvChunks value vectors + 1 broadcast
inline constexpr int kQkRows = HWY_TARGET <= HWY_AVX3 ? 4 : 2;
// PV: on AVX-512, 4 query vectors x 4 vectors of columns, so that a decode row's GQA group of 4
// loads (and, f16, widens) each V vector once instead of twice (2 x 8 before: f32 decode at
// 1k keys 25% and prefill 10-20% faster in attention_bench, f16 within noise).
inline constexpr int kPvRows = HWY_TARGET <= HWY_AVX3 ? 4 : 2;
// Long jobs (prefill chunks) on AVX-512 score a tile with its keys along the lanes (QkKeysInLanes
// below) when a kv head has at least this many query vectors in the task to share the tile's
// transpose.
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX2
inline constexpr bool kKeysInLanes = true;
#else
inline constexpr bool kKeysInLanes = false;
#endif
inline constexpr int64_t kKeysInLanesMinVectors = 8;
inline constexpr int kPvChunks = 4;
// Software prefetch: for tasks of several kv heads (dense layers), none: paced prefetching of
// the next unit's K/V rows (as the matmul does) or of V during QK, or of the next tiles,
// measured neutral to 5% slower on Zen 4, DRAM- or L3-resident; what helps is the order of the
// reads (TileKeys below). Decode tasks of one kv head (a compressed sequence's streams) read
// one head's page-long slices, 4 KiB apart at best (f32, head_dim 64), which the hardware
// prefetchers of Zen 4 do not run ahead of: there (one_head_kv_prefetch) AttendChunks
// prefetches the K and V slices kOneHeadPrefetchPages pages ahead. A 1024-key stream on every
// other slice, evicted from the caches (attention_bench-like, one thread, Zen 4): ~70-110 us
// without, ~45 us 2 pages ahead, ~50 us 1 ahead; into L2 (T1) or the whole task up front,
// 55-70 us.
inline constexpr int64_t kOneHeadPrefetchPages = 2;
// ...and kOneHeadFarPrefetchPages ahead into L2 as well. The L1 prefetches alone seem to keep
// too few lines in flight for a core to draw K/V from DRAM at its rate (as if L1's few miss
// buffers were the limit; this VM has no counters to tell), and Zen 4 is reported to drop some
// L2 prefetches, which the L1 prefetch 2 pages ahead then makes up for. The 57M
// model's steady decode at 16k, 1k keys, f32 KV, against a depth-0 twin
// (bench-engine --depth-twin, Zen 4, 18 runs before, 6 after): streaming 0.66-0.74x ->
// 0.77-0.81x, snapkv 0.65-0.72x -> 0.71-0.76x; 3, 6, 10 or 16 pages ahead gained less.
inline constexpr int64_t kOneHeadFarPrefetchPages = 4;
// Row-invariant jobs on f32 / f16 pools (AttendChunks): at most this many pages per chunk.
inline constexpr int64_t kMaxChunkPages = 64;
// Quantized pools on AVX3 with VNNI (RunTask): keys per tile at most (Q4_1: 4 pages of 16;
// Q8_0 half that), and tiles prefetched this many tiles ahead.
inline constexpr int64_t kVnniTileKeys = 64;
inline constexpr int64_t kPrefetchTiles = 1;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Consecutive keys of one page: K row j at k + j * head_dim (V likewise); their scores are
// columns [col, col + count) of the tile.
// T: the pool's element type, float or uint16_t (IEEE half).
template <typename T>
struct KeyRun {
  const T* k;
  const T* v;
  int64_t col;
  int64_t count;
};

// Lanes(DF) K/V values at p as f32, and the first `count` of them (the rest 0), not reading
// past p + count.
HWY_INLINE VF LoadKv(DF d, const float* HWY_RESTRICT p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadKv(DF d, const uint16_t* HWY_RESTRICT p) { return PromoteF16(d, p); }
HWY_INLINE VF LoadKvTail(DF d, const float* HWY_RESTRICT p, size_t count) {
  return LoadTail(d, p, count, 0.0f);
}
HWY_INLINE VF LoadKvTail(DF d, const uint16_t* HWY_RESTRICT p, size_t count) {
  uint16_t padded[hn::MaxLanes(DF())] = {};
  std::copy(p, p + count, padded);
  return PromoteF16(d, padded);
}

// The pool's K and V base (page id 0) as T.
template <typename T>
HWY_INLINE const T* KBase(const PagedKv& kv) {
  if constexpr (std::is_same_v<T, float>) {
    return kv.k;
  } else {
    return kv.k_f16;
  }
}
template <typename T>
HWY_INLINE const T* VBase(const PagedKv& kv) {
  if constexpr (std::is_same_v<T, float>) {
    return kv.v;
  } else {
    return kv.v_f16;
  }
}

// The read-only inputs every task shares, plus derived sizes.
struct Problem {
  const PagedKv& kv;
  const AttentionQuery& q;
  const AttentionOutput& out;
  int64_t group;       // query heads per kv head
  int64_t dp;          // head_dim rounded up to whole vectors
  int64_t tp;          // kTileKeys rounded up to whole vectors (vnni: kVnniTileKeys)
  int64_t max_rows;    // query vectors per task at most (AttentionPlan::max_query_vectors)
  float* partials;     // num_slots slots of SlotFloats() floats
  bool quantized;      // kQ8_0 / kQ4_1: queries rounded by block_kv_query; tiles are dequantized
                       // into Scratch::k_tile / v_tile, or with `vnni` read in place
  bool vnni;           // quantized on AVX3 with VNNI: cpu/attention_vnni.h scores and P·V
  bool row_invariant;  // AttentionPlan::row_invariant: page-long tiles for every task
  // Not row-invariant, f32 / f16 pool, kKeysInLanes target: kLongTileKeys tiles (tp), and the
  // tasks with enough query vectors score with keys in lanes (RunTask).
  bool long_tiles = false;
  // Row-invariant, f32 / f16 pool: the task's keys in chunks of chunk_keys (tp), AttendChunks.
  bool chunked = false;
  int64_t chunk_keys = 0;
  // Long tiles scoring with keys in lanes, f32 / f16 pool, on an AVX512-BF16 CPU: p·v (bf16_pv)
  // or q·k and p·v (bf16_qk too) as bf16 dot products (AttentionQuery::prefill_dots,
  // cpu/attention_bf16.h).
  bool bf16_pv = false;
  bool bf16_qk = false;
  // A partial slot: [max_rows][dp] acc, [max_rows] max, [max_rows] sum; whole cache lines, so
  // every slot's acc is vector-aligned.
  int64_t SlotFloats() const { return (max_rows * (dp + 2) + 15) / 16 * 16; }
};

// Per-thread buffers for one task at a time (aligned, whole vectors).
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> buffer;
  float* q;       // [max_rows][dp] staged queries, scale applied, zero padding
  float* acc;     // [max_rows][dp] unnormalized outputs
  float* s;       // [max_rows][tp] scores, then probabilities
  float* max;     // [max_rows] running max of scores
  float* sum;     // [max_rows] running sum of exp(score - max)
  float* alpha;   // [max_rows] this tile's rescale factor of acc
  float* k_tile;  // quantized pools: [kTileKeys][head_dim] one unit's K rows, dequantized
  float* v_tile;  // ... and V rows
  float* kt;      // QkKeysInLanes: [head_dim][tp] the tile's K, transposed
  float* vt;      // ... and f16 pools: [tp][head_dim] the tile's V as f32
  // vnni: the staged queries as Q8_0 (int8 [max_rows][head_dim], d [max_rows][head_dim / 32])
  // and each kv head's sets of 4 (vnni::attn_prepare_queries; at most max_rows sets).
  hwy::AlignedFreeUniquePtr<int8_t[]> q_int;
  hwy::AlignedFreeUniquePtr<float[]> q_scale;
  hwy::AlignedFreeUniquePtr<uint8_t[]> q_sets;
  // bf16: the staged queries ([max_rows][head_dim / 2] pairs), the tile's K ([head_dim / 2][tp]:
  // pairs of dims, keys in lanes), V ([tp / 2][head_dim]: pairs of keys) and probabilities
  // ([max_rows][tp / 2]), as bf16 pairs (cpu/attention_bf16.h).
  hwy::AlignedFreeUniquePtr<uint32_t[]> q2, kt2, vt2, p2;

  explicit Scratch(const Problem& p) {
    const int64_t n = p.max_rows;
    const int64_t floats_per_vec = static_cast<int64_t>(hn::Lanes(DF()));
    const int64_t small = (n + floats_per_vec - 1) / floats_per_vec * floats_per_vec;
    const int64_t tile =
        p.quantized && !p.vnni ? (p.long_tiles ? kLongTileKeys : kTileKeys) * p.kv.head_dim : 0;
    const int64_t kt_floats = p.long_tiles ? p.dp * p.tp : 0;
    buffer = hwy::AllocateAligned<float>(
        static_cast<size_t>(n * (2 * p.dp + p.tp) + 3 * small + 2 * tile + 2 * kt_floats));
    q = buffer.get();
    acc = q + n * p.dp;
    s = acc + n * p.dp;
    max = s + n * p.tp;
    sum = max + small;
    alpha = sum + small;
    k_tile = alpha + small;
    v_tile = k_tile + tile;
    kt = v_tile + tile;
    vt = kt + kt_floats;
    if (p.vnni) {
      const int64_t hd = p.kv.head_dim;
      q_int = hwy::AllocateAligned<int8_t>(static_cast<size_t>(n * hd));
      q_scale = hwy::AllocateAligned<float>(static_cast<size_t>(n * hd / kQBlock));
      q_sets =
          hwy::AllocateAligned<uint8_t>(static_cast<size_t>(n) * vnni::attn_query_set_bytes(hd));
    }
    if (p.bf16_pv) {
      const int64_t pairs = p.kv.head_dim / 2;
      q2 = hwy::AllocateAligned<uint32_t>(static_cast<size_t>(n * pairs));
      kt2 = hwy::AllocateAligned<uint32_t>(static_cast<size_t>(pairs * p.tp));
      vt2 = hwy::AllocateAligned<uint32_t>(static_cast<size_t>(p.tp / 2 * p.kv.head_dim));
      p2 = hwy::AllocateAligned<uint32_t>(static_cast<size_t>(n * p.tp / 2));
    }
  }
};

// The query vectors of one kv head in a task (row r, group head g at index r * group + g) and
// the per-tile scratch they use.
struct HeadBlock {
  const float* q;  // [num_rows][dp]
  float* acc;      // [num_rows][dp]
  float* max;      // [num_rows]
  float* sum;      // [num_rows]
  float* s;        // [num_rows][tp]
  float* alpha;    // [num_rows]
  int64_t num_rows;
};

// ----------------------------------------------------------------------------- reductions

#if HWY_TARGET != HWY_SCALAR  // (1 lane: the scores are plain sums there)
// Sums the halves of v down to one 128-bit vector (4 lanes).
template <class D>
HWY_INLINE auto FoldTo128(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) <= 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return FoldTo128(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// {sum(a), sum(b), sum(c), sum(e)} as 4 lanes. Needs >= 4 lanes. Per 128-bit block:
//   ab = [a0+a2, b0+b2, a1+a3, b1+b3], ce likewise; 64-bit interleaves then give
//   [a02, b02, c02, e02] + [a13, b13, c13, e13]; then the blocks are added.
template <class D>
HWY_INLINE auto Reduce4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> e) {
  const hn::Repartition<uint64_t, D> du64;
  const auto ab =
      hn::BitCast(du64, hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b)));
  const auto ce =
      hn::BitCast(du64, hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e)));
  const auto sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(du64, ab, ce)),
                            hn::BitCast(d, hn::InterleaveUpper(du64, ab, ce)));
  return FoldTo128(d, sums);
}
#endif  // HWY_TARGET != HWY_SCALAR

// sum(v) by the same tree as Reduce4's: a score or a softmax sum comes out bit for bit the same
// whether its vector was folded alone (a page's last keys, a row that sees part of a tile) or
// with three others (the same key in a longer chunk), so a row's result does not depend on the
// rows and keys attended beside it (speculative decoding's verification relies on it).
HWY_INLINE float SumLanes(DF d, VF v) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) >= 4) {
    const VF zero = hn::Zero(d);
    return hn::GetLane(Reduce4(d, v, zero, zero, zero));
  }
#endif
  return ReduceSum(d, v);
}

// sum * alpha + tile_sum as SoftmaxStep4 computes it for four query vectors (one MulAdd).
HWY_INLINE float RescaledSum(float sum, float alpha, float tile_sum) {
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  return hn::GetLane(hn::MulAdd(hn::Set(d4, sum), hn::Set(d4, alpha), hn::Set(d4, tile_sum)));
#else
  return sum * alpha + tile_sum;
#endif
}

// The online softmax's rescale factor exp(old_max - new_max), 1 when the max did not move, by
// the same vector Exp for one query vector as for four (SoftmaxStep4).
HWY_INLINE float RescaleFactor(float old_max, float new_max) {
  if (new_max == old_max) return 1.0f;
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  return hn::GetLane(hn::Exp(d4, hn::Set(d4, old_max - new_max)));
#else
  return std::exp(old_max - new_max);
#endif
}

// ----------------------------------------------------------------------------- QK

// s[m * tp + j] = <q_m, k_j> for m < kM, j < kK. q: rows of dp floats (aligned, zero padded);
// k: rows of head_dim floats (the tail is loaded without reading past the row).
template <int kM, int kK, typename T>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, int64_t dp, const T* HWY_RESTRICT k,
                       int64_t head_dim, float* HWY_RESTRICT s, int64_t tp) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[kM][kK];
  for (int m = 0; m < kM; ++m) {
    for (int j = 0; j < kK; ++j) acc[m][j] = hn::Zero(d);
  }
  int64_t i = 0;
  for (; i + N <= head_dim; i += N) {
    VF kv[kK];
    for (int j = 0; j < kK; ++j) kv[j] = LoadKv(d, k + j * head_dim + i);
    for (int m = 0; m < kM; ++m) {
      const VF qv = hn::Load(d, q + m * dp + i);
      for (int j = 0; j < kK; ++j) acc[m][j] = hn::MulAdd(qv, kv[j], acc[m][j]);
    }
  }
  if (i < head_dim) {
    const size_t rest = static_cast<size_t>(head_dim - i);
    VF kv[kK];
    for (int j = 0; j < kK; ++j) kv[j] = LoadKvTail(d, k + j * head_dim + i, rest);
    for (int m = 0; m < kM; ++m) {
      const VF qv = hn::Load(d, q + m * dp + i);
      for (int j = 0; j < kK; ++j) acc[m][j] = hn::MulAdd(qv, kv[j], acc[m][j]);
    }
  }
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kK == 4) {
    const hn::CappedTag<float, 4> d4;
    for (int m = 0; m < kM; ++m) {
      hn::StoreU(Reduce4(d, acc[m][0], acc[m][1], acc[m][2], acc[m][3]), d4, s + m * tp);
    }
    return;
  }
#endif
  for (int m = 0; m < kM; ++m) {
    for (int j = 0; j < kK; ++j) s[m * tp + j] = SumLanes(d, acc[m][j]);
  }
}

// Scores of kM query vectors against every key of the tile.
template <int kM, typename T>
HWY_NOINLINE void QkRows(const float* HWY_RESTRICT q, int64_t dp, const KeyRun<T>* runs,
                         int64_t num_runs, int64_t head_dim, float* HWY_RESTRICT s, int64_t tp) {
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun<T>& run = runs[r];
    int64_t j = 0;
    for (; j + 4 <= run.count; j += 4) {
      QkTile<kM, 4>(q, dp, run.k + j * head_dim, head_dim, s + run.col + j, tp);
    }
    for (; j < run.count; ++j) {
      QkTile<kM, 1>(q, dp, run.k + j * head_dim, head_dim, s + run.col + j, tp);
    }
  }
}

// fn.template operator()<kM>() for the register tile of the query vectors left in a block:
// kM = min(kMaxRows, rows), kMaxRows 2 or 4.
template <int kMaxRows, class Fn>
HWY_INLINE void WithRowTile(int64_t rows, const Fn& fn) {
  static_assert(kMaxRows == 2 || kMaxRows == 4);
  switch (std::min<int64_t>(kMaxRows, rows)) {
    case 1:
      fn.template operator()<1>();
      break;
    case 2:
      fn.template operator()<2>();
      break;
    case 3:
      if constexpr (kMaxRows >= 4) fn.template operator()<3>();
      break;
    default:
      if constexpr (kMaxRows >= 4) fn.template operator()<4>();
      break;
  }
}

template <typename T>
HWY_INLINE void Qk(const Problem& p, const HeadBlock& block, const KeyRun<T>* runs,
                   int64_t num_runs) {
  for (int64_t m = 0; m < block.num_rows; m += kQkRows) {
    WithRowTile<kQkRows>(block.num_rows - m, [&]<int kM>() HWY_ATTR {
      QkRows<kM>(block.q + m * p.dp, p.dp, runs, num_runs, p.kv.head_dim, block.s + m * p.tp, p.tp);
    });
  }
}

#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX2
// Scores with the tile's keys along the lanes, for long jobs: the tile's K is transposed once
// (kt[i * tp + col] = element i of the key in column col) and every query vector of the kv head
// then takes head_dim FMAs per 16 keys, a broadcast query element times a row of kt, with no
// horizontal sums (QkTile's Reduce4 spends ~9 shuffles and adds per 4 scores, on the port that
// also runs FMAs on Intel cores). A score sums over head_dim in another order than QkTile's, so
// only jobs that are not row-invariant (AttentionPlan) take it: decode and verification rows
// keep QkTile, and come out the same alone and in any batch.
// (GCC 12 warns about the _mm512_undefined_epi32() inside its unpack intrinsics when they inline
// into a Highway target region: a false positive.)
// Keys per QkKeysInLanesRows call: 2 vectors (AVX-512) or 4 (AVX2); query vectors per register
// tile: 8 (8 kC of the 32 registers) or 2 (of 16).
inline constexpr int64_t kKeysPerCall = 32;
inline constexpr int kKeysInLanesRows = HWY_TARGET <= HWY_AVX3 ? 8 : 2;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <typename T>
HWY_INLINE void TransposeTile(const KeyRun<T>* runs, int64_t num_runs, int64_t head_dim,
                              int64_t num_keys, int64_t tp, float* HWY_RESTRICT kt) {
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun<T>& run = runs[r];
    int64_t j = 0;
#if HWY_TARGET <= HWY_AVX3
    // Whole vectors of 16 keys (a page of 16, or a dequantized tile) by 16 x 16 transposes. (AVX2:
    // element by element below, ~3% of a 256-vector task's FMAs.)
    const DF d;
    constexpr int64_t N = 16;
    static_assert(hn::MaxLanes(DF()) == N);
    for (; head_dim % N == 0 && (run.col + j) % N == 0 && j + N <= run.count; j += N) {
      alignas(64) float block[N * N];
      for (int64_t c = 0; c < head_dim; c += N) {
        __m512i rows[N];
        for (int64_t e = 0; e < N; ++e) {
          rows[e] = _mm512_castps_si512(LoadKv(d, run.k + (j + e) * head_dim + c).raw);
        }
        Transpose16x16(rows, reinterpret_cast<uint8_t*>(block));
        for (int64_t e = 0; e < N; ++e) {
          hn::Store(hn::Load(d, block + e * N), d, kt + (c + e) * tp + run.col + j);
        }
      }
    }
#endif
    for (; j < run.count; ++j) {
      const T* k = run.k + j * head_dim;
      for (int64_t i = 0; i < head_dim; ++i) {
        if constexpr (std::is_same_v<T, float>) {
          kt[i * tp + run.col + j] = k[i];
        } else {
          kt[i * tp + run.col + j] = hn::GetLane(PromoteF16(hn::CappedTag<float, 1>(), k + i));
        }
      }
    }
  }
  if (num_keys % kKeysPerCall != 0) {  // columns past the tile that QK reads: finite, masked later
    const int64_t end = std::min(tp, (num_keys + kKeysPerCall - 1) / kKeysPerCall * kKeysPerCall);
    for (int64_t i = 0; i < head_dim; ++i)
      std::fill(kt + i * tp + num_keys, kt + i * tp + end, 0.0f);
  }
}

#pragma GCC diagnostic pop

// s[m * tp + c * N + lane] = <q_m, key in that column> for m < kM, c < kC.
template <int kM, int kC>
HWY_INLINE void QkKeysInLanesTile(const float* HWY_RESTRICT q, int64_t dp,
                                  const float* HWY_RESTRICT kt, int64_t tp, int64_t head_dim,
                                  float* HWY_RESTRICT s) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[kM][kC];
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) acc[m][c] = hn::Zero(d);
  }
  for (int64_t i = 0; i < head_dim; ++i) {
    VF k[kC];
    for (int c = 0; c < kC; ++c) k[c] = hn::Load(d, kt + i * tp + c * N);
    for (int m = 0; m < kM; ++m) {
      const VF qv = hn::Set(d, q[m * dp + i]);
      for (int c = 0; c < kC; ++c) acc[m][c] = hn::MulAdd(qv, k[c], acc[m][c]);
    }
  }
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) hn::Store(acc[m][c], d, s + m * tp + c * N);
  }
}

// Columns [c0, c0 + kC vectors) of the tile (kt: their first column).
template <int kC>
HWY_NOINLINE void QkKeysInLanesRows(const Problem& p, const HeadBlock& block, const float* kt,
                                    int64_t c0) {
  // kC key vectors x kRows query vectors: kRows kC accumulators, per element kC loads of kt and
  // kRows broadcasts of a query element (loads on Intel cores).
  constexpr int kRows = kKeysInLanesRows;
  int64_t m = 0;
  for (; m + kRows <= block.num_rows; m += kRows) {
    QkKeysInLanesTile<kRows, kC>(block.q + m * p.dp, p.dp, kt, p.tp, p.kv.head_dim,
                                 block.s + m * p.tp + c0);
  }
  if constexpr (kRows >= 8) {
    for (; m < block.num_rows; m += 4) {
      WithRowTile<4>(block.num_rows - m, [&]<int kM>() HWY_ATTR {
        QkKeysInLanesTile<kM, kC>(block.q + m * p.dp, p.dp, kt, p.tp, p.kv.head_dim,
                                  block.s + m * p.tp + c0);
      });
    }
  } else {
    for (; m < block.num_rows; ++m) {
      QkKeysInLanesTile<1, kC>(block.q + m * p.dp, p.dp, kt, p.tp, p.kv.head_dim,
                               block.s + m * p.tp + c0);
    }
  }
}

template <typename T>
HWY_INLINE void QkKeysInLanes(const Problem& p, const HeadBlock& block, const KeyRun<T>* runs,
                              int64_t num_runs, int64_t num_keys, float* kt) {
  TransposeTile(runs, num_runs, p.kv.head_dim, num_keys, p.tp, kt);
  constexpr int64_t N = hn::MaxLanes(DF());
  for (int64_t c0 = 0; c0 < num_keys; c0 += kKeysPerCall) {
    if constexpr (N == 16) {
      if (num_keys - c0 > 16) {
        QkKeysInLanesRows<2>(p, block, kt + c0, c0);
      } else {
        QkKeysInLanesRows<1>(p, block, kt + c0, c0);
      }
    } else {
      QkKeysInLanesRows<kKeysPerCall / N>(p, block, kt + c0, c0);
    }
  }
}
#endif

// ----------------------------------------------------------------------------- softmax

// Online softmax step of query vector m for one tile of num_keys keys starting at position key0.
// Query vector m (row m / group) sees keys in [first, limit) of its row. Leaves its
// probabilities in S (0 for masked keys) and its acc rescale factor in alpha.
HWY_INLINE void SoftmaxRow(const Problem& p, const HeadBlock& block, const int64_t* first,
                           const int64_t* limit, int64_t key0, int64_t num_keys, int64_t m) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = (num_keys + N - 1) / N * N;  // <= tp: this tile's scores, whole vectors
  float* HWY_RESTRICT s = block.s + m * p.tp;
  const int64_t num_valid = std::clamp<int64_t>(limit[m / p.group] - key0, 0, num_keys);
  const int64_t num_before =
      std::clamp<int64_t>(first[m / p.group] - key0, 0, num_keys);  // sliding window
  if (num_valid <= num_before) {  // nothing to see in this tile: P = 0, acc unchanged
    std::fill(s, s + p.tp, 0.0f);
    block.alpha[m] = 1.0f;
    return;
  }
  std::fill(s, s + num_before, kNegInf);         // keys older than the window
  std::fill(s + num_valid, s + width, kNegInf);  // masked keys and padding
  VF vmax = hn::Load(d, s);
  for (int64_t i = N; i < width; i += N) vmax = hn::Max(vmax, hn::Load(d, s + i));
  const float old_max = block.max[m];
  const float new_max = std::max(old_max, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  // old_max = -inf (first keys): alpha = exp(-inf) = 0, acc and sum are 0 anyway.
  const float alpha = RescaleFactor(old_max, new_max);
  const VF shift = hn::Set(d, new_max);
  VF vsum = hn::Zero(d);
  for (int64_t i = 0; i < width; i += N) {
    const VF e = ExpOfScores(d, hn::Sub(hn::Load(d, s + i), shift));  // exp(-inf) = 0
    hn::Store(e, d, s + i);
    vsum = hn::Add(vsum, e);
  }
  block.alpha[m] = alpha;
  block.max[m] = new_max;
  block.sum[m] = RescaledSum(block.sum[m], alpha, SumLanes(d, vsum));
}

// Online softmax step for one tile of num_keys keys starting at position key0, every query
// vector of the block (SoftmaxRow).
HWY_INLINE void SoftmaxStep(const Problem& p, const HeadBlock& block, const int64_t* first,
                            const int64_t* limit, int64_t key0, int64_t num_keys) {
  for (int64_t m = 0; m < block.num_rows; ++m) {
    SoftmaxRow(p, block, first, limit, key0, num_keys, m);
  }
}

#if HWY_TARGET != HWY_SCALAR
// {max(a), max(b), max(c), max(e)} as 4 lanes (Reduce4 with Max).
template <class D>
HWY_INLINE auto Max4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> e) {
  const hn::Repartition<uint64_t, D> du64;
  const auto ab =
      hn::BitCast(du64, hn::Max(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b)));
  const auto ce =
      hn::BitCast(du64, hn::Max(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e)));
  auto v = hn::Max(hn::BitCast(d, hn::InterleaveLower(du64, ab, ce)),
                   hn::BitCast(d, hn::InterleaveUpper(du64, ab, ce)));
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    auto h = hn::Max(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v));
    if constexpr (hn::MaxLanes(decltype(dh)()) > 4) {
      const hn::Half<decltype(dh)> dq;
      return hn::Max(hn::LowerHalf(dq, h), hn::UpperHalf(dq, h));
    } else {
      return h;
    }
  } else {
    return v;
  }
}
#endif

// SoftmaxStep with 4 query vectors at a time where the tile is wholly visible
// to all 4 (every tile of a decode row but its last): their maxima, rescale factors and sums
// as 4 lanes (one Exp for the 4 alphas, no scalar exp, 2 horizontal folds per 4 vectors
// instead of 2 per vector). The other vectors take SoftmaxRow.
HWY_INLINE void SoftmaxStep4(const Problem& p, const HeadBlock& block, const int64_t* first,
                             const int64_t* limit, int64_t key0, int64_t num_keys) {
#if HWY_TARGET != HWY_SCALAR
  const DF d;
  const hn::CappedTag<float, 4> d4;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (N >= 4) {
    const int64_t width = (num_keys + N - 1) / N * N;
    const int64_t key1 = key0 + num_keys;
    int64_t m = 0;
    for (; m + 4 <= block.num_rows; m += 4) {
      bool visible = true;
      for (int64_t r = 0; r < 4; ++r) {
        const int64_t row = (m + r) / p.group;
        visible = visible && first[row] <= key0 && limit[row] >= key1;
      }
      if (!visible) {
        for (int64_t r = 0; r < 4; ++r) SoftmaxRow(p, block, first, limit, key0, num_keys, m + r);
        continue;
      }
      float* HWY_RESTRICT s = block.s + m * p.tp;
      VF vmax[4];
      for (int r = 0; r < 4; ++r) {
        float* HWY_RESTRICT row = s + r * p.tp;
        std::fill(row + num_keys, row + width, kNegInf);  // padding
        vmax[r] = hn::Load(d, row);
        for (int64_t i = N; i < width; i += N) vmax[r] = hn::Max(vmax[r], hn::Load(d, row + i));
      }
      const auto old_max = hn::LoadU(d4, block.max + m);
      const auto new_max = hn::Max(old_max, Max4(d, vmax[0], vmax[1], vmax[2], vmax[3]));
      // old_max = -inf (first keys): alpha = exp(-inf) = 0, acc and sum are 0 anyway. Past
      // the first tiles the maxima rarely move: alpha = 1 without the Exp.
      const auto unmoved = hn::Eq(old_max, new_max);
      const auto alpha =
          hn::AllTrue(d4, unmoved)
              ? hn::Set(d4, 1.0f)
              : hn::IfThenElse(unmoved, hn::Set(d4, 1.0f), hn::Exp(d4, hn::Sub(old_max, new_max)));
      alignas(16) float shift[4];
      hn::Store(new_max, d4, shift);
      VF vsum[4];
      for (int r = 0; r < 4; ++r) {
        float* HWY_RESTRICT row = s + r * p.tp;
        const VF sh = hn::Set(d, shift[r]);
        vsum[r] = hn::Zero(d);
        for (int64_t i = 0; i < width; i += N) {
          const VF e = ExpOfScores(d, hn::Sub(hn::Load(d, row + i), sh));  // exp(-inf) = 0
          hn::Store(e, d, row + i);
          vsum[r] = hn::Add(vsum[r], e);
        }
      }
      const auto sums = Reduce4(d, vsum[0], vsum[1], vsum[2], vsum[3]);
      hn::StoreU(alpha, d4, block.alpha + m);
      hn::StoreU(new_max, d4, block.max + m);
      hn::StoreU(hn::MulAdd(hn::LoadU(d4, block.sum + m), alpha, sums), d4, block.sum + m);
    }
    for (; m < block.num_rows; ++m) SoftmaxRow(p, block, first, limit, key0, num_keys, m);
    return;
  }
#endif
  SoftmaxStep(p, block, first, limit, key0, num_keys);
}

// ----------------------------------------------------------------------------- PV

// acc[m][c0 + c * N + lane] = alpha[m] * acc[...] + sum_t P[m][t] * v_t[...] for m < kM and
// c < kC vectors of columns from c0. kTail: one partial vector of `rest` columns (acc is
// padded, V rows are read only up to head_dim).
template <int kM, int kC, bool kTail, typename T>
HWY_INLINE void PvTile(const float* HWY_RESTRICT prob, int64_t tp, const KeyRun<T>* runs,
                       int64_t num_runs, int64_t head_dim, const float* HWY_RESTRICT alpha,
                       float* HWY_RESTRICT acc, int64_t dp, int64_t c0, size_t rest) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a[kM][kC];
  for (int m = 0; m < kM; ++m) {
    // Past the first tiles the running max rarely moves (alpha = 1): x * 1 is x.
    if (alpha[m] == 1.0f) {
      for (int c = 0; c < kC; ++c) a[m][c] = hn::Load(d, acc + m * dp + c0 + c * N);
      continue;
    }
    const VF scale = hn::Set(d, alpha[m]);
    for (int c = 0; c < kC; ++c) a[m][c] = hn::Mul(hn::Load(d, acc + m * dp + c0 + c * N), scale);
  }
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun<T>& run = runs[r];
    const float* HWY_RESTRICT pcol = prob + run.col;
    const T* HWY_RESTRICT v = run.v + c0;
    for (int64_t j = 0; j < run.count; ++j, v += head_dim) {
      VF vv[kC];
      for (int c = 0; c < kC; ++c) {
        vv[c] = kTail ? LoadKvTail(d, v + c * N, rest) : LoadKv(d, v + c * N);
      }
      for (int m = 0; m < kM; ++m) {
        const VF pm = hn::Set(d, pcol[m * tp + j]);
        for (int c = 0; c < kC; ++c) a[m][c] = hn::MulAdd(pm, vv[c], a[m][c]);
      }
    }
  }
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) hn::Store(a[m][c], d, acc + m * dp + c0 + c * N);
  }
}

// All columns for kM query vectors: passes of kPvChunks vectors, then at most one pass of each
// narrower width, then the partial vector.
template <int kM, typename T>
HWY_NOINLINE void PvRows(const float* HWY_RESTRICT prob, int64_t tp, const KeyRun<T>* runs,
                         int64_t num_runs, int64_t head_dim, const float* HWY_RESTRICT alpha,
                         float* HWY_RESTRICT acc, int64_t dp) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t c = 0;
  for (; c + kPvChunks * N <= head_dim; c += kPvChunks * N) {
    PvTile<kM, kPvChunks, false>(prob, tp, runs, num_runs, head_dim, alpha, acc, dp, c, 0);
  }
  if (c + kPvChunks / 2 * N <= head_dim) {
    PvTile<kM, kPvChunks / 2, false>(prob, tp, runs, num_runs, head_dim, alpha, acc, dp, c, 0);
    c += kPvChunks / 2 * N;
  }
  if constexpr (kPvChunks >= 8) {
    if (c + 2 * N <= head_dim) {
      PvTile<kM, 2, false>(prob, tp, runs, num_runs, head_dim, alpha, acc, dp, c, 0);
      c += 2 * N;
    }
  }
  for (; c + N <= head_dim; c += N) {
    PvTile<kM, 1, false>(prob, tp, runs, num_runs, head_dim, alpha, acc, dp, c, 0);
  }
  if (c < head_dim) {
    PvTile<kM, 1, true>(prob, tp, runs, num_runs, head_dim, alpha, acc, dp, c,
                        static_cast<size_t>(head_dim - c));
  }
}

template <typename T>
HWY_INLINE void Pv(const Problem& p, const HeadBlock& block, const KeyRun<T>* runs,
                   int64_t num_runs) {
  int64_t m = 0;
  if constexpr (kKeysInLanes && HWY_TARGET <= HWY_AVX3) {
    // Long jobs: 6 query vectors x 4 vectors of columns (24 accumulators), each V load used 6
    // times. A vector's sums do not depend on the vectors beside it, so the bits are the same.
    if (p.long_tiles) {
      for (; m + 6 <= block.num_rows; m += 6) {
        PvRows<6>(block.s + m * p.tp, p.tp, runs, num_runs, p.kv.head_dim, block.alpha + m,
                  block.acc + m * p.dp, p.dp);
      }
    }
  }
  for (; m < block.num_rows; m += kPvRows) {
    WithRowTile<kPvRows>(block.num_rows - m, [&]<int kM>() HWY_ATTR {
      PvRows<kM>(block.s + m * p.tp, p.tp, runs, num_runs, p.kv.head_dim, block.alpha + m,
                 block.acc + m * p.dp, p.dp);
    });
  }
}

// ----------------------------------------------------------------------------- tasks

// The runs of keys [key0, key1) of kv_head; returns how many.
template <typename T>
HWY_INLINE int64_t TileRuns(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t key1,
                            KeyRun<T>* runs) {
  int64_t num_runs = 0;
  for (int64_t t = key0; t < key1;) {
    const int64_t slot = (t + kv.key_offset) % kv.page_size;
    const int64_t count = std::min(key1 - t, kv.page_size - slot);
    const int64_t offset = kv_offset(kv, t, kv_head);
    runs[num_runs++] = KeyRun<T>{KBase<T>(kv) + offset, VBase<T>(kv) + offset, t - key0, count};
    t += count;
  }
  return num_runs;
}

// n halves at src as floats at dst.
HWY_INLINE void ConvertF16Row(const uint16_t* HWY_RESTRICT src, int64_t n,
                              float* HWY_RESTRICT dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadKv(d, src + i), d, dst + i);
  if (i < n)
    StoreTail(d, LoadKvTail(d, src + i, static_cast<size_t>(n - i)), dst + i,
              static_cast<size_t>(n - i));
}

// The V rows of a tile's runs (f16) as f32 at vt + col * head_dim; float runs over them (their
// K unused). Returns how many (one per input run).
HWY_INLINE int64_t WidenValues(const KeyRun<uint16_t>* runs, int64_t num_runs, int64_t head_dim,
                               float* HWY_RESTRICT vt, KeyRun<float>* wide) {
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun<uint16_t>& run = runs[r];
    float* out = vt + run.col * head_dim;
    ConvertF16Row(run.v, run.count * head_dim, out);
    wide[r] = KeyRun<float>{nullptr, out, run.col, run.count};
  }
  return num_runs;
}

// Quantized pools: the K and V rows of keys [key0, key1) of kv_head dequantized into
// sc.k_tile / sc.v_tile (key key0 + j at j * head_dim), as one run; returns 1.
HWY_INLINE int64_t DequantizeTile(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t key1,
                                  const Scratch& sc, KeyRun<float>* runs) {
  for (int64_t t = key0; t < key1;) {
    const int64_t slot = (t + kv.key_offset) % kv.page_size;
    const int64_t count = std::min(key1 - t, kv.page_size - slot);
    const int64_t offset = kv_offset(kv, t, kv_head);  // count rows, contiguous in the page
    const int64_t at = (t - key0) * kv.head_dim;
    DequantizeKvRow(kv.dtype, kv_block_row(kv, false, offset), sc.k_tile + at, count * kv.head_dim);
    DequantizeKvRow(kv.dtype, kv_block_row(kv, true, offset), sc.v_tile + at, count * kv.head_dim);
    t += count;
  }
  runs[0] = KeyRun<float>{sc.k_tile, sc.v_tile, 0, key1 - key0};
  return 1;
}

// Quantized pools: the K and V row addresses of keys [key0, key1) of kv_head; returns how many.
HWY_INLINE int64_t QuantTileRows(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t key1,
                                 const uint8_t** k_rows, const uint8_t** v_rows) {
  const int64_t bytes = static_cast<int64_t>(row_bytes(kv.dtype, kv.head_dim));
  for (int64_t t = key0; t < key1;) {
    const int64_t slot = (t + kv.key_offset) % kv.page_size;
    const int64_t count = std::min(key1 - t, kv.page_size - slot);
    const int64_t offset = kv_offset(kv, t, kv_head);  // count rows, contiguous in the page
    const uint8_t* k = kv_block_row(kv, false, offset);
    const uint8_t* v = kv_block_row(kv, true, offset);
    for (int64_t j = 0; j < count; ++j) {
      k_rows[t - key0 + j] = k + j * bytes;
      v_rows[t - key0 + j] = v + j * bytes;
    }
    t += count;
  }
  return key1 - key0;
}

// Quantized pools: prefetches the K and V rows of keys [key0, key1) of kv_head (one range of
// whole rows per page).
HWY_INLINE void PrefetchTile(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t key1) {
  for (int64_t t = key0; t < key1;) {
    const int64_t slot = (t + kv.key_offset) % kv.page_size;
    const int64_t count = std::min(key1 - t, kv.page_size - slot);
    const int64_t offset = kv_offset(kv, t, kv_head);
    const uint8_t* k = kv_block_row(kv, false, offset);
    const uint8_t* v = kv_block_row(kv, true, offset);
    const int64_t bytes = static_cast<int64_t>(row_bytes(kv.dtype, count * kv.head_dim));
    for (int64_t i = 0; i < bytes; i += 64) {
      hwy::Prefetch(k + i);
      hwy::Prefetch(v + i);
    }
    hwy::Prefetch(k + bytes - 1);
    hwy::Prefetch(v + bytes - 1);
    t += count;
  }
}

// f32 / f16 pools: prefetches `elements` values from p.
template <typename T>
HWY_INLINE void PrefetchRows(const T* p, int64_t elements) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < elements; i += kLine) hwy::Prefetch(p + i);
}

// The same into L2 (PREFETCHT1) where the target has it; elsewhere into L1 as PrefetchRows.
template <typename T>
HWY_INLINE void PrefetchRowsToL2(const T* p, int64_t elements) {
#if HWY_ARCH_X86
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < elements; i += kLine)
    _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
#else
  PrefetchRows(p, elements);
#endif
}

// out row = acc / sum (head_dim floats, acc padded to whole vectors).
HWY_INLINE void StoreNormalized(const float* HWY_RESTRICT acc, float inv_sum, int64_t head_dim,
                                float* HWY_RESTRICT out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF scale = hn::Set(d, inv_sum);
  int64_t i = 0;
  for (; i + N <= head_dim; i += N) hn::StoreU(hn::Mul(hn::Load(d, acc + i), scale), d, out + i);
  if (i < head_dim) {
    StoreTail(d, hn::Mul(hn::Load(d, acc + i), scale), out + i, static_cast<size_t>(head_dim - i));
  }
}

// Writes output row m (query row row0 + m / group, head kv_head * group + m % group).
HWY_INLINE void StoreRow(const Problem& p, int64_t row0, int64_t kv_head, int64_t m,
                         const float* acc, float max, float sum) {
  const int64_t row = row0 + m / p.group;
  const int64_t head = kv_head * p.group + m % p.group;
  const int64_t idx = row * p.q.num_heads + head;
  StoreNormalized(acc, 1.0f / sum, p.kv.head_dim, p.out.out + idx * p.kv.head_dim);
  if (p.out.row_max != nullptr) p.out.row_max[idx] = max;
  if (p.out.row_lse != nullptr) p.out.row_lse[idx] = max + std::log(sum);
}

// Keys per tile. A task of several kv heads walks each tile through its heads in turn; with
// tiles of one page, that reads the page's heads one after the other: one linear stream
// through a layer's pages when their ids are consecutive (model::KvCache's layout). Tiles of
// two pages jump back and forth within them, which defeats the hardware prefetchers: decode
// at 16k keys (head_dim 64, 2 kv heads, one thread, Zen 4) took 2.0 ms per layer instead of
// 0.8 (f32), 1.2 instead of 0.6 (f16). Tasks of a row-invariant plan (short jobs: decode and
// speculative verification) all take page-long tiles, whatever their heads: the online softmax
// rescales at tile ends, so a row alone and in a short chunk must step through the same tiles
// to come out bit for bit the same (on f32 / f16 pools they take AttendChunks instead). Tiles
// start on multiples of their length (such tasks start on kAttentionSplitKeys multiples).
// Pages under 8 keys keep the long tiles (per-tile costs would dominate).
HWY_INLINE int64_t TileKeys(const PagedKv& kv, int64_t num_heads, bool row_invariant) {
  if ((row_invariant || num_heads > 1) && kv.page_size >= 8 && kv.page_size < kTileKeys)
    return kv.page_size;
  return kTileKeys;
}

// The chunk length for pages of page_size keys: one kAttentionSplitKeys piece (a row-invariant
// task's keys at most), or kMaxChunkPages pages when that is shorter (pages under 8 keys).
HWY_INLINE int64_t ChunkKeys(int64_t page_size) {
  return std::min(attention_split_keys(page_size), kMaxChunkPages * page_size);
}

// acc *= alpha for each query vector of the block, then alpha = 1: P·V then runs over a chunk in
// several calls (PvTile rescales on every call where alpha != 1).
HWY_INLINE void RescaleAcc(const Problem& p, const HeadBlock& block) {
  const DF d;
  for (int64_t m = 0; m < block.num_rows; ++m) {
    if (block.alpha[m] == 1.0f) continue;
    const VF scale = hn::Set(d, block.alpha[m]);
    float* HWY_RESTRICT acc = block.acc + m * p.dp;
    for (int64_t i = 0; i < p.dp; i += static_cast<int64_t>(hn::Lanes(d))) {
      hn::Store(hn::Mul(hn::Load(d, acc + i), scale), d, acc + i);
    }
    block.alpha[m] = 1.0f;
  }
}

// Row-invariant jobs (decode, speculative verification) on f32 / f16 pools: the task's keys in
// chunks of p.chunk_keys at absolute multiples of it (one chunk per task when pages hold >= 8
// keys: a task is at most one kAttentionSplitKeys piece), each in three passes:
//   QK       the scores of every key of the chunk, K read page by page, each page through all
//            the task's kv heads (one stream through the layer's K when the page ids run on)
//   softmax  one step per query vector over the whole chunk (the fast exp, ExpOfScores)
//   PV       page by page as QK, V likewise
// Page-long tiles (the rest of RunTask) paid a max, a rescale and an exp call per page and
// interleaved the K and V streams: decode of 1024 keys (attention_bench EngineDecode f32,
// threads:1, 2-core Xeon) took 0.052 ms, L2-resident 0.039. A key's lane in the score rows is
// its position in its chunk, and chunks start at absolute multiples, so a row's bits do not
// depend on the rows, heads or threads beside it.
template <typename T>
HWY_INLINE void AttendChunks(const Problem& p, const AttentionTask& task, Scratch& sc,
                             int64_t per_head, const int64_t* first, const int64_t* limit) {
  const int64_t num_heads = task.kv_head_end - task.kv_head_begin;
  const int64_t head_dim = p.kv.head_dim;
  const bool prefetch = num_heads == 1 && one_head_kv_prefetch();
  const auto block_of = [&](int64_t b) {
    return HeadBlock{sc.q + b * per_head * p.dp,
                     sc.acc + b * per_head * p.dp,
                     sc.max + b * per_head,
                     sc.sum + b * per_head,
                     sc.s + b * per_head * p.tp,
                     sc.alpha + b * per_head,
                     per_head};
  };
  KeyRun<T> runs[kMaxChunkPages + 1];  // + 1: a pool whose first page starts mid-page
  for (int64_t base = task.key_begin / p.chunk_keys * p.chunk_keys; base < task.key_end;
       base += p.chunk_keys) {
    const int64_t key0 = std::max(base, task.key_begin);
    const int64_t key1 = std::min(task.key_end, base + p.chunk_keys);
    const int64_t num_runs = TileRuns(p.kv, task.kv_head_begin, key0, key1, runs);
    for (int64_t r = 0; r < num_runs; ++r) runs[r].col += key0 - base;
    // Run r of the task's head b: the same slots b head strides further.
    const auto head_run = [&](int64_t r, int64_t b) {
      KeyRun<T> run = runs[r];
      run.k += b * p.kv.head_stride;
      run.v += b * p.kv.head_stride;
      return run;
    };
    // pass(block, runs, num_runs) over the chunk's pages (QK reading K, P·V reading V): with
    // several heads (or a prefetch) page by page, each page through the task's heads.
    const auto each_page = [&](bool values, const auto& pass) HWY_ATTR {
      if (num_heads == 1 && !prefetch) {
        pass(block_of(0), runs, num_runs);
        return;
      }
      for (int64_t r = 0; r < num_runs; ++r) {
        if (prefetch && r + kOneHeadPrefetchPages < num_runs) {
          const KeyRun<T>& ahead = runs[r + kOneHeadPrefetchPages];
          PrefetchRows(values ? ahead.v : ahead.k, ahead.count * head_dim);
        }
        if (prefetch && r + kOneHeadFarPrefetchPages < num_runs) {
          const KeyRun<T>& far = runs[r + kOneHeadFarPrefetchPages];
          PrefetchRowsToL2(values ? far.v : far.k, far.count * head_dim);
        }
        for (int64_t b = 0; b < num_heads; ++b) {
          const KeyRun<T> run = head_run(r, b);
          pass(block_of(b), &run, 1);
        }
      }
    };
    each_page(false, [&](const HeadBlock& block, const KeyRun<T>* page_runs, int64_t count)
                         HWY_ATTR { Qk(p, block, page_runs, count); });
    for (int64_t b = 0; b < num_heads; ++b) {
      const HeadBlock block = block_of(b);
      // Columns before the task's first key (a task starting mid-chunk): not keys of this task.
      for (int64_t m = 0; m < per_head; ++m) {
        std::fill(block.s + m * p.tp, block.s + m * p.tp + (key0 - base), kNegInf);
      }
      SoftmaxStep4(p, block, first, limit, base, key1 - base);
      RescaleAcc(p, block);
    }
    each_page(true, [&](const HeadBlock& block, const KeyRun<T>* page_runs, int64_t count)
                        HWY_ATTR { Pv(p, block, page_runs, count); });
  }
}

#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
// One unit of a long job with bf16 dot products (Problem::bf16_pv): keys [key0, key1) of one kv
// head against the task's query vectors of that head (theirs from vector v0 in Scratch::q2).
// With bf16_qk the tile's K rows are paired by dims and transposed (bf16::pack_keys), else QK
// runs in f32; the f32 softmax keeps its row sums, and the probabilities are rounded after it;
// the V rows are paired by keys (bf16::pack_values).
template <typename T>
HWY_INLINE void Bf16Unit(const Problem& p, const HeadBlock& block, const KeyRun<T>* runs,
                         int64_t num_runs, int64_t key0, int64_t key1, const int64_t* first,
                         const int64_t* limit, Scratch& sc, int64_t v0) {
  const int64_t head_dim = p.kv.head_dim;
  const int64_t pairs = head_dim / 2;
  const int64_t num_keys = key1 - key0;
  constexpr bool kHalves = !std::is_same_v<T, float>;
  const void* rows[kLongTileKeys];  // the tile's K rows, then its V rows, by column
  if (p.bf16_qk) {
    const int64_t cols = (num_keys + kKeysPerCall - 1) / kKeysPerCall * kKeysPerCall;
    for (int64_t r = 0; r < num_runs; ++r) {
      for (int64_t j = 0; j < runs[r].count; ++j) rows[runs[r].col + j] = runs[r].k + j * head_dim;
    }
    bf16::pack_keys(rows, kHalves, num_keys, cols, head_dim, sc.kt2.get(), p.tp);
    bf16::scores(sc.q2.get() + v0 * pairs, pairs, block.num_rows, sc.kt2.get(), p.tp, pairs, cols,
                 block.s, p.tp);
  } else {
    QkKeysInLanes(p, block, runs, num_runs, num_keys, sc.kt);
  }
  SoftmaxStep4(p, block, first, limit, key0, num_keys);

  for (int64_t r = 0; r < num_runs; ++r) {
    for (int64_t j = 0; j < runs[r].count; ++j) rows[runs[r].col + j] = runs[r].v + j * head_dim;
  }
  bf16::pack_values(rows, kHalves, num_keys, head_dim, sc.vt2.get());
  const int64_t num_pairs = (num_keys + 1) / 2;
  const int64_t p_stride = p.tp / 2;
  for (int64_t m = 0; m < block.num_rows; ++m) {
    bf16::round_row(block.s + m * p.tp, 2 * num_pairs,
                    reinterpret_cast<uint16_t*>(sc.p2.get() + m * p_stride));
  }
  bf16::pv(sc.p2.get(), p_stride, block.num_rows, block.alpha, sc.vt2.get(), num_pairs, head_dim,
           block.acc, p.dp);
}
#endif

// Keys per tile of a long job scoring with keys in lanes: kLongTileKeys, fewer where the
// transposed tile (dp x tile floats) would pass 32 KiB and crowd L1 (head_dim 128: 64 keys).
HWY_INLINE int64_t LongTileKeys(int64_t dp) {
  return std::clamp<int64_t>(8192 / dp / 32 * 32, 32, kLongTileKeys);
}

template <typename T>
HWY_NOINLINE void RunTask(const Problem& p, const AttentionTask& task, Scratch& sc) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t head_dim = p.kv.head_dim;
  const int64_t num_rows = task.row_end - task.row_begin;
  const int64_t per_head = num_rows * p.group;  // query vectors per kv head
  const int64_t num_heads = task.kv_head_end - task.kv_head_begin;

  // Stage the queries (scaled, zero padded); reset the state. Vector b * per_head + m is row
  // m / group of query head (kv_head_begin + b) * group + m % group.
  const VF scale = hn::Set(d, p.q.scale);
  for (int64_t v = 0; v < num_heads * per_head; ++v) {
    const int64_t row = task.row_begin + v % per_head / p.group;
    const int64_t head = task.kv_head_begin * p.group + v / per_head * p.group + v % p.group;
    const float* src = p.q.q + (row * p.q.num_heads + head) * head_dim;
    float* dst = sc.q + v * p.dp;
    int64_t i = 0;
    for (; i + N <= head_dim; i += N) hn::Store(hn::Mul(hn::LoadU(d, src + i), scale), d, dst + i);
    if (i < head_dim) {
      hn::Store(hn::Mul(LoadTail(d, src + i, static_cast<size_t>(head_dim - i), 0.0f), scale), d,
                dst + i);
    }
    if (p.vnni) {  // the values block_kv_query rounds to, as int8 blocks
      QuantizeRowQ8_0(dst, head_dim / kQBlock, sc.q_int.get() + v * head_dim,
                      sc.q_scale.get() + v * (head_dim / kQBlock));
    } else if (p.quantized) {
      RoundToQ8Blocks(dst, head_dim);
    }
    if (p.bf16_qk) {
      bf16::round_row(dst, head_dim, reinterpret_cast<uint16_t*>(sc.q2.get() + v * (head_dim / 2)));
    }
    std::fill(sc.acc + v * p.dp, sc.acc + (v + 1) * p.dp, 0.0f);
    sc.max[v] = kNegInf;
    sc.sum[v] = 0.0f;
  }
  const auto format =
      p.kv.dtype == DType::kQ8_0 ? vnni::KvBlockFormat::kQ8_0 : vnni::KvBlockFormat::kQ4_1;
  const size_t set_bytes = p.vnni ? vnni::attn_query_set_bytes(head_dim) : 0;
  const int64_t sets_per_head = (per_head + 3) / 4;
  if (p.vnni) {
    for (int64_t b = 0; b < num_heads; ++b) {
      vnni::attn_prepare_queries(format, sc.q_int.get() + b * per_head * head_dim,
                                 sc.q_scale.get() + b * per_head * (head_dim / kQBlock), per_head,
                                 head_dim, sc.q_sets.get() + b * sets_per_head * set_bytes);
    }
  }
  int64_t first[kAttentionLongJobQueryVectorsPerTask];  // per query row: keys in [first, limit) are
                                                        // visible
  int64_t limit[kAttentionLongJobQueryVectorsPerTask];
  for (int64_t r = 0; r < num_rows; ++r) {
    first[r] = first_visible_key(p.q, static_cast<size_t>(task.row_begin + r));
    limit[r] = int64_t{p.q.positions[task.row_begin + r]} + 1;
  }

  // VNNI (quantized pools on AVX3): head by head, tiles of up to kVnniTileKeys keys, the rows
  // of the tile kPrefetchTiles ahead prefetched. Longer tiles cut the per-tile costs (scales,
  // P·d, Q4_1's sum of p·m, the softmax's folds): q4 from L2 (bench-engine's shape, 1 thread,
  // Zen 4, ns per key for both heads) 26.2 with tiles of one page, 21.9 with 2 pages, ~1.5
  // less again with 4. One head's pages (every other page block in a layer-major pool) are a
  // pattern the hardware prefetchers follow badly: at 16k keys, 2-page tiles took 26.0
  // instead of 24.7 without the software prefetch, 22.7 with it; 4-page tiles 21.3 for q4, but
  // q8 (68-byte rows) 31 instead of 25: q8 keeps 2 pages. (The page-by-page order below with
  // 2-page tiles ran 0.77 instead of 0.48 ms at 16k.)
  if (p.vnni) {
    const int64_t tile = p.kv.dtype == DType::kQ4_1 ? kVnniTileKeys : kVnniTileKeys / 2;
    for (int64_t b = 0; b < num_heads; ++b) {
      const HeadBlock block{nullptr,
                            sc.acc + b * per_head * p.dp,
                            sc.max + b * per_head,
                            sc.sum + b * per_head,
                            sc.s,
                            sc.alpha,
                            per_head};
      const uint8_t* q_sets = sc.q_sets.get() + b * sets_per_head * set_bytes;
      const int64_t kv_head = task.kv_head_begin + b;
      for (int64_t key0 = task.key_begin; key0 < task.key_end; key0 += tile) {
        const int64_t key1 = std::min(task.key_end, key0 + tile);
        const int64_t ahead = key0 + kPrefetchTiles * tile;
        if (ahead < task.key_end) {
          PrefetchTile(p.kv, kv_head, ahead, std::min(task.key_end, ahead + tile));
        }
        const uint8_t* k_rows[kVnniTileKeys];
        const uint8_t* v_rows[kVnniTileKeys];
        const int64_t num_keys = QuantTileRows(p.kv, kv_head, key0, key1, k_rows, v_rows);
        vnni::attn_scores(format, q_sets, per_head, head_dim, k_rows, num_keys, block.s, p.tp);
        SoftmaxStep4(p, block, first, limit, key0, num_keys);
        vnni::attn_pv(format, block.s, p.tp, block.alpha, per_head, v_rows, num_keys, head_dim,
                      block.acc, p.dp);
      }
    }
  }
  if (p.chunked) AttendChunks<T>(p, task, sc, per_head, first, limit);
  // Otherwise units of work in order: for each key tile, each kv head of the task.
  KeyRun<T> runs[kMaxRuns];
  const bool keys_in_lanes = p.long_tiles && per_head >= kKeysInLanesMinVectors;
  // Long jobs with enough query vectors per key: 8-page tiles (the tile's keys are reused by all
  // of them, so reading order matters less than per-tile work).
  const int64_t tile_keys =
      keys_in_lanes ? LongTileKeys(p.dp) : TileKeys(p.kv, num_heads, p.row_invariant);
  for (int64_t key0 = task.key_begin; !p.vnni && !p.chunked && key0 < task.key_end;
       key0 += tile_keys) {
    const int64_t key1 = std::min(task.key_end, key0 + tile_keys);
    for (int64_t b = 0; b < num_heads; ++b) {
      int64_t num_runs;
      if constexpr (std::is_same_v<T, float>) {
        num_runs = p.quantized ? DequantizeTile(p.kv, task.kv_head_begin + b, key0, key1, sc, runs)
                               : TileRuns(p.kv, task.kv_head_begin + b, key0, key1, runs);
      } else {
        num_runs = TileRuns(p.kv, task.kv_head_begin + b, key0, key1, runs);
      }
      const HeadBlock block{sc.q + b * per_head * p.dp,
                            sc.acc + b * per_head * p.dp,
                            sc.max + b * per_head,
                            sc.sum + b * per_head,
                            sc.s,
                            sc.alpha,
                            per_head};
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
      if (keys_in_lanes && p.bf16_pv) {
        Bf16Unit(p, block, runs, num_runs, key0, key1, first, limit, sc, b * per_head);
        continue;
      }
#endif
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX2
      if (keys_in_lanes) {
        QkKeysInLanes(p, block, runs, num_runs, key1 - key0, sc.kt);
      } else {
        Qk(p, block, runs, num_runs);
      }
#else
      Qk(p, block, runs, num_runs);
#endif
      SoftmaxStep4(p, block, first, limit, key0, key1 - key0);
      if constexpr (!std::is_same_v<T, float>) {
        // f16 pools in long jobs: the tile's V widened once for all the P·V passes over it
        // (each pass of 6 query vectors would widen every V row again).
        if (keys_in_lanes) {
          KeyRun<float> wide[kMaxRuns];
          const int64_t num_wide = WidenValues(runs, num_runs, head_dim, sc.vt, wide);
          Pv(p, block, wide, num_wide);
          continue;
        }
      }
      Pv(p, block, runs, num_runs);
    }
  }

  const int64_t num_vectors = num_heads * per_head;
  if (task.partial_slot.has_value()) {
    float* slot = p.partials + *task.partial_slot * p.SlotFloats();
    std::copy(sc.acc, sc.acc + num_vectors * p.dp, slot);
    std::copy(sc.max, sc.max + num_vectors, slot + p.max_rows * p.dp);
    std::copy(sc.sum, sc.sum + num_vectors, slot + p.max_rows * (p.dp + 1));
    return;
  }
  for (int64_t v = 0; v < num_vectors; ++v) {
    StoreRow(p, task.row_begin, task.kv_head_begin + v / per_head, v % per_head, sc.acc + v * p.dp,
             sc.max[v], sc.sum[v]);
  }
}

// Combines the partial states of one split (row tile, kv head) and writes its outputs.
HWY_NOINLINE void MergeSplits(const Problem& p, const AttentionMerge& merge, Scratch& sc) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t per_head = (merge.row_end - merge.row_begin) * p.group;
  const float* first = p.partials + merge.first_slot * p.SlotFloats();
  const int64_t max_at = p.max_rows * p.dp, sum_at = p.max_rows * (p.dp + 1);
  for (int64_t m = 0; m < per_head; ++m) {
    const int64_t v = merge.head_in_slot * per_head + m;  // vector index in each slot
    float max = kNegInf;
    for (int64_t j = 0; j < merge.num_slots; ++j) {
      max = std::max(max, first[j * p.SlotFloats() + max_at + v]);
    }
    float* acc = sc.acc;
    std::fill(acc, acc + p.dp, 0.0f);
    float sum = 0.0f;
    for (int64_t j = 0; j < merge.num_slots; ++j) {
      const float* slot = first + j * p.SlotFloats();
      const float slot_max = slot[max_at + v];
      if (slot_max == kNegInf) continue;  // no visible keys in that split
      const float w = std::exp(slot_max - max);
      sum += w * slot[sum_at + v];
      const VF vw = hn::Set(d, w);
      for (int64_t i = 0; i < p.dp; i += N) {
        hn::Store(hn::MulAdd(vw, hn::Load(d, slot + v * p.dp + i), hn::Load(d, acc + i)), d,
                  acc + i);
      }
    }
    StoreRow(p, merge.row_begin, merge.kv_head, m, acc, max, sum);
  }
}

// Below this many multiply-adds everything runs on the calling thread (waking the pool costs
// microseconds).
inline constexpr int64_t kMinParallelMacs = 1 << 16;

inline void PagedAttention(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out,
                           ThreadPool& pool) {
  if (q.positions.empty()) return;
  const AttentionPlan plan = plan_paged_attention(kv, q, pool.num_threads());
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t group = q.num_heads / kv.num_kv_heads;
  Problem problem{kv,
                  q,
                  out,
                  group,
                  (kv.head_dim + N - 1) / N * N,
                  (kTileKeys + N - 1) / N * N,
                  plan.max_query_vectors,
                  nullptr,
                  is_block_kv_dtype(kv.dtype),
                  false,
                  plan.row_invariant};
  problem.long_tiles = kKeysInLanes && !plan.row_invariant;
  if (problem.long_tiles) problem.tp = kLongTileKeys;
  problem.chunked = plan.row_invariant && !problem.quantized;
  if (problem.chunked) {
    problem.chunk_keys = ChunkKeys(kv.page_size);
    problem.tp = (problem.chunk_keys + N - 1) / N * N;
  }
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
  if (q.prefill_dots != PrefillDots::kF32 && problem.long_tiles && !problem.quantized &&
      kv.head_dim % kQBlock == 0 && bf16::supported()) {
    problem.bf16_pv = true;
    problem.bf16_qk = q.prefill_dots == PrefillDots::kBf16;
  }
#endif
#if HWY_TARGET == HWY_AVX3
  // Long jobs on quantized pools dequantize each tile once for all its query vectors and score
  // with keys in lanes, as f16 pools do: VNNI's int8 P·V widens every V row again for each set
  // of query vectors (eval-32k, q8, 16k prefill: Pv 45% of the time).
  problem.vnni = problem.quantized && vnni::supported() && !problem.long_tiles;
  if (problem.vnni) problem.tp = kVnniTileKeys;
#endif
  hwy::AlignedFreeUniquePtr<float[]> partials;
  if (plan.num_slots > 0) {
    partials =
        hwy::AllocateAligned<float>(static_cast<size_t>(plan.num_slots * problem.SlotFloats()));
    problem.partials = partials.get();
  }
  const bool parallel = pool.num_threads() > 1 && plan.total_macs >= kMinParallelMacs;
  const auto run_tasks = [&](int64_t begin, int64_t end) HWY_ATTR {
    Scratch scratch(problem);
    for (int64_t t = begin; t < end; ++t) {
      if (kv.dtype == DType::kF16) {
        RunTask<uint16_t>(problem, plan.tasks[t], scratch);
      } else {  // f32, or quantized tiles dequantized to f32
        RunTask<float>(problem, plan.tasks[t], scratch);
      }
    }
  };
  const auto run_merges = [&](int64_t begin, int64_t end) HWY_ATTR {
    Scratch scratch(problem);
    for (int64_t i = begin; i < end; ++i) MergeSplits(problem, plan.merges[i], scratch);
  };
  const auto num_tasks = static_cast<int64_t>(plan.tasks.size());
  const auto num_merges = static_cast<int64_t>(plan.merges.size());
  if (parallel) {
    pool.parallel_for(num_tasks, run_tasks, /*grain=*/1);
    if (num_merges > 0) pool.parallel_for(num_merges, run_merges, /*grain=*/1);
  } else {
    run_tasks(0, num_tasks);
    if (num_merges > 0) run_merges(0, num_merges);
  }
}

}  // namespace attention

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SIEVE_KERNELS_CPU_ATTENTION_INL_H_ toggle
