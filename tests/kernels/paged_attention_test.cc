// paged_attention against ref::paged_attention on every SIMD target: prefill, chunked prefill
// and decode; sequence lengths around page boundaries; GQA groups 1/2/4/8; head_dim 8/64/128
// (head_dim 8 is a partial vector on AVX2 and AVX-512); pools of 1 and 3 threads (3 threads
// split long decodes across threads). The K/V of each sequence sit in shuffled,
// non-contiguous pages of a larger pool; every float the kernel must not read (other pages,
// unused slots, gaps between heads and pages) is NaN, so a stray read shows up in the output.
#include "kernels/paged_attention.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <cstdio>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/ops.h"
#include "kernels_test_util.h"
#include "paged_kv_test_util.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

struct Outputs {
  std::vector<float> out, row_max, row_lse;
  Outputs(int64_t num_q, int64_t num_heads, int64_t head_dim, float fill)
      : out(static_cast<size_t>(num_q * num_heads * head_dim + 1), fill),
        row_max(static_cast<size_t>(num_q * num_heads + 1), fill),
        row_lse(static_cast<size_t>(num_q * num_heads + 1), fill) {}
  AttentionOutput view() { return {out.data(), row_max.data(), row_lse.data()}; }
};

std::string describe(const CacheShape& shape, const std::vector<int32_t>& positions, int64_t group,
                     int num_threads) {
  std::ostringstream s;
  s << "keys=" << shape.num_keys << " page_size=" << shape.page_size
    << " kv_heads=" << shape.num_kv_heads << " group=" << group << " head_dim=" << shape.head_dim
    << " num_q=" << positions.size() << " first_pos=" << (positions.empty() ? -1 : positions[0])
    << " dtype=" << to_string(shape.dtype) << " threads=" << num_threads;
  return s.str();
}

// Runs the kernel and the reference on random queries (uniform in [q_lo, q_hi]) and
// compares every output: out within 1e-5 (V is in [-1, 1], outputs are averages of it), row max
// and lse within 1e-5 * (1 + |value|). Also checks nothing is written past the outputs.
void expect_matches_ref(const TestCache& cache, const std::vector<int32_t>& positions,
                        int64_t group, ThreadPool& pool, uint32_t seed, float q_lo = -1.0f,
                        float q_hi = 1.0f, std::optional<int32_t> window = std::nullopt,
                        bool chunk_tiles = false) {
  const CacheShape& shape = cache.shape();
  const int64_t num_q = static_cast<int64_t>(positions.size());
  const int64_t num_heads = shape.num_kv_heads * group;
  const std::vector<float> q = random_floats(num_q * num_heads * shape.head_dim, seed, q_lo, q_hi);
  const AttentionQuery query{q.data(),  positions,
                             num_heads, 1.0f / std::sqrt(static_cast<float>(shape.head_dim)),
                             window,    chunk_tiles};
  constexpr float kSentinel = 12345.0f;
  Outputs got(num_q, num_heads, shape.head_dim, kSentinel);
  Outputs want(num_q, num_heads, shape.head_dim, kSentinel);
  paged_attention(cache.view(), query, got.view(), pool);
  ref::paged_attention(cache.view(), query, want.view());

  const std::string what = describe(shape, positions, group, pool.num_threads());
  for (int64_t i = 0; i < num_q; ++i) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t idx = i * num_heads + h;
      ASSERT_NEAR(got.row_max[idx], want.row_max[idx], 1e-5 * (1 + std::fabs(want.row_max[idx])))
          << what << " row " << i << " head " << h;
      ASSERT_NEAR(got.row_lse[idx], want.row_lse[idx], 1e-5 * (1 + std::fabs(want.row_lse[idx])))
          << what << " row " << i << " head " << h;
      for (int64_t d = 0; d < shape.head_dim; ++d) {
        const int64_t o = idx * shape.head_dim + d;
        ASSERT_NEAR(got.out[o], want.out[o], 1e-5)
            << what << " row " << i << " head " << h << " dim " << d;
      }
    }
  }
  EXPECT_EQ(got.out.back(), kSentinel) << what << ": wrote past out";
  EXPECT_EQ(got.row_max.back(), kSentinel) << what << ": wrote past row_max";
  EXPECT_EQ(got.row_lse.back(), kSentinel) << what << ": wrote past row_lse";
}

class PagedAttention : public PerTargetTest {};

TEST_P(PagedAttention, DispatchFollowsTheForcedTarget) {
  EXPECT_EQ(paged_attention_target_name(), GetParam());
}

// num_q = n at positions 0..n-1: causal self-attention of a whole prompt.
TEST_P(PagedAttention, Prefill) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 100;
  for (int64_t len : {1, 15, 16, 17, 100}) {
    for (int64_t head_dim : {8, 64, 128}) {
      const TestCache cache({.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim}, ++seed);
      for (int64_t group : {1, 2, 4, 8}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          expect_matches_ref(cache, position_range(0, len), group, *pool, ++seed);
        }
      }
    }
  }
  // A long prompt: many row tiles, causal masking on the diagonal tiles only.
  const TestCache cache({.num_keys = 1000, .num_kv_heads = 1, .head_dim = 64}, ++seed);
  for (int64_t group : {1, 4})
    expect_matches_ref(cache, position_range(0, 1000), group, pool3, ++seed);
}

// A cache of `len` keys: the decode row, a 20-row chunk at the end and a prefill of the first
// 40 rows, each against the reference (seed advances once per call).
void expect_decode_chunk_and_prefill_match(const TestCache& cache, int64_t len, int64_t group,
                                           ThreadPool& pool, uint32_t& seed) {
  expect_matches_ref(cache, {static_cast<int32_t>(len - 1)}, group, pool, ++seed);
  expect_matches_ref(cache, position_range(std::max<int64_t>(0, len - 20), len), group, pool,
                     ++seed);
  expect_matches_ref(cache, position_range(0, std::min<int64_t>(len, 40)), group, pool, ++seed);
}

// num_q = 1 at position n - 1. With 3 threads, n >= 512 splits the keys (flash-decoding).
TEST_P(PagedAttention, Decode) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 200;
  for (int64_t len : {1, 15, 16, 17, 100, 1000, 2500}) {
    for (int64_t head_dim : {8, 64, 128}) {
      const TestCache cache({.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim}, ++seed);
      for (int64_t group : {1, 2, 4, 8}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          expect_matches_ref(cache, {static_cast<int32_t>(len - 1)}, group, *pool, ++seed);
        }
      }
    }
  }
}

