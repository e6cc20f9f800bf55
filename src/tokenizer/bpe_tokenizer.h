#pragma once
// Internal to src/tokenizer: the byte-level BPE tokenizer of "gpt2" vocabularies (llama.cpp's
// llm_tokenizer_bpe).
//
// text -> pre-tokenizer words -> each byte of a word mapped to its GPT-2 code point -> merges:
// repeatedly the adjacent pair with the lowest merge rank is joined (ties: leftmost) -> each
// final symbol is looked up as a token. Cost: O(n log n) per word.
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace sieve::tok {

class BpeTokenizer final : public TokenizerBase {
 public:
  explicit BpeTokenizer(Vocab vocab);

 private:
  void encode_text(std::string_view text, bool after_special,
                   std::vector<TokenId>& out) const override;
  std::string normal_piece(std::string_view token_text) const override;
  // word: in the GPT-2 byte alphabet. key: scratch space for merge lookups.
  void encode_word(std::string_view word, std::string& key, std::vector<TokenId>& out) const;
  // One merged symbol's token (or, in a broken vocabulary, its characters' tokens).
  void append_symbol(std::string_view symbol, std::vector<TokenId>& out) const;

  PreTokenizer pre_tokenizer_;
  // "left right" -> rank (index in tokenizer.ggml.merges; the first of duplicates wins).
  // Byte-level symbols never contain a space, so the joined key is unambiguous.
  StringMap<int32_t> merge_ranks_;
};

}  // namespace sieve::tok
