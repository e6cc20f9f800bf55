#pragma once
// Internal to src/tokenizer: the SentencePiece-style tokenizer of "llama" vocabularies
// (llama.cpp's llm_tokenizer_spm).
//
// A text fragment gets a leading space when it starts the input or follows a special token
// (add_space_prefix), spaces become U+2581, and the fragment is cut into UTF-8 characters.
// Then, repeatedly, the adjacent pair whose concatenation is the vocabulary token with the
// highest score is merged (ties: the leftmost pair). Each final symbol is its token, or else
// its bytes as <0xXX> byte tokens, or else unk. Cost: O(n log n) in the fragment length.
#include <array>
#include <optional>

#include "tokenizer/tokenizer_impl.h"

namespace sieve::tok {

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(Vocab vocab);

 private:
  void encode_text(std::string_view text, bool after_special,
                   std::vector<TokenId>& out) const override;
  std::string normal_piece(std::string_view token_text) const override;

  float score(TokenId id) const { return vocab_.scores.empty() ? 0.0f : vocab_.scores[id]; }
  void append_bytes(std::string_view symbol, std::vector<TokenId>& out) const;

  // Per byte: the <0xXX> token, else the one-byte token, else unk, else nothing (the byte is
  // dropped; only a vocabulary without byte tokens and without unk can do that).
  std::array<std::optional<TokenId>, 256> byte_tokens_;
};

}  // namespace sieve::tok
