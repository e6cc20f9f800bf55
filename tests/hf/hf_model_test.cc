// Hugging Face folders against GGUF: for each architecture, random weights written by hand as a
// safetensors folder (HF names, HF's Q/K row order, config.json) and as a GGUF (llama.cpp's
// names and keys, written with the project's gguf::Writer) must give the same logits; malformed
// or unsupported folders are errors naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <random>

#include "cli/run_sieve.h"
#include "gguf/gguf.h"
#include "hf/hf_model.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "safetensors_writer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::StTensor;

struct ArchCase {
  std::string label;
  std::string hf_arch;
  std::string gguf_arch;
  std::string dtype = "F32";
  int64_t dim = 64, num_layers = 2, num_heads = 4, num_kv_heads = 2, head_dim = 16, ffn_dim = 96,
          vocab = 96;
  bool explicit_head_dim = false, tied = false, qkv_bias = false, qk_norm = false, fused = false,
       permute_qk = false, sharded = false;
  std::optional<int64_t> sliding_window;
  json rope_scaling = nullptr;
  float rope_theta = 10000.0f;
};

// One tensor in HF's layout: row-major values already rounded to the case's dtype.
struct HfTensor {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<float> values;
};

uint16_t to_half(const std::string& dtype, float value) {
  return dtype == "F16" ? kernels::f32_to_f16(value) : kernels::f32_to_bf16(value);
}
float from_half(const std::string& dtype, uint16_t bits) {
  return dtype == "F16" ? kernels::f16_to_f32(bits) : kernels::bf16_to_f32(bits);
}

std::vector<uint8_t> encode(const std::string& dtype, const std::vector<float>& values) {
  std::vector<uint8_t> bytes;
  for (float value : values) {
    if (dtype == "F32") {
      const auto* raw = reinterpret_cast<const uint8_t*>(&value);
      bytes.insert(bytes.end(), raw, raw + 4);
    } else {
      const uint16_t bits = to_half(dtype, value);
      bytes.push_back(static_cast<uint8_t>(bits));
      bytes.push_back(static_cast<uint8_t>(bits >> 8));
    }
  }
  return bytes;
}

std::vector<HfTensor> random_weights(const ArchCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<HfTensor> tensors;
  auto add = [&](std::string name, std::vector<uint64_t> shape, float scale, float offset = 0) {
    uint64_t count = 1;
    for (uint64_t size : shape) count *= size;
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> values(count);
    for (float& value : values) {
      value = offset + dist(rng);
      if (c.dtype != "F32") value = from_half(c.dtype, to_half(c.dtype, value));
    }
    tensors.push_back({std::move(name), std::move(shape), std::move(values)});
  };
  const uint64_t dim = c.dim, q_dim = c.num_heads * c.head_dim,
                 kv_dim = c.num_kv_heads * c.head_dim, ffn = c.ffn_dim;
  const float in_scale = 1.7f / std::sqrt(static_cast<float>(dim));
  add("model.embed_tokens.weight", {static_cast<uint64_t>(c.vocab), dim}, 1.0f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {dim}, 0.2f, 1.0f);
    if (c.fused) {
      add(p + "self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, dim}, in_scale);
    } else {
      add(p + "self_attn.q_proj.weight", {q_dim, dim}, in_scale);
      add(p + "self_attn.k_proj.weight", {kv_dim, dim}, in_scale);
      add(p + "self_attn.v_proj.weight", {kv_dim, dim}, in_scale);
    }
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q_dim}, 0.5f);
      add(p + "self_attn.k_proj.bias", {kv_dim}, 0.5f);
      add(p + "self_attn.v_proj.bias", {kv_dim}, 0.5f);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {static_cast<uint64_t>(c.head_dim)}, 0.2f, 1.0f);
      add(p + "self_attn.k_norm.weight", {static_cast<uint64_t>(c.head_dim)}, 0.2f, 1.0f);
    }
    add(p + "self_attn.o_proj.weight", {dim, q_dim}, 1.7f / std::sqrt(static_cast<float>(q_dim)));
    add(p + "post_attention_layernorm.weight", {dim}, 0.2f, 1.0f);
    if (c.fused) {
      add(p + "mlp.gate_up_proj.weight", {2 * ffn, dim}, in_scale);
    } else {
      add(p + "mlp.gate_proj.weight", {ffn, dim}, in_scale);
      add(p + "mlp.up_proj.weight", {ffn, dim}, in_scale);
    }
    add(p + "mlp.down_proj.weight", {dim, ffn}, 1.7f / std::sqrt(static_cast<float>(ffn)));
  }
  add("model.norm.weight", {dim}, 0.2f, 1.0f);
  if (!c.tied) add("lm_head.weight", {static_cast<uint64_t>(c.vocab), dim}, in_scale * 2);
  return tensors;
}

