// AnswerTokens on real vocabularies (llama.cpp's reference SPM and BPE files, stories260K): a
// prompt that resends a remembered answer as text keeps the answer's ids, its ids still decode
// to the text, and nothing else is tokenized differently.
#include "server/answer_tokens.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

constexpr tok::EncodeOptions kCompletion{.add_special = true, .parse_special = true};

std::unique_ptr<tok::Tokenizer> load_tokenizer(const std::string& relative) {
  return tok::Tokenizer::create(
      tok::load_vocab(gguf::File::open(sieve::testing::shared_path(relative))));
}

// A tokenization of `text` the tokenizer would not choose: encoded in pieces cut at character
// boundaries every `step` bytes, each a continuation of the last (as a model writes its answer).
std::vector<TokenId> written_in_pieces(const tok::Tokenizer& tokenizer, const std::string& text,
                                       size_t step) {
  std::vector<TokenId> ids;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + step);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    const auto part =
        tokenizer.encode(text.substr(at, end - at),
                         {.add_special = false, .parse_special = false, .continues = true});
    ids.insert(ids.end(), part.begin(), part.end());
    at = end;
  }
  return ids;
}

// The bytes of ids as a part of a longer text (decode() reads them as a whole text: SPM drops
// the space in front of its first piece).
std::string text_of(const tok::Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  std::string text;
  for (TokenId id : ids) text += tokenizer.token_to_piece(id, true);
  return text;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class AnswerTokensOnVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(AnswerTokensOnVocab, AResentAnswerKeepsItsIdsAndTheTextDecodesTheSame) {
  const auto tokenizer = load_tokenizer(GetParam());
  const std::string prompt = "The quick brown fox said:";
  const std::vector<std::string> answers = {
      " jumping over lazy dogs is what I do best, every single morning.",
      " naïve café owners serve crème brûlée — 12,345 of them!",
      "\n\n  indented code(x) { return x*2; }"};
  size_t reshaped = 0;
  for (const std::string& answer_text : answers) {
    for (size_t step : {1, 2, 3, 5}) {
      AnswerTokens answers_kept(*tokenizer, 8);
      const std::vector<TokenId> prompt_ids = answers_kept.encode(prompt, kCompletion);
      ASSERT_EQ(prompt_ids, tokenizer->encode(prompt, kCompletion)) << "nothing remembered yet";
      const std::vector<TokenId> answer = written_in_pieces(*tokenizer, answer_text, step);
      ASSERT_EQ(text_of(*tokenizer, answer), answer_text);
      answers_kept.remember(prompt, prompt_ids, answer, kCompletion);

      const std::string next = prompt + answer_text + " And then? The fox ran.";
      const std::vector<TokenId> ids = answers_kept.encode(next, kCompletion);
      const std::vector<TokenId> kept = concat(prompt_ids, answer);
      ASSERT_GE(ids.size(), kept.size());
      EXPECT_TRUE(std::equal(kept.begin(), kept.end(), ids.begin()))
          << GetParam() << " step " << step << ": the answer's ids are kept";
      EXPECT_EQ(tokenizer->decode(ids), tokenizer->decode(tokenizer->encode(next, kCompletion)))
          << GetParam() << " step " << step;
      const std::vector<TokenId> plain = tokenizer->encode(next, kCompletion);
      reshaped += !std::equal(kept.begin(), kept.end(), plain.begin(),
                              plain.begin() + std::min(plain.size(), kept.size()));
    }
  }
  // The point of it: plain tokenization of the next turn leaves the answer's ids.
  EXPECT_GT(reshaped, 0u) << "every answer re-tokenized to its own ids: the test shows nothing";
}

TEST_P(AnswerTokensOnVocab, APromptThatLeavesTheAnswerKeepsOnlyItsWholeTokensUpToThere) {
  const auto tokenizer = load_tokenizer(GetParam());
  AnswerTokens answers_kept(*tokenizer, 8);
  const std::string prompt = "Q: name three colours.\nA:";
  const std::string answer_text = " red, green and blue";
  const auto prompt_ids = tokenizer->encode(prompt, kCompletion);
  const auto answer = written_in_pieces(*tokenizer, answer_text, 2);
  answers_kept.remember(prompt, prompt_ids, answer, kCompletion);

  // A stop string cut the answer after "green": the client resends only that much.
  const std::string next = prompt + " red, green!";
  const auto ids = answers_kept.encode(next, kCompletion);
  EXPECT_EQ(tokenizer->decode(ids), tokenizer->decode(tokenizer->encode(next, kCompletion)));
  ASSERT_GT(ids.size(), prompt_ids.size());
  EXPECT_TRUE(std::equal(prompt_ids.begin(), prompt_ids.end(), ids.begin()));
  // The first answer token is kept (" r" or " re": two bytes a piece).
  EXPECT_EQ(ids[prompt_ids.size()], answer[0]);

  // Another prompt, and a prompt that only shares the remembered one's beginning, are encoded
  // as the tokenizer would.
  for (const std::string& other : {std::string("Something else entirely."), prompt.substr(0, 10),
                                   std::string("Q: name three animals.\nA: red")}) {
    EXPECT_EQ(answers_kept.encode(other, kCompletion), tokenizer->encode(other, kCompletion))
        << other;
  }
  // Other encoding options never use the entry.
  const tok::EncodeOptions chat{.add_special = false, .parse_special = true};
  EXPECT_EQ(answers_kept.encode(next, chat), tokenizer->encode(next, chat));
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, AnswerTokensOnVocab,
                         ::testing::Values("golden/tokenizer/ggml-vocab-llama-spm.gguf",
                                           "golden/tokenizer/ggml-vocab-gpt-2.gguf",
                                           "golden/tokenizer/ggml-vocab-deepseek-llm.gguf",
                                           "models/stories260K.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name = name.substr(name.rfind('/') + 1);
                           name = name.substr(0, name.find(".gguf"));
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(AnswerTokens, AConversationKeepsOneEntryAndTheOldestGoFirst) {
  const auto tokenizer = load_tokenizer("models/stories260K.gguf");
  AnswerTokens answers_kept(*tokenizer, 2);
  std::string text = "Lily had a ball.";
  for (int turn = 0; turn < 3; ++turn) {
    const auto prompt_ids = answers_kept.encode(text, kCompletion);
    const std::string answer_text = " She played.";
    answers_kept.remember(text, prompt_ids, written_in_pieces(*tokenizer, answer_text, 1),
                          kCompletion);
    EXPECT_EQ(answers_kept.size(), 1u) << "turn " << turn << " supersedes the one before";
    text += answer_text + " Then?";
  }
  for (const char* other : {"Tom ran.", "Sue sat.", "Max hid."}) {
    answers_kept.remember(other, tokenizer->encode(other, kCompletion),
                          tokenizer->encode(" Yes.", {.add_special = false}), kCompletion);
  }
  EXPECT_EQ(answers_kept.size(), 2u);
  const std::string resent = std::string("Tom ran.") + " Yes. No.";
  EXPECT_EQ(answers_kept.encode(resent, kCompletion), tokenizer->encode(resent, kCompletion))
      << "the oldest entry is gone (and this one re-tokenizes the same way anyway)";

  AnswerTokens none(*tokenizer, 0);
  none.remember(text, tokenizer->encode(text, kCompletion), tokenizer->encode(" x"), kCompletion);
  EXPECT_EQ(none.size(), 0u);
}

// A next turn sent again (a retry, or another client of the same conversation) after it was
// answered: its entry superseded the first turn's, and it is still prompted with the first
// answer's ids, as the first time; so is a regenerated answer's resend and the turn after.
TEST(AnswerTokens, ANextTurnSentAgainKeepsTheIdsItHadTheFirstTime) {
  const auto tokenizer = load_tokenizer("models/stories260K.gguf");
  AnswerTokens kept(*tokenizer, 8);
  const std::string prompt = "Lily had a big red ball.";
  const std::string answer_text = " She played with it in the park every day.";
  const auto prompt_ids = kept.encode(prompt, kCompletion);
  const auto answer = written_in_pieces(*tokenizer, answer_text, 1);
  kept.remember(prompt, prompt_ids, answer, kCompletion, answer_text);

  const std::string next = prompt + answer_text + " Then?";
  const auto next_ids = kept.encode(next, kCompletion);
  ASSERT_NE(next_ids, tokenizer->encode(next, kCompletion))
      << "the answer re-tokenizes to its own ids: the test shows nothing";
  const auto next_answer = written_in_pieces(*tokenizer, " They ran home.", 1);
  kept.remember(next, next_ids, next_answer, kCompletion, text_of(*tokenizer, next_answer));
  EXPECT_EQ(kept.size(), 1u) << "the next turn supersedes the first";
  EXPECT_EQ(kept.encode(next, kCompletion), next_ids) << "sent again";
  const std::string retry = next + " Why?";
  const auto retry_ids = kept.encode(retry, kCompletion);
  ASSERT_GE(retry_ids.size(), prompt_ids.size() + answer.size());
  EXPECT_TRUE(std::equal(next_ids.begin(), next_ids.begin() + prompt_ids.size() + answer.size(),
                         retry_ids.begin()))
      << "a longer text that leaves the next turn's answer keeps the first answer's ids";

  // Another answer to the next turn, and the same answer again, keep what the entry kept.
  const auto other_answer = written_in_pieces(*tokenizer, " Max barked.", 2);
  kept.remember(next, next_ids, other_answer, kCompletion, text_of(*tokenizer, other_answer));
  kept.remember(next, next_ids, next_answer, kCompletion, text_of(*tokenizer, next_answer));
  EXPECT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept.encode(next, kCompletion), next_ids);

  // The third turn keeps both answers' ids.
  const std::string third = next + text_of(*tokenizer, next_answer) + " And?";
  const auto third_ids = kept.encode(third, kCompletion);
  const auto both = concat(next_ids, next_answer);
  ASSERT_GE(third_ids.size(), both.size());
  EXPECT_TRUE(std::equal(both.begin(), both.end(), third_ids.begin()));
  EXPECT_EQ(tokenizer->decode(third_ids), tokenizer->decode(tokenizer->encode(third, kCompletion)));

  // A prompt that branches off the first turn before its answer (the user rewrote it) does not
  // supersede the entries it starts like: the first answer, resent later, keeps its ids.
  AnswerTokens branched(*tokenizer, 8);
  branched.remember(prompt, prompt_ids, answer, kCompletion, answer_text);
  const std::string branch = prompt + "\nThen it rained.";  // not the answer's first byte
  branched.remember(branch, branched.encode(branch, kCompletion), next_answer, kCompletion,
                    text_of(*tokenizer, next_answer));
  EXPECT_EQ(branched.size(), 2u);
  EXPECT_EQ(branched.encode(next, kCompletion), next_ids);
}

// Two answers to one prompt, one the start of the other ("  " and "    ", written a space a
// token): a next turn that resends the short one whole, then " The", keeps the short one's ids,
// although the long one's pieces would match one more space (a text the same, ids past the
// answer the client holds: the next turn would not continue that answer's state as it was).
TEST(AnswerTokens, AnAnswerResentWholeBeatsALongerPiecewiseMatchOfAnother) {
  const auto tokenizer = load_tokenizer("models/stories260K.gguf");
  const std::string prompt = "The sun was hot.";
  const auto prompt_ids = tokenizer->encode(prompt, kCompletion);
  const std::vector<TokenId> space =
      tokenizer->encode(" ", {.add_special = false, .continues = true});
  ASSERT_EQ(text_of(*tokenizer, space), " ");
  std::vector<TokenId> short_answer, long_answer;
  for (int i = 0; i < 2; ++i) short_answer = concat(short_answer, space);
  for (int i = 0; i < 4; ++i) long_answer = concat(long_answer, space);
  const std::string short_text = text_of(*tokenizer, short_answer);
  for (const bool short_first : {true, false}) {
    AnswerTokens kept(*tokenizer, 8);
    const auto remember = [&](const std::vector<TokenId>& answer) {
      kept.remember(prompt, prompt_ids, answer, kCompletion, text_of(*tokenizer, answer));
    };
    if (short_first) {
      remember(short_answer);
      remember(long_answer);
    } else {
      remember(long_answer);
      remember(short_answer);
    }
    const std::vector<TokenId> ids = kept.encode(prompt + short_text + " The", kCompletion);
    ASSERT_GE(ids.size(), prompt_ids.size() + short_answer.size() + 1);
    EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + prompt_ids.size() + 2),
              concat(prompt_ids, short_answer))
        << "short first " << short_first;
    const std::vector<TokenId> rest(ids.begin() + prompt_ids.size() + 2, ids.end());
    EXPECT_EQ(rest, tokenizer->encode(" The", {.add_special = false, .continues = true}));
    EXPECT_EQ(kept.size(), 2u) << "two answers to one prompt are both kept";
    remember(short_answer);
    EXPECT_EQ(kept.size(), 2u) << "the same answer again replaces its copy";
  }
}

