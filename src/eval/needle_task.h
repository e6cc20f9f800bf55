#pragma once
// Needle-in-a-haystack cases (RULER's synthetic retrieval families, from any text, no downloads)
// for `sieve eval --task`.
//
// A needle is the sentence " The secret code of KEY is VALUE." put between two sentences of a
// haystack (after ". ", "! " or "? " and before the next sentence; KEY: one capitalised word,
// VALUE: lowercase words or digit groups, eval/needle_words.h). Tasks:
//   single       one needle, asked for;
//   multi-key    the needle and num_distractors others under other keys; only the first asked;
//   multi-value  num_values needles under one key with different values; all must come back;
//   multi-query  num_queries needles under different keys; all asked, all must come back.
// The needle asked first sits at the cell's depth; the others at seeded sentence ends.
//
// Framings (what the model is asked, and how its answer is read):
//   completion   the question is the needle's own beginning, " The secret code of KEY is"; the
//                model continues greedily. One question (single, multi-key): exact when the
//                generated text, leading white space stripped, starts with VALUE. Several:
//                the questions are chained in one continuation with the true answers forced,
//                multi-query  " The secret code of K1 is V1. The secret code of K2 is V2. ..."
//                multi-value  " The secret codes of KEY are V1, V2, ..." (values in the order
//                             the document gives them)
//                and an answer counts when the model's greedy choice is its token at every one
//                of its tokens: what greedy decoding would write after the right answers before
//                it. The case is exact when every answer counts.
//   instruct     the model's chat template wraps one user message, the document, "\n\n" and the
//                question in words ("What is the secret code of KEY? Answer with the code
//                only."; multi-value: "What are all the secret codes of KEY? ..."; multi-query:
//                "What are the secret codes of K1, K2 and K3? ..."), then its generation prompt;
//                exact when the generated text contains every asked value (ignoring case, as
//                RULER's string match does).
// The question ends the prompt (question_in_prompt: a policy that compresses at prefill sees
// it), or is forced after it (the question comes after the document: after compression).
//
// Length: every token up to the first answer, the question included wherever it goes: BOS (or
// the template's opening), the haystack, the needles, the question (and the template's closing).
// The haystack takes what the rest leaves, exactly. Depth: haystack tokens before the asked
// needle / haystack tokens, the sentence end nearest the requested depth (0 and 1 included).
// Cases with the same (length, case_idx) share their haystack window and needles and differ in
// the asked needle's place only, so their prompts share the prefix up to it (a prefix cache
// reuses it). The window is a seeded stretch of the text's tokens (repeated when the text is
// short) that starts at a word and ends at a sentence end.
//
// Prompts are built from token pieces, each tokenized as it stands after a sentence end (a
// needle, a value, a question), so the counts are exact and the values' tokens are the same in
// needle and answer; with the usual tokenizers (no token spans a sentence end or a word start)
// that is the tokenization of the prompt's text.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sieve::eval {

enum class NeedleTask { kSingle, kMultiKey, kMultiValue, kMultiQuery };
enum class NeedleFraming { kCompletion, kInstruct };
enum class NeedleValueKind { kWords, kDigits };

std::string_view needle_task_name(NeedleTask task);  // "single", "multi-key", ...
std::optional<NeedleTask> parse_needle_task(std::string_view name);
std::string_view needle_framing_name(NeedleFraming framing);  // "completion", "instruct"

// The prompt text of one user message through the model's chat template, generation prompt
// added (what a chat server would render).
using ChatRenderer = std::function<std::string(const std::string& user_message)>;

struct NeedleTaskConfig {
  NeedleTask task = NeedleTask::kSingle;
  NeedleFraming framing = NeedleFraming::kCompletion;
  bool question_in_prompt = true;
  NeedleValueKind value_kind = NeedleValueKind::kWords;
  int32_t value_min_tokens = 6;  // tokens of " VALUE" in the model's tokenizer
  int32_t value_max_tokens = 10;
  int32_t num_distractors = 3;  // multi-key
  int32_t num_values = 4;       // multi-value
  int32_t num_queries = 4;      // multi-query
  uint64_t seed = 1;
  ChatRenderer render_chat;  // instruct
};

