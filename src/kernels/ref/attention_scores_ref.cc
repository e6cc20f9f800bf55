// Scalar references of the sparsity scores (attention_scores.h), in double.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_scores.h"

namespace sieve::kernels::ref {

namespace {

// The one place the references read K: the row of `position`, every dtype (load_kv_row).
std::vector<float> key_row(const PagedKv& kv, int64_t position, int64_t kv_head) {
  std::vector<float> row(static_cast<size_t>(kv.head_dim));
  load_kv_row(kv, /*value=*/false, position, kv_head, row.data());
  return row;
}

float* summary_min(const KeySummaries& s, const PagedKv& kv, int64_t page, int64_t kv_head) {
  return s.data + page * s.page_stride +
         kv_head * key_summary_floats(kv.head_dim, kv.page_size, s.key_halves);
}

// Whether slot j lies in the upper half of channel c (bits after the head's min and max).
uint8_t* half_bits(float* min, const PagedKv& kv) {
  return reinterpret_cast<uint8_t*>(min + 2 * kv.head_dim);
}
bool upper_half(const uint8_t* bits, const PagedKv& kv, int64_t c, int64_t slot) {
  return (bits[c * key_half_bytes(kv.page_size) + slot / 8] >> (slot % 8)) & 1;
}

}  // namespace

void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                        int64_t num_keys, float* scores) {
  assert(window.num_heads % kv.num_kv_heads == 0);
  const int64_t group = window.num_heads / kv.num_kv_heads;
  const auto num_rows = static_cast<int64_t>(window.positions.size());
  std::vector<float> q_rounded(static_cast<size_t>(kv.head_dim));
  for (int64_t kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head) {
    for (int64_t t = 0; t < num_keys; ++t) {
      double sum = 0.0;
      std::vector<float> k;  // read when some row sees key t
      for (int64_t i = 0; i < num_rows; ++i) {
        if (window.positions[i] < t || t < first_visible_key(window, static_cast<size_t>(i)))
          continue;
        if (k.empty()) k = key_row(kv, t, kv_head);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kv_head * group + g;
          const float* q = window.q + (i * window.num_heads + h) * kv.head_dim;
          double scale = window.scale;
          if (is_block_kv_dtype(kv.dtype)) {  // as paged_attention: the rounded query
            block_kv_query(q, window.scale, kv.head_dim, q_rounded.data());
            q = q_rounded.data();
            scale = 1.0;
          }
          double dot = 0.0;
          for (int64_t c = 0; c < kv.head_dim; ++c) dot += double{q[c]} * k[c];
          sum += std::exp(scale * dot - row_lse[i * window.num_heads + h]);
        }
      }
      scores[kv_head * num_keys + t] = static_cast<float>(sum);
    }
  }
}

void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                         const KeySummaries& summaries) {
  assert(num_filled >= 1 && num_filled <= kv.page_size);
  const int64_t page = kv.block_table[static_cast<size_t>(block)];
  for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
    float* min = summary_min(summaries, kv, page, h);
    float* max = min + kv.head_dim;
    std::vector<double> lo(static_cast<size_t>(kv.head_dim),
                           std::numeric_limits<double>::infinity());
    std::vector<double> hi(lo.size(), -std::numeric_limits<double>::infinity());
    for (int64_t slot = 0; slot < num_filled; ++slot) {
      const std::vector<float> k = key_row(kv, block * kv.page_size + slot, h);
      for (size_t c = 0; c < lo.size(); ++c) {
        lo[c] = std::min(lo[c], double{k[c]});
        hi[c] = std::max(hi[c], double{k[c]});
      }
    }
    for (size_t c = 0; c < lo.size(); ++c) {
      min[c] = static_cast<float>(lo[c]);
      max[c] = static_cast<float>(hi[c]);
    }
    if (!summaries.key_halves) continue;
    uint8_t* bits = half_bits(min, kv);
    std::fill(bits, bits + kv.head_dim * key_half_bytes(kv.page_size), uint8_t{0});
    for (int64_t slot = 0; slot < kv.page_size; ++slot) {
      const std::vector<float> k =
          key_row(kv, block * kv.page_size + (slot < num_filled ? slot : 0), h);
      for (int64_t c = 0; c < kv.head_dim; ++c) {
        const float mid = 0.5f * (min[c] + max[c]);
        uint8_t& byte = bits[c * key_half_bytes(kv.page_size) + slot / 8];
        if (k[c] > mid) byte = static_cast<uint8_t>(byte | (1 << (slot % 8)));
      }
    }
  }
}

void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                       int64_t num_heads, int64_t num_blocks, float* bounds) {
  assert(num_heads % kv.num_kv_heads == 0);
  const int64_t group = num_heads / kv.num_kv_heads;
  for (int64_t kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t page = kv.block_table[static_cast<size_t>(b)];
      float* min = summary_min(summaries, kv, page, kv_head);
      const float* max = min + kv.head_dim;
      // Bounds q·k over keys whose channels lie in [lo, hi].
      const auto bound_within = [&](const auto& lo, const auto& hi) {
        double bound = 0.0;
        for (int64_t g = 0; g < group; ++g) {
          const float* qh = q + (kv_head * group + g) * kv.head_dim;
          for (int64_t c = 0; c < kv.head_dim; ++c) {
            bound += std::max(double{qh[c]} * lo(c), double{qh[c]} * hi(c));
          }
        }
        return bound;
      };
      double bound = 0.0;
      if (!summaries.key_halves) {
        bound = bound_within([&](int64_t c) { return min[c]; }, [&](int64_t c) { return max[c]; });
      } else {
        bound = -std::numeric_limits<double>::infinity();
        const uint8_t* bits = half_bits(min, kv);
        const auto mid = [&](int64_t c) { return 0.5f * (min[c] + max[c]); };
        for (int64_t slot = 0; slot < kv.page_size; ++slot) {
          const auto up = [&](int64_t c) { return upper_half(bits, kv, c, slot); };
          bound = std::max(bound, bound_within([&](int64_t c) { return up(c) ? mid(c) : min[c]; },
                                               [&](int64_t c) { return up(c) ? max[c] : mid(c); }));
        }
      }
      bounds[kv_head * num_blocks + b] = static_cast<float>(bound);
    }
  }
}

}  // namespace sieve::kernels::ref
