// sieve eval's fidelity harness on stories260K: the dense baseline agrees with itself, a budget
// above the prompt keeps everything and agrees exactly, and real budgets keep fewer pages.
#include "eval/sparsity_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "model/loader.h"
#include "shared_data.h"

namespace sieve::eval {
namespace {

std::string shared_text(const std::string& path) {
  std::ifstream in(sieve::testing::shared_path(path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SparsityEval, DenseAgreesWithItselfAndBudgetsKeepLess) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/stories260K.gguf"), ""});
  const std::string text = shared_text("golden/stories260K/tinystories_valid.txt");
  SparsityEvalConfig config{.families = {"snapkv", "streaming"},
                            .budgets = {2.0, 0.25},
                            .num_prompts = 2,
                            .prompt_tokens = 96,
                            .continuation_tokens = 8};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 5u);
  const PolicyFidelity& dense = results[0];
  EXPECT_EQ(dense.family, "full");
  EXPECT_DOUBLE_EQ(dense.kv_kept, 1.0);
  EXPECT_DOUBLE_EQ(dense.top1_agreement, 1.0);
  EXPECT_NEAR(dense.mean_kl, 0.0, 1e-9);
  EXPECT_GT(dense.perplexity, 1.0);
  for (const PolicyFidelity& r : results) {
    EXPECT_GE(r.mean_kl, -1e-6) << r.spec;  // float logprobs: equal distributions give |KL| ~ 1e-8
    EXPECT_GE(r.top1_agreement, 0.0);
    EXPECT_LE(r.top1_agreement, 1.0);
    EXPECT_GE(r.retrieval, 0.0);
    EXPECT_LE(r.retrieval, 1.0);
    if (r.budget >= 1.0) {  // keeps every prompt token: the dense distributions exactly
      EXPECT_DOUBLE_EQ(r.top1_agreement, 1.0) << r.spec;
      EXPECT_NEAR(r.mean_kl, 0.0, 1e-6) << r.spec;
      EXPECT_NEAR(r.perplexity, dense.perplexity, 1e-6 * dense.perplexity) << r.spec;
    } else {
      EXPECT_LT(r.kv_kept, 0.6) << r.spec;
    }
  }
  const std::string svg = fidelity_svg(results, "test");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("snapkv"), std::string::npos);
}

// copy-lm copies a span from the start of its prompt when given the span's first tokens: dense
// retrieval is high, a window that drops the span loses it, and the interval is over the cases.
TEST(SparsityEval, RetrievalOnACopyingModelWithAnInterval) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const std::string text = shared_text("models/copy/heldout.txt");
  SparsityEvalConfig config{.families = {"streaming"},
                            .budgets = {0.125},
                            .num_prompts = 1,
                            .prompt_tokens = 256,
                            .continuation_tokens = 8,
                            .retrieval_prompts = 40};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 2u);
  const PolicyFidelity& dense = results[0];
  const PolicyFidelity& window = results[1];
  EXPECT_GT(dense.retrieval, 0.6);
  EXPECT_GT(dense.retrieval_ci95, 0.0);
  EXPECT_LT(dense.retrieval_ci95, 0.2);
  EXPECT_DOUBLE_EQ(dense.retrieval_vs_dense, 1.0);
  EXPECT_LT(window.retrieval, 0.3) << "a sink + window cache no longer holds the span";
  EXPECT_NEAR(window.retrieval_vs_dense, window.retrieval / dense.retrieval, 1e-9);
  // The same seed draws the same cases; another seed, other ones.
  const std::vector<PolicyFidelity> again =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  EXPECT_DOUBLE_EQ(again[0].retrieval, dense.retrieval);
  config.seed = 2;
  const std::vector<PolicyFidelity> other =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  EXPECT_NE(other[0].retrieval, dense.retrieval);
}

