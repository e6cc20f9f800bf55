// Sparsity scores (attention_scores.h): per-target kernels (compiled once per Highway target)
// and dispatchers. The scalar references are ref/attention_scores_ref.cc.
//
// observation_scores: a task is (kv head, chunk of kKeysPerTask keys). It stages the window's
// query vectors of that kv head once (vector m = row m / group, head kv_head * group + m %
// group; pre-scaled, zero padded to dp), then walks its keys in tiles of kTileKeys: gather the
// tile's K rows into a contiguous buffer, and per query vector m that sees any of them
//   s[j] = q_m · k_j              4 keys at a time, lanes along head_dim
//   p[j] = exp(s[j] - lse_m)      ExpOfScores over the tile; keys past row m's position -> 0
//   acc[j] += p[j]
// Each key's sum is formed in query-vector order inside one task: deterministic for any pool.
// Quantized pools (kQ8_0 / kQ4_1): the gather dequantizes the tile's rows (SIMD), so the scores
// and the page summaries below are those of the dequantized keys the attention sees.
// Cost per key and query vector: head_dim FMAs + one Exp lane; K read once per key (+ a copy
// into the tile buffer, a fraction of the α * group dot products that reuse it).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_scores.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/attention_scores.h"
#include "kernels/cpu/ops-inl.h"
#include "kernels/cpu/transpose16x16.h"
#include "util/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace scores {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

inline constexpr int64_t kTileKeys = 32;       // K rows per gathered tile (16 KiB at head_dim 128)
inline constexpr int64_t kKeysPerTask = 512;   // keys per observation task
inline constexpr int64_t kVectorsPerStep = 4;  // query vectors scored together against a tile
// Below this many multiply-adds the calling thread does everything.
inline constexpr int64_t kMinParallelMacs = 1 << 16;

inline int64_t RoundUpToVectors(int64_t n) {
  const auto N = static_cast<int64_t>(hn::Lanes(DF()));
  return (n + N - 1) / N * N;
}

// The one place the kernels read K: rows [key0, key0 + count) of kv_head into dst, row j at
// dst + j * dp, zero padded from head_dim to dp.
HWY_INLINE void GatherKeys(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t count,
                           int64_t dp, float* HWY_RESTRICT dst) {
  for (int64_t j = 0; j < count; ++j) {
    const int64_t offset = kv_offset(kv, key0 + j, kv_head);
    if (is_block_kv_dtype(kv.dtype)) {  // row-local Q8_0 / Q4_1 blocks
      DequantizeKvRow(kv.dtype, kv_block_row(kv, false, offset), dst + j * dp, kv.head_dim);
    } else if (kv.dtype == DType::kF16) {
      for (int64_t c = 0; c < kv.head_dim; ++c) dst[j * dp + c] = f16_to_f32(kv.k_f16[offset + c]);
    } else {
      std::memcpy(dst + j * dp, kv.k + offset, static_cast<size_t>(kv.head_dim) * sizeof(float));
    }
    std::fill(dst + j * dp + kv.head_dim, dst + (j + 1) * dp, 0.0f);
  }
}

