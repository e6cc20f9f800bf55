#include "eval/needle_task.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "eval/needle_words.h"
#include "util/error.h"

namespace sieve::eval {

namespace {

using tok::TokenId;

// Tokens a completion answer may take beyond its value's own (another split of the same text).
constexpr int32_t kAnswerSlack = 4;
// An instruct answer's room: per asked value beyond its tokens, and once for the wording.
constexpr int32_t kInstructSlackPerValue = 8;
constexpr int32_t kInstructSlack = 16;
// Stands for the user message while the chat template is rendered once to find its two sides.
constexpr std::string_view kMessagePlaceholder = "SIEVE-NEEDLE-DOCUMENT";
// What text is tokenized after to learn its tokens in place: a sentence end (a needle, a
// question), or a word (the "." or "," right after a value).
constexpr std::string_view kSentenceAnchor = ".";
constexpr std::string_view kWordAnchor = "so";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A draw in [0, n): the same for a seed on every standard library (unlike its distributions).
uint64_t draw(std::mt19937_64& rng, uint64_t n) { return rng() % n; }

std::string cue_text(std::string_view key) { return fmt::format(" The secret code of {} is", key); }

std::string list_of(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " and " : ", ";
    out += words[i];
  }
  return out;
}

int32_t size_of(const std::vector<TokenId>& tokens) { return static_cast<int32_t>(tokens.size()); }

void append(std::vector<TokenId>& to, const std::vector<TokenId>& tokens) {
  to.insert(to.end(), tokens.begin(), tokens.end());
}

}  // namespace

std::string_view needle_task_name(NeedleTask task) {
  switch (task) {
    case NeedleTask::kSingle:
      return "single";
    case NeedleTask::kMultiKey:
      return "multi-key";
    case NeedleTask::kMultiValue:
      return "multi-value";
    case NeedleTask::kMultiQuery:
      return "multi-query";
  }
  return "?";
}

std::optional<NeedleTask> parse_needle_task(std::string_view name) {
  for (NeedleTask task : {NeedleTask::kSingle, NeedleTask::kMultiKey, NeedleTask::kMultiValue,
                          NeedleTask::kMultiQuery}) {
    if (needle_task_name(task) == name) return task;
  }
  return std::nullopt;
}

std::string_view needle_framing_name(NeedleFraming framing) {
  return framing == NeedleFraming::kCompletion ? "completion" : "instruct";
}

std::vector<TokenId> NeedleCaseMaker::encode_after(std::string_view before,
                                                   const std::vector<TokenId>& before_tokens,
                                                   std::string_view text,
                                                   bool parse_special) const {
  // The tokens of before + text less those of before: what the text becomes in that place
  // (SentencePiece would otherwise add its leading space, and "\n" would not start a token).
  std::string anchored(before);
  anchored.append(text);
  const std::vector<TokenId> joined =
      tokenizer_->encode(anchored, {.add_special = false, .parse_special = parse_special});
  if (joined.size() < before_tokens.size() ||
      !std::equal(before_tokens.begin(), before_tokens.end(), joined.begin()))
    fail("the tokenizer joins '{}' to the '{}' before it", text, before);
  return {joined.begin() + static_cast<ptrdiff_t>(before_tokens.size()), joined.end()};
}

std::vector<TokenId> NeedleCaseMaker::encode_after_sentence(std::string_view text,
                                                            bool parse_special) const {
  return encode_after(kSentenceAnchor, anchor_, text, parse_special);
}

std::vector<TokenId> NeedleCaseMaker::encode_after_word(std::string_view text) const {
  return encode_after(kWordAnchor, word_anchor_, text, false);
}