json config_json(const ArchCase& c) {
  json config = {{"architectures", {c.hf_arch}},
                 {"hidden_size", c.dim},
                 {"num_hidden_layers", c.num_layers},
                 {"num_attention_heads", c.num_heads},
                 {"num_key_value_heads", c.num_kv_heads},
                 {"intermediate_size", c.ffn_dim},
                 {"vocab_size", c.vocab},
                 {"max_position_embeddings", 256},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", c.rope_theta},
                 {"tie_word_embeddings", c.tied},
                 {"torch_dtype", "bfloat16"},
                 {"rope_scaling", c.rope_scaling}};
  if (c.explicit_head_dim) config["head_dim"] = c.head_dim;
  if (c.sliding_window) config["sliding_window"] = *c.sliding_window;
  return config;
}

// A temporary folder holding the case's HF files; removed at the end.
struct HfFolder {
  fs::path dir;
  explicit HfFolder(const ArchCase& c, const std::vector<HfTensor>& tensors) {
    dir =
        fs::temp_directory_path() / ("sieve_hf_test_" + std::to_string(::getpid()) + "_" + c.label);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config_json(c).dump(2);
    std::vector<StTensor> files[2];
    json weight_map = json::object();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t shard = c.sharded ? i % 2 : 0;
      files[shard].push_back(
          {tensors[i].name, c.dtype, tensors[i].shape, encode(c.dtype, tensors[i].values)});
      weight_map[tensors[i].name] = fmt::format("model-0000{}-of-00002.safetensors", shard + 1);
    }
    if (c.sharded) {
      for (size_t shard = 0; shard < 2; ++shard) {
        testing::write_bytes(dir / fmt::format("model-0000{}-of-00002.safetensors", shard + 1),
                             testing::safetensors_bytes(files[shard]));
      }
      std::ofstream(dir / "model.safetensors.index.json")
          << json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump();
    } else {
      testing::write_bytes(dir / "model.safetensors",
                           testing::safetensors_bytes(files[0], {{"format", "pt"}}));
    }
  }
  ~HfFolder() { fs::remove_all(dir); }
};

// llama.cpp's permutation of a Llama Q or K matrix, written from its definition: each head's
// rows (i, i + d/2) become rows (2i, 2i + 1).
std::vector<float> permuted(const HfTensor& tensor, int64_t num_heads) {
  const uint64_t rows = tensor.shape[0], cols = tensor.shape.size() > 1 ? tensor.shape[1] : 1;
  const uint64_t head_rows = rows / num_heads;
  std::vector<float> out(tensor.values.size());
  for (uint64_t row = 0; row < rows; ++row) {
    const uint64_t head = row / head_rows, within = row % head_rows;
    const uint64_t source = head * head_rows + (within % 2) * (head_rows / 2) + within / 2;
    std::copy_n(tensor.values.begin() + source * cols, cols, out.begin() + row * cols);
  }
  return out;
}

