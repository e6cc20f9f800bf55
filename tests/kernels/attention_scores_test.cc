// Sparsity scores on every SIMD target:
//  - observation_scores after paged_attention's LSE equals the naive full softmax of the window
//    rows (own max and sum, in double), summed over the rows and the GQA group; and equals
//    ref::observation_scores on the same LSE. Shuffled non-contiguous pages, NaN everywhere the
//    kernel must not read (so keys past the last row's position must be skipped), lengths not
//    multiples of the page size, GQA groups 1/4/8 (8 query heads over 2 KV heads = group 4),
//    head_dim 8/64/128/72, pools of 1 and 3 threads.
//  - page key summaries (whole and partial pages; extended key by key) equal the reference.
//  - page upper bounds equal the reference and bound every key's q·k in the page.
#include "kernels/attention_scores.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/targets.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "kernels_test_util.h"
#include "paged_kv_test_util.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

// The naive definition: per window row and query head, softmax over keys [0, position] with
// its own max and sum (double); each key's probability summed over rows and the group.
std::vector<double> naive_window_mass(const PagedKv& kv, const AttentionQuery& w,
                                      int64_t num_keys) {
  const int64_t group = w.num_heads / kv.num_kv_heads;
  std::vector<double> mass(static_cast<size_t>(kv.num_kv_heads * num_keys), 0.0);
  for (size_t i = 0; i < w.positions.size(); ++i) {
    const int64_t n = int64_t{w.positions[i]} + 1;
    const int64_t first = w.window ? std::max<int64_t>(0, n - *w.window) : 0;  // sliding window
    for (int64_t h = 0; h < w.num_heads; ++h) {
      const int64_t kv_head = h / group;
      const float* q = w.q + (static_cast<int64_t>(i) * w.num_heads + h) * kv.head_dim;
      double scale = w.scale;
      std::vector<float> q_rounded(static_cast<size_t>(kv.head_dim));
      if (is_block_kv_dtype(kv.dtype)) {  // block pools score with the rounded query
        block_kv_query(q, w.scale, kv.head_dim, q_rounded.data());
        q = q_rounded.data();
        scale = 1.0;
      }
      std::vector<double> s(static_cast<size_t>(n));
      double max = -std::numeric_limits<double>::infinity();
      std::vector<float> k(static_cast<size_t>(kv.head_dim));
      for (int64_t t = first; t < n; ++t) {
        load_kv_row(kv, /*value=*/false, t, kv_head, k.data());
        double dot = 0;
        for (int64_t c = 0; c < kv.head_dim; ++c) dot += double{q[c]} * k[c];
        s[t] = scale * dot;
        max = std::max(max, s[t]);
      }
      double sum = 0;
      for (int64_t t = first; t < n; ++t) sum += std::exp(s[t] - max);
      for (int64_t t = first; t < n; ++t)
        mass[kv_head * num_keys + t] += std::exp(s[t] - max) / sum;
    }
  }
  return mass;
}

struct WindowCase {
  CacheShape shape;
  int64_t group = 4;
  std::vector<int32_t> positions;  // the window rows
  int64_t num_keys = 0;            // scored keys (>= last position + 1)
  float q_range = 1.0f;
  std::optional<int32_t> attention_window;  // sliding-window attention
};

std::string describe(const WindowCase& c, int threads) {
  std::ostringstream s;
  s << "keys=" << c.shape.num_keys << " page=" << c.shape.page_size
    << " kv_heads=" << c.shape.num_kv_heads << " group=" << c.group
    << " head_dim=" << c.shape.head_dim << " rows=" << c.positions.size()
    << " scored=" << c.num_keys << " q_range=" << c.q_range << " threads=" << threads;
  return s.str();
}

