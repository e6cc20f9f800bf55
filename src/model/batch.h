#pragma once
// A ragged batch: tokens from any number of sequences, each with its position and the KV
// slot (sequence cache) it belongs to. Tokens of one sequence appear in position order.
#include <cstdint>
#include <vector>

namespace sieve::model {

using TokenId = int32_t;

struct Batch {
  std::vector<TokenId> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;
  std::vector<uint8_t> want_logits;  // 1: produce logits for this token

  void add(TokenId token, int32_t position, int32_t slot, bool logits) {
    tokens.push_back(token);
    positions.push_back(position);
    slots.push_back(slot);
    want_logits.push_back(logits ? 1 : 0);
  }
  void clear() {
    tokens.clear();
    positions.clear();
    slots.clear();
    want_logits.clear();
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_logits() const {
    int64_t n = 0;
    for (uint8_t w : want_logits) n += w;
    return n;
  }
};

}  // namespace sieve::model
