#pragma once
// --speculative-config: vLLM's JSON, with speculative::parse_speculative_config's errors, on every
// command that builds an engine from command-line options (serve, run, batch, bench-engine).
#include <CLI/CLI.hpp>

#include <string>

#include "engine/engine.h"
#include "speculative/speculative_config.h"
#include "util/error.h"

namespace sieve::cli {

// Adds --speculative-config to `command`, writing the parsed configuration into `config` (which
// must outlive the parse). Malformed JSON, an unknown key or an out-of-range value is a parse
// error naming the key.
inline CLI::Option* add_speculative_config_option(CLI::App& command,
                                                  speculative::SpeculativeConfig& config) {
  const CLI::Validator valid(
      [](std::string& text) -> std::string {
        try {
          (void)speculative::parse_speculative_config(text);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "JSON", "speculative config");
  return command
      .add_option_function<std::string>(
          "--speculative-config",
          [&config](const std::string& text) {
            config = speculative::parse_speculative_config(text);
          },
          "Speculative decoding, as vLLM's JSON: {\"method\": \"ngram\", "
          "\"num_speculative_tokens\": 4} (prompt lookup; also prompt_lookup_max/min) or "
          "{\"method\": \"self_sparse\", \"num_speculative_tokens\": 4, \"kv_policy\": "
          "\"streaming:S=4,W=1020\"} (the model drafts from a sink + window view of its own KV; or "
          "\"quest:K=64\": the top-64 pages by a q·k bound) or "
          "{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, \"model\": "
          "\"draft.gguf\"} (a smaller model with the same vocabulary drafts; it is loaded once, "
          "at start, and its KV pages come out of the same --kv-memory; requests may ask only "
          "for this draft file); disable_by_batch_size; \"adaptive\": true (each sequence's k "
          "moves in [1, num_speculative_tokens] with its acceptance). Output is unchanged (greedy; "
          "sampling "
          "for the same seed). Default: off")
      ->check(valid);
}

// Throws sieve::Error naming the option when `engine` cannot run `config` (e.g. a method this
// build does not have): checked once at start instead of refusing every request.
inline void check_speculative_option(const engine::Engine& engine,
                                     const speculative::SpeculativeConfig& config) {
  try {
    engine.check_speculative(config);
  } catch (const Error& e) {
    fail("--speculative-config {}: {}", speculative::to_json(config), e.what());
  }
}

}  // namespace sieve::cli
