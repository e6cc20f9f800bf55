#pragma once
// Token sampling from one row of logits, with OpenAI/vLLM request semantics. Each sequence
// owns its Sampler (and so its RNG): the same seed and the same inputs give the same tokens
// whatever else runs in the batch.
//
// One step of Sampler::sample, in this order (vLLM v1 order; vLLM v0 order for the truncations):
//   raw logits ──► 0. constraint (constrained requests only): tokens the grammar does not
//        │            allow := -inf
//        ├──► logprobs (top-N and the sampled token's, of these logits' log-softmax: the raw
//        │    logits, or the raw logits restricted to the allowed set)
//        ├─ 1. logit_bias (additive), then min_tokens: stop/EOS ids := -inf while
//        │     num_output < min_tokens
//        ├─ 2. penalties: repetition (prompt ∪ output tokens), then frequency and presence
//        │     (output tokens only)
//        ├─ 3. temperature < kGreedyTemperature: argmax of the penalised logits, done
//        ├─ 4. / temperature, softmax
//        ├─ 5. top-k  (exactly k tokens; ties at the k-th logit go to the lowest id)
//        ├─ 6. top-p  (smallest most-likely prefix whose mass, over the top-k set, is >= top_p)
//        ├─ 7. min-p  (drop p < min_p * p_max)
//        └─ 8. draw one token from what is left (one 53-bit uniform from the sequence's RNG)
// The caller's logits are never written; processing happens in a scratch copy.
// A constrained sampler follows the sequence's output through its grammar state (advanced by
// each token of `history.output` it has not seen yet, so tokens accepted from a speculative
// draft advance it too). The grammar wins over min_tokens: when it allows only EOG, EOG is
// sampled. A grammar that cannot go on (too ambiguous to run, or a forced token it rejects)
// leaves only EOG allowed, so the output ends rather than leaving the grammar.
// Cost per step: O(V) for the copy and softmax, O(#distinct history tokens) for penalties,
// O(V log N) for top-N logprobs, O(V) expected for top-k/top-p selection (no full vocab sort
// unless top-p needs most of the vocabulary).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/admission.h"
#include "grammar/token_masker.h"

namespace sieve::engine {

using TokenId = int32_t;

// Below this temperature sampling is greedy (vLLM's epsilon).
inline constexpr float kGreedyTemperature = 1e-5f;
// Largest number of top logprobs a request may ask for (OpenAI chat allows 0..20).
inline constexpr int32_t kMaxTopLogprobs = 20;
// Upper bounds of temperature and repetition_penalty. Past them sampling is uniform, or a
// repeated token is gone, to float precision: a larger value is a mistake, refused.
inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;

struct SamplingParams {
  float temperature = 0.0f;  // [0, 100]; < kGreedyTemperature: greedy (argmax; ties: lowest id)
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // nucleus mass, (0, 1]
  float min_p = 0.0f;        // drop tokens with p < min_p * p_max, [0, 1]
  uint64_t seed = 0;         // the engine passes a random one when the request gives none

  // Penalties; the defaults are neutral.
  float repetition_penalty = 1.0f;  // (0, 100]; logit > 0 ? logit / p : logit * p, prompt ∪ output
  float presence_penalty = 0.0f;    // [-2, 2]; logit -= presence * [count > 0], output only
  float frequency_penalty = 0.0f;   // [-2, 2]; logit -= frequency * count, output only
  std::map<TokenId, float> logit_bias;  // token id -> additive bias, [-100, 100]
  int32_t min_tokens = 0;  // stop token ids and EOS are masked until this many are generated
  // Constrained decoding: only tokens the grammar allows at each step (and EOG only where the
  // grammar may end) can be sampled; the mask applies first, so logprobs, penalties and the
  // truncations all see the allowed set. Null: unconstrained. Shared by the request's samples;
  // each Sampler keeps its own grammar state.
  std::shared_ptr<const grammar::TokenMasker> constraint;

  // Stopping (see StopMatcher). A sequence finishes with "stop" on EOS (unless ignore_eos), on
  // one of stop_token_ids or on one of stop_strings, and with "length" after max_tokens.
  // nullopt: until the context is full; 0: none (the engine computes the prompt and finishes
  // with "length", e.g. to score it with prompt logprobs).
  std::optional<int32_t> max_tokens;
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop_strings;  // non-empty UTF-8 strings
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;

  // Output.
  // nullopt: no logprobs; 0: the sampled token's logprob only; N: also the top N (<= 20).
  std::optional<int32_t> logprobs;
  int32_t n = 1;  // samples per request, each with its own Sampler (see params_for_sample)