enum class NeedleScoring {
  kStartsWith,  // completion, one question: generated text starts with the value
  kForced,      // completion, chained questions: greedy choice == every forced answer token
  kContains,    // instruct: generated text contains every asked value, ignoring case
};

struct NeedleQuery {
  std::string key;
  std::string value;  // what must come back
  // kForced: this answer's tokens are NeedleCase::forced[answer_begin, answer_end).
  int32_t answer_begin = 0;
  int32_t answer_end = 0;
};

struct PlacedNeedle {
  std::string key;
  std::string value;
  int32_t haystack_offset = 0;  // haystack tokens before it
  int32_t num_tokens = 0;
};

struct NeedleCase {
  int32_t length = 0;
  double depth = 0.0;         // requested
  double needle_depth = 0.0;  // the asked needle's: haystack tokens before it / haystack tokens
  int32_t case_idx = 0;       // within its (length, depth) cell
  int32_t num_haystack_tokens = 0;
  std::vector<PlacedNeedle> needles;  // in document order
  std::vector<NeedleQuery> queries;   // in the order asked
  NeedleScoring scoring = NeedleScoring::kStartsWith;
  std::vector<tok::TokenId> prompt;
  std::vector<tok::TokenId> forced;  // the question when it comes after the prompt, chained ones
  int32_t max_tokens = 0;            // outputs, the forced ones included
};

class NeedleCaseMaker {
 public:
  // Tokenizes the haystack once. Throws sieve::Error for a config it cannot serve: value token
  // bounds the word lists cannot meet, counts out of range, instruct without render_chat or
  // with a template that does not show the user message verbatim, a text with no sentence end.
  NeedleCaseMaker(std::shared_ptr<const tok::Tokenizer> tokenizer, std::string_view haystack,
                  NeedleTaskConfig config);

  const NeedleTaskConfig& config() const { return config_; }
  // Positions a case may take after its `length` tokens at most (answers, chained questions,
  // room to write them): length + answer_room() must fit the model's context.
  int32_t answer_room() const { return answer_room_; }
  // The cases of one (length, case_idx): one per depth (fractions in [0, 1]), in that order.
  // Throws sieve::Error when `length` leaves no haystack beside the needles and question.
  std::vector<NeedleCase> make_cases(int32_t length, int32_t case_idx,
                                     std::span<const double> depths) const;

  // Tokens of `text` as they stand after a sentence end, e.g. a needle " The secret code ...".
  std::vector<tok::TokenId> encode_after_sentence(std::string_view text,
                                                  bool parse_special = false) const;
  // Tokens of `text` right after a word, e.g. the "." that ends a value.
  std::vector<tok::TokenId> encode_after_word(std::string_view text) const;

 private:
  std::vector<tok::TokenId> encode_after(std::string_view before,
                                         const std::vector<tok::TokenId>& before_tokens,
                                         std::string_view text, bool parse_special) const;

  std::shared_ptr<const tok::Tokenizer> tokenizer_;
  NeedleTaskConfig config_;
  std::vector<tok::TokenId> haystack_;     // the text's tokens, read cyclically
  std::vector<bool> sentence_start_;       // per token: a sentence ended before it (". " ...)
  std::vector<bool> word_start_;           // per token: its piece starts with a space
  std::vector<tok::TokenId> anchor_;       // the tokens of "." (see encode_after_sentence)
  std::vector<tok::TokenId> word_anchor_;  // the tokens of a word (see encode_after_word)
  std::vector<tok::TokenId> opening_;      // BOS, or the chat template up to the user message
  std::vector<tok::TokenId> closing_;      // instruct: the template after the user message
  int32_t answer_room_ = 0;
};

}  // namespace sieve::eval
