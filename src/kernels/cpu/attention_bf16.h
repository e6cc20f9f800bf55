#pragma once
// Internal to src/kernels: q·k and p·v of a long attention job's tile (a prefill chunk's keys in
// lanes, cpu/attention-inl.h) as bf16 dot products, for x86 CPUs with AVX512-BF16
// (bf16::supported()); AttentionQuery::bf16_dots asks for them. Plain intrinsics in their own
// translation unit, as cpu/attention_vnni.cc.
//
// vdpbf16ps adds the products of two bf16 pairs to an f32 lane: twice the multiply-adds of an
// f32 FMA at the same issue rate on Zen 4, where the f32 FMA kernels run at 90-95% of their
// peak. The pairs:
//   q·k  lane j = key j, pair i = dims (2i, 2i + 1) of that key (the K tile, transposed as f32,
//        then rows 2i and 2i + 1 interleaved); the query's pair i broadcast.
//   p·v  lane c = output column c, pair t = keys (2t, 2t + 1) (V rows 2t and 2t + 1
//        interleaved); the probabilities' pair t broadcast (a row of probabilities in bf16, read
//        as 32-bit pairs, is already in that order).
// Q, K, P and V are rounded to bf16 (to nearest even) as GPU FlashAttention does for bf16
// models; the sums, the softmax and its row sums stay f32.
#include <cstdint>

namespace sieve::kernels::bf16 {

// AVX-512 F / BW and AVX512-BF16.
bool supported();

// dst[j] = bf16(src[j]) for j < n: as 32-bit words, the pairs (src[2i], src[2i + 1]).
void round_row(const float* src, int64_t n, uint16_t* dst);

// A tile's K for scores(): rows[j] is key j's row of head_dim values (f32, or f16 halves with
// `halves`), j < num_keys; k[i * tp + j] = the pair (dims 2i, 2i + 1) of key j for i <
// head_dim / 2 and j < num_cols (a multiple of 16, >= num_keys; keys past num_keys are 0).
// head_dim is a multiple of 32.
void pack_keys(const void* const* rows, bool halves, int64_t num_keys, int64_t num_cols,
               int64_t head_dim, uint32_t* k, int64_t tp);

// A tile's V for pv(): v[t * head_dim + c] = the pair (value c of key 2t, of key 2t + 1) for
// t < (num_keys + 1) / 2 (a key past num_keys is 0); rows and halves as pack_keys.
void pack_values(const void* const* rows, bool halves, int64_t num_keys, int64_t head_dim,
                 uint32_t* v);

// s[m * s_stride + j] = sum_{i < num_pairs} q[m * q_stride + i] · k[i * k_stride + j] (pair
// dot products) for m < count and j < num_cols (a multiple of 16).
void scores(const uint32_t* q, int64_t q_stride, int64_t count, const uint32_t* k, int64_t k_stride,
            int64_t num_pairs, int64_t num_cols, float* s, int64_t s_stride);

// acc[m * dp + c] = alpha[m] * acc[m * dp + c] + sum_{t < num_pairs} p[m * p_stride + t] ·
// v[t * head_dim + c] for m < count and c < head_dim (a multiple of 32).
void pv(const uint32_t* p, int64_t p_stride, int64_t count, const float* alpha, const uint32_t* v,
        int64_t num_pairs, int64_t head_dim, float* acc, int64_t dp);

}  // namespace sieve::kernels::bf16