void expect_observation_matches(const WindowCase& c, ThreadPool& pool, uint32_t seed) {
  const TestCache cache(c.shape, seed);
  const PagedKv kv = cache.view();
  const int64_t num_heads = c.shape.num_kv_heads * c.group;
  const auto num_rows = static_cast<int64_t>(c.positions.size());
  const std::vector<float> q =
      random_floats(num_rows * num_heads * c.shape.head_dim, seed + 1, -c.q_range, c.q_range);
  const AttentionQuery window{q.data(), c.positions, num_heads,
                              1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)),
                              c.attention_window};
  // The flash kernel's LSE for the window rows, as the engine would have it after prefill.
  std::vector<float> out(static_cast<size_t>(num_rows * num_heads * c.shape.head_dim));
  std::vector<float> lse(static_cast<size_t>(num_rows * num_heads));
  paged_attention(kv, window, {out.data(), nullptr, lse.data()}, pool);

  constexpr float kSentinel = 777.0f;
  std::vector<float> got(static_cast<size_t>(c.shape.num_kv_heads * c.num_keys + 1), kSentinel);
  std::vector<float> want_ref(got.size() - 1);
  observation_scores(kv, window, lse.data(), c.num_keys, got.data(), pool);
  ref::observation_scores(kv, window, lse.data(), c.num_keys, want_ref.data());
  const std::vector<double> naive = naive_window_mass(kv, window, c.num_keys);

  const std::string what = describe(c, pool.num_threads());
  for (int64_t h = 0; h < c.shape.num_kv_heads; ++h) {
    double total = 0;
    for (int64_t t = 0; t < c.num_keys; ++t) {
      const size_t i = static_cast<size_t>(h * c.num_keys + t);
      ASSERT_NEAR(got[i], want_ref[i], 1e-5 * (1 + want_ref[i]))
          << what << " kv " << h << " t " << t;
      ASSERT_NEAR(got[i], naive[i], 2e-5 * (1 + naive[i])) << what << " kv " << h << " t " << t;
      total += got[i];
    }
    // Each (row, query head) distributes probability 1.
    EXPECT_NEAR(total, static_cast<double>(num_rows * c.group), 1e-4 * num_rows * c.group) << what;
  }
  EXPECT_EQ(got.back(), kSentinel) << what << ": wrote past the scores";
}

class AttentionScores : public PerTargetTest {};

TEST_P(AttentionScores, DispatchFollowsTheForcedTarget) {
  EXPECT_EQ(attention_scores_target_name(), GetParam());
}

// The last α rows of a prompt of n tokens, α in {1, 7, 32}; GQA 8 query heads over 2 KV heads.
TEST_P(AttentionScores, ObservationWindowEqualsNaiveSoftmax) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 100;
  for (int64_t len : {1, 15, 16, 17, 100, 1000}) {
    for (int64_t alpha : {1, 7, 32}) {
      if (alpha > len) continue;
      for (int64_t head_dim : {8, 64, 128}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          WindowCase c;
          c.shape = {.num_keys = len, .num_kv_heads = 2, .head_dim = head_dim};
          c.group = 4;
          c.positions = position_range(len - alpha, len);
          c.num_keys = len;
          expect_observation_matches(c, *pool, ++seed);
        }
      }
    }
  }
}

// Under a sliding window, keys older than a row's window get none of its attention.
TEST_P(AttentionScores, SlidingWindowRowsScoreOnlyTheirWindow) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 700;
  for (int64_t len : {17, 100, 1000}) {
    for (int32_t attention_window : {1, 5, 16, 40, 2000}) {
      for (ThreadPool* pool : {&pool1, &pool3}) {
        WindowCase c;
        c.shape = {.num_keys = len, .num_kv_heads = 2, .head_dim = 64};
        c.positions = position_range(len - std::min<int64_t>(len, 7), len);
        c.num_keys = len;
        c.attention_window = attention_window;
        expect_observation_matches(c, *pool, ++seed);
      }
    }
  }
}

TEST_P(AttentionScores, OtherGroupsPageSizesAndHeadSizes) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 200;
  for (int64_t group : {1, 8}) {
    for (int32_t page_size : {1, 5, 16, 64}) {
      for (int64_t head_dim : {3, 72}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          WindowCase c;
          c.shape = {
              .num_keys = 301, .num_kv_heads = 3, .head_dim = head_dim, .page_size = page_size};
          c.group = group;
          c.positions = position_range(301 - 20, 301);
          c.num_keys = 301;
          expect_observation_matches(c, *pool, ++seed);
        }
      }
    }
  }
}

