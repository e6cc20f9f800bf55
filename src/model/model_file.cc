#include "model/model_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <optional>

#include "gguf/gguf.h"
#include "model/loader.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::model {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Encodes a [rows][cols] matrix row by row, in parallel; row r depends only on (seed, name, r).
std::vector<uint8_t> random_matrix(std::string_view name, int64_t rows, int64_t cols, float stddev,
                                   kernels::DType dtype, uint64_t seed, ThreadPool& pool) {
  const size_t row_size = kernels::row_bytes(dtype, cols);
  std::vector<uint8_t> data(row_size * rows);
  const uint64_t tensor_seed = seed ^ hash_name(name);
  const float half_width = stddev * std::sqrt(3.0f);  // uniform[-a, a] has stddev a/sqrt(3)
  pool.parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> values(cols);
        for (int64_t r = begin; r < end; ++r) {
          uint64_t state = tensor_seed + static_cast<uint64_t>(r) * 0x632BE59BD9B4E019ull;
          for (int64_t c = 0; c < cols; ++c) {
            const double unit = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
            values[c] = static_cast<float>((2.0 * unit - 1.0) * half_width);
          }
          kernels::quantize_row(dtype, values.data(), data.data() + r * row_size, cols);
        }
      },
      16);
  return data;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace

std::optional<kernels::DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (kernels::DType dtype : kernels::kAllDTypes) {
    std::string candidate(kernels::to_string(dtype));
    std::transform(candidate.begin(), candidate.end(), candidate.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (candidate == lower) return dtype;
  }
  return std::nullopt;
}

void write_random_model(const RandomModelSpec& spec, const std::string& out_path,
                        ThreadPool& pool) {
  if (spec.dim <= 0 || spec.num_layers <= 0 || spec.num_heads <= 0 || spec.num_kv_heads <= 0 ||
      spec.ffn_dim <= 0 || spec.context_length <= 0) {
    fail("model dimensions must be positive");
  }
  if (spec.dim % spec.num_heads != 0)
    fail("dim {} is not a multiple of heads {}", spec.dim, spec.num_heads);
  if (spec.num_heads % spec.num_kv_heads != 0) {
    fail("heads {} is not a multiple of KV heads {}", spec.num_heads, spec.num_kv_heads);
  }
  const int64_t block = kernels::block_elems(spec.dtype);
  if (spec.dim % block != 0 || spec.ffn_dim % block != 0) {
    fail("dim and ffn must be multiples of {} for {}", block, kernels::to_string(spec.dtype));
  }
  const gguf::File vocab_file = gguf::File::open(spec.vocab_path);
  const std::optional<std::vector<std::string>> tokens =
      vocab_file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) fail("'{}' has no tokenizer.ggml.tokens", spec.vocab_path);
  const int64_t vocab_size = static_cast<int64_t>(tokens->size());
  const int64_t head_dim = spec.dim / spec.num_heads;
  const int64_t kv_dim = head_dim * spec.num_kv_heads;

  gguf::Writer writer;
  writer.set_string("general.architecture", "llama");
  writer.set_string("general.name", fmt::format("sieve-random-{}d-{}l-{}", spec.dim,
                                                spec.num_layers, kernels::to_string(spec.dtype)));
  writer.set_u32("general.file_type", kernels::dtype_traits(spec.dtype).gguf_file_type);
  writer.set_u32("llama.context_length", static_cast<uint32_t>(spec.context_length));
  writer.set_u32("llama.embedding_length", static_cast<uint32_t>(spec.dim));
  writer.set_u32("llama.block_count", static_cast<uint32_t>(spec.num_layers));
  writer.set_u32("llama.feed_forward_length", static_cast<uint32_t>(spec.ffn_dim));
  writer.set_u32("llama.attention.head_count", static_cast<uint32_t>(spec.num_heads));
  writer.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(spec.num_kv_heads));
  writer.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  writer.set_f32("llama.rope.freq_base", spec.rope_base);
  writer.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  writer.set_u32("llama.vocab_size", static_cast<uint32_t>(vocab_size));
  for (const gguf::KeyValue& kv : vocab_file.metadata()) {
    if (kv.key.starts_with("tokenizer.")) writer.copy_from(vocab_file, kv.key);
  }

  auto add_matrix = [&](const std::string& name, int64_t rows, int64_t cols, float stddev) {
    writer.add_tensor(name, to_tensor_type(spec.dtype),
                      {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                      random_matrix(name, rows, cols, stddev, spec.dtype, spec.seed, pool));
  };
  auto add_ones = [&](const std::string& name, int64_t size) {
    writer.add_tensor(name, gguf::TensorType::kF32, {static_cast<uint64_t>(size)},
                      f32_bytes(std::vector<float>(size, 1.0f)));
  };
  // Unit-scale activations: each matrix has stddev 1/sqrt(fan_in); the two residual-branch
  // outputs are further scaled by 1/sqrt(2 * layers) so the residual stream stays O(1).
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(spec.num_layers));
  auto fan_in = [](int64_t cols) { return 1.0f / std::sqrt(static_cast<float>(cols)); };
  add_matrix("token_embd.weight", vocab_size, spec.dim, 1.0f);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add_ones(p + "attn_norm.weight", spec.dim);
    // Queries and keys a little hotter than unit scale so attention is not uniform.
    add_matrix(p + "attn_q.weight", spec.dim, spec.dim, 2.0f * fan_in(spec.dim));
    add_matrix(p + "attn_k.weight", kv_dim, spec.dim, 2.0f * fan_in(spec.dim));
    add_matrix(p + "attn_v.weight", kv_dim, spec.dim, fan_in(spec.dim));
    add_matrix(p + "attn_output.weight", spec.dim, spec.dim, residual_scale * fan_in(spec.dim));
    add_ones(p + "ffn_norm.weight", spec.dim);
    add_matrix(p + "ffn_gate.weight", spec.ffn_dim, spec.dim, fan_in(spec.dim));
    add_matrix(p + "ffn_up.weight", spec.ffn_dim, spec.dim, fan_in(spec.dim));
    add_matrix(p + "ffn_down.weight", spec.dim, spec.ffn_dim,
               2.0f * residual_scale * fan_in(spec.ffn_dim));
  }
  add_ones("output_norm.weight", spec.dim);
  add_matrix("output.weight", vocab_size, spec.dim, 4.0f * fan_in(spec.dim));
  writer.write(out_path);
}

