#include "kv/kv_manager.h"

#include <gtest/gtest.h>

#include "kv_test_util.h"

namespace sieve::kv {
namespace {

using test::Iota;
using test::P;
using test::Pages;
using test::Snap;
using test::Table;

constexpr SeqId kA{1};
constexpr SeqId kB{2};
constexpr SeqId kC{3};

// Page size 4 keeps the arithmetic visible: tokens 0..3 are block 0, 4..7 block 1, ...
KvManager Make(int32_t num_pages, bool prefix_caching = true) {
  return KvManager(
      KvConfig{.num_pages = num_pages, .page_size = 4, .enable_prefix_caching = prefix_caching});
}

// Looks up, admits `num_tokens` (default: the whole prompt) and commits them as computed.
void AdmitAndCompute(KvManager& kv, SeqId seq, const std::vector<int32_t>& prompt,
                     uint64_t extra_key = 0) {
  PrefixMatch match = kv.lookup_prefix(prompt, extra_key);
  ASSERT_TRUE(kv.admit(seq, match, static_cast<int32_t>(prompt.size())));
  kv.commit_full_blocks(seq, prompt, static_cast<int32_t>(prompt.size()));
}

void ExpectNoLeaks(KvManager& kv, std::initializer_list<SeqId> seqs) {
  for (SeqId seq : seqs) kv.free(seq);
  EXPECT_EQ(kv.num_seqs(), 0);
  EXPECT_EQ(kv.num_free_pages(), kv.num_pages());
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(KvManager, DefaultPageSizeIs16) {
  KvManager kv(KvConfig{.num_pages = 4});
  EXPECT_EQ(kv.config().page_size, 16);
  EXPECT_EQ(kv.num_pages_for(0), 0);
  EXPECT_EQ(kv.num_pages_for(16), 1);
  EXPECT_EQ(kv.num_pages_for(17), 2);
  EXPECT_EQ(kv.admit(kA, kv.lookup_prefix(Iota(0, 40)), 40), (Allocation{0, 3}));
  EXPECT_EQ(Table(kv, kA), Pages({0, 1, 2}));
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, AdmitTakesPagesInIdOrderAndCommitPublishesFullBlocksOnly) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 10);
  PrefixMatch match = kv.lookup_prefix(prompt);
  EXPECT_EQ(match.num_prompt_tokens, 10);
  EXPECT_EQ(match.num_cached_tokens, 0);
  EXPECT_TRUE(match.pages.empty());
  EXPECT_EQ(kv.num_pages_needed(match, 10), 3);

  EXPECT_EQ(kv.admit(kA, match, 10), (Allocation{.first_new_block_idx = 0, .num_new_pages = 3}));
  EXPECT_EQ(Table(kv, kA), Pages({0, 1, 2}));
  EXPECT_EQ(kv.num_free_pages(), 5);
  EXPECT_DOUBLE_EQ(kv.stats().usage(), 3.0 / 8);