// Keys no row sees score 0 and are never read (they are NaN); rows need not be the last ones
// nor sorted (a chunk's window mid-prompt).
TEST_P(AttentionScores, KeysPastEveryRowScoreZero) {
  ThreadPool pool(3);
  WindowCase c;
  c.shape = {.num_keys = 700, .num_kv_heads = 2, .head_dim = 64};
  c.positions = {650, 600, 640, 10};
  c.num_keys = 700 + 4;  // past the filled keys: NaN pages, must not be read
  expect_observation_matches(c, pool, 300);
  WindowCase mid = c;
  mid.num_keys = 651;
  expect_observation_matches(mid, pool, 301);
}

// Large scores: most probabilities underflow; the LSE still recovers the exact softmax.
TEST_P(AttentionScores, WideScoreRange) {
  ThreadPool pool(3);
  for (float q_range : {8.0f, 30.0f}) {
    WindowCase c;
    c.shape = {.num_keys = 900, .num_kv_heads = 2, .head_dim = 64};
    c.positions = position_range(868, 900);
    c.num_keys = 900;
    c.q_range = q_range;
    expect_observation_matches(c, pool, 400);
  }
}

// ----------------------------------------------------------------------------- summaries

struct SummaryBuffer {
  std::vector<float> data;
  KeySummaries view;
  SummaryBuffer(const PagedKv& kv, int64_t num_pages, float fill) {
    const int64_t stride = kv.num_kv_heads * 2 * kv.head_dim + 7;  // gaps between pages
    data.assign(static_cast<size_t>(num_pages * stride), fill);
    view = {data.data(), stride};
  }
};

int64_t max_page_id(const PagedKv& kv) {
  return *std::max_element(kv.block_table.begin(), kv.block_table.end()) + 1;
}

TEST_P(AttentionScores, PageSummariesMatchTheReference) {
  uint32_t seed = 500;
  for (int64_t head_dim : {3, 8, 64, 72}) {
    for (int32_t page_size : {1, 5, 16}) {
      const CacheShape shape{
          .num_keys = 83, .num_kv_heads = 2, .head_dim = head_dim, .page_size = page_size};
      const TestCache cache(shape, ++seed);
      const PagedKv kv = cache.view();
      const int64_t num_pages = max_page_id(kv);
      SummaryBuffer got(kv, num_pages, 5.0f), want(kv, num_pages, 5.0f),
          extended(kv, num_pages, kNaN);
      const int64_t num_blocks = (shape.num_keys + page_size - 1) / page_size;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t filled = std::min<int64_t>(page_size, shape.num_keys - b * page_size);
        summarize_page_keys(kv, b, filled, got.view);
        ref::summarize_page_keys(kv, b, filled, want.view);
      }
      for (int64_t t = 0; t < shape.num_keys; ++t) extend_page_key_summary(kv, t, extended.view);
      for (size_t i = 0; i < got.data.size(); ++i) {
        ASSERT_EQ(got.data[i], want.data[i])
            << "head_dim " << head_dim << " page " << page_size << " float " << i;
        // Floats outside the summaries stay untouched (NaN); inside they equal the others.
        if (want.data[i] != 5.0f) {
          ASSERT_EQ(extended.data[i], want.data[i]) << i;
        } else {
          ASSERT_TRUE(std::isnan(extended.data[i])) << i;
        }
      }
    }
  }
}

// page_stride 0 with one kv head: each page summarized into a caller's own buffer (Quest's
// per-stream, per-logical-block summaries) equals the page-id-indexed summary.
TEST_P(AttentionScores, OnePageSummaryIntoACallersBuffer) {
  const CacheShape shape{.num_keys = 75, .num_kv_heads = 1, .head_dim = 72, .page_size = 16};
  const TestCache cache(shape, 650);
  const PagedKv kv = cache.view();
  SummaryBuffer want(kv, max_page_id(kv), 0.0f);
  const int64_t num_blocks = (shape.num_keys + shape.page_size - 1) / shape.page_size;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t filled = std::min<int64_t>(shape.page_size, shape.num_keys - b * shape.page_size);
    ref::summarize_page_keys(kv, b, filled, want.view);
    std::vector<float> own(2 * 72, kNaN);
    summarize_page_keys(kv, b, filled, {own.data(), 0});
    const float* expected =
        want.data.data() + kv.block_table[static_cast<size_t>(b)] * want.view.page_stride;
    for (size_t c = 0; c < own.size(); ++c)
      ASSERT_EQ(own[c], expected[c]) << "block " << b << " float " << c;
  }
}

