// sieve eval --task's grid on copy-lm (context 1024): lengths beyond the context are refused
// before any work, the cells add up, dense is its own reference and reuses its prefixes, the
// same seed gives the same results, and a forced answer counts exactly when greedy decoding
// writes it.
#include "eval/long_context_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/engine.h"
#include "eval/eval_requests.h"
#include "model/loader.h"
#include "server/chat_template.h"
#include "copy_lm_fixture.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve::eval {
namespace {

class LongContextEvalTest : public CopyLmTest {
 protected:
  static LongContextRun run(const LongContextConfig& config,
                            const std::function<void(const NeedleResult&)>& on_result = {}) {
    return run_long_context_eval(loaded_->model, loaded_->tokenizer, *text_, config, on_result);
  }
};

TEST_F(LongContextEvalTest, LengthsBeyondTheContextAreRefusedBeforeAnyWork) {
  ASSERT_EQ(loaded_->model->config().context_length, 1024);
  int settings_run = 0;
  const LongContextConfig config{.lengths = {256, 1020}, .families = {"snapkv"}};
  try {
    run(config, [&](const NeedleResult&) { ++settings_run; });
    ADD_FAILURE() << "1020 tokens and the answer do not fit 1024 positions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context of 1024"), std::string::npos) << e.what();
  }
  EXPECT_EQ(settings_run, 0);
  EXPECT_THROW(run({.lengths = {256}, .families = {"nonsense"}}), Error);
  EXPECT_THROW(run({.lengths = {256}, .depths = {0.5, 2.0}}), Error);
}

TEST(LongContextDefaults, LengthsFollowTheContextAndCasesTheLength) {
  EXPECT_EQ(default_needle_lengths(1024, 14), (std::vector<int32_t>{256, 512, 1008}));
  EXPECT_EQ(default_needle_lengths(32768, 30), (std::vector<int32_t>{8192, 16384, 32736}));
  EXPECT_EQ(default_cases_per_cell(8192), 4);
  EXPECT_EQ(default_cases_per_cell(16384), 2);
}

TEST_F(LongContextEvalTest, CellsAddUpAndTheSameSeedGivesTheSameResults) {
  const LongContextConfig config{.lengths = {128, 320},
                                 .depths = {0.0, 0.5, 1.0},
                                 .cases_per_cell = 3,
                                 .families = {"streaming"},
                                 .budgets = {0.125}};
  const LongContextRun first = run(config);
  ASSERT_EQ(first.case_sets.size(), 1u);
  const std::vector<NeedleCase>& cases = first.case_sets[0].cases;
  ASSERT_EQ(cases.size(), 2u * 3 * 3);
  ASSERT_EQ(first.results.size(), 2u);
  const NeedleResult& dense = first.results[0];
  const NeedleResult& window = first.results[1];
  EXPECT_EQ(dense.setting.family, "full");
  EXPECT_EQ(window.spec, "streaming:S=4,W=12");
  for (const NeedleResult& r : first.results) {
    ASSERT_EQ(r.cells.size(), 6u);
    ASSERT_EQ(r.outcomes.size(), cases.size());
    int32_t exact = 0;
    for (const NeedleCell& cell : r.cells) {
      EXPECT_EQ(cell.num_cases, 3);
      exact += cell.num_exact;
    }
    EXPECT_DOUBLE_EQ(r.accuracy, exact / 18.0);
    for (size_t i = 0; i < cases.size(); ++i) {
      // Exact means: the generated text, leading white space stripped, starts with the value.
      const NeedleOutcome& o = r.outcomes[i];
      const std::string text =
          o.answer.substr(std::min(o.answer.find_first_not_of(" \n"), o.answer.size()));
      EXPECT_EQ(o.exact, text.starts_with(cases[i].queries[0].value)) << o.answer;
      EXPECT_EQ(loaded_->tokenizer->decode(o.answer_tokens), o.answer);
    }
  }
  if (dense.accuracy > 0) {
    EXPECT_DOUBLE_EQ(*dense.accuracy_vs_dense, 1.0);
  }
  EXPECT_GT(dense.cached_prompt_tokens, 0) << "cases of one haystack share their prefix";
  EXPECT_EQ(window.cached_prompt_tokens, 0) << "compressed once: its pages stay its own";
  EXPECT_LT(window.kv_kept, 0.5);
  EXPECT_DOUBLE_EQ(dense.kv_kept, 1.0);

  const LongContextRun again = run(config);
  for (size_t r = 0; r < first.results.size(); ++r) {
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(again.results[r].outcomes[i].answer_tokens,
                first.results[r].outcomes[i].answer_tokens);
  }
}

