#include "hf/hf_model.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <numbers>
#include <optional>

#include "hf/hf_tokenizer.h"
#include "hf/json_file.h"
#include "hf/safetensors.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace sieve::hf {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct HfArchitecture {
  std::string_view hf_name;    // config.json "architectures"[0]
  std::string_view gguf_name;  // general.architecture, as llama.cpp's converter writes it
  bool permutes_qk;            // HF rotate_half vs GGUF normal RoPE (see hf_model.h)
  bool keeps_sliding_window;   // config.json sliding_window -> <arch>.attention.sliding_window
  double default_rms_eps;      // the transformers config class's default
};

constexpr std::array kArchitectures = {
    HfArchitecture{"LlamaForCausalLM", "llama", true, false, 1e-6},
    HfArchitecture{"MistralForCausalLM", "llama", true, true, 1e-6},
    HfArchitecture{"Qwen2ForCausalLM", "qwen2", false, false, 1e-6},
    HfArchitecture{"Qwen3ForCausalLM", "qwen3", false, false, 1e-6},
    // llama.cpp writes phi3's window, which it (and sieve) then ignores.
    HfArchitecture{"Phi3ForCausalLM", "phi3", false, true, 1e-5},
};

std::string supported_list() {
  std::string list;
  for (const HfArchitecture& arch : kArchitectures) {
    list += (list.empty() ? "" : ", ") + std::string(arch.hf_name);
  }
  return list;
}

// config.json's fields, with errors naming the file and the field.
class Config {
 public:
  Config(json value, std::string path) : json_(std::move(value)), path_(std::move(path)) {
    if (!json_.is_object()) fail("{}: not a JSON object", path_);
  }
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }
  const json& at(const char* key) const { return json_[key]; }

  std::optional<uint64_t> integer(const json& parent, const char* key) const {
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return std::nullopt;
    // Bounded like GGUF's counts: a size past 2^40 is hostile, not a model.
    if (!it->is_number_unsigned() || it->get<uint64_t>() > (uint64_t{1} << 40))
      fail("{}: \"{}\" is {}, expected a non-negative integer", path_, key, it->dump());
    return it->get<uint64_t>();
  }
  std::optional<uint64_t> integer(const char* key) const { return integer(json_, key); }
  uint64_t require_integer(const char* key) const {
    std::optional<uint64_t> value = integer(key);
    if (!value) fail("{}: no \"{}\"", path_, key);
    return *value;
  }
  std::optional<double> number(const json& parent, const char* key) const {
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return std::nullopt;
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      fail("{}: \"{}\" is {}, expected a number", path_, key, it->dump());
    return it->get<double>();
  }
  std::optional<double> number(const char* key) const { return number(json_, key); }
  std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    if (!json_[key].is_boolean()) fail("{}: \"{}\" is not true or false", path_, key);
    return json_[key].get<bool>();
  }

 private:
  json json_;
  std::string path_;
};

// What the File keeps alive: the mappings and every converted tensor.
struct FolderStorage {
  SafetensorsSet weights;
  std::deque<std::vector<uint8_t>> buffers;  // deque: earlier buffers never move

  std::span<const uint8_t> keep(std::vector<uint8_t> bytes) {
    buffers.push_back(std::move(bytes));
    return buffers.back();
  }
};

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// HF's names below "model.layers.<i>." and llama.cpp's below "blk.<i>.".
constexpr std::array<std::pair<std::string_view, std::string_view>, 17> kLayerTensors = {{
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // Phi-3: rows gate then up, as GGUF's
    {"self_attn.rotary_emb.inv_freq", ""},         // old checkpoints' RoPE cache: recomputed
}};

// The GGUF name of an HF tensor ("" to skip it), nullopt when unknown.
std::optional<std::string> gguf_tensor_name(std::string_view name, bool tied) {
  if (name == "model.embed_tokens.weight") return "token_embd.weight";
  if (name == "model.norm.weight") return "output_norm.weight";
  if (name == "lm_head.weight") return tied ? "" : "output.weight";  // tied: embed_tokens' copy
  constexpr std::string_view kLayerPrefix = "model.layers.";
  if (!name.starts_with(kLayerPrefix)) return std::nullopt;
  name.remove_prefix(kLayerPrefix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 6) return std::nullopt;
  const std::string_view layer = name.substr(0, dot);
  for (char c : layer) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  const std::string_view suffix = name.substr(dot + 1);
  for (const auto& [hf, gguf] : kLayerTensors) {
    if (suffix == hf) {
      if (gguf.empty()) return "";
      return fmt::format("blk.{}.{}", std::stoll(std::string(layer)), gguf);
    }
  }
  return std::nullopt;
}