// The tile's keys along the lanes, a vector of N keys (N = lanes) at a time: key j's channel c
// at kt[(j / N * dp + c) * N + j % N], keys from `count` on 0. From the pool's rows where they
// are f32 and whole vectors long, else from the rows GatherKeys puts in `keys`.
HWY_INLINE void TransposeKeys(const PagedKv& kv, int64_t kv_head, int64_t key0, int64_t count,
                              int64_t dp, int64_t tp, const float* HWY_RESTRICT zero,
                              float* HWY_RESTRICT keys, float* HWY_RESTRICT kt) {
  const auto N = static_cast<int64_t>(hn::Lanes(DF()));
  const bool direct = kv.dtype == DType::kF32 && kv.head_dim == dp;
  if (!direct) GatherKeys(kv, kv_head, key0, count, dp, keys);
  const auto row = [&](int64_t j) -> const float* {
    if (j >= count) return zero;
    return direct ? kv.k + kv_offset(kv, key0 + j, kv_head) : keys + j * dp;
  };
#if HWY_ARCH_X86_64 && HWY_TARGET == HWY_AVX3
  for (int64_t k0 = 0; k0 < tp; k0 += 16) {
    const float* rows[16];
    for (int64_t i = 0; i < 16; ++i) rows[i] = row(k0 + i);
    for (int64_t c0 = 0; c0 < dp; c0 += 16) {
      __m512i v[16];
      for (int64_t i = 0; i < 16; ++i) v[i] = _mm512_loadu_si512(rows[i] + c0);
      Transpose16x16(v, reinterpret_cast<uint8_t*>(kt + (k0 / 16 * dp + c0) * 16));
    }
  }
#else
  for (int64_t j = 0; j < tp; ++j) {
    const float* k = row(j);
    float* out = kt + j / N * dp * N + j % N;
    for (int64_t c = 0; c < dp; ++c) out[c * N] = k[c];
  }
#endif
}

// s[r * tp + j] = <q_r, k_j> for r < num_m (<= kVectorsPerStep) query vectors (q_r at q + r * dp)
// and the tp keys of kt (TransposeKeys' layout).
HWY_INLINE void ScoreVectors(const float* HWY_RESTRICT q, int64_t num_m, int64_t dp,
                             const float* HWY_RESTRICT kt, int64_t head_dim, int64_t tp,
                             float* HWY_RESTRICT s) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  if (num_m == kVectorsPerStep) {
    for (; j + 2 * N <= tp; j += 2 * N) {  // 4 vectors x 2 key vectors: 8 accumulators
      const float* kt0 = kt + j / N * dp * N;
      const float* kt1 = kt0 + dp * N;
      VF a[kVectorsPerStep][2];
      for (auto& pair : a) pair[0] = pair[1] = hn::Zero(d);
      for (int64_t c = 0; c < head_dim; ++c) {
        const VF k0 = hn::Load(d, kt0 + c * N);
        const VF k1 = hn::Load(d, kt1 + c * N);
        for (int64_t r = 0; r < kVectorsPerStep; ++r) {
          const VF qv = hn::Set(d, q[r * dp + c]);
          a[r][0] = hn::MulAdd(qv, k0, a[r][0]);
          a[r][1] = hn::MulAdd(qv, k1, a[r][1]);
        }
      }
      for (int64_t r = 0; r < kVectorsPerStep; ++r) {
        hn::Store(a[r][0], d, s + r * tp + j);
        hn::Store(a[r][1], d, s + r * tp + j + N);
      }
    }
  }
  for (; j < tp; j += N) {  // the rest, a vector of keys and a query vector at a time
    const float* ktj = kt + j / N * dp * N;
    for (int64_t r = 0; r < num_m; ++r) {
      VF a = hn::Zero(d);
      for (int64_t c = 0; c < head_dim; ++c)
        a = hn::MulAdd(hn::Set(d, q[r * dp + c]), hn::Load(d, ktj + c * N), a);
      hn::Store(a, d, s + r * tp + j);
    }
  }
}

struct ObservationProblem {
  const PagedKv& kv;
  const AttentionQuery& window;
  const float* row_lse;
  int64_t num_keys;
  float* scores;
  int64_t group;
  int64_t num_vectors;  // rows x group
  int64_t dp;           // head_dim rounded up to whole vectors
  int64_t tp;           // kTileKeys rounded up to whole vectors
};

// Per-thread buffers (aligned).
struct ObservationScratch {
  hwy::AlignedFreeUniquePtr<float[]> buffer;
  float* q;                    // [num_vectors][dp] staged, scaled queries
  float* keys;                 // [kTileKeys][dp] gathered K rows
  float* kt;                   // [tp][dp] the same keys along the lanes (TransposeKeys)
  float* zero;                 // [dp] zeros: the rows past a tile's last key
  float* s;                    // [kVectorsPerStep][tp] scores, then probabilities
  float* acc;                  // [tp] per-key sums of the tile
  std::vector<float> lse;      // [num_vectors]
  std::vector<int64_t> first;  // [num_vectors] keys >= first are visible (sliding window; else 0)
  std::vector<int64_t> limit;  // [num_vectors] keys < limit are visible

