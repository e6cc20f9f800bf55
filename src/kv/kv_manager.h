#pragma once
// KvManager: the KV-cache API the scheduler calls (integers only). Each sequence has a block
// table, one page per `page_size` tokens; pages come from one PagePool and may be shared
// between sequences with a common cached prefix and between the samples of one request (fork).
//
//   seq 7  block table [ p3 | p0 | p8 ]   tokens 0..15 | 16..31 | 32..40 (partial, private)
//   seq 9  block table [ p3 | p0 | p5 ]   same first 32 tokens: prefix hit on p3, p0
//                          |    |    |
//   PagePool   page  p0  p1  p2  p3  p4  p5  p6  p7  p8     K/V of page p: the model runner's
//              ref    2   0   0   2   0   1   0   0   1     storage[p] (all layers, all heads)
//              hash  h1   -  h7  h0   -   -   -   -   -     p2: cached-free, reusable by a prefix
//              free queue (head..tail): p1 p4 p6 p7 p2      hit until evicted
//
// Position t of a sequence lives in page block_table[t / page_size], slot t % page_size.
//
// Every sequence is one stream per (layer, KV head) (sparse_layout.h). A sequence starts with
// its streams sharing one block table (a "dense" sequence: prefix sharing, fork by reference,
// copy-on-write); once its sparsity policy drops tokens, each stream owns its slices in whole
// pages the sequence owns alone (a "sparse" sequence: never published, never shared). The
// scheduler does not tell the two apart:
//   waiting:  match = lookup_prefix(prompt, extra_key);   // no state change
//             num_computed = match.num_cached_tokens;     // choose n new tokens for the budget
//             admit(seq, match, num_computed + n)         // nullopt: does not fit, keep waiting
//             (or start_sparse(seq): streams of their own from the first token, no cache)
//   running:  reserve(seq, num_computed, num_computed + n)  // nullopt: preempt someone, retry
//   after the forward pass:
//             commit_full_blocks(seq, tokens, num_computed + n)   // publish for reuse (dense)
//   fork(parent, child) for n > 1; free(seq) when finished, preempted or cancelled;
//   truncate(seq, n) when speculative decoding rejects draft tokens.
// The engine's sparsity step changes a sequence's streams: compress(seq, num_positions, keep)
// (a policy's keep-sets; a dense sequence turns sparse) and drop_tokens(seq, drops) (evictions
// during decode), each returning a CompactionPlan the runner performs before any later K/V
// write. block_table(), allocate() and prepare_write() are for streams sharing a block table;
// sparse_layout() and owned_pages() for streams of their own.
//
// Parked sequences (conversations continued from a compressed cache): a finished sequence can be
// parked instead of freed: it keeps its pages and layout, is no longer running, and is keyed by a
// hash chain of its computed tokens and an extra key (the engine's: the policy). A new prompt that
// extends those tokens adopts it and computes only the rest. Parked pages count as used, but any
// call that needs pages takes them back first, least recently parked first, before it would
// report "no free page" (so before the scheduler preempts anyone); parking keeps their total
// within KvConfig::max_parked_pages.
//   finish:   park(seq, tokens.first(num_computed), key)      // instead of free(seq)
//   admit:    hit = lookup_parked(prompt, key); adopt(hit->seq, new_seq)   // num_computed =
//             hit->num_tokens; then reserve() as for a running sequence
//   per step: take_evicted_parked()    // parked sequences whose pages were taken back
//
// Expected failures (no free page) are return values and leave the state unchanged; misuse
// (unknown or duplicate SeqId, out-of-range positions, stale match) is an assert.
// Costs: every call is O(blocks touched) plus hashing O(tokens hashed); nothing is O(num_pages)
// except reset_prefix_cache() and the invariant check.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kv/block_hash.h"
#include "kv/ids.h"
#include "kv/page_pool.h"
#include "kv/precise_areas.h"
#include "kv/sparse_layout.h"
#include "kv/sparse_sequence.h"

