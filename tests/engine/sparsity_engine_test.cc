// KV sparsity inside the engine: a batch mixing policies gives every request exactly the tokens
// it gives alone with the same policy; compressed requests hold fewer pages than dense ones,
// sink + window requests stay bounded while they generate, and every page is back at the end.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "engine/engine.h"
#include "engine/generator.h"
#include "kernels/backend.h"
#include "eval/calibration.h"
#include "kv_dtype_cases.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "shared_data.h"
#include "sparsity/policy_spec.h"
#include "sparsity/selection.h"
#include "util/thread_pool.h"

namespace sieve::engine {
namespace {

model::LoadedModel load_stories() {
  return model::load_model({testing::shared_path("models/stories260K.gguf"), ""});
}

// Long prompts (sparsity needs something to drop): consecutive TinyStories text.
std::vector<std::vector<TokenId>> long_prompts(const tok::Tokenizer& tokenizer, size_t count) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::vector<TokenId>> out;
  for (size_t i = 0; i < count; ++i) {
    out.push_back(tokenizer.encode(text.substr(i * 700, 350 + 45 * (i % 5))));
  }
  return out;
}

struct Outcome {
  std::vector<TokenId> tokens;
  Usage usage;
  std::optional<std::string> error;
};

std::vector<Outcome> run(Engine& engine, const std::vector<Request>& requests) {
  std::vector<Outcome> outcomes(requests.size());
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto submitted = engine.submit(requests[i], [&outcomes, &index](const RequestEvent& event) {
      Outcome& o = outcomes[index.at(event.request_id)];
      o.tokens.insert(o.tokens.end(), event.tokens.begin(), event.tokens.end());
      if (event.finish) o.usage = event.usage;
      if (event.error) o.error = event.error;
    });
    if (auto* rejected = std::get_if<AdmissionError>(&submitted)) {
      ADD_FAILURE() << rejected->message;
      continue;
    }
    index[std::get<RequestId>(submitted)] = i;
  }
  engine.run_until_idle();
  return outcomes;
}

Request greedy(std::vector<TokenId> prompt, const std::string& policy, int32_t max_tokens = 40) {
  Request request{.prompt = std::move(prompt), .kv_policy = sparsity::parse_policy(policy)};
  request.params.max_tokens = max_tokens;
  request.params.ignore_eos = true;
  return request;
}

EngineConfig config(int32_t num_pages,
                    std::shared_ptr<const sparsity::CalibrationProfile> calibration = nullptr,
                    kernels::DType kv_dtype = model::kKvDefaultDType) {
  return {.num_kv_pages = num_pages,
          .page_size = 16,
          .max_batch_tokens = 128,
          .max_num_seqs = 64,
          .max_queued = 256,
          .enable_prefix_caching = true,
          .kv_dtype = kv_dtype,
          .calibration = std::move(calibration)};
}

void expect_all_pages_free(const Engine& engine) {
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv.num_free_pages, stats.kv.num_pages) << "KV pages leaked";
  EXPECT_EQ(stats.num_running, 0);
}

// Every policy and every composition, each once: ThePolicyListCoversEveryPolicy fails when a
// policy (a PolicySpec alternative, a score= of pyramidkv / adakv, a head policy it resolves to)
// is missing, so a new policy must be added here and then runs in every test below. Indices
// stay within the smallest model of SparseEngineOnModel (2 layers, 2 KV heads).
const std::vector<std::string> kPolicies = {
    "full",
    "streaming:S=4,W=48",
    "snapkv:B=48,W=8",
    "pyramidkv:B=48,W=8",
    "adakv:B=40,W=8",
    "keydiff:B=40,W=8",
    "pyramidkv:B=48,W=8,score=keydiff",
    "adakv:B=40,W=8,score=keydiff",
    "layerwise:L=2,rest=snapkv:B=32,W=8",
    "heads:(streaming:S=4,W=32)@kv=0+1,rest=snapkv:B=40,W=8",
    "heads:(streaming:S=4,W=32)@profile=0.5,rest=keydiff:B=40,W=8",
    "layers:(h2o:B=32,W=16)@0,full@1,rest=snapkv:B=40,W=8",
    "layers:(streaming:S=4,W=32)@1,rest=heads:(keydiff:B=32,W=8)@kv=0,rest=adakv:B=40,W=8",
    "h2o:B=32,W=16",
    "fastgen:T=0.3,W=16,F=0.1",
    "fastgen:T=0.6,W=8,F=0.05",
    "fastgen:T=0,W=16",  // every head recovers all: chooses full
    "quest:K=4,R=1,S=4,W=16",
    "quest:K=4,R=2,S=4,W=16,B=1",
    "lserve:K=3,R=3,S=4,W=32,f=0.5",
    "lserve:K=3,R=1,S=4,W=32,f=0.5,w=8,B=1",
};

