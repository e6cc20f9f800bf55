#include "tokenizer/spm_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "tokenizer/merge_queue.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
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

  // A pair merges if its text is a token, the higher score first. Every merged symbol is
  // then a token, so only single characters can be missing from the vocabulary.
  merge_pairs(
      text,
      [&](std::string_view a, std::string_view b) -> std::optional<float> {
        const auto id = find_token(std::string_view(a.data(), a.size() + b.size()));
        if (!id) return std::nullopt;
        return score(*id);
      },
      [&](std::string_view symbol) {
        if (const auto id = find_token(symbol)) {
          out.push_back(*id);
        } else {
          append_bytes(symbol, out);
        }
      });
}

}  // namespace sieve::tok