namespace sieve::kv {

struct KvConfig {
  int32_t num_pages = 0;
  int32_t page_size = 16;  // tokens per page
  bool enable_prefix_caching = true;
  uint64_t hash_seed = 0;  // see block_hash.h
  // Parked sequences hold at most this many pages together (0: none are parked).
  int32_t max_parked_pages = 0;
  // The page layout's slices (sparse_layout.h); needed by sparse sequences only.
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  // Streams the model runner also keeps in f16 (ascending), and the spare areas for sparse
  // sequences' copies of them (precise_areas.h).
  std::vector<int32_t> precise_streams;
  int32_t num_spare_areas = 0;
};

// The longest cached prefix of a prompt, from lookup_prefix(); valid until the next call that
// changes the manager (admit it right away).
struct PrefixMatch {
  int32_t num_prompt_tokens = 0;
  // pages.size() * page_size. Always < num_prompt_tokens, so at least one prompt token is
  // computed and yields logits (vLLM caps hits at num_prompt_tokens - 1, rounded down to
  // full blocks).
  int32_t num_cached_tokens = 0;
  uint64_t extra_key = 0;
  std::vector<PageId> pages;      // [num cached blocks]
  std::vector<BlockHash> hashes;  // [num cached blocks]
};

// A parked sequence whose tokens start a prompt (KvManager::lookup_parked).
struct ParkedMatch {
  SeqId seq;
  int32_t num_tokens = 0;  // its computed tokens: < the prompt's
};

// Pages added to a block table: block_table(seq)[first_new_block_idx, + num_new_pages).
struct Allocation {
  int32_t first_new_block_idx = 0;
  int32_t num_new_pages = 0;
  bool operator==(const Allocation&) const = default;
};

// Copy-on-write order for the model runner: copy page `src` to page `dst` (all layers) before
// this step writes; `dst` replaced `src` at block_table(seq)[block_idx].
struct PageCopy {
  PageId src;
  PageId dst;
  int32_t block_idx = 0;
  bool operator==(const PageCopy&) const = default;
};
// The page is this sequence's alone and not published: write in place.
struct WriteInPlace {
  bool operator==(const WriteInPlace&) const = default;
};
// A copy was needed but no page is free; nothing changed (preempt someone and retry).
struct NoFreePage {
  bool operator==(const NoFreePage&) const = default;
};
using WritePlan = std::variant<WriteInPlace, PageCopy, NoFreePage>;

// Where one step's new tokens of a running sequence go (KvManager::reserve). Read the block table
// or the sparse layout for the addresses before the next call that changes the sequence.
struct StepSlots {
  std::optional<PageCopy> page_copy;   // copy-on-write: perform it before the forward pass
  std::optional<SparseAppend> append;  // streams of their own: each stream's first new key
};

struct KvStats {
  int32_t num_pages = 0;
  // Ref count 0, including cached-free (evictable) pages, plus the pages only parked sequences
  // hold (taken back on demand like cached-free ones).
  int32_t num_free_pages = 0;
  int32_t num_cached_blocks = 0;  // published pages, in use or cached-free
  int64_t num_evictions = 0;      // cached pages reused for other data
  // Counted at admit(): prompt tokens and requests admitted, and how many were served from
  // the cache (a request "hits" when at least one block was cached).
  int64_t num_prefix_query_tokens = 0;
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_prefix_query_requests = 0;
  int64_t num_prefix_hit_requests = 0;
  // Parked sequences (reclaimable: see the top of kv_manager.h), the pages they hold (shared
  // ones included), and the parked sequences taken back to make room.
  int32_t num_parked_seqs = 0;
  int32_t num_parked_pages = 0;
  int64_t num_parked_evictions = 0;
  // Precise streams' f16 copies (precise_areas.h): spare areas free, of how many, and the
  // sparse streams that dropped their copy for lack of one.
  int32_t num_free_spare_areas = 0;
  int32_t num_spare_areas = 0;
  int64_t num_dropped_f16_copies = 0;
  double usage() const {  // fraction of pages in use (ref count > 0)
    return num_pages == 0 ? 0.0 : 1.0 - static_cast<double>(num_free_pages) / num_pages;
  }
  bool operator==(const KvStats&) const = default;
};

class KvManager {
 public:
  explicit KvManager(const KvConfig& config);