// Sliding-window attention: each row sees only its last W keys (window edges inside tiles,
// on tile and page boundaries, wider than the context, and in split decodes).
TEST_P(PagedAttention, SlidingWindowMasksOlderKeys) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 900;
  for (int64_t len : {17, 100, 1000}) {
    const TestCache cache({.num_keys = len, .num_kv_heads = 2, .head_dim = 64}, ++seed);
    for (int32_t window : {1, 7, 16, 33, 500, 4096}) {
      for (ThreadPool* pool : {&pool1, &pool3}) {
        expect_matches_ref(cache, position_range(0, len), 4, *pool, ++seed, -1.0f, 1.0f, window);
        expect_matches_ref(cache, {static_cast<int32_t>(len - 1)}, 2, *pool, ++seed, -1.0f, 1.0f,
                           window);
      }
    }
  }
  const TestCache long_cache({.num_keys = 2500, .num_kv_heads = 2, .head_dim = 64}, ++seed);
  expect_matches_ref(long_cache, {2499}, 4, pool3, ++seed, -1.0f, 1.0f,
                     1500);  // split keys, some all masked
}

// The window's meaning, independently of the kernels: a decode row under window W attends as a
// row that sees only the last W keys (the cache with its older slots dropped).
TEST(PagedAttentionRef, SlidingWindowEqualsAttentionOverTheLastKeysAlone) {
  const int64_t len = 50, head_dim = 16, num_heads = 2;
  const int32_t window = 9;
  const TestCache cache({.num_keys = len, .num_kv_heads = 1, .head_dim = head_dim}, 77);
  const std::vector<float> q = random_floats(num_heads * head_dim, 78, -1.0f, 1.0f);
  const std::vector<int32_t> last = {static_cast<int32_t>(len - 1)};
  Outputs windowed(1, num_heads, head_dim, 0.0f), alone(1, num_heads, head_dim, 0.0f);
  ref::paged_attention(cache.view(), {q.data(), last, num_heads, 0.25f, window}, windowed.view());
  PagedKv recent = cache.view();
  recent.key_offset = static_cast<int32_t>(len - window);
  const std::vector<int32_t> recent_last = {window - 1};
  ref::paged_attention(recent, {q.data(), recent_last, num_heads, 0.25f}, alone.view());
  for (int64_t i = 0; i < num_heads * head_dim; ++i)
    EXPECT_NEAR(windowed.out[i], alone.out[i], 1e-6) << i;
}

// A sparse stream whose first slots were dropped: key j at slot key_offset + j of the table.
// The kernel must read exactly keys [key_offset, key_offset + n) of the underlying slots.
TEST_P(PagedAttention, KeyOffsetSkipsTheFirstSlots) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 900;
  for (int32_t offset : {1, 5, 15}) {
    for (int64_t n : {1, 16, 40, 130}) {
      const TestCache cache({.num_keys = n + offset, .num_kv_heads = 2, .head_dim = 64}, ++seed);
      PagedKv shifted = cache.view();
      shifted.key_offset = offset;
      for (int64_t key : {int64_t{0}, n - 1}) {
        std::vector<float> a(64), b(64);
        load_kv_row(shifted, false, key, 1, a.data());
        load_kv_row(cache.view(), false, key + offset, 1, b.data());
        ASSERT_EQ(a, b);
      }
      for (int64_t group : {1, 4}) {
        const int64_t num_heads = 2 * group;
        for (const std::vector<int32_t>& positions :
             {std::vector<int32_t>{static_cast<int32_t>(n - 1)}, position_range(0, n)}) {
          const int64_t num_q = static_cast<int64_t>(positions.size());
          const std::vector<float> q = random_floats(num_q * num_heads * 64, ++seed);
          const AttentionQuery query{q.data(), positions, num_heads, 0.125f};
          for (ThreadPool* pool : {&pool1, &pool3}) {
            Outputs got(num_q, num_heads, 64, 0.0f), want(num_q, num_heads, 64, 0.0f);
            paged_attention(shifted, query, got.view(), *pool);
            ref::paged_attention(shifted, query, want.view());
            for (size_t i = 0; i < got.out.size(); ++i) {
              ASSERT_NEAR(got.out[i], want.out[i], 1e-5)
                  << "offset " << offset << " n " << n << " i " << i;
            }
            for (size_t i = 0; i < got.row_lse.size(); ++i)
              ASSERT_NEAR(got.row_lse[i], want.row_lse[i], 1e-4);
          }
        }
      }
    }
  }
}

// A chunk of a prompt whose earlier part is already cached: positions start mid-sequence.
TEST_P(PagedAttention, ChunkedPrefill) {
  ThreadPool pool1(1), pool2(2), pool3(3);
  struct Chunk {
    int64_t begin, num_q;
  };
  uint32_t seed = 300;
  for (const Chunk chunk : {Chunk{1, 15}, Chunk{16, 1}, Chunk{15, 17}, Chunk{20, 5}, Chunk{23, 5},
                            Chunk{50, 50}, Chunk{17, 83}, Chunk{990, 10}}) {
    const int64_t len = chunk.begin + chunk.num_q;
    for (int64_t head_dim : {8, 16, 64, 128}) {
      const TestCache cache({.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim}, ++seed);
      for (int64_t group : {1, 2, 4, 8}) {
        for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
          expect_matches_ref(cache, position_range(chunk.begin, len), group, *pool, ++seed);
        }
      }
    }
  }
  // A long chunk late in a long sequence, split across threads.
  const TestCache cache({.num_keys = 1000, .num_kv_heads = 2, .head_dim = 64}, ++seed);
  expect_matches_ref(cache, position_range(900, 1000), 2, pool3, ++seed);
}

// Short jobs that ask for chunk tiles (AttentionQuery::chunk_tiles: the observation window's
// recompute) are planned and run as prefill chunks: rows 1 to 32 at the end of short and long
// contexts, every pool dtype, against the reference.
TEST_P(PagedAttention, ShortJobsOnChunkTiles) {
  ThreadPool pool1(1), pool2(2);
  uint32_t seed = 350;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
    for (int64_t len : {40, 700}) {
      for (int64_t head_dim : {8, 64, 128}) {
        if (is_block_kv_dtype(dtype) && head_dim % 32 != 0) continue;
        const TestCache cache(
            {.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim, .dtype = dtype}, ++seed);
        for (int64_t rows : {1, 7, 32}) {
          for (int64_t group : {1, 4}) {
            for (ThreadPool* pool : {&pool1, &pool2}) {
              expect_matches_ref(cache, position_range(len - rows, len), group, *pool, ++seed,
                                 -1.0f, 1.0f, std::nullopt, /*chunk_tiles=*/true);
            }
          }
        }
      }
    }
  }
}

