#pragma once
// Content hashes of full KV blocks, the keys of the prefix cache.
//
// Block i of a sequence is identified by everything that determines its K/V values: the tokens
// of blocks 0..i and the sequence's extra key. Hashing is chained so that each block costs
// O(page_size):
//
//   hash(block 0) = H(seed; none,            tokens[0, P),   extra_key)
//   hash(block i) = H(seed; hash(block i-1), tokens[iP, iP+P), extra_key)
//
// H is a hand-written 128-bit non-cryptographic hash (two 64-bit multiply-rotate lanes with a
// final avalanche, xxHash-style). An accidental collision would make two different prefixes
// share K/V; at 128 bits that needs ~2^64 cached blocks, i.e. never. It is not meant to resist
// a deliberate collision: untrusted tenants sharing one engine should be kept apart with
// distinct extra keys (a per-tenant salt), which no collision can cross without breaking H.
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace sieve::kv {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  auto operator<=>(const BlockHash&) const = default;
};

// `parent` is the hash of the previous block of the same sequence, nullopt for block 0.
// `extra_key` separates sequences that must never share K/V although their tokens agree (LoRA
// adapter, sparsity policy, tenant salt); 0 is "none". `seed` is KvConfig::hash_seed.
// Cost: O(tokens.size()).
BlockHash hash_block(const std::optional<BlockHash>& parent, std::span<const int32_t> tokens,
                     uint64_t extra_key, uint64_t seed);

}  // namespace sieve::kv

template <>
struct std::hash<sieve::kv::BlockHash> {
  // The low lane is already well mixed.
  size_t operator()(const sieve::kv::BlockHash& h) const noexcept {
    return static_cast<size_t>(h.lo);
  }
};
