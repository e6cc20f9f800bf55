#pragma once
// Causal multi-head attention of one sequence's new tokens over its paged KV cache.
//
// The KV cache lives in fixed-size pages from a shared pool; a sequence owns a block table
// (logical block i -> page id). One layer's K (and, with the same strides, V):
//
//   k ─┬─ page 0 ─┬─ kv head 0: slot 0 [head_dim] slot 1 [head_dim] ... slot page_size-1
//      │          ├─ kv head 1: ...                          (head_stride elements apart)
//      │          └─ ...
//      ├─ page 1 ─ ...                                       (page_stride elements apart)
//      └─ ...
//   block_table = {7, 2, 9}:  positions 0..15 -> page 7, 16..31 -> page 2, 32..47 -> page 9
//
// Key position t of kv head h is at element offset page * page_stride + h * head_stride + slot *
// head_dim from the K base, with page = block_table[t / page_size], slot = t % page_size
// (kv_offset() below). Only the pages of attended positions are read.
//
// Element types (PagedKv::dtype); bytes per token per kv head at head_dim 64 / 128:
//   kF32   floats                                                     256 / 512
//   kF16   IEEE halves                                                128 / 256
//   kQ8_0  per row, blocks of 32 along head_dim: {f16 d; int8 q[32]}    68 / 136   x = d * q
//   kQ4_1  per row, blocks of 32: {f16 d, m; uint8 nibbles[16]}         40 /  80   x = d * q + m
// Offsets and strides count elements (values) for every dtype. For the block dtypes an element
// offset o (always a multiple of 32: head_dim, head_stride and page_stride must be multiples of
// 32) is at byte o / 32 * block_bytes(dtype) = row_bytes(dtype, o) of the K (V) base, so a pool
// of E elements is row_bytes(dtype, E) bytes and every KV row (one token, one kv head) carries
// its own scales: moving a token, a slice or a page is a plain byte copy. Rows are written with
// quantize_row(dtype, ...) (ggml's reference rounding: Q8_0 d = max|x| / 127, q = round(x / d);
// Q4_1 m = min, d = (max - min) / 15, q = trunc((x - m) / d + 0.5)), e.g. by
// Backend::store_kv_rows. Keys are scored against the query rounded to Q8_0 blocks
// (block_kv_query below): exact int8 block dot products on AVX-512 VNNI (K never dequantized),
// V dequantized in registers; other targets dequantize a tile of rows at a time into a small
// per-thread buffer (never a full-precision copy of the KV). Keys are quantized without per-channel
// scales: the model smooths each key channel by a static per-channel shift and scale (the query
// scaled inversely) and rotates each key and query head by rotate_heads() (ops.h) before storing
// keys / attending (model/kv_cache.h), which changes q·k only by a per-query constant and spreads
// channel outliers over the group; the kernels here know nothing of it.
//
// Algorithm (FlashAttention-2 style, see cpu/attention-inl.h): work items are (query-row tile,
// kv heads, key range). Each runs all query heads of a kv head's GQA group and several query
// rows against one tile of keys at a time, with an online softmax (running max and sum,
// rescaled accumulator): memory O(tile), each K/V element read once per query-row tile.
// Decode takes several kv heads per work item, so each page is read through all its heads in
// turn, and splits the key range across threads (flash-decoding), merging the partial
// (max, sum, acc) states at the end; so do short chunks over long contexts.
// Cost: 2 * head_dim multiply-adds per (query row, query head, attended key) for q·k, the same
// for p·v; K/V traffic ~ num_row_tiles * attended keys * num_kv_heads * 2 * row_bytes(dtype,
// head_dim) bytes (num_row_tiles = 1 for decode; rows per tile = 32 / group); quantized rows add
// their dequantization, once per (row tile, key, kv head).
// Results are deterministic for a given pool size (the key splits depend on it).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kernels/ops.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::kernels {

// Where one layer's K/V of one sequence lives (layout above). Strides are in elements (values)
// for every dtype.
struct PagedKv {
  const float* k = nullptr;  // F32 pool: the K base (page id 0); null for an F16 pool
  const float* v = nullptr;  // F32 pool: the V base, same strides as k
  int64_t page_stride = 0;   // elements between pages, >= num_kv_heads * head_stride
  int64_t head_stride = 0;   // elements between kv heads of a page, >= page_size * head_dim
  int32_t page_size = 16;    // token slots per page
  int64_t head_dim = 0;
  int64_t num_kv_heads = 0;
  std::span<const int32_t> block_table;  // page ids of logical blocks 0, 1, ... (position order)
  // Slots of the first block before key 0: key j lives at slot key_offset + j of the table
  // (a sparse stream whose oldest slots were dropped). 0 for a dense sequence.
  int32_t key_offset = 0;
  // The element type: kF32 (k, v) or kF16 (k_f16, v_f16: IEEE halves, same layout; half the
  // bytes to read per attended key).
  DType dtype = DType::kF32;
  const uint16_t* k_f16 = nullptr;
  const uint16_t* v_f16 = nullptr;
  // kQ8_0 / kQ4_1 pools: the K and V bases (bytes; element offset o at byte row_bytes(dtype, o)).
  const void* k_q = nullptr;
  const void* v_q = nullptr;
};

