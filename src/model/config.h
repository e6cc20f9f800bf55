#pragma once
// The shape of a Llama-family decoder, read from GGUF metadata (`<arch>.*` keys) or from a
// llama2.c checkpoint header. Everything the forward pass needs to know about the model's
// geometry lives here; weights live in Weights.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/rope.h"

namespace sieve::gguf {
class File;
}

namespace sieve::model {

using kernels::RopeOrdering;  // kNormal: pairs (2i, 2i+1), llama.cpp "normal"; kNeox: (i, i + n/2)

// `<arch>.rope.scaling.type`; Llama 3.1's scaling is no type but a rope_freqs tensor.
enum class RopeScaling : uint8_t { kNone, kLinear, kYarn };

struct RopeConfig {
  RopeOrdering ordering = RopeOrdering::kNormal;
  int64_t num_dims = 0;  // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
  RopeScaling scaling = RopeScaling::kNone;
  float freq_scale = 1.0f;  // linear and YaRN: 1 / rope.scaling.factor
  // Per-pair frequency divisors (Llama 3 "rope_freqs" tensor); empty = all 1.
  std::vector<float> freq_factors;
  float attn_factor = 1.0f;  // rope.scaling.attn_factor: cos and sin multiplied by it
  kernels::RopeYarn yarn;    // ext_factor 1 for YaRN, else 0

  // What the kernel needs for a head of head_dim values (freq_factors is a view of this).
  kernels::RopeParams params(int64_t head_dim) const;
};

struct ModelConfig {
  std::string architecture;  // general.architecture, one of supported_architectures()
  std::string name;
  int64_t dim = 0;  // embedding size
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA: num_heads % num_kv_heads == 0)
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  RopeConfig rope;
  // Keys older than this many positions are not attended (<arch>.attention.sliding_window, for
  // architectures that honour it: Mistral 7B v0.1 declares 4096).
  std::optional<int64_t> sliding_window;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t group_size() const { return num_heads / num_kv_heads; }

  // Throws sieve::Error if the numbers are inconsistent (zero sizes, heads not dividing, ...).
  void validate() const;
  std::string summary() const;
};

// Reads `general.architecture` and the `<arch>.*` keys (see model/architecture.h). Unknown
// architectures and missing required keys are errors naming the key. The vocabulary size comes from
// the tokenizer tokens array (or `<arch>.vocab_size`).
ModelConfig config_from_gguf(const gguf::File& file);

// What a user may change of a file's context at load, as llama.cpp's -c, --rope-scaling,
// --rope-scale and --yarn-orig-ctx do: run a model beyond the context it was trained for, with
// its RoPE stretched to fit (YaRN keeps the fast-turning pairs, which carry local position, as
// trained and interpolates the slow ones). Unset fields keep the file's values.
struct ContextOverrides {
  std::optional<int64_t> context_length;         // positions a sequence may use
  std::optional<RopeScaling> rope_scaling;       // replaces the file's scaling type
  std::optional<float> rope_scale;               // context scaling factor (freq_scale = 1 / it)
  std::optional<int64_t> yarn_original_context;  // YaRN's n_ctx_orig (default: the file's
                                                 // training context)
  bool empty() const {
    return !context_length && !rope_scaling && !rope_scale && !yarn_original_context;
  }
};
// Applies `overrides` to a config read from its file, then validates it (sieve::Error naming
// the bad value).
void apply_context_overrides(ModelConfig& config, const ContextOverrides& overrides);
std::optional<RopeScaling> parse_rope_scaling(std::string_view name);  // none, linear, yarn

}  // namespace sieve::model