// The PolicySpec alternatives `spec` uses (its groups and rest included) and, per pyramidkv /
// adakv, the ScoredSpec alternative it ranks by (as policy index * 100 + score index).
void collect_policy_kinds(const sparsity::PolicySpec& spec, std::set<size_t>& kinds,
                          std::set<size_t>& scored) {
  kinds.insert(spec.policy.index());
  std::visit(
      [&](const auto& policy) {
        using T = std::decay_t<decltype(policy)>;
        if constexpr (std::is_same_v<T, sparsity::PyramidKvSpec> ||
                      std::is_same_v<T, sparsity::AdaKvSpec>) {
          scored.insert(spec.policy.index() * 100 + policy.scored.index());
        } else if constexpr (std::is_same_v<T, sparsity::LayerwiseSpec>) {
          collect_policy_kinds(*policy.rest, kinds, scored);
        } else if constexpr (std::is_same_v<T, sparsity::HeadsSpec> ||
                             std::is_same_v<T, sparsity::LayersSpec>) {
          for (const auto& group : policy.groups)
            collect_policy_kinds(*group.policy, kinds, scored);
          collect_policy_kinds(*policy.rest, kinds, scored);
        }
      },
      spec.policy);
}

// Variant's alternative `index`, default-constructed (to name a missing one in a message).
template <typename Variant, size_t... I>
Variant default_alternative(size_t index, std::index_sequence<I...>) {
  Variant value;
  ((I == index ? void(value = std::variant_alternative_t<I, Variant>{}) : void()), ...);
  return value;
}

template <typename Variant>
Variant default_alternative(size_t index) {
  return default_alternative<Variant>(index,
                                      std::make_index_sequence<std::variant_size_v<Variant>>());
}

TEST(SparseEngine, ThePolicyListCoversEveryPolicy) {
  using Policies = decltype(sparsity::PolicySpec::policy);
  std::set<size_t> kinds, scored;
  for (const std::string& policy : kPolicies)
    collect_policy_kinds(sparsity::parse_policy(policy), kinds, scored);
  for (size_t i = 0; i < std::variant_size_v<Policies>; ++i) {
    const std::string name = sparsity::to_string({default_alternative<Policies>(i)});
    EXPECT_TRUE(kinds.contains(i)) << "kPolicies has no " << name.substr(0, name.find(':'))
                                   << " policy: add one, so that the engine tests run it";
  }
  for (size_t score = 0; score < std::variant_size_v<sparsity::ScoredSpec>; ++score) {
    const auto scores = default_alternative<sparsity::ScoredSpec>(score);
    for (const sparsity::PolicySpec& wrapper :
         {sparsity::PolicySpec{sparsity::PyramidKvSpec{.scored = scores}},
          sparsity::PolicySpec{sparsity::AdaKvSpec{.scored = scores}}}) {
      EXPECT_TRUE(scored.contains(wrapper.policy.index() * 100 + score))
          << "kPolicies has no " << sparsity::to_string(wrapper) << " (any parameters)";
    }
  }
}

// What a request's plan lets the test expect of the pages it holds against its dense count.
enum class PagesVersusDense { kEqual, kAtLeast, kAtMost, kFewer };

PagesVersusDense expected_pages(const sparsity::SparsityPlan& plan, bool random_weights) {
  bool drops = false, maybe_drops = false, reads_pages = false;
  for (const sparsity::HeadPolicy& head : plan.heads) {
    std::visit(
        [&](const auto& h) {
          using T = std::decay_t<decltype(h)>;
          if constexpr (std::is_same_v<T, sparsity::DenseHead>) {
          } else if constexpr (std::is_same_v<T, sparsity::PageSelectHead>) {
            reads_pages = true;  // quest keeps every page (and frees no memory)
          } else if constexpr (std::is_same_v<T, sparsity::FastGenPendingHead>) {
            // T = 0: no cheaper policy recovers all the attention, so the head keeps everything.
            // Random weights attend diffusely: no cheap set of keys recovers 1 - T of the
            // attention, so FastGen heads may all choose full.
            if (h.threshold > 0) (random_weights ? maybe_drops : drops) = true;
          } else {
            drops = true;  // the prompts are longer than every budget + window above
          }
        },
        head);
  }
  if (drops) return PagesVersusDense::kFewer;
  if (maybe_drops) return PagesVersusDense::kAtMost;
  if (reads_pages) return PagesVersusDense::kAtLeast;
  return PagesVersusDense::kEqual;
}

// A profile rating KV heads 0 and 2 of every layer the most streaming-like (lserve's f=0.5).
std::shared_ptr<const sparsity::CalibrationProfile> profile_for(const model::Model& model) {
  auto profile = std::make_shared<sparsity::CalibrationProfile>();
  profile->model_name = "stories260K";
  profile->model_fingerprint = model.fingerprint();
  profile->num_layers = model.config().num_layers;
  profile->num_kv_heads = model.config().num_kv_heads;
  for (int64_t i = 0; i < profile->num_layers * profile->num_kv_heads; ++i) {
    profile->streaming_scores.push_back(i % 2 == 0 ? 0.9 : 0.1);
  }
  return profile;
}

// The engine's paths do not depend on the architecture: the same on llama (stories260K, trained),
// on qwen2 (Q/K/V biases, NeoX RoPE, tied output), phi3 (fused QKV and gate/up) and qwen3
// (per-head Q/K norms, n_head * head_dim = 2 n_embd), random-weight 2-layer models from
// golden/quant; nor on the KV dtype: q8 and q4 pages (rotated keys, quantized rows moved with
// their scales by compaction and copy-on-write) on copy-lm (trained llama, head_dim 32) and
// qwen3 (head_dim 64).
struct ModelCase {
  std::string name;
  std::string path;  // under shared/
  bool random_weights = false;
  kernels::DType kv_dtype = model::kKvDefaultDType;
};

class SparseEngineOnModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(SparseEngineOnModel, MixedBatchGivesEachRequestItsTokensAlone) {
  const ModelCase& model_case = GetParam();
  model::LoadedModel loaded = model::load_model({testing::shared_path(model_case.path), ""});
  const sparsity::ModelShape shape{loaded.model->config().num_layers,
                                   loaded.model->config().num_kv_heads};
  // One prompt per policy, built from the list: every policy runs.
  const auto prompts = long_prompts(*loaded.tokenizer, kPolicies.size());
  ASSERT_EQ(prompts.size(), kPolicies.size());
  std::vector<Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i) requests.push_back(greedy(prompts[i], kPolicies[i]));

  const auto profile = profile_for(*loaded.model);
  // Every head policy runs on this model too (the compositions' indices resolve here).
  std::set<size_t> head_kinds;
  for (const std::string& policy : kPolicies) {
    for (const auto& head :
         sparsity::resolve(sparsity::parse_policy(policy), shape, profile.get()).heads) {
      head_kinds.insert(head.index());
    }
  }
  EXPECT_EQ(head_kinds.size(), std::variant_size_v<sparsity::HeadPolicy>)
      << "a head policy no request of kPolicies resolves to on " << model_case.name;

  // A small max_batch_tokens chunks the prompts differently together than alone.
  Engine together(config(1024, profile, model_case.kv_dtype), loaded.model, loaded.tokenizer);
  const std::vector<Outcome> batched = run(together, requests);
  expect_all_pages_free(together);
  ASSERT_EQ(batched.size(), kPolicies.size());

  for (size_t i = 0; i < requests.size(); ++i) {
    Engine alone_engine(config(1024, profile, model_case.kv_dtype), loaded.model, loaded.tokenizer);
    const std::vector<Outcome> alone = run(alone_engine, {requests[i]});
    expect_all_pages_free(alone_engine);
    const std::string& policy = kPolicies[i];
    EXPECT_FALSE(batched[i].error.has_value()) << policy;
    EXPECT_EQ(batched[i].tokens.size(), 40u) << policy;
    EXPECT_EQ(batched[i].tokens, alone[0].tokens) << "request " << i << " policy " << policy;
    const Usage& u = batched[i].usage;
    switch (expected_pages(sparsity::resolve(requests[i].kv_policy, shape, profile.get()),
                           model_case.random_weights)) {
      case PagesVersusDense::kEqual:
        EXPECT_EQ(u.kv_pages, u.kv_dense_pages) << policy << " keeps everything";
        break;
      case PagesVersusDense::kAtLeast:
        EXPECT_GE(u.kv_pages, u.kv_dense_pages) << policy << ": quest frees no memory";
        break;
      case PagesVersusDense::kAtMost:
        EXPECT_LE(u.kv_pages, u.kv_dense_pages) << policy;
        break;
      case PagesVersusDense::kFewer:
        EXPECT_LT(u.kv_pages, u.kv_dense_pages)
            << policy << ": compressed requests hold fewer pages";
        break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, SparseEngineOnModel,
    ::testing::Values(
        ModelCase{"llama", "models/stories260K.gguf"},
        ModelCase{"qwen2", "golden/quant/arch-qwen2-F16.gguf", true},
        ModelCase{"phi3", "golden/quant/arch-phi3-F16.gguf", true},
        ModelCase{"qwen3", "golden/quant/arch-qwen3-F16.gguf", true},
        ModelCase{"copylm_q8", "models/copy/copy-lm.gguf", false, kernels::DType::kQ8_0},
        ModelCase{"copylm_q4", "models/copy/copy-lm.gguf", false, kernels::DType::kQ4_1},
        ModelCase{"qwen3_q4", "golden/quant/arch-qwen3-F16.gguf", true, kernels::DType::kQ4_1}),
    [](const auto& info) { return info.param.name; });

TEST(SparseEngine, F16KvCacheRunsTheSamePolicies) {
  model::LoadedModel loaded = load_stories();
  const auto prompts = long_prompts(*loaded.tokenizer, kPolicies.size());
  std::vector<Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    requests.push_back(greedy(prompts[i], kPolicies[i % kPolicies.size()]));
  EngineConfig c = config(1024, profile_for(*loaded.model));
  c.kv_dtype = kernels::DType::kF16;
  Engine together(c, loaded.model, loaded.tokenizer);
  const std::vector<Outcome> batched = run(together, requests);
  expect_all_pages_free(together);
  for (size_t i = 0; i < requests.size(); ++i) {
    Engine alone(c, loaded.model, loaded.tokenizer);
    EXPECT_EQ(batched[i].tokens, run(alone, {requests[i]})[0].tokens)
        << kPolicies[i % kPolicies.size()];
  }
}

TEST(SparseEngine, SparsePoliciesChangeTheOutputButStayCloseToDense) {
  // Not a fidelity measurement (that is `sieve eval`): a check that the policies act at all and
  // that a generous budget (everything kept) reproduces the dense output exactly.
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto dense = run(engine, {greedy(prompt, "full")})[0].tokens;
  const auto keep_all = run(engine, {greedy(prompt, "snapkv:B=4096,W=8")})[0].tokens;
  const auto tight = run(engine, {greedy(prompt, "streaming:S=2,W=8")})[0].tokens;
  EXPECT_EQ(keep_all, dense) << "a budget above the prompt keeps every token";
  EXPECT_NE(tight, dense)
      << "a 10-token cache must change a 40-token continuation of a long prompt";
  expect_all_pages_free(engine);
}

TEST(SparseEngine, ScoredPoliciesReportTheAttentionTheyKept) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const Usage all = run(engine, {greedy(prompt, "snapkv:B=4096,W=8", 4)})[0].usage;
  const Usage tight = run(engine, {greedy(prompt, "snapkv:B=16,W=8", 4)})[0].usage;
  const Usage h2o = run(engine, {greedy(prompt, "h2o:B=16,W=8", 4)})[0].usage;
  const Usage window = run(engine, {greedy(prompt, "streaming:S=4,W=16", 4)})[0].usage;
  ASSERT_TRUE(all.attention_recovery && tight.attention_recovery && h2o.attention_recovery);
  EXPECT_NEAR(*all.attention_recovery, 1.0f, 1e-5f) << "keeping every key keeps all the attention";
  EXPECT_GT(*tight.attention_recovery, 0.0f);
  EXPECT_LT(*tight.attention_recovery, 1.0f);
  EXPECT_GT(*h2o.attention_recovery, 0.0f);
  EXPECT_FALSE(window.attention_recovery.has_value()) << "sink + window scores nothing";
  expect_all_pages_free(engine);
}