// is_kv_dtype() and is_block_kv_dtype(): dtype.h.
// Block dtypes: the bytes of the K (value = false) or V row at element offset `offset`.
inline const uint8_t* kv_block_row(const PagedKv& kv, bool value, int64_t offset) {
  return static_cast<const uint8_t*>(value ? kv.v_q : kv.k_q) + row_bytes(kv.dtype, offset);
}

// The K (or V) row of position `position`, kv head `kv_head`, as f32 (any dtype).
void load_kv_row(const PagedKv& kv, bool value, int64_t position, int64_t kv_head, float* out);

// Block pools (kQ8_0 / kQ4_1) score key t as sum_i out[i] * k_t[i] (no further scale) with out
// this query row: q * scale (f32), then rounded to Q8_0 blocks as a matmul's activations
// (quantize_activations_q8) and read back (q_int * d). So the kernels may take q·k as exact
// int8 block dot products times one scale per block (vpdpbusd), as ggml's CPU flash attention
// does for quantized K. n % 32 == 0. Every consumer of q·k on block pools (paged_attention,
// observation_scores and their references) uses it, so their scores agree.
void block_kv_query(const float* q, float scale, int64_t n, float* out);

// Offset in elements of position `position`, kv head `kv_head` from the K (and V) base.
inline int64_t kv_offset(const PagedKv& kv, int64_t key, int64_t kv_head) {
  const int64_t position = key + kv.key_offset;
  const int64_t page = kv.block_table[static_cast<size_t>(position / kv.page_size)];
  return page * kv.page_stride + kv_head * kv.head_stride + (position % kv.page_size) * kv.head_dim;
}

// The arithmetic of long jobs' (prefill chunks') products on f32 / f16 pools. The bf16 dot
// products (vdpbf16ps: a pair of bf16 products per f32 lane, twice an f32 FMA's multiply-adds)
// take effect where bf16_attention_supported(); rows of up to kAttentionInvariantRows (decode,
// speculative verification) and other pools always run f32. The softmax and the sums stay f32.
enum class PrefillDots : uint8_t {
  kF32,     // f32 FMAs
  kBf16Pv,  // p·v as bf16 dot products (P and V rounded to bf16)
  kBf16,    // q·k too (Q and K rounded), as GPU FlashAttention does for bf16 models
};
// The names --prefill-attention takes. parse_prefill_dots: nullopt for any other name.
inline constexpr std::string_view kPrefillDotsNames = "f32, bf16-pv, bf16";
std::optional<PrefillDots> parse_prefill_dots(std::string_view name);
std::string_view prefill_dots_name(PrefillDots dots);

// The new tokens (query rows) of ONE sequence.
struct AttentionQuery {
  const float* q = nullptr;            // [num_q][num_heads][head_dim]
  std::span<const int32_t> positions;  // [num_q]; row i attends to key positions [0, positions[i]]
  int64_t num_heads = 0;               // a multiple of num_kv_heads; query head h uses kv head
                                       // h / (num_heads / num_kv_heads) (grouped-query attention)
  float scale = 1.0f;                  // score = scale * q·k, usually 1 / sqrt(head_dim)
  // Sliding-window attention (Mistral 7B v0.1: 4096): row i sees only the last `window` keys,
  // (positions[i] - window, positions[i]]. Key indices, so on a sparse stream it is exact when
  // the stream keeps a contiguous run of recent keys (a sink-0 streaming policy).
  std::optional<int32_t> window;
  // Jobs of up to kAttentionInvariantRows rows (cpu/attention.h) are planned so that each row
  // comes out bit for bit as it would alone (decode, speculative verification). A pass whose
  // rows never meet their decode (the observation window's recompute) sets this and is planned
  // as a prefill chunk, whose tiles run several times faster per key.
  bool chunk_tiles = false;
  PrefillDots prefill_dots = PrefillDots::kF32;
};

// The first key row i may see: 0, or positions[i] - window + 1 under a sliding window.
inline int64_t first_visible_key(const AttentionQuery& q, size_t row) {
  if (!q.window) return 0;
  return std::max<int64_t>(0, int64_t{q.positions[row]} - *q.window + 1);
}

struct AttentionOutput {
  float* out = nullptr;      // [num_q][num_heads][head_dim]: softmax(scores) · v
  float* row_max = nullptr;  // optional [num_q][num_heads]: max score over attended keys
  float* row_lse = nullptr;  // optional [num_q][num_heads]: log(sum exp(score)) (natural log),
                             // so p_t = exp(score_t - lse) is the attention weight of key t
};

// Requirements: is_kv_dtype(kv.dtype) (head_dim a multiple of 32 for the block dtypes); the K/V of
// every attended position (positions[i] included) are in the pages; positions[i] <
// block_table.size() * page_size; num_heads % num_kv_heads == 0. Parallel on `pool` over (query-row
// tiles x kv heads x key splits).
void paged_attention(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out,
                     ThreadPool& pool);

// Whether AttentionQuery::prefill_dots' bf16 choices take effect here: the CPU has AVX512-BF16
// and the attention runs on an AVX-512 (AVX3) target. Elsewhere they change nothing.
bool bf16_attention_supported();

namespace ref {
// Naive full softmax per (row, head), in double; the definition of correct.
void paged_attention(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out);
}  // namespace ref

}  // namespace sieve::kernels