// llama.cpp's LlamaModel.permute: within each of `num_heads` blocks of rows, row 2i + j comes
// from row j * (rows per head / 2) + i. Works on rows of any element type.
std::vector<uint8_t> permute_qk_rows(std::span<const uint8_t> data, uint64_t rows,
                                     uint64_t row_bytes, uint64_t num_heads,
                                     const std::string& name) {
  if (num_heads == 0 || rows % (2 * num_heads) != 0) {
    fail("tensor '{}' has {} rows, which do not split into {} heads of rotated pairs", name, rows,
         num_heads);
  }
  const uint64_t half = rows / num_heads / 2;
  std::vector<uint8_t> out(data.size());
  for (uint64_t head = 0; head < num_heads; ++head) {
    for (uint64_t i = 0; i < half; ++i) {
      for (uint64_t j = 0; j < 2; ++j) {
        const uint64_t to = head * 2 * half + 2 * i + j, from = head * 2 * half + j * half + i;
        std::memcpy(out.data() + to * row_bytes, data.data() + from * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

std::vector<float> to_f32(DType dtype, std::span<const uint8_t> data) {
  std::vector<float> values(data.size() / dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&values[i], data.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, data.data() + 2 * i, 2);
      values[i] = dtype == DType::kF16 ? kernels::f16_to_f32(bits) : kernels::bf16_to_f32(bits);
    }
  }
  return values;
}

gguf::TensorType tensor_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return gguf::TensorType::kF32;
    case DType::kF16:
      return gguf::TensorType::kF16;
    default:
      return gguf::TensorType::kBF16;
  }
}

// Llama 3.1's frequency divisors, as llama.cpp's converter computes them (float32 throughout).
std::vector<float> llama3_rope_freqs(const Config& config, const json& scaling, double theta,
                                     uint64_t head_dim) {
  const auto factor = static_cast<float>(config.number(scaling, "factor").value_or(8.0));
  const auto low = static_cast<float>(config.number(scaling, "low_freq_factor").value_or(1.0));
  const auto high = static_cast<float>(config.number(scaling, "high_freq_factor").value_or(4.0));
  const auto old_context = static_cast<float>(
      config.integer(scaling, "original_max_position_embeddings").value_or(8192));
  if (!(factor > 0) || !(high > low))
    fail("{}: rope_scaling llama3 needs factor > 0 and high_freq_factor > low_freq_factor",
         config.path());
  const float low_wavelen = old_context / low, high_wavelen = old_context / high;
  std::vector<float> factors;
  for (uint64_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                       static_cast<float>(i) / static_cast<float>(head_dim));
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(factor);
    } else {
      const float smooth = (old_context / wavelen - low) / (high - low);
      factors.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return factors;
}

std::vector<float> float_list(const Config& config, const json& parent, const char* key,
                              size_t size) {
  const auto it = parent.find(key);
  if (it == parent.end() || !it->is_array() || it->size() != size)
    fail("{}: rope_scaling \"{}\" must be a list of {} numbers", config.path(), key, size);
  std::vector<float> values;
  for (const json& item : *it) {
    if (!item.is_number())
      fail("{}: rope_scaling \"{}\" holds {}", config.path(), key, item.dump());
    values.push_back(item.get<float>());
  }
  return values;
}

const HfArchitecture& find_architecture(const Config& config) {
  if (!config.has("architectures") || !config.at("architectures").is_array() ||
      config.at("architectures").empty() || !config.at("architectures")[0].is_string()) {
    fail("{}: no \"architectures\" list naming the model class (sieve runs: {})", config.path(),
         supported_list());
  }
  const std::string name = config.at("architectures")[0].get<std::string>();
  for (const HfArchitecture& arch : kArchitectures) {
    if (arch.hf_name == name) return arch;
  }
  fail("{}: unsupported architecture '{}' (sieve runs: {})", config.path(), name, supported_list());
}

}  // namespace

bool is_model_folder(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) return fs::exists(fs::path(path) / "config.json", error);
  const std::string name = fs::path(path).filename().string();
  return name.ends_with(".safetensors") || name == "model.safetensors.index.json";
}

std::string model_folder(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) return path;
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

