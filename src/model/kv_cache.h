#pragma once
// The K/V values of the whole page pool (kKvDefaultDType unless asked otherwise). Which pages a
// sequence uses is decided by kv::KvManager (integers only); this class only stores them. Layout
// (in elements, i.e. values; V identical):
//
//   k[layer][page][kv_head][slot][head_dim]      slot in [0, page_size)
//
// so one page id covers page_size consecutive positions in every layer, for a fixed
// (layer, kv head) the slots of a page are contiguous rows for the attention kernel, and a
// layer's pages are contiguous: a sequence whose pages have consecutive ids is read by one
// layer's attention as one linear stream (with pages interleaved across layers, each page
// was a separate 8 KiB stream that the hardware prefetchers restart on: decode at 8k depth ran
// at ~1/3 of the plain read bandwidth).
//
// Element types (--kv-dtype; kernels/paged_attention.h has the kernels' side). Element offset o
// is at byte kernels::row_bytes(dtype, o) of the K (V) buffer:
//
//   name  dtype   one K (or V) row of head_dim values                 bytes per row
//   f32   kF32    floats                                              4 * head_dim
//   f16   kF16    IEEE halves                                         2 * head_dim
//   q8    kQ8_0   head_dim / 32 blocks {f16 d; int8 q[32]}, x = d * q   34 * head_dim / 32
//   q4    kQ4_1   head_dim / 32 blocks {f16 d, m; 16 bytes of nibbles}, 20 * head_dim / 32
//                 x = d * q + m
//
// The blocks of q8 / q4 are row-local: every row (one token of one kv head) carries its own
// scales, groups of 32 consecutive channels of that row; keys and values alike, one scale per
// (token, 32 channels). So a row, a slice or a page moves by a plain byte copy (copy_row,
// copy_slice, copy_page), and head_dim must be a multiple of 32 (checked at construction: a
// model with another head_dim gets an error naming it).
//
// Keys have per-channel offsets and outlier channels that would set a whole block's scale.
// Before storing / attending, the model (llama.cc) transforms each key and query head, q·k
// changing only by a per-query constant (softmax, SnapKV's probabilities and Quest's ranking
// unchanged; no bytes stored):
//   1. static smoothing, per (layer, kv head, channel), measured once per model and KV dtype
//      (when it first gets a q8 / q4 cache) from one f32 forward pass and carried by the cache
//      (key_smoothing.h): k_c <- (k_c - mu_c) / s_c, q_c <- q_c * s_c, s_c = sqrt(sd(k_c) /
//      rms(q_c)) shared by a RoPE pair (KVQuant / KIVI find key outliers per channel; QServe's
//      SmoothAttention; the mean removal is exact under softmax);
//   2. a normalized Walsh–Hadamard rotation, which spreads what is left over the group.
// A kv head gets only one or neither where that rounds its keys at far less cost to the
// attention on that pass (key_smoothing.h): a head of few equal-magnitude codes rounds almost
// exactly as it is at 4 bits (eval-32k's wired induction head: q4 top-1 0.84 -> 0.98).
// Values are stored as they are. No residual window: a page's newest rows are quantized when
// written, like the rest.
//
// Why, with numbers (copy-lm, sieve eval --prompts 8 --prompt-tokens 512, full cache vs f32:
// top-1 agreement / mean KL; one part quantized at a time, the rest f16, as a temporary
// fake-quantization experiment):
//   K q4 per token, rotated 0.70 / 0.31, not rotated 0.79 / 0.14, smoothed + rotated
//   0.82 / 0.09; per channel over a page (KIVI) with the page's rows f16 until it is full
//   0.87 / 0.047 (rotated 0.90 / 0.035); the last 64 tokens f16 (per token) 0.83 / 0.088;
//   K q8 rotated 0.980 / 1.6e-3, smoothed 0.992 / 5e-4 (with V q8).
//   V q4 per token 0.94 / 0.012 (group 16: 0.94 / 0.007; MSE-chosen d, m: 0.94 / 0.011; per
//   channel over a page: 0.95 / 0.006; the last 64 tokens f16: 0.96 / 0.009); V q8 0.992 / 1e-4.
//   The query's Q8_0 rounding alone: 0.988 / 2e-4.
// So on this model q4's error is mostly the keys', smoothing cuts the key error more than any
// residual window does and costs nothing per token; the rest is the values' 4-bit rounding,
// which no layout at 4 bits tested here removes (V needs ~6 bits for KL < 1e-3). Whole q4
// cache: 0.664 / 0.34 / ppl +17.9% -> 0.781 / 0.18 / +7.4%; q8: 0.973 / 1.8e-3 / +0.57% ->
// 0.973 / 7e-4 / -0.06%.
//
// Bytes per token, per layer, K + V: 2 * num_kv_heads * bytes per row, i.e. num_kv_heads *
// head_dim * {8, 4, 2.125, 1.25} for {f32, f16, q8, q4}. E.g. head_dim 128, 8 kv heads
// (Llama 3 8B): 8192, 4096, 2176, 1280 bytes (x 32 layers: 256, 128, 68, 40 KiB per token);
// copy-lm (shared/models/copy: head_dim 32, 2 kv heads, 2 layers): 512, 256, 136, 80 bytes per
// layer. stories260K (head_dim 8, 4 kv heads: 256 / 128 bytes per layer in f32 / f16) cannot
// use q8 or q4.
//
// Precise streams (q8 / q4 only). A head whose keys no transform rounds well enough (the
// calibration pass finds it: KeySmoothing::precise_streams; eval-32k's wired induction head,
// which separates matches by fractions of a logit out of ~100) is also kept in f16, in a second
// pair of buffers indexed by page, not by slice:
//
//   precise_k[rank][page][slot][head_dim]     rank: the stream's index among precise_streams()
//
// that is, an area per (precise stream, page), then spare areas (kv/precise_areas.h numbers
// them: area rank * num_pages + page, then the spares):
//
//   precise_k[area][slot][head_dim]
//
// Dense sequences write those rows to both and attend that head from the f16 copy
// (head_view). Sparse sequences place a stream's keys in any slice of their pages
// (kv/sparse_layout.h): the KV manager gives each slice of a precise stream an area of its own
// (the sequence's pages' areas first, then spares; area_view), and the runner mirrors every
// row move into the areas. The q8 / q4 rows are always written too: a sparse stream that found
// no area reads them, and turning a dense sequence sparse in place moves nothing extra. There
// is a spare area per kPagesPerSpareArea pages and precise stream; all of it counts in
// bytes_per_page (--kv-memory).
//
// K and V live in the backend's memory (DeviceBuffers); every write and copy here is a
// backend call (store_kv_rows, copy), so the host never touches them. The backend must outlive
// the cache.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "kv/precise_areas.h"
#include "kv/sparse_layout.h"
#include "model/config.h"

