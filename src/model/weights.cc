#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_set>

#include "gguf/gguf.h"
#include "model/architecture.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace sieve::model {

std::optional<kernels::DType> to_dtype(gguf::TensorType type) {
  return kernels::dtype_of_gguf_type(static_cast<uint32_t>(type));
}

gguf::TensorType to_tensor_type(kernels::DType dtype) {
  return static_cast<gguf::TensorType>(kernels::dtype_traits(dtype).gguf_type);
}

namespace {

std::string supported_type_list() {
  std::string list;
  for (kernels::DType dtype : kernels::kAllDTypes) {
    if (!list.empty()) list += ", ";
    list += kernels::to_string(dtype);
  }
  return list;
}

class GgufTensors {
 public:
  explicit GgufTensors(const gguf::File& file) : file_(file) {}

  const gguf::TensorInfo* find(const std::string& name) const { return file_.find_tensor(name); }

  const gguf::TensorInfo& require(const std::string& name) const {
    const gguf::TensorInfo* info = file_.find_tensor(name);
    if (info == nullptr) fail("model file has no tensor '{}'", name);
    used_.insert(name);
    return *info;
  }

  // Tensors of the file that nothing required, in file order.
  std::vector<std::string> unused() const {
    std::vector<std::string> names;
    for (const gguf::TensorInfo& info : file_.tensors()) {
      if (!used_.contains(info.name)) names.push_back(info.name);
    }
    return names;
  }

  // A [rows][cols] matrix (ggml shape [cols, rows]).
  kernels::MatrixView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const gguf::TensorInfo& info = require(name);
    std::optional<kernels::DType> dtype = to_dtype(info.type);
    if (!dtype) {
      fail(
          "tensor '{}' has type {}, which sieve cannot compute with (supported: {}); convert "
          "the model with `sieve quantize` or llama.cpp's llama-quantize",
          name, gguf::to_string(info.type), supported_type_list());
    }
    if (info.shape.size() != 2 || info.shape[0] != static_cast<uint64_t>(cols) ||
        info.shape[1] != static_cast<uint64_t>(rows)) {
      fail("tensor '{}' has shape {}, expected [{}, {}]", name, shape_string(info), cols, rows);
    }
    return kernels::MatrixView{*dtype, file_.tensor_data(info).data(), rows, cols};
  }

  std::vector<float> vector(const std::string& name, int64_t size) const {
    const gguf::TensorInfo& info = require(name);
    if (info.shape.size() != 1 || info.shape[0] != static_cast<uint64_t>(size)) {
      fail("tensor '{}' has shape {}, expected [{}]", name, shape_string(info), size);
    }
    std::optional<kernels::DType> dtype = to_dtype(info.type);
    if (!dtype || kernels::block_elems(*dtype) != 1) {
      fail("vector tensor '{}' has type {}; expected F32, F16 or BF16", name,
           gguf::to_string(info.type));
    }
    std::vector<float> values(size);
    kernels::dequantize_row(*dtype, file_.tensor_data(info).data(), values.data(), size);
    return values;
  }

 private:
  static std::string shape_string(const gguf::TensorInfo& info) {
    std::string text = "[";
    for (size_t i = 0; i < info.shape.size(); ++i) {
      text += (i ? ", " : "") + std::to_string(info.shape[i]);
    }
    return text + "]";
  }
  const gguf::File& file_;
  mutable std::unordered_set<std::string> used_;
};

}  // namespace

std::vector<kernels::MatrixView*> LayerWeights::matrices() {
  std::vector<kernels::MatrixView*> list;
  if (wqkv) {
    list.push_back(&*wqkv);
  } else {
    list.insert(list.end(), {&wq, &wk, &wv});
  }
  list.push_back(&wo);
  if (w_gate_up) {
    list.push_back(&*w_gate_up);
  } else {
    list.insert(list.end(), {&w_gate, &w_up});
  }
  list.push_back(&w_down);
  return list;
}

std::vector<const kernels::MatrixView*> LayerWeights::matrices() const {
  std::vector<kernels::MatrixView*> list = const_cast<LayerWeights*>(this)->matrices();
  return {list.begin(), list.end()};
}

size_t Weights::bytes_per_token() const {
  auto bytes = [](const kernels::MatrixView& m) {
    return kernels::row_bytes(m.dtype, m.cols) * static_cast<size_t>(m.rows);
  };
  size_t total = bytes(output);
  for (const LayerWeights& layer : layers) {
    for (const kernels::MatrixView* m : layer.matrices()) total += bytes(*m);
  }
  return total;
}

namespace {

// The optional per-layer vector `name` ([size]) as the architecture's presence says: empty when
// absent from the file (or from the architecture).
std::vector<float> layer_vector(const GgufTensors& tensors, const std::string& name, int64_t size,
                                TensorPresence presence) {
  if (presence == TensorPresence::kAbsent) return {};
  if (presence == TensorPresence::kOptional && tensors.find(name) == nullptr) return {};
  return tensors.vector(name, size);
}

}  // namespace

