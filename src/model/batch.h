#pragma once
// A ragged batch: the new tokens of any number of sequences, each sequence's tokens contiguous
// and in position order, plus each sequence's block table (where its K/V pages are).
//
//   tokens     [ a3 a4 a5 | b9 | c0 c1 ]      positions [ 3 4 5 | 9 | 0 1 ]
//   sequences  [ {first 0, count 3, pages a}, {first 3, count 1, pages b}, {first 4, count 2, pages c} ]
#include <cassert>
#include <cstdint>
#include <vector>

namespace sieve::model {

using TokenId = int32_t;

struct BatchSequence {
  int32_t first_token = 0;  // index into Batch::tokens
  int32_t num_tokens = 0;
  std::vector<int32_t> block_table;  // page ids; position t is in block_table[t / page_size]
};

struct Batch {
  std::vector<TokenId> tokens;
  std::vector<int32_t> positions;
  std::vector<uint8_t> want_logits;  // 1: produce logits for this token
  std::vector<BatchSequence> sequences;

  // Starts the next sequence; its tokens follow with add().
  void begin_sequence(std::vector<int32_t> block_table) {
    sequences.push_back({static_cast<int32_t>(tokens.size()), 0, std::move(block_table)});
  }
  void add(TokenId token, int32_t position, bool logits) {
    assert(!sequences.empty());
    tokens.push_back(token);
    positions.push_back(position);
    want_logits.push_back(logits ? 1 : 0);
    ++sequences.back().num_tokens;
  }
  void clear() {
    tokens.clear();
    positions.clear();
    want_logits.clear();
    sequences.clear();
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_logits() const {
    int64_t n = 0;
    for (uint8_t w : want_logits) n += w;
    return n;
  }
};

}  // namespace sieve::model