TEST(SparseEngine, StreamingHoldsABoundedNumberOfPagesWhileGenerating) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto outcome = run(engine, {greedy(prompt, "streaming:S=4,W=28", 300)})[0];
  ASSERT_EQ(outcome.tokens.size(), 300u);
  // 5 layers x 4 KV heads = 20 streams of <= 32 keys (+ at most one partial slice each) in pages
  // of 20 slices: a handful of pages, whatever the length.
  EXPECT_LE(outcome.usage.kv_pages, 5);
  EXPECT_GE(outcome.usage.kv_dense_pages, 26);
  expect_all_pages_free(engine);
}

// A sliding-window model (the window as Mistral 7B v0.1 declares it, here 24 keys on
// stories260K): the engine runs a dense request as sink-free streaming, so the pages of keys
// older than the window go back to the pool, and the tokens are exactly those of the dense
// cache with the kernels' window mask (the single-sequence generator).
TEST(SparseEngine, SlidingWindowModelDropsKeysOutsideTheWindowExactly) {
  model::LoadedModel loaded = load_stories();
  model::ModelConfig windowed_config = loaded.model->config();
  windowed_config.sliding_window = 24;
  const auto windowed = std::make_shared<const model::LlamaModel>(
      windowed_config, loaded.model->weights(), kernels::make_cpu_backend(1));
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  ASSERT_GT(prompt.size(), 48u);

  Engine engine(config(512), windowed, loaded.tokenizer);
  const Outcome outcome = run(engine, {greedy(prompt, "full", 200)})[0];
  ASSERT_FALSE(outcome.error.has_value()) << *outcome.error;
  ASSERT_EQ(outcome.tokens.size(), 200u);
  // 5 layers x 4 KV heads = 20 streams of <= 24 keys (+ a partial slice each): a few pages.
  EXPECT_LE(outcome.usage.kv_pages, 5);
  EXPECT_GE(outcome.usage.kv_dense_pages, 18);
  expect_all_pages_free(engine);
  std::vector<TokenId> masked_dense;
  engine::generate(*windowed, prompt, {.max_tokens = 200, .sampling = {.temperature = 0.0f}},
                   [&](TokenId token, std::span<const float>) {
                     masked_dense.push_back(token);
                     return true;
                   });
  EXPECT_EQ(outcome.tokens, masked_dense);

  Engine full_engine(config(512), loaded.model, loaded.tokenizer);
  EXPECT_NE(run(full_engine, {greedy(prompt, "full", 200)})[0].tokens, outcome.tokens)
      << "a 24-key window must change a 200-token continuation of a long prompt";
}

TEST(SparseEngine, FastGenRecoversWhatItsThresholdAsks) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto dense = run(engine, {greedy(prompt, "full", 60)})[0];
  // T = 0: no cheaper policy recovers all the attention, so every head keeps everything.
  const auto all = run(engine, {greedy(prompt, "fastgen:T=0,W=16", 60)})[0];
  EXPECT_EQ(all.tokens, dense.tokens) << "every head chose full";
  EXPECT_EQ(all.usage.kv_pages, all.usage.kv_dense_pages) << "and the sequence stayed dense";
  ASSERT_TRUE(all.usage.attention_recovery.has_value());
  EXPECT_NEAR(*all.usage.attention_recovery, 1.0f, 1e-6f);
  int32_t previous_pages = all.usage.kv_pages;
  for (const double threshold : {0.1, 0.3, 0.6}) {
    const auto outcome =
        run(engine, {greedy(prompt, fmt::format("fastgen:T={},W=8,F=0.05", threshold), 60)})[0];
    ASSERT_EQ(outcome.tokens.size(), 60u);
    ASSERT_TRUE(outcome.usage.attention_recovery.has_value()) << threshold;
    // Every head's recovery is >= 1 - T, so their mean is too.
    EXPECT_GE(*outcome.usage.attention_recovery, 1.0 - threshold - 1e-6) << threshold;
    EXPECT_LE(*outcome.usage.attention_recovery, 1.0f + 1e-6f);
    EXPECT_LE(outcome.usage.kv_pages, previous_pages) << "a larger T never picks a dearer policy";
    previous_pages = outcome.usage.kv_pages;
  }
  EXPECT_LT(previous_pages, dense.usage.kv_dense_pages) << "T = 0.6 drops most of the prompt";
  // Nearly any recovery will do: every head keeps its special tokens only (here the BOS, which
  // draws far more than 0.1% of the attention), and drops each generated token right after its
  // step. 20 streams of one key fit one page, plus packing slack.
  const auto special = run(engine, {greedy(prompt, "fastgen:T=0.999,W=8", 60)})[0];
  ASSERT_EQ(special.tokens.size(), 60u);
  EXPECT_LE(special.usage.kv_pages, 2);
  expect_all_pages_free(engine);
}