NeedleCaseMaker::NeedleCaseMaker(std::shared_ptr<const tok::Tokenizer> tokenizer,
                                 std::string_view haystack, NeedleTaskConfig config)
    : tokenizer_(std::move(tokenizer)), config_(std::move(config)) {
  const NeedleTaskConfig& c = config_;
  if (c.value_min_tokens < 1 || c.value_max_tokens < c.value_min_tokens)
    fail("value tokens: need 1 <= min ({}) <= max ({})", c.value_min_tokens, c.value_max_tokens);
  const auto num_keys = static_cast<int32_t>(needle_keys().size());
  if (c.num_distractors < 1 || c.num_distractors >= num_keys)
    fail("multi-key needs 1 to {} distractors, not {}", num_keys - 1, c.num_distractors);
  if (c.num_values < 2 || c.num_values > 64)
    fail("multi-value needs 2 to 64 values, not {}", c.num_values);
  if (c.num_queries < 2 || c.num_queries > num_keys)
    fail("multi-query needs 2 to {} queries, not {}", num_keys, c.num_queries);
  anchor_ = tokenizer_->encode(kSentenceAnchor, {.add_special = false, .parse_special = false});
  word_anchor_ = tokenizer_->encode(kWordAnchor, {.add_special = false, .parse_special = false});

  // The haystack's tokens, where its sentences end (". " "! " "? ", closing quotes or brackets
  // between) and where its words start.
  haystack_ = tokenizer_->encode(haystack, {.add_special = false, .parse_special = false});
  if (haystack_.empty()) fail("the haystack text is empty");
  std::vector<std::string> pieces;
  pieces.reserve(haystack_.size());
  char last = 0;  // the last character that is neither white space nor a closing mark
  for (TokenId id : haystack_) {
    pieces.push_back(tokenizer_->token_to_piece(id));
    for (char ch : pieces.back()) {
      if (!is_space(ch) && ch != '"' && ch != '\'' && ch != ')') last = ch;
    }
  }
  sentence_start_.resize(haystack_.size());
  word_start_.resize(haystack_.size());
  bool any_sentence_end = false;
  // `last` now holds the text's end: the token after it is the first, read cyclically.
  for (size_t i = 0; i < haystack_.size(); ++i) {
    const std::string& piece = pieces[i];
    // A word starts with a space, not a line break: a window begins with " word" (which
    // SentencePiece writes as its leading space again when the text is tokenized anew).
    word_start_[i] = !piece.empty() && piece.front() == ' ';
    sentence_start_[i] =
        !piece.empty() && is_space(piece.front()) && (last == '.' || last == '!' || last == '?');
    any_sentence_end = any_sentence_end || sentence_start_[i];
    for (char ch : piece) {
      if (!is_space(ch) && ch != '"' && ch != '\'' && ch != ')') last = ch;
    }
  }
  if (!any_sentence_end)
    fail(
        "the haystack text has no sentence end ('. ', '! ' or '? '): needles go between sentences");

  const tok::Vocab& vocab = tokenizer_->vocab();
  if (c.framing == NeedleFraming::kInstruct) {
    if (!c.render_chat) fail("the instruct framing needs the model's chat template");
    const std::string rendered = c.render_chat(std::string(kMessagePlaceholder));
    const size_t at = rendered.find(kMessagePlaceholder);
    if (at == std::string::npos ||
        rendered.find(kMessagePlaceholder, at + 1) != std::string::npos) {
      fail("the chat template does not show the user message once, verbatim: '{}'", rendered);
    }
    opening_ =
        tokenizer_->encode(rendered.substr(0, at), {.add_special = false, .parse_special = true});
    // As a chat server does: BOS when the vocabulary wants one and the template wrote none.
    if (vocab.add_bos && vocab.bos && (opening_.empty() || opening_.front() != *vocab.bos))
      opening_.insert(opening_.begin(), *vocab.bos);
    closing_ = encode_after_sentence(rendered.substr(at + kMessagePlaceholder.size()), true);
  } else if (vocab.add_bos && vocab.bos) {
    opening_ = {*vocab.bos};
  }

  // The room after `length`: the longest answers, and the chained questions.
  int32_t longest_cue = 0;
  for (std::string_view key : needle_keys())
    longest_cue = std::max(longest_cue, size_of(encode_after_sentence(cue_text(key))));
  const int32_t num_asked = c.task == NeedleTask::kMultiValue   ? c.num_values
                            : c.task == NeedleTask::kMultiQuery ? c.num_queries
                                                                : 1;
  if (c.framing == NeedleFraming::kInstruct) {
    answer_room_ = num_asked * (c.value_max_tokens + kInstructSlackPerValue) + kInstructSlack;
  } else if (num_asked == 1) {
    answer_room_ = c.value_max_tokens + kAnswerSlack;
  } else {
    const std::string separator = c.task == NeedleTask::kMultiValue ? "," : ".";
    const int32_t between = size_of(encode_after_word(separator)) +
                            (c.task == NeedleTask::kMultiQuery ? longest_cue : 0);
    answer_room_ = num_asked * c.value_max_tokens + (num_asked - 1) * between;
  }
}