Weights weights_from_gguf(std::shared_ptr<const gguf::File> file, ModelConfig& config) {
  namespace tn = tensor_name;
  const Architecture& arch = find_architecture(config.architecture);
  GgufTensors tensors(*file);
  const std::string rope_freqs(tn::kRopeFreqs);
  if (const gguf::TensorInfo* freqs = tensors.find(rope_freqs)) {
    config.rope.freq_factors =
        tensors.vector(rope_freqs, freqs->shape.empty() ? 0 : freqs->shape[0]);
  } else if (arch.long_rope_factors != TensorPresence::kAbsent) {
    const std::string long_factors(tn::kRopeFactorsLong), short_factors(tn::kRopeFactorsShort);
    if (tensors.find(long_factors) != nullptr) {
      config.rope.freq_factors = tensors.vector(long_factors, config.rope.num_dims / 2);
      tensors.vector(short_factors,
                     config.rope.num_dims / 2);  // required with the long ones (unused)
    }
  }
  const std::string token_embd(tn::kTokenEmbd);
  if (config.vocab_size == 0) {
    const gguf::TensorInfo& embd = tensors.require(token_embd);
    if (embd.shape.size() == 2) config.vocab_size = static_cast<int64_t>(embd.shape[1]);
  }
  config.validate();

  const int64_t dim = config.dim, q_dim = config.q_dim(), kv_dim = config.kv_dim(),
                ffn_dim = config.ffn_dim;
  Weights weights;
  weights.token_embd = tensors.matrix(token_embd, config.vocab_size, dim);
  weights.layers.resize(config.num_layers);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    auto name = [i](std::string_view suffix) { return tn::layer(i, suffix); };
    LayerWeights& layer = weights.layers[i];
    layer.attn_norm = tensors.vector(name(tn::kAttnNorm), dim);
    if (arch.qkv_layout == QkvLayout::kFused) {
      layer.wqkv = tensors.matrix(name(tn::kAttnQkv), q_dim + 2 * kv_dim, dim);
    } else {
      layer.wq = tensors.matrix(name(tn::kAttnQ), q_dim, dim);
      layer.wk = tensors.matrix(name(tn::kAttnK), kv_dim, dim);
      layer.wv = tensors.matrix(name(tn::kAttnV), kv_dim, dim);
    }
    layer.bq = layer_vector(tensors, name(tn::kAttnQBias), q_dim, arch.qkv_bias);
    layer.bk = layer_vector(tensors, name(tn::kAttnKBias), kv_dim, arch.qkv_bias);
    layer.bv = layer_vector(tensors, name(tn::kAttnVBias), kv_dim, arch.qkv_bias);
    layer.q_norm = layer_vector(tensors, name(tn::kAttnQNorm), config.head_dim, arch.qk_norm);
    layer.k_norm = layer_vector(tensors, name(tn::kAttnKNorm), config.head_dim, arch.qk_norm);
    layer.wo = tensors.matrix(name(tn::kAttnOutput), dim, q_dim);
    layer.ffn_norm = tensors.vector(name(tn::kFfnNorm), dim);
    if (arch.ffn_layout == FfnLayout::kFusedGateUp) {
      layer.w_gate_up = tensors.matrix(name(tn::kFfnUp), 2 * ffn_dim, dim);
    } else {
      layer.w_gate = tensors.matrix(name(tn::kFfnGate), ffn_dim, dim);
      layer.w_up = tensors.matrix(name(tn::kFfnUp), ffn_dim, dim);
    }
    layer.w_down = tensors.matrix(name(tn::kFfnDown), dim, ffn_dim);
  }
  weights.output_norm = tensors.vector(std::string(tn::kOutputNorm), dim);
  if (const std::string output(tn::kOutput); tensors.find(output) != nullptr) {
    weights.output = tensors.matrix(output, config.vocab_size, dim);
  } else {
    weights.output = weights.token_embd;
    weights.tied_output = true;
  }
  // A tensor nothing reads means a variant sieve does not implement (an output bias, Phi-3
  // long-context rope factors, ...): running without it would be silently wrong.
  if (std::vector<std::string> unused = tensors.unused(); !unused.empty()) {
    std::string list;
    for (size_t k = 0; k < unused.size() && k < 8; ++k) list += (k ? ", " : "") + unused[k];
    if (unused.size() > 8) list += fmt::format(", ... ({} in all)", unused.size());
    fail(
        "model file has tensors sieve's '{}' architecture does not use: {}; this variant of the "
        "architecture is "
        "not supported",
        config.architecture, list);
  }
  weights.storage = std::move(file);
  return weights;
}