TEST(SparseEngine, HeavyHittersKeepABoundedCacheWhileGenerating) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto dense = run(engine, {greedy(prompt, "full", 200)})[0];
  const auto h2o = run(engine, {greedy(prompt, "h2o:B=24,W=8", 200)})[0];
  ASSERT_EQ(h2o.tokens.size(), 200u);
  // 20 streams of 32 (+1) keys: 2 pages of 20 slices plus packing slack, whatever the length.
  EXPECT_LE(h2o.usage.kv_pages, 4);
  EXPECT_GE(h2o.usage.kv_dense_pages, 20);
  EXPECT_NE(h2o.tokens, dense.tokens) << "a 32-token cache changes a 200-token continuation";
  const auto roomy = run(engine, {greedy(prompt, "h2o:B=4096,W=8", 40)})[0];
  EXPECT_EQ(roomy.tokens, std::vector<TokenId>(dense.tokens.begin(), dense.tokens.begin() + 40))
      << "a budget above the sequence keeps everything";
  expect_all_pages_free(engine);
}

TEST(SparseEngine, CompressedRequestsFitWhereDenseOnesDoNot) {
  // A pool of 34 pages holds one ~31-page dense request at a time; sink + window requests take
  // a few pages each after their prompt, so several run together.
  model::LoadedModel loaded = load_stories();
  const auto prompts = long_prompts(*loaded.tokenizer, 4);
  std::vector<Request> dense, sparse;
  for (const auto& p : prompts) {
    dense.push_back(greedy(p, "full", 250));
    sparse.push_back(greedy(p, "streaming:S=4,W=28", 250));
  }
  Engine dense_engine(config(34), loaded.model, loaded.tokenizer);
  for (const auto& o : run(dense_engine, dense)) EXPECT_EQ(o.tokens.size(), 250u);
  const int64_t dense_preemptions = dense_engine.stats().num_preemptions;
  Engine sparse_engine(config(34), loaded.model, loaded.tokenizer);
  for (const auto& o : run(sparse_engine, sparse)) EXPECT_EQ(o.tokens.size(), 250u);
  EXPECT_LT(sparse_engine.stats().num_preemptions, dense_preemptions + 1);
  EXPECT_LT(sparse_engine.stats().num_steps, dense_engine.stats().num_steps)
      << "more requests ran at once";
  expect_all_pages_free(dense_engine);
  expect_all_pages_free(sparse_engine);
}

// Prompts of `length` tokens (most of the 512-token context), from consecutive text.
std::vector<std::vector<TokenId>> very_long_prompts(const tok::Tokenizer& tokenizer, size_t count,
                                                    size_t length) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::vector<TokenId> all = tokenizer.encode(buffer.str().substr(0, 40000));
  std::vector<std::vector<TokenId>> out;
  for (size_t i = 0; i < count; ++i) {
    EXPECT_GE(all.size(), (i + 1) * length);
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * length),
                     all.begin() + static_cast<std::ptrdiff_t>((i + 1) * length - 7 * i));
  }
  return out;
}

EngineConfig chunked_config(
    int32_t num_pages, int32_t chunk,
    std::shared_ptr<const sparsity::CalibrationProfile> calibration = nullptr) {
  EngineConfig c = config(num_pages, std::move(calibration));
  c.sparse_prefill_chunk = chunk;
  return c;
}

TEST(SparseEngine, ChunkByChunkCompressionGivesEachRequestItsTokensAlone) {
  // Compressions happen at fixed prompt positions (multiples of the chunk), whatever else is in
  // the batch and however max_batch_tokens splits the prefill.
  model::LoadedModel loaded = load_stories();
  std::vector<std::string> policies = kPolicies;
  policies.push_back(
      "heads:(fastgen:T=0.3,W=16)@kv=0+1,rest=snapkv:B=40,W=8");  // FastGen beside chunked heads
  const auto prompts = very_long_prompts(*loaded.tokenizer, policies.size(), 300);
  std::vector<Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    requests.push_back(greedy(prompts[i], policies[i], 24));
  const auto profile = profile_for(*loaded.model);  // lserve's
  Engine together(chunked_config(1024, 48, profile), loaded.model, loaded.tokenizer);
  const std::vector<Outcome> batched = run(together, requests);
  expect_all_pages_free(together);
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineConfig alone_config = chunked_config(1024, 48, profile);
    alone_config.max_batch_tokens = 40 + 16 * static_cast<int32_t>(i);  // other prefill splits
    Engine alone(alone_config, loaded.model, loaded.tokenizer);
    const Outcome a = run(alone, {requests[i]})[0];
    expect_all_pages_free(alone);
    const std::string& policy = policies[i];
    EXPECT_FALSE(batched[i].error.has_value()) << policy;
    EXPECT_EQ(batched[i].tokens.size(), 24u) << policy;
    EXPECT_EQ(batched[i].tokens, a.tokens) << "request " << i << " policy " << policy;
  }
}