// The GGUF llama.cpp's converter writes for the same weights, by the test's own table.
gguf::Writer gguf_of(const ArchCase& c, const std::vector<HfTensor>& tensors, bool permute) {
  gguf::Writer writer;
  const std::string a = c.gguf_arch + ".";
  writer.set_string("general.architecture", c.gguf_arch);
  writer.set_u32(a + "context_length", 256);
  writer.set_u32(a + "embedding_length", c.dim);
  writer.set_u32(a + "block_count", c.num_layers);
  writer.set_u32(a + "feed_forward_length", c.ffn_dim);
  writer.set_u32(a + "attention.head_count", c.num_heads);
  writer.set_u32(a + "attention.head_count_kv", c.num_kv_heads);
  writer.set_u32(a + "vocab_size", c.vocab);
  writer.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  writer.set_f32(a + "rope.freq_base", c.rope_theta);
  if (c.explicit_head_dim) writer.set_u32(a + "attention.key_length", c.head_dim);
  if (c.sliding_window) writer.set_u32(a + "attention.sliding_window", *c.sliding_window);
  if (!c.rope_scaling.is_null()) {
    const std::string type = c.rope_scaling["rope_type"];
    if (type == "linear" || type == "yarn") {
      writer.set_string(a + "rope.scaling.type", type);
      writer.set_f32(a + "rope.scaling.factor", c.rope_scaling["factor"].get<float>());
      if (type == "yarn")
        writer.set_u32(a + "rope.scaling.original_context_length",
                       c.rope_scaling["original_max_position_embeddings"].get<uint32_t>());
    } else if (type == "llama3") {
      // HF's _compute_llama3_parameters as divisors of each pair's frequency.
      const float factor = c.rope_scaling["factor"], low = c.rope_scaling["low_freq_factor"],
                  high = c.rope_scaling["high_freq_factor"],
                  old_context = c.rope_scaling["original_max_position_embeddings"];
      std::vector<float> divisors;
      for (int64_t i = 0; i < c.head_dim; i += 2) {
        const float inv_freq = 1.0f / std::pow(c.rope_theta, static_cast<float>(i) / c.head_dim);
        const float wavelen = 2.0f * std::numbers::pi_v<float> / inv_freq;
        const float smooth = (old_context / wavelen - low) / (high - low);
        divisors.push_back(wavelen < old_context / high  ? 1.0f
                           : wavelen > old_context / low ? factor
                                                         : 1.0f / ((1 - smooth) / factor + smooth));
      }
      writer.add_tensor("rope_freqs.weight", gguf::TensorType::kF32, {divisors.size()},
                        encode("F32", divisors));
    }
  }
  const std::vector<std::pair<std::string, std::string>> names = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  for (const HfTensor& tensor : tensors) {
    std::string name;
    if (tensor.name == "model.embed_tokens.weight") name = "token_embd.weight";
    if (tensor.name == "model.norm.weight") name = "output_norm.weight";
    if (tensor.name == "lm_head.weight") name = "output.weight";
    int layer = -1;
    char suffix[128] = {};
    if (std::sscanf(tensor.name.c_str(), "model.layers.%d.%127s", &layer, suffix) == 2) {
      for (const auto& [hf, gguf] : names) {
        if (hf == suffix) name = "blk." + std::to_string(layer) + "." + gguf;
      }
    }
    EXPECT_FALSE(name.empty()) << tensor.name;
    std::vector<float> values = tensor.values;
    const bool is_q = name.find("attn_q.") != std::string::npos;
    const bool is_k = name.find("attn_k.") != std::string::npos;
    if (permute && (is_q || is_k)) values = permuted(tensor, is_q ? c.num_heads : c.num_kv_heads);
    if (tensor.shape.size() == 1) {  // norms and biases in F32, as llama.cpp writes them
      writer.add_tensor(name, gguf::TensorType::kF32, {tensor.shape[0]}, encode("F32", values));
    } else {
      const gguf::TensorType type = c.dtype == "F32"   ? gguf::TensorType::kF32
                                    : c.dtype == "F16" ? gguf::TensorType::kF16
                                                       : gguf::TensorType::kBF16;
      writer.add_tensor(name, type, {tensor.shape[1], tensor.shape[0]}, encode(c.dtype, values));
    }
  }
  return writer;
}

