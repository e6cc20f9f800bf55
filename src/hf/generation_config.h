#pragma once
// A Hugging Face folder's generation_config.json: the sampling defaults its authors chose, read
// as vLLM's `--generation-config auto` reads them (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens, and eos_token_id as one id or a list). Other fields
// (do_sample, num_beams, ...) are not applied by vLLM either, and are ignored here.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
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

// The sampling defaults of a model folder, and the file they came from: its
// generation_config.json, else config.json's eos_token_id (an id or a list, as transformers'
// GenerationConfig.from_model_config takes it when there is no generation_config.json; the
// first id is also the tokenizer's EOS, hf_tokenizer.h), else std::nullopt. Only eos_token_id
// is taken from config.json: the sampling fields an old config.json may hold are defaults
// transformers no longer reads from there.
std::optional<std::pair<std::string, GenerationConfig>> read_folder_generation_config(
    const std::string& folder);

}  // namespace sieve::hf