  const KvConfig& config() const { return config_; }
  int32_t num_pages() const { return pool_.num_pages(); }
  int32_t num_free_pages() const { return pool_.num_free_pages(); }
  KvStats stats() const;
  const PagePool& pool() const { return pool_; }

  // Pages covering `num_tokens` tokens: ceil(num_tokens / page_size).
  int32_t num_pages_for(int32_t num_tokens) const;

  // The longest run of cached full blocks that starts the prompt, capped below the whole
  // prompt (see PrefixMatch). Changes nothing, counts nothing. O(matched blocks + 1) hashes.
  PrefixMatch lookup_prefix(std::span<const int32_t> prompt, uint64_t extra_key = 0) const;
  // Free pages admit(match, num_tokens) would take: new pages plus matched pages that are
  // cached-free (a hit takes them out of the free queue).
  int32_t num_pages_needed(const PrefixMatch& match, int32_t num_tokens) const;
  // Free pages allocate(seq, num_tokens) would take.
  int32_t num_pages_needed(SeqId seq, int32_t num_tokens) const;

  // Starts a sequence (new SeqId): attaches the matched pages (ref++) and allocates pages to
  // cover num_tokens >= match.num_cached_tokens tokens. The first match.num_cached_tokens
  // tokens count as computed. nullopt, with nothing changed and nothing counted, if not enough
  // pages are free. `match` must come from lookup_prefix() with no change in between.
  std::optional<Allocation> admit(SeqId seq, const PrefixMatch& match, int32_t num_tokens);
  // Grows the block table to cover num_tokens tokens (never shrinks it). nullopt, with nothing
  // changed, if not enough pages are free (cached-free pages count as free: they get evicted).
  std::optional<Allocation> allocate(SeqId seq, int32_t num_tokens);
  // Publishes every full block within the first num_computed_tokens tokens that is not yet
  // published, so later prompts can reuse it. `tokens` are the sequence's tokens so far
  // (prompt + output); blocks already hashed for this sequence are skipped. If another page
  // already caches the same block, this sequence's copy stays private.
  void commit_full_blocks(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed_tokens);
  // Call before writing K/V at `position` (once per page a step writes to; for a decode step,
  // position = num_computed_tokens). If the page holding it is shared (ref > 1) or published,
  // the sequence gets a fresh page holding a copy (PageCopy, which the runner must perform
  // before the forward pass); the old page keeps serving its other users and the cache.
  WritePlan prepare_write(SeqId seq, int32_t position);
  // Makes room for a running sequence's tokens [num_computed, num_tokens) (this step's new
  // tokens), for either kind: streams sharing a block table grow it (allocate) and make the
  // page written first private (prepare_write); streams of their own take slots
  // (append_sparse; num_computed must be the layout's num_positions). nullopt if the pool lacks
  // pages (a sparse sequence is unchanged; a block table may have grown): preempt someone and
  // retry.
  std::optional<StepSlots> reserve(SeqId seq, int32_t num_computed, int32_t num_tokens);
  // Parallel sampling: `child` (new SeqId) starts as a copy of `parent`. Streams sharing a block
  // table share all its pages (writes to shared pages then go through copy-on-write; returns no
  // copies). Streams of their own get fresh pages holding a copy of every used slice (and area
  // of an f16 copy): perform the returned copies (slice_moves, area_moves) before either
  // sequence writes or compacts (the layouts are equal but for slice and area ids); nullopt,
  // nothing changed, if the pool lacks the pages.
  std::optional<CompactionPlan> fork(SeqId parent, SeqId child);
  // Speculative decoding's rollback: a sequence whose streams share a block table keeps only its
  // first num_tokens tokens' K/V (the rejected draft tokens' slots are written again later).
  // Pages past them go back to the pool now (last first), and hashes of blocks past them are
  // forgotten (a published page stays in the cache, valid for the tokens it was published for,
  // and the next write to it goes through copy-on-write). Never needs a page.
  void truncate(SeqId seq, int32_t num_tokens);
  // Releases the sequence's pages, last block first, so that the tail of a cached prefix is
  // evicted before its head.
  void free(SeqId seq);
  // Forgets all cached blocks. Only while no page is in use; false (nothing changed) otherwise.
  bool reset_prefix_cache();