std::vector<float> logits_of(std::shared_ptr<const gguf::File> file,
                             std::optional<kernels::RopeOrdering> ordering = std::nullopt) {
  model::ModelConfig config = model::config_from_gguf(*file);
  if (ordering) config.rope.ordering = *ordering;
  model::Weights weights = model::weights_from_gguf(file, config);
  std::shared_ptr<kernels::Backend> backend = kernels::make_backend({.threads = 2});
  const model::LlamaModel m(config, std::move(weights), backend);
  const std::vector<int32_t> tokens = {1, 17, 5, 42, 9, 88, 3, 61, 30, 7, 2, 50};
  auto [cache, table] =
      model::KvCache::for_one_sequence(*backend, config, static_cast<int32_t>(tokens.size()));
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(table);
  for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], static_cast<int32_t>(i), true);
  std::vector<float> logits;
  m.forward(batch, cache, scratch, logits);
  return logits;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  return diff;
}

std::vector<ArchCase> arch_cases() {
  std::vector<ArchCase> cases;
  ArchCase llama{.label = "llama_f32", .hf_arch = "LlamaForCausalLM", .gguf_arch = "llama"};
  llama.permute_qk = true;
  cases.push_back(llama);
  ArchCase llama3 = llama;
  llama3.label = "llama3_bf16_tied_sharded";
  llama3.dtype = "BF16";
  llama3.tied = true;
  llama3.sharded = true;
  llama3.rope_theta = 500000.0f;
  llama3.rope_scaling = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  cases.push_back(llama3);
  ArchCase linear = llama;
  linear.label = "llama_linear_f16";
  linear.dtype = "F16";
  linear.rope_scaling = {{"rope_type", "linear"}, {"factor", 2.0}};
  cases.push_back(linear);
  ArchCase yarn = llama;
  yarn.label = "llama_yarn";
  yarn.rope_scaling = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  cases.push_back(yarn);
  ArchCase mistral = llama;
  mistral.label = "mistral_f16_window";
  mistral.hf_arch = "MistralForCausalLM";
  mistral.dtype = "F16";
  mistral.sliding_window = 4;
  cases.push_back(mistral);
  ArchCase qwen2{.label = "qwen2_bf16_tied", .hf_arch = "Qwen2ForCausalLM", .gguf_arch = "qwen2"};
  qwen2.dtype = "BF16";
  qwen2.tied = true;
  qwen2.qkv_bias = true;
  cases.push_back(qwen2);
  ArchCase qwen3{.label = "qwen3_f32", .hf_arch = "Qwen3ForCausalLM", .gguf_arch = "qwen3"};
  qwen3.head_dim = 32;  // n_head * head_dim != hidden_size, as in Qwen3
  qwen3.explicit_head_dim = true;
  qwen3.qk_norm = true;
  cases.push_back(qwen3);
  ArchCase phi3{.label = "phi3_f16", .hf_arch = "Phi3ForCausalLM", .gguf_arch = "phi3"};
  phi3.dtype = "F16";
  phi3.fused = true;
  phi3.num_kv_heads = 4;
  cases.push_back(phi3);
  return cases;
}

class HfArchitectures : public ::testing::TestWithParam<ArchCase> {};