// Speculative decoding verifies k drafted tokens as one chunk and must give, token for token,
// what decoding them one by one gives; so a chunk's row must equal, bit for bit, the same row
// attended alone (the decode path), wherever the chunk starts and however many rows it has.
TEST_P(PagedAttention, ChunkRowsEqualTheirDecodeBitForBit) {
  ThreadPool pool1(1), pool2(2);
  uint32_t seed = 900;
  const auto expect_rows_equal_alone = [&](const TestCache& cache, int64_t group, int64_t begin,
                                           int64_t rows, ThreadPool& pool,
                                           std::optional<int32_t> window = std::nullopt) {
    const int64_t head_dim = cache.shape().head_dim;
    const std::vector<int32_t> positions = position_range(begin, begin + rows);
    const int64_t num_heads = 2 * group;
    const std::vector<float> q = random_floats(rows * num_heads * head_dim, ++seed, -4.0f, 4.0f);
    Outputs chunk(rows, num_heads, head_dim, 0.0f);
    paged_attention(cache.view(), {q.data(), positions, num_heads, 0.25f, window}, chunk.view(),
                    pool);
    for (int64_t i = 0; i < rows; ++i) {
      Outputs alone(1, num_heads, head_dim, 0.0f);
      const std::vector<int32_t> one = {positions[static_cast<size_t>(i)]};
      paged_attention(cache.view(),
                      {q.data() + i * num_heads * head_dim, one, num_heads, 0.25f, window},
                      alone.view(), pool);
      for (int64_t j = 0; j < num_heads * head_dim; ++j) {
        ASSERT_EQ(chunk.out[i * num_heads * head_dim + j], alone.out[j])
            << to_string(cache.shape().dtype) << " head_dim " << head_dim << " group " << group
            << " begin " << begin << " rows " << rows << " row " << i << " threads "
            << pool.num_threads() << " page_size " << cache.shape().page_size << " window "
            << window.value_or(0);
      }
    }
  };
  // Pages of other sizes: f32 / f16 jobs attend in chunks at absolute multiples of a length
  // that a piece need not be a multiple of (5-key pages: 515-key pieces, 320-key chunks), and
  // under a sliding window a chunk's rows start at different keys than the row alone.
  for (DType dtype : {DType::kF32, DType::kF16}) {
    for (int32_t page_size : {5, 8}) {
      const TestCache cache({.num_keys = 1100,
                             .num_kv_heads = 2,
                             .head_dim = 64,
                             .page_size = page_size,
                             .dtype = dtype},
                            ++seed);
      for (int64_t begin : {300, 515, 640, 1030}) {
        for (std::optional<int32_t> window :
             {std::optional<int32_t>{}, std::optional<int32_t>{40}, std::optional<int32_t>{700}}) {
          for (ThreadPool* pool : {&pool1, &pool2}) {
            expect_rows_equal_alone(cache, 4, begin, 7, *pool, window);
          }
        }
      }
    }
  }
  // Chunks that cross a key piece (kAttentionSplitKeys): the rows before the boundary see one
  // piece alone and a masked one in the chunk.
  for (DType dtype : {DType::kF32, DType::kQ4_1}) {
    const TestCache cache(
        {.num_keys = kAttentionSplitKeys + 24, .num_kv_heads = 2, .head_dim = 64, .dtype = dtype},
        ++seed);
    for (int64_t begin : {kAttentionSplitKeys - 6, kAttentionSplitKeys - 1, kAttentionSplitKeys}) {
      for (ThreadPool* pool : {&pool1, &pool2}) expect_rows_equal_alone(cache, 4, begin, 5, *pool);
    }
  }
  for (DType dtype : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
    for (int64_t head_dim : {16, 64, 128}) {
      if (is_block_kv_dtype(dtype) && head_dim % 32 != 0) continue;
      for (int64_t group : {1, 4}) {
        const TestCache cache(
            {.num_keys = 140, .num_kv_heads = 2, .head_dim = head_dim, .dtype = dtype}, ++seed);
        for (int64_t begin : {3, 16, 20, 23, 31, 100, 130}) {
          for (int64_t rows : {2, 5, 9}) {
            for (ThreadPool* pool : {&pool1, &pool2}) {
              const std::vector<int32_t> positions = position_range(begin, begin + rows);
              const int64_t num_heads = 2 * group;
              const std::vector<float> q =
                  random_floats(rows * num_heads * head_dim, ++seed, -4.0f, 4.0f);
              Outputs chunk(rows, num_heads, head_dim, 0.0f);
              paged_attention(cache.view(), {q.data(), positions, num_heads, 0.25f}, chunk.view(),
                              *pool);
              for (int64_t i = 0; i < rows; ++i) {
                Outputs alone(1, num_heads, head_dim, 0.0f);
                const std::vector<int32_t> one = {positions[static_cast<size_t>(i)]};
                paged_attention(cache.view(),
                                {q.data() + i * num_heads * head_dim, one, num_heads, 0.25f},
                                alone.view(), *pool);
                for (int64_t j = 0; j < num_heads * head_dim; ++j) {
                  ASSERT_EQ(chunk.out[i * num_heads * head_dim + j], alone.out[j])
                      << to_string(dtype) << " head_dim " << head_dim << " group " << group
                      << " begin " << begin << " rows " << rows << " row " << i << " threads "
                      << pool->num_threads();
                }
              }
            }
          }
        }
      }
    }
  }
}

// A decode row under kAttentionSplitKeys keys is one key piece: with more threads than pieces
// the plan shares its kv heads out among tasks, which must not change a bit.
TEST_P(PagedAttention, DecodeRowsEqualWhateverTheThreadsShareOut) {
  ThreadPool pool1(1), pool2(2), pool3(3);
  uint32_t seed = 1200;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
    const TestCache cache({.num_keys = 300, .num_kv_heads = 4, .head_dim = 64, .dtype = dtype},
                          ++seed);
    for (int32_t position : {0, 17, 299}) {
      const int64_t num_heads = 16, head_dim = 64;
      const std::vector<float> q = random_floats(num_heads * head_dim, ++seed, -4.0f, 4.0f);
      const std::vector<int32_t> one = {position};
      Outputs serial(1, num_heads, head_dim, 0.0f);
      paged_attention(cache.view(), {q.data(), one, num_heads, 0.25f}, serial.view(), pool1);
      for (ThreadPool* pool : {&pool2, &pool3}) {
        Outputs shared(1, num_heads, head_dim, 0.0f);
        paged_attention(cache.view(), {q.data(), one, num_heads, 0.25f}, shared.view(), *pool);
        for (int64_t j = 0; j < num_heads * head_dim; ++j) {
          ASSERT_EQ(serial.out[j], shared.out[j])
              << to_string(dtype) << " position " << position << " threads " << pool->num_threads();
        }
        EXPECT_EQ(serial.row_lse, shared.row_lse);
      }
    }
  }
}

