#pragma once
// One sequence, one sample of one request: what the engine's stages keep about it between steps
// (engine/engine.h). The scheduler holds its tokens and the KV manager its pages; this holds the
// rest, by stage.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_snapshot.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "sched/scheduler.h"
#include "sparsity/controller.h"
#include "speculative/draft_length.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {

// One sequence: one sample of one request.
struct Sample {
  RequestId request_id = 0;
  int32_t sample_idx = 0;
  std::shared_ptr<EventSink> sink;
  SamplingParams params;
  Sampler sampler;
  StopMatcher stop;
  int32_t num_prompt_tokens = 0;
  int32_t num_samples_to_fork = 0;  // n - 1 on the first sample until its first token
  // For KV snapshots only: the request's label and canonical kv_policy (shared by its samples).
  std::shared_ptr<const RequestLabel> label;
  std::shared_ptr<const std::string> policy_name;

  // The output stage's (engine/output_stage.h): timings, and prompt logprobs
  // (Request::prompt_logprobs): the top N per row; the prompt tokens' entries so far ([0]: the
  // first token's, without logprob), until the prompt is done; then the result the sample's
  // first event carries (moved out when sent).
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled;
  int32_t cached_prompt_tokens = 0;
  // Of those, the tokens taken over from a parked compressed state (a next turn).
  int32_t continued_prompt_tokens = 0;
  Timings timings;
  std::optional<int32_t> prompt_logprobs;
  std::vector<SampleResult> prompt_rows;
  std::shared_ptr<const std::vector<SampleResult>> unsent_prompt_logprobs;

  // The sparsity driver's (engine/sparsity_driver.h).
  std::unique_ptr<sparsity::SparsityController> sparsity;  // null: dense
  int32_t chunk_boundary = 0;                              // SparseAdmission's
  std::optional<float> attention_recovery;                 // from the compression

  // Request::given_output / then_prompt (the continuation reference): what is left of them.
  std::vector<TokenId> given_output;
  size_t num_given_used = 0;
  std::vector<TokenId> then_prompt;

  // The speculative driver's (engine/speculative_driver.h).
  speculative::SpeculativeConfig speculative;            // the request's, or the server's
  std::optional<speculative::DraftLength> draft_length;  // speculative.adaptive: this sequence's k
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;

  Sample(RequestId request, int32_t idx, std::shared_ptr<EventSink> event_sink,
         const SamplingParams& p, std::span<const TokenId> eos, int32_t prompt_tokens,
         Clock::time_point arrived)
      : request_id(request),
        sample_idx(idx),
        sink(std::move(event_sink)),
        params(p),
        sampler(p, eos),
        stop(p, eos),
        num_prompt_tokens(prompt_tokens),
        arrival(arrived) {}
};

// The engine's live sequences (owned by the stepping thread).
using Samples = std::unordered_map<sched::SeqId, std::unique_ptr<Sample>>;

}  // namespace sieve::engine