TEST_P(HfArchitectures, FolderGivesTheLogitsOfTheSameWeightsAsGguf) {
  const ArchCase& c = GetParam();
  const std::vector<HfTensor> tensors = random_weights(c, 7);
  const HfFolder folder(c, tensors);
  const auto hf_file =
      std::make_shared<const gguf::File>(hf::open_model_folder(folder.dir.string()));
  const std::vector<uint8_t> gguf_bytes = gguf_of(c, tensors, c.permute_qk).to_bytes();
  const auto gguf_file = std::make_shared<const gguf::File>(gguf::File::parse(gguf_bytes));
  const std::vector<float> from_hf = logits_of(hf_file), from_gguf = logits_of(gguf_file);
  ASSERT_EQ(from_hf.size(), static_cast<size_t>(12 * c.vocab));
  if (c.rope_scaling.is_null() || c.rope_scaling["rope_type"] != "llama3") {
    EXPECT_EQ(from_hf, from_gguf) << "the same weights, bytes and keys: bitwise equal logits";
  } else {  // rope_freqs computed by two formulas in float
    EXPECT_LT(max_abs_diff(from_hf, from_gguf), 1e-4f);
  }
  // The config the folder gives is the GGUF's.
  const model::ModelConfig hf_config = model::config_from_gguf(*hf_file),
                           gguf_config = model::config_from_gguf(*gguf_file);
  EXPECT_EQ(hf_config.summary().substr(hf_config.summary().find(':')),
            gguf_config.summary().substr(gguf_config.summary().find(':')));
  EXPECT_EQ(hf_config.sliding_window, gguf_config.sliding_window);

  if (c.permute_qk) {
    // Why the permutation: HF's unpermuted rows under NEOX RoPE (rotate_half, HF's own rotation)
    // give the same logits up to summation order.
    const std::vector<uint8_t> unpermuted = gguf_of(c, tensors, false).to_bytes();
    const std::vector<float> neox =
        logits_of(std::make_shared<const gguf::File>(gguf::File::parse(unpermuted)),
                  kernels::RopeOrdering::kNeox);
    EXPECT_LT(max_abs_diff(from_hf, neox), 2e-3f);
    const std::vector<float> wrong =
        logits_of(std::make_shared<const gguf::File>(gguf::File::parse(unpermuted)));
    EXPECT_GT(max_abs_diff(from_hf, wrong), 1e-2f) << "the permutation must matter";
  }
}

// `sieve convert DIR OUT.gguf` writes what loading the folder reads: the GGUF loads, with the
// same logits; `sieve convert DIR OUT.gguf TYPE` converts the weights as `sieve quantize` does.
TEST_P(HfArchitectures, ConvertedGgufGivesTheSameLogits) {
  const ArchCase& c = GetParam();
  const std::vector<HfTensor> tensors = random_weights(c, 11);
  const HfFolder folder(c, tensors);
  const std::string out = (folder.dir / "converted.gguf").string();
  const testing::CliResult convert =
      testing::run_sieve(fmt::format("convert {} {}", folder.dir.string(), out), true);
  ASSERT_EQ(convert.exit_code, 0) << convert.out;
  const auto converted = std::make_shared<const gguf::File>(gguf::File::open(out));
  EXPECT_EQ(converted->get_string("general.architecture"), c.gguf_arch);
  EXPECT_EQ(
      logits_of(converted),
      logits_of(std::make_shared<const gguf::File>(hf::open_model_folder(folder.dir.string()))));

  const std::string out_f32 = (folder.dir / "converted-f32.gguf").string();
  const testing::CliResult to_f32 =
      testing::run_sieve(fmt::format("convert {} {} f32", folder.dir.string(), out_f32), true);
  ASSERT_EQ(to_f32.exit_code, 0) << to_f32.out;
  const auto widened = std::make_shared<const gguf::File>(gguf::File::open(out_f32));
  EXPECT_EQ(widened->find_tensor("token_embd.weight")->type, gguf::TensorType::kF32);
  // F16 / BF16 values widen to F32 exactly; only the kernels' arithmetic differs.
  EXPECT_LT(max_abs_diff(logits_of(widened), logits_of(converted)), 2e-3f);
}

// --quantize at load (LoadOptions::quantize): the folder's weights converted in memory are what
// `sieve convert DIR OUT.gguf q8_0` writes, bitwise: same tensor types, same logits.
TEST_P(HfArchitectures, QuantizedAtLoadIsWhatConvertWrites) {
  const ArchCase& c = GetParam();
  const std::vector<HfTensor> tensors = random_weights(c, 13);
  const HfFolder folder(c, tensors);
  const std::string out = (folder.dir / "converted-q8_0.gguf").string();
  const testing::CliResult convert =
      testing::run_sieve(fmt::format("convert {} {} q8_0", folder.dir.string(), out), true);
  ASSERT_EQ(convert.exit_code, 0) << convert.out;
  const auto written = std::make_shared<const gguf::File>(gguf::File::open(out));
  ThreadPool pool(2);
  const auto in_memory = std::make_shared<const gguf::File>(
      model::quantize_file(
          std::make_shared<const gguf::File>(hf::open_model_folder(folder.dir.string())),
          *model::parse_quant_mix("q8_0"), pool)
          .file);
  ASSERT_EQ(in_memory->tensors().size(), written->tensors().size());
  for (const gguf::TensorInfo& tensor : in_memory->tensors()) {
    const gguf::TensorInfo* other = written->find_tensor(tensor.name);
    ASSERT_NE(other, nullptr) << tensor.name;
    EXPECT_EQ(tensor.type, other->type) << tensor.name;
    const std::span<const uint8_t> a = in_memory->tensor_data(tensor),
                                   b = written->tensor_data(*other);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << tensor.name;
  }
  EXPECT_EQ(in_memory->get_u64("general.file_type"), written->get_u64("general.file_type"));
  EXPECT_EQ(logits_of(in_memory), logits_of(written));
}

