#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "gguf/gguf.h"
#include "util/error.h"

namespace sieve::model {

namespace {

// Architectures whose tensors and hyper-parameters follow llama's layout, and the RoPE
// ordering their GGUF conversion uses.
struct KnownArch {
  std::string_view name;
  RopeOrdering ordering;
};
constexpr std::array kKnownArchs = {
    KnownArch{"llama", RopeOrdering::kNormal},
    KnownArch{"mistral", RopeOrdering::kNormal},
};

int64_t require_int(const gguf::File& file, const std::string& key) {
  std::optional<uint64_t> value = file.get_u64(key);
  if (!value) fail("model metadata is missing required key '{}'", key);
  if (*value > (uint64_t{1} << 40)) fail("model metadata key '{}' has absurd value {}", key, *value);
  return static_cast<int64_t>(*value);
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](int64_t value, std::string_view what) {
    if (value <= 0) fail("model {} must be positive, got {}", what, value);
  };
  positive(dim, "embedding size");
  positive(num_layers, "layer count");
  positive(num_heads, "head count");
  positive(num_kv_heads, "KV head count");
  positive(head_dim, "head size");
  positive(ffn_dim, "feed-forward size");
  positive(vocab_size, "vocabulary size");
  positive(context_length, "context length");
  if (num_heads % num_kv_heads != 0) {
    fail("head count {} is not a multiple of the KV head count {}", num_heads, num_kv_heads);
  }
  if (rope.num_dims <= 0 || rope.num_dims > head_dim || rope.num_dims % 2 != 0) {
    fail("RoPE dimension count {} must be even and in (0, head size {}]", rope.num_dims, head_dim);
  }
  if (!rope.freq_factors.empty() &&
      static_cast<int64_t>(rope.freq_factors.size()) != rope.num_dims / 2) {
    fail("rope_freqs has {} entries, expected {}", rope.freq_factors.size(), rope.num_dims / 2);
  }
  if (!(rms_eps > 0.0f)) fail("RMSNorm epsilon must be positive");
  if (!(rope.freq_base > 0.0f) || !(rope.freq_scale > 0.0f)) fail("RoPE base and scale must be positive");
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} '{}': dim {}, {} layers, {} heads / {} KV heads (head size {}), ffn {}, vocab {}, "
      "context {}, rope base {} ({})",
      architecture, name, dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim,
      vocab_size, context_length, rope.freq_base,
      rope.ordering == RopeOrdering::kNormal ? "normal" : "neox");
}

ModelConfig config_from_gguf(const gguf::File& file) {
  ModelConfig config;
  std::optional<std::string> arch = file.get_string("general.architecture");
  if (!arch) fail("model metadata has no 'general.architecture'");
  auto known = std::find_if(kKnownArchs.begin(), kKnownArchs.end(),
                            [&](const KnownArch& k) { return k.name == *arch; });
  if (known == kKnownArchs.end()) {
    fail("unsupported model architecture '{}' (sieve runs llama-family models: llama, mistral)",
         *arch);
  }
  config.architecture = *arch;
  config.name = file.get_string("general.name").value_or("");
  const std::string prefix = *arch + ".";
  config.dim = require_int(file, prefix + "embedding_length");
  config.num_layers = require_int(file, prefix + "block_count");
  config.num_heads = require_int(file, prefix + "attention.head_count");
  config.num_kv_heads =
      static_cast<int64_t>(file.get_u64(prefix + "attention.head_count_kv").value_or(config.num_heads));
  config.ffn_dim = require_int(file, prefix + "feed_forward_length");
  config.context_length = require_int(file, prefix + "context_length");
  if (config.num_heads <= 0) fail("'{}attention.head_count' must be positive", prefix);
  config.head_dim = static_cast<int64_t>(
      file.get_u64(prefix + "attention.key_length").value_or(config.dim / config.num_heads));
  if (auto value_length = file.get_u64(prefix + "attention.value_length");
      value_length && static_cast<int64_t>(*value_length) != config.head_dim) {
    fail("key length {} != value length {} is not supported", config.head_dim, *value_length);
  }
  config.rms_eps = static_cast<float>(
      file.get_f64(prefix + "attention.layer_norm_rms_epsilon").value_or(1e-5));

  config.rope.ordering = known->ordering;
  config.rope.num_dims =
      static_cast<int64_t>(file.get_u64(prefix + "rope.dimension_count").value_or(config.head_dim));
  config.rope.freq_base = static_cast<float>(file.get_f64(prefix + "rope.freq_base").value_or(10000.0));
  std::string scaling_type = file.get_string(prefix + "rope.scaling.type").value_or("none");
  double scaling_factor = file.get_f64(prefix + "rope.scaling.factor").value_or(0.0);
  if (auto legacy = file.get_f64(prefix + "rope.scale_linear")) {
    scaling_type = "linear";
    scaling_factor = *legacy;
  }
  if (scaling_type == "linear") {
    if (scaling_factor > 0.0) config.rope.freq_scale = static_cast<float>(1.0 / scaling_factor);
  } else if (scaling_type != "none" && !(scaling_type.empty())) {
    fail("RoPE scaling type '{}' is not supported (supported: none, linear, llama3 rope_freqs)",
         scaling_type);
  }

  if (auto tokens = file.find("tokenizer.ggml.tokens");
      tokens && tokens->type() == gguf::ValueType::kArray) {
    config.vocab_size = static_cast<int64_t>(std::get<gguf::Array>(tokens->data).items.size());
  } else if (auto vocab_size = file.get_u64(prefix + "vocab_size")) {
    config.vocab_size = static_cast<int64_t>(*vocab_size);
  }
  return config;
}

}  // namespace sieve::model