  explicit ObservationScratch(const ObservationProblem& p)
      : lse(static_cast<size_t>(p.num_vectors)),
        first(static_cast<size_t>(p.num_vectors)),
        limit(static_cast<size_t>(p.num_vectors)) {
    buffer = hwy::AllocateAligned<float>(static_cast<size_t>(
        (p.num_vectors + kTileKeys + 1) * p.dp + p.dp * p.tp + (kVectorsPerStep + 1) * p.tp));
    q = buffer.get();
    keys = q + p.num_vectors * p.dp;
    kt = keys + kTileKeys * p.dp;
    zero = kt + p.dp * p.tp;
    std::fill(zero, zero + p.dp, 0.0f);
    s = zero + p.dp;
    acc = s + kVectorsPerStep * p.tp;
  }
};

HWY_NOINLINE void ObservationTask(const ObservationProblem& p, int64_t kv_head, int64_t key_begin,
                                  int64_t key_end, ObservationScratch& sc) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t head_dim = p.kv.head_dim;
  const AttentionQuery& w = p.window;
  float* out = p.scores + kv_head * p.num_keys;
  std::fill(out + key_begin, out + key_end, 0.0f);

  // Stage this kv head's query vectors.
  int64_t max_limit = 0;
  const VF scale = hn::Set(d, w.scale);
  for (int64_t m = 0; m < p.num_vectors; ++m) {
    const int64_t row = m / p.group;
    const int64_t head = kv_head * p.group + m % p.group;
    const float* src = w.q + (row * w.num_heads + head) * head_dim;
    float* dst = sc.q + m * p.dp;
    int64_t c = 0;
    for (; c + N <= head_dim; c += N) hn::Store(hn::Mul(hn::LoadU(d, src + c), scale), d, dst + c);
    if (c < head_dim) {
      hn::Store(hn::Mul(LoadTail(d, src + c, static_cast<size_t>(head_dim - c), 0.0f), scale), d,
                dst + c);
    }
    // Block pools: the rounded query paged_attention scores with (block_kv_query).
    if (is_block_kv_dtype(p.kv.dtype)) RoundToQ8Blocks(dst, head_dim);
    sc.lse[static_cast<size_t>(m)] = p.row_lse[row * w.num_heads + head];
    sc.first[static_cast<size_t>(m)] = first_visible_key(w, static_cast<size_t>(row));
    sc.limit[static_cast<size_t>(m)] = int64_t{w.positions[static_cast<size_t>(row)]} + 1;
    max_limit = std::max(max_limit, sc.limit[static_cast<size_t>(m)]);
  }

  for (int64_t key0 = key_begin; key0 < std::min(key_end, max_limit); key0 += kTileKeys) {
    const int64_t count = std::min({kTileKeys, key_end - key0, max_limit - key0});
    // Keys along the lanes: a vector of scores is then broadcast query element x key vector,
    // multiply-adds with no horizontal sums (which held the row-by-row dot products to ~30% of
    // the FMA peak: attention_bench Observation).
    TransposeKeys(p.kv, kv_head, key0, count, p.dp, p.tp, sc.zero, sc.keys, sc.kt);
    for (int64_t i = 0; i < p.tp; i += N) hn::Store(hn::Zero(d), d, sc.acc + i);
    for (int64_t m0 = 0; m0 < p.num_vectors; m0 += kVectorsPerStep) {
      const int64_t num_m = std::min(kVectorsPerStep, p.num_vectors - m0);
      ScoreVectors(sc.q + m0 * p.dp, num_m, p.dp, sc.kt, head_dim, p.tp, sc.s);
      for (int64_t r = 0; r < num_m; ++r) {
        const auto m = static_cast<size_t>(m0 + r);
        float* s_row = sc.s + r * p.tp;
        const int64_t num_valid = std::clamp<int64_t>(sc.limit[m] - key0, 0, count);
        if (num_valid == 0) continue;
        std::fill(s_row + num_valid, s_row + p.tp, -std::numeric_limits<float>::infinity());
        const int64_t num_before = std::clamp<int64_t>(sc.first[m] - key0, 0, num_valid);
        std::fill(s_row, s_row + num_before,
                  -std::numeric_limits<float>::infinity());  // older than the window
        const VF shift = hn::Set(d, sc.lse[m]);
        for (int64_t i = 0; i < p.tp; i += N) {
          const VF prob = ExpOfScores(d, hn::Sub(hn::Load(d, s_row + i), shift));  // exp(-inf) = 0
          hn::Store(hn::Add(hn::Load(d, sc.acc + i), prob), d, sc.acc + i);
        }
      }
    }
    std::copy(sc.acc, sc.acc + count, out + key0);
  }
}