// Head sizes that cut the value sweeps (8, 4, 2, 1 vectors, a partial vector) differently on
// each target, and more query heads per kv head than a task's usual budget.
TEST_P(PagedAttention, OtherHeadSizesAndGroups) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 350;
  for (int64_t head_dim : {1, 3, 24, 72, 80, 96, 112, 256}) {
    const TestCache cache({.num_keys = 600, .num_kv_heads = 3, .head_dim = head_dim}, ++seed);
    for (ThreadPool* pool : {&pool1, &pool3}) {
      expect_matches_ref(cache, {599}, 3, *pool, ++seed);
      expect_matches_ref(cache, position_range(560, 600), 2, *pool, ++seed);
    }
  }
  const TestCache cache({.num_keys = 300, .num_kv_heads = 1, .head_dim = 64}, ++seed);
  for (ThreadPool* pool : {&pool1, &pool3}) {
    expect_matches_ref(cache, {299}, 48, *pool, ++seed);
    expect_matches_ref(cache, position_range(290, 300), 48, *pool, ++seed);
  }
}

// F16 pools: prefill, a chunk and decode (split across 3 threads at 600 keys, head_dim 64),
// head sizes with a partial vector, page sizes that cut tiles. The reference reads the same
// halves.
TEST_P(PagedAttention, F16Pool) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 1500;
  for (int64_t len : {1, 17, 100, 600}) {
    for (int64_t head_dim : {8, 24, 64}) {
      const TestCache cache(
          {.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim, .dtype = DType::kF16}, ++seed);
      for (int64_t group : {1, 4}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          expect_decode_chunk_and_prefill_match(cache, len, group, *pool, seed);
        }
      }
    }
  }
  for (int32_t page_size : {1, 5, 64}) {
    const TestCache cache({.num_keys = 300,
                           .num_kv_heads = 2,
                           .head_dim = 64,
                           .page_size = page_size,
                           .dtype = DType::kF16},
                          ++seed);
    expect_matches_ref(cache, {299}, 4, pool3, ++seed);
    expect_matches_ref(cache, position_range(250, 300), 2, pool3, ++seed);
  }
}

// Q8_0 and Q4_1 pools (row-local blocks of 32): prefill, chunks, decode (split across 3 threads
// at 600+ keys), page sizes that cut tiles, GQA groups, a key offset. The reference reads the
// same quantized rows (scalar dequantize_row), so the tolerance is that of f32.
TEST_P(PagedAttention, QuantizedPools) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 2500;
  for (DType dtype : {DType::kQ8_0, DType::kQ4_1}) {
    for (int64_t len : {1, 17, 100, 700}) {
      for (int64_t head_dim : {32, 64, 128}) {
        const TestCache cache(
            {.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim, .dtype = dtype}, ++seed);
        for (int64_t group : {1, 4}) {
          for (ThreadPool* pool : {&pool1, &pool3}) {
            expect_decode_chunk_and_prefill_match(cache, len, group, *pool, seed);
          }
        }
      }
    }
    for (int32_t page_size : {1, 5, 16, 64}) {
      const TestCache cache({.num_keys = 300,
                             .num_kv_heads = 3,
                             .head_dim = 96,
                             .page_size = page_size,
                             .dtype = dtype},
                            ++seed);
      expect_matches_ref(cache, {299}, 2, pool3, ++seed);
      expect_matches_ref(cache, position_range(250, 300), 2, pool3, ++seed);
      expect_matches_ref(cache, {299}, 8, pool1, ++seed, -1.0f, 1.0f, 40);  // sliding window
    }
    const TestCache cache({.num_keys = 2500, .num_kv_heads = 2, .head_dim = 64, .dtype = dtype},
                          ++seed);
    expect_matches_ref(cache, {2499}, 4, pool3, ++seed, -8.0f, 8.0f);  // wide scores, split
    PagedKv shifted = cache.view();
    shifted.key_offset = 7;
    const std::vector<int32_t> last = {2000};
    const std::vector<float> q = random_floats(8 * 64, ++seed);
    const AttentionQuery query{q.data(), last, 8, 0.125f};
    Outputs got(1, 8, 64, 0.0f), want(1, 8, 64, 0.0f);
    paged_attention(shifted, query, got.view(), pool3);
    ref::paged_attention(shifted, query, want.view());
    for (size_t i = 0; i < got.out.size(); ++i) ASSERT_NEAR(got.out[i], want.out[i], 1e-5) << i;
  }
}

