#pragma once
// A ragged batch: the new tokens of any number of sequences, each sequence's tokens contiguous
// and in position order, plus where each sequence's K/V lives (SequenceKv: a block table, or a
// slice table per stream).
//
//   tokens     [ a3 a4 a5 | b9 | c0 c1 ]      positions [ 3 4 5 | 9 | 0 1 ]
//   sequences  [ {first 0, count 3, pages a}, {first 3, count 1, pages b}, {first 4, count 2, pages
//   c} ]
#include <cassert>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace sieve::model {

using TokenId = int32_t;

// Quest page selection for one stream's decode row: the row reads only some of the stream's
// slices. Only for streams that hold every key of the sequence (key_offset 0, num_dropped 0), so
// slice b holds keys [b * page_size, (b + 1) * page_size) and a slice is a Quest "page".
struct SliceSelection {
  // choose: compute each summarized slice's upper bound of the group's q·k from `summaries`
  // and read the `forced` slices plus the best others by bound, top_k in all (top_slices()).
  // Slices from num_summarized on (the newest, not summarized yet) get +inf bounds.
  bool choose = false;
  // [num_summarized][kernels::key_summary_floats(head_dim, page_size, key_halves)]: key min,
  // then max, then (key_halves) each key's half bits.
  float* summaries = nullptr;
  int32_t num_summarized = 0;
  bool key_halves = false;
  int32_t top_k = 0;
  std::vector<int32_t> forced;  // ascending slice indices (the sinks' and the window's)
  // !choose: read these slices (indices into SparseStream::slices, ascending, the last one
  // included), chosen at an earlier step.
  std::vector<int32_t> reuse;
};

// The slices a choosing row reads: every slice when there are at most top_k; else `forced`
// plus the others with the highest bounds (ties: the lower index; NaN lowest) up to top_k.
// Ascending. The engine's sparsity::select_pages() is the same rule on Quest's pages.
std::vector<int32_t> top_slices(std::span<const float> bounds, std::span<const int32_t> forced,
                                int32_t top_k);

// Where one sequence's K/V lives: one stream per (layer, KV head), [layer * num_kv_heads +
// kv_head], each a table of KvCache slices (kv/sparse_layout.h's numbering: slice v is rows
// [v * page_size, (v + 1) * page_size) of the cache). Two shapes of the same thing:
//  - streams sharing one block table (a dense sequence): position t of stream s is slot
//    t % page_size of slice kv::SliceShape::dense_slice(block_table[t / page_size], s). The
//    kernels read all of a layer's heads through the one table (each page once, all heads).
//  - streams of their own (a compressed sequence): `streams[s]` lists the slices holding the
//    stream's kept keys in order, as the KV manager laid them out.
// The engine fills it; the model only reads and writes rows.
struct KvStream {
  std::vector<int32_t> slices;  // KvCache slice indices, in key order
  int32_t key_offset = 0;       // slots of slices[0] before key 0
  int32_t num_keys = 0;         // keys after this step's new tokens are written
  int32_t num_dropped = 0;      // tokens dropped before the new ones: key j is visible to the
                                // query at position p iff j <= p - num_dropped
  std::vector<std::pair<int32_t, int32_t>> new_rows;  // (slice, slot) of each new token
  // A precise stream's f16 copy (KvCache areas, kv/precise_areas.h): areas[i] holds the keys
  // of slices[i], and new_area_rows the new tokens' (area, slot). Empty: none (the stream
  // reads its q8 / q4 rows).
  std::vector<int32_t> areas;
  std::vector<std::pair<int32_t, int32_t>> new_area_rows;
  std::optional<SliceSelection> selection;  // Quest; unset: read every slice
};
struct SequenceKv {
  std::vector<int32_t> block_table;  // shared by every stream; empty when `streams` is set
  std::vector<KvStream> streams;     // empty when the streams share `block_table`
  // Streams whose decode row's attention weights the caller wants back (H2O, FastGen's
  // frequent set): StreamOutputs::attention.
  std::vector<uint8_t> want_attention;  // [stream], empty: none
  // > 0: the step's last observe_rows rows (SnapKV's window, when the step's chunk ends where
  // the prompt is compressed) score every key as Model::observe would, in the step itself:
  // StreamOutputs::observed. At most the step's rows of the sequence.
  int32_t observe_rows = 0;
  bool shares_block_table() const { return streams.empty(); }
};

// What a forward step hands back for one sequence's streams.
struct StreamOutputs {
  // [stream]: the decode row's attention weights (summed over the group's query heads, one per
  // key in key order, the new token last) where want_attention asked; else empty.
  std::vector<std::vector<float>> attention;
  // [stream]: the slices a choosing Quest row read (SliceSelection::choose); else empty.
  std::vector<std::vector<int32_t>> chosen_slices;
  // With SequenceKv::observe_rows: Model::observe's scores of the observed_rows-row window that
  // ends at position observed_through - 1 (stream after stream); else empty.
  std::vector<float> observed;
  int32_t observed_rows = 0, observed_through = 0;
};

struct BatchSequence {
  int32_t first_token = 0;  // index into Batch::tokens
  int32_t num_tokens = 0;
  SequenceKv kv;
};

struct Batch {
  std::vector<TokenId> tokens;
  std::vector<int32_t> positions;
  std::vector<uint8_t> want_logits;  // 1: produce logits for this token
  std::vector<BatchSequence> sequences;

  // Starts the next sequence; its tokens follow with add().
  void begin_sequence(SequenceKv kv) {
    sequences.push_back({static_cast<int32_t>(tokens.size()), 0, std::move(kv)});
  }
  // A sequence whose streams share one block table.
  void begin_sequence(std::vector<int32_t> block_table) {
    begin_sequence(SequenceKv{.block_table = std::move(block_table)});
  }
  void add(TokenId token, int32_t position, bool logits) {
    assert(!sequences.empty());
    tokens.push_back(token);
    positions.push_back(position);
    want_logits.push_back(logits ? 1 : 0);
    ++sequences.back().num_tokens;
  }
  void clear() {
    tokens.clear();
    positions.clear();
    want_logits.clear();
    sequences.clear();
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_logits() const {
    int64_t n = 0;
    for (uint8_t w : want_logits) n += w;
    return n;
  }
};

}  // namespace sieve::model