namespace sieve::model {

class KeySmoothing;

// The element type K and V are stored in unless a caller asks otherwise. kF16 halves the bytes
// every decode step reads per attended key (decode at long contexts is bound by them), but its
// rounding is not within the golden tests' logprob tolerance (1e-3; f16 K/V moved
// stories260K's top logprobs by up to 2e-3), so f32 stays the default.
inline constexpr kernels::DType kKvDefaultDType = kernels::DType::kF32;

// Spare f16 areas of precise streams: one per kPagesPerSpareArea pages and precise stream
// (header). A sparse sequence's precise stream that keeps more keys than its sequence owns pages
// (lserve's dynamic heads keep all of them while its streaming heads keep a window) takes
// spares: eval-32k's lserve at 16k needs 0.8 per page it owns, streaming and snapkv about none.
inline constexpr int64_t kPagesPerSpareArea = 4;

// The KV element types by their user-facing names (--kv-dtype, sieve eval, metrics): "f32",
// "f16", "q8" (kQ8_0) and "q4" (kQ4_1). parse_kv_dtype: nullopt for any other name.
inline constexpr std::string_view kKvDTypeNames = "f32, f16, q8, q4";
std::optional<kernels::DType> parse_kv_dtype(std::string_view name);
std::string_view kv_dtype_name(kernels::DType dtype);

class KvCache {
 public:
  // dtype: one of kKvDTypeNames' (check_dtype). K and V are allocated (zero-filled) through
  // `backend`. precise_streams: ascending stream indices (layer * num_kv_heads + kv head) also
  // kept in f16 (header); q8 / q4 only.
  // num_spare_areas: spare f16 areas for precise streams (spare_areas_for(num_pages, ...) as
  // bytes_per_page pays for).
  KvCache(kernels::Backend& backend, const ModelConfig& config, int32_t num_pages,
          int32_t page_size, kernels::DType dtype = kKvDefaultDType,
          std::vector<int32_t> precise_streams = {}, int32_t num_spare_areas = 0);

