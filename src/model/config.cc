#include "model/config.h"

#include <fmt/format.h>

#include <string_view>

#include "gguf/gguf.h"
#include "model/architecture.h"
#include "util/error.h"

namespace sieve::model {

namespace {

int64_t require_int(const gguf::File& file, const std::string& key) {
  std::optional<uint64_t> value = file.get_u64(key);
  if (!value) fail("model metadata is missing required key '{}'", key);
  if (*value > (uint64_t{1} << 40))
    fail("model metadata key '{}' has absurd value {}", key, *value);
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
  if (!(rope.freq_base > 0.0f) || !(rope.freq_scale > 0.0f))
    fail("RoPE base and scale must be positive");
  if (rope.yarn.ext_factor != 0.0f && rope.yarn.original_context <= 0) {
    fail("YaRN RoPE scaling needs a positive original context length, got {}",
         rope.yarn.original_context);
  }
  if (sliding_window && *sliding_window <= 0)
    fail("sliding window must be positive, got {}", *sliding_window);
}

kernels::RopeParams RopeConfig::params(int64_t head_dim) const {
  return {.ordering = ordering,
          .head_dim = head_dim,
          .num_dims = num_dims,
          .freq_base = freq_base,
          .freq_scale = freq_scale,
          .freq_factors = freq_factors,
          .attn_factor = attn_factor,
          .yarn = yarn};
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} '{}': dim {}, {} layers, {} heads / {} KV heads (head size {}), ffn {}, vocab {}, "
      "context {}, rope base {} ({}{}){}",
      architecture, name, dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim, vocab_size,
      context_length, rope.freq_base, rope.ordering == RopeOrdering::kNormal ? "normal" : "neox",
      rope.scaling == RopeScaling::kLinear ? fmt::format(", linear x{}", 1.0f / rope.freq_scale)
      : rope.scaling == RopeScaling::kYarn
          ? fmt::format(", yarn x{} from {}", 1.0f / rope.freq_scale, rope.yarn.original_context)
      : !rope.freq_factors.empty() ? ", rope_freqs"
                                   : "",
      sliding_window ? fmt::format(", sliding window {}", *sliding_window) : "");
}

