#include "kv/block_hash.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_set>
#include <vector>

#include "kv_test_util.h"

namespace sieve::kv {
namespace {

const std::vector<int32_t> kBlock = {1, 2, 3, 4};

TEST(BlockHash, SameInputsSameHash) {
  BlockHash parent = hash_block(std::nullopt, kBlock, 0, 0);
  EXPECT_EQ(hash_block(std::nullopt, kBlock, 0, 0), parent);
  EXPECT_EQ(hash_block(parent, kBlock, 5, 9),
            hash_block(parent, std::vector<int32_t>(kBlock), 5, 9));
}

TEST(BlockHash, EveryInputChangesTheHash) {
  const BlockHash base = hash_block(std::nullopt, kBlock, 0, 0);
  const BlockHash other_parent = hash_block(std::nullopt, std::vector<int32_t>{9, 9, 9, 9}, 0, 0);
  const std::vector<BlockHash> variants = {
      hash_block(std::nullopt, std::vector<int32_t>{1, 2, 3, 5}, 0, 0),  // one token
      hash_block(std::nullopt, std::vector<int32_t>{2, 1, 3, 4}, 0, 0),  // order
      hash_block(std::nullopt, std::vector<int32_t>{1, 2, 3}, 0, 0),     // length
      hash_block(std::nullopt, std::vector<int32_t>{1, 2, 3, 4, 0}, 0, 0),
      hash_block(std::nullopt, std::vector<int32_t>{-1, 2, 3, 4}, 0, 0),
      hash_block(base, kBlock, 0, 0),          // a parent
      hash_block(other_parent, kBlock, 0, 0),  // another parent
      hash_block(std::nullopt, kBlock, 1, 0),  // extra key
      hash_block(std::nullopt, kBlock, 0, 1),  // seed
  };
  std::unordered_set<BlockHash> seen = {base};
  for (const BlockHash& h : variants) {
    EXPECT_TRUE(seen.insert(h).second) << ::testing::PrintToString(h);
  }
}

TEST(BlockHash, BothHalvesAreDistinctOverManyBlocks) {
  // 200k random 16-token blocks chained in 1000 sequences: no 64-bit half collides (the
  // chance of any collision is about 2^-27 per half).
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0,
                                               15);  // small alphabet: many near-identical blocks
  std::unordered_set<uint64_t> los, his;
  std::vector<int32_t> block(16);
  for (int seq = 0; seq < 1000; ++seq) {
    std::optional<BlockHash> parent;
    for (int b = 0; b < 200; ++b) {
      for (int32_t& t : block) t = token(rng);
      BlockHash h = hash_block(parent, block, 0, 0);
      ASSERT_TRUE(los.insert(h.lo).second);
      ASSERT_TRUE(his.insert(h.hi).second);
      parent = h;
    }
  }
}

}  // namespace
}  // namespace sieve::kv