  // Bytes of K and V one page takes, exactly (the unit of --kv-memory accounting): num_layers *
  // num_kv_heads * 2 * page_size * bytes per row (header), plus 2 * page_size * 2 * head_dim per
  // precise stream and its share of spare areas (kPagesPerSpareArea). Checks the dtype like
  // the constructor.
  static size_t bytes_per_page(const ModelConfig& config, int32_t page_size,
                               kernels::DType dtype = kKvDefaultDType,
                               int64_t num_precise_streams = 0);
  // Spare areas a pool of num_pages pays for (bytes_per_page).
  static int32_t spare_areas_for(int32_t num_pages, int64_t num_precise_streams);
  // Throws sieve::Error naming the dtype and the head_dim when a model's K/V cannot be stored
  // in `dtype` (q8 / q4 need a head_dim that is a multiple of 32).
  static void check_dtype(const ModelConfig& config, kernels::DType dtype);

  // A cache for one sequence of up to `num_tokens` tokens, and its block table (pages 0, 1, ...).
  struct Single;
  static Single for_one_sequence(kernels::Backend& backend, const ModelConfig& config,
                                 int32_t num_tokens, int32_t page_size = 16,
                                 kernels::DType dtype = kKvDefaultDType,
                                 std::vector<int32_t> precise_streams = {});

  int32_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }
  kernels::DType dtype() const { return dtype_; }
  // q8 / q4: the key smoothing the keys are stored with (key_smoothing.h), set by the model
  // before the first keys are written (Model::prepare_cache); null until then and for f32 / f16.
  const KeySmoothing* key_smoothing() const { return key_smoothing_.get(); }
  void set_key_smoothing(std::shared_ptr<const KeySmoothing> smoothing) {
    key_smoothing_ = std::move(smoothing);
  }

  // Writes one token's K and V ([num_kv_heads][head_dim] each, backend memory) for `layer` at
  // `position`.
  void write(int64_t layer, std::span<const int32_t> block_table, int32_t position, const float* k,
             const float* v);
  // The kernel's view of one layer of one sequence.
  kernels::PagedKv layer_view(int64_t layer, std::span<const int32_t> block_table) const;
  // Copy-on-write support: page `dst` becomes a copy of page `src` (all layers, and the
  // precise streams' f16 rows).
  void copy_page(int32_t src, int32_t dst);

  // Precise streams (header): ascending; precise_rank: the stream's index among them, or -1.
  std::span<const int32_t> precise_streams() const { return precise_streams_; }
  int32_t precise_rank(int64_t layer, int64_t kv_head) const {
    return precise_rank_.empty()
               ? -1
               : precise_rank_[static_cast<size_t>(layer * num_kv_heads_ + kv_head)];
  }
  bool layer_has_precise_streams(int64_t layer) const;
  // The kernel's view of one kv head of one dense sequence's layer: the f16 copy of a precise
  // stream, else that head of layer_view.
  kernels::PagedKv head_view(int64_t layer, int64_t kv_head,
                             std::span<const int32_t> block_table) const;
  // The f16 copy: row r of k and v (head_dim floats each, backend memory) goes to element offset
  // offsets[r] (precise_row_offset()) of the copy's K and V.
  void write_precise_rows(kernels::Rows<const float> k, kernels::Rows<const float> v,
                          std::span<const int64_t> offsets);
  int64_t precise_row_offset(int32_t rank, int32_t page, int32_t slot) const {
    return area_row_offset(kv::PreciseAreas::page_area(rank, kv::PageId{page}, num_pages_).value,
                           slot);
  }
  // Areas of the f16 copy (kv/precise_areas.h's numbering): row `slot` of area `area`.
  int64_t num_precise_areas() const { return num_areas_; }
  int64_t area_row_offset(int64_t area, int32_t slot) const {
    return area * head_stride_ + int64_t{slot} * head_dim_;
  }
  // The kernel's view of a sparse sequence's precise stream: one f16 head whose "pages" are
  // the given areas.
  kernels::PagedKv area_view(std::span<const int32_t> areas, int32_t key_offset) const;
  void copy_area_row(int32_t src_area, int32_t src_slot, int32_t dst_area, int32_t dst_slot);
  void copy_area(int32_t src_area, int32_t dst_area);