inline void ObservationScores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                              int64_t num_keys, float* out, ThreadPool& pool) {
  if (num_keys <= 0) return;
  const int64_t group = window.num_heads / kv.num_kv_heads;
  const auto num_rows = static_cast<int64_t>(window.positions.size());
  if (num_rows == 0) {
    std::fill(out, out + kv.num_kv_heads * num_keys, 0.0f);
    return;
  }
  const ObservationProblem problem{kv,
                                   window,
                                   row_lse,
                                   num_keys,
                                   out,
                                   group,
                                   num_rows * group,
                                   RoundUpToVectors(kv.head_dim),
                                   RoundUpToVectors(kTileKeys)};
  const int64_t chunks_per_head = (num_keys + kKeysPerTask - 1) / kKeysPerTask;
  const int64_t num_tasks = kv.num_kv_heads * chunks_per_head;
  const auto run = [&](int64_t begin, int64_t end) HWY_ATTR {
    ObservationScratch scratch(problem);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t key_begin = t % chunks_per_head * kKeysPerTask;
      ObservationTask(problem, t / chunks_per_head, key_begin,
                      std::min(num_keys, key_begin + kKeysPerTask), scratch);
    }
  };
  const int64_t macs = num_rows * window.num_heads * num_keys * kv.head_dim;
  if (pool.num_threads() > 1 && num_tasks > 1 && macs >= kMinParallelMacs) {
    pool.parallel_for(num_tasks, run, /*grain=*/1);
  } else {
    run(0, num_tasks);
  }
}

// ----------------------------------------------------------------------------- summaries

inline float* SummaryMin(const KeySummaries& s, const PagedKv& kv, int64_t page, int64_t kv_head) {
  return s.data + page * s.page_stride +
         kv_head * key_summary_floats(kv.head_dim, kv.page_size, s.key_halves);
}

inline uint8_t* HalfBits(float* min, int64_t head_dim) {
  return reinterpret_cast<uint8_t*>(min + 2 * head_dim);
}

