#pragma once
// Internal to src/kernels: the paged attention kernel's work on one tile of Q8_0 / Q4_1 K/V rows
// (paged_attention.h) for x86 CPUs with AVX-512 VNNI (vnni::supported()), called by the AVX3
// target's cpu/attention-inl.h: scores from int8 queries without dequantizing K, and P·V with V
// dequantized in registers. Plain intrinsics in their own translation unit, as
// cpu/matmul_vnni.cc.
//
// Scores (attn_scores). The query vectors of a kv head are quantized once per task
// (quantize_activations_q8 of the scaled query, the values block_kv_query defines) and stored
// with their block scales and sums (attn_prepare_queries). Per 16 keys, their K bytes are
// transposed once into one vector per dword g of a block with key j in lane j (4 rows' 16-byte
// pieces per Load4, a 4 x 4 dword transpose in each 128-bit chunk; Q8_0's bytes biased by +128
// to be unsigned, Q4_1's nibbles split); then each query vector takes one vpdpbusd per dword
// with its dword g broadcast, and per block of 32 values the int32 sums convert once and take
// their scales d_k[j] * d_q (+ Q4_1's m_k[j] * d_q * sum q; Q8_0's bias undone with
// 128 * sum q). The scores come out as a row per query vector, 16 keys per store. Exact int32
// block dots, the same value as q'·k in f32 up to rounding.
//
// P·V (AttnPv): acc[m] = alpha[m] * acc[m] + sum_j p[m][j] * v_j with v_j = d_j * q_j (+ m_j),
// per block: q_j widened to f32 in registers (no buffer) and multiplied by p[m][j] * d_j
// (formed once per tile, vectorized over keys); Q4_1's sum_j p[m][j] m_j added once per tile.
#include <cstddef>
#include <cstdint>

namespace sieve::kernels::vnni {

enum class KvBlockFormat : uint8_t { kQ8_0, kQ4_1 };

// Bytes of 4 prepared query vectors at head_dim (a multiple of 32).
size_t attn_query_set_bytes(int64_t head_dim);

// Query vectors [0, count) (q int8 [count][head_dim], d f32 [count][head_dim / 32], from
// quantize_activations_q8) -> count prepared vectors at `sets` (64-byte aligned; room for
// ceil(count / 4) * attn_query_set_bytes).
void attn_prepare_queries(KvBlockFormat format, const int8_t* q, const float* d, int64_t count,
                          int64_t head_dim, uint8_t* sets);

// s[m * tp + j] = q'_m · k_j for m < count (the prepared vectors), j < num_keys <= 64, key j's
// row at k_rows[j]. Writes columns [0, num_keys rounded up to 16) (tp >= 64).
void attn_scores(KvBlockFormat format, const uint8_t* sets, int64_t count, int64_t head_dim,
                 const uint8_t* const* k_rows, int64_t num_keys, float* s, int64_t tp);

// acc[m * dp + c] = alpha[m] * acc[m * dp + c] + sum_{j < num_keys} p[m * tp + j] * v_j[c] for
// m < count, c < head_dim; value j's row at v_rows[j].
void attn_pv(KvBlockFormat format, const float* p, int64_t tp, const float* alpha, int64_t count,
             const uint8_t* const* v_rows, int64_t num_keys, int64_t head_dim, float* acc,
             int64_t dp);

}  // namespace sieve::kernels::vnni