// With the question (the cue) at the prompt's end, SnapKV's observation window sees it before
// evicting; the cue attends where the span's rest starts, and G keeps what follows. With the
// cue after compression no evicting policy can know the span.
TEST(SparsityEval, RetrievalWithTheQuestionInThePrompt) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const std::string text = shared_text("models/copy/heldout.txt");
  SparsityEvalConfig config{.families = {"snapkv", "snapkv:G=11"},
                            .budgets = {0.125},
                            .num_prompts = 1,
                            .prompt_tokens = 256,
                            .continuation_tokens = 8,
                            .retrieval_prompts = 40,
                            .retrieval_cue_in_prompt = true};
  const std::vector<PolicyFidelity> in_prompt =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(in_prompt.size(), 3u);
  EXPECT_EQ(in_prompt[2].spec, "snapkv:B=24,W=8,G=11");
  EXPECT_GT(in_prompt[0].retrieval, 0.6);
  EXPECT_LT(in_prompt[2].kv_kept, 0.25) << "it frees pages";
  EXPECT_GT(in_prompt[2].retrieval, 0.5);
  EXPECT_GT(in_prompt[2].retrieval, in_prompt[1].retrieval + 0.2) << "G keeps the span's rest";
  config.retrieval_cue_in_prompt = false;
  const std::vector<PolicyFidelity> after =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  EXPECT_GT(after[0].retrieval, 0.6);
  EXPECT_LT(after[1].retrieval, 0.3);
  EXPECT_LT(after[2].retrieval, 0.3) << "evicted before the question: nothing to follow";
}

// "full" takes no budget: asking for it gives the dense row once, not once per budget.
TEST(SparsityEval, FullIsOneRowWhateverTheBudgets) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/stories260K.gguf"), ""});
  const std::string text = shared_text("golden/stories260K/tinystories_valid.txt");
  const SparsityEvalConfig config{.families = {"full", "streaming"},
                                  .budgets = {0.5, 0.25},
                                  .num_prompts = 1,
                                  .prompt_tokens = 64,
                                  .continuation_tokens = 4,
                                  .retrieval_prompts = 0};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 3u) << "dense once, then streaming at each budget";
  EXPECT_EQ(results[0].family, "full");
  EXPECT_EQ(results[1].family, "streaming");
  EXPECT_EQ(results[2].family, "streaming");
}

TEST(SparsityEval, FastGenRunsAtThresholdsInsteadOfBudgets) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/stories260K.gguf"), ""});
  const std::string text = shared_text("golden/stories260K/tinystories_valid.txt");
  SparsityEvalConfig config{.families = {"fastgen"},
                            .budgets = {0.25},
                            .fastgen_thresholds = {0.0, 0.5},
                            .num_prompts = 2,
                            .prompt_tokens = 96,
                            .continuation_tokens = 8};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 3u) << "the dense baseline and one row per threshold";
  const PolicyFidelity& dense = results[0];
  const PolicyFidelity& all = results[1];
  const PolicyFidelity& loose = results[2];
  EXPECT_EQ(all.spec, "fastgen:T=0,W=16,F=0.1");
  EXPECT_DOUBLE_EQ(all.kv_kept, 1.0) << "T = 0: every head keeps everything";
  EXPECT_DOUBLE_EQ(all.top1_agreement, 1.0);
  EXPECT_NEAR(all.perplexity, dense.perplexity, 1e-6 * dense.perplexity);
  EXPECT_NEAR(all.attention_recovery, 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(loose.budget, 0.5);
  EXPECT_LT(loose.kv_kept, 1.0);
  EXPECT_GE(loose.attention_recovery, 0.5 - 1e-6);
}