// What quantization costs, against f32 attention over the unquantized data (out relative L2
// error over all outputs, printed). Gaussian K/V (sd 1), queries sd 1, head_dim 128, 2 kv
// heads x group 4, a decode row and a 32-row chunk at 1024 keys. With one key channel an
// outlier (+20: channel outliers of real keys), keys quantize badly where the outlier's block
// sets the scale; rotate_heads on queries and keys (q·k unchanged) spreads it over all blocks.
// Sanity bounds: q8 < 1e-2 and q4 < 1.5e-1 on Gaussian data (rotated or not); rotation lowers
// the error of both with the outlier channel. Measured (this test's printout, decode): q8
// 9.9e-3, q4 1.1e-1 (Q4_1's step on 32 Gaussian values is ~4.1 / 15, an rms error of ~8% of the
// values' sd in V alone); with the outlier channel q8 2.6e-2 -> 1.1e-2 rotated, q4 2.5e-1 ->
// 1.55e-1. The query's rounding to Q8_0 (block_kv_query) costs q8 7.7e-3 -> 9.9e-3 and
// leaves q4 where it was (1.10e-1 -> 1.11e-1).
TEST(PagedAttentionQuantized, CloseToF32AndRotationHelpsWithOutlierChannels) {
  constexpr int64_t kKeys = 1024, kKvHeads = 2, kHeadDim = 128, kHeads = 8;  // group 4
  ThreadPool pool(3);
  const std::vector<int32_t> positions = position_range(kKeys - 32, kKeys);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto gaussian = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& f : x) f = normal(rng);
    return x;
  };
  const std::vector<float> q = gaussian(32 * kHeads * kHeadDim);
  const std::vector<float> v = gaussian(kKeys * kKvHeads * kHeadDim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const auto at = [](int64_t t, int64_t h, int64_t d) { return (t * kKvHeads + h) * kHeadDim + d; };
  const KvFill v_fill = [&](int64_t t, int64_t h, int64_t d) { return v[at(t, h, d)]; };
  struct Errors {
    double out = 0, lse = 0;
  };
  // Attention of `rows` query rows (the last ones, or only the last) on `dtype` pages of keys k
  // (rotated with the queries when `rotate`), against f32 attention on the unrotated keys.
  const auto measure = [&](const std::vector<float>& k, DType dtype, bool rotate, bool decode) {
    std::vector<float> k_stored = k, q_used = q;
    if (rotate) {
      rotate_heads(k_stored.data(), kKeys, kKvHeads, kHeadDim);
      rotate_heads(q_used.data(), 32, kHeads, kHeadDim);
    }
    const KvFill k_fill = [&](int64_t t, int64_t h, int64_t d) { return k_stored[at(t, h, d)]; };
    const KvFill k_plain = [&](int64_t t, int64_t h, int64_t d) { return k[at(t, h, d)]; };
    const CacheShape shape{.num_keys = kKeys, .num_kv_heads = kKvHeads, .head_dim = kHeadDim};
    CacheShape quantized = shape;
    quantized.dtype = dtype;
    const TestCache truth(shape, 1, k_plain, v_fill), cache(quantized, 1, k_fill, v_fill);
    const std::span<const int32_t> rows =
        decode ? std::span<const int32_t>(positions).last(1) : std::span<const int32_t>(positions);
    const int64_t first_row = decode ? 31 : 0;
    const auto num_q = static_cast<int64_t>(rows.size());
    Outputs got(num_q, kHeads, kHeadDim, 0.0f), want(num_q, kHeads, kHeadDim, 0.0f);
    paged_attention(cache.view(),
                    {q_used.data() + first_row * kHeads * kHeadDim, rows, kHeads, scale},
                    got.view(), pool);
    ref::paged_attention(
        truth.view(), {q.data() + first_row * kHeads * kHeadDim, rows, kHeads, scale}, want.view());
    double err = 0, norm = 0, lse_err = 0;
    for (int64_t i = 0; i < num_q * kHeads * kHeadDim; ++i) {
      err += std::pow(double{got.out[i]} - want.out[i], 2);
      norm += std::pow(double{want.out[i]}, 2);
    }
    for (int64_t i = 0; i < num_q * kHeads; ++i)
      lse_err = std::max(lse_err, std::fabs(double{got.row_lse[i]} - want.row_lse[i]));
    return Errors{std::sqrt(err / norm), lse_err};
  };
  const std::vector<float> k_gauss = gaussian(kKeys * kKvHeads * kHeadDim);
  std::vector<float> k_outlier = k_gauss;
  for (int64_t t = 0; t < kKeys; ++t) {
    for (int64_t h = 0; h < kKvHeads; ++h) k_outlier[at(t, h, 5)] += 20.0f;
  }
  for (DType dtype : {DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
    for (bool decode : {true, false}) {
      const Errors plain = measure(k_gauss, dtype, false, decode);
      const Errors rotated = measure(k_gauss, dtype, true, decode);
      const Errors outlier = measure(k_outlier, dtype, false, decode);
      const Errors outlier_rotated = measure(k_outlier, dtype, true, decode);
      std::printf(
          "[ measured ] %-5s %-6s out rel L2 err (max |lse err|): gaussian %.2e (%.1e), rotated "
          "%.2e (%.1e); outlier channel %.2e (%.1e), rotated %.2e (%.1e)\n",
          std::string(to_string(dtype)).c_str(), decode ? "decode" : "chunk", plain.out, plain.lse,
          rotated.out, rotated.lse, outlier.out, outlier.lse, outlier_rotated.out,
          outlier_rotated.lse);
      const double bound = dtype == DType::kQ4_1 ? 1.5e-1 : 1e-2;
      EXPECT_LT(plain.out, bound) << to_string(dtype);
      EXPECT_LT(rotated.out, bound) << to_string(dtype);
      if (dtype != DType::kF16) {
        EXPECT_LT(outlier_rotated.out, outlier.out) << to_string(dtype);
      }
    }
  }
}

// Rows need not be sorted or distinct: each sees exactly the keys up to its own position.
TEST_P(PagedAttention, AnyPositionsPerRow) {
  ThreadPool pool(3);
  const TestCache cache({.num_keys = 41, .num_kv_heads = 2, .head_dim = 64}, 400);
  expect_matches_ref(cache, {40, 7, 40, 0, 16, 15}, 4, pool, 401);
}

TEST_P(PagedAttention, OtherPageSizes) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 500;
  for (int32_t page_size : {1, 5, 32, 64}) {
    const TestCache cache(
        {.num_keys = 300, .num_kv_heads = 2, .head_dim = 64, .page_size = page_size}, ++seed);
    for (ThreadPool* pool : {&pool1, &pool3}) {
      expect_matches_ref(cache, {299}, 4, *pool, ++seed);
      expect_matches_ref(cache, position_range(250, 300), 2, *pool, ++seed);
    }
  }
}

// Large scores: most probabilities underflow, the running max changes by large steps.
TEST_P(PagedAttention, WideScoreRange) {
  ThreadPool pool1(1), pool3(3);
  const TestCache cache({.num_keys = 700, .num_kv_heads = 2, .head_dim = 64}, 600);
  for (ThreadPool* pool : {&pool1, &pool3}) {
    for (float q_range : {8.0f, 40.0f}) {
      expect_matches_ref(cache, {699}, 4, *pool, 601, -q_range, q_range);
      expect_matches_ref(cache, position_range(600, 700), 4, *pool, 602, -q_range, q_range);
    }
  }
}

// Keys drift towards the (positive) queries, so every tile raises the running max and the
// accumulator is rescaled at every step.
TEST_P(PagedAttention, RunningMaxGrowsEveryTile) {
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(700);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  const KvFill drift = [&](int64_t t, int64_t, int64_t) { return 0.002f * t + dist(rng); };
  const TestCache cache({.num_keys = 1000, .num_kv_heads = 2, .head_dim = 64}, 701, drift);
  for (ThreadPool* pool : {&pool1, &pool3}) {
    expect_matches_ref(cache, {999}, 8, *pool, 702, 0.5f, 1.0f);
    expect_matches_ref(cache, position_range(960, 1000), 1, *pool, 703, 0.5f, 1.0f);
  }
}

TEST_P(PagedAttention, RowStatsAreOptional) {
  ThreadPool pool(3);
  const TestCache cache({.num_keys = 600, .num_kv_heads = 2, .head_dim = 64}, 800);
  const std::vector<int32_t> positions = {599};
  const std::vector<float> q = random_floats(4 * 64, 801);
  const AttentionQuery query{q.data(), positions, 4, 0.125f};
  Outputs with(1, 4, 64, 0.0f);
  std::vector<float> without(4 * 64);
  paged_attention(cache.view(), query, with.view(), pool);
  paged_attention(cache.view(), query, {without.data(), nullptr, nullptr}, pool);
  for (size_t i = 0; i < without.size(); ++i) EXPECT_EQ(without[i], with.out[i]) << i;
}