  kv.commit_full_blocks(kA, prompt, 7);  // block 0 full, block 1 not yet
  EXPECT_EQ(kv.stats().num_cached_blocks, 1);
  const BlockHash h0 = hash_block(std::nullopt, Iota(0, 4), 0, 0);
  const BlockHash h1 = hash_block(h0, Iota(4, 4), 0, 0);
  EXPECT_EQ(kv.pool().block_hash(P(0)), h0);
  EXPECT_EQ(kv.pool().block_hash(P(1)), std::nullopt);
  kv.commit_full_blocks(kA, prompt, 7);  // idempotent
  kv.commit_full_blocks(kA, prompt, 10);
  EXPECT_EQ(kv.stats().num_cached_blocks, 2);
  EXPECT_EQ(kv.pool().block_hash(P(1)), h1);
  EXPECT_EQ(kv.pool().block_hash(P(2)), std::nullopt);  // partial block: never published
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, PrefixHitSharesPagesAndCountsTokensAndRequests) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 10);
  AdmitAndCompute(kv, kA, prompt);

  PrefixMatch match = kv.lookup_prefix(prompt);
  EXPECT_EQ(match.num_cached_tokens, 8);
  EXPECT_EQ(match.pages, Pages({0, 1}));
  EXPECT_EQ(kv.num_pages_needed(match, 10),
            1);  // the hits are in use: not taken from the free pool
  EXPECT_EQ(kv.admit(kB, match, 10), (Allocation{.first_new_block_idx = 2, .num_new_pages = 1}));
  EXPECT_EQ(Table(kv, kB), Pages({0, 1, 3}));
  EXPECT_EQ(kv.pool().ref_count(P(0)), 2);
  EXPECT_EQ(kv.pool().ref_count(P(1)), 2);
  EXPECT_EQ(kv.pool().ref_count(P(2)), 1);
  EXPECT_EQ(kv.pool().ref_count(P(3)), 1);
  EXPECT_EQ(kv.num_free_pages(), 4);

  // A different prompt: one request and 6 tokens queried, nothing hit.
  ASSERT_TRUE(kv.admit(kC, kv.lookup_prefix(Iota(100, 6)), 6));
  const KvStats stats = kv.stats();
  EXPECT_EQ(stats.num_prefix_query_tokens, 26);
  EXPECT_EQ(stats.num_prefix_hit_tokens, 8);
  EXPECT_EQ(stats.num_prefix_query_requests, 3);
  EXPECT_EQ(stats.num_prefix_hit_requests, 1);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kA, kB, kC});
}

TEST(KvManager, HitIsCappedBelowTheWholePrompt) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 12);  // three full blocks
  AdmitAndCompute(kv, kA, prompt);
  ASSERT_EQ(kv.stats().num_cached_blocks, 3);

  auto cached = [&](int32_t num_tokens) {
    return kv.lookup_prefix(std::span(prompt).first(num_tokens)).num_cached_tokens;
  };
  EXPECT_EQ(cached(12), 8);  // the last token must be computed: block 2 is not a hit
  EXPECT_EQ(cached(9), 8);
  EXPECT_EQ(cached(8), 4);
  EXPECT_EQ(cached(5), 4);
  EXPECT_EQ(cached(4), 0);
  EXPECT_EQ(cached(1), 0);
  EXPECT_EQ(cached(0), 0);
  std::vector<int32_t> longer = prompt;
  longer.push_back(99);
  EXPECT_EQ(kv.lookup_prefix(longer).num_cached_tokens, 12);
  EXPECT_EQ(kv.lookup_prefix(longer).pages, Pages({0, 1, 2}));
  // A block that differs stops the match there, even if later blocks would match.
  std::vector<int32_t> changed = longer;
  changed[5] = -1;
  EXPECT_EQ(kv.lookup_prefix(changed).pages, Pages({0}));
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, DifferentExtraKeysNeverShare) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 9);
  AdmitAndCompute(kv, kA, prompt, /*extra_key=*/7);
  EXPECT_EQ(kv.lookup_prefix(prompt, 0).num_cached_tokens, 0);
  EXPECT_EQ(kv.lookup_prefix(prompt, 8).num_cached_tokens, 0);
  EXPECT_EQ(kv.lookup_prefix(prompt, 7).num_cached_tokens, 8);

  // The same tokens under key 0 are computed again and cached separately.
  AdmitAndCompute(kv, kB, prompt, 0);
  EXPECT_EQ(Table(kv, kB), Pages({3, 4, 5}));
  EXPECT_EQ(kv.stats().num_cached_blocks, 4);
  EXPECT_EQ(kv.lookup_prefix(prompt, 0).pages, Pages({3, 4}));
  EXPECT_EQ(kv.lookup_prefix(prompt, 7).pages, Pages({0, 1}));
  ExpectNoLeaks(kv, {kA, kB});
}