std::vector<NeedleCase> NeedleCaseMaker::make_cases(int32_t length, int32_t case_idx,
                                                    std::span<const double> depths) const {
  const NeedleTaskConfig& c = config_;
  std::seed_seq seq{static_cast<uint32_t>(c.seed), static_cast<uint32_t>(c.seed >> 32),
                    static_cast<uint32_t>(c.task), static_cast<uint32_t>(length),
                    static_cast<uint32_t>(case_idx)};
  std::mt19937_64 rng(seq);

  // Keys (distinct), then values (distinct), then the needles: the first is the asked one.
  const int32_t num_keys = c.task == NeedleTask::kMultiKey     ? 1 + c.num_distractors
                           : c.task == NeedleTask::kMultiQuery ? c.num_queries
                                                               : 1;
  const int32_t num_needles = c.task == NeedleTask::kMultiValue ? c.num_values : num_keys;
  const std::span<const std::string_view> key_list = needle_keys();
  std::vector<size_t> key_order(key_list.size());
  std::iota(key_order.begin(), key_order.end(), 0);
  for (int32_t i = 0; i < num_keys; ++i) {  // a partial Fisher-Yates shuffle
    std::swap(key_order[static_cast<size_t>(i)],
              key_order[static_cast<size_t>(i) + draw(rng, key_order.size() - i)]);
  }
  const std::span<const std::string_view> words = needle_value_words();
  std::vector<std::string> values;
  std::vector<std::vector<TokenId>> value_tokens;
  for (int attempt = 0; static_cast<int32_t>(values.size()) < num_needles; ++attempt) {
    if (attempt > 1000 * num_needles) {
      fail("cannot make values of {} to {} tokens from the {} list with this tokenizer",
           c.value_min_tokens, c.value_max_tokens,
           c.value_kind == NeedleValueKind::kWords ? "word" : "digit");
    }
    // Words (or 4-digit groups) until " VALUE" is at least a drawn size in the bounds.
    const auto wanted = static_cast<int32_t>(
        c.value_min_tokens + draw(rng, c.value_max_tokens - c.value_min_tokens + 1));
    std::string value;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> drawn;  // no word twice in one value
    while (size_of(tokens) < wanted) {
      if (!value.empty()) value += ' ';
      if (c.value_kind == NeedleValueKind::kWords) {
        uint64_t word = draw(rng, words.size());
        while (std::find(drawn.begin(), drawn.end(), word) != drawn.end())
          word = draw(rng, words.size());
        drawn.push_back(word);
        value += words[word];
      } else {
        value += fmt::format("{:04d}", draw(rng, 10000));
      }
      tokens = encode_after_sentence(" " + value);
    }
    if (size_of(tokens) > c.value_max_tokens ||
        std::find(values.begin(), values.end(), value) != values.end())
      continue;
    values.push_back(std::move(value));
    value_tokens.push_back(std::move(tokens));
  }
  std::vector<PlacedNeedle> needles;
  std::vector<std::vector<TokenId>> needle_tokens;
  for (int32_t i = 0; i < num_needles; ++i) {
    const std::string_view key =
        key_list[key_order[c.task == NeedleTask::kMultiValue ? 0 : static_cast<size_t>(i)]];
    std::vector<TokenId> tokens = encode_after_sentence(cue_text(key));
    append(tokens, value_tokens[static_cast<size_t>(i)]);
    append(tokens, encode_after_word("."));
    needles.push_back({.key = std::string(key),
                       .value = values[static_cast<size_t>(i)],
                       .num_tokens = size_of(tokens)});
    needle_tokens.push_back(std::move(tokens));
  }

  // The first question, which counts in the length wherever it goes.
  std::vector<TokenId> question;
  const std::string& first_key = needles.front().key;
  if (c.framing == NeedleFraming::kInstruct) {
    std::string words_asked;
    if (c.task == NeedleTask::kMultiQuery) {
      std::vector<std::string> keys;
      for (const PlacedNeedle& n : needles) keys.push_back(n.key);
      words_asked = fmt::format("What are the secret codes of {}? Answer with the codes only.",
                                list_of(keys));
    } else if (c.task == NeedleTask::kMultiValue) {
      words_asked = fmt::format("What are all the secret codes of {}? Answer with the codes only.",
                                first_key);
    } else {
      words_asked =
          fmt::format("What is the secret code of {}? Answer with the code only.", first_key);
    }
    question = encode_after_sentence("\n\n" + words_asked);
    append(question, closing_);
  } else if (c.task == NeedleTask::kMultiValue) {
    question = encode_after_sentence(fmt::format(" The secret codes of {} are", first_key));
  } else {
    question = encode_after_sentence(cue_text(first_key));
  }
  int32_t num_fixed = size_of(opening_) + size_of(question);
  for (const PlacedNeedle& n : needles) num_fixed += n.num_tokens;
  const int32_t hay_len = length - num_fixed;
  if (hay_len < 1) {
    fail("a length of {} tokens leaves no haystack: the needles and the question take {}", length,
         num_fixed);
  }

  // The window: it ends at a sentence end and starts at a word, from a seeded place.
  const auto text_len = static_cast<int64_t>(haystack_.size());
  const auto at = [&](int64_t i) {
    return static_cast<size_t>(((i % text_len) + text_len) % text_len);
  };
  const auto seeded = static_cast<int64_t>(draw(rng, static_cast<uint64_t>(text_len)));
  int64_t end = -1;
  for (int64_t e = seeded; e < seeded + text_len && end < 0; ++e) {
    if (sentence_start_[at(e)] && word_start_[at(e - hay_len)]) end = e;
  }
  for (int64_t e = seeded; e < seeded + text_len && end < 0; ++e) {
    if (sentence_start_[at(e)]) end = e;
  }
  const int64_t begin = end - hay_len;
  // Where a needle may go: a sentence end inside the window, or either end of it.
  std::vector<int32_t> slots = {0};
  for (int32_t k = 1; k < hay_len; ++k) {
    if (sentence_start_[at(begin + k)]) slots.push_back(k);
  }
  slots.push_back(hay_len);
  for (size_t i = 1; i < needles.size(); ++i)
    needles[i].haystack_offset = slots[draw(rng, slots.size())];

  // Completion multi-value / multi-query: the answers follow the first question in one
  // forced continuation, with what goes between them: ",", or ". " and the next question.
  const bool chained =
      c.framing == NeedleFraming::kCompletion && num_needles > 1 && c.task != NeedleTask::kMultiKey;
  const std::vector<TokenId> comma = encode_after_word(",");
  const std::vector<TokenId> period = encode_after_word(".");
  const auto chain = [&](const std::vector<PlacedNeedle>& placed, std::span<const size_t> asked,
                         NeedleCase& out) {
    for (size_t n = 0; n < asked.size(); ++n) {
      const size_t i = asked[n];
      if (n > 0 && c.task == NeedleTask::kMultiValue) append(out.forced, comma);
      if (n > 0 && c.task == NeedleTask::kMultiQuery) {
        append(out.forced, period);
        append(out.forced, encode_after_sentence(cue_text(placed[i].key)));
      }
      out.queries.push_back({.key = placed[i].key,
                             .value = placed[i].value,
                             .answer_begin = size_of(out.forced),
                             .answer_end = size_of(out.forced) + size_of(value_tokens[i])});
      append(out.forced, value_tokens[i]);
    }
  };

  std::vector<NeedleCase> cases;
  for (double depth : depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) fail("depth {} is not in [0, 1]", depth);
    const double wanted = depth * hay_len;
    const int32_t slot = *std::min_element(slots.begin(), slots.end(), [&](int32_t a, int32_t b) {
      return std::fabs(a - wanted) < std::fabs(b - wanted);
    });
    NeedleCase out{.length = length,
                   .depth = depth,
                   .needle_depth = static_cast<double>(slot) / hay_len,
                   .case_idx = case_idx,
                   .num_haystack_tokens = hay_len};
    std::vector<size_t> order(needles.size());
    std::iota(order.begin(), order.end(), 0);
    std::vector<PlacedNeedle> placed = needles;
    placed.front().haystack_offset = slot;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return placed[a].haystack_offset < placed[b].haystack_offset;
    });
    std::vector<TokenId> document;
    document.reserve(static_cast<size_t>(length));
    int32_t done = 0;
    for (size_t i : order) {
      for (; done < placed[i].haystack_offset; ++done)
        document.push_back(haystack_[at(begin + done)]);
      append(document, needle_tokens[i]);
      out.needles.push_back(placed[i]);
    }
    for (; done < hay_len; ++done) document.push_back(haystack_[at(begin + done)]);

    out.prompt = opening_;
    append(out.prompt, document);
    if (c.question_in_prompt) {
      append(out.prompt, question);
    } else {
      out.forced = question;
    }
    if (chained) {
      // multi-query asks in the order drawn; multi-value lists the values as the document does.
      std::vector<size_t> asked(needles.size());
      std::iota(asked.begin(), asked.end(), 0);
      chain(placed, c.task == NeedleTask::kMultiValue ? order : asked, out);
      out.scoring = NeedleScoring::kForced;
      out.max_tokens = size_of(out.forced);
    } else if (c.framing == NeedleFraming::kInstruct) {
      const size_t num_asked = c.task == NeedleTask::kMultiKey ? 1 : placed.size();
      for (size_t i = 0; i < num_asked; ++i)
        out.queries.push_back({.key = placed[i].key, .value = placed[i].value});
      out.scoring = NeedleScoring::kContains;
      out.max_tokens =
          size_of(out.forced) + kInstructSlack +
          static_cast<int32_t>(num_asked) * (c.value_max_tokens + kInstructSlackPerValue);
    } else {
      out.queries.push_back({.key = first_key, .value = placed.front().value});
      out.scoring = NeedleScoring::kStartsWith;
      out.max_tokens = size_of(out.forced) + c.value_max_tokens + kAnswerSlack;
    }
    cases.push_back(std::move(out));
  }
  return cases;
}

}  // namespace sieve::eval