gguf::File open_model_folder(const std::string& path) {
  const fs::path folder = model_folder(path);
  const std::string config_path = (folder / "config.json").string();
  if (!fs::exists(config_path)) {
    fail("'{}' has no config.json: a Hugging Face model folder needs one beside its weights",
         folder.string());
  }
  const Config config(read_json_file(config_path), config_path);
  const HfArchitecture& arch = find_architecture(config);
  const std::string prefix = std::string(arch.gguf_name) + ".";

  // Hyperparameters, as convert_hf_to_gguf.py writes them.
  const uint64_t dim = config.require_integer("hidden_size");
  const uint64_t num_heads = config.require_integer("num_attention_heads");
  if (num_heads == 0) fail("{}: \"num_attention_heads\" is 0", config_path);
  const uint64_t num_kv_heads = config.integer("num_key_value_heads").value_or(num_heads);
  const std::optional<uint64_t> explicit_head_dim = config.integer("head_dim");
  const uint64_t head_dim = explicit_head_dim.value_or(dim / num_heads);
  const uint64_t context = config.require_integer("max_position_embeddings");
  const double theta = config.number("rope_theta").value_or(10000.0);
  const double partial_rotary = config.number("partial_rotary_factor").value_or(1.0);
  const auto rope_dims = static_cast<uint64_t>(static_cast<double>(head_dim) * partial_rotary);
  const bool tied = config.boolean("tie_word_embeddings").value_or(false);

  std::vector<gguf::KeyValue> metadata;
  auto set = [&](std::string key, gguf::Value value) {
    metadata.push_back({std::move(key), std::move(value)});
  };
  auto u32 = [&](const std::string& key, uint64_t value) {
    if (value > UINT32_MAX) fail("{}: value {} for {} is out of range", config_path, value, key);
    set(prefix + key, {static_cast<uint32_t>(value)});
  };
  auto f32 = [&](const std::string& key, double value) {
    set(prefix + key, {static_cast<float>(value)});
  };
  set("general.architecture", {std::string(arch.gguf_name)});
  set("general.name", {fs::absolute(folder).lexically_normal().filename().string()});
  u32("context_length", context);
  u32("embedding_length", dim);
  u32("block_count", config.require_integer("num_hidden_layers"));
  u32("feed_forward_length", config.require_integer("intermediate_size"));
  u32("attention.head_count", num_heads);
  u32("attention.head_count_kv", num_kv_heads);
  f32("rope.freq_base", theta);
  f32("attention.layer_norm_rms_epsilon",
      config.number("rms_norm_eps").value_or(arch.default_rms_eps));
  u32("rope.dimension_count", rope_dims);
  if (explicit_head_dim) {
    u32("attention.key_length", head_dim);
    u32("attention.value_length", head_dim);
  }
  if (auto vocab = config.integer("vocab_size")) u32("vocab_size", *vocab);
  // The tokenizer (tokenizer.json and friends), padded to the model's rows as the converter does.
  for (gguf::KeyValue& entry : tokenizer_metadata(folder.string(), config.integer("vocab_size")))
    metadata.push_back(std::move(entry));
  if (arch.keeps_sliding_window) {
    if (auto window = config.integer("sliding_window")) u32("attention.sliding_window", *window);
  } else if (config.boolean("use_sliding_window").value_or(false)) {
    fail("{}: use_sliding_window is not supported for {}", config_path, arch.hf_name);
  }

  auto storage = std::make_shared<FolderStorage>();
  std::vector<gguf::File::AssembledTensor> tensors;
  auto add_f32 = [&](std::string name, const std::vector<float>& values) {
    tensors.push_back({std::move(name),
                       gguf::TensorType::kF32,
                       {values.size()},
                       storage->keep(f32_bytes(values))});
  };

  // RoPE scaling: HF's rope_scaling as the keys and tensors llama.cpp's converter writes.
  if (config.has("rope_scaling")) {
    const json& scaling = config.at("rope_scaling");
    if (!scaling.is_object()) fail("{}: \"rope_scaling\" is not an object", config_path);
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (scaling.contains(key) && scaling[key].is_string()) {
        type = scaling[key].get<std::string>();
        break;
      }
    }
    const std::optional<double> factor = config.number(scaling, "factor");
    if (type == "linear" || type == "yarn") {
      if (!factor || *factor <= 0)
        fail("{}: rope_scaling '{}' needs a positive \"factor\"", config_path, type);
      set(prefix + "rope.scaling.type", {type});
      f32("rope.scaling.factor", *factor);
      if (type == "yarn") {
        u32("rope.scaling.original_context_length",
            config.integer(scaling, "original_max_position_embeddings").value_or(context));
        if (auto beta = config.number(scaling, "beta_fast"))
          f32("rope.scaling.yarn_beta_fast", *beta);
        if (auto beta = config.number(scaling, "beta_slow"))
          f32("rope.scaling.yarn_beta_slow", *beta);
        // HF's default attention factor is the one YaRN's RoPE applies itself (0.1 ln s + 1).
        if (auto attention = config.number(scaling, "attention_factor");
            attention && std::fabs(*attention - (0.1 * std::log(*factor) + 1.0)) > 1e-6) {
          fail("{}: rope_scaling yarn with attention_factor {} is not supported", config_path,
               *attention);
        }
      }
    } else if (type == "llama3" && arch.permutes_qk) {
      add_f32("rope_freqs.weight", llama3_rope_freqs(config, scaling, theta, head_dim));
    } else if ((type == "longrope" || type == "su") && arch.gguf_name == "phi3") {
      const uint64_t original =
          config.integer("original_max_position_embeddings").value_or(context);
      const double scale = static_cast<double>(context) / static_cast<double>(original);
      u32("rope.scaling.original_context_length", original);
      f32("rope.scaling.attn_factor",
          scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(original)))
                      : 1.0);
      add_f32("rope_factors_long.weight",
              float_list(config, scaling, "long_factor", rope_dims / 2));
      add_f32("rope_factors_short.weight",
              float_list(config, scaling, "short_factor", rope_dims / 2));
    } else if (type != "default") {
      fail("{}: rope_scaling type '{}' is not supported for {} (supported: linear, yarn{})",
           config_path, type, arch.hf_name,
           arch.permutes_qk           ? ", llama3"
           : arch.gguf_name == "phi3" ? ", longrope"
                                      : "");
    }
  }

  // Tensors: renamed, shapes reversed to ggml's order, Q/K permuted for llama.
  storage->weights = SafetensorsSet::open(path);
  bool has_output = false;
  for (const std::string& hf_name : storage->weights.names()) {
    const SafetensorsSet::Tensor tensor = *storage->weights.find(hf_name);
    const std::optional<std::string> name = gguf_tensor_name(hf_name, tied);
    if (!name) {
      fail("{}: tensor '{}' is not one sieve knows for {}", *tensor.file, hf_name, arch.hf_name);
    }
    if (name->empty()) continue;
    has_output = has_output || *name == "output.weight";
    const TensorInfo& info = *tensor.info;
    if (info.dtype != DType::kF32 && info.dtype != DType::kF16 && info.dtype != DType::kBF16) {
      fail("{}: tensor '{}' has dtype {}; sieve reads F32, F16 and BF16 weights", *tensor.file,
           hf_name, to_string(info.dtype));
    }
    if (info.shape.empty() || info.shape.size() > 2) {
      fail("{}: tensor '{}' has {} dimensions; expected a vector or a matrix", *tensor.file,
           hf_name, info.shape.size());
    }
    std::span<const uint8_t> data = tensor.data;
    const bool is_q = name->ends_with("attn_q.weight") || name->ends_with("attn_q.bias");
    const bool is_k = name->ends_with("attn_k.weight") || name->ends_with("attn_k.bias");
    if (arch.permutes_qk && (is_q || is_k)) {
      const uint64_t row_bytes =
          (info.shape.size() == 2 ? info.shape[1] : 1) * dtype_size(info.dtype);
      data = storage->keep(permute_qk_rows(data, info.shape[0], row_bytes,
                                           is_q ? num_heads : num_kv_heads, hf_name));
    }
    if (info.shape.size() == 1) {
      add_f32(*name, to_f32(info.dtype, data));
      continue;
    }
    tensors.push_back({*name, tensor_type(info.dtype), {info.shape[1], info.shape[0]}, data});
  }
  if (!tied && !has_output && storage->weights.find("model.embed_tokens.weight")) {
    fail(
        "'{}' has no lm_head.weight and config.json does not tie it to the embeddings "
        "(tie_word_embeddings)",
        path);
  }
  try {
    return gguf::File::assemble(std::move(metadata), std::move(tensors), std::move(storage));
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

}  // namespace sieve::hf
