// The needle-in-a-haystack generator (eval/needle_task.h) on copy-lm's tokenizer and held-out
// text: deterministic per seed, exact lengths, needles between sentences at the requested
// depth, distinct keys, values within their token bounds, forced answers where they say.
#include "eval/needle_task.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "eval/needle_words.h"
#include "model/loader.h"
#include "server/chat_template.h"
#include "copy_lm_fixture.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve::eval {
namespace {

class NeedleTaskTest : public CopyLmTest {
 protected:
  static NeedleCaseMaker maker(NeedleTaskConfig config) {
    return NeedleCaseMaker(loaded_->tokenizer, *text_, std::move(config));
  }
  static const tok::Tokenizer& tokenizer() { return *loaded_->tokenizer; }

  // Tokens of the question that count in the length but come after the prompt.
  static size_t question_after_prompt(const NeedleCase& c) {
    if (c.scoring == NeedleScoring::kForced) return static_cast<size_t>(c.queries[0].answer_begin);
    return c.forced.size();
  }
};

constexpr NeedleTask kTasks[] = {NeedleTask::kSingle, NeedleTask::kMultiKey,
                                 NeedleTask::kMultiValue, NeedleTask::kMultiQuery};
const std::vector<double> kDepths = {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};

ChatRenderer chatml() {
  auto chat_template = std::make_shared<const server::ChatTemplate>(
      server::ChatTemplate::parse(server::chatml_template()));
  return [chat_template](const std::string& message) {
    return chat_template->render(nlohmann::json{
        {"messages", {{{"role", "user"}, {"content", message}}}}, {"add_generation_prompt", true}});
  };
}

TEST_F(NeedleTaskTest, SameSeedSameCasesOtherSeedOtherCases) {
  for (NeedleTask task : kTasks) {
    const NeedleCaseMaker a = maker({.task = task, .seed = 7});
    const NeedleCaseMaker b = maker({.task = task, .seed = 7});
    const NeedleCaseMaker other = maker({.task = task, .seed = 8});
    const std::vector<NeedleCase> x = a.make_cases(300, 1, kDepths);
    const std::vector<NeedleCase> y = b.make_cases(300, 1, kDepths);
    const std::vector<NeedleCase> z = other.make_cases(300, 1, kDepths);
    ASSERT_EQ(x.size(), kDepths.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].prompt, y[i].prompt) << needle_task_name(task);
      EXPECT_EQ(x[i].forced, y[i].forced);
      EXPECT_EQ(x[i].needles.front().value, y[i].needles.front().value);
      EXPECT_NE(x[i].prompt, z[i].prompt) << needle_task_name(task);
    }
    // Another case of the same cell is another haystack and another needle.
    EXPECT_NE(a.make_cases(300, 2, kDepths)[0].prompt, x[0].prompt);
  }
}

TEST_F(NeedleTaskTest, LengthsAreExactInEveryTaskFramingAndPlace) {
  for (NeedleTask task : kTasks) {
    for (NeedleFraming framing : {NeedleFraming::kCompletion, NeedleFraming::kInstruct}) {
      for (bool in_prompt : {true, false}) {
        const NeedleCaseMaker m = maker({.task = task,
                                         .framing = framing,
                                         .question_in_prompt = in_prompt,
                                         .render_chat = chatml()});
        for (int32_t length : {300, 517, 1000}) {
          for (const NeedleCase& c : m.make_cases(length, 0, kDepths)) {
            EXPECT_EQ(c.prompt.size() + question_after_prompt(c), static_cast<size_t>(length))
                << needle_task_name(task) << " " << needle_framing_name(framing) << " "
                << in_prompt;
            EXPECT_EQ(in_prompt, question_after_prompt(c) == 0);
            EXPECT_LE(static_cast<int32_t>(c.forced.size()) -
                          static_cast<int32_t>(question_after_prompt(c)),
                      m.answer_room());
            EXPECT_GE(c.max_tokens, static_cast<int32_t>(c.forced.size()));
            EXPECT_LE(c.max_tokens - static_cast<int32_t>(question_after_prompt(c)),
                      m.answer_room())
                << "the answer fits the room the context check counts on";
          }
        }
      }
    }
  }
}

// Completion framing, question in the prompt: the prompt is its text's own tokenization (BOS
// first), so `sieve run` / `sieve batch` given that text compute the same tokens.
TEST_F(NeedleTaskTest, CompletionPromptsAreTheTokenizationOfTheirText) {
  for (NeedleTask task : kTasks) {
    const NeedleCaseMaker m = maker({.task = task});
    for (int32_t length : {256, 777}) {
      for (int32_t case_idx = 0; case_idx < 4; ++case_idx) {
        for (const NeedleCase& c : m.make_cases(length, case_idx, kDepths)) {
          const std::string text = tokenizer().decode(c.prompt);
          EXPECT_EQ(tokenizer().encode(text), c.prompt) << text;
        }
      }
    }
  }
}