TEST(KvManager, FreeReleasesTheTailFirstAndEvictionIsLru) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 10);
  AdmitAndCompute(kv, kA, prompt);  // p0, p1 cached; p2 partial
  EXPECT_EQ(kv.pool().free_queue(), Pages({3, 4, 5, 6, 7}));
  kv.free(kA);
  // p2 (nothing cached) to the head; then p1 and p0 to the tail, so p1 (the tail of the
  // prefix) is evicted before p0.
  EXPECT_EQ(kv.pool().free_queue(), Pages({2, 3, 4, 5, 6, 7, 1, 0}));
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.stats().num_cached_blocks, 2);

  // Seven pages for an unrelated prompt: the six plain free pages, then p1 is evicted.
  ASSERT_EQ(kv.admit(kB, kv.lookup_prefix(Iota(100, 28)), 28), (Allocation{0, 7}));
  EXPECT_EQ(Table(kv, kB), Pages({2, 3, 4, 5, 6, 7, 1}));
  EXPECT_EQ(kv.stats().num_evictions, 1);
  EXPECT_EQ(kv.stats().num_cached_blocks, 1);
  EXPECT_EQ(kv.pool().free_queue(), Pages({0}));

  // The head of the prefix survives.
  PrefixMatch match = kv.lookup_prefix(prompt);
  EXPECT_EQ(match.pages, Pages({0}));
  EXPECT_EQ(match.num_cached_tokens, 4);
  ExpectNoLeaks(kv, {kB});
}

TEST(KvManager, PrefixHitOnACachedFreePageTakesItOutOfTheQueue) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 10);
  AdmitAndCompute(kv, kA, prompt);
  kv.free(kA);
  ASSERT_EQ(kv.pool().free_queue(), Pages({2, 3, 4, 5, 6, 7, 1, 0}));

  PrefixMatch match = kv.lookup_prefix(prompt);
  EXPECT_EQ(match.pages, Pages({0, 1}));
  EXPECT_EQ(kv.num_pages_needed(match, 10), 3);  // two free hits + one new page
  EXPECT_EQ(kv.admit(kB, match, 10), (Allocation{2, 1}));
  EXPECT_EQ(Table(kv, kB), Pages({0, 1, 2}));
  EXPECT_EQ(kv.pool().free_queue(), Pages({3, 4, 5, 6, 7}));
  EXPECT_EQ(kv.pool().ref_count(P(0)), 1);
  EXPECT_EQ(kv.stats().num_evictions, 0);
  EXPECT_EQ(kv.stats().num_prefix_hit_tokens, 8);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kB});
}

TEST(KvManager, AdmitCountsCachedFreeHitsAgainstTheFreePages) {
  KvManager kv = Make(4);
  const std::vector<int32_t> prompt = Iota(0, 9);
  AdmitAndCompute(kv, kA, prompt);                              // p0, p1 cached; p2
  kv.free(kA);                                                  // queue: p2 p3 p1 p0
  ASSERT_TRUE(kv.admit(kB, kv.lookup_prefix(Iota(50, 8)), 8));  // takes p2, p3
  ASSERT_EQ(kv.pool().free_queue(), Pages({1, 0}));

  // Two hits, both cached-free, plus one new page: 3 > 2 free. Nothing changes, nothing counted.
  PrefixMatch match = kv.lookup_prefix(prompt);
  ASSERT_EQ(match.pages, Pages({0, 1}));
  EXPECT_EQ(kv.num_pages_needed(match, 9), 3);
  const test::Snapshot before = Snap(kv, {kB});
  EXPECT_EQ(kv.admit(kC, match, 9), std::nullopt);
  EXPECT_FALSE(kv.contains(kC));
  EXPECT_EQ(Snap(kv, {kB}), before);

  // Admitting only the cached part plus nothing new fits (a chunk of zero new tokens is the
  // caller's business; the manager only needs num_tokens >= num_cached_tokens).
  EXPECT_EQ(kv.admit(kC, match, 8), (Allocation{2, 0}));
  EXPECT_EQ(Table(kv, kC), Pages({0, 1}));
  EXPECT_EQ(kv.num_free_pages(), 0);
  ExpectNoLeaks(kv, {kB, kC});
}