  // Evaluation only (not reachable from the HTTP API). The first forced_tokens.size() outputs
  // are these tokens instead of sampled ones (teacher forcing; logprobs still describe the
  // model's logits), and full_logprobs puts the whole distribution in SampleResult::top
  // (needs logprobs set).
  std::vector<TokenId> forced_tokens;
  bool full_logprobs = false;
};

// What is wrong with `params` for a model with `vocab_size` tokens (kInvalidParams, naming the
// field); nullopt when the parameters are valid. The one place the ranges of the sampling
// parameters are checked: the engine checks every request, the server every body (naming the
// field as the body did).
std::optional<AdmissionError> check_sampling_params(const SamplingParams& params,
                                                    int32_t vocab_size);

// The parameters of sample `sample_idx` in [0, n) of an n > 1 request: a copy with n = 1 and
// seed = request seed + sample_idx (as vLLM), so every sample is reproducible on its own.
SamplingParams params_for_sample(const SamplingParams& request, int32_t sample_idx);

// Token ids that end the sequence: stop_token_ids, plus the model's EOS ids unless ignore_eos.
// Sorted, without duplicates.
std::vector<TokenId> all_stop_token_ids(const SamplingParams& params,
                                        std::span<const TokenId> eos_token_ids);

struct TokenLogprob {
  TokenId id = 0;
  float logprob = 0.0f;
};

// The token history of one sequence. Both spans only ever grow between calls on the same
// Sampler (a shorter one, e.g. after a rollback, makes the Sampler recount from scratch).
struct SequenceTokens {
  std::span<const TokenId> prompt;
  std::span<const TokenId> output;  // generated so far, not including the token being sampled
};

struct SampleResult {
  TokenId token = 0;
  // log_softmax(raw logits)[token]; set when params.logprobs is set.
  std::optional<float> logprob;
  // The params.logprobs most likely tokens of the raw logits, largest first (ties: lowest id).
  std::vector<TokenLogprob> top;
};

class Sampler {
 public:
  // `eos_token_ids`: the model's end-of-generation ids, masked for min_tokens.
  explicit Sampler(SamplingParams params, std::span<const TokenId> eos_token_ids = {});
  const SamplingParams& params() const { return params_; }

  // One step for a sequence whose tokens so far are `history`. `logits` has one entry per
  // vocabulary token and is not modified. Amortised history cost: O(#new tokens) to update
  // counts, O(#distinct tokens) to apply penalties.
  SampleResult sample(std::span<const float> logits, const SequenceTokens& history);
  // Same as sample(logits, {}).token: for callers without a history (no penalties apply and
  // min_tokens sees zero output tokens).
  TokenId sample(std::span<const float> logits);

  // Steps 1-2 alone, as a copy: the logits after logit_bias, min_tokens and penalties for a
  // sequence whose tokens so far are `history` (for tests and processed-logits views). Updates
  // the history counts as sample() does.
  std::vector<float> processed_logits(std::span<const float> logits, const SequenceTokens& history);

 private:
  void update_history(const SequenceTokens& history);
  void update_grammar(std::span<const TokenId> output);
  // mask_ := what the grammar allows now (only EOG when it cannot go on).
  void fill_constraint_mask();
  // The logits with every token the grammar does not allow at -inf, in masked_.
  std::span<const float> apply_constraint(std::span<const float> logits);
  // Greedy's token among the allowed ones (ties: lowest id), without the masked copy; -1 when
  // nothing in range is allowed.
  TokenId constrained_argmax(std::span<const float> logits);
  bool needs_scratch(int64_t num_output) const;
  void apply_bias_and_penalties(std::span<float> logits, int64_t num_output) const;
  TokenId sample_truncated(std::span<const float> logits);

  SamplingParams params_;
  std::vector<TokenId> min_tokens_mask_ids_;  // stop ids masked while num_output < min_tokens
  std::mt19937_64 rng_;

  // Incremental history, caught up on each call to sample().
  size_t num_prompt_seen_ = 0;
  size_t num_output_seen_ = 0;
  std::vector<TokenId> prompt_ids_;                     // distinct prompt tokens, sorted
  std::unordered_map<TokenId, int32_t> output_counts_;  // output token -> occurrences

  // Constrained decoding: the grammar state after the first grammar_output_seen_ output tokens;
  // nullopt when unconstrained or when the grammar cannot go on (then only EOG is allowed).
  std::optional<grammar::GrammarState> grammar_state_;
  size_t grammar_output_seen_ = 0;
  grammar::TokenBitset mask_;
  std::vector<float> masked_;  // [V] raw logits restricted to the allowed tokens

  // Scratch, reused between steps.
  std::vector<float> logits_;                           // [V] processed logits
  std::vector<std::pair<double, TokenId>> candidates_;  // (unnormalised p, id)
};

TokenId argmax(std::span<const float> logits);
// The `count` most likely tokens with log-softmax values of the raw logits, largest first,
// ties to the lowest id. O(V log count) by a bounded heap; no sort of the vocabulary.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count);
// log_softmax(logits)[token], computed in double for accuracy.
double token_logprob(std::span<const float> logits, TokenId token);

}  // namespace sieve::engine