namespace {

// Owned f32 buffers for a llama2.c checkpoint; views point into `data`.
struct Llama2cStorage {
  MappedFile file;
};

}  // namespace

Llama2cModel load_llama2c_checkpoint(const std::string& path) {
  auto storage = std::make_shared<Llama2cStorage>();
  storage->file = MappedFile::open(path);
  std::span<const uint8_t> bytes = storage->file.bytes();
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  if (bytes.size() < kHeaderBytes) fail("'{}' is too small to be a llama2.c checkpoint", path);
  int32_t header[7];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  const auto [dim, hidden_dim, n_layers, n_heads, n_kv_heads, signed_vocab, seq_len] =
      std::array<int32_t, 7>{header[0], header[1], header[2], header[3],
                             header[4], header[5], header[6]};
  for (int32_t value : {dim, hidden_dim, n_layers, n_heads, n_kv_heads, seq_len}) {
    if (value <= 0 || value > (1 << 20))
      fail("'{}': implausible llama2.c header value {}", path, value);
  }
  const bool shared_classifier = signed_vocab > 0;
  const int64_t vocab = signed_vocab > 0 ? signed_vocab : -static_cast<int64_t>(signed_vocab);
  if (vocab == 0 || vocab > (1 << 24)) fail("'{}': implausible vocabulary size {}", path, vocab);

  Llama2cModel model;
  ModelConfig& config = model.config;
  config.architecture = "llama";
  config.name = path;
  config.dim = dim;
  config.ffn_dim = hidden_dim;
  config.num_layers = n_layers;
  config.num_heads = n_heads;
  config.num_kv_heads = n_kv_heads;
  config.head_dim = dim / n_heads;
  config.vocab_size = vocab;
  config.context_length = seq_len;
  config.rms_eps = 1e-5f;
  config.rope.num_dims = config.head_dim;
  config.rope.freq_base = 10000.0f;
  config.rope.ordering = RopeOrdering::kNormal;
  config.validate();

  // Walk the f32 arrays in file order, checking each fits.
  const float* base = reinterpret_cast<const float*>(bytes.data() + kHeaderBytes);
  const size_t num_floats = (bytes.size() - kHeaderBytes) / sizeof(float);
  size_t cursor = 0;
  auto take = [&](size_t count, const char* what) {
    if (count > num_floats - cursor) fail("'{}' is truncated (reading {})", path, what);
    const float* start = base + cursor;
    cursor += count;
    return start;
  };
  auto matrix = [](const float* data, int64_t rows, int64_t cols) {
    return kernels::MatrixView{kernels::DType::kF32, data, rows, cols};
  };
  const int64_t head_dim = config.head_dim, kv_dim = config.kv_dim(), L = n_layers;
  const float* embd = take(vocab * dim, "token embeddings");
  const float* rms_att = take(L * dim, "attention norms");
  const float* wq = take(L * dim * config.q_dim(), "wq");
  const float* wk = take(L * dim * kv_dim, "wk");
  const float* wv = take(L * dim * kv_dim, "wv");
  const float* wo = take(L * config.q_dim() * dim, "wo");
  const float* rms_ffn = take(L * dim, "ffn norms");
  const float* w1 = take(L * dim * hidden_dim, "w1");
  const float* w2 = take(L * hidden_dim * dim, "w2");
  const float* w3 = take(L * dim * hidden_dim, "w3");
  const float* rms_final = take(dim, "final norm");
  take(static_cast<size_t>(seq_len) * head_dim, "rope tables");  // freq_cis_real + imag
  const float* wcls = shared_classifier ? embd : take(vocab * dim, "classifier");

  Weights& weights = model.weights;
  weights.token_embd = matrix(embd, vocab, dim);
  weights.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& layer = weights.layers[l];
    layer.attn_norm.assign(rms_att + l * dim, rms_att + (l + 1) * dim);
    layer.wq = matrix(wq + l * dim * config.q_dim(), config.q_dim(), dim);
    layer.wk = matrix(wk + l * dim * kv_dim, kv_dim, dim);
    layer.wv = matrix(wv + l * dim * kv_dim, kv_dim, dim);
    layer.wo = matrix(wo + l * config.q_dim() * dim, dim, config.q_dim());
    layer.ffn_norm.assign(rms_ffn + l * dim, rms_ffn + (l + 1) * dim);
    layer.w_gate = matrix(w1 + l * dim * hidden_dim, hidden_dim, dim);
    layer.w_down = matrix(w2 + l * hidden_dim * dim, dim, hidden_dim);
    layer.w_up = matrix(w3 + l * dim * hidden_dim, hidden_dim, dim);
  }
  weights.output_norm.assign(rms_final, rms_final + dim);
  weights.output = matrix(wcls, vocab, dim);
  weights.tied_output = shared_classifier;
  weights.storage = std::move(storage);
  return model;
}

}  // namespace sieve::model
