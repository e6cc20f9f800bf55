#include "kv/kv_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

namespace sieve::kv {

KvManager::KvManager(const KvConfig& config)
    : config_(config),
      pool_(config.num_pages),
      precise_(config.precise_streams, config.num_layers * config.num_kv_heads, config.num_pages,
               config.num_spare_areas) {
  assert(config.page_size > 0 && config.num_pages >= 0);
}

KvManager::SeqState& KvManager::state(SeqId seq) {
  auto it = seqs_.find(seq);
  assert(!sparse_.contains(seq) && "a dense-only call on a sparse sequence");
  assert(it != seqs_.end() && "unknown SeqId");
  return it->second;
}

const KvManager::SeqState& KvManager::state(SeqId seq) const {
  auto it = seqs_.find(seq);
  assert(!sparse_.contains(seq) && "a dense-only call on a sparse sequence");
  assert(it != seqs_.end() && "unknown SeqId");
  return it->second;
}

template <typename Attempt>
auto KvManager::reclaiming(Attempt&& attempt) {
  for (;;) {
    auto result = attempt();
    if (result || !evict_oldest_parked()) return result;
  }
}

KvStats KvManager::stats() const {
  int32_t num_reclaimable = 0;  // pages that freeing every parked sequence would free
  for (const auto& [seq, parked] : parked_) {
    if (auto sparse = sparse_.find(seq); sparse != sparse_.end()) {
      num_reclaimable += static_cast<int32_t>(sparse->second.pages().size());
    } else {
      for (PageId page : state(seq).pages) num_reclaimable += pool_.ref_count(page) == 1 ? 1 : 0;
    }
  }
  return KvStats{.num_pages = pool_.num_pages(),
                 .num_free_pages = pool_.num_free_pages() + num_reclaimable,
                 .num_cached_blocks = pool_.num_cached_pages(),
                 .num_evictions = pool_.num_evictions(),
                 .num_prefix_query_tokens = num_prefix_query_tokens_,
                 .num_prefix_hit_tokens = num_prefix_hit_tokens_,
                 .num_prefix_query_requests = num_prefix_query_requests_,
                 .num_prefix_hit_requests = num_prefix_hit_requests_,
                 .num_parked_seqs = static_cast<int32_t>(parked_.size()),
                 .num_parked_pages = num_parked_pages_,
                 .num_parked_evictions = num_parked_evictions_,
                 .num_free_spare_areas = precise_.num_free_spares(),
                 .num_spare_areas = precise_.num_spare(),
                 .num_dropped_f16_copies = precise_.num_dropped_copies()};
}

int32_t KvManager::num_pages_for(int32_t num_tokens) const {
  assert(num_tokens >= 0);
  return static_cast<int32_t>((int64_t{num_tokens} + config_.page_size - 1) / config_.page_size);
}

PrefixMatch KvManager::lookup_prefix(std::span<const int32_t> prompt, uint64_t extra_key) const {
  PrefixMatch match{.num_prompt_tokens = static_cast<int32_t>(prompt.size()),
                    .extra_key = extra_key};
  if (!config_.enable_prefix_caching || prompt.empty()) return match;
  const size_t page_size = static_cast<size_t>(config_.page_size);
  // At least the last prompt token is computed, so only blocks within prompt[0, n-1) count.
  const size_t max_blocks = (prompt.size() - 1) / page_size;
  std::optional<BlockHash> parent;
  for (size_t block = 0; block < max_blocks; ++block) {
    BlockHash hash = hash_block(parent, prompt.subspan(block * page_size, page_size), extra_key,
                                config_.hash_seed);
    std::optional<PageId> page = pool_.find_cached(hash);
    if (!page) break;
    match.pages.push_back(*page);
    match.hashes.push_back(hash);
    parent = hash;
  }
  match.num_cached_tokens = static_cast<int32_t>(match.pages.size()) * config_.page_size;
  return match;
}

int32_t KvManager::num_pages_needed(const PrefixMatch& match, int32_t num_tokens) const {
  assert(num_tokens >= match.num_cached_tokens);
  int32_t num_needed = num_pages_for(num_tokens) - static_cast<int32_t>(match.pages.size());
  for (PageId page : match.pages) {
    if (pool_.ref_count(page) == 0) ++num_needed;
  }
  return num_needed;
}

int32_t KvManager::num_pages_needed(SeqId seq, int32_t num_tokens) const {
  int32_t num_have = static_cast<int32_t>(state(seq).pages.size());
  return std::max(0, num_pages_for(num_tokens) - num_have);
}

std::optional<Allocation> KvManager::admit(SeqId seq, const PrefixMatch& match,
                                           int32_t num_tokens) {
  assert(!contains(seq) && "SeqId already in use");
  assert(match.pages.size() == match.hashes.size());
  for (size_t i = 0; i < match.pages.size(); ++i) {
    assert(pool_.block_hash(match.pages[i]) == match.hashes[i] && "stale PrefixMatch");
  }
  // Freeing a parked sequence may turn matched pages cached-free, which the count includes.
  while (num_pages_needed(match, num_tokens) > pool_.num_free_pages() && evict_oldest_parked()) {
  }
  if (num_pages_needed(match, num_tokens) > pool_.num_free_pages()) return std::nullopt;

  SeqState& s = seqs_[seq];
  s.extra_key = match.extra_key;
  s.block_hashes = match.hashes;
  s.pages.reserve(num_pages_for(num_tokens));
  // Hits first: taking them out of the free queue keeps allocate() from evicting them.
  for (PageId page : match.pages) {
    pool_.retain(page);
    s.pages.push_back(page);
  }
  const int32_t num_new = num_pages_for(num_tokens) - static_cast<int32_t>(s.pages.size());
  for (int32_t i = 0; i < num_new; ++i) {
    std::optional<PageId> page = pool_.allocate();
    assert(page);
    s.pages.push_back(*page);
  }
  num_prefix_query_tokens_ += match.num_prompt_tokens;
  num_prefix_hit_tokens_ += match.num_cached_tokens;
  ++num_prefix_query_requests_;
  if (match.num_cached_tokens > 0) ++num_prefix_hit_requests_;
  return Allocation{.first_new_block_idx = static_cast<int32_t>(match.pages.size()),
                    .num_new_pages = num_new};
}

std::optional<Allocation> KvManager::allocate(SeqId seq, int32_t num_tokens) {
  SeqState& s = state(seq);
  const int32_t num_have = static_cast<int32_t>(s.pages.size());
  const int32_t num_new = std::max(0, num_pages_for(num_tokens) - num_have);
  while (num_new > pool_.num_free_pages() && evict_oldest_parked()) {
  }
  if (num_new > pool_.num_free_pages()) return std::nullopt;
  for (int32_t i = 0; i < num_new; ++i) {
    std::optional<PageId> page = pool_.allocate();
    assert(page);
    s.pages.push_back(*page);
  }
  return Allocation{.first_new_block_idx = num_have, .num_new_pages = num_new};
}

void KvManager::commit_full_blocks(SeqId seq, std::span<const int32_t> tokens,
                                   int32_t num_computed_tokens) {
  if (is_sparse(seq)) return;  // a sparse sequence's pages are never published
  SeqState& s = state(seq);
  assert(num_computed_tokens >= 0 && static_cast<size_t>(num_computed_tokens) <= tokens.size());
  assert(num_computed_tokens <= static_cast<int64_t>(s.pages.size()) * config_.page_size);
  if (!config_.enable_prefix_caching) return;
  const size_t page_size = static_cast<size_t>(config_.page_size);
  const size_t num_full = static_cast<size_t>(num_computed_tokens) / page_size;
  for (size_t block = s.block_hashes.size(); block < num_full; ++block) {
    std::optional<BlockHash> parent;
    if (block > 0) parent = s.block_hashes[block - 1];
    BlockHash hash = hash_block(parent, tokens.subspan(block * page_size, page_size), s.extra_key,
                                config_.hash_seed);
    PageId page = s.pages[block];
    if (!pool_.block_hash(page)) {
      pool_.publish(page, hash);  // false: another page caches this block; ours stays private
    } else {
      // A page shared through fork that the other sequence published first.
      assert(*pool_.block_hash(page) == hash &&
             "a published page was written without prepare_write");
    }
    s.block_hashes.push_back(hash);
  }
}

WritePlan KvManager::prepare_write(SeqId seq, int32_t position) {
  SeqState& s = state(seq);
  assert(position >= 0 && position < static_cast<int64_t>(s.pages.size()) * config_.page_size);
  const size_t block = static_cast<size_t>(position / config_.page_size);
  const PageId page = s.pages[block];
  WritePlan plan = WriteInPlace{};
  if (pool_.ref_count(page) > 1 || pool_.block_hash(page)) {
    std::optional<PageId> fresh = reclaiming([&] { return pool_.allocate(); });
    if (!fresh) return NoFreePage{};
    s.pages[block] = *fresh;
    pool_.release(page);
    plan = PageCopy{.src = page, .dst = *fresh, .block_idx = static_cast<int32_t>(block)};
  }
  // Block `block` is about to change, so its hash (and the chain after it) no longer holds.
  if (s.block_hashes.size() > block) s.block_hashes.resize(block);
  return plan;
}

std::optional<CompactionPlan> KvManager::fork(SeqId parent, SeqId child) {
  assert(!contains(child) && "SeqId already in use");
  if (auto it = sparse_.find(parent); it != sparse_.end()) {
    CompactionPlan copies;
    std::optional<SparseSequence> copy = reclaiming([&] {
      copies = CompactionPlan{};
      return it->second.copy_to_fresh_pages(pool_, precise_, copies);
    });
    if (!copy) return std::nullopt;
    sparse_.emplace(child, std::move(*copy));
    return copies;
  }
  SeqState copy = state(parent);
  for (PageId page : copy.pages) pool_.retain(page);
  seqs_.emplace(child, std::move(copy));
  return CompactionPlan{};
}

std::optional<StepSlots> KvManager::reserve(SeqId seq, int32_t num_computed, int32_t num_tokens) {
  assert(num_tokens > num_computed);
  if (auto it = sparse_.find(seq); it != sparse_.end()) {
    assert(num_computed == it->second.layout().num_positions);
    std::optional<SparseAppend> append = reclaiming(
        [&] { return it->second.append(num_tokens - num_computed, {}, pool_, precise_); });
    if (!append) return std::nullopt;
    return StepSlots{.append = std::move(*append)};
  }
  if (!allocate(seq, num_tokens)) return std::nullopt;
  const WritePlan plan = prepare_write(seq, num_computed);
  if (std::holds_alternative<NoFreePage>(plan)) return std::nullopt;
  StepSlots slots;
  if (const auto* copy = std::get_if<PageCopy>(&plan)) slots.page_copy = *copy;
  return slots;
}

int32_t KvManager::num_pages_held(SeqId seq) const {
  if (auto it = sparse_.find(seq); it != sparse_.end())
    return static_cast<int32_t>(it->second.pages().size());
  return static_cast<int32_t>(state(seq).pages.size());
}

std::vector<int32_t> KvManager::stream_lengths(SeqId seq, int32_t num_tokens) const {
  if (auto it = sparse_.find(seq); it != sparse_.end()) {
    const SparseLayout& layout = it->second.layout();
    assert(num_tokens == layout.num_positions);
    std::vector<int32_t> lengths;
    for (const SparseStream& stream : layout.streams) lengths.push_back(stream.num_tokens);
    return lengths;
  }
  return std::vector<int32_t>(static_cast<size_t>(slice_shape().num_streams()), num_tokens);
}

void KvManager::truncate(SeqId seq, int32_t num_tokens) {
  assert(!is_sparse(seq) && num_tokens >= 0);
  SeqState& s = state(seq);
  const auto keep_pages = static_cast<size_t>(num_pages_for(num_tokens));
  while (s.pages.size() > keep_pages) {
    pool_.release(s.pages.back());
    s.pages.pop_back();
  }
  const auto full_blocks = static_cast<size_t>(num_tokens / config_.page_size);
  if (s.block_hashes.size() > full_blocks) s.block_hashes.resize(full_blocks);
}

void KvManager::free(SeqId seq) {
  if (auto parked = parked_.find(seq); parked != parked_.end()) {
    num_parked_pages_ -= parked->second.num_pages;
    parked_.erase(parked);
  }
  if (auto sparse = sparse_.find(seq); sparse != sparse_.end()) {
    sparse->second.release(pool_, precise_);
    sparse_.erase(sparse);
    return;
  }
  auto it = seqs_.find(seq);
  assert(it != seqs_.end() && "unknown SeqId");
  const std::vector<PageId>& pages = it->second.pages;
  for (auto page = pages.rbegin(); page != pages.rend(); ++page) pool_.release(*page);
  seqs_.erase(it);
}

bool KvManager::reset_prefix_cache() {
  evict_all_parked();
  if (!pool_.reset_cache()) return false;
  // No page is in use, so every sequence left has an empty table and no hashes.
  return true;
}

std::span<const PageId> KvManager::block_table(SeqId seq) const { return state(seq).pages; }

std::optional<std::string> KvManager::invariant_violation() const {
  if (std::optional<std::string> violation = pool_.invariant_violation()) return violation;
  std::vector<int32_t> num_uses(pool_.num_pages(), 0);
  std::vector<AreaId> spares_held;
  for (const auto& [seq, sparse] : sparse_) {
    if (seqs_.contains(seq)) return fmt::format("seq {} is both dense and sparse", seq.value);
    if (std::optional<std::string> violation =
            sparse.invariant_violation(pool_, precise_, num_uses, spares_held)) {
      return fmt::format("sparse seq {} {}", seq.value, *violation);
    }
  }
  if (std::optional<std::string> violation = precise_.invariant_violation(spares_held))
    return violation;
  for (const auto& [seq, s] : seqs_) {
    if (s.block_hashes.size() > s.pages.size()) {
      return fmt::format("seq {} has {} block hashes but {} pages", seq.value,
                         s.block_hashes.size(), s.pages.size());
    }
    for (size_t block = 0; block < s.pages.size(); ++block) {
      PageId page = s.pages[block];
      if (page.value < 0 || page.value >= pool_.num_pages()) {
        return fmt::format("seq {} holds page {}, which does not exist", seq.value, page.value);
      }
      ++num_uses[page.value];
      const std::optional<BlockHash>& published = pool_.block_hash(page);
      if (block < s.block_hashes.size() && published && *published != s.block_hashes[block]) {
        return fmt::format("seq {} block {}: page {} is published under another hash", seq.value,
                           block, page.value);
      }
    }
  }
  for (int32_t page = 0; page < pool_.num_pages(); ++page) {
    if (num_uses[page] != pool_.ref_count(PageId{page})) {
      return fmt::format("page {} has ref count {} but {} block table entries and owners", page,
                         pool_.ref_count(PageId{page}), num_uses[page]);
    }
  }
  return std::nullopt;
}

BlockHash KvManager::hash_chain(std::span<const int32_t> tokens, uint64_t key) const {
  const size_t page_size = static_cast<size_t>(config_.page_size);
  std::optional<BlockHash> hash;
  for (size_t at = 0; at < tokens.size(); at += page_size) {
    hash = hash_block(hash, tokens.subspan(at, std::min(page_size, tokens.size() - at)), key,
                      config_.hash_seed);
  }
  return hash.value_or(BlockHash{});
}

void KvManager::park(SeqId seq, std::span<const int32_t> tokens, uint64_t key) {
  assert(contains(seq) && !parked_.contains(seq));
  const BlockHash hash = hash_chain(tokens, key);
  for (auto& [other, parked] : parked_) {  // the same state again: keep the newer
    if (parked.hash == hash && parked.key == key &&
        std::equal(parked.tokens.begin(), parked.tokens.end(), tokens.begin(), tokens.end())) {
      const SeqId old = other;
      free(old);
      evicted_parked_.push_back(old);
      break;
    }
  }
  const int32_t num_pages = num_pages_held(seq);
  if (tokens.empty() || num_pages > config_.max_parked_pages) {
    free(seq);
    return;
  }
  while (num_parked_pages_ + num_pages > config_.max_parked_pages) evict_oldest_parked();
  parked_.emplace(seq, Parked{.tokens = std::vector<int32_t>(tokens.begin(), tokens.end()),
                              .key = key,
                              .hash = hash,
                              .parked_at = ++park_clock_,
                              .num_pages = num_pages});
  num_parked_pages_ += num_pages;
}

std::optional<ParkedMatch> KvManager::lookup_parked(std::span<const int32_t> prompt,
                                                    uint64_t key) const {
  if (parked_.empty() || prompt.empty()) return std::nullopt;
  // The prompt's chain over whole pages, once; a candidate of L tokens hashes its partial page.
  const size_t page_size = static_cast<size_t>(config_.page_size);
  std::vector<BlockHash> chain;
  for (size_t at = 0; at + page_size <= prompt.size(); at += page_size) {
    chain.push_back(hash_block(chain.empty() ? std::nullopt : std::optional(chain.back()),
                               prompt.subspan(at, page_size), key, config_.hash_seed));
  }
  std::optional<ParkedMatch> best;
  for (const auto& [seq, parked] : parked_) {
    const size_t n = parked.tokens.size();
    if (parked.key != key || n >= prompt.size()) continue;
    if (best && n <= static_cast<size_t>(best->num_tokens)) continue;
    const size_t full = n / page_size;
    std::optional<BlockHash> hash;
    if (full > 0) hash = chain[full - 1];
    if (n % page_size != 0) {
      hash =
          hash_block(hash, prompt.subspan(full * page_size, n % page_size), key, config_.hash_seed);
    }
    if (*hash != parked.hash ||
        !std::equal(parked.tokens.begin(), parked.tokens.end(), prompt.begin())) {
      continue;
    }
    best = ParkedMatch{.seq = seq, .num_tokens = static_cast<int32_t>(n)};
  }
  return best;
}

void KvManager::adopt(SeqId parked, SeqId seq, int32_t num_prompt_tokens) {
  auto it = parked_.find(parked);
  assert(it != parked_.end() && !contains(seq));
  assert(num_prompt_tokens > static_cast<int32_t>(it->second.tokens.size()));
  num_prefix_query_tokens_ += num_prompt_tokens;
  num_prefix_hit_tokens_ += static_cast<int64_t>(it->second.tokens.size());
  ++num_prefix_query_requests_;
  ++num_prefix_hit_requests_;
  num_parked_pages_ -= it->second.num_pages;
  parked_.erase(it);
  if (auto sparse = sparse_.find(parked); sparse != sparse_.end()) {
    sparse_.emplace(seq, std::move(sparse->second));
    sparse_.erase(sparse);
  } else {
    auto dense = seqs_.find(parked);
    seqs_.emplace(seq, std::move(dense->second));
    seqs_.erase(dense);
  }
}

bool KvManager::evict_oldest_parked() {
  if (parked_.empty()) return false;
  auto oldest = std::min_element(parked_.begin(), parked_.end(), [](const auto& a, const auto& b) {
    return a.second.parked_at < b.second.parked_at;
  });
  const SeqId seq = oldest->first;
  free(seq);
  evicted_parked_.push_back(seq);
  ++num_parked_evictions_;
  return true;
}

std::vector<SeqId> KvManager::take_evicted_parked() {
  std::vector<SeqId> evicted;
  evicted.swap(evicted_parked_);
  return evicted;
}

void KvManager::evict_all_parked() {
  while (evict_oldest_parked()) {
  }
}

void KvManager::start_sparse(SeqId seq) {
  assert(!contains(seq) && "SeqId already in use");
  sparse_.emplace(seq, SparseSequence(slice_shape(), precise_));
}

std::optional<CompactionPlan> KvManager::compress(SeqId seq, int32_t num_tokens,
                                                  const KeepSets& keep) {
  assert(keep.size() == static_cast<size_t>(slice_shape().num_streams()));
  CompactionPlan plan;
  if (auto sparse = sparse_.find(seq); sparse != sparse_.end()) {
    assert(num_tokens == sparse->second.layout().num_positions);
    sparse->second.compact(keep, pool_, precise_, plan);
    return plan;
  }
  SeqState& dense = state(seq);
  const bool all_private = std::all_of(dense.pages.begin(), dense.pages.end(), [&](PageId page) {
    return pool_.ref_count(page) == 1 && !pool_.block_hash(page);
  });
  if (all_private) {
    SparseSequence sparse =
        SparseSequence::adopt_dense(slice_shape(), precise_, dense.pages, num_tokens);
    sparse.compact(keep, pool_, precise_, plan);
    seqs_.erase(seq);
    sparse_.emplace(seq, std::move(sparse));
    return plan;
  }
  std::optional<SparseSequence> sparse = reclaiming([&] {
    plan = CompactionPlan{};
    return SparseSequence::copy_from_dense(slice_shape(), dense.pages, num_tokens, keep, pool_,
                                           precise_, plan);
  });
  if (!sparse) return std::nullopt;
  // As free(): last block first, so a cached prefix's tail is evicted before its head.
  for (auto page = dense.pages.rbegin(); page != dense.pages.rend(); ++page) {
    pool_.release(*page);
    if (pool_.ref_count(*page) == 0) plan.freed_pages.push_back(*page);
  }
  seqs_.erase(seq);
  sparse_.emplace(seq, std::move(*sparse));
  return plan;
}

std::optional<SparseAppend> KvManager::append_sparse(SeqId seq, int32_t num_tokens,
                                                     std::span<const uint8_t> stores) {
  auto it = sparse_.find(seq);
  assert(it != sparse_.end() && "append_sparse on a sequence that is not sparse");
  return reclaiming([&] { return it->second.append(num_tokens, stores, pool_, precise_); });
}

int32_t KvManager::num_pages_needed_sparse(SeqId seq, int32_t num_tokens,
                                           std::span<const uint8_t> stores) const {
  auto it = sparse_.find(seq);
  assert(it != sparse_.end() && "not a sparse sequence");
  return it->second.num_pages_needed(num_tokens, stores);
}

CompactionPlan KvManager::drop_tokens(SeqId seq, const DropSets& drop) {
  auto it = sparse_.find(seq);
  assert(it != sparse_.end() && "drop_tokens on a sequence that is not sparse");
  CompactionPlan plan;
  it->second.drop(drop, pool_, precise_, plan);
  return plan;
}

const SparseLayout& KvManager::sparse_layout(SeqId seq) const {
  auto it = sparse_.find(seq);
  assert(it != sparse_.end() && "not a sparse sequence");
  return it->second.layout();
}

std::span<const PageId> KvManager::owned_pages(SeqId seq) const {
  auto it = sparse_.find(seq);
  assert(it != sparse_.end() && "not a sparse sequence");
  return it->second.pages();
}

}  // namespace sieve::kv
