#include "tokenizer/spm_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <queue>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

// One run of the text, a linked list over the initial characters. A symbol that was merged
// into its left neighbour has length 0 and is skipped by the list.
struct Symbol {
  uint32_t begin = 0;
  uint32_t length = 0;
  int32_t prev = -1;
  int32_t next = -1;
};

// A candidate merge of two adjacent symbols. Stale once either side has changed length, which
// happens exactly when either took part in another merge.
struct Bigram {
  float score = 0;
  int32_t left = 0;
  int32_t right = 0;
  uint32_t left_length = 0;
  uint32_t right_length = 0;
};

// Max-heap order: higher score first, then the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

SpmTokenizer::SpmTokenizer(Vocab vocab) : TokenizerBase(std::move(vocab)) {
  build_piece_cache();
  for (int byte = 0; byte < 256; ++byte) {
    byte_tokens_[byte] = find_token(fmt::format("<0x{:02X}>", byte));
    if (!byte_tokens_[byte])
      byte_tokens_[byte] = find_token(std::string(1, static_cast<char>(byte)));
    if (!byte_tokens_[byte]) byte_tokens_[byte] = vocab_.unk;
  }
}

std::string SpmTokenizer::normal_piece(std::string_view token_text) const {
  return unicode::unescape_spm_spaces(token_text);
}

void SpmTokenizer::append_bytes(std::string_view symbol, std::vector<TokenId>& out) const {
  for (char c : symbol) {
    if (const auto& id = byte_tokens_[static_cast<uint8_t>(c)]) out.push_back(*id);
  }
}

void SpmTokenizer::encode_text(std::string_view fragment, bool after_special,
                               std::vector<TokenId>& out) const {
  std::string spaced;
  if (vocab_.add_space_prefix && after_special) spaced = " ";
  spaced.append(fragment);
  const std::string text = unicode::escape_spm_spaces(spaced);
  if (text.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail("SPM tokenizer: a text fragment of {} bytes is too long (limit 2 GiB)", text.size());
  }

  // Characters by their lead byte, as llama.cpp cuts them: a truncated sequence at the end is
  // one short symbol, stray continuation bytes are one symbol each.
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t length = std::min(unicode::sequence_length(text[offset]), text.size() - offset);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(length), index - 1,
                       offset + length == text.size() ? -1 : index + 1});
    offset += length;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    const auto id = find_token(std::string_view(text).substr(a.begin, a.length + b.length));
    if (!id) return;
    queue.push({score(*id), left, right, a.length, b.length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length != bigram.left_length || right.length != bigram.right_length ||
        right.length == 0) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  // Every merged symbol is a token (a pair is only queued if it is one), so only single
  // characters can be missing from the vocabulary.
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view symbol =
        std::string_view(text).substr(symbols[i].begin, symbols[i].length);
    if (const auto id = find_token(symbol)) {
      out.push_back(*id);
    } else {
      append_bytes(symbol, out);
    }
  }
}

}  // namespace sieve::tok