TEST_P(AttentionScores, PageUpperBoundsMatchTheReferenceAndBoundEveryKey) {
  uint32_t seed = 600;
  for (int64_t head_dim : {3, 8, 64, 72, 128}) {
    for (int64_t group : {1, 4}) {
      const CacheShape shape{.num_keys = 150, .num_kv_heads = 2, .head_dim = head_dim};
      const TestCache cache(shape, ++seed);
      const PagedKv kv = cache.view();
      SummaryBuffer summaries(kv, max_page_id(kv), 0.0f);
      const int64_t num_blocks = (shape.num_keys + shape.page_size - 1) / shape.page_size;
      for (int64_t t = 0; t < shape.num_keys; ++t) extend_page_key_summary(kv, t, summaries.view);
      const int64_t num_heads = shape.num_kv_heads * group;
      const std::vector<float> q = random_floats(num_heads * head_dim, ++seed, -2.0f, 2.0f);
      std::vector<float> got(static_cast<size_t>(shape.num_kv_heads * num_blocks + 1), 555.0f);
      std::vector<float> want(got.size() - 1);
      page_upper_bounds(kv, summaries.view, q.data(), num_heads, num_blocks, got.data());
      ref::page_upper_bounds(kv, summaries.view, q.data(), num_heads, num_blocks, want.data());
      EXPECT_EQ(got.back(), 555.0f);
      for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
        for (int64_t b = 0; b < num_blocks; ++b) {
          const float bound = got[h * num_blocks + b];
          ASSERT_NEAR(bound, want[h * num_blocks + b], 1e-4 * (1 + std::fabs(bound)))
              << head_dim << " " << group << " " << h << " " << b;
          for (int64_t t = b * shape.page_size;
               t < std::min<int64_t>(shape.num_keys, (b + 1) * shape.page_size); ++t) {
            double dot = 0;
            std::vector<float> k(static_cast<size_t>(head_dim));
            load_kv_row(kv, /*value=*/false, t, h, k.data());
            for (int64_t g = 0; g < group; ++g) {
              const float* qh = q.data() + (h * group + g) * head_dim;
              for (int64_t c = 0; c < head_dim; ++c) dot += double{qh[c]} * k[c];
            }
            ASSERT_LE(dot, bound + 1e-4 * (1 + std::fabs(bound))) << "key " << t;
          }
        }
      }
    }
  }
}