TEST(KvManager, AllocateGrowsOnlyWhenNeededAndFailsWithoutChange) {
  KvManager kv = Make(4);
  ASSERT_EQ(kv.admit(kA, kv.lookup_prefix(Iota(0, 5)), 5), (Allocation{0, 2}));
  EXPECT_EQ(kv.num_pages_needed(kA, 8), 0);
  EXPECT_EQ(kv.allocate(kA, 8), (Allocation{2, 0}));
  EXPECT_EQ(kv.num_pages_needed(kA, 9), 1);
  EXPECT_EQ(kv.allocate(kA, 9), (Allocation{2, 1}));
  EXPECT_EQ(Table(kv, kA), Pages({0, 1, 2}));
  EXPECT_EQ(kv.allocate(kA, 3), (Allocation{3, 0}));  // never shrinks
  EXPECT_EQ(Table(kv, kA), Pages({0, 1, 2}));

  EXPECT_EQ(kv.num_pages_needed(kA, 20), 2);
  const test::Snapshot before = Snap(kv, {kA});
  EXPECT_EQ(kv.allocate(kA, 20), std::nullopt);  // needs 2, 1 free
  EXPECT_EQ(Snap(kv, {kA}), before);
  EXPECT_EQ(kv.allocate(kA, 16), (Allocation{3, 1}));
  EXPECT_EQ(kv.num_free_pages(), 0);
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, ForkSharesPagesAndCopyOnWriteReturnsExactPages) {
  KvManager kv = Make(8);
  std::vector<int32_t> tokens = Iota(0, 6);
  AdmitAndCompute(kv, kA, tokens);  // p0 (cached, tokens 0..3), p1 (tokens 4..5)
  kv.fork(kA, kB);
  EXPECT_EQ(Table(kv, kB), Pages({0, 1}));
  EXPECT_EQ(kv.pool().ref_count(P(0)), 2);
  EXPECT_EQ(kv.pool().ref_count(P(1)), 2);
  EXPECT_EQ(kv.num_free_pages(), 6);

  // Both samples write position 6 (in the shared partial block 1). The first to write copies.
  ASSERT_EQ(kv.allocate(kA, 7), (Allocation{2, 0}));
  EXPECT_EQ(kv.prepare_write(kA, 6), WritePlan(PageCopy{.src = P(1), .dst = P(2), .block_idx = 1}));
  EXPECT_EQ(Table(kv, kA), Pages({0, 2}));
  EXPECT_EQ(kv.pool().ref_count(P(1)), 1);
  EXPECT_EQ(kv.pool().ref_count(P(2)), 1);
  ASSERT_EQ(kv.allocate(kB, 7), (Allocation{2, 0}));
  EXPECT_EQ(kv.prepare_write(kB, 6), WritePlan(WriteInPlace{}));  // p1 is now B's alone
  EXPECT_EQ(Table(kv, kB), Pages({0, 1}));

  // A's next block is its own fresh page; writes there need no copy.
  ASSERT_EQ(kv.allocate(kA, 9), (Allocation{2, 1}));
  EXPECT_EQ(Table(kv, kA), Pages({0, 2, 3}));
  EXPECT_EQ(kv.prepare_write(kA, 8), WritePlan(WriteInPlace{}));

  // Writing into the shared, published block 0 copies it; the cache keeps p0.
  EXPECT_EQ(kv.prepare_write(kB, 3), WritePlan(PageCopy{.src = P(0), .dst = P(4), .block_idx = 0}));
  EXPECT_EQ(Table(kv, kB), Pages({4, 1}));
  EXPECT_EQ(kv.pool().ref_count(P(0)), 1);
  EXPECT_EQ(kv.lookup_prefix(Iota(0, 6)).pages, Pages({0}));
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kA, kB});
}

