// Sparse sequences in KvManager: hand-checked plans on a tiny shape (2 layers x 2 KV heads, page
// size 4, so S = 4 slices per page and slice v = page * 4 + stream), pages returned, leaving
// shared pages, decode growth, streaming windows over many steps, admission figures. A fake
// runner (sparse_test_util.h) performs every plan and reads each stream back.
#include <gtest/gtest.h>

#include <algorithm>

#include "kv/kv_manager.h"
#include "kv_test_util.h"
#include "sparse_test_util.h"

namespace sieve::kv {
namespace {

using test::A;
using test::FakeRunner;
using test::Iota;
using test::M;
using test::Pages;
using test::Slices;
using test::V;

constexpr int32_t kStreams = 4;

std::vector<PageId> Owned(const KvManager& kv, SeqId seq) {
  auto pages = kv.owned_pages(seq);
  return {pages.begin(), pages.end()};
}

// Also makes V() name this pool's slices.
KvConfig TinyConfig(int32_t num_pages, bool prefix_caching = true) {
  const KvConfig config{.num_pages = num_pages,
                        .page_size = 4,
                        .enable_prefix_caching = prefix_caching,
                        .num_layers = 2,
                        .num_kv_heads = 2};
  Numbering::use(KvManager(config).slice_shape());
  return config;
}

// The tag of position `position` of stream `stream` of a sequence.
uint64_t Tag(int32_t stream, int32_t position) { return uint64_t{1000} * (stream + 1) + position; }
std::vector<uint64_t> Tags(int32_t stream, const std::vector<int32_t>& positions) {
  std::vector<uint64_t> tags;
  for (int32_t p : positions) tags.push_back(Tag(stream, p));
  return tags;
}

// Writes positions [first, first + n) of every stream that stored them.
void WriteAppended(FakeRunner& runner, const KvManager& kv, SeqId seq, const SparseAppend& append,
                   int32_t first_position, int32_t n) {
  const SparseLayout& layout = kv.sparse_layout(seq);
  for (int32_t s = 0; s < kStreams; ++s) {
    if (!append.first_index[s]) continue;
    for (int32_t i = 0; i < n; ++i) {
      runner.write(layout.address(s, *append.first_index[s] + i), Tag(s, first_position + i));
    }
  }
}

void WriteDense(FakeRunner& runner, const KvManager& kv, SeqId seq, int32_t first, int32_t n) {
  for (int32_t s = 0; s < kStreams; ++s) {
    for (int32_t p = first; p < first + n; ++p) {
      runner.write(runner.dense_address(kv.block_table(seq), s, p), Tag(s, p));
    }
  }
}

TEST(SparseLayoutTest, AppendFillsSlicesLowestFirstAndCompactionPacksPages) {
  KvManager kv(TinyConfig(8));
  FakeRunner runner(kv);
  const SeqId seq{1};
  kv.start_sparse(seq);
  EXPECT_TRUE(kv.is_sparse(seq));
  EXPECT_EQ(kv.num_pages_needed_sparse(seq, 6), 2);
  std::optional<SparseAppend> append = kv.append_sparse(seq, 6);
  ASSERT_TRUE(append);
  EXPECT_EQ(append->new_pages, Pages({0, 1}));
  EXPECT_EQ(append->first_index, (std::vector<std::optional<int32_t>>{0, 0, 0, 0}));
  EXPECT_EQ(append->first_slot,
            (std::vector<std::optional<SlotAddress>>{A(0, 0), A(2, 0), A(4, 0), A(6, 0)}));
  WriteAppended(runner, kv, seq, *append, 0, 6);
  EXPECT_EQ(kv.sparse_layout(seq).streams[0].slices, Slices({0, 1}));
  EXPECT_EQ(kv.sparse_layout(seq).streams[3].slices, Slices({6, 7}));
  EXPECT_EQ(kv.sparse_layout(seq).address(1, 5), A(3, 1));

  // Stream 0 keeps 3 of 6, stream 1 all, stream 2 one, stream 3 none.
  KeepSets keep = {std::vector<int32_t>{0, 2, 5}, std::nullopt, std::vector<int32_t>{5},
                   std::vector<int32_t>{}};
  std::optional<CompactionPlan> plan = kv.compress(seq, 6, keep);
  ASSERT_TRUE(plan);
  // Key 0 of stream 0 stays; 2 -> 1 and 5 (slice 1 slot 1) -> 2; stream 2's key 5 -> slot 0.
  EXPECT_EQ(plan->token_moves,
            (std::vector<TokenMove>{M(0, 2, 0, 1), M(1, 1, 0, 2), M(5, 1, 4, 0)}));
  // Used slices 0, 2, 3 (page 0) and 4 (page 1): page 1's only slice moves to page 0's free one.
  EXPECT_EQ(plan->slice_moves, (std::vector<SliceMove>{{V(4), V(1)}}));
  EXPECT_EQ(plan->new_pages, Pages({}));
  EXPECT_EQ(plan->freed_pages, Pages({1}));
  EXPECT_EQ(Owned(kv, seq), Pages({0}));
  EXPECT_EQ(kv.num_free_pages(), 7);
  EXPECT_EQ(kv.pool().ref_count(PageId{1}), 0);
  runner.run(*plan);

  const SparseLayout& layout = kv.sparse_layout(seq);
  EXPECT_EQ(layout.num_positions, 6);
  EXPECT_EQ(layout.streams[0],
            (SparseStream{.slices = Slices({0}), .num_tokens = 3, .num_dropped = 3}));
  EXPECT_EQ(layout.streams[1], (SparseStream{.slices = Slices({2, 3}), .num_tokens = 6}));
  EXPECT_EQ(layout.streams[2],
            (SparseStream{.slices = Slices({1}), .num_tokens = 1, .num_dropped = 5}));
  EXPECT_EQ(layout.streams[3], (SparseStream{.num_dropped = 6}));
  EXPECT_EQ(runner.read_stream(layout, 0), Tags(0, {0, 2, 5}));
  EXPECT_EQ(runner.read_stream(layout, 1), Tags(1, Iota(0, 6)));
  EXPECT_EQ(runner.read_stream(layout, 2), Tags(2, {5}));
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);

