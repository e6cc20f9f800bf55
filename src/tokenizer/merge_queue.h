#pragma once
// Internal to src/tokenizer: the best-first pair merging both tokenizers run (BPE by merge
// rank, SPM by token score), as llama.cpp does it.
//
// The text is cut into characters by their lead byte (a truncated sequence at the end is one
// short symbol, stray continuation bytes one symbol each); adjacent symbols whose pair has a
// priority are merged, highest priority first (ties: the leftmost pair), until no pair is left.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace sieve::tok {

// priority(left, right) -> std::optional<P>: the pair's priority (higher merges first), or
// nullopt if it never merges. Calls emit(symbol) for the resulting symbols, in order.
template <typename Priority, typename Emit>
void merge_pairs(std::string_view text, Priority&& priority, Emit&& emit) {
  // A linked list over the characters; a symbol merged into its left neighbour has length 0.
  struct Symbol {
    uint32_t begin = 0;
    uint32_t length = 0;
    int32_t prev = -1;
    int32_t next = -1;
  };
  using P = typename std::invoke_result_t<Priority, std::string_view, std::string_view>::value_type;
  // A candidate merge; stale once either side has changed length (took part in another merge).
  struct Pair {
    P priority;
    int32_t left = 0;
    int32_t right = 0;
    uint32_t left_length = 0;
    uint32_t right_length = 0;
  };
  struct Order {  // max-heap: the highest priority, then the leftmost pair
    bool operator()(const Pair& a, const Pair& b) const {
      return a.priority < b.priority || (!(b.priority < a.priority) && a.left > b.left);
    }
  };

  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t length = std::min(unicode::sequence_length(text[offset]), text.size() - offset);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(length), index - 1,
                       offset + length == text.size() ? -1 : index + 1});
    offset += length;
  }
  const auto view = [&](const Symbol& s) { return text.substr(s.begin, s.length); };

  std::priority_queue<Pair, std::vector<Pair>, Order> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    if (const auto p = priority(view(a), view(b)))
      queue.push({*p, left, right, a.length, b.length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Pair pair = queue.top();
    queue.pop();
    Symbol& left = symbols[pair.left];
    Symbol& right = symbols[pair.right];
    if (left.length != pair.left_length || right.length != pair.right_length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pair.left;
    try_add(left.prev, pair.left);
    try_add(pair.left, left.next);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) emit(view(symbols[i]));
}

}  // namespace sieve::tok