// Special tokens in an answer: kept where the prompt is read for them (chat templates), and
// there the template's end-of-turn text resends the model's end-of-turn id.
TEST(AnswerTokens, SpecialTokensOfAnAnswerAreKeptOnlyWhereTextIsReadForThem) {
  const auto tokenizer = load_tokenizer("golden/tokenizer/ggml-vocab-llama-spm.gguf");
  const TokenId eos = *tokenizer->vocab().eos;
  const std::string eos_text = tokenizer->token_to_piece(eos, true);
  const tok::EncodeOptions chat{.add_special = false, .parse_special = true};
  const std::string prompt = "[INST] hi [/INST]";
  auto answer = written_in_pieces(*tokenizer, " Hello there", 1);
  answer.push_back(eos);
  AnswerTokens answers_kept(*tokenizer, 4);
  answers_kept.remember(prompt, tokenizer->encode(prompt, chat), answer, chat);
  const std::string next = prompt + " Hello there" + eos_text + "[INST] more [/INST]";
  const auto ids = answers_kept.encode(next, chat);
  const auto kept = concat(tokenizer->encode(prompt, chat), answer);
  ASSERT_GE(ids.size(), kept.size());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), ids.begin())) << "the EOS id is kept too";
  EXPECT_EQ(tokenizer->decode(ids, true), tokenizer->decode(tokenizer->encode(next, chat), true));

  AnswerTokens plain_text(*tokenizer, 4);
  const tok::EncodeOptions literal{.add_special = false, .parse_special = false};
  plain_text.remember(prompt, tokenizer->encode(prompt, literal), answer, literal);
  const auto literal_ids = plain_text.encode(next, literal);
  EXPECT_EQ(std::count(literal_ids.begin(), literal_ids.end(), eos), 0)
      << "text not read for special tokens never becomes one";
}