  kv.free(seq);
  EXPECT_FALSE(kv.contains(seq));
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, PrivateDensePagesTurnSparseInPlace) {
  KvManager kv(TinyConfig(8, /*prefix_caching=*/false));
  FakeRunner runner(kv);
  const SeqId seq{3};
  ASSERT_TRUE(kv.admit(seq, kv.lookup_prefix(Iota(0, 10)), 10));
  EXPECT_EQ(test::Table(kv, seq), Pages({0, 1, 2}));
  WriteDense(runner, kv, seq, 0, 10);

  KeepSets keep = {std::vector<int32_t>{0, 9}, std::vector<int32_t>{8, 9}, std::nullopt,
                   std::vector<int32_t>{1, 2, 3, 4}};
  std::optional<CompactionPlan> plan = kv.compress(seq, 10, keep);
  ASSERT_TRUE(plan);
  // Stream s starts in slices s, 4 + s, 8 + s (pages 0, 1, 2).
  EXPECT_EQ(plan->token_moves,
            (std::vector<TokenMove>{M(8, 1, 0, 1),                                // stream 0
                                    M(9, 0, 1, 0), M(9, 1, 1, 1),                 // stream 1
                                    M(3, 1, 3, 0), M(3, 2, 3, 1), M(3, 3, 3, 2),  // stream 3
                                    M(7, 0, 3, 3)}));
  // Used: 0, 1, 2, 3 (page 0), 6 (page 1), 10 (page 2): page 2 goes, stream 2's slice 10
  // moves to page 1's lowest free slice.
  EXPECT_EQ(plan->slice_moves, (std::vector<SliceMove>{{V(10), V(4)}}));
  EXPECT_EQ(plan->new_pages, Pages({}));
  EXPECT_EQ(plan->freed_pages, Pages({2}));
  runner.run(*plan);
  ASSERT_TRUE(kv.is_sparse(seq));
  const SparseLayout& layout = kv.sparse_layout(seq);
  EXPECT_EQ(layout.streams[2].slices, Slices({2, 6, 4}));
  EXPECT_EQ(Owned(kv, seq), Pages({0, 1}));
  EXPECT_EQ(runner.read_stream(layout, 0), Tags(0, {0, 9}));
  EXPECT_EQ(runner.read_stream(layout, 1), Tags(1, {8, 9}));
  EXPECT_EQ(runner.read_stream(layout, 2), Tags(2, Iota(0, 10)));
  EXPECT_EQ(runner.read_stream(layout, 3), Tags(3, {1, 2, 3, 4}));
  EXPECT_EQ(kv.num_free_pages(), 6);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, SharedPrefixIsCopiedNeverWritten) {
  KvManager kv(TinyConfig(10));
  FakeRunner runner(kv);
  const std::vector<int32_t> prompt = Iota(100, 12);
  const SeqId first{1}, second{2};
  ASSERT_TRUE(kv.admit(first, kv.lookup_prefix(prompt), 12));
  WriteDense(runner, kv, first, 0, 12);
  kv.commit_full_blocks(first, prompt, 12);  // publishes pages 0, 1, 2

  // The second request hits the first two blocks and computes positions 8..9 itself.
  std::vector<int32_t> second_prompt = prompt;
  second_prompt.resize(10);
  PrefixMatch match = kv.lookup_prefix(second_prompt);
  ASSERT_EQ(match.pages, Pages({0, 1}));
  ASSERT_TRUE(kv.admit(second, match, 10));
  EXPECT_EQ(test::Table(kv, second), Pages({0, 1, 3}));
  for (int32_t s = 0; s < kStreams; ++s) {
    for (int32_t p = 8; p < 10; ++p) {
      runner.write(runner.dense_address(kv.block_table(second), s, p), Tag(s, p));
    }
  }
  const int32_t free_before = kv.num_free_pages();  // 6

  // Each stream keeps 3 of 10: 3 slices in all, one fresh page.
  KeepSets keep = {std::vector<int32_t>{0, 5, 9}, std::vector<int32_t>{1, 2, 8},
                   std::vector<int32_t>{7, 8, 9}, std::vector<int32_t>{}};
  std::optional<CompactionPlan> plan = kv.compress(second, 10, keep);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->new_pages, Pages({4}));
  EXPECT_EQ(plan->freed_pages, Pages({3}));  // pages 0 and 1 still serve the first request
  EXPECT_EQ(plan->slice_moves, (std::vector<SliceMove>{}));
  for (const TokenMove& move : plan->token_moves) {
    EXPECT_EQ(kv.slice_shape().page_of(move.dst.slice), PageId{4});
  }
  EXPECT_EQ(plan->token_moves.front(), M(0, 0, 16, 0));  // stream 0, position 0, page 0 slot 0
  EXPECT_EQ(plan->token_moves[2], M(12, 1, 16, 2));      // stream 0, position 9, page 3 slot 1
  runner.run(*plan);                                     // checks every destination page is private
  EXPECT_EQ(kv.num_free_pages(), free_before);           // +1 new, -1 private dense page
  EXPECT_EQ(kv.pool().ref_count(PageId{0}), 1);
  EXPECT_TRUE(kv.pool().block_hash(PageId{0}));
  const SparseLayout& layout = kv.sparse_layout(second);
  EXPECT_EQ(runner.read_stream(layout, 0), Tags(0, {0, 5, 9}));
  EXPECT_EQ(runner.read_stream(layout, 1), Tags(1, {1, 2, 8}));
  EXPECT_EQ(runner.read_stream(layout, 2), Tags(2, {7, 8, 9}));
  EXPECT_EQ(layout.streams[3].num_dropped, 10);
  // The first request's K/V is intact.
  for (int32_t s = 0; s < kStreams; ++s) {
    for (int32_t p = 0; p < 12; ++p) {
      EXPECT_EQ(runner.row(runner.dense_address(kv.block_table(first), s, p)), Tag(s, p));
    }
  }
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);

  // A sparse sequence publishes nothing.
  kv.commit_full_blocks(second, second_prompt, 10);
  EXPECT_FALSE(kv.pool().block_hash(PageId{4}));
  kv.free(second);
  kv.free(first);
  EXPECT_EQ(kv.num_free_pages(), 10);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, LeavingSharedPagesFailsCleanlyWithoutFreePages) {
  KvManager kv(TinyConfig(4));
  const std::vector<int32_t> prompt = Iota(0, 9);
  ASSERT_TRUE(kv.admit(SeqId{1}, kv.lookup_prefix(prompt), 9));  // pages 0, 1, 2
  kv.commit_full_blocks(SeqId{1}, prompt, 8);
  ASSERT_TRUE(kv.admit(SeqId{3}, kv.lookup_prefix(Iota(50, 1)), 1));  // page 3
  kv.fork(SeqId{1}, SeqId{2});
  const test::Snapshot before = test::Snap(kv, {SeqId{1}, SeqId{2}, SeqId{3}});
  KeepSets keep(kStreams, std::vector<int32_t>{0});
  EXPECT_EQ(kv.compress(SeqId{2}, 9, keep), std::nullopt);
  EXPECT_EQ(test::Snap(kv, {SeqId{1}, SeqId{2}, SeqId{3}}), before);
  EXPECT_FALSE(kv.is_sparse(SeqId{2}));
  kv.free(SeqId{3});
  std::optional<CompactionPlan> plan = kv.compress(SeqId{2}, 9, keep);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->new_pages, Pages({3}));
  EXPECT_EQ(plan->freed_pages, Pages({}));  // seq 1 still holds all three
  EXPECT_EQ(kv.num_free_pages(), 0);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, DecodeGrowthCrossesSliceAndPageBoundaries) {
  KvManager kv(TinyConfig(3));
  FakeRunner runner(kv);
  const SeqId seq{5};
  kv.start_sparse(seq);
  // Tokens 0..3 share the first page's four slices, one per stream.
  for (int32_t t = 0; t < 4; ++t) {
    std::optional<SparseAppend> append = kv.append_sparse(seq, 1);
    ASSERT_TRUE(append);
    EXPECT_EQ(append->new_pages, t == 0 ? Pages({0}) : Pages({}));
    EXPECT_EQ(append->first_slot,
              (std::vector<std::optional<SlotAddress>>{A(0, t), A(1, t), A(2, t), A(3, t)}));
    WriteAppended(runner, kv, seq, *append, t, 1);
  }
  // Token 4 needs a new slice in every stream: a new page.
  std::optional<SparseAppend> append = kv.append_sparse(seq, 1);
  ASSERT_TRUE(append);
  EXPECT_EQ(append->new_pages, Pages({1}));
  EXPECT_EQ(append->first_slot,
            (std::vector<std::optional<SlotAddress>>{A(4, 0), A(5, 0), A(6, 0), A(7, 0)}));
  WriteAppended(runner, kv, seq, *append, 4, 1);
  // Token 5: streams 1 and 3 drop it at once.
  const std::vector<uint8_t> stores = {1, 0, 1, 0};
  append = kv.append_sparse(seq, 1, stores);
  ASSERT_TRUE(append);
  EXPECT_EQ(append->first_slot, (std::vector<std::optional<SlotAddress>>{A(4, 1), std::nullopt,
                                                                         A(6, 1), std::nullopt}));
  WriteAppended(runner, kv, seq, *append, 5, 1);
  EXPECT_EQ(kv.sparse_layout(seq).streams[1].num_dropped, 1);
  // Stream 0 alone grows for 3 more tokens: the third needs a slice, so page 2 comes in and
  // stream 0 takes its lowest slice; the next stream to need one gets slice 9 from the same page.
  const std::vector<uint8_t> only_first = {1, 0, 0, 0};
  for (int32_t t = 6; t < 9; ++t) {
    append = kv.append_sparse(seq, 1, only_first);
    ASSERT_TRUE(append);
    EXPECT_EQ(append->new_pages, t == 8 ? Pages({2}) : Pages({}));
    WriteAppended(runner, kv, seq, *append, t, 1);
  }
  EXPECT_EQ(kv.sparse_layout(seq).streams[0].slices, Slices({0, 4, 8}));
  EXPECT_EQ(kv.num_free_pages(), 0);
  // A 4-token chunk needs one more slice in every stream, 4 > the 3 free (9, 10, 11), and the
  // pool is empty: refused, nothing changed.
  const SparseLayout layout_before = kv.sparse_layout(seq);
  EXPECT_EQ(kv.num_pages_needed_sparse(seq, 4), 1);
  EXPECT_EQ(kv.append_sparse(seq, 4), std::nullopt);
  EXPECT_EQ(kv.sparse_layout(seq), layout_before);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  // Three tokens fit in what is owned.
  EXPECT_EQ(kv.num_pages_needed_sparse(seq, 3), 0);
  append = kv.append_sparse(seq, 3);
  ASSERT_TRUE(append);
  WriteAppended(runner, kv, seq, *append, 9, 3);
  const SparseLayout& layout = kv.sparse_layout(seq);
  EXPECT_EQ(layout.num_positions, 12);
  EXPECT_EQ(runner.read_stream(layout, 0), Tags(0, Iota(0, 12)));
  // Stream 1 skipped 5 (with stream 3) and 6..8 (with streams 2 and 3).
  EXPECT_EQ(runner.read_stream(layout, 1), Tags(1, {0, 1, 2, 3, 4, 9, 10, 11}));
  EXPECT_EQ(layout.streams[1].num_dropped, 4);
  EXPECT_EQ(runner.read_stream(layout, 2), Tags(2, {0, 1, 2, 3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(layout.streams[2].slices, Slices({2, 6, 9}));
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, DropShiftsTheCheaperSide) {
  KvManager kv(TinyConfig(4));
  FakeRunner runner(kv);
  const SeqId seq{9};
  kv.start_sparse(seq);
  std::optional<SparseAppend> append = kv.append_sparse(seq, 10);  // 3 slices per stream
  ASSERT_TRUE(append);
  WriteAppended(runner, kv, seq, *append, 0, 10);
  EXPECT_EQ(kv.sparse_layout(seq).streams[0].slices, Slices({0, 1, 2}));
  // Stream 0 drops key 1 (sink at 0): key 0 moves back one slot, the stream starts at slot 1.
  // Stream 1 drops key 8: key 9 moves front. Stream 2 drops 0..4: nothing moves, its first
  // slice is freed. Stream 3 drops keys 3 and 6: keys 4, 5 and 7..9 after vs 0..2 and 4, 5
  // before: 5 either way, so front; its third slice empties.
  DropSets drops = {{1}, {8}, {0, 1, 2, 3, 4}, {3, 6}};
  CompactionPlan plan = kv.drop_tokens(seq, drops);
  EXPECT_EQ(plan.token_moves,
            (std::vector<TokenMove>{M(0, 0, 0, 1),                                     // stream 0
                                    M(5, 1, 5, 0),                                     // stream 1
                                    M(10, 0, 9, 3), M(10, 1, 10, 0), M(10, 3, 10, 1),  // stream 3
                                    M(11, 0, 10, 2), M(11, 1, 10, 3)}));
  runner.run(plan);
  const SparseLayout& layout = kv.sparse_layout(seq);
  EXPECT_EQ(layout.streams[0],
            (SparseStream{
                .slices = Slices({0, 1, 2}), .first_slot = 1, .num_tokens = 9, .num_dropped = 1}));
  EXPECT_EQ(layout.streams[2].first_slot, 1);
  EXPECT_EQ(layout.streams[2].slices, Slices({7, 8}));
  EXPECT_EQ(runner.read_stream(layout, 0), Tags(0, {0, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(runner.read_stream(layout, 1), Tags(1, {0, 1, 2, 3, 4, 5, 6, 7, 9}));
  EXPECT_EQ(runner.read_stream(layout, 2), Tags(2, {5, 6, 7, 8, 9}));
  EXPECT_EQ(runner.read_stream(layout, 3), Tags(3, {0, 1, 2, 4, 5, 7, 8, 9}));
  // Slices 6 (stream 2) and 11 (stream 3's third) are free; 2 < 2S - 1, no packing.
  EXPECT_EQ(plan.slice_moves, (std::vector<SliceMove>{}));
  EXPECT_EQ(plan.freed_pages, Pages({}));
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

// StreamingLLM heads over 10k decode steps: append, then drop the oldest non-sink key once over
// sinks + window. Pages stay within ceil(used slices / S) + 1 and the admission bound; each
// eviction costs min(num_sinks, window) token moves; packing stays below one slice move per
// slice freed; every stream reads back its sinks and its window at the end.
TEST(SparseLayoutTest, StreamingWindowsKeepPagesBoundedOver10kSteps) {
  struct Head {
    int32_t num_sinks, window;
  };
  const std::vector<Head> heads = {{4, 8}, {1, 5}, {2, 13}, {0, 3}};
  KvManager kv(TinyConfig(16));
  FakeRunner runner(kv);
  const SeqId seq{11};
  kv.start_sparse(seq);
  std::vector<std::optional<int64_t>> bounds;
  for (const Head& h : heads) bounds.push_back(h.num_sinks + h.window);
  const int64_t bound = sparse_peak_pages(SparsePeakQuery{.shape = kv.slice_shape(),
                                                          .max_kept_tokens = bounds,
                                                          .chunk_size = 1,
                                                          .max_total_tokens = 100000});
  int64_t num_token_moves = 0, expected_token_moves = 0, num_slice_moves = 0;
  size_t max_pages = 0;
  constexpr int32_t kSteps = 10000;
  for (int32_t t = 0; t < kSteps; ++t) {
    std::optional<SparseAppend> append = kv.append_sparse(seq, 1);
    ASSERT_TRUE(append) << "step " << t;
    WriteAppended(runner, kv, seq, *append, t, 1);
    max_pages = std::max(max_pages, kv.owned_pages(seq).size());
    DropSets drops(kStreams);
    for (int32_t s = 0; s < kStreams; ++s) {
      const Head& h = heads[s];
      if (kv.sparse_layout(seq).streams[s].num_tokens > h.num_sinks + h.window) {
        drops[s] = {h.num_sinks};
        expected_token_moves += std::min(h.num_sinks, h.window);
      }
    }
    CompactionPlan plan = kv.drop_tokens(seq, drops);
    runner.run(plan);
    num_token_moves += static_cast<int64_t>(plan.token_moves.size());
    num_slice_moves += static_cast<int64_t>(plan.slice_moves.size());
    const int64_t used = kv.sparse_layout(seq).num_used_slices();
    ASSERT_LE(static_cast<int64_t>(kv.owned_pages(seq).size()), (used + 3) / 4 + 1) << "step " << t;
    if (t % 997 == 0) {
      ASSERT_EQ(kv.invariant_violation(), std::nullopt) << "step " << t;
    }
  }
  EXPECT_EQ(num_token_moves, expected_token_moves);
  EXPECT_LE(static_cast<int64_t>(max_pages), bound);
  // Each stream frees a slice every 4 evictions: about 10k slices over the run.
  EXPECT_LT(num_slice_moves, kSteps);
  const SparseLayout& layout = kv.sparse_layout(seq);
  for (int32_t s = 0; s < kStreams; ++s) {
    std::vector<int32_t> expected = Iota(0, heads[s].num_sinks);
    for (int32_t p = kSteps - heads[s].window; p < kSteps; ++p) expected.push_back(p);
    EXPECT_EQ(runner.read_stream(layout, s), Tags(s, expected)) << "stream " << s;
    EXPECT_EQ(layout.streams[s].num_dropped, kSteps - static_cast<int32_t>(expected.size()));
  }
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
  kv.free(seq);
  EXPECT_EQ(kv.num_free_pages(), 16);
}

TEST(SparseLayoutTest, ForkCopiesEverySliceIntoFreshPages) {
  KvManager kv(TinyConfig(4));
  FakeRunner runner(kv);
  kv.start_sparse(SeqId{1});
  std::optional<SparseAppend> append = kv.append_sparse(SeqId{1}, 5);  // slices 0..7
  ASSERT_TRUE(append);
  WriteAppended(runner, kv, SeqId{1}, *append, 0, 5);
  runner.run(*kv.compress(
      SeqId{1}, 5,
      {std::vector<int32_t>{4}, std::nullopt, std::vector<int32_t>{}, std::vector<int32_t>{0}}));
  // Stream 0 in slice 0, stream 1 in 2 and 3, stream 3 moved from 6 to 1: one page.
  EXPECT_EQ(kv.owned_pages(SeqId{1}).size(), 1u);
  std::optional<CompactionPlan> copies = kv.fork(SeqId{1}, SeqId{2});
  ASSERT_TRUE(copies);
  runner.run_copies(*copies);
  const SparseLayout& parent = kv.sparse_layout(SeqId{1});
  const SparseLayout& child = kv.sparse_layout(SeqId{2});
  EXPECT_EQ(child.num_used_slices(), parent.num_used_slices());
  for (int32_t s = 0; s < kStreams; ++s) {
    EXPECT_EQ(runner.read_stream(child, s), runner.read_stream(parent, s));
  }
  for (PageId page : kv.owned_pages(SeqId{2})) {
    EXPECT_EQ(std::count(kv.owned_pages(SeqId{1}).begin(), kv.owned_pages(SeqId{1}).end(), page),
              0);
  }
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(SparseLayoutTest, AdmissionFigures) {
  const SliceShape shape{.num_layers = 2, .num_kv_heads = 2, .page_size = 4};
  const std::vector<std::optional<int64_t>> bounds = {8, 8, std::nullopt, 3};
  // Held per stream: 12, 12, 40, 7 tokens -> 3+1, 3+1, 10+1, 2+1 = 22 slices -> 6 pages + 1.
  EXPECT_EQ(
      sparse_peak_pages(
          {.shape = shape, .max_kept_tokens = bounds, .chunk_size = 4, .max_total_tokens = 40}),
      7);
  // Leaving 12 dense tokens: 3 dense pages + kept 8, 8, 12, 3 -> 2+2+3+1 = 8 slices = 2 pages.
  EXPECT_EQ(sparse_peak_pages({.shape = shape,
                               .max_kept_tokens = bounds,
                               .chunk_size = 4,
                               .max_total_tokens = 40,
                               .dense_tokens_at_first_compression = 12}),
            7);
  // Leaving 36: 9 + ceil((2+2+9+1) / 4) = 13 pages.
  EXPECT_EQ(sparse_peak_pages({.shape = shape,
                               .max_kept_tokens = bounds,
                               .chunk_size = 4,
                               .max_total_tokens = 40,
                               .dense_tokens_at_first_compression = 36}),
            13);
  // The same dense pages turned sparse in place (private, unpublished): 9 pages, no copy.
  EXPECT_EQ(sparse_peak_pages({.shape = shape,
                               .max_kept_tokens = bounds,
                               .chunk_size = 4,
                               .max_total_tokens = 40,
                               .dense_tokens_at_first_compression = 36,
                               .in_place = true}),
            9);
  // Short requests: no stream holds more than the total.
  EXPECT_EQ(
      sparse_peak_pages(
          {.shape = shape, .max_kept_tokens = bounds, .chunk_size = 16, .max_total_tokens = 5}),
      // 5, 5, 5, 5 tokens -> (2+1) * 4 = 12 slices -> 3 pages + 1
      4);
  // 32 streams (8 layers x 4 heads), page size 16, budget 1024 + chunk 512 at 32k tokens:
  // 96 + 1 slices per stream -> ceil(3104 / 32) + 1 = 98 pages, vs 2048 dense.
  const SliceShape big{.num_layers = 8, .num_kv_heads = 4, .page_size = 16};
  const std::vector<std::optional<int64_t>> budget(32, 1024);
  EXPECT_EQ(
      sparse_peak_pages(
          {.shape = big, .max_kept_tokens = budget, .chunk_size = 512, .max_total_tokens = 32768}),
      98);
}

}  // namespace
}  // namespace sieve::kv