// Compaction, forks, preemption and prefix sharing of compressed requests, per KV dtype (q8 / q4
// slices move with their scales).
class SparseEngineOnKvDType : public ::testing::TestWithParam<KvDTypeCase> {
 protected:
  EngineConfig chunked_config(int32_t num_pages, int32_t chunk) const {
    EngineConfig c = engine::chunked_config(num_pages, chunk);
    c.kv_dtype = GetParam().dtype;
    return c;
  }
};

TEST_P(SparseEngineOnKvDType, ChunkByChunkCompressionWithEverythingKeptEqualsDense) {
  // Prefill chunks of a compressed sequence attend through its streams: with a budget above the
  // prompt that must be the dense computation exactly.
  model::LoadedModel loaded = GetParam().load();
  const auto prompt = very_long_prompts(*loaded.tokenizer, 1, 400)[0];
  Engine engine(chunked_config(512, 64), loaded.model, loaded.tokenizer);
  const auto dense = run(engine, {greedy(prompt, "full", 24)})[0].tokens;
  EXPECT_EQ(run(engine, {greedy(prompt, "snapkv:B=4096,W=8", 24)})[0].tokens, dense);
  EXPECT_EQ(run(engine, {greedy(prompt, "h2o:B=4096,W=8", 24)})[0].tokens, dense);
  EXPECT_EQ(run(engine, {greedy(prompt, "streaming:S=4,W=4096", 24)})[0].tokens, dense);
  expect_all_pages_free(engine);
}

// The most pages `request` holds at any step when run alone.
int32_t peak_pages(const model::LoadedModel& loaded, const EngineConfig& c,
                   const Request& request) {
  Engine engine(c, loaded.model, loaded.tokenizer);
  int32_t peak = 0;
  bool finished = false;
  EXPECT_TRUE(
      std::holds_alternative<RequestId>(engine.submit(request, [&](const RequestEvent& event) {
        finished = finished || event.finish.has_value();
      })));
  while (!finished) {
    engine.step();
    const EngineStats stats = engine.stats();
    peak = std::max(peak, stats.kv.num_pages - stats.kv.num_free_pages);
  }
  expect_all_pages_free(engine);
  return peak;
}

TEST(SparseEngine, ChunkByChunkCompressionBoundsALongPromptsPeak) {
  // 400-token prompt = 25 dense pages. Compressed once at its end it holds all but its last
  // chunk densely between steps (and all of it, plus the copy out of the prefix-cached pages,
  // within the last one); compressed every 64 tokens it never holds more than budget + one
  // chunk per stream.
  model::LoadedModel loaded = load_stories();
  const auto prompt = very_long_prompts(*loaded.tokenizer, 1, 400)[0];
  for (const char* policy : {"snapkv:B=32,W=8", "h2o:B=24,W=8", "streaming:S=4,W=36"}) {
    const Request request = greedy(prompt, policy, 8);
    const int32_t at_end = peak_pages(loaded, chunked_config(512, 0), request);
    const int32_t chunked = peak_pages(loaded, chunked_config(512, 64), request);
    EXPECT_GE(at_end, 24) << policy;
    // 20 streams of <= 40 + 64 + 8 keys: 8 slices each (+1 for a mid-slice start) in pages of
    // 20 slices, + 1 page of packing slack; the first chunk's dense pages + their copy is less.
    EXPECT_LE(chunked, 10) << policy;
    Engine engine(chunked_config(512, 64), loaded.model, loaded.tokenizer);
    EXPECT_EQ(run(engine, {request})[0].tokens.size(), 8u) << policy;
  }
}

TEST(SparseEngine, QuestReadingEveryPageReproducesDense) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto dense = run(engine, {greedy(prompt, "full", 60)})[0].tokens;
  EXPECT_EQ(run(engine, {greedy(prompt, "quest:K=4096,R=1,S=4,W=16", 60)})[0].tokens, dense)
      << "K above the number of pages reads every key";
  // Few pages read from a ~100-token prompt (8 pages): the output moves, but every request runs
  // its full length, with the choice fresh every step or reused for 4 steps.
  for (const char* policy : {"quest:K=2,R=1,S=1,W=1", "quest:K=2,R=4,S=1,W=1"}) {
    const auto sparse = run(engine, {greedy(prompt, policy, 60)})[0];
    EXPECT_FALSE(sparse.error.has_value()) << policy;
    EXPECT_EQ(sparse.tokens.size(), 60u) << policy;
    EXPECT_NE(sparse.tokens, dense) << policy << ": two of ~10 pages must change the continuation";
  }
  expect_all_pages_free(engine);
}

TEST(SparseEngine, QuestSelectionReusedForRStepsDiffersFromFreshEveryStep) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512), loaded.model, loaded.tokenizer);
  const auto fresh = run(engine, {greedy(prompt, "quest:K=3,R=1,S=1,W=1", 80)})[0].tokens;
  const auto reused = run(engine, {greedy(prompt, "quest:K=3,R=8,S=1,W=1", 80)})[0].tokens;
  ASSERT_EQ(fresh.size(), 80u);
  ASSERT_EQ(reused.size(), 80u);
  // Same first step (both choose at once), then the pages read differ.
  EXPECT_EQ(fresh.front(), reused.front());
  EXPECT_NE(fresh, reused);
  expect_all_pages_free(engine);
}