INSTANTIATE_TEST_SUITE_P(All, HfArchitectures, ::testing::ValuesIn(arch_cases()),
                         [](const auto& info) { return info.param.label; });

// A whole folder as a user serves it: weights, a byte-level tokenizer.json (26 letters, the
// space, a few merges, padded to the model's 96 ids), tokenizer_config.json with its chat
// template and EOS, generation_config.json. `sieve run -m DIR` answers, with the tokenizer's ids
// (BOS off, as the config says), and `--quantize q8_0` runs too; `sieve tokenize` reads the
// folder's tokenizer.
TEST(HfFolderServed, RunsWithItsTokenizerChatTemplateAndQuantizedAtLoad) {
  ArchCase c = arch_cases()[0];
  c.label = "served";
  const HfFolder folder(c, random_weights(c, 5));
  json vocab = json::object();
  int id = 0;
  for (char ch = 'a'; ch <= 'z'; ++ch) vocab[std::string(1, ch)] = id++;
  vocab["\xC4\xA0"] = id++;  // GPT-2's byte alphabet writes a space as U+0120
  for (const char* merged : {"he", "ll", "hell", "hello", "\xC4\xA0w"}) vocab[merged] = id++;
  const json tokenizer = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", {{{"id", id}, {"content", "<|end|>"}, {"special", true}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"})}}}};
  std::ofstream(folder.dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(folder.dir / "tokenizer_config.json")
      << json{{"eos_token", "<|end|>"},
              {"add_bos_token", false},
              {"chat_template", "{% for m in messages %}{{ m['content'] }}<|end|>{% endfor %}"}}
             .dump();
  const testing::CliResult tokens =
      testing::run_sieve("tokenize -m " + folder.dir.string() + " --ids 'hello world'", true);
  ASSERT_EQ(tokens.exit_code, 0) << tokens.out;
  const std::string hello = std::to_string(vocab["hello"].get<int>());
  EXPECT_NE(tokens.out.find(hello), std::string::npos) << tokens.out;
  for (const char* extra : {"", " --quantize q8_0"}) {
    const testing::CliResult run = testing::run_sieve("run -m " + folder.dir.string() + extra +
                                                      " -p 'hello world' -n 4 --temp 0 --json");
    ASSERT_EQ(run.exit_code, 0) << extra << run.out;
    const json out = json::parse(run.out);
    // "hello" merged whole, then " world" as Ġw o r l d; no BOS (add_bos_token false).
    EXPECT_EQ(out["prompt_tokens"], json::array({vocab["hello"], vocab["\xC4\xA0w"], vocab["o"],
                                                 vocab["r"], vocab["l"], vocab["d"]}))
        << extra;
    EXPECT_EQ(out["tokens"].size(), 4u) << extra;
  }
}

class BadFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = arch_cases()[0];
    c_.label =
        std::string("bad_") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    folder_.emplace(c_, random_weights(c_, 3));
  }
  void write_config(const json& config) {
    std::ofstream(folder_->dir / "config.json") << config.dump();
  }
  std::string open_error() {
    return error_of([&] { hf::open_model_folder(folder_->dir.string()); });
  }
  ArchCase c_;
  std::optional<HfFolder> folder_;
};

