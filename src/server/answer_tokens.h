#pragma once
// The token ids of recent answers, so that a next turn which sends an answer back as text is
// prompted with the ids the model wrote rather than a new tokenization of that text.
//
// A conversation's KV (a parked compressed sequence, or the prefix cache's pages) is found by
// token ids. Text does not round-trip through ids: the model may write "Hel"+"lo" where the
// tokenizer would read "Hello", and then the next turn's prompt leaves the cached ids at the first
// token of the answer, and the whole history is computed again. With this, a prompt text that
// starts with a remembered prompt's text and goes on with (part of) its answer keeps those ids,
// and only the rest of the text is tokenized:
//
//   turn 1:  text T1 ──encode──► ids P1;   answer ids A (text "Hello")
//   remember(T1, P1, A)
//   turn 2:  text T1 + "Hello" + R ──encode──► P1 + A + encode(R, continuing)
//
// Only answers are kept this way: a prompt is always its own text's tokenization up to the end of
// a remembered prompt, so two prompts that share a beginning are not tokenized differently.
// Thread-safe.
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sieve::server {

using TokenId = tok::TokenId;

class AnswerTokens {
 public:
  // capacity: how many answers are remembered, the most recent first (0: none, encode() is
  // tokenizer.encode()).
  AnswerTokens(const tok::Tokenizer& tokenizer, size_t capacity);

  // tokenizer.encode(text, options), except where text starts with a remembered prompt's text
  // and one or more whole tokens of its answer: those ids are kept and the rest of the text is
  // encoded as a continuation. The ids always decode to text.
  std::vector<TokenId> encode(std::string_view text, tok::EncodeOptions options) const;

  // After a request's answer: prompt_ids are what encode(prompt_text, options) gave; sent_text,
  // where given, the answer's text as the response carried it (the engine's bytes: JSON writes
  // invalid UTF-8 as U+FFFD, so that a resent answer matches whole even where bytes of its
  // tokens did not make characters).
  void remember(std::string_view prompt_text, std::span<const TokenId> prompt_ids,
                std::span<const TokenId> answer, tok::EncodeOptions options,
                std::optional<std::string_view> sent_text = std::nullopt);

  size_t size() const;

 private:
  struct Entry {
    std::string prompt_text;
    std::vector<TokenId> prompt_ids;
    std::vector<TokenId> answer;
    std::vector<std::string> answer_pieces;  // the bytes of each answer token, special ones too
    // The answer's text as the client received it, and how many of its tokens wrote it (0: the
    // pieces are matched one by one only).
    std::string sent_text;
    size_t sent_tokens = 0;
    // The start of the prompt whose ids came from the answer of the turn this entry superseded
    // (its bytes and ids; 0: none): a prompt resent again, which does not go on with this
    // entry's answer, still keeps those ids, as the superseded entry would have kept them.
    size_t kept_prefix_bytes = 0;
    size_t kept_prefix_ids = 0;
    bool kept_prefix_whole = false;
    bool add_special = false;
    bool parse_special = false;
  };

  // How much of `text` (which starts with e's prompt text) e's answer covers after the prompt:
  // whole (its sent text), then piece by piece; given `ids` (a prompt's ids that start with e's
  // prompt ids), only as far as they go on with the answer's ids.
  struct AnswerMatch {
    size_t end_bytes = 0;
    size_t tokens = 0;
    bool whole = false;
  };
  static AnswerMatch match_answer(const Entry& e, std::string_view text,
                                  std::span<const TokenId> ids = {});

  const tok::Tokenizer& tokenizer_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recent first
};

}  // namespace sieve::server
