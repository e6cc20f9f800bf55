#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <iterator>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

// Control tokens that end a turn or a text in common chat vocabularies (llama.cpp's list).
constexpr std::string_view kEndOfGenerationNames[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<|return|>",
    "<|call|>",
    "<｜end▁of▁sentence｜>",
};

void check_id(const Tokenizer& tokenizer, TokenId id) {
  if (id < 0 || static_cast<size_t>(id) >= tokenizer.vocab().size()) {
    fail("token id {} is out of range: the vocabulary has {} tokens", id, tokenizer.vocab().size());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  for (const auto& id : {vocab_.eos, vocab_.eot}) {
    if (id) eog_ids_.push_back(*id);
  }
  std::optional<TokenId> end_id;  // "<|end|>"
  bool has_return = false;
  bool has_call = false;
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const std::string& text = vocab_.tokens[id];
    if (vocab_.types[id] != TokenType::kControl ||
        std::find(std::begin(kEndOfGenerationNames), std::end(kEndOfGenerationNames), text) ==
            std::end(kEndOfGenerationNames)) {
      continue;
    }
    eog_ids_.push_back(static_cast<TokenId>(id));
    if (text == "<|end|>") end_id = static_cast<TokenId>(id);
    has_return |= text == "<|return|>";
    has_call |= text == "<|call|>";
  }
  // gpt-oss (harmony) ends a message with <|end|> but a turn with <|return|> or <|call|>.
  if (end_id && has_return && has_call && end_id != vocab_.eos && end_id != vocab_.eot) {
    eog_ids_.erase(std::find(eog_ids_.begin(), eog_ids_.end(), *end_id));
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
}

std::unique_ptr<Tokenizer> Tokenizer::create(Vocab vocab) {
  validate(vocab);
  switch (vocab.kind) {
    case VocabKind::kSpm:
      return std::make_unique<SpmTokenizer>(std::move(vocab));
    case VocabKind::kBpe:
      return std::make_unique<BpeTokenizer>(std::move(vocab));
  }
  fail("unknown vocabulary kind {}", static_cast<int>(vocab.kind));
}

bool Tokenizer::is_control(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < vocab_.size() &&
         vocab_.types[id] == TokenType::kControl;
}

bool Tokenizer::is_special(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_.size()) return false;
  return vocab_.types[id] == TokenType::kControl || vocab_.types[id] == TokenType::kUserDefined;
}

bool Tokenizer::is_punctuation(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < punctuation_.size() && punctuation_[id];
}

bool Tokenizer::is_eog(TokenId id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

// ---------------------------------------------------------------------------------------------
// TokenizerBase

TokenizerBase::TokenizerBase(Vocab vocab) : Tokenizer(std::move(vocab)), specials_(vocab_) {
  token_ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (!vocab_.tokens[id].empty()) token_ids_.emplace(vocab_.tokens[id], static_cast<TokenId>(id));
  }
}

void TokenizerBase::build_piece_cache() {
  pieces_.resize(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const std::string& text = vocab_.tokens[id];
    switch (vocab_.types[id]) {
      case TokenType::kNormal:
        pieces_[id] = normal_piece(text);
        break;
      case TokenType::kByte:
        if (auto byte = parse_byte_token(text)) {
          pieces_[id] = std::string(1, static_cast<char>(*byte));
        } else {
          pieces_[id] = normal_piece(text);
        }
        break;
      case TokenType::kUserDefined:
        // SentencePiece's (and Hugging Face's) decoders read U+2581 in these as a space too:
        // Gemma's "▁▁" runs are user-defined tokens.
        pieces_[id] = vocab_.kind == VocabKind::kSpm ? normal_piece(text) : text;
        break;
      case TokenType::kControl:
      case TokenType::kUnknown:
        pieces_[id] = text;
        break;
      case TokenType::kUnused:
      case TokenType::kUndefined:
        break;  // stand for nothing, like llama.cpp
    }
  }
  punctuation_ = find_punctuation(pieces_);
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (is_special(static_cast<TokenId>(id))) punctuation_[id] = false;  // "</s>" and the like
  }
}

std::optional<TokenId> TokenizerBase::find_token(std::string_view text) const {
  auto it = token_ids_.find(text);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::string_view TokenizerBase::piece(TokenId id, bool render_special) const {
  const TokenType type = vocab_.types[id];
  if (!render_special && (type == TokenType::kControl || type == TokenType::kUnknown)) return {};
  return pieces_[id];
}

std::vector<TokenId> TokenizerBase::encode(std::string_view text, EncodeOptions options) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_special && vocab_.add_bos) out.push_back(*vocab_.bos);
  bool after_special = !options.continues;
  for (const Fragment& fragment : specials_.partition(text, options.parse_special)) {
    if (fragment.token) {
      out.push_back(*fragment.token);
      after_special = true;
    } else {
      if (vocab_.normalize_nfc) {
        encode_text(unicode::to_nfc(fragment.text), after_special, out);
      } else {
        encode_text(fragment.text, after_special, out);
      }
      after_special = false;
    }
  }
  if (options.add_special && vocab_.add_eos) out.push_back(*vocab_.eos);
  return out;
}

std::string TokenizerBase::token_to_piece(TokenId id, bool render_special) const {
  check_id(*this, id);
  return std::string(piece(id, render_special));
}

std::string TokenizerBase::decode(std::span<const TokenId> ids, bool render_special) const {
  for (TokenId id : ids) check_id(*this, id);
  // encode() put one space in front of the text; it shows up at the start of the first piece
  // after an optional BOS.
  const bool strip_space = vocab_.kind == VocabKind::kSpm && vocab_.add_space_prefix;
  const size_t first_text = !ids.empty() && vocab_.bos && ids[0] == *vocab_.bos ? 1 : 0;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string_view p = piece(ids[i], render_special);
    if (strip_space && i == first_text && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    out.append(p);
  }
  return out;
}

std::optional<uint8_t> parse_byte_token(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() != 6 || !text.starts_with("<0x") || text.back() != '>') return std::nullopt;
  const int high = hex(text[3]);
  const int low = hex(text[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<uint8_t>(high * 16 + low);
}

}  // namespace sieve::tok