// Key halves (one bit per key and channel): summaries byte for byte equal to the reference's,
// whole pages or key by key; each page's bound matches the reference, bounds every key of its
// page, and is never looser than the page's min/max bound.
TEST_P(AttentionScores, KeyHalvesTightenTheBoundAndStillBoundEveryKey) {
  uint32_t seed = 700;
  for (int64_t head_dim : {3, 8, 64, 72, 128}) {
    for (int32_t page_size : {1, 5, 16}) {
      const CacheShape shape{
          .num_keys = 83, .num_kv_heads = 2, .head_dim = head_dim, .page_size = page_size};
      const TestCache cache(shape, ++seed);
      const PagedKv kv = cache.view();
      const int64_t num_pages = max_page_id(kv);
      const int64_t stride = kv.num_kv_heads * key_summary_floats(head_dim, page_size, true) + 7;
      std::vector<float> got(static_cast<size_t>(num_pages * stride), 5.0f), want = got,
                                                                             extended = got;
      const KeySummaries got_view{got.data(), stride, true}, want_view{want.data(), stride, true},
          extended_view{extended.data(), stride, true};
      SummaryBuffer plain(kv, num_pages, 0.0f);
      const int64_t num_blocks = (shape.num_keys + page_size - 1) / page_size;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t filled = std::min<int64_t>(page_size, shape.num_keys - b * page_size);
        summarize_page_keys(kv, b, filled, got_view);
        ref::summarize_page_keys(kv, b, filled, want_view);
        ref::summarize_page_keys(kv, b, filled, plain.view);
      }
      for (int64_t t = 0; t < shape.num_keys; ++t) extend_page_key_summary(kv, t, extended_view);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "head_dim " << head_dim << " page " << page_size;
      ASSERT_EQ(std::memcmp(extended.data(), want.data(), got.size() * sizeof(float)), 0)
          << "head_dim " << head_dim << " page " << page_size;
      for (int64_t group : {1, 4}) {
        const int64_t num_heads = kv.num_kv_heads * group;
        const std::vector<float> q = random_floats(num_heads * head_dim, ++seed, -2.0f, 2.0f);
        const size_t n = static_cast<size_t>(kv.num_kv_heads * num_blocks);
        std::vector<float> bounds(n), ref_bounds(n), page_bounds(n);
        page_upper_bounds(kv, got_view, q.data(), num_heads, num_blocks, bounds.data());
        ref::page_upper_bounds(kv, want_view, q.data(), num_heads, num_blocks, ref_bounds.data());
        ref::page_upper_bounds(kv, plain.view, q.data(), num_heads, num_blocks, page_bounds.data());
        std::vector<float> k(static_cast<size_t>(head_dim));
        for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
          for (int64_t b = 0; b < num_blocks; ++b) {
            const size_t i = static_cast<size_t>(h * num_blocks + b);
            const float tol = 1e-4f * (1 + std::fabs(bounds[i]));
            ASSERT_NEAR(bounds[i], ref_bounds[i], tol) << head_dim << " " << page_size << " " << b;
            ASSERT_LE(bounds[i], page_bounds[i] + tol) << head_dim << " " << page_size << " " << b;
            for (int64_t t = b * page_size;
                 t < std::min<int64_t>(shape.num_keys, (b + 1) * page_size); ++t) {
              load_kv_row(kv, /*value=*/false, t, h, k.data());
              double dot = 0;
              for (int64_t g = 0; g < group; ++g) {
                for (int64_t c = 0; c < head_dim; ++c)
                  dot += double{q[(h * group + g) * head_dim + c]} * k[c];
              }
              ASSERT_LE(dot, bounds[i] + tol) << "key " << t;
            }
          }
        }
      }
    }
  }
}

// Why key halves exist: keys that are codes of independent signs (a copy head's) take both
// signs in every channel of a 16-key page, so every page's min/max bound is the same and the
// query's own key cannot be found; with key halves its page is the only one that reaches it.
TEST_P(AttentionScores, KeyHalvesFindTheMatchingCodeWherePageBoundsTie) {
  const CacheShape shape{.num_keys = 1024, .num_kv_heads = 1, .head_dim = 64, .page_size = 16};
  std::mt19937 rng(800);
  std::vector<float> codes(static_cast<size_t>(shape.num_keys * shape.head_dim));
  for (float& c : codes) c = rng() % 2 ? 1.0f : -1.0f;
  const TestCache cache(shape, 801, [&](int64_t t, int64_t, int64_t d) {
    return codes[static_cast<size_t>(t * shape.head_dim + d)];
  });
  const PagedKv kv = cache.view();
  const int64_t num_blocks = shape.num_keys / shape.page_size;
  const int64_t match = 700;  // the key the query equals, in block 43
  const std::vector<float> q(codes.begin() + match * shape.head_dim,
                             codes.begin() + (match + 1) * shape.head_dim);
  for (bool key_halves : {false, true}) {
    const int64_t stride = key_summary_floats(shape.head_dim, shape.page_size, key_halves);
    std::vector<float> summaries(static_cast<size_t>(max_page_id(kv) * stride));
    const KeySummaries view{summaries.data(), stride, key_halves};
    for (int64_t b = 0; b < num_blocks; ++b) summarize_page_keys(kv, b, shape.page_size, view);
    std::vector<float> bounds(static_cast<size_t>(num_blocks));
    page_upper_bounds(kv, view, q.data(), 1, num_blocks, bounds.data());
    const auto best = std::max_element(bounds.begin(), bounds.end());
    const int64_t ties = std::count(bounds.begin(), bounds.end(), *best);
    if (!key_halves) {
      // A channel of one sign in all 16 keys of a page has odds 2^-15: nearly every page ties.
      EXPECT_GE(ties, num_blocks * 9 / 10) << "min/max bounds tie";
    } else {
      EXPECT_EQ(ties, 1);
      EXPECT_EQ(best - bounds.begin(), match / shape.page_size);
      EXPECT_FLOAT_EQ(*best, static_cast<float>(shape.head_dim));  // q·q, reached
    }
  }
}