namespace {

using kernels::DType;

constexpr QuantMix kQuantMixes[] = {
    {"F32", DType::kF32, 0},      {"F16", DType::kF16, 1},        {"Q4_0", DType::kQ4_0, 2},
    {"Q4_1", DType::kQ4_1, 3},    {"Q8_0", DType::kQ8_0, 7},      {"Q5_0", DType::kQ5_0, 8},
    {"Q5_1", DType::kQ5_1, 9},    {"Q2_K", DType::kQ2_K, 10},     {"Q3_K_S", DType::kQ3_K, 11},
    {"Q3_K_M", DType::kQ3_K, 12}, {"Q3_K_L", DType::kQ3_K, 13},   {"Q4_K_S", DType::kQ4_K, 14},
    {"Q4_K_M", DType::kQ4_K, 15}, {"Q5_K_S", DType::kQ5_K, 16},   {"Q5_K_M", DType::kQ5_K, 17},
    {"Q6_K", DType::kQ6_K, 18},   {"IQ4_NL", DType::kIQ4_NL, 25}, {"IQ4_XS", DType::kIQ4_XS, 30},
    {"BF16", DType::kBF16, 32},
};

std::string lowercase(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return lower;
}

// "blk.12.attn_v.weight" -> 12.
std::optional<int64_t> layer_index(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  name.remove_prefix(4);
  int64_t index = 0;
  size_t digits = 0;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) {
    index = index * 10 + (name[digits++] - '0');
  }
  if (digits == 0) return std::nullopt;
  return index;
}