TEST(SparseEngine, LServeNeedsACalibrationProfileForTheModel) {
  model::LoadedModel loaded = load_stories();
  {
    Engine engine(config(64), loaded.model, loaded.tokenizer);
    auto submitted = engine.submit(greedy({1, 2, 3}, "lserve:K=4"), [](const RequestEvent&) {});
    ASSERT_TRUE(std::holds_alternative<AdmissionError>(submitted));
    EXPECT_EQ(std::get<AdmissionError>(submitted).param, "kv_policy");
    const std::string& message = std::get<AdmissionError>(submitted).message;
    EXPECT_NE(message.find("kv_policy"), std::string::npos) << message;
    EXPECT_NE(message.find("--calibration"), std::string::npos) << message;
    // f=0 needs no profile.
    EXPECT_TRUE(std::holds_alternative<RequestId>(
        engine.submit(greedy({1, 2, 3}, "lserve:K=4,f=0"), [](const RequestEvent&) {})));
    engine.run_until_idle();
  }
  auto other = std::make_shared<sparsity::CalibrationProfile>(*profile_for(*loaded.model));
  other->model_fingerprint = "0123456789abcdef";
  EXPECT_THROW(Engine(config(64, other), loaded.model, loaded.tokenizer), Error);
}

TEST(SparseEngine, LServeStreamingHeadsHoldFewerPagesThanQuest) {
  model::LoadedModel loaded = load_stories();
  const auto prompt = long_prompts(*loaded.tokenizer, 1)[0];
  Engine engine(config(512, profile_for(*loaded.model)), loaded.model, loaded.tokenizer);
  const auto quest = run(engine, {greedy(prompt, "quest:K=4,R=2,S=4,W=16", 100)})[0];
  const auto lserve = run(engine, {greedy(prompt, "lserve:K=4,R=2,S=4,W=16,f=0.5", 100)})[0];
  ASSERT_EQ(lserve.tokens.size(), 100u);
  EXPECT_LT(lserve.usage.kv_pages, quest.usage.kv_pages) << "half the heads keep 20 keys";
  expect_all_pages_free(engine);
}

TEST(SparseEngine, LServeRunsWithAMeasuredProfile) {
  // What `sieve calibrate` writes, round-tripped through the file format, drives lserve.
  model::LoadedModel loaded = load_stories();
  const auto prompts = long_prompts(*loaded.tokenizer, 3);
  const sparsity::CalibrationProfile measured = eval::calibrate(
      *loaded.model, loaded.name, prompts, {.num_sinks = 4, .window = 16, .observation_rows = 8});
  const std::string path =
      (std::filesystem::temp_directory_path() / "sieve_lserve_profile.json").string();
  sparsity::save_calibration(measured, path);
  auto profile =
      std::make_shared<const sparsity::CalibrationProfile>(sparsity::load_calibration(path));
  std::filesystem::remove(path);
  EXPECT_EQ(*profile, measured);
  Engine engine(config(512, profile), loaded.model, loaded.tokenizer);
  const auto outcome = run(engine, {greedy(prompts[0], "lserve:K=4,R=2,S=4,W=16,f=0.5", 50)})[0];
  EXPECT_FALSE(outcome.error.has_value());
  EXPECT_EQ(outcome.tokens.size(), 50u);
  EXPECT_LT(outcome.usage.kv_pages, outcome.usage.kv_dense_pages)
      << "half the heads keep sinks + window";
  expect_all_pages_free(engine);
}

TEST_P(SparseEngineOnKvDType, ParallelSamplesOfACompressedPromptEachEqualItsSeedAlone) {
  // n > 1: the samples fork from the parent after its prompt (compressed chunk by chunk, so the
  // parent is already sparse: its children get copies of its slices and carry its state on).
  model::LoadedModel loaded = GetParam().load();
  const auto prompt = very_long_prompts(*loaded.tokenizer, 1, 300)[0];
  for (const char* policy :
       {"snapkv:B=40,W=8", "h2o:B=32,W=16", "streaming:S=4,W=48", "fastgen:T=0.3,W=16"}) {
    Request request = greedy(prompt, policy, 24);
    request.params.temperature = 0.9f;
    request.params.seed = 99;
    request.params.n = 3;
    Engine engine(chunked_config(512, 64), loaded.model, loaded.tokenizer);
    std::map<int32_t, std::vector<TokenId>> samples;
    ASSERT_TRUE(
        std::holds_alternative<RequestId>(engine.submit(request, [&](const RequestEvent& event) {
          EXPECT_FALSE(event.error.has_value()) << policy << ": " << event.error.value_or("");
          auto& tokens = samples[event.sample_idx];
          tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
        })));
    engine.run_until_idle();
    expect_all_pages_free(engine);
    ASSERT_EQ(samples.size(), 3u) << policy;
    for (int32_t i = 0; i < 3; ++i) {
      Engine alone(chunked_config(512, 64), loaded.model, loaded.tokenizer);
      Request one = request;
      one.params = params_for_sample(request.params, i);
      EXPECT_EQ(samples[i], run(alone, {one})[0].tokens) << policy << " sample " << i;
    }
  }
}