TEST(KvManager, WritingAPublishedPageCopiesEvenWhenUnshared) {
  KvManager kv = Make(4);
  const std::vector<int32_t> tokens = Iota(0, 5);
  AdmitAndCompute(kv, kA, tokens);  // p0 cached
  ASSERT_EQ(kv.pool().ref_count(P(0)), 1);
  EXPECT_EQ(kv.prepare_write(kA, 2), WritePlan(PageCopy{.src = P(0), .dst = P(2), .block_idx = 0}));
  EXPECT_EQ(Table(kv, kA), Pages({2, 1}));
  // p0 keeps its content and stays reusable (cached-free, at the tail).
  EXPECT_EQ(kv.pool().free_queue(), Pages({3, 0}));
  EXPECT_EQ(kv.lookup_prefix(tokens).pages, Pages({0}));
  // A's block 0 is rewritten with other content (say, token 2 replaced): its old hash no
  // longer describes it, and committing publishes the new page under the new hash.
  std::vector<int32_t> rewritten = tokens;
  rewritten[2] = 42;
  kv.commit_full_blocks(kA, rewritten, 5);
  EXPECT_EQ(kv.pool().block_hash(P(2)),
            hash_block(std::nullopt, std::vector<int32_t>{0, 1, 42, 3}, 0, 0));
  EXPECT_EQ(kv.stats().num_cached_blocks, 2);
  EXPECT_EQ(kv.lookup_prefix(rewritten).pages, Pages({2}));
  EXPECT_EQ(kv.lookup_prefix(tokens).pages, Pages({0}));
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, CopyOnWriteWithoutAFreePageFailsWithoutChange) {
  KvManager kv = Make(2);
  ASSERT_TRUE(kv.admit(kA, kv.lookup_prefix(Iota(0, 5)), 5));  // p0, p1: the whole pool
  kv.fork(kA, kB);
  const test::Snapshot before = Snap(kv, {kA, kB});
  EXPECT_EQ(kv.prepare_write(kA, 5), WritePlan(NoFreePage{}));
  EXPECT_EQ(Snap(kv, {kA, kB}), before);
  // Once the other sample is gone the page is A's alone.
  kv.free(kB);
  EXPECT_EQ(kv.prepare_write(kA, 5), WritePlan(WriteInPlace{}));
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, SameBlockComputedTwiceStaysPrivateButTheChainContinues) {
  KvManager kv = Make(8);
  const std::vector<int32_t> prompt = Iota(0, 10);
  // Both admitted before either computed anything: no hits, two copies of the same blocks.
  ASSERT_TRUE(kv.admit(kA, kv.lookup_prefix(prompt), 10));
  ASSERT_TRUE(kv.admit(kB, kv.lookup_prefix(prompt), 10));
  EXPECT_EQ(Table(kv, kA), Pages({0, 1, 2}));
  EXPECT_EQ(Table(kv, kB), Pages({3, 4, 5}));
  kv.commit_full_blocks(kA, prompt, 10);
  kv.commit_full_blocks(kB, prompt, 10);
  EXPECT_EQ(kv.stats().num_cached_blocks, 2);
  EXPECT_EQ(kv.pool().block_hash(P(3)), std::nullopt);
  EXPECT_EQ(kv.pool().block_hash(P(4)), std::nullopt);

  // B fills block 2; its hash chains from the same content, so it extends A's cached prefix.
  std::vector<int32_t> longer = Iota(0, 13);
  ASSERT_EQ(kv.allocate(kB, 12), (Allocation{3, 0}));
  kv.commit_full_blocks(kB, longer, 12);
  EXPECT_EQ(kv.lookup_prefix(longer).pages, Pages({0, 1, 5}));

  // B's private copies hold nothing reusable: freed to the head, reused first.
  kv.free(kB);
  EXPECT_EQ(kv.pool().free_queue(), Pages({3, 4, 6, 7, 5}));
  ExpectNoLeaks(kv, {kA});
}

