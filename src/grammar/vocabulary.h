#pragma once
// A model's vocabulary as the grammar engine sees it: the bytes each token makes the detokenizer
// emit, which tokens end generation, and a byte trie over the text tokens. Built once per model
// and shared (immutable, thread-safe).
//
// Token bytes are Tokenizer::token_to_piece(id): SentencePiece's U+2581 is a space and <0xHH>
// byte tokens are that one byte; byte-level BPE is unmapped back to raw bytes. Special tokens
// (control, user-defined such as chat markers), unknown, unused and empty tokens are never text:
// a grammar never allows them. End-of-generation tokens (Tokenizer::eog_ids) are allowed exactly
// when the grammar may end.
//
// Note: Tokenizer::decode drops the space SentencePiece puts at the start of a prompt; the
// grammar sees every generated token's bytes as they are, including a leading space.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::tok {
class Tokenizer;
}

namespace sieve::grammar {

using TokenId = int32_t;

// One bit per token id.
class TokenBitset {
 public:
  TokenBitset() = default;
  explicit TokenBitset(size_t size) { reset(size); }
  void reset(size_t size) {
    size_ = size;
    words_.assign((size + 63) / 64, 0);
  }
  size_t size() const { return size_; }
  void set(size_t id) { words_[id >> 6] |= uint64_t{1} << (id & 63); }
  bool test(size_t id) const { return (words_[id >> 6] >> (id & 63)) & 1; }
  size_t count() const;
  void or_with(const TokenBitset& other);
  std::span<const uint64_t> words() const { return words_; }
  friend bool operator==(const TokenBitset&, const TokenBitset&) = default;

 private:
  size_t size_ = 0;
  std::vector<uint64_t> words_;
};

class Vocabulary {
 public:
  // Trie nodes in preorder: node 0 is the root (the empty string); a node's subtree is
  // [node, subtree_end), so its children are node + 1, then each child's subtree_end in turn.
  struct TrieNode {
    uint32_t subtree_end = 0;
    uint32_t token_begin = 0;  // tokens whose bytes end here: trie_tokens()[begin, end)
    uint32_t token_end = 0;
    uint8_t byte = 0;  // the byte that leads here from the parent
  };

  // token_bytes[id]; is_text[id] false for tokens a grammar never allows; eog_ids may repeat.
  Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> is_text,
             std::vector<TokenId> eog_ids);
  static std::shared_ptr<const Vocabulary> from_tokenizer(const tok::Tokenizer& tokenizer);

  size_t size() const { return token_bytes_.size(); }
  std::string_view token_bytes(TokenId id) const { return token_bytes_[id]; }
  bool is_text(TokenId id) const { return is_text_[id]; }
  bool is_eog(TokenId id) const;
  std::span<const TokenId> eog_ids() const { return eog_ids_; }

  std::span<const TrieNode> trie() const { return trie_; }
  std::span<const TokenId> trie_tokens() const { return trie_tokens_; }
  size_t max_token_length() const { return max_token_length_; }

 private:
  std::vector<std::string> token_bytes_;
  std::vector<bool> is_text_;
  std::vector<TokenId> eog_ids_;  // sorted, unique
  std::vector<TrieNode> trie_;
  std::vector<TokenId> trie_tokens_;
  size_t max_token_length_ = 0;
};

}  // namespace sieve::grammar