// lse gives each key's attention weight: sum_t exp(score_t - lse) = 1 and
// sum_t exp(score_t - lse) * v_t = out.
TEST_P(PagedAttention, LseRecoversTheAttentionWeights) {
  ThreadPool pool(3);
  const CacheShape shape{.num_keys = 777, .num_kv_heads = 1, .head_dim = 64};
  const TestCache cache(shape, 900);
  const std::vector<int32_t> positions = {776};
  const std::vector<float> q = random_floats(64, 901, -3.0f, 3.0f);
  const float scale = 0.125f;
  const AttentionQuery query{q.data(), positions, 1, scale};
  Outputs got(1, 1, 64, 0.0f);
  paged_attention(cache.view(), query, got.view(), pool);
  const PagedKv kv = cache.view();
  double total = 0;
  std::vector<double> out(64);
  for (int64_t t = 0; t < shape.num_keys; ++t) {
    const float* k = kv.k + kv_offset(kv, t, 0);
    const float* v = kv.v + kv_offset(kv, t, 0);
    double dot = 0;
    for (int d = 0; d < 64; ++d) dot += double{q[d]} * k[d];
    const double p = std::exp(scale * dot - got.row_lse[0]);
    total += p;
    for (int d = 0; d < 64; ++d) out[d] += p * v[d];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  for (int d = 0; d < 64; ++d) EXPECT_NEAR(out[d], got.out[d], 1e-5) << d;
}

// Pages past 4 GiB of the pool base: page offsets must be computed in 64 bits. The pool is a
// sparse anonymous mapping; only the pages in the block table are written. The result must
// equal the reference on the same data laid out compactly.
TEST_P(PagedAttention, PageOffsetsBeyond4GiB) {
  const CacheShape shape{.num_keys = 70, .num_kv_heads = 2, .head_dim = 64};
  const TestCache compact(shape, 1000);
  const PagedKv small = compact.view();
  const int64_t page_stride = shape.num_kv_heads * shape.page_size * shape.head_dim;
  const int64_t first_page = ((int64_t{1} << 32) / 4) / page_stride + 1000;  // past 4 GiB
  const int64_t num_blocks = static_cast<int64_t>(small.block_table.size());
  const size_t bytes = static_cast<size_t>((first_page + 2 * num_blocks) * page_stride) * 4;
  void* k_mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (k_mem == MAP_FAILED) GTEST_SKIP() << "cannot map " << bytes << " bytes";
  void* v_mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (v_mem == MAP_FAILED) {
    munmap(k_mem, bytes);
    GTEST_SKIP() << "cannot map " << bytes << " bytes";
  }
  std::vector<int32_t> table;
  for (int64_t b = 0; b < num_blocks; ++b) {
    table.push_back(static_cast<int32_t>(first_page + 2 * (num_blocks - 1 - b)));  // descending
  }
  PagedKv big{static_cast<float*>(k_mem),
              static_cast<float*>(v_mem),
              page_stride,
              shape.page_size * shape.head_dim,
              shape.page_size,
              shape.head_dim,
              shape.num_kv_heads,
              table};
  for (int64_t t = 0; t < shape.num_keys; ++t) {
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
      std::memcpy(const_cast<float*>(big.k) + kv_offset(big, t, h),
                  small.k + kv_offset(small, t, h), shape.head_dim * sizeof(float));
      std::memcpy(const_cast<float*>(big.v) + kv_offset(big, t, h),
                  small.v + kv_offset(small, t, h), shape.head_dim * sizeof(float));
    }
  }
  ThreadPool pool(3);
  for (const std::vector<int32_t>& positions : {position_range(69, 70), position_range(0, 70)}) {
    const int64_t num_q = static_cast<int64_t>(positions.size()), num_heads = 4;
    const std::vector<float> q = random_floats(num_q * num_heads * shape.head_dim, 1001);
    const AttentionQuery query{q.data(), positions, num_heads, 0.125f};
    Outputs got(num_q, num_heads, shape.head_dim, 0.0f),
        want(num_q, num_heads, shape.head_dim, 0.0f);
    paged_attention(big, query, got.view(), pool);
    ref::paged_attention(small, query, want.view());
    for (size_t i = 0; i < got.out.size(); ++i) ASSERT_NEAR(got.out[i], want.out[i], 1e-5) << i;
    for (size_t i = 0; i < got.row_lse.size(); ++i) {
      ASSERT_NEAR(got.row_lse[i], want.row_lse[i], 1e-5 * (1 + std::fabs(want.row_lse[i]))) << i;
    }
  }
  munmap(k_mem, bytes);
  munmap(v_mem, bytes);
}