TEST(KvManager, ResetPrefixCacheOnlyWhenIdle) {
  KvManager kv = Make(4);
  const std::vector<int32_t> prompt = Iota(0, 9);
  AdmitAndCompute(kv, kA, prompt);
  EXPECT_FALSE(kv.reset_prefix_cache());
  EXPECT_EQ(kv.stats().num_cached_blocks, 2);
  kv.free(kA);
  EXPECT_TRUE(kv.reset_prefix_cache());
  EXPECT_EQ(kv.stats().num_cached_blocks, 0);
  EXPECT_EQ(kv.lookup_prefix(prompt).num_cached_tokens, 0);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(KvManager, PrefixCachingCanBeDisabled) {
  KvManager kv = Make(8, /*prefix_caching=*/false);
  const std::vector<int32_t> prompt = Iota(0, 9);
  AdmitAndCompute(kv, kA, prompt);
  EXPECT_EQ(kv.stats().num_cached_blocks, 0);
  EXPECT_EQ(kv.lookup_prefix(prompt).num_cached_tokens, 0);
  AdmitAndCompute(kv, kB, prompt);
  EXPECT_EQ(Table(kv, kB), Pages({3, 4, 5}));
  EXPECT_EQ(kv.stats().num_prefix_hit_tokens, 0);
  ExpectNoLeaks(kv, {kA, kB});
}

// Speculative decoding's rollback: truncate gives back the pages past the kept tokens and forgets
// hashes of blocks past them; a published page stays cached and the next write copies it.
TEST(KvManager, TruncateReleasesPagesPastTheKeptTokens) {
  KvManager kv = Make(8);
  const std::vector<int32_t> tokens = Iota(100, 10);
  AdmitAndCompute(kv, kA, tokens);  // blocks 0, 1 published, block 2 partial
  ASSERT_TRUE(kv.allocate(kA, 14));
  EXPECT_EQ(kv.block_table(kA).size(), 4u);
  kv.truncate(kA, 6);
  EXPECT_EQ(kv.block_table(kA).size(), 2u);
  EXPECT_EQ(kv.num_free_pages(), 6);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  // Position 6 is in published block 1: writing there goes through copy-on-write.
  const WritePlan plan = kv.prepare_write(kA, 6);
  EXPECT_TRUE(std::holds_alternative<PageCopy>(plan));
  kv.truncate(kA, 0);
  EXPECT_TRUE(kv.block_table(kA).empty());
  ExpectNoLeaks(kv, {kA});
}

}  // namespace
}  // namespace sieve::kv

