#include "tokenizer/bpe_tokenizer.h"

#include <limits>
#include <queue>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

// A run of the word, a linked list over its initial characters (one per original byte). A
// symbol merged into its left neighbour has length 0 and is skipped by the list.
struct Symbol {
  uint32_t begin = 0;
  uint32_t length = 0;
  int32_t prev = -1;
  int32_t next = -1;
};

// A candidate merge; stale once either side has changed length (took part in another merge).
struct Bigram {
  int32_t rank = 0;
  int32_t left = 0;
  int32_t right = 0;
  uint32_t left_length = 0;
  uint32_t right_length = 0;
};

// Min-heap order: lowest rank first, then the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab)
    : TokenizerBase(std::move(vocab)), pre_tokenizer_(vocab_.pre) {
  build_piece_cache();
  merge_ranks_.reserve(vocab_.merges.size());
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    merge_ranks_.emplace(vocab_.merges[rank], static_cast<int32_t>(rank));
  }
}

std::string BpeTokenizer::normal_piece(std::string_view token_text) const {
  // Code points of the GPT-2 alphabet become their byte; any other code point (a vocabulary
  // outside that alphabet) is kept as its UTF-8.
  std::string out;
  out.reserve(token_text.size());
  size_t offset = 0;
  while (offset < token_text.size()) {
    const size_t start = offset;
    const uint32_t cpt = unicode::decode_lenient(token_text, offset);
    if (const auto byte = unicode::unicode_to_byte(cpt)) {
      out.push_back(static_cast<char>(*byte));
    } else {
      out.append(token_text.substr(start, offset - start));
    }
  }
  return out;
}

void BpeTokenizer::encode_text(std::string_view text, bool /*after_special*/,
                               std::vector<TokenId>& out) const {
  std::string key;
  std::string encoded;
  for (const std::string& word : pre_tokenizer_.split(text)) {
    encoded.clear();
    for (char c : word) encoded.append(unicode::byte_to_unicode(static_cast<uint8_t>(c)));
    if (pre_tokenizer_.traits().ignore_merges) {
      if (const auto id = find_token(encoded)) {
        out.push_back(*id);
        continue;
      }
    }
    encode_word(encoded, key, out);
  }
}

void BpeTokenizer::encode_word(std::string_view word, std::string& key,
                               std::vector<TokenId>& out) const {
  if (word.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail("BPE tokenizer: a word of {} bytes is too long (limit 2 GiB)", word.size());
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t offset = 0; offset < word.size();) {
    const size_t length = std::min(unicode::sequence_length(word[offset]), word.size() - offset);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(length), index - 1,
                       offset + length == word.size() ? -1 : index + 1});
    offset += length;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    key.assign(word.substr(a.begin, a.length));
    key.push_back(' ');
    key.append(word.substr(b.begin, b.length));
    const auto it = merge_ranks_.find(key);
    if (it == merge_ranks_.end()) return;
    queue.push({it->second, left, right, a.length, b.length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length != bigram.left_length || right.length != bigram.right_length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view symbol = word.substr(symbols[i].begin, symbols[i].length);
    if (const auto id = find_token(symbol)) {
      out.push_back(*id);
      continue;
    }
    // A merge result missing from the vocabulary (a broken vocabulary): fall back to the
    // symbol's characters, each one byte of the input; unk (or nothing) for a missing one.
    for (size_t offset = 0; offset < symbol.size();) {
      const size_t length =
          std::min(unicode::sequence_length(symbol[offset]), symbol.size() - offset);
      if (const auto id = find_token(symbol.substr(offset, length))) {
        out.push_back(*id);
      } else if (vocab_.unk) {
        out.push_back(*vocab_.unk);
      }
      offset += length;
    }
  }
}

}  // namespace sieve::tok