  // --- parked sequences (see the top of this file) ---
  // The running or finished sequence `seq` stops and keeps its pages as the state of `tokens`
  // (its computed tokens, no draft), under `key`. Parked sequences least recently parked make
  // room first if its pages would pass max_parked_pages; one that alone would is freed instead.
  // A parked sequence answers no call but the ones below and free(); a new park() of the same
  // tokens and key replaces the older one.
  void park(SeqId seq, std::span<const int32_t> tokens, uint64_t key);
  // The parked sequence under `key` with the most tokens that start `prompt`, fewer than all of
  // it (one prompt token at least is computed). O(prompt + parked sequences' tokens compared).
  std::optional<ParkedMatch> lookup_parked(std::span<const int32_t> prompt, uint64_t key) const;
  // `seq` (new) takes parked sequence `parked`'s pages and layout; `parked` is gone. Counted as
  // a prefix-cache query of `num_prompt_tokens` that hit the parked tokens.
  void adopt(SeqId parked, SeqId seq, int32_t num_prompt_tokens);
  bool is_parked(SeqId seq) const { return parked_.contains(seq); }
  // Parked sequences freed since the last call to make room (or replaced): forget what you keep
  // about them.
  std::vector<SeqId> take_evicted_parked();
  // Frees every parked sequence (e.g. a cache reset).
  void evict_all_parked();

  // --- sparse sequences (see the top of this file and sparse_layout.h) ---
  SliceShape slice_shape() const {
    return {.num_layers = config_.num_layers,
            .num_kv_heads = config_.num_kv_heads,
            .page_size = config_.page_size,
            .num_pages = config_.num_pages};
  }
  // Starts a sequence (new SeqId) that is sparse from its first token: no pages, no prefix
  // cache, every stream empty. Costs no page; append_sparse() allocates.
  void start_sparse(SeqId seq);
  // Applies a policy's keep-sets (keep[s]: key indices of stream s to keep, ascending; nullopt
  // keeps the stream). `num_tokens` is the sequence's computed tokens: for a dense sequence
  // the keys of every stream are positions [0, num_tokens); for a sparse one it must equal
  // sparse_layout(seq).num_positions.
  //   sparse sequence: compacts in place and packs the pages; frees the emptied ones.
  //   dense sequence, every page ref 1 and unpublished: turns sparse in place, the same way.
  //   dense sequence sharing or publishing any page: copies the kept tokens into fresh pages
  //     (ceil(sum_s ceil(kept_s / page_size) / S) of them) and then drops its references to
  //     the old pages; a shared page is only read. This needs the old and new pages at once
  //     for this one step; nullopt, nothing changed, if the pool lacks the new ones.
  // The runner performs the returned plan before any later K/V write (see CompactionPlan).
  std::optional<CompactionPlan> compress(SeqId seq, int32_t num_tokens, const KeepSets& keep);
  // Adds num_tokens positions to a sparse sequence. stores[s] == 0: stream s does not store
  // them (num_dropped grows; only for num_tokens == 1, e.g. a head whose policy keeps no decode
  // token: the runner attends the new token's own K/V from the step's activations). Empty:
  // every stream stores. Takes a page when the sequence's free slices run out; nullopt, nothing
  // changed, if the pool has too few free pages.
  std::optional<SparseAppend> append_sparse(SeqId seq, int32_t num_tokens,
                                            std::span<const uint8_t> stores = {});
  // Free pages append_sparse(seq, num_tokens, stores) would take.
  int32_t num_pages_needed_sparse(SeqId seq, int32_t num_tokens,
                                  std::span<const uint8_t> stores = {}) const;
  // Evictions during decode (streaming window, H2O, FastGen): drops drop[s] (key indices,
  // ascending) from stream s. Per stream it moves the cheaper side of the dropped keys: the keys
  // after the first dropped one move towards the front, or the keys before the last dropped
  // one towards the back (the stream then starts later in its first slice, and a slice that
  // empties is freed). So a streaming head dropping its oldest non-sink key costs num_sinks
  // token moves and an H2O eviction min(keys before, keys after). Pages that empty go back to
  // the pool; when 2S - 1 slices are free the pages are packed (S = num_layers * num_kv_heads).
  // Never needs a page.
  CompactionPlan drop_tokens(SeqId seq, const DropSets& drop);
  bool is_sparse(SeqId seq) const { return sparse_.contains(seq); }
  // Valid until the next call that changes this sequence.
  const SparseLayout& sparse_layout(SeqId seq) const;
  std::span<const PageId> owned_pages(SeqId seq) const;  // a sparse sequence's pages