// The page's half bits (attention_scores.h) from its gathered rows; unfilled slots repeat
// slot 0's, so that they never raise the page's bound. Compared a vector of channels at a time
// into slot-major bits, then turned channel-major bit by bit (integers only).
inline void HalfBitsOfRows(const float* rows, int64_t count, int64_t dp, int64_t page_size,
                           int64_t head_dim, float* min) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const float* max = min + head_dim;
  // key_bytes covers the padded row, so that a vector's bits never spill into the next slot's.
  const int64_t bytes = key_half_bytes(page_size), key_bytes = (dp + 7) / 8;
  uint8_t* bits = HalfBits(min, head_dim);
  std::fill(bits, bits + head_dim * bytes, uint8_t{0});
  // by_slot[j * key_bytes + c / 8] bit c % 8: slot j above channel c's midpoint.
  std::vector<uint8_t> by_slot(static_cast<size_t>(page_size * key_bytes), 0);
  if (N >= 8) {
    for (int64_t c = 0; c < head_dim; c += N) {
      const auto rest = static_cast<size_t>(std::min(N, head_dim - c));
      const VF mid =
          hn::Mul(hn::Add(LoadTail(d, min + c, rest, 0.0f), LoadTail(d, max + c, rest, 0.0f)),
                  hn::Set(d, 0.5f));
      for (int64_t slot = 0; slot < count; ++slot) {
        // Lanes past head_dim compare the rows' zero padding with 0: never above.
        hn::StoreMaskBits(d, hn::Gt(hn::Load(d, rows + slot * dp + c), mid),
                          by_slot.data() + slot * key_bytes + c / 8);
      }
    }
  } else {  // lanes of fewer than a byte: channel by channel
    for (int64_t slot = 0; slot < count; ++slot) {
      for (int64_t c = 0; c < head_dim; ++c) {
        if (rows[slot * dp + c] > 0.5f * (min[c] + max[c])) {
          by_slot[static_cast<size_t>(slot * key_bytes + c / 8)] |=
              static_cast<uint8_t>(1 << (c % 8));
        }
      }
    }
  }
  for (int64_t slot = 0; slot < page_size; ++slot) {
    const uint8_t* from = by_slot.data() + (slot < count ? slot : 0) * key_bytes;
    for (int64_t c = 0; c < head_dim; ++c) {
      if ((from[c / 8] >> (c % 8)) & 1) {
        bits[c * bytes + slot / 8] |= static_cast<uint8_t>(1 << (slot % 8));
      }
    }
  }
}

// min/max of `count` gathered rows (dp apart) into min[0..head_dim) / max[0..head_dim);
// `extend`: fold into the values already there.
HWY_INLINE void MinMaxRows(const float* HWY_RESTRICT rows, int64_t count, int64_t dp,
                           int64_t head_dim, bool extend, float* HWY_RESTRICT min,
                           float* HWY_RESTRICT max) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t c = 0; c < head_dim; c += N) {
    const auto rest = static_cast<size_t>(std::min(N, head_dim - c));
    const bool full = rest == static_cast<size_t>(N);
    VF lo = hn::Load(d, rows + c), hi = lo;
    for (int64_t j = 1; j < count; ++j) {
      const VF k = hn::Load(d, rows + j * dp + c);
      lo = hn::Min(lo, k);
      hi = hn::Max(hi, k);
    }
    if (extend) {
      lo = hn::Min(lo, full ? hn::LoadU(d, min + c) : LoadTail(d, min + c, rest, 0.0f));
      hi = hn::Max(hi, full ? hn::LoadU(d, max + c) : LoadTail(d, max + c, rest, 0.0f));
    }
    if (full) {
      hn::StoreU(lo, d, min + c);
      hn::StoreU(hi, d, max + c);
    } else {
      StoreTail(d, lo, min + c, rest);
      StoreTail(d, hi, max + c, rest);
    }
  }
}

inline void SummarizePage(const PagedKv& kv, int64_t block, int64_t first_slot, int64_t count,
                          const KeySummaries& summaries) {
  if (summaries.key_halves && first_slot > 0) {  // the midpoints may move: the page again
    count += first_slot;
    first_slot = 0;
  }
  const int64_t dp = RoundUpToVectors(kv.head_dim);
  auto rows = hwy::AllocateAligned<float>(static_cast<size_t>(count * dp));
  const int64_t page = kv.block_table[static_cast<size_t>(block)];
  for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
    GatherKeys(kv, h, block * kv.page_size + first_slot, count, dp, rows.get());
    float* min = SummaryMin(summaries, kv, page, h);
    MinMaxRows(rows.get(), count, dp, kv.head_dim, /*extend=*/first_slot > 0, min,
               min + kv.head_dim);
    if (summaries.key_halves) HalfBitsOfRows(rows.get(), count, dp, kv.page_size, kv.head_dim, min);
  }
}

// ----------------------------------------------------------------------------- bounds

