#include "tokenizer/bpe_tokenizer.h"

#include <limits>

#include "tokenizer/merge_queue.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
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
  // A pair merges if it is in the merge list, the lower rank first.
  merge_pairs(
      word,
      [&](std::string_view a, std::string_view b) -> std::optional<int64_t> {
        key.assign(a);
        key.push_back(' ');
        key.append(b);
        const auto it = merge_ranks_.find(key);
        if (it == merge_ranks_.end()) return std::nullopt;
        return -int64_t{it->second};
      },
      [&](std::string_view symbol) { append_symbol(symbol, out); });
}

void BpeTokenizer::append_symbol(std::string_view symbol, std::vector<TokenId>& out) const {
  if (const auto id = find_token(symbol)) {
    out.push_back(*id);
    return;
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

}  // namespace sieve::tok