  bool contains(SeqId seq) const { return seqs_.contains(seq) || sparse_.contains(seq); }
  // Pages the sequence holds (its block table's, shared ones included, or the ones it owns).
  int32_t num_pages_held(SeqId seq) const;
  // Keys each stream holds [layer * num_kv_heads + kv_head] when the sequence has computed
  // num_tokens tokens: num_tokens each for streams sharing a block table.
  std::vector<int32_t> stream_lengths(SeqId seq, int32_t num_tokens) const;
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size() + sparse_.size()); }
  // A dense sequence's block table. Valid until the next call that changes this sequence.
  std::span<const PageId> block_table(SeqId seq) const;

  // Describes the first broken invariant of the pool or the tables, nullopt if all hold:
  // ref count of every page == its number of occurrences in all block tables plus the sparse
  // sequences owning it; a sparse sequence's pages have ref count 1 and are unpublished, its
  // slices are used once (by a stream or its free list) and each stream's slices fit its
  // length exactly; and the pool's own invariants. O(num_pages + total table length + total
  // slices); for tests and debugging.
  std::optional<std::string> invariant_violation() const;

 private:
  struct SeqState {
    std::vector<PageId> pages;  // the block table
    // Hashes of blocks [0, block_hashes.size()), all full and computed; a prefix of `pages`.
    std::vector<BlockHash> block_hashes;
    uint64_t extra_key = 0;
  };
  SeqState& state(SeqId seq);
  const SeqState& state(SeqId seq) const;
  struct Parked {
    std::vector<int32_t> tokens;
    uint64_t key = 0;
    BlockHash hash;  // hash_chain(tokens, key)
    uint64_t parked_at = 0;
    int32_t num_pages = 0;
  };
  // Hash chain of whole pages of tokens, then the partial last one (block_hash.h).
  BlockHash hash_chain(std::span<const int32_t> tokens, uint64_t key) const;
  // Frees the least recently parked sequence; false when none is parked.
  bool evict_oldest_parked();
  // Runs `attempt` (a call that leaves everything unchanged when it lacks pages) again after
  // each parked sequence it frees, until it succeeds or none is left.
  template <typename Attempt>
  auto reclaiming(Attempt&& attempt);

  KvConfig config_;
  PagePool pool_;
  PreciseAreas precise_;
  std::unordered_map<SeqId, SeqState> seqs_;  // dense
  std::unordered_map<SeqId, SparseSequence> sparse_;
  int64_t num_prefix_query_tokens_ = 0;
  int64_t num_prefix_hit_tokens_ = 0;
  int64_t num_prefix_query_requests_ = 0;
  int64_t num_prefix_hit_requests_ = 0;
  std::unordered_map<SeqId, Parked> parked_;
  int32_t num_parked_pages_ = 0;
  uint64_t park_clock_ = 0;
  int64_t num_parked_evictions_ = 0;
  std::vector<SeqId> evicted_parked_;
};

}  // namespace sieve::kv
