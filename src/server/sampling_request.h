#pragma once
// The sampling part of a completions or chat body: the fields of engine::SamplingParams, and
// the constraint (response_format, grammar) the output must follow.
//
// Types are checked while reading; ranges in one place, engine::check_sampling_params (the
// engine applies the same check to every request it is given), through check_sampling, which
// names the field as the body did.
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "engine/sampler.h"
#include "grammar/grammar_cache.h"
#include "server/api_requests.h"

namespace sieve::server {

// Reads the sampling fields into `p` (types only); where the body is silent, `defaults`, else
// OpenAI's. The defaults' stop ids join the body's unless it ignores EOS.
void parse_sampling(ApiKind kind, const json& body, const hf::GenerationConfig& defaults,
                    engine::SamplingParams& p);

// Throws ApiException (400) when engine::check_sampling_params refuses `p`, its param the
// field's name in `body` (chat's top_logprobs, max_completion_tokens).
void check_sampling(ApiKind kind, const json& body, const engine::SamplingParams& p,
                    size_t vocab_size);

// What to constrain the output to: the parameter that asked and the grammar.
using Constraint = std::pair<std::string, grammar::GrammarSpec>;

// response_format (json_object, json_schema) or llama.cpp's `grammar` (GBNF text); nullopt for
// free text. Parameter errors are 400s naming the field.
std::optional<Constraint> parse_constraint(const json& body);

// Compiles (or finds in the model's cache) the constraint's grammar; 400 naming its parameter
// when the grammar is refused or the server has no constrained decoding.
std::shared_ptr<const grammar::TokenMasker> compile_constraint(const Constraint& constraint,
                                                               const ModelInfo& model);

}  // namespace sieve::server