// AttentionQuery::prefill_dots. Long jobs (prefill chunks) on f32 / f16 pools with head_dim a
// multiple of 32, on an AVX3 target of a CPU with AVX512-BF16: close to the reference within
// bf16's rounding (8 significant bits: outputs, averages of V in [-1, 1], within 4 * 2^-8; row
// max and lse relatively, bf16-pv's as f32's, it does not touch the scores). Everywhere else
// (other targets, head sizes, short jobs such as decode) the choice changes no bit.
TEST_P(PagedAttention, Bf16DotsInLongJobs) {
  const bool dots = bf16_attention_supported();
  EXPECT_EQ(dots, GetParam().starts_with("AVX3") && bf16::supported());
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 2100;
  struct Case {
    int64_t len, rows, head_dim, group;
    DType dtype;
    int32_t page_size;
    std::optional<int32_t> window;
  };
  for (const Case& c :
       {Case{100, 100, 64, 1, DType::kF32, 16, {}}, Case{600, 200, 64, 4, DType::kF32, 16, {}},
        Case{1000, 1000, 64, 2, DType::kF16, 16, {}}, Case{301, 77, 128, 4, DType::kF32, 5, {}},
        Case{513, 513, 64, 1, DType::kF16, 32, 100}, Case{300, 100, 80, 2, DType::kF32, 16, {}},
        Case{700, 1, 64, 4, DType::kF32, 16, {}}, Case{700, 32, 64, 4, DType::kF16, 16, {}}}) {
    const TestCache cache({.num_keys = c.len,
                           .num_kv_heads = 2,
                           .head_dim = c.head_dim,
                           .page_size = c.page_size,
                           .dtype = c.dtype},
                          ++seed);
    const int64_t num_heads = 2 * c.group;
    const std::vector<int32_t> positions = position_range(c.len - c.rows, c.len);
    const std::vector<float> q = random_floats(c.rows * num_heads * c.head_dim, ++seed);
    AttentionQuery query{.q = q.data(),
                         .positions = positions,
                         .num_heads = num_heads,
                         .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                         .window = c.window};
    const bool eligible = dots && c.rows > kAttentionInvariantRows && c.head_dim % 32 == 0;
    for (ThreadPool* pool : {&pool1, &pool3}) {
      const std::string what = describe(cache.shape(), positions, c.group, pool->num_threads());
      Outputs f32(c.rows, num_heads, c.head_dim, 0.0f), want(c.rows, num_heads, c.head_dim, 0.0f);
      query.prefill_dots = PrefillDots::kF32;
      paged_attention(cache.view(), query, f32.view(), *pool);
      ref::paged_attention(cache.view(), query, want.view());
      float f32_diff = 0.0f;
      for (size_t i = 0; i < f32.out.size(); ++i)
        f32_diff = std::max(f32_diff, std::fabs(f32.out[i] - want.out[i]));
      for (PrefillDots mode : {PrefillDots::kBf16Pv, PrefillDots::kBf16}) {
        const std::string name = what + " " + std::string(prefill_dots_name(mode));
        Outputs got(c.rows, num_heads, c.head_dim, 0.0f);
        query.prefill_dots = mode;
        paged_attention(cache.view(), query, got.view(), *pool);
        if (!eligible) {
          for (size_t i = 0; i < got.out.size(); ++i) ASSERT_EQ(got.out[i], f32.out[i]) << name;
          for (size_t i = 0; i < got.row_lse.size(); ++i)
            ASSERT_EQ(got.row_lse[i], f32.row_lse[i]) << name;
          continue;
        }
        constexpr float kBound = 4.0f / 256;
        const float stats_bound = mode == PrefillDots::kBf16 ? kBound : 1e-5f;
        float max_diff = 0.0f;
        for (size_t i = 0; i < got.out.size(); ++i) {
          ASSERT_NEAR(got.out[i], want.out[i], kBound) << name << " output " << i;
          max_diff = std::max(max_diff, std::fabs(got.out[i] - want.out[i]));
        }
        for (size_t i = 0; i < got.row_lse.size(); ++i) {
          ASSERT_NEAR(got.row_lse[i], want.row_lse[i],
                      stats_bound * (1 + std::fabs(want.row_lse[i])))
              << name << " row " << i;
          ASSERT_NEAR(got.row_max[i], want.row_max[i],
                      stats_bound * (1 + std::fabs(want.row_max[i])))
              << name << " row " << i;
        }
        // The bf16 path really ran: its rounding shows, far above f32's.
        EXPECT_GT(max_diff, 1e-4f) << name;
        EXPECT_LT(f32_diff, 1e-5f) << name;
        std::printf("%s: max |out - ref| %.2e (f32 %.2e)\n", name.c_str(), max_diff, f32_diff);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, PagedAttention, ::testing::ValuesIn(available_targets()),
                         target_test_name);

// ----------------------------------------------------------------------------- the plan

// Every (row, kv head, key) the rows must see is covered by exactly one task; split tasks
// are page-aligned and each split (row tile, kv head) has one merge over its slots.
void expect_plan_covers(const PagedKv& kv, const AttentionQuery& q, int num_threads) {
  const AttentionPlan plan = plan_paged_attention(kv, q, num_threads);
  const int64_t num_q = static_cast<int64_t>(q.positions.size());
  const int64_t group = q.num_heads / kv.num_kv_heads;
  const int64_t max_keys = static_cast<int64_t>(kv.block_table.size()) * kv.page_size;
  std::vector<int> covered(static_cast<size_t>(num_q * kv.num_kv_heads * max_keys), 0);
  std::vector<int> slot_used(static_cast<size_t>(plan.num_slots), 0);
  std::vector<int> merged(static_cast<size_t>(num_q * kv.num_kv_heads), 0);
  for (const AttentionTask& task : plan.tasks) {
    EXPECT_LE(task.row_end - task.row_begin, plan.rows_per_tile);
    EXPECT_LE((task.row_end - task.row_begin) * (task.kv_head_end - task.kv_head_begin) * group,
              plan.max_query_vectors);
    if (task.partial_slot) {
      ++slot_used[*task.partial_slot];
      EXPECT_EQ(task.key_begin % kv.page_size, 0);
    }
    for (int64_t i = task.row_begin; i < task.row_end; ++i) {
      for (int64_t h = task.kv_head_begin; h < task.kv_head_end; ++h) {
        for (int64_t t = task.key_begin; t < task.key_end; ++t) {
          ++covered[(i * kv.num_kv_heads + h) * max_keys + t];
        }
        if (task.partial_slot) ++merged[i * kv.num_kv_heads + h];
      }
    }
  }
  for (int64_t i = 0; i < num_q; ++i) {
    for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
      for (int64_t t = first_visible_key(q, static_cast<size_t>(i)); t <= q.positions[i]; ++t) {
        ASSERT_EQ(covered[(i * kv.num_kv_heads + h) * max_keys + t], 1)
            << i << " " << h << " " << t;
      }
    }
  }
  for (int used : slot_used) EXPECT_EQ(used, 1);
  // Each merge covers exactly the split tasks of its (rows, kv head).
  for (const AttentionMerge& merge : plan.merges) {
    EXPECT_GE(merge.num_slots, 2);
    for (int64_t j = merge.first_slot; j < merge.first_slot + merge.num_slots; ++j) {
      const auto task = std::find_if(plan.tasks.begin(), plan.tasks.end(),
                                     [&](const AttentionTask& t) { return t.partial_slot == j; });
      ASSERT_NE(task, plan.tasks.end());
      EXPECT_EQ(task->row_begin, merge.row_begin);
      EXPECT_EQ(task->kv_head_begin + merge.head_in_slot, merge.kv_head);
    }
    for (int64_t i = merge.row_begin; i < merge.row_end; ++i) {
      merged[i * kv.num_kv_heads + merge.kv_head] -= static_cast<int>(merge.num_slots);
    }
  }
  for (int m : merged) EXPECT_EQ(m, 0);
  const auto cost = [](const AttentionTask& t) {
    return (t.key_end - t.key_begin) * (t.row_end - t.row_begin) *
           (t.kv_head_end - t.kv_head_begin);
  };
  for (size_t i = 1; i < plan.tasks.size(); ++i) {
    EXPECT_GE(cost(plan.tasks[i - 1]), cost(plan.tasks[i]));
  }
}

TEST(AttentionPlan, DecodeSplitsKeysAtFixedPiecesAndSharesFewTasksHeadsOut) {
  const std::vector<int32_t> table(1024);
  const PagedKv kv{nullptr, nullptr, 0, 0, 16, 128, 8, table};
  const std::vector<int32_t> decode = {16000};
  const AttentionQuery q{nullptr, decode, 32, 1.0f};  // group 4: 8 kv heads = 32 vectors
  // 16001 keys: pieces of kAttentionSplitKeys, each one task of all 8 kv heads while that
  // makes kAttentionTasksPerThread tasks per thread (1 or 2 threads); on 16 threads, two tasks
  // of 4 kv heads per piece.
  const auto pieces = static_cast<size_t>((16001 + kAttentionSplitKeys - 1) / kAttentionSplitKeys);
  ASSERT_GE(pieces, 2u);
  for (const auto& [threads, heads] : {std::pair{1, 8}, {2, 8}, {16, 4}}) {
    const AttentionPlan plan = plan_paged_attention(kv, q, threads);
    EXPECT_TRUE(plan.row_invariant);
    ASSERT_EQ(plan.tasks.size(), pieces * 8 / heads);
    for (const AttentionTask& task : plan.tasks) {
      EXPECT_EQ(task.kv_head_end - task.kv_head_begin, heads);
      EXPECT_EQ(task.key_begin % kAttentionSplitKeys, 0);
      EXPECT_LE(task.key_end - task.key_begin, kAttentionSplitKeys);
    }
    EXPECT_EQ(plan.merges.size(), 8u);  // one per kv head
    expect_plan_covers(kv, q, threads);
  }
  // Short contexts are not split; their kv heads are shared out among the threads, up to
  // kAttentionTasksPerThread tasks each (one task of all 8 on one thread, 8 of 1 on 2 or more).
  static_assert(kAttentionTasksPerThread == 4);
  const std::vector<int32_t> short_decode = {20};
  for (const auto& [threads, tasks] : {std::pair{1, 1}, {2, 8}, {3, 8}, {16, 8}}) {
    const AttentionPlan plan = plan_paged_attention(kv, {nullptr, short_decode, 32, 1.0f}, threads);
    EXPECT_TRUE(plan.merges.empty());
    EXPECT_EQ(std::ssize(plan.tasks), tasks) << threads << " threads";
    expect_plan_covers(kv, {nullptr, short_decode, 32, 1.0f}, threads);
  }
  // Group 8: two tasks of 4 kv heads per piece.
  const AttentionPlan wide = plan_paged_attention(kv, {nullptr, decode, 64, 1.0f}, 1);
  ASSERT_EQ(wide.tasks.size(), 2u * pieces);
  EXPECT_EQ(wide.max_query_vectors, 32);
  expect_plan_covers(kv, {nullptr, decode, 64, 1.0f}, 3);
}

TEST(AttentionPlan, PrefillTilesRowsAndCoversTheCausalTriangle) {
  const std::vector<int32_t> table(64);
  const std::vector<int32_t> positions = position_range(0, 1000);
  for (int64_t group : {1, 4, 8}) {
    const PagedKv kv{nullptr, nullptr, 0, 0, 16, 64, 2, table};
    const AttentionQuery q{nullptr, positions, 2 * group, 1.0f};
    const AttentionPlan plan = plan_paged_attention(kv, q, 2);
    // Longer jobs than kAttentionInvariantRows rows take the long jobs' budget per task.
    EXPECT_EQ(plan.rows_per_tile * group, kAttentionLongJobQueryVectorsPerTask);
    EXPECT_EQ(plan.max_query_vectors, kAttentionLongJobQueryVectorsPerTask);
    const std::vector<int32_t> last_rows = position_range(990, 990 + kAttentionInvariantRows);
    const AttentionQuery verification{nullptr, last_rows, 2 * group, 1.0f};
    EXPECT_EQ(plan_paged_attention(kv, verification, 2).max_query_vectors,
              std::min(kAttentionQueryVectorsPerTask, kAttentionInvariantRows * group));
    EXPECT_TRUE(plan_paged_attention(kv, verification, 2).row_invariant);
    // The same rows asking for chunk tiles (an observation window) are planned as a chunk.
    AttentionQuery window = verification;
    window.chunk_tiles = true;
    const AttentionPlan window_plan = plan_paged_attention(kv, window, 2);
    EXPECT_FALSE(window_plan.row_invariant);
    EXPECT_GT(window_plan.max_query_vectors, kAttentionQueryVectorsPerTask);
    expect_plan_covers(kv, window, 2);
    // A long prompt has tasks enough for the threads: nothing split.
    EXPECT_FALSE(plan.row_invariant);
    EXPECT_TRUE(plan.merges.empty());
    expect_plan_covers(kv, q, 2);
    expect_plan_covers(kv, q, 3);  // (fewer tasks than 4 per thread with group 1: split)
  }
  // A short chunk over a long context with many threads is split.
  const std::vector<int32_t> chunk = position_range(9000, 9010);
  const std::vector<int32_t> long_table(1024);
  const PagedKv kv{nullptr, nullptr, 0, 0, 16, 64, 2, long_table};
  expect_plan_covers(kv, {nullptr, chunk, 8, 1.0f}, 8);
  EXPECT_FALSE(plan_paged_attention(kv, {nullptr, chunk, 8, 1.0f}, 8).merges.empty());
}

// Under a sliding window, tasks start at the window of their rows (page-aligned): keys older
// than every row's window are not read at all.
TEST(AttentionPlan, SlidingWindowSkipsKeysOlderThanTheWindow) {
  const std::vector<int32_t> table(256);
  const PagedKv kv{nullptr, nullptr, 0, 0, 16, 64, 2, table};
  const auto keys_read = [](const AttentionPlan& plan) {
    int64_t total = 0;
    for (const AttentionTask& task : plan.tasks) total += task.key_end - task.key_begin;
    return total;
  };
  const std::vector<int32_t> prompt = position_range(0, 1000);
  const std::vector<int32_t> decode = {3999};
  for (int threads : {1, 3, 8}) {
    for (const std::vector<int32_t>* positions : {&prompt, &decode}) {
      const AttentionQuery full{nullptr, *positions, 8, 1.0f};
      const AttentionQuery windowed{nullptr, *positions, 8, 1.0f, 100};
      expect_plan_covers(kv, windowed, threads);
      EXPECT_LT(keys_read(plan_paged_attention(kv, windowed, threads)),
                keys_read(plan_paged_attention(kv, full, threads)) / 3);
    }
  }
  const AttentionPlan plan = plan_paged_attention(kv, {nullptr, decode, 8, 1.0f, 100}, 8);
  for (const AttentionTask& task : plan.tasks) EXPECT_GE(task.key_begin, (3999 - 99) / 16 * 16);
}

}  // namespace
}  // namespace sieve::kernels
