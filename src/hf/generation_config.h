#pragma once
// A Hugging Face folder's generation_config.json: the sampling defaults its authors chose, read
// as vLLM's `--generation-config auto` reads them (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens, and eos_token_id as one id or a list). Other fields
// (do_sample, num_beams, ...) are not applied by vLLM either, and are ignored here.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sieve::hf {

struct GenerationConfig {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int32_t> max_new_tokens;
  std::vector<int32_t> eos_token_ids;

  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty && !max_new_tokens &&
           eos_token_ids.empty();
  }
};

// Reads `path` (a generation_config.json). A field of the wrong type or out of range is a
// sieve::Error naming the file and the field; a null field counts as absent.
GenerationConfig read_generation_config(const std::string& path);

// The folder's generation_config.json, if it has one.
std::optional<std::string> find_generation_config(const std::string& folder);

}  // namespace sieve::hf