// llama-quantize's use_more_bits: the first and last eighth of the layers and every third
// layer in between get more bits in the _M mixes.
bool use_more_bits(int64_t layer, int64_t num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

// The type a mix chooses for a tensor by its role, before the shape is checked.
DType mix_rule(const QuantMix& mix, const QuantModelInfo& model, std::string_view name,
               uint64_t row_length) {
  const std::string_view ftype = mix.name;
  const DType base = mix.base;
  const int64_t layer = layer_index(name).value_or(0);
  const int64_t num_layers = std::max<int64_t>(model.num_layers, 1);
  const bool is_output =
      name == "output.weight" || (!model.has_output && name == "token_embd.weight");
  if (is_output) {
    if (row_length % kernels::block_elems(base) != 0) return DType::kQ8_0;
    return base == DType::kQ8_0 ? DType::kQ8_0 : DType::kQ6_K;
  }
  if (name == "token_embd.weight") return base;
  if (name.find("attn_v.weight") != std::string_view::npos) {
    DType type = base;
    if (ftype == "Q2_K") {
      type = model.num_gqa >= 4 ? DType::kQ4_K : DType::kQ3_K;
    } else if (ftype == "Q3_K_M") {
      type = layer < 2 ? DType::kQ5_K : DType::kQ4_K;
    } else if (ftype == "Q3_K_L") {
      type = DType::kQ5_K;
    } else if ((ftype == "IQ4_NL" || ftype == "IQ4_XS") && model.num_gqa >= 4) {
      type = DType::kQ5_K;
    } else if ((ftype == "Q4_K_M" || ftype == "Q5_K_M") && use_more_bits(layer, num_layers)) {
      type = DType::kQ6_K;
    } else if (ftype == "Q4_K_S" && layer < 4) {
      type = DType::kQ5_K;
    }
    // llama.cpp's 70B rule: 8 query heads share each attn_v, so it is small and worth more bits.
    const bool llama_70b =
        model.architecture == "llama" && model.num_layers == 80 && model.num_gqa > 1;
    if (llama_70b && (type == DType::kQ3_K || type == DType::kQ4_K)) type = DType::kQ5_K;
    return type;
  }
  if (name.find("ffn_down") != std::string_view::npos) {
    if (ftype == "Q2_K") return DType::kQ3_K;
    if (ftype == "Q3_K_M") return layer < num_layers / 16 ? DType::kQ5_K : DType::kQ4_K;
    if (ftype == "Q3_K_L") return DType::kQ5_K;
    if (ftype == "Q4_K_M") return use_more_bits(layer, num_layers) ? DType::kQ6_K : base;
    if ((ftype == "IQ4_NL" || ftype == "IQ4_XS") && layer < num_layers / 8) return DType::kQ5_K;
    if (ftype == "Q5_K_M" && use_more_bits(layer, num_layers)) return DType::kQ6_K;
    if (ftype == "Q4_K_S" && layer < num_layers / 8) return DType::kQ5_K;
    return base;
  }
  if (name.find("attn_output.weight") != std::string_view::npos) {
    if (ftype == "Q2_K") return DType::kQ3_K;
    if (ftype == "Q3_K_M") return DType::kQ4_K;
    if (ftype == "Q3_K_L") return DType::kQ5_K;
    return base;
  }
  if (name.find("attn_qkv.weight") != std::string_view::npos) {
    if (ftype == "Q3_K_M" || ftype == "Q3_K_L") return DType::kQ4_K;
    if (ftype == "Q4_K_M") return DType::kQ5_K;
    if (ftype == "Q5_K_M") return DType::kQ6_K;
  }
  return base;
}

}  // namespace

std::span<const QuantMix> quant_mixes() { return kQuantMixes; }

std::optional<QuantMix> parse_quant_mix(std::string_view name) {
  std::string lower = lowercase(name);
  if (lower == "q3_k" || lower == "q4_k" || lower == "q5_k") lower += "_m";
  for (const QuantMix& mix : kQuantMixes) {
    if (lowercase(mix.name) == lower) return mix;
  }
  return std::nullopt;
}

QuantModelInfo quant_model_info(const gguf::File& file) {
  QuantModelInfo info;
  info.architecture = file.get_string("general.architecture").value_or("");
  const std::string prefix = info.architecture + ".";
  info.num_layers = file.get_i64(prefix + "block_count").value_or(0);
  if (info.num_layers == 0) {  // no metadata: count the layers' attention value matrices
    for (const gguf::TensorInfo& tensor : file.tensors()) {
      if (tensor.name.find("attn_v.weight") != std::string::npos ||
          tensor.name.find("attn_qkv.weight") != std::string::npos) {
        ++info.num_layers;
      }
    }
  }
  const int64_t heads = file.get_i64(prefix + "attention.head_count").value_or(1);
  const int64_t kv_heads = file.get_i64(prefix + "attention.head_count_kv").value_or(heads);
  info.num_gqa = kv_heads > 0 ? heads / kv_heads : 1;
  info.has_output = file.find_tensor("output.weight") != nullptr;
  return info;
}

PlannedType plan_tensor_type(const QuantMix& mix, const QuantModelInfo& model,
                             std::string_view name, std::span<const uint64_t> shape, bool pure) {
  if (shape.size() != 2) return {DType::kF32, ""};  // norms, biases and rope factors stay exact
  const uint64_t row_length = shape[0];
  DType chosen = mix.base;
  if (kernels::is_quantized(mix.base) && !pure) chosen = mix_rule(mix, model, name, row_length);
  if (row_length % kernels::block_elems(chosen) == 0) return {chosen, ""};
  DType fallback = kernels::dtype_traits(chosen).quantize_fallback.value_or(DType::kF16);
  if (row_length % kernels::block_elems(fallback) != 0) fallback = DType::kF16;
  return {fallback, fmt::format("row length {} is not a multiple of {} for {}: {} instead",
                                row_length, kernels::block_elems(chosen),
                                kernels::to_string(chosen), kernels::to_string(fallback))};
}

