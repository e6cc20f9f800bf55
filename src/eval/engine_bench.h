#pragma once
// Measurements for `sieve bench-engine`: the paged continuous-batching Engine under load.
//   1. throughput vs concurrency: C requests submitted at once to one fresh Engine (prefix
//      caching off, so no request helps another), stepped to idle on the calling thread;
//   2. single-sequence decode speed vs context depth: one request with a D-token prompt
//      (chunked prefill, timed apart), then decode steps timed from the per-token Timings;
//      at each depth once per KV policy (sparsity/policy_spec.h), the first being the baseline
//      the others are compared with.
// Prompts are token ids drawn deterministically from the vocabulary (a different one per
// request), sampling is greedy with ignore_eos, so every run does the same work.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "sparsity/calibration.h"
#include "speculative/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace sieve::eval {

struct EngineBenchConfig {
  int32_t prompt_tokens = 512;
  int32_t output_tokens = 128;
  std::vector<int32_t> concurrency = {1, 4, 16, 64};
  std::vector<int32_t> depths = {0, 2048, 8192, 16384};
  int32_t depth_decode_tokens = 32;
  std::vector<std::string> depth_policies = {
      "full"};                              // kv_policy strings; the first is the baseline
  std::optional<uint64_t> kv_memory_bytes;  // nullopt: exactly enough pages for each point
  int32_t max_batch_tokens = 512;
  int32_t page_size = 16;
  kernels::DType kv_dtype = kernels::DType::kF32;
  bool precise_kv_heads = true;                // engine::EngineConfig's
  speculative::SpeculativeConfig speculative;  // every request's (off by default)
  // Speculative decoding at depth: each depth runs each kv_policy as configured, then with
  // each of these (same prompt, same greedy tokens; ratios against the first point).
  std::vector<speculative::SpeculativeConfig> depth_speculative;
  // > 0: the depth prompt is a random span of this many tokens repeated (text that repeats
  // itself, for prompt lookup); 0: random tokens throughout.
  int32_t depth_prompt_period = 0;
  // Depth > 0: each point runs its request a second time with its decode steps alternating with
  // a depth-0 twin's (DepthPoint::steady_ratio_vs_twin): a second prefill per point.
  bool depth_twin = false;
  // Non-empty: prompts are these tokens (e.g. held-out text) instead of random ones, repeated
  // where a prompt runs past the end: the depth prompt from the start (depth_prompt_period is
  // then unused), request i of a concurrency point from i prompt lengths in.
  std::vector<int32_t> prompt_text;
  // The model's KV-head calibration (`sieve calibrate`), for kv_policies that need one (lserve).
  std::shared_ptr<const sparsity::CalibrationProfile> calibration;
};

struct ConcurrencyPoint {
  int32_t concurrency = 0;
  int32_t num_kv_pages = 0;
  int64_t prompt_tokens = 0;     // over all requests
  int64_t generated_tokens = 0;  // over all requests
  double wall_seconds = 0.0;     // first submit to idle
  // Process CPU time (all threads) over the same span: on a shared machine it moves less than
  // wall time with what else runs there.
  double cpu_seconds = 0.0;
  double generated_tokens_per_cpu_s = 0.0;
  double generated_tokens_per_s = 0.0;
  double total_tokens_per_s = 0.0;  // (prompt + generated) / wall
  double mean_ttft_seconds = 0.0;
  double mean_tpot_seconds = 0.0;  // mean over requests of (total - ttft) / (completion - 1)
  // Steady decode: tokens sampled after the last request's first token, over the time from
  // then to the last token (all C sequences in the cache, one token each per step).
  int64_t decode_phase_tokens = 0;
  double decode_phase_seconds = 0.0;
  double decode_phase_tokens_per_s = 0.0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  double speedup_vs_c1 = 0.0;  // generated tok/s / the C=1 figure (0 when no C=1 point)
};