ModelConfig config_from_gguf(const gguf::File& file) {
  ModelConfig config;
  std::optional<std::string> arch_name = file.get_string("general.architecture");
  if (!arch_name)
    fail("model metadata has no 'general.architecture' (sieve runs: {})",
         supported_architectures());
  const Architecture& arch = find_architecture(*arch_name);
  config.architecture = *arch_name;
  config.name = file.get_string("general.name").value_or("");
  const std::string prefix = *arch_name + ".";
  config.dim = require_int(file, prefix + "embedding_length");
  config.num_layers = require_int(file, prefix + "block_count");
  config.num_heads = require_int(file, prefix + "attention.head_count");
  config.num_kv_heads = static_cast<int64_t>(
      file.get_u64(prefix + "attention.head_count_kv").value_or(config.num_heads));
  config.ffn_dim = require_int(file, prefix + "feed_forward_length");
  config.context_length = require_int(file, prefix + "context_length");
  if (config.num_heads <= 0) fail("'{}attention.head_count' must be positive", prefix);
  // Qwen3 and others: head_dim from key_length, and num_heads * head_dim may differ from dim.
  config.head_dim = static_cast<int64_t>(
      file.get_u64(prefix + "attention.key_length").value_or(config.dim / config.num_heads));
  if (auto value_length = file.get_u64(prefix + "attention.value_length");
      value_length && static_cast<int64_t>(*value_length) != config.head_dim) {
    fail("key length {} != value length {} is not supported", config.head_dim, *value_length);
  }
  config.rms_eps =
      static_cast<float>(file.get_f64(prefix + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (arch.honours_sliding_window) {
    if (auto window = file.get_u64(prefix + "attention.sliding_window"); window && *window > 0) {
      config.sliding_window = static_cast<int64_t>(*window);
    }
  }

  RopeConfig& rope = config.rope;
  rope.ordering = arch.rope_ordering;
  rope.num_dims =
      static_cast<int64_t>(file.get_u64(prefix + "rope.dimension_count").value_or(config.head_dim));
  rope.freq_base = static_cast<float>(file.get_f64(prefix + "rope.freq_base").value_or(10000.0));
  rope.attn_factor =
      static_cast<float>(file.get_f64(prefix + "rope.scaling.attn_factor").value_or(1.0));
  std::string scaling_type = file.get_string(prefix + "rope.scaling.type").value_or("none");
  double scaling_factor = file.get_f64(prefix + "rope.scaling.factor").value_or(0.0);
  if (auto legacy = file.get_f64(prefix + "rope.scale_linear")) {
    scaling_type = "linear";
    scaling_factor = *legacy;
  }
  if (scaling_type == "linear" || scaling_type == "yarn") {
    // As llama.cpp: a factor of 0 (absent) means no scaling of the frequencies.
    if (scaling_factor > 0.0) rope.freq_scale = static_cast<float>(1.0 / scaling_factor);
    rope.scaling = scaling_type == "linear" ? RopeScaling::kLinear : RopeScaling::kYarn;
  } else if (scaling_type != "none" && !scaling_type.empty()) {
    fail(
        "RoPE scaling type '{}' ({}rope.scaling.type) is not supported (supported: none, linear, "
        "yarn; Llama 3.1 "
        "scaling comes as a rope_freqs tensor)",
        scaling_type, prefix);
  }
  if (rope.scaling == RopeScaling::kYarn) {
    // llama.cpp's defaults; the optional keys override them.
    rope.yarn.ext_factor =
        static_cast<float>(file.get_f64(prefix + "rope.scaling.yarn_ext_factor").value_or(1.0));
    rope.yarn.beta_fast =
        static_cast<float>(file.get_f64(prefix + "rope.scaling.yarn_beta_fast").value_or(32.0));
    rope.yarn.beta_slow =
        static_cast<float>(file.get_f64(prefix + "rope.scaling.yarn_beta_slow").value_or(1.0));
    rope.yarn.original_context =
        static_cast<int64_t>(file.get_u64(prefix + "rope.scaling.original_context_length")
                                 .value_or(config.context_length));
  }

  if (auto tokens = file.find("tokenizer.ggml.tokens");
      tokens && tokens->type() == gguf::ValueType::kArray) {
    config.vocab_size = static_cast<int64_t>(std::get<gguf::Array>(tokens->data).items.size());
  } else if (auto vocab_size = file.get_u64(prefix + "vocab_size")) {
    config.vocab_size = static_cast<int64_t>(*vocab_size);
  }
  return config;
}

std::optional<RopeScaling> parse_rope_scaling(std::string_view name) {
  if (name == "none") return RopeScaling::kNone;
  if (name == "linear") return RopeScaling::kLinear;
  if (name == "yarn") return RopeScaling::kYarn;
  return std::nullopt;
}

void apply_context_overrides(ModelConfig& config, const ContextOverrides& overrides) {
  if (overrides.empty()) return;
  // YaRN's ramp is measured against the context the model was trained for, so take it before
  // the served context replaces it.
  const int64_t trained_context = config.context_length;
  RopeConfig& rope = config.rope;
  if (overrides.rope_scaling) rope.scaling = *overrides.rope_scaling;
  if (overrides.rope_scale) {
    if (!(*overrides.rope_scale >= 1.0f))
      fail("RoPE scale must be at least 1 (the factor the context is stretched by), got {}",
           *overrides.rope_scale);
    rope.freq_scale = 1.0f / *overrides.rope_scale;
    // A factor with no type stretches linearly, as llama.cpp does with --rope-scale alone.
    if (rope.scaling == RopeScaling::kNone) rope.scaling = RopeScaling::kLinear;
  }
  if (rope.scaling == RopeScaling::kNone) {
    rope.freq_scale = 1.0f;
    rope.yarn = {};
  } else if (rope.scaling == RopeScaling::kLinear) {
    rope.yarn = {};
  } else if (rope.yarn.ext_factor == 0.0f) {  // newly YaRN: llama.cpp's defaults
    rope.yarn = {.ext_factor = 1.0f,
                 .beta_fast = 32.0f,
                 .beta_slow = 1.0f,
                 .original_context = trained_context};
  }
  if (overrides.yarn_original_context) {
    if (rope.scaling != RopeScaling::kYarn)
      fail("--yarn-orig-ctx applies to YaRN RoPE scaling only (this model's is {})",
           rope.scaling == RopeScaling::kLinear ? "linear" : "none");
    rope.yarn.original_context = *overrides.yarn_original_context;
  }
  if (overrides.context_length) config.context_length = *overrides.context_length;
  config.validate();
}

}  // namespace sieve::model