TEST_F(NeedleTaskTest, NeedlesSitBetweenSentencesAtTheRequestedDepth) {
  const NeedleCaseMaker m = maker({.task = NeedleTask::kSingle});
  for (int32_t case_idx = 0; case_idx < 4; ++case_idx) {
    const std::vector<NeedleCase> cases = m.make_cases(600, case_idx, kDepths);
    for (const NeedleCase& c : cases) {
      ASSERT_EQ(c.needles.size(), 1u);
      const PlacedNeedle& needle = c.needles[0];
      EXPECT_EQ(needle.haystack_offset, std::lround(c.needle_depth * c.num_haystack_tokens));
      // TinyStories sentences are short: the nearest sentence end is close to the depth asked.
      EXPECT_NEAR(c.needle_depth, c.depth, 0.08) << c.depth;
      if (c.depth == 0.0 || c.depth == 1.0) {
        EXPECT_EQ(c.needle_depth, c.depth);
      }
      // (Decoding drops the space of the text's first word.)
      const std::string sentence =
          fmt::format("{}The secret code of {} is {}.", needle.haystack_offset > 0 ? " " : "",
                      needle.key, needle.value);
      const std::string text = tokenizer().decode(c.prompt);
      const size_t at = text.find(sentence);
      ASSERT_NE(at, std::string::npos) << text;
      EXPECT_EQ(text.find(sentence, at + 1), std::string::npos) << "one needle";
      // Before it: the start of the document or a sentence's end; after it: the next one (or
      // the question).
      const std::string before = text.substr(0, at);
      const size_t last = before.find_last_not_of(" \n\"')");
      if (needle.haystack_offset > 0) {
        ASSERT_NE(last, std::string::npos);
        EXPECT_NE(std::string(".!?").find(before[last]), std::string::npos) << before;
      }
      const std::string after = text.substr(at + sentence.size());
      ASSERT_FALSE(after.empty());
      EXPECT_TRUE(after[0] == ' ' || after[0] == '\n') << after.substr(0, 40);
      // The question ends the prompt, right after a sentence.
      const std::string cue = fmt::format(". The secret code of {} is", needle.key);
      EXPECT_EQ(text.substr(text.size() - cue.size()), cue);
      EXPECT_EQ(c.queries.size(), 1u);
      EXPECT_EQ(c.queries[0].value, needle.value);
    }
    // One haystack per (length, case): the cases share their prompt up to the needle.
    for (const NeedleCase& c : cases) {
      const auto shared = static_cast<size_t>(
          1 + std::min(c.needles[0].haystack_offset, cases[0].needles[0].haystack_offset));
      EXPECT_TRUE(std::equal(c.prompt.begin(), c.prompt.begin() + static_cast<ptrdiff_t>(shared),
                             cases.back().prompt.begin()));
    }
  }
}

TEST_F(NeedleTaskTest, KeysDistinctValuesWithinTokenBounds) {
  for (NeedleTask task : kTasks) {
    for (NeedleValueKind kind : {NeedleValueKind::kWords, NeedleValueKind::kDigits}) {
      const NeedleCaseMaker m = maker({.task = task,
                                       .value_kind = kind,
                                       .value_min_tokens = 5,
                                       .value_max_tokens = 9,
                                       .num_distractors = 3,
                                       .num_values = 3,
                                       .num_queries = 5});
      for (int32_t case_idx = 0; case_idx < 6; ++case_idx) {
        const NeedleCase c = m.make_cases(700, case_idx, std::vector<double>{0.5})[0];
        std::set<std::string> keys, values;
        for (const PlacedNeedle& n : c.needles) {
          keys.insert(n.key);
          values.insert(n.value);
          const size_t tokens = m.encode_after_sentence(" " + n.value).size();
          EXPECT_GE(tokens, 5u) << n.value;
          EXPECT_LE(tokens, 9u) << n.value;
          for (char ch : n.value) {
            if (kind == NeedleValueKind::kDigits)
              EXPECT_TRUE(std::isdigit(ch) || ch == ' ');
            else
              EXPECT_TRUE(std::islower(ch) || ch == ' ');
          }
          const auto& list = needle_keys();
          EXPECT_NE(std::find(list.begin(), list.end(), n.key), list.end());
        }
        EXPECT_EQ(values.size(), c.needles.size()) << "values differ";
        switch (task) {
          case NeedleTask::kSingle:
            EXPECT_EQ(c.needles.size(), 1u);
            break;
          case NeedleTask::kMultiKey:
            EXPECT_EQ(c.needles.size(), 4u);
            EXPECT_EQ(keys.size(), 4u);
            EXPECT_EQ(c.queries.size(), 1u) << "only the first key is asked";
            break;
          case NeedleTask::kMultiValue:
            EXPECT_EQ(c.needles.size(), 3u);
            EXPECT_EQ(keys.size(), 1u);
            EXPECT_EQ(c.queries.size(), 3u) << "every value is asked for";
            break;
          case NeedleTask::kMultiQuery:
            EXPECT_EQ(c.needles.size(), 5u);
            EXPECT_EQ(keys.size(), 5u);
            EXPECT_EQ(c.queries.size(), 5u);
            break;
        }
      }
    }
  }
}