// Q8_0 / Q4_1 pools: observation scores (against the reference and the naive softmax of the
// dequantized keys), page summaries (bit for bit: min/max of the same dequantized values, whole
// pages and key by key) and page bounds (against the reference; each bounds every dequantized
// key of its page), on shuffled pages with 0xFF (NaN-scaled) bytes everywhere not written.
TEST_P(AttentionScores, QuantizedPools) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 1200;
  for (DType dtype : {DType::kQ8_0, DType::kQ4_1}) {
    for (int64_t head_dim : {32, 64, 128}) {
      for (int32_t page_size : {1, 5, 16}) {
        for (ThreadPool* pool : {&pool1, &pool3}) {
          WindowCase c;
          c.shape = {.num_keys = 301,
                     .num_kv_heads = 2,
                     .head_dim = head_dim,
                     .page_size = page_size,
                     .dtype = dtype};
          c.positions = position_range(301 - 20, 301);
          c.num_keys = 301 + 3;  // keys past every row: not read
          expect_observation_matches(c, *pool, ++seed);
        }
      }
      const CacheShape shape{
          .num_keys = 83, .num_kv_heads = 2, .head_dim = head_dim, .page_size = 16, .dtype = dtype};
      const TestCache cache(shape, ++seed);
      const PagedKv kv = cache.view();
      const int64_t num_pages = max_page_id(kv);
      SummaryBuffer got(kv, num_pages, 5.0f), want(kv, num_pages, 5.0f),
          extended(kv, num_pages, 5.0f);
      const int64_t num_blocks = (shape.num_keys + 15) / 16;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t filled = std::min<int64_t>(16, shape.num_keys - b * 16);
        summarize_page_keys(kv, b, filled, got.view);
        ref::summarize_page_keys(kv, b, filled, want.view);
      }
      for (int64_t t = 0; t < shape.num_keys; ++t) extend_page_key_summary(kv, t, extended.view);
      ASSERT_EQ(got.data, want.data) << to_string(dtype) << " head_dim " << head_dim;
      ASSERT_EQ(extended.data, want.data) << to_string(dtype) << " head_dim " << head_dim;
      const std::vector<float> q = random_floats(8 * head_dim, ++seed, -2.0f, 2.0f);
      std::vector<float> bounds(static_cast<size_t>(2 * num_blocks)), ref_bounds(bounds.size());
      page_upper_bounds(kv, got.view, q.data(), 8, num_blocks, bounds.data());
      ref::page_upper_bounds(kv, want.view, q.data(), 8, num_blocks, ref_bounds.data());
      std::vector<float> k(static_cast<size_t>(head_dim));
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t b = 0; b < num_blocks; ++b) {
          const float bound = bounds[h * num_blocks + b];
          ASSERT_NEAR(bound, ref_bounds[h * num_blocks + b], 1e-4 * (1 + std::fabs(bound)));
          for (int64_t t = b * 16; t < std::min<int64_t>(shape.num_keys, (b + 1) * 16); ++t) {
            load_kv_row(kv, /*value=*/false, t, h, k.data());
            double dot = 0;
            for (int64_t g = 0; g < 4; ++g) {
              for (int64_t ch = 0; ch < head_dim; ++ch)
                dot += double{q[(h * 4 + g) * head_dim + ch]} * k[ch];
            }
            ASSERT_LE(dot, bound + 1e-4 * (1 + std::fabs(bound))) << "key " << t;
          }
        }
      }
    }
  }
}