namespace sieve::kv {
namespace {

KvManager MakeParking(int32_t num_pages, int32_t max_parked_pages) {
  return KvManager(KvConfig{.num_pages = num_pages,
                            .page_size = 4,
                            .max_parked_pages = max_parked_pages,
                            .num_layers = 1,
                            .num_kv_heads = 1});
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KvManagerParking, TheLongestParkedPrefixUnderTheSameKeyIsAdopted) {
  KvManager kv = MakeParking(16, 16);
  const std::vector<int32_t> turn1 = test::Iota(0, 10);
  const std::vector<int32_t> turn2 = Concat(turn1, test::Iota(100, 7));
  AdmitAndCompute(kv, kA, turn1);
  kv.park(kA, turn1, 7);
  AdmitAndCompute(kv, kB, turn2);
  kv.park(kB, turn2, 7);
  EXPECT_TRUE(kv.is_parked(kA) && kv.is_parked(kB));
  EXPECT_EQ(kv.stats().num_parked_seqs, 2);
  const std::vector<int32_t> turn3 = Concat(turn2, test::Iota(200, 3));
  EXPECT_EQ(kv.lookup_parked(turn3, 8), std::nullopt) << "another key";
  EXPECT_EQ(kv.lookup_parked(turn2, 7)->seq, kA) << "never the whole prompt";
  const std::optional<ParkedMatch> hit = kv.lookup_parked(turn3, 7);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->seq, kB);
  EXPECT_EQ(hit->num_tokens, 17);
  std::vector<int32_t> diverged = turn3;
  diverged[12] = -1;
  EXPECT_EQ(kv.lookup_parked(diverged, 7)->seq, kA);
  const std::vector<PageId> pages(kv.block_table(kB).begin(), kv.block_table(kB).end());
  const int64_t hits_before = kv.stats().num_prefix_hit_tokens;
  kv.adopt(kB, kC, 20);
  EXPECT_EQ(kv.stats().num_prefix_hit_tokens - hits_before, 17);
  EXPECT_FALSE(kv.is_parked(kB));
  EXPECT_FALSE(kv.contains(kB));
  EXPECT_EQ(Table(kv, kC), pages);
  ASSERT_TRUE(kv.reserve(kC, 17, 20));
  EXPECT_EQ(kv.take_evicted_parked(), std::vector<SeqId>{});
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kA, kC});
}

TEST(KvManagerParking, ParkedPagesCountAsFreeAndGoBackBeforeAnAllocationFails) {
  KvManager kv = MakeParking(6, 6);
  AdmitAndCompute(kv, kA, test::Iota(0, 8));  // 2 pages
  kv.park(kA, test::Iota(0, 8), 1);
  AdmitAndCompute(kv, kB, test::Iota(50, 8));  // 2 pages
  kv.park(kB, test::Iota(50, 8), 1);
  EXPECT_EQ(kv.num_free_pages(), 2);
  EXPECT_EQ(kv.stats().num_free_pages, 6) << "parked pages are free to take";
  // 4 pages: the oldest parked sequence goes, the newer one stays.
  ASSERT_TRUE(kv.admit(kC, kv.lookup_prefix(test::Iota(900, 16)), 16));
  EXPECT_EQ(kv.take_evicted_parked(), std::vector<SeqId>{kA});
  EXPECT_TRUE(kv.is_parked(kB));
  EXPECT_EQ(kv.stats().num_parked_evictions, 1);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  ExpectNoLeaks(kv, {kB, kC});
}

TEST(KvManagerParking, ParkingKeepsWithinItsShareAndReplacesTheSameState) {
  KvManager kv = MakeParking(16, 4);
  AdmitAndCompute(kv, kA, test::Iota(0, 8));
  kv.park(kA, test::Iota(0, 8), 1);
  AdmitAndCompute(kv, kB, test::Iota(0, 8));  // the same tokens again: replaces kA
  kv.park(kB, test::Iota(0, 8), 1);
  EXPECT_EQ(kv.take_evicted_parked(), std::vector<SeqId>{kA});
  AdmitAndCompute(kv, kC, test::Iota(30, 8));  // 2 more pages: at the share exactly
  kv.park(kC, test::Iota(30, 8), 1);
  EXPECT_EQ(kv.stats().num_parked_pages, 4);
  constexpr SeqId kD{4};
  AdmitAndCompute(kv, kD, test::Iota(60, 8));  // over the share: the oldest goes
  kv.park(kD, test::Iota(60, 8), 1);
  EXPECT_EQ(kv.take_evicted_parked(), std::vector<SeqId>{kB});
  constexpr SeqId kE{5};
  AdmitAndCompute(kv, kE, test::Iota(90, 20));  // 5 pages: more than the share alone
  kv.park(kE, test::Iota(90, 20), 1);
  EXPECT_FALSE(kv.contains(kE));
  EXPECT_EQ(kv.stats().num_parked_pages, 4);
  kv.evict_all_parked();
  EXPECT_EQ(kv.num_free_pages(), 16);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

}  // namespace
}  // namespace sieve::kv
