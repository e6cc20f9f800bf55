#pragma once
// Internal to src/tokenizer: what the SPM and BPE tokenizers share.
//
// encode(text):  special-token partition -> per text fragment encode_text() -> BOS/EOS
// decode(ids):   per-id piece from a cache built once -> concatenation (SPM: leading space)
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace sieve::tok {

// Hash for unordered containers keyed by std::string that are looked up by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

// Per piece: whether it is punctuation as Tokenizer::is_punctuation() defines it.
std::vector<bool> find_punctuation(const std::vector<std::string>& pieces);

// The byte of a "<0xXX>" token text (two hex digits), std::nullopt for any other text.
std::optional<uint8_t> parse_byte_token(std::string_view text);

class TokenizerBase : public Tokenizer {
 public:
  std::vector<TokenId> encode(std::string_view text, EncodeOptions options) const final;
  std::string token_to_piece(TokenId id, bool render_special) const final;
  std::string decode(std::span<const TokenId> ids, bool render_special) const final;

 protected:
  explicit TokenizerBase(Vocab vocab);
  // Must be called by the subclass constructor: fills the piece cache via normal_piece().
  void build_piece_cache();

  // Appends the tokens of one fragment of plain text (never empty). after_special: the fragment
  // starts the input or follows a special token.
  virtual void encode_text(std::string_view text, bool after_special,
                           std::vector<TokenId>& out) const = 0;
  // The bytes a NORMAL token stands for, from its stored text.
  virtual std::string normal_piece(std::string_view token_text) const = 0;

  std::optional<TokenId> find_token(std::string_view text) const;
  // The piece of `id` (which must be in range) as token_to_piece() defines it.
  std::string_view piece(TokenId id, bool render_special) const;

 private:
  StringMap<TokenId> token_ids_;  // token text -> id (empty texts are not indexed)
  SpecialTokenMatcher specials_;
  std::vector<std::string> pieces_;  // per id, rendered as with render_special = true
};

}  // namespace sieve::tok
