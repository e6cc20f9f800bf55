#include "kv/page_pool.h"

#include <gtest/gtest.h>

#include "kv_test_util.h"

namespace sieve::kv {
namespace {

using test::P;
using test::Pages;

BlockHash H(int32_t token) { return hash_block(std::nullopt, std::vector<int32_t>{token}, 0, 0); }

TEST(PagePool, StartsAllFreeAndAllocatesInIdOrder) {
  PagePool pool(3);
  EXPECT_EQ(pool.num_pages(), 3);
  EXPECT_EQ(pool.num_free_pages(), 3);
  EXPECT_EQ(pool.free_queue(), Pages({0, 1, 2}));
  EXPECT_EQ(pool.allocate(), P(0));
  EXPECT_EQ(pool.allocate(), P(1));
  EXPECT_EQ(pool.allocate(), P(2));
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.num_free_pages(), 0);
  EXPECT_EQ(pool.ref_count(P(1)), 1);
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

TEST(PagePool, EmptyPool) {
  PagePool pool(0);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_TRUE(pool.free_queue().empty());
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

TEST(PagePool, UncachedPagesGoToTheHeadCachedToTheTail) {
  PagePool pool(5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.allocate());
  ASSERT_TRUE(pool.publish(P(1), H(1)));
  ASSERT_TRUE(pool.publish(P(2), H(2)));
  pool.release(P(1));
  pool.release(P(0));
  pool.release(P(2));
  pool.release(P(3));
  EXPECT_EQ(pool.free_queue(), Pages({3, 0, 1, 2}));
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);

  // Plain free pages are reused before any cached one is evicted; then LRU.
  EXPECT_EQ(pool.allocate(), P(3));
  EXPECT_EQ(pool.allocate(), P(0));
  EXPECT_EQ(pool.num_evictions(), 0);
  EXPECT_EQ(pool.find_cached(H(1)), P(1));
  EXPECT_EQ(pool.allocate(), P(1));
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_EQ(pool.find_cached(H(1)), std::nullopt);
  EXPECT_EQ(pool.block_hash(P(1)), std::nullopt);
  EXPECT_EQ(pool.find_cached(H(2)), P(2));
  EXPECT_EQ(pool.num_cached_pages(), 1);
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

TEST(PagePool, RetainTakesACachedFreePageOutOfTheMiddle) {
  PagePool pool(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.allocate());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.publish(P(i), H(i)));
  for (int i = 0; i < 4; ++i) pool.release(P(i));
  EXPECT_EQ(pool.free_queue(), Pages({0, 1, 2, 3}));

  pool.retain(P(2));  // prefix hit: ref 0 -> 1, hash kept
  EXPECT_EQ(pool.ref_count(P(2)), 1);
  EXPECT_EQ(pool.num_free_pages(), 3);
  EXPECT_EQ(pool.free_queue(), Pages({0, 1, 3}));
  EXPECT_EQ(pool.find_cached(H(2)), P(2));
  pool.retain(P(2));
  EXPECT_EQ(pool.ref_count(P(2)), 2);
  pool.release(P(2));
  EXPECT_EQ(pool.free_queue(), Pages({0, 1, 3}));
  pool.release(P(2));  // most recently used: evicted last
  EXPECT_EQ(pool.free_queue(), Pages({0, 1, 3, 2}));
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

TEST(PagePool, OnePagePerHash) {
  PagePool pool(2);
  ASSERT_TRUE(pool.allocate());
  ASSERT_TRUE(pool.allocate());
  EXPECT_TRUE(pool.publish(P(0), H(7)));
  EXPECT_FALSE(pool.publish(P(1), H(7)));
  EXPECT_EQ(pool.block_hash(P(1)), std::nullopt);
  EXPECT_EQ(pool.find_cached(H(7)), P(0));
  EXPECT_EQ(pool.num_cached_pages(), 1);
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

TEST(PagePool, ResetCacheOnlyWhenNothingIsInUse) {
  PagePool pool(2);
  ASSERT_TRUE(pool.allocate());
  ASSERT_TRUE(pool.publish(P(0), H(1)));
  EXPECT_FALSE(pool.reset_cache());
  EXPECT_EQ(pool.find_cached(H(1)), P(0));
  pool.release(P(0));
  EXPECT_TRUE(pool.reset_cache());
  EXPECT_EQ(pool.find_cached(H(1)), std::nullopt);
  EXPECT_EQ(pool.num_cached_pages(), 0);
  EXPECT_EQ(pool.free_queue(), Pages({1, 0}));
  EXPECT_EQ(pool.invariant_violation(), std::nullopt);
}

}  // namespace
}  // namespace sieve::kv