struct DepthPoint {
  int32_t depth = 0;                   // as asked (0: a 1-token prompt)
  std::string policy;                  // kv_policy, canonical
  std::string speculative = "none";    // the speculative config's method and k, or "none"
  int32_t spec_draft_tokens = 0;       // drafted and verified over the request
  int32_t spec_accepted_tokens = 0;    // of which accepted
  int32_t kv_pages = 0;                // KV pages the sequence held at its end
  int32_t kv_dense_pages = 0;          // what its tokens take dense
  uint64_t kv_bytes = 0;               // kv_pages in bytes
  uint64_t draft_kv_bytes = 0;         // draft_model: the draft's KV held at the end, in bytes
  double ratio_vs_baseline = 0.0;      // decode tok/s / the first policy's at this depth
  double itl_ratio_vs_baseline = 0.0;  // the first policy's ITL p50 / this one's
  int32_t prompt_tokens = 0;           // as run
  int32_t num_kv_pages = 0;
  double prompt_seconds = 0.0;  // submit to first token: the chunked prefill
  double prompt_tokens_per_s = 0.0;
  int32_t decode_tokens = 0;    // tokens after the first
  double decode_seconds = 0.0;  // first token to last
  double decode_tokens_per_s = 0.0;
  // Median time between two decode tokens: steady decode, without one-off work such as a
  // sparse policy's compression right after the first token (which the mean above includes).
  double itl_p50_seconds = 0.0;
  // The first decode step apart (one-off work: a sparse policy compresses the prompt there) and
  // the rate of the steps after it: what a step that reads the kept keys costs.
  double first_step_seconds = 0.0;
  double steady_tokens_per_s = 0.0;
  double steady_ratio_vs_depth0 = 0.0;  // steady tok/s / the depth-0 point's (the first one)
  // With depth_twin, depth > 0: the twin's steady rate (a 1-token prompt under the first policy,
  // as the depth-0 point) over steps alternating with a second run of this point's request, and
  // that run's steady rate over it. The machine's drifts between points (a neighbour on a shared
  // host, a busy second core) cancel out of the ratio.
  double twin_steady_tokens_per_s = 0.0;
  double steady_ratio_vs_twin = 0.0;
  bool twin_same_tokens = false;  // the second run generated the first run's tokens (greedy)
  // Process CPU time from the first token's event to the last: with one thread (-t 1) the
  // decode's own work, which wall time on a shared machine is not.
  double decode_cpu_seconds = 0.0;
  double cpu_ratio_vs_baseline = 0.0;  // the first policy's decode_cpu_seconds / this one's
  int64_t steps = 0;
  double ratio_vs_depth0 = 0.0;  // decode tok/s / the depth-0 figure (0 when no depth-0 point)
  std::vector<int32_t> tokens;   // generated (greedy)
  // tokens equal the first point's at this depth: what speculative decoding must keep.
  bool same_tokens_as_baseline = false;
};

struct EngineBenchResult {
  int threads = 0;
  std::vector<ConcurrencyPoint> concurrency;
  std::vector<DepthPoint> depths;
};

// The prompt of request `index`: `length` ids in [3, vocab) (above llama's unk/bos/eos),
// different for every index, the same on every run.
std::vector<int32_t> bench_prompt(int64_t vocab_size, int32_t length, uint64_t index);

ConcurrencyPoint measure_concurrency(const std::shared_ptr<const model::Model>& model,
                                     const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                                     const EngineBenchConfig& config, int32_t concurrency);
DepthPoint measure_depth(const std::shared_ptr<const model::Model>& model,
                         const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                         const EngineBenchConfig& config, int32_t depth,
                         const std::string& policy = "full",
                         const speculative::SpeculativeConfig* speculative = nullptr);

// Both tables; `on_point` (optional) is called after each point, e.g. to print progress.
struct EngineBenchProgress {
  std::function<void(const ConcurrencyPoint&)> on_concurrency;
  std::function<void(const DepthPoint&)> on_depth;
};
EngineBenchResult run_engine_bench(const std::shared_ptr<const model::Model>& model,
                                   const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                                   const EngineBenchConfig& config,
                                   const EngineBenchProgress& progress = {});

}  // namespace sieve::eval