TEST_F(BadFolder, UnsupportedArchitectureIsAnErrorNamingItAndTheSupported) {
  json config = config_json(c_);
  config["architectures"] = {"GPTNeoXForCausalLM"};
  write_config(config);
  const std::string error = open_error();
  EXPECT_NE(error.find("config.json: unsupported architecture 'GPTNeoXForCausalLM'"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("Qwen3ForCausalLM"), std::string::npos);
}

TEST_F(BadFolder, MissingOrMalformedConfigIsAnError) {
  write_config({{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", -3}});
  EXPECT_NE(open_error().find("\"hidden_size\" is -3"), std::string::npos);
  std::ofstream(folder_->dir / "config.json") << std::string(1000, '[');
  EXPECT_NE(open_error().find("nests deeper"), std::string::npos);
  fs::remove(folder_->dir / "config.json");
  EXPECT_NE(open_error().find("no config.json"), std::string::npos);
}

TEST_F(BadFolder, UnsupportedRopeScalingIsAnError) {
  json config = config_json(c_);
  config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  write_config(config);
  EXPECT_NE(open_error().find("rope_scaling type 'dynamic' is not supported"), std::string::npos);
}

TEST_F(BadFolder, WeightsOfAnotherDtypeOrShapeOrNameAreErrorsNamingTheFile) {
  const fs::path weights = folder_->dir / "model.safetensors";
  testing::write_bytes(
      weights, testing::safetensors_bytes(
                   {{"model.embed_tokens.weight", "I8", {96, 64}, std::vector<uint8_t>(96 * 64)}}));
  std::string error = open_error();
  EXPECT_NE(error.find("model.safetensors: tensor 'model.embed_tokens.weight' has dtype I8"),
            std::string::npos)
      << error;
  testing::write_bytes(weights,
                       testing::safetensors_bytes(
                           {{"model.vision_tower.weight", "F32", {1}, std::vector<uint8_t>(4)}}));
  error = open_error();
  EXPECT_NE(error.find("'model.vision_tower.weight' is not one sieve knows"), std::string::npos)
      << error;
  // A shape config.json does not imply: caught where the weights are viewed, naming the tensor.
  std::vector<HfTensor> tensors = random_weights(c_, 3);
  tensors[2].shape = {32, 128};  // q_proj of layer 0
  std::vector<StTensor> files;
  for (const HfTensor& t : tensors)
    files.push_back({t.name, "F32", t.shape, encode("F32", t.values)});
  testing::write_bytes(weights, testing::safetensors_bytes(files));
  error = error_of([&] {
    auto file = std::make_shared<const gguf::File>(hf::open_model_folder(folder_->dir.string()));
    model::ModelConfig config = model::config_from_gguf(*file);
    model::weights_from_gguf(file, config);
  });
  EXPECT_NE(error.find("blk.0.attn_q.weight"), std::string::npos) << error;
}

TEST_F(BadFolder, UntiedModelWithoutLmHeadIsAnError) {
  std::vector<HfTensor> tensors = random_weights(c_, 3);
  tensors.pop_back();  // lm_head
  std::vector<StTensor> files;
  for (const HfTensor& t : tensors)
    files.push_back({t.name, "F32", t.shape, encode("F32", t.values)});
  testing::write_bytes(folder_->dir / "model.safetensors", testing::safetensors_bytes(files));
  EXPECT_NE(open_error().find("no lm_head.weight"), std::string::npos);
}

TEST_F(BadFolder, ServingAFolderWithoutTokenizerJsonIsAnError) {
  for (const std::string& path :
       {folder_->dir.string(), (folder_->dir / "model.safetensors").string()}) {
    const std::string error = error_of([&] { model::load_model({.model_path = path}); });
    EXPECT_NE(error.find("has no tokenizer.json"), std::string::npos) << error;
    const testing::CliResult run = testing::run_sieve("run -m " + path + " -p hello -n 1", true);
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.out.find("has no tokenizer.json"), std::string::npos) << run.out;
  }
}

TEST_F(BadFolder, TruncatedWeightsAreAnErrorNamingTheFile) {
  fs::resize_file(folder_->dir / "model.safetensors",
                  fs::file_size(folder_->dir / "model.safetensors") - 10);
  const std::string error = open_error();
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

}  // namespace
}  // namespace sieve