// The chained questions of multi-query are read by forcing the true answers: an answer counts
// exactly when greedy decoding from the same point writes its tokens. The first question ends
// the prompt, so its answer can be generated too, and both ways must agree.
TEST_F(LongContextEvalTest, AForcedAnswerCountsWhenGreedyDecodingWritesIt) {
  const LongContextConfig config{.tasks = {NeedleTask::kMultiQuery},
                                 .needles = {.num_queries = 3},
                                 .lengths = {200, 400},
                                 .depths = {0.0, 0.4, 0.8},
                                 .cases_per_cell = 3,
                                 .families = {}};
  const LongContextRun lc = run(config);
  const std::vector<NeedleCase>& cases = lc.case_sets[0].cases;
  ASSERT_EQ(lc.results.size(), 1u);
  const NeedleResult& dense = lc.results[0];
  EXPECT_GT(dense.query_accuracy, 0.0) << "copy-lm copies some";
  std::vector<EvalRequest> requests;
  for (const NeedleCase& c : cases) {
    ASSERT_EQ(c.scoring, NeedleScoring::kForced);
    ASSERT_EQ(c.queries[0].answer_begin, 0);
    requests.push_back({.prompt = c.prompt,
                        .max_tokens = c.queries[0].answer_end,
                        .policy = "full",
                        .ignore_eos = true});
  }
  engine::Engine engine({.num_kv_pages = 1024, .enable_prefix_caching = false}, loaded_->model,
                        loaded_->tokenizer);
  const std::vector<EvalOutput> greedy = run_eval_requests(engine, requests);
  int32_t agree = 0, first_exact = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const NeedleQuery& q = cases[i].queries[0];
    const bool generated = std::equal(greedy[i].tokens.begin(), greedy[i].tokens.end(),
                                      cases[i].forced.begin() + q.answer_begin,
                                      cases[i].forced.begin() + q.answer_end);
    const std::vector<tok::TokenId>& chosen = dense.outcomes[i].answer_tokens;
    const bool forced_exact =
        std::equal(chosen.begin(), chosen.begin() + (q.answer_end - q.answer_begin),
                   cases[i].forced.begin() + q.answer_begin);
    agree += generated == forced_exact;
    first_exact += forced_exact;
  }
  EXPECT_EQ(agree, static_cast<int32_t>(cases.size()));
  EXPECT_GT(first_exact, 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const NeedleOutcome& o = dense.outcomes[i];
    EXPECT_EQ(o.exact, o.num_queries_exact == 3);
  }
}

TEST_F(LongContextEvalTest, EveryTaskRunsInBothFramingsAndPlaces) {
  auto chat_template = std::make_shared<const server::ChatTemplate>(
      server::ChatTemplate::parse(server::chatml_template()));
  const ChatRenderer chatml = [chat_template](const std::string& message) {
    return chat_template->render(nlohmann::json{
        {"messages", {{{"role", "user"}, {"content", message}}}}, {"add_generation_prompt", true}});
  };
  for (NeedleFraming framing : {NeedleFraming::kCompletion, NeedleFraming::kInstruct}) {
    for (bool in_prompt : {true, false}) {
      const LongContextConfig config{.tasks = {NeedleTask::kSingle, NeedleTask::kMultiKey,
                                               NeedleTask::kMultiValue, NeedleTask::kMultiQuery},
                                     .needles = {.framing = framing,
                                                 .question_in_prompt = in_prompt,
                                                 .num_values = 2,
                                                 .num_queries = 2,
                                                 .render_chat = chatml},
                                     .lengths = {300},
                                     .depths = {0.5},
                                     .cases_per_cell = 2,
                                     .families = {"snapkv"},
                                     .budgets = {0.25}};
      const LongContextRun lc = run(config);
      ASSERT_EQ(lc.results.size(), 8u) << "dense and snapkv per task";
      for (const NeedleResult& r : lc.results) {
        EXPECT_GE(r.accuracy, 0.0);
        EXPECT_LE(r.accuracy, r.query_accuracy + 1e-12) << "all of a case's answers, or none";
        EXPECT_LE(r.query_accuracy, 1.0);
        for (const NeedleOutcome& o : r.outcomes) EXPECT_FALSE(o.answer_tokens.empty());
      }
    }
  }
}

}  // namespace
}  // namespace sieve::eval