inline void PageUpperBounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                            int64_t num_heads, int64_t num_blocks, float* bounds) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t head_dim = kv.head_dim;
  const int64_t group = num_heads / kv.num_kv_heads;
  for (int64_t kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t page = kv.block_table[static_cast<size_t>(b)];
      const float* min = SummaryMin(summaries, kv, page, kv_head);
      const float* max = min + head_dim;
      VF acc = hn::Zero(d);
      for (int64_t g = 0; g < group; ++g) {
        const float* qh = q + (kv_head * group + g) * head_dim;
        int64_t c = 0;
        for (; c + N <= head_dim; c += N) {
          const VF qv = hn::LoadU(d, qh + c);
          acc = hn::Add(
              acc, hn::Max(hn::Mul(qv, hn::LoadU(d, min + c)), hn::Mul(qv, hn::LoadU(d, max + c))));
        }
        if (c < head_dim) {  // zero padding adds max(0, 0) = 0
          const auto rest = static_cast<size_t>(head_dim - c);
          const VF qv = LoadTail(d, qh + c, rest, 0.0f);
          acc = hn::Add(acc, hn::Max(hn::Mul(qv, LoadTail(d, min + c, rest, 0.0f)),
                                     hn::Mul(qv, LoadTail(d, max + c, rest, 0.0f))));
        }
      }
      bounds[kv_head * num_blocks + b] = ReduceSum(d, acc);
    }
  }
}

// page_upper_bounds with key halves. Per page, lower[c] = the group's sum of max(q·min, q·mid)
// bounds channel c for a key in the lower half and lower[c] + raise[c] (the group's sum of
// max(q·mid, q·max)) for one in the upper half; a key's bound is sum(lower) + the raises its
// bits select. The bits are channel-major: one vector holds N slots' bounds, and channel c adds
// raise[c] to the slots its bits select, with no reduction per key.
inline void PageUpperBoundsByHalves(const PagedKv& kv, const KeySummaries& summaries,
                                    const float* q, int64_t num_heads, int64_t num_blocks,
                                    float* bounds) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t head_dim = kv.head_dim, page_size = kv.page_size;
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t dp = RoundUpToVectors(head_dim);
  const int64_t bytes = key_half_bytes(page_size);
  // Vectors of N slots whose bits start on a byte; otherwise slot by slot.
  const bool by_vectors = N >= 8 && page_size % N == 0;
  auto raise = hwy::AllocateAligned<float>(static_cast<size_t>(dp));
  for (int64_t kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t page = kv.block_table[static_cast<size_t>(b)];
      float* min = SummaryMin(summaries, kv, page, kv_head);
      const float* max = min + head_dim;
      VF base = hn::Zero(d);
      for (int64_t c = 0; c < dp; c += N) {
        // LoadTail only for a partial vector: it assembles lanes through the stack.
        const auto rest = static_cast<size_t>(std::min(N, head_dim - c));
        const auto load = [&](const float* p) HWY_ATTR {
          return rest == static_cast<size_t>(N) ? hn::LoadU(d, p) : LoadTail(d, p, rest, 0.0f);
        };
        const VF lo = load(min + c), hi = load(max + c);
        const VF mid = hn::Mul(hn::Add(lo, hi), hn::Set(d, 0.5f));
        VF lower = hn::Zero(d), upper = hn::Zero(d);
        for (int64_t g = 0; g < group; ++g) {
          const VF qv = load(q + (kv_head * group + g) * head_dim + c);
          lower = hn::Add(lower, hn::Max(hn::Mul(qv, lo), hn::Mul(qv, mid)));
          upper = hn::Add(upper, hn::Max(hn::Mul(qv, mid), hn::Mul(qv, hi)));
        }
        base = hn::Add(base, lower);
        hn::Store(hn::Sub(upper, lower), d, raise.get() + c);
      }
      const float base_sum = ReduceSum(d, base);
      const uint8_t* bits = HalfBits(min, head_dim);
      float best = -std::numeric_limits<float>::infinity();
      if (by_vectors) {
        // Four sums, so that the adds do not wait on one another.
        const auto add_channel = [&](VF acc, int64_t c, int64_t first) HWY_ATTR {
          return hn::Add(acc, hn::IfThenElseZero(hn::LoadMaskBits(d, bits + c * bytes + first / 8),
                                                 hn::Set(d, raise[static_cast<size_t>(c)])));
        };
        for (int64_t first = 0; first < page_size; first += N) {
          VF acc0 = hn::Set(d, base_sum), acc1 = hn::Zero(d), acc2 = hn::Zero(d),
             acc3 = hn::Zero(d);
          int64_t c = 0;
          for (; c + 4 <= head_dim; c += 4) {
            acc0 = add_channel(acc0, c, first);
            acc1 = add_channel(acc1, c + 1, first);
            acc2 = add_channel(acc2, c + 2, first);
            acc3 = add_channel(acc3, c + 3, first);
          }
          for (; c < head_dim; ++c) acc0 = add_channel(acc0, c, first);
          const VF acc = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
          best = std::max(best, hn::GetLane(hn::MaxOfLanes(d, acc)));
        }
      } else {
        for (int64_t slot = 0; slot < page_size; ++slot) {
          float sum = base_sum;
          for (int64_t c = 0; c < head_dim; ++c) {
            if ((bits[c * bytes + slot / 8] >> (slot % 8)) & 1)
              sum += raise[static_cast<size_t>(c)];
          }
          best = std::max(best, sum);
        }
      }
      bounds[kv_head * num_blocks + b] = best;
    }
  }
}

}  // namespace scores