TEST_P(SparseEngineOnKvDType, PreemptedChunkCompressedRequestsAreRecomputedAndFinish) {
  // A pool too small for all of them at once: compressed requests are preempted mid-prefill or
  // mid-decode, recomputed (compressed again at the same chunk boundaries) and finish.
  model::LoadedModel loaded = GetParam().load();
  const auto prompts = very_long_prompts(*loaded.tokenizer, 6, 300);
  const std::vector<std::string> policies = {"snapkv:B=40,W=8", "h2o:B=32,W=16",
                                             "streaming:S=4,W=48"};
  std::vector<Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    requests.push_back(greedy(prompts[i], policies[i % policies.size()], 40));
  Engine engine(chunked_config(22, 64), loaded.model, loaded.tokenizer);
  const std::vector<Outcome> outcomes = run(engine, requests);
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_FALSE(outcomes[i].error.has_value()) << i;
    EXPECT_EQ(outcomes[i].tokens.size(), 40u) << i;
  }
  EXPECT_GT(engine.stats().num_preemptions, 0);
  expect_all_pages_free(engine);
}

TEST_P(SparseEngineOnKvDType, CompressionRetriedAfterAFailedCompactionSurvivesPreemption) {
  // Pools so tight that a compaction finds no free page for its copy (retried the next step) and
  // the sequence is preempted before that retry: the retry must skip it (it has no KV any more;
  // the server crashed on it) and every request still finishes.
  model::LoadedModel loaded = GetParam().load();
  const auto prompts = very_long_prompts(*loaded.tokenizer, 8, 300);
  std::vector<Request> requests;
  for (const auto& prompt : prompts) requests.push_back(greedy(prompt, "snapkv:B=40,W=8", 48));
  int64_t preemptions = 0;
  for (int32_t num_pages = 20; num_pages <= 30; num_pages += 2) {
    Engine engine(chunked_config(num_pages, 64), loaded.model, loaded.tokenizer);
    const std::vector<Outcome> outcomes = run(engine, requests);
    for (size_t i = 0; i < outcomes.size(); ++i) {
      EXPECT_FALSE(outcomes[i].error.has_value()) << num_pages << " pages, request " << i;
      EXPECT_EQ(outcomes[i].tokens.size(), 48u) << num_pages << " pages, request " << i;
    }
    preemptions += engine.stats().num_preemptions;
    expect_all_pages_free(engine);
  }
  EXPECT_GT(preemptions, 0);
}

TEST_P(SparseEngineOnKvDType, ChunkCompressedRequestsShareTheFirstChunkThroughThePrefixCache) {
  // The first chunk is computed densely and published before its compression copies out of it,
  // so a later request with the same prompt starts from it (a hit is capped a page before the
  // first chunk's end, so that its first step ends where the first compression happens) and
  // gives the same tokens. (A hit of the whole chunk skipped that compression: copy-lm, which
  // copies spans, then gave other tokens; stories260K happened not to.)
  model::LoadedModel loaded = GetParam().load();
  const auto prompt = very_long_prompts(*loaded.tokenizer, 1, 300)[0];
  Engine engine(chunked_config(512, 64), loaded.model, loaded.tokenizer);
  const Outcome first = run(engine, {greedy(prompt, "snapkv:B=40,W=8", 24)})[0];
  const Outcome second = run(engine, {greedy(prompt, "snapkv:B=40,W=8", 24)})[0];
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(second.usage.cached_prompt_tokens, 48);
  EXPECT_EQ(second.tokens, first.tokens);
  // quest is compressed once, at the prompt's end: it keeps its pages private (in place).
  const Outcome quest_first = run(engine, {greedy(prompt, "quest:K=4,R=1,S=4,W=16", 8)})[0];
  EXPECT_EQ(quest_first.usage.cached_prompt_tokens, 0)
      << "private: it does not read the cache either";
  expect_all_pages_free(engine);
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, SparseEngineOnKvDType,
                         ::testing::Values(kStoriesF32, kCopyLmQ8, kCopyLmQ4, kEvalQ8Precise),
                         kv_case_name);

// Quest's page choice is made inside the forward pass (it needs this step's queries) from plain
// data: the model's rule (forced slices + the best others by bound) must be the policy's.
TEST(QuestPageChoice, TheModelsRuleIsSparsitySelectPages) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> bound(-2.0f, 2.0f);
  for (int trial = 0; trial < 500; ++trial) {
    const int32_t page_size = 1 + static_cast<int32_t>(rng() % 16);
    const int64_t num_tokens = 1 + static_cast<int64_t>(rng() % 400);
    const int64_t num_pages = (num_tokens + page_size - 1) / page_size;
    const sparsity::PageSelectHead head{.top_k_pages = 1 + static_cast<int64_t>(rng() % 12),
                                        .reuse_steps = 1,
                                        .num_sinks = static_cast<int64_t>(rng() % 20),
                                        .window = static_cast<int64_t>(rng() % 40)};
    std::vector<float> bounds(static_cast<size_t>(num_pages));
    for (float& b : bounds) b = trial % 3 == 0 ? std::round(bound(rng)) : bound(rng);  // ties too
    if (trial % 7 == 0) bounds[rng() % bounds.size()] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(model::top_slices(bounds, sparsity::forced_pages(num_tokens, page_size, head),
                                static_cast<int32_t>(head.top_k_pages)),
              sparsity::select_pages(bounds, num_tokens, page_size, head))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace sieve::engine