void write_model_file(const gguf::File& input, const std::string& out_path) {
  gguf::Writer writer;
  for (const gguf::KeyValue& kv : input.metadata()) {
    if (kv.key == "general.alignment") continue;  // the writer chooses its own
    writer.copy_from(input, kv.key);
  }
  for (const gguf::TensorInfo& info : input.tensors()) {
    std::span<const uint8_t> data = input.tensor_data(info);
    writer.add_tensor(info.name, info.type, info.shape, {data.begin(), data.end()});
  }
  writer.write(out_path);
}

QuantizedFile quantize_file(std::shared_ptr<const gguf::File> input_file, const QuantMix& mix,
                            ThreadPool& pool, bool pure) {
  const gguf::File& input = *input_file;
  const QuantModelInfo model = quant_model_info(input);

  struct Step {
    const gguf::TensorInfo* info;
    DType from;
    PlannedType to;
  };
  std::vector<Step> steps;
  for (const gguf::TensorInfo& info : input.tensors()) {
    std::optional<DType> from = to_dtype(info.type);
    if (!from) {
      fail("tensor '{}' has type {}, which sieve cannot convert", info.name,
           gguf::to_string(info.type));
    }
    steps.push_back({&info, *from, plan_tensor_type(mix, model, info.name, info.shape, pure)});
  }
  // Every conversion this file needs, tried once here on the calling thread, so that a type
  // this build cannot (de)quantize is a clear error before any work or output.
  for (const Step& step : steps) {
    if (step.from == step.to.dtype) continue;
    const int64_t n =
        std::max(kernels::block_elems(step.from), kernels::block_elems(step.to.dtype));
    std::vector<float> values(n, 0.0f);
    std::vector<uint8_t> in_bytes(kernels::row_bytes(step.from, n)),
        out_bytes(kernels::row_bytes(step.to.dtype, n));
    kernels::dequantize_row(step.from, in_bytes.data(), values.data(), n);
    kernels::quantize_row(step.to.dtype, values.data(), out_bytes.data(), n);
  }

  std::vector<gguf::KeyValue> metadata = input.metadata();
  const gguf::Value file_type{mix.file_type};
  auto it = std::find_if(metadata.begin(), metadata.end(),
                         [](const gguf::KeyValue& kv) { return kv.key == "general.file_type"; });
  if (it != metadata.end()) {
    it->value = file_type;
  } else {
    metadata.push_back({"general.file_type", file_type});
  }

  // The converted tensors' buffers, and the input whose bytes the others still are.
  struct Storage {
    std::shared_ptr<const gguf::File> input;
    std::vector<std::vector<uint8_t>> buffers;
  };
  auto storage = std::make_shared<Storage>();
  storage->input = input_file;
  storage->buffers.reserve(steps.size());
  std::vector<gguf::File::AssembledTensor> tensors;
  QuantizeReport report;
  for (const Step& step : steps) {
    const gguf::TensorInfo& info = *step.info;
    const DType from = step.from, to = step.to.dtype;
    std::span<const uint8_t> src = input.tensor_data(info);
    std::span<const uint8_t> data = src;  // nothing to convert: bytes kept exactly
    if (from != to) {
      const int64_t cols = static_cast<int64_t>(info.shape.empty() ? 1 : info.shape[0]);
      const int64_t rows = static_cast<int64_t>(info.num_elements() / cols);
      const size_t in_row = kernels::row_bytes(from, cols), out_row = kernels::row_bytes(to, cols);
      std::vector<uint8_t>& out = storage->buffers.emplace_back(out_row * rows);
      pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
        std::vector<float> values(cols);
        for (int64_t r = begin; r < end; ++r) {
          kernels::dequantize_row(from, src.data() + r * in_row, values.data(), cols);
          kernels::quantize_row(to, values.data(), out.data() + r * out_row, cols);
        }
      });
      data = out;
    }
    report.bytes_in += src.size();
    report.bytes_out += data.size();
    tensors.push_back({.name = info.name,
                       .type = from == to ? info.type : to_tensor_type(to),
                       .shape = info.shape,
                       .data = data});
    report.tensors.push_back({info.name, std::string(kernels::to_string(from)),
                              std::string(kernels::to_string(to)), step.to.note});
  }
  return {gguf::File::assemble(std::move(metadata), std::move(tensors), std::move(storage)),
          std::move(report)};
}

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantMix& mix, ThreadPool& pool, bool pure) {
  // A GGUF or a Hugging Face folder.
  QuantizedFile quantized =
      quantize_file(std::make_shared<const gguf::File>(open_model_file(in_path)), mix, pool, pure);
  write_model_file(quantized.file, out_path);
  return std::move(quantized.report);
}

}  // namespace sieve::model
