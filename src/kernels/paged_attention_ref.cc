// ref::paged_attention: per (query row, query head), every score, one softmax, all in double.
// K/V rows are read through load_kv_row (scalar dequantize_row for the block dtypes); block
// pools score with the query rounded by block_kv_query.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/paged_attention.h"

namespace sieve::kernels {

void load_kv_row(const PagedKv& kv, bool value, int64_t position, int64_t kv_head, float* out) {
  const int64_t offset = kv_offset(kv, position, kv_head);
  if (is_block_kv_dtype(kv.dtype)) {
    assert(kv.head_dim % block_elems(kv.dtype) == 0);
    dequantize_row(kv.dtype, kv_block_row(kv, value, offset), out, kv.head_dim);
  } else if (kv.dtype == DType::kF16) {
    const uint16_t* row = (value ? kv.v_f16 : kv.k_f16) + offset;
    for (int64_t d = 0; d < kv.head_dim; ++d) out[d] = f16_to_f32(row[d]);
  } else {
    const float* row = (value ? kv.v : kv.k) + offset;
    std::copy(row, row + kv.head_dim, out);
  }
}

void block_kv_query(const float* q, float scale, int64_t n, float* out) {
  assert(n % kQBlock == 0);
  std::vector<float> scaled(static_cast<size_t>(n)), d(static_cast<size_t>(n / kQBlock));
  std::vector<int8_t> ints(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scaled[static_cast<size_t>(i)] = q[i] * scale;
  quantize_activations_q8(scaled.data(), n, ints.data(), d.data(), nullptr);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(ints[static_cast<size_t>(i)]) * d[static_cast<size_t>(i / kQBlock)];
  }
}

namespace ref {

void paged_attention(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out) {
  assert(kv.num_kv_heads > 0 && q.num_heads % kv.num_kv_heads == 0);
  const int64_t group = q.num_heads / kv.num_kv_heads;
  const int64_t head_dim = kv.head_dim;
  const int64_t num_q = static_cast<int64_t>(q.positions.size());
  std::vector<double> scores, acc(static_cast<size_t>(head_dim));
  std::vector<float> k_row(static_cast<size_t>(head_dim)), v_row(static_cast<size_t>(head_dim));
  std::vector<float> q_rounded(static_cast<size_t>(head_dim));
  for (int64_t i = 0; i < num_q; ++i) {
    const int64_t num_keys = int64_t{q.positions[i]} + 1;
    const int64_t first_key = first_visible_key(q, static_cast<size_t>(i));
    assert(num_keys <= static_cast<int64_t>(kv.block_table.size()) * kv.page_size - kv.key_offset);
    scores.assign(static_cast<size_t>(num_keys), 0.0);
    for (int64_t h = 0; h < q.num_heads; ++h) {
      const int64_t kv_head = h / group;
      const float* q_row = q.q + (i * q.num_heads + h) * head_dim;
      // Block pools: the scaled query rounded to Q8_0 blocks (block_kv_query), score = q'·k.
      double scale = q.scale;
      if (is_block_kv_dtype(kv.dtype)) {
        block_kv_query(q_row, q.scale, head_dim, q_rounded.data());
        q_row = q_rounded.data();
        scale = 1.0;
      }
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t t = first_key; t < num_keys; ++t) {
        load_kv_row(kv, false, t, kv_head, k_row.data());
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q_row[d]) * k_row[d];
        scores[t] = scale * dot;
        max = std::max(max, scores[t]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t t = first_key; t < num_keys; ++t) {
        const double p = std::exp(scores[t] - max);
        sum += p;
        load_kv_row(kv, true, t, kv_head, v_row.data());
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * v_row[d];
      }
      float* out_row = out.out + (i * q.num_heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) out_row[d] = static_cast<float>(acc[d] / sum);
      if (out.row_max != nullptr) out.row_max[i * q.num_heads + h] = static_cast<float>(max);
      if (out.row_lse != nullptr) {
        out.row_lse[i * q.num_heads + h] = static_cast<float>(max + std::log(sum));
      }
    }
  }
}

}  // namespace ref
}  // namespace sieve::kernels
