#include "model/model_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <optional>

#include "gguf/gguf.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::model {

namespace {

// llama.cpp's general.file_type values ("mostly X").
uint32_t file_type(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32: return 0;
    case kernels::DType::kF16: return 1;
    case kernels::DType::kQ4_0: return 2;
    case kernels::DType::kQ8_0: return 7;
    case kernels::DType::kBF16: return 32;
    case kernels::DType::kQ4_1: return 3;
    case kernels::DType::kQ5_0: return 8;
    case kernels::DType::kQ5_1: return 9;
    case kernels::DType::kQ2_K: return 10;
    case kernels::DType::kQ3_K: return 12;  // Q3_K_M
    case kernels::DType::kQ4_K: return 15;  // Q4_K_M
    case kernels::DType::kQ5_K: return 17;  // Q5_K_M
    case kernels::DType::kQ6_K: return 18;
    case kernels::DType::kIQ4_NL: return 25;
    case kernels::DType::kIQ4_XS: return 30;
  }
  return 0;
}

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
  pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> values(cols);
    for (int64_t r = begin; r < end; ++r) {
      uint64_t state = tensor_seed + static_cast<uint64_t>(r) * 0x632BE59BD9B4E019ull;
      for (int64_t c = 0; c < cols; ++c) {
        const double unit = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
        values[c] = static_cast<float>((2.0 * unit - 1.0) * half_width);
      }
      kernels::quantize_row(dtype, values.data(), data.data() + r * row_size, cols);
    }
  }, 16);
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
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (kernels::DType dtype : kernels::kAllDTypes) {
    std::string candidate(kernels::to_string(dtype));
    std::transform(candidate.begin(), candidate.end(), candidate.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (candidate == lower) return dtype;
  }
  return std::nullopt;
}

void write_random_model(const RandomModelSpec& spec, const std::string& out_path, ThreadPool& pool) {
  if (spec.dim <= 0 || spec.num_layers <= 0 || spec.num_heads <= 0 || spec.num_kv_heads <= 0 ||
      spec.ffn_dim <= 0 || spec.context_length <= 0) {
    fail("model dimensions must be positive");
  }
  if (spec.dim % spec.num_heads != 0) fail("dim {} is not a multiple of heads {}", spec.dim, spec.num_heads);
  if (spec.num_heads % spec.num_kv_heads != 0) {
    fail("heads {} is not a multiple of KV heads {}", spec.num_heads, spec.num_kv_heads);
  }
  const int64_t block = kernels::block_elems(spec.dtype);
  if (spec.dim % block != 0 || spec.ffn_dim % block != 0) {
    fail("dim and ffn must be multiples of {} for {}", block, kernels::to_string(spec.dtype));
  }
  const gguf::File vocab_file = gguf::File::open(spec.vocab_path);
  const std::optional<std::vector<std::string>> tokens = vocab_file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) fail("'{}' has no tokenizer.ggml.tokens", spec.vocab_path);
  const int64_t vocab_size = static_cast<int64_t>(tokens->size());
  const int64_t head_dim = spec.dim / spec.num_heads;
  const int64_t kv_dim = head_dim * spec.num_kv_heads;

  gguf::Writer writer;
  writer.set_string("general.architecture", "llama");
  writer.set_string("general.name", fmt::format("sieve-random-{}d-{}l-{}", spec.dim, spec.num_layers,
                                                kernels::to_string(spec.dtype)));
  writer.set_u32("general.file_type", file_type(spec.dtype));
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
    add_matrix(p + "ffn_down.weight", spec.dim, spec.ffn_dim, 2.0f * residual_scale * fan_in(spec.ffn_dim));
  }
  add_ones("output_norm.weight", spec.dim);
  add_matrix("output.weight", vocab_size, spec.dim, 4.0f * fan_in(spec.dim));
  writer.write(out_path);
}

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              kernels::DType dtype, ThreadPool& pool) {
  const gguf::File input = gguf::File::open(in_path);
  gguf::Writer writer;
  for (const gguf::KeyValue& kv : input.metadata()) {
    if (kv.key == "general.alignment") continue;  // the writer chooses its own
    writer.copy_from(input, kv.key);
  }
  writer.set_u32("general.file_type", file_type(dtype));

  QuantizeReport report;
  for (const gguf::TensorInfo& info : input.tensors()) {
    std::optional<kernels::DType> from = to_dtype(info.type);
    if (!from) {
      fail("tensor '{}' has type {}, which sieve cannot convert", info.name, gguf::to_string(info.type));
    }
    QuantizeReport::Tensor entry{info.name, std::string(kernels::to_string(*from)), "", ""};
    kernels::DType to = dtype;
    if (info.shape.size() != 2) {
      to = kernels::DType::kF32;  // norms and other vectors stay exact
    } else if (info.shape[0] % kernels::block_elems(dtype) != 0) {
      to = kernels::DType::kF16;
      entry.note = fmt::format("row length {} is not a multiple of {}: kept as F16", info.shape[0],
                               kernels::block_elems(dtype));
    }
    const int64_t cols = static_cast<int64_t>(info.shape[0]);
    const int64_t rows = static_cast<int64_t>(info.num_elements() / info.shape[0]);
    std::span<const uint8_t> src = input.tensor_data(info);
    const size_t in_row = kernels::row_bytes(*from, cols), out_row = kernels::row_bytes(to, cols);
    std::vector<uint8_t> data(out_row * rows);
    pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
      std::vector<float> values(cols);
      for (int64_t r = begin; r < end; ++r) {
        kernels::dequantize_row(*from, src.data() + r * in_row, values.data(), cols);
        kernels::quantize_row(to, values.data(), data.data() + r * out_row, cols);
      }
    });
    entry.to_type = std::string(kernels::to_string(to));
    report.bytes_in += src.size();
    report.bytes_out += data.size();
    writer.add_tensor(info.name, to_tensor_type(to), info.shape, std::move(data));
    report.tensors.push_back(std::move(entry));
  }
  writer.write(out_path);
  return report;
}

}  // namespace sieve::model
