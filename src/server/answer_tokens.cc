#include "server/answer_tokens.h"

#include <algorithm>

#include "server/json.h"

namespace sieve::server {

AnswerTokens::AnswerTokens(const tok::Tokenizer& tokenizer, size_t capacity)
    : tokenizer_(tokenizer), capacity_(capacity) {}

AnswerTokens::AnswerMatch AnswerTokens::match_answer(const Entry& e, std::string_view text,
                                                     std::span<const TokenId> ids) {
  const size_t ids_at = e.prompt_ids.size();
  const auto id_matches = [&](size_t k) {
    return ids.empty() || (ids_at + k < ids.size() && ids[ids_at + k] == e.answer[k]);
  };
  AnswerMatch m{.end_bytes = e.prompt_text.size()};
  if (e.sent_tokens > 0 && text.substr(m.end_bytes).starts_with(e.sent_text)) {
    size_t k = 0;
    while (k < e.sent_tokens && id_matches(k)) ++k;
    if (k == e.sent_tokens)
      m = {.end_bytes = m.end_bytes + e.sent_text.size(), .tokens = k, .whole = true};
  }
  for (; m.tokens < e.answer_pieces.size(); ++m.tokens) {
    const std::string& piece = e.answer_pieces[m.tokens];
    if (piece.empty() || !id_matches(m.tokens) ||
        text.substr(m.end_bytes).substr(0, piece.size()) != piece) {
      break;
    }
    m.end_bytes += piece.size();
  }
  return m;
}

std::vector<TokenId> AnswerTokens::encode(std::string_view text, tok::EncodeOptions options) const {
  std::vector<TokenId> ids;
  size_t kept_bytes = 0;
  {
    std::lock_guard lock(mutex_);
    const Entry* best = nullptr;
    size_t best_prompt_ids = 0;  // of best->prompt_ids, then best_tokens of its answer
    size_t best_tokens = 0;
    bool best_whole = false;
    for (const Entry& e : entries_) {
      if (e.add_special != options.add_special || e.parse_special != options.parse_special) {
        continue;
      }
      AnswerMatch m;
      size_t prompt_ids = e.prompt_ids.size();
      if (text.starts_with(e.prompt_text)) m = match_answer(e, text);
      if (m.tokens == 0) {
        // Not this entry's answer: the prompt it superseded may still be resent (a next turn
        // sent again: its text stops where this entry's answer would start).
        if (e.kept_prefix_ids == 0 ||
            !text.starts_with(std::string_view(e.prompt_text).substr(0, e.kept_prefix_bytes))) {
          continue;
        }
        m = {.end_bytes = e.kept_prefix_bytes, .tokens = 0, .whole = e.kept_prefix_whole};
        prompt_ids = e.kept_prefix_ids;
      }
      // An answer resent whole is the conversation the client holds: it beats a longer piecewise
      // match of another answer to the same prompt (same text, but ids past this answer's end:
      // "   " + " The" read as another answer's four spaces then "The"). Among equals, the most
      // bytes; of equal bytes, the most recent.
      if ((best_whole && !m.whole) || (m.whole == best_whole && m.end_bytes <= kept_bytes)) {
        continue;
      }
      best = &e;
      best_prompt_ids = prompt_ids;
      best_tokens = m.tokens;
      best_whole = m.whole;
      kept_bytes = m.end_bytes;
    }
    if (best) {
      ids.reserve(best_prompt_ids + best_tokens + (text.size() - kept_bytes) / 3 + 1);
      ids.assign(best->prompt_ids.begin(), best->prompt_ids.begin() + best_prompt_ids);
      ids.insert(ids.end(), best->answer.begin(), best->answer.begin() + best_tokens);
    }
  }
  if (ids.empty()) return tokenizer_.encode(text, options);
  // After a kept special token the rest starts as text after a special token always does (SPM
  // puts its space in front); after other tokens it continues their text.
  const std::vector<TokenId> rest =
      tokenizer_.encode(text.substr(kept_bytes), {.add_special = false,
                                                  .parse_special = options.parse_special,
                                                  .continues = !tokenizer_.is_special(ids.back())});
  ids.insert(ids.end(), rest.begin(), rest.end());
  const auto& vocab = tokenizer_.vocab();
  if (options.add_special && vocab.add_eos && vocab.eos) ids.push_back(*vocab.eos);
  return ids;
}

namespace {

// Text as a client reads it from a response: invalid UTF-8 replaced as the server's JSON writes it.
std::string as_sent(std::string_view bytes) {
  return json::parse(dump_json(std::string(bytes))).get<std::string>();
}

}  // namespace

void AnswerTokens::remember(std::string_view prompt_text, std::span<const TokenId> prompt_ids,
                            std::span<const TokenId> answer, tok::EncodeOptions options,
                            std::optional<std::string_view> sent_text) {
  if (capacity_ == 0 || answer.empty() || prompt_text.empty()) return;
  // Special tokens in an answer stand for their text only where the prompt's text is read for
  // special tokens; elsewhere the answer is kept up to its first special token.
  std::vector<std::string> pieces;
  pieces.reserve(answer.size());
  for (TokenId id : answer) {
    if (!options.parse_special && tokenizer_.is_special(id)) break;
    pieces.push_back(tokenizer_.token_to_piece(id, /*render_special=*/true));
  }
  if (pieces.empty()) return;
  // An answer ending in the vocabulary's EOS: the prompt was encoded without one at its end.
  const auto& vocab = tokenizer_.vocab();
  if (options.add_special && vocab.add_eos && !prompt_ids.empty() && vocab.eos &&
      prompt_ids.back() == *vocab.eos) {
    return;  // a prompt that ends in EOS is not continued by its answer
  }
  // The sent text stands for the answer's tokens up to the last that writes text (an EOS after
  // them writes none), when those tokens' bytes read as that text.
  std::string sent;
  size_t sent_tokens = 0;
  if (sent_text && !sent_text->empty()) {
    std::string bytes;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string piece = tokenizer_.token_to_piece(answer[i], /*render_special=*/false);
      bytes += piece;
      if (!piece.empty()) sent_tokens = i + 1;
    }
    sent = as_sent(*sent_text);
    if (as_sent(bytes) != sent) {
      sent.clear();
      sent_tokens = 0;
    }
  }
  Entry entry{.prompt_text = std::string(prompt_text),
              .prompt_ids = std::vector<TokenId>(prompt_ids.begin(), prompt_ids.end()),
              .answer = std::vector<TokenId>(answer.begin(), answer.begin() + pieces.size()),
              .answer_pieces = std::move(pieces),
              .sent_text = std::move(sent),
              .sent_tokens = sent_tokens,
              .add_special = options.add_special,
              .parse_special = options.parse_special};
  std::lock_guard lock(mutex_);
  // A conversation keeps one entry: the turn whose answer this prompt goes on with is superseded
  // by it, and the new entry keeps what of its prompt came from that answer (so that this
  // prompt, resent, is encoded as it was now). Other answers to the same prompt stay (n > 1, a
  // regenerated answer: each may be resent), but the same answer again replaces its older copy.
  const auto continues = [&](const Entry& e) {
    return e.add_special == entry.add_special && e.parse_special == entry.parse_special &&
           prompt_text.starts_with(e.prompt_text) &&
           std::ranges::mismatch(e.prompt_ids, entry.prompt_ids).in1 == e.prompt_ids.end();
  };
  // Superseded: the turn this prompt goes on from (with some of its answer's ids), and the same
  // answer to the same prompt. A prompt that branches off before e's answer leaves e: a client
  // may still resend that answer.
  std::vector<const Entry*> superseded;
  for (const Entry& e : entries_) {
    if (!continues(e)) continue;
    // A longer prompt continues e's answer; the same prompt (another answer to it) keeps e's
    // kept start.
    const AnswerMatch m = prompt_text.size() > e.prompt_text.size()
                              ? match_answer(e, prompt_text, entry.prompt_ids)
                              : AnswerMatch{};
    const bool answer = m.tokens > 0;
    if (answer || (prompt_text.size() == e.prompt_text.size() && e.answer == entry.answer))
      superseded.push_back(&e);
    const size_t bytes = answer ? m.end_bytes : e.kept_prefix_bytes;
    if (bytes <= entry.kept_prefix_bytes) continue;
    entry.kept_prefix_bytes = bytes;
    entry.kept_prefix_ids = answer ? e.prompt_ids.size() + m.tokens : e.kept_prefix_ids;
    entry.kept_prefix_whole = answer ? m.whole : e.kept_prefix_whole;
  }
  std::erase_if(entries_, [&](const Entry& e) {
    return std::ranges::find(superseded, &e) != superseded.end();
  });
  entries_.push_front(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_back();
}

size_t AnswerTokens::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace sieve::server
