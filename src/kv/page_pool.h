#pragma once
// PagePool: the fixed set of KV pages, their reference counts, the free queue (which is also
// the LRU eviction order) and the prefix-cache index (block hash -> page). Integers only: the
// K/V values of page p live in the model runner's storage at index p.
//
// Life cycle of a page:
//
//              allocate                        publish (full block committed)
//   FREE -----------------------> IN USE ---------------------------------> IN USE + CACHED
//   ref 0, no hash                ref >= 1                                  ref >= 1, hash
//     ^                             |                                         |          ^
//     |     release to ref 0:       |                    release to ref 0:    |          | retain
//     +---- queued at the HEAD <----+                    queued at the TAIL   v          | (hit)
//     |     (reused first)                                                 CACHED-FREE --+
//     |                                                                    ref 0, hash kept
//     |                                                                      |
//     +---- allocate pops it from the head: hash dropped (an eviction) ------+
//
// The free queue is one circular doubly linked list over page indices, with a sentinel node at
// index num_pages, so removal from the middle is O(1):
//
//   sentinel <-> p7 <-> p2 <-> ... <-> p9 <-> p4 <-> ... <-> p5 <-> (sentinel)
//   head         [free, no hash: reused first ]  [cached-free, least recently freed first]  tail
//
// Invariants (checked by invariant_violation()):
//   - a page is in the free queue iff its ref count is 0; num_free_pages() is the queue length;
//   - the queue holds all hash-less pages before all cached ones, so a cached block is evicted
//     only when no plain free page is left (as vLLM PR #33710 proposes; plain vLLM v1 appends
//     every freed block at the tail);
//   - a page has a hash iff the index maps that hash to that page (one page per hash).
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/ids.h"

namespace sieve::kv {

class PagePool {
 public:
  // All pages start free, queued in id order: the first allocations return 0, 1, 2, ...
  explicit PagePool(int32_t num_pages);

  int32_t num_pages() const { return num_pages_; }
  // Pages with ref count 0, including cached-free ones (allocation may evict those).
  int32_t num_free_pages() const { return num_free_; }
  int32_t num_cached_pages() const { return static_cast<int32_t>(cached_.size()); }
  // Cached pages whose hash was dropped because allocation reused them.
  int64_t num_evictions() const { return num_evictions_; }

  int32_t ref_count(PageId page) const { return ref_counts_[index(page)]; }
  // Set iff the page is published in the prefix cache.
  const std::optional<BlockHash>& block_hash(PageId page) const { return hashes_[index(page)]; }

  // Pops the head of the free queue (ref 0 -> 1); if it was cached, its hash is evicted.
  // nullopt when no page has ref count 0. O(1).
  std::optional<PageId> allocate();
  // ref++; a page at ref 0 (a cached-free page hit by a prefix lookup) leaves the queue. O(1).
  void retain(PageId page);
  // ref--; at 0 the page joins the free queue: at the tail if cached (LRU order), at the head
  // if not (it holds nothing worth keeping). O(1).
  void release(PageId page);

  // The page caching `hash`, if any (in use or cached-free). O(1).
  std::optional<PageId> find_cached(const BlockHash& hash) const;
  // Publishes a page in use (ref >= 1, no hash yet) under `hash`. Returns false and changes
  // nothing if another page already caches that hash (the same block computed twice: the
  // second copy stays private and is never shared).
  bool publish(PageId page, const BlockHash& hash);
  // Forgets every cached hash. Only while no page is in use; returns false (nothing changed)
  // otherwise. O(num_pages).
  bool reset_cache();

  // The free queue from head to tail, for tests and debugging. O(num_pages).
  std::vector<PageId> free_queue() const;
  // Describes the first broken invariant, nullopt if all hold. O(num_pages).
  std::optional<std::string> invariant_violation() const;

 private:
  size_t index(PageId page) const;
  void link_before(int32_t node, int32_t page);  // insert `page` before `node`
  void unlink(int32_t page);

  int32_t num_pages_;
  int32_t num_free_;
  int64_t num_evictions_ = 0;
  std::vector<int32_t> ref_counts_;               // [num_pages]
  std::vector<std::optional<BlockHash>> hashes_;  // [num_pages]
  std::vector<int32_t> next_;                     // [num_pages + 1]; [num_pages] is the sentinel
  std::vector<int32_t> prev_;                     // [num_pages + 1]
  std::unordered_map<BlockHash, PageId> cached_;  // the prefix-cache index
};

}  // namespace sieve::kv