// Completion multi-query / multi-value: the forced continuation chains questions and true
// answers; each answer's range holds its value's tokens.
TEST_F(NeedleTaskTest, ChainedAnswersAreForcedWhereTheQueriesSay) {
  for (NeedleTask task : {NeedleTask::kMultiValue, NeedleTask::kMultiQuery}) {
    for (bool in_prompt : {true, false}) {
      const NeedleCaseMaker m =
          maker({.task = task, .question_in_prompt = in_prompt, .num_values = 3, .num_queries = 3});
      const NeedleCase c = m.make_cases(400, 0, std::vector<double>{0.3})[0];
      ASSERT_EQ(c.scoring, NeedleScoring::kForced);
      ASSERT_EQ(c.queries.size(), 3u);
      EXPECT_EQ(c.max_tokens, static_cast<int32_t>(c.forced.size()));
      std::string chain;
      for (size_t i = 0; i < c.queries.size(); ++i) {
        const NeedleQuery& q = c.queries[i];
        const std::vector<tok::TokenId> answer(c.forced.begin() + q.answer_begin,
                                               c.forced.begin() + q.answer_end);
        EXPECT_EQ(answer, m.encode_after_sentence(" " + q.value));
      }
      const std::string forced = tokenizer().decode(c.forced);
      const std::string key = c.queries[0].key;
      if (task == NeedleTask::kMultiValue) {
        // In the order the document gives the values.
        for (size_t i = 0; i < 3; ++i) EXPECT_EQ(c.queries[i].value, c.needles[i].value);
        const std::string want =
            fmt::format("{}, {}, {}", c.queries[0].value, c.queries[1].value, c.queries[2].value);
        EXPECT_NE(forced.find(want), std::string::npos) << forced;
        const std::string text = tokenizer().decode(c.prompt) + " " + forced;
        EXPECT_NE(text.find(fmt::format("The secret codes of {} are", key)), std::string::npos);
      } else {
        const std::string want = fmt::format("{}. The secret code of {} is {}", c.queries[0].value,
                                             c.queries[1].key, c.queries[1].value);
        EXPECT_NE(forced.find(want), std::string::npos) << forced;
      }
    }
  }
}

TEST_F(NeedleTaskTest, InstructPromptsGoThroughTheChatTemplate) {
  const NeedleCaseMaker m = maker({.task = NeedleTask::kMultiQuery,
                                   .framing = NeedleFraming::kInstruct,
                                   .num_queries = 3,
                                   .render_chat = chatml()});
  const NeedleCase c = m.make_cases(500, 0, std::vector<double>{0.5})[0];
  EXPECT_EQ(c.scoring, NeedleScoring::kContains);
  const std::string text = tokenizer().decode(c.prompt);
  EXPECT_EQ(text.rfind("<|im_start|>user\n", 0), 0u) << text.substr(0, 40);
  const std::string question =
      fmt::format("\n\nWhat are the secret codes of {}, {} and {}? Answer with the codes only.",
                  c.queries[0].key, c.queries[1].key, c.queries[2].key);
  const std::string ending = question + "<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_GE(text.size(), ending.size());
  EXPECT_EQ(text.substr(text.size() - ending.size()), ending);

  EXPECT_THROW(maker({.framing = NeedleFraming::kInstruct}), Error) << "no chat template";
  EXPECT_THROW(maker({.framing = NeedleFraming::kInstruct,
                      .render_chat = [](const std::string&) { return std::string("fixed"); }}),
               Error)
      << "a template that drops the message";
}

TEST_F(NeedleTaskTest, BadConfigurationsAndLengthsAreRefused) {
  EXPECT_THROW(maker({.value_min_tokens = 8, .value_max_tokens = 7}), Error);
  EXPECT_THROW(maker({.value_min_tokens = 1, .value_max_tokens = 1}).make_cases(300, 0, kDepths),
               Error)
      << "no word list value is one token";
  EXPECT_THROW(maker({.num_values = 1}), Error);
  EXPECT_THROW(maker({.task = NeedleTask::kMultiQuery}).make_cases(40, 0, kDepths), Error)
      << "too short for the needles";
  EXPECT_THROW(maker({}).make_cases(300, 0, std::vector<double>{1.5}), Error);
  EXPECT_THROW(NeedleCaseMaker(loaded_->tokenizer, "no sentence ends here at all", {}), Error);
}

// A text shorter than the prompt is repeated.
TEST_F(NeedleTaskTest, AShortTextIsRepeated) {
  const NeedleCaseMaker m(loaded_->tokenizer, "The cat sat. The dog ran. A bird sang. ", {});
  const NeedleCase c = m.make_cases(300, 0, std::vector<double>{0.5})[0];
  EXPECT_EQ(c.prompt.size(), 300u);
  EXPECT_NE(tokenizer().decode(c.prompt).find("The dog ran. A bird sang."), std::string::npos);
}

}  // namespace
}  // namespace sieve::eval