TEST(SparsityEval, QuestReadsFewerPagesButKeepsThemAll) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/stories260K.gguf"), ""});
  const std::string text = shared_text("golden/stories260K/tinystories_valid.txt");
  SparsityEvalConfig config{.families = {"quest"},
                            .budgets = {2.0, 0.125},
                            .num_prompts = 2,
                            .prompt_tokens = 96,
                            .continuation_tokens = 8};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 3u);
  const PolicyFidelity& dense = results[0];
  const PolicyFidelity& every_page = results[1];
  const PolicyFidelity& two_pages = results[2];
  EXPECT_DOUBLE_EQ(every_page.top1_agreement, 1.0) << "K above the page count reads everything";
  EXPECT_NEAR(every_page.perplexity, dense.perplexity, 1e-6 * dense.perplexity);
  EXPECT_GE(two_pages.kv_kept, 1.0) << "quest frees no memory";
  EXPECT_GT(two_pages.mean_kl, 1e-6) << "reading 2 of 7 pages changes the distributions";

  config.families = {"lserve"};
  EXPECT_THROW(run_sparsity_eval(loaded.model, loaded.tokenizer, text, config), Error)
      << "lserve without a calibration profile";
}

// With --kv-dtype q8 the reference stays f32 dense: a "full" row in q8 comes first, measured
// against it, and the policies run on q8 pages. On copy-lm (head_dim 32): bytes kept are q8's
// 34 bytes per 32 values against f32's 128, exactly, for every dense-sized request.
TEST(SparsityEval, QuantizedKvIsMeasuredAgainstF32Dense) {
  model::LoadedModel loaded =
      model::load_model({sieve::testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const std::string text = shared_text("models/copy/heldout.txt");
  SparsityEvalConfig config{.families = {"snapkv"},
                            .budgets = {2.0, 0.25},
                            .num_prompts = 2,
                            .prompt_tokens = 128,
                            .continuation_tokens = 16,
                            .kv_dtype = kernels::DType::kQ8_0};
  const std::vector<PolicyFidelity> results =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(results.size(), 4u) << "f32 dense, q8 full, then the budgets";
  const PolicyFidelity& reference = results[0];
  const PolicyFidelity& q8_full = results[1];
  const PolicyFidelity& keep_all = results[2];
  const PolicyFidelity& quarter = results[3];
  EXPECT_EQ(reference.kv_dtype, "f32");
  EXPECT_DOUBLE_EQ(reference.top1_agreement, 1.0);
  EXPECT_DOUBLE_EQ(reference.kv_bytes_kept, 1.0);
  EXPECT_EQ(q8_full.family, "full");
  EXPECT_EQ(q8_full.kv_dtype, "q8");
  EXPECT_DOUBLE_EQ(q8_full.kv_kept, 1.0);
  EXPECT_DOUBLE_EQ(q8_full.kv_bytes_kept, 34.0 / 128.0);
  EXPECT_GE(q8_full.top1_agreement, 0.95);
  EXPECT_GT(q8_full.mean_kl, 0.0) << "q8 is not f32";
  EXPECT_LT(q8_full.mean_kl, 0.01);
  EXPECT_NEAR(q8_full.perplexity, reference.perplexity, 0.02 * reference.perplexity);
  // Everything kept in q8 is q8 full exactly; a quarter keeps fewer q8 bytes still.
  EXPECT_EQ(keep_all.kv_dtype, "q8");
  EXPECT_DOUBLE_EQ(keep_all.top1_agreement, q8_full.top1_agreement);
  EXPECT_NEAR(keep_all.perplexity, q8_full.perplexity, 1e-6 * q8_full.perplexity);
  EXPECT_LT(quarter.kv_bytes_kept, 0.6 * q8_full.kv_bytes_kept);
}

// eval-32k's wired copy head is kept in f16 as well on q8 pages (kv_cache.h's precise streams).
// A compressed sequence reads it from its own f16 areas: one that keeps every key (budget 2)
// agrees with q8 full exactly, and both sit far closer to f32 than without the f16 copy.
TEST(SparsityEval, CompressedSequencesReadTheirPreciseHeadInF16) {
  model::LoadedModel loaded =
      model::load_model({std::string(SIEVE_SOURCE_DIR) + "/models/eval-32k.gguf", ""});
  ASSERT_EQ(loaded.model->precise_kv_streams(kernels::DType::kQ8_0), std::vector<int32_t>{2});
  const std::string text = shared_text("models/copy/heldout.txt");
  SparsityEvalConfig config{.families = {"snapkv"},
                            .budgets = {2.0, 0.25},
                            .num_prompts = 2,
                            .prompt_tokens = 512,
                            .continuation_tokens = 32,
                            .retrieval_prompts = 0,
                            .kv_dtype = kernels::DType::kQ8_0};
  const std::vector<PolicyFidelity> precise =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  config.precise_kv_heads = false;
  const std::vector<PolicyFidelity> plain =
      run_sparsity_eval(loaded.model, loaded.tokenizer, text, config);
  ASSERT_EQ(precise.size(), 4u) << "f32 dense, q8 full, then the budgets";
  ASSERT_EQ(plain.size(), 4u);
  for (size_t i = 1; i < 4; ++i) {
    std::printf("%s at %.2f: KL against f32 %.2e with the f16 copy, %.2e without\n",
                precise[i].family.c_str(), precise[i].budget, precise[i].mean_kl, plain[i].mean_kl);
  }
  const PolicyFidelity &full = precise[1], &keep_all = precise[2];
  EXPECT_EQ(keep_all.family, "snapkv");
  EXPECT_DOUBLE_EQ(keep_all.top1_agreement, full.top1_agreement);
  EXPECT_NEAR(keep_all.perplexity, full.perplexity, 1e-6 * full.perplexity);
  EXPECT_LT(full.mean_kl, plain[1].mean_kl / 10);
  EXPECT_LT(keep_all.mean_kl, plain[2].mean_kl / 10);
}

TEST(SparsityEval, PolicyStringsScaleWithTheBudget) {
  EXPECT_EQ(policy_for_budget("streaming", 0.25, 256, 8), "streaming:S=4,W=60");
  EXPECT_EQ(policy_for_budget("snapkv", 0.5, 256, 8), "snapkv:B=120,W=8");
  EXPECT_EQ(policy_for_budget("layerwise", 0.125, 256, 8), "layerwise:L=1,rest=snapkv:B=24,W=8");
  EXPECT_THROW(policy_for_budget("nonsense", 0.5, 256, 8), Error);
  EXPECT_THROW(policy_for_budget("fastgen", 0.5, 256, 8), Error) << "a threshold, not a budget";
  EXPECT_EQ(fastgen_policy(0.05, 256, 8), "fastgen:T=0.05,W=32,F=0.1");
  EXPECT_EQ(policy_for_budget("quest", 0.25, 256, 8), "quest:K=4,R=1,S=4,W=8");
  // lserve's quest heads keep the short window; its streaming heads take the budget's.
  EXPECT_EQ(policy_for_budget("lserve", 0.25, 256, 8), "lserve:K=4,R=4,S=4,W=60,f=0.5,t=0.5,w=8");
  EXPECT_EQ(policy_for_budget("quest:B=1", 0.25, 256, 8), "quest:K=4,R=1,S=4,W=8,B=1");
}

// --policies lserve:R=1,B=1,quest arrives split at every comma.
TEST(SparsityEval, AFamilysOwnParametersSplitAtCommasStayWithIt) {
  const std::vector<PolicySetting> settings = policy_settings(
      {"lserve:R=1", "B=1", "quest", "snapkv:G=11"}, {0.25}, {}, kernels::DType::kF32, true);
  ASSERT_EQ(settings.size(), 4u);
  EXPECT_EQ(settings[1].family, "lserve:R=1,B=1");
  EXPECT_EQ(settings[2].family, "quest");
  EXPECT_EQ(settings[3].family, "snapkv:G=11");
  EXPECT_EQ(policy_for_setting(settings[1], 256, 8), "lserve:K=4,R=1,S=4,W=60,f=0.5,t=0.5,w=8,B=1");
}

}  // namespace
}  // namespace sieve::eval