void ObservationScoresImpl(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                           int64_t num_keys, float* out, ThreadPool& pool) {
  scores::ObservationScores(kv, window, row_lse, num_keys, out, pool);
}
void SummarizePageImpl(const PagedKv& kv, int64_t block, int64_t first_slot, int64_t count,
                       const KeySummaries& summaries) {
  scores::SummarizePage(kv, block, first_slot, count, summaries);
}
void PageUpperBoundsImpl(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                         int64_t num_heads, int64_t num_blocks, float* bounds) {
  if (summaries.key_halves) {
    scores::PageUpperBoundsByHalves(kv, summaries, q, num_heads, num_blocks, bounds);
  } else {
    scores::PageUpperBounds(kv, summaries, q, num_heads, num_blocks, bounds);
  }
}
const char* AttentionScoresTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cassert>

#include "kernels/cpu/targets.h"

namespace sieve::kernels {

HWY_EXPORT(ObservationScoresImpl);
HWY_EXPORT(SummarizePageImpl);
HWY_EXPORT(PageUpperBoundsImpl);
HWY_EXPORT(AttentionScoresTargetName);

void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                        int64_t num_keys, float* scores, ThreadPool& pool) {
  assert(kv.num_kv_heads > 0 && window.num_heads % kv.num_kv_heads == 0);
  assert(num_keys <= static_cast<int64_t>(kv.block_table.size()) * kv.page_size);
  HWY_DYNAMIC_DISPATCH(ObservationScoresImpl)(kv, window, row_lse, num_keys, scores, pool);
}

void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                         const KeySummaries& summaries) {
  assert(num_filled >= 1 && num_filled <= kv.page_size);
  HWY_DYNAMIC_DISPATCH(SummarizePageImpl)(kv, block, 0, num_filled, summaries);
}

void extend_page_key_summary(const PagedKv& kv, int64_t position, const KeySummaries& summaries) {
  HWY_DYNAMIC_DISPATCH(SummarizePageImpl)
  (kv, position / kv.page_size, position % kv.page_size, 1, summaries);
}

void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                       int64_t num_heads, int64_t num_blocks, float* bounds) {
  assert(kv.num_kv_heads > 0 && num_heads % kv.num_kv_heads == 0);
  assert(num_blocks <= static_cast<int64_t>(kv.block_table.size()));
  HWY_DYNAMIC_DISPATCH(PageUpperBoundsImpl)(kv, summaries, q, num_heads, num_blocks, bounds);
}

std::string_view attention_scores_target_name() {
  return HWY_DYNAMIC_DISPATCH(AttentionScoresTargetName)();
}

}  // namespace sieve::kernels
#endif  // HWY_ONCE
