#pragma once
// The evaluations' way through the engine: a list of greedy requests (prompt, forced tokens,
// policy) submitted together to one engine, run to the end, their outputs collected in order.
// An evaluation that can reuse prefixes submits in waves on the same engine (its prefix cache
// keeps what earlier waves computed).
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace sieve::eval {

struct EvalRequest {
  std::vector<tok::TokenId> prompt;
  // Teacher forcing: the first outputs (engine::SamplingParams::forced_tokens).
  std::vector<tok::TokenId> forced;
  int32_t max_tokens = 0;  // outputs, the forced ones included
  std::string policy;      // sparsity::parse_policy's grammar
  std::optional<int32_t> logprobs;
  bool full_logprobs = false;
  bool ignore_eos = true;
};

struct EvalOutput {
  std::vector<tok::TokenId> tokens;         // every output, the forced ones first
  std::vector<engine::SampleResult> steps;  // per output, with logprobs
  engine::Usage usage;
};

// Submits every request, steps the engine until all finish and returns their outputs in the
// order given. A refused or failed request throws sieve::Error naming its policy.
std::vector<EvalOutput> run_eval_requests(engine::Engine& engine,
                                          std::span<const EvalRequest> requests);

}  // namespace sieve::eval
