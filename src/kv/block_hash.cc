#include "kv/block_hash.h"

#include <bit>

namespace sieve::kv {
namespace {

// The xxHash64 primes.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

uint64_t avalanche(uint64_t x) {
  x ^= x >> 33;
  x *= kP2;
  x ^= x >> 29;
  x *= kP3;
  x ^= x >> 32;
  return x;
}

// Two lanes with different round functions; each round is a bijection of the word for a fixed
// state, so a one-word change always changes both lanes.
struct Lanes {
  uint64_t a;
  uint64_t b;
  void mix(uint64_t word) {
    a = std::rotl(a + word * kP2, 31) * kP1;
    b = std::rotl(b ^ (word * kP4), 27) * kP3 + kP5;
  }
};

}  // namespace

BlockHash hash_block(const std::optional<BlockHash>& parent, std::span<const int32_t> tokens,
                     uint64_t extra_key, uint64_t seed) {
  Lanes lanes{.a = seed + kP1 + kP2, .b = (seed ^ kP4) + kP3};
  // The header word fixes the layout: parent present or not, and the token count (so packing an
  // odd last token with zero bits is unambiguous).
  lanes.mix((parent ? 1ull : 0ull) | (static_cast<uint64_t>(tokens.size()) << 1));
  lanes.mix(parent ? parent->lo : 0);
  lanes.mix(parent ? parent->hi : 0);
  lanes.mix(extra_key);
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    lanes.mix(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
              static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
  }
  if (i < tokens.size()) lanes.mix(static_cast<uint32_t>(tokens[i]));
  BlockHash hash;
  hash.lo = avalanche(lanes.a ^ std::rotl(lanes.b, 23));
  hash.hi = avalanche(lanes.b + std::rotl(lanes.a, 41) + kP5);
  return hash;
}

}  // namespace sieve::kv