  // Streams see the pool as one flat array of equal slices: page_size rows of one (layer, page,
  // kv head), numbered as kv/sparse_layout.h says, which is this layout: slice i is rows
  // [i * page_size, (i + 1) * page_size) of k and v.
  kv::SliceShape slice_shape() const {
    return {.num_layers = static_cast<int32_t>(num_layers_),
            .num_kv_heads = static_cast<int32_t>(num_kv_heads_),
            .page_size = page_size_,
            .num_pages = num_pages_};
  }
  // The kernel's view of one stream: one kv head whose "pages" are the given slices.
  kernels::PagedKv slice_view(std::span<const int32_t> slices, int32_t key_offset) const;
  // One head's K and V row ([head_dim] each, backend memory) into slot `slot` of slice `slice`.
  void write_row(int64_t slice, int32_t slot, const float* k, const float* v);
  // Many rows at once: row r of k and v (head_dim floats each, backend memory) goes to element
  // offset offsets[r] (row_offset()) of K and V. One store_kv_rows per K and V.
  void write_rows(kernels::Rows<const float> k, kernels::Rows<const float> v,
                  std::span<const int64_t> offsets);
  int64_t row_offset(int64_t slice, int32_t slot) const {
    return slice * head_stride_ + int64_t{slot} * head_dim_;
  }
  void copy_row(int64_t src_slice, int32_t src_slot, int64_t dst_slice, int32_t dst_slot);
  void copy_slice(int64_t src_slice, int64_t dst_slice);
  // Quest: the key summaries (kernels::KeySummaries: per channel min, then max, then with
  // key_halves each key's half bits) of slices [first, end) of stream `stream` (layer *
  // num_kv_heads + kv head: whose keys they hold), each full (page_size keys): slice b's F =
  // kernels::key_summary_floats() floats go to summaries + b * F (backend memory). Keys the
  // key smoothing rotated are summarized rotated back (the smoothed channels): a Walsh-Hadamard
  // rotation mixes every channel into every other, so each channel's [min, max] over a page
  // widens and the page bounds say little (eval-32k, q8 pages, quest at 1/8: perplexity 295
  // against f16's 202). Bounds then take the query rotated back too (LlamaModel::attend).
  // `areas`: a precise stream's f16 copy of those slices (area_view), summarized instead; empty
  // for any other stream.
  void summarize_slices(int32_t stream, std::span<const int32_t> slices,
                        std::span<const int32_t> areas, int32_t first, int32_t end, bool key_halves,
                        float* summaries) const;

 private:
  // Byte offset of element offset `offset` (a multiple of head_dim) in keys_ / values_.
  size_t bytes_at(int64_t offset) const { return kernels::row_bytes(dtype_, offset); }
  // The K/V view of the element at `offset`: k/v (kF32), k_f16/v_f16 (kF16) or k_q/v_q.
  void set_bases(kernels::PagedKv& view, int64_t offset) const;
  // Byte copy of `elements` elements (whole rows) from element offset src to dst, K and V.
  void copy_elements(int64_t src, int64_t dst, int64_t elements);
  // The same in the f16 copy.
  void copy_precise(int64_t src, int64_t dst, int64_t elements);

  kernels::Backend* backend_;
  int64_t num_layers_, num_kv_heads_, head_dim_;
  int32_t num_pages_, page_size_;
  kernels::DType dtype_;
  int64_t head_stride_, page_stride_, layer_stride_;  // in elements
  kernels::DeviceBuffer keys_, values_;  // row_bytes(dtype_, num_layers * layer_stride) bytes
  std::vector<int32_t> precise_streams_;
  std::vector<int32_t> precise_rank_;  // [stream], -1 where not precise; empty: none
  // f16, [area][slot][head_dim]: [rank][page], then the spares
  int64_t num_areas_ = 0;
  kernels::DeviceBuffer precise_keys_, precise_values_;
  std::shared_ptr<const KeySmoothing> key_smoothing_;
};

struct KvCache::Single {
  KvCache cache;
  std::vector<int32_t> block_table;
};

}  // namespace sieve::model
