#include "grammar/vocabulary.h"

#include <algorithm>
#include <bit>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace sieve::grammar {

size_t TokenBitset::count() const {
  size_t n = 0;
  for (uint64_t w : words_) n += static_cast<size_t>(std::popcount(w));
  return n;
}

void TokenBitset::or_with(const TokenBitset& other) {
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
}

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> is_text,
                       std::vector<TokenId> eog_ids)
    : token_bytes_(std::move(token_bytes)),
      is_text_(std::move(is_text)),
      eog_ids_(std::move(eog_ids)) {
  if (is_text_.size() != token_bytes_.size()) {
    fail("grammar vocabulary: {} token texts but {} text flags", token_bytes_.size(),
         is_text_.size());
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
  for (TokenId id : eog_ids_) {
    if (id < 0 || static_cast<size_t>(id) >= size()) fail("grammar vocabulary: EOG id {}", id);
    is_text_[id] = false;
  }
  std::vector<TokenId> ids;
  for (size_t id = 0; id < size(); ++id) {
    if (token_bytes_[id].empty()) is_text_[id] = false;
    if (is_text_[id]) ids.push_back(static_cast<TokenId>(id));
  }
  std::sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) {
    return token_bytes_[a] != token_bytes_[b] ? token_bytes_[a] < token_bytes_[b] : a < b;
  });
  // Build the trie in preorder from the sorted strings; `path` holds the open nodes.
  trie_.push_back(TrieNode{});
  std::vector<uint32_t> path = {0};
  std::string_view prev;
  for (TokenId id : ids) {
    const std::string_view s = token_bytes_[id];
    max_token_length_ = std::max(max_token_length_, s.size());
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    while (path.size() > common + 1) {
      trie_[path.back()].subtree_end = static_cast<uint32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t i = common; i < s.size(); ++i) {
      TrieNode node;
      node.byte = static_cast<uint8_t>(s[i]);
      node.token_begin = node.token_end = static_cast<uint32_t>(trie_tokens_.size());
      path.push_back(static_cast<uint32_t>(trie_.size()));
      trie_.push_back(node);
    }
    TrieNode& leaf = trie_[path.back()];
    if (leaf.token_begin == leaf.token_end) {
      leaf.token_begin = leaf.token_end = static_cast<uint32_t>(trie_tokens_.size());
    }
    trie_tokens_.push_back(id);
    ++leaf.token_end;
    prev = s;
  }
  while (!path.empty()) {
    trie_[path.back()].subtree_end = static_cast<uint32_t>(trie_.size());
    path.pop_back();
  }
}

bool Vocabulary::is_eog(TokenId id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const tok::Tokenizer& tokenizer) {
  const tok::Vocab& vocab = tokenizer.vocab();
  std::vector<std::string> bytes(vocab.size());
  std::vector<bool> is_text(vocab.size(), false);
  for (size_t i = 0; i < vocab.size(); ++i) {
    const auto id = static_cast<tok::TokenId>(i);
    bytes[i] = tokenizer.token_to_piece(id);
    const tok::TokenType type = vocab.types[i];
    is_text[i] = !tokenizer.is_special(id) &&
                 (type == tok::TokenType::kNormal || type == tok::TokenType::kByte ||
                  type == tok::TokenType::kUndefined);
  }
  std::vector<TokenId> eog(tokenizer.eog_ids().begin(), tokenizer.eog_ids().end());
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(is_text), std::move(eog));
}

}  // namespace sieve::grammar