// A sparse anonymous mapping of `bytes`, unmapped at scope exit.
struct SparseMapping {
  void* data = MAP_FAILED;
  size_t bytes = 0;
  explicit SparseMapping(size_t size) : bytes(size) {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                -1, 0);
  }
  ~SparseMapping() {
    if (data != MAP_FAILED) munmap(data, bytes);
  }
  float* floats() const { return static_cast<float*>(data); }
};

// Pages (and their summaries) past 4 GiB of the pool base: offsets must be 64-bit. Results must
// equal those on the same keys laid out compactly, bit for bit.
TEST_P(AttentionScores, PageOffsetsBeyond4GiB) {
  const CacheShape shape{.num_keys = 70, .num_kv_heads = 2, .head_dim = 64};
  const TestCache compact(shape, 1000);
  const PagedKv small = compact.view();
  const int64_t page_stride = shape.num_kv_heads * shape.page_size * shape.head_dim;
  const int64_t first_page = ((int64_t{1} << 32) / 4) / page_stride + 1000;  // past 4 GiB
  const auto num_blocks = static_cast<int64_t>(small.block_table.size());
  const size_t bytes = static_cast<size_t>((first_page + 2 * num_blocks) * page_stride) * 4;
  const SparseMapping k_mem(bytes), summary_mem(bytes);
  if (k_mem.data == MAP_FAILED || summary_mem.data == MAP_FAILED) {
    GTEST_SKIP() << "cannot map " << bytes << " bytes";
  }
  std::vector<int32_t> table;
  for (int64_t b = 0; b < num_blocks; ++b) {
    table.push_back(static_cast<int32_t>(first_page + 2 * (num_blocks - 1 - b)));  // descending
  }
  const PagedKv big{
      k_mem.floats(),  k_mem.floats(), page_stride,        shape.page_size * shape.head_dim,
      shape.page_size, shape.head_dim, shape.num_kv_heads, table};
  for (int64_t t = 0; t < shape.num_keys; ++t) {
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
      std::memcpy(k_mem.floats() + kv_offset(big, t, h), small.k + kv_offset(small, t, h),
                  shape.head_dim * sizeof(float));
    }
  }
  ThreadPool pool(3);
  const int64_t num_heads = 8;
  const std::vector<int32_t> positions = position_range(40, 70);
  const std::vector<float> q = random_floats(30 * num_heads * shape.head_dim, 1001);
  const AttentionQuery window{q.data(), positions, num_heads, 0.125f};
  std::vector<float> out(30 * num_heads * shape.head_dim), lse(30 * num_heads);
  paged_attention(small, window, {out.data(), nullptr, lse.data()}, pool);
  std::vector<float> got(2 * 70), want(2 * 70);
  observation_scores(big, window, lse.data(), 70, got.data(), pool);
  observation_scores(small, window, lse.data(), 70, want.data(), pool);
  EXPECT_EQ(got, want);

  const KeySummaries big_summaries{summary_mem.floats(), page_stride};
  std::vector<float> small_data(static_cast<size_t>(2 * num_blocks + 3) * 2 * 2 * 64);
  const KeySummaries small_summaries{small_data.data(), 2 * 2 * 64};
  for (int64_t t = 0; t < shape.num_keys; ++t) {
    extend_page_key_summary(big, t, big_summaries);
    extend_page_key_summary(small, t, small_summaries);
  }
  const std::vector<float> q1 = random_floats(num_heads * shape.head_dim, 1002);
  std::vector<float> got_bounds(2 * 5), want_bounds(2 * 5);
  page_upper_bounds(big, big_summaries, q1.data(), num_heads, 5, got_bounds.data());
  page_upper_bounds(small, small_summaries, q1.data(), num_heads, 5, want_bounds.data());
  EXPECT_EQ(got_bounds, want_bounds);
}

INSTANTIATE_TEST_SUITE_P(AllTargets, AttentionScores, ::testing::ValuesIn(available_targets()),
                         target_test_name);

}  // namespace
}  // namespace sieve::kernels
