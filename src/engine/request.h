#pragma once
// What a caller hands the engine (Request) and what it hears back (RequestEvent, per sample and
// step, with Usage and Timings when the sample finishes).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/admission.h"
#include "engine/kv_snapshot.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;
struct Request {
  std::vector<TokenId> prompt;
  SamplingParams params;
  // Which KV to keep (sparsity/policy_spec.h); the default keeps everything. The engine runs the
  // per-(layer, KV head) plans made of full, sink + window (streaming), observation-window
  // top-B (snapkv, pyramidkv), heavy-hitter (h2o) and page-selecting (quest, lserve) heads,
  // composed by layerwise / heads / layers; others are refused.
  sparsity::PolicySpec kv_policy;
  // Overrides EngineConfig::speculative for this request ({"method": "none"} turns it off).
  std::optional<speculative::SpeculativeConfig> speculative;
  // Prompt logprobs (vLLM's prompt_logprobs): nullopt: none; N in [0, kMaxTopLogprobs]: each
  // prompt token's log-probability given the tokens before it, and the top N there
  // (RequestEvent::prompt_logprobs). Such a request computes its whole prompt: it takes no
  // prefix-cache hit (cached tokens have no logits), though it publishes its pages for others.
  // Each prompt row is reduced to (logprob, top N) in the step that computes it. With a sparse
  // kv_policy compressed chunk by chunk, a later chunk's rows attend to the keys kept so far
  // (what the model really computed); compressed only at the prompt's end, they are dense.
  std::optional<int32_t> prompt_logprobs;
  // Echoed back in KV snapshots only (engine/kv_snapshot.h).
  RequestLabel label;
  // The reference a continued conversation is defined by (EngineConfig::max_parked_share): one
  // sequence that prefills `prompt`, takes `given_output` as its first sampled tokens whatever
  // the logits say, then prefills `then_prompt` after them as a second prompt (compressed at its
  // chunk boundaries and end as a prompt is) and samples on. Tests compare a continued request
  // with it; empty: a plain request.
  std::vector<TokenId> given_output;
  std::vector<TokenId> then_prompt;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  // Of those, the tokens taken over from a parked compressed state (a next turn).
  int32_t continued_prompt_tokens = 0;
  // KV pages the sequence held when it finished, and what the same tokens take dense; the same
  // in bytes (pages x the cache's bytes per page: its dtype's).
  int32_t kv_pages = 0;
  int32_t kv_dense_pages = 0;
  int64_t kv_bytes = 0;
  int64_t kv_dense_bytes = 0;
  // Attention mass the kept keys received from the observation rows, over all keys, averaged
  // over the scored streams (SnapKV/PyramidKV/H2O); unset when no stream was scored.
  std::optional<float> attention_recovery;
  // Speculative decoding: draft tokens proposed and verified, and how many of them the target
  // accepted (the tokens sampled after them are not counted).
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;
  // draft_model: the pages the draft model's KV held for this sample when it finished (beside
  // kv_pages, in the draft's pool), and their bytes.
  int32_t spec_draft_kv_pages = 0;
  int64_t spec_draft_kv_bytes = 0;
};

struct Timings {
  double queue_seconds = 0.0;         // arrival to first scheduled
  double first_token_seconds = 0.0;   // arrival to first sampled token (TTFT)
  double total_seconds = 0.0;         // arrival to finish
  std::vector<double> token_seconds;  // arrival to each sampled token
};

// One step's news for one sample of one request.
struct RequestEvent {
  RequestId request_id = 0;
  int32_t sample_idx = 0;
  std::vector<TokenId> tokens;         // sampled this step (more than one: accepted drafts)
  std::string text;                    // text now safe to stream (may be empty: held back)
  std::vector<SampleResult> logprobs;  // per token, when the request asked for logprobs
  // Request::prompt_logprobs, on each sample's first event (null otherwise): [prompt tokens],
  // in order; entry i holds prompt token i, its logprob under the logits at position i - 1 and
  // the top N there (largest first, ties to the lowest id); entry 0 has neither (nothing comes
  // before it). Shared by the request's samples.
  std::shared_ptr<const std::vector<SampleResult>> prompt_logprobs;
  std::optional<Finish> finish;
  std::optional<std::string> error;  // the request failed; finish is set too
  bool cancelled = false;            // the error is cancel()'s
  // The error is a refusal found when the engine came to admit the request after submit()
  // accepted it (the queue filled meanwhile): what submit() would have returned.
  std::optional<AdmissionError> refused;
  Usage usage;      // meaningful with finish
  Timings timings;  // meaningful with finish
};
using EventSink = std::function<void(const RequestEvent&)>;

}  // namespace sieve::engine