// An answer whose tokens' bytes do not make characters (a byte token cut off by the next):
// the response carried U+FFFD for them, and the client sends that back. The answer given as the
// response's text is kept whole; without it only the tokens before the byte match.
TEST(AnswerTokens, AnAnswerWithInvalidUtf8IsKeptWholeWhenItsSentTextIsResent) {
  const auto tokenizer = load_tokenizer("golden/tokenizer/ggml-vocab-llama-spm.gguf");
  const auto& texts = tokenizer->vocab().tokens;
  const auto found = std::find(texts.begin(), texts.end(), "<0xE2>");
  ASSERT_NE(found, texts.end());
  const std::optional<TokenId> byte_e2 = static_cast<TokenId>(found - texts.begin());
  const std::string prompt = "Say something:";
  const auto prompt_ids = tokenizer->encode(prompt, kCompletion);
  std::vector<TokenId> answer = written_in_pieces(*tokenizer, " odd", 2);
  const size_t before_byte = answer.size();
  answer.push_back(*byte_e2);
  const auto after = written_in_pieces(*tokenizer, "A word", 2);
  answer.insert(answer.end(), after.begin(), after.end());
  const std::string engine_text = text_of(*tokenizer, answer);  // " odd\xE2A word"
  const std::string sent =
      " odd\xEF\xBF\xBD"
      "A word";  // as JSON carried it
  const std::string next = prompt + sent + " More.";

  AnswerTokens whole(*tokenizer, 4);
  whole.remember(prompt, prompt_ids, answer, kCompletion, engine_text);
  const auto ids = whole.encode(next, kCompletion);
  const auto kept = concat(prompt_ids, answer);
  ASSERT_GE(ids.size(), kept.size());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), ids.begin()));

  AnswerTokens pieces_only(*tokenizer, 4);
  pieces_only.remember(prompt, prompt_ids, answer, kCompletion);
  const auto partial = pieces_only.encode(next, kCompletion);
  const auto kept_partial =
      concat(prompt_ids, std::vector<TokenId>(answer.begin(), answer.begin() + before_byte));
  EXPECT_TRUE(std::equal(kept_partial.begin(), kept_partial.end(), partial.begin()));
  EXPECT_NE(partial[kept_partial.size()], *byte_e2);

  // A sent text the answer's bytes do not make (a stop string cut it) is not trusted whole.
  AnswerTokens cut(*tokenizer, 4);
  cut.remember(prompt, prompt_ids, answer, kCompletion, std::string_view(" odd"));
  const auto cut_ids = cut.encode(prompt + " odd and more", kCompletion);
  EXPECT_EQ(tokenizer->decode(cut_ids),
            tokenizer->decode(tokenizer->encode(prompt + " odd and more", kCompletion)));
}

}  // namespace
}  // namespace sieve::server
