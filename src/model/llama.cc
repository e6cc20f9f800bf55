#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "kernels/attention_scores.h"
#include "kernels/paged_attention.h"
#include "kernels/ops.h"
#include "model/llama_internal.h"
#include "util/error.h"

namespace sieve::model {

using detail::grow;
using detail::rotates_keys;

namespace {

// A block-quantized KV cache (q8 / q4, kv_cache.h) stores keys rotated by a normalized
// Walsh–Hadamard transform (kernels::rotate_heads), and the queries that read them are rotated
// alike: q·k is unchanged, and a key channel's outlier is spread over its quantization block
// instead of setting the block's scale (attention output's rel. L2 error against f32 with one
// outlier key channel, tests/kernels/paged_attention_test.cc: q8 2.5e-2 -> 1.0e-2 rotated, q4
// 0.25 -> 0.15). The transform works on powers of two (KeySmoothing::rotation_group). The
// rotation follows the key smoothing below. f32 / f16 caches are neither smoothed nor rotated
// (their outputs stay bit for bit).

// Key smoothing (before the rotation, on q8 / q4 caches only, like it): per layer, kv head and
// channel c, k_c <- (k_c - mu_c) / s_c and, for the query heads of its group, q_c <- q_c * s_c.
// q·k becomes q·k - q·mu: the same shift for every key a query row scores, so softmax, its
// output, SnapKV's probabilities and Quest's page ranking (bounds summed over the group) are
// unchanged; only row_max / LSE move by -q·mu. mu removes the keys' per-channel offsets (RoPE's
// slow channels carry near-constant offsets of up to 6 on copy-lm) that per-token scales and
// the rotation would otherwise spread over every channel; s_c = sqrt(sd(k_c) / rms(q_c)),
// shared by a RoPE pair and normalised to geometric mean 1 per head, balances the rounding
// error of k against the weight q gives it (SmoothQuant's alpha = 0.5; QServe's SmoothAttention
// scales keys alike). mu and s are measured once, when the first q8 / q4 cache is used or an
// engine makes one (prepare_cache: measure_key_smoothing), from a forward
// pass over kSmoothingTokens pseudo-random tokens with an f32 cache, once per KV dtype.
//
// Smoothing and rotation are chosen per kv head: both, unless one or neither rounds the head's
// keys at far less cost to its attention on that pass (key_smoothing.h: a head of few
// equal-magnitude codes rounds best as it is at 4 bits). copy-lm, K alone
// quantized (V and Q exact), rotated: top-1 0.70 -> 0.82 (q4), 0.980 -> 0.992 (q8, with V q8).
// Cost: one f32 prefill of kSmoothingTokens (copy-lm's whole q4 cache, mean KL: 64 tokens
// 0.31, 128 0.24, 256 0.18, 512 0.12, 1024 0.12, none 0.34; the teacher-forced test prefers
// 256 to 512), only for a model that gets a q8 / q4 cache (~0.2 s on the generated 57M model).
constexpr int64_t kSmoothingTokens = 256;
constexpr uint32_t kSmoothingSeed = 20260501;

}  // namespace

// Every quantized matrix the forward pass multiplies by (Q8_0, Q4_0 .. Q5_1, IQ4_NL, Q2_K .. Q6_K,
// IQ4_XS), and every F16 / BF16 one, gets the CPU backend's packed copy (kernels/cpu/pack.h,
// where packed_matmul_supported(dtype)): matmul() on it runs 16 rows per vector with no horizontal
// sums (Q8_0: 2.7x the multiply-adds per second of the plain VNNI kernel at bench-engine's shapes,
// 16-512 rows; Q4_0 decode ~1.45x, prefill ~1.15x, one thread) and streams decode's weights faster;
// it costs a pass over the weights at load, and the backend hands the mapped originals' pages back
// once packed.
LlamaModel::LlamaModel(ModelConfig config, Weights weights,
                       std::shared_ptr<kernels::Backend> backend)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(std::move(backend)) {
  config_.validate();
  if (!backend_) fail("a model needs a backend for its weights");
  rope_ = config_.rope.params(config_.head_dim);
  const int64_t q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  for (const LayerWeights& w : weights_.layers) {  // shapes the forward pass relies on
    const bool fused_ok = !w.wqkv || w.wqkv->rows == q_dim + 2 * kv_dim;
    const bool bias_ok = (w.bq.empty() || std::ssize(w.bq) == q_dim) &&
                         (w.bk.empty() || std::ssize(w.bk) == kv_dim) &&
                         (w.bv.empty() || std::ssize(w.bv) == kv_dim);
    const bool norm_ok = (w.q_norm.empty() || std::ssize(w.q_norm) == config_.head_dim) &&
                         (w.k_norm.empty() || std::ssize(w.k_norm) == config_.head_dim);
    const bool ffn_ok = !w.w_gate_up || w.w_gate_up->rows == 2 * config_.ffn_dim;
    if (!fused_ok || !bias_ok || !norm_ok || !ffn_ok)
      fail("layer weights do not match the model's shape");
  }

  // Norms and biases: one buffer in the backend's memory.
  kernels::Backend& b = *backend_;
  size_t num_floats = weights_.output_norm.size();
  for (const LayerWeights& w : weights_.layers) {
    for (const std::vector<float>* v :
         {&w.attn_norm, &w.ffn_norm, &w.bq, &w.bk, &w.bv, &w.q_norm, &w.k_norm})
      num_floats += v->size();
  }
  vectors_ = b.allocate(num_floats * sizeof(float));
  size_t offset = 0;
  const auto upload = [&](const std::vector<float>& v) -> const float* {
    if (v.empty()) return nullptr;
    float* at = vectors_.as<float>() + offset;
    b.upload(at, v.data(), v.size() * sizeof(float));
    offset += v.size();
    return at;
  };
  // A GGUF file's matrices lie in its mapping (llama2.c checkpoints' F32 ones are never
  // repacked, so never released); the stacked copies below are ours.
  using WeightSource = kernels::Backend::WeightSource;
  const auto prepare = [&](const kernels::MatrixView& m,
                           WeightSource source = WeightSource::kMappedFile) {
    return m.data ? b.prepare_weights(m, source) : m;
  };
  // Matrices that read the same input and share a type are stacked into one (rows of the
  // first, then the next): one matmul instead of three (Q, K, V) or two (gate, up), so decode
  // quantizes each activation once and runs one parallel region, not one per matrix. Only where
  // that costs no memory: the parts lie back to back in the file (the mapped bytes are the
  // stacked matrix), or the backend makes its own copy anyway (packed types), which then
  // replaces the parts' copies and the stacked host bytes are dropped.
  const auto stack = [&](std::initializer_list<const kernels::MatrixView*> parts)
      -> std::optional<kernels::MatrixView> {
    const kernels::MatrixView& first = **parts.begin();
    int64_t rows = 0;
    for (const kernels::MatrixView* m : parts) {
      if (!m->data || m->dtype != first.dtype || m->cols != first.cols) return std::nullopt;
      rows += m->rows;
    }
    const size_t row_bytes = kernels::row_bytes(first.dtype, first.cols);
    const auto* next = static_cast<const uint8_t*>(first.data);
    bool adjacent = true;
    for (const kernels::MatrixView* m : parts) {
      adjacent = adjacent && m->data == next;
      next += static_cast<size_t>(m->rows) * row_bytes;
    }
    if (adjacent)
      return prepare({.dtype = first.dtype, .data = first.data, .rows = rows, .cols = first.cols});
    std::vector<uint8_t> bytes(static_cast<size_t>(rows) * row_bytes);
    size_t at = 0;
    for (const kernels::MatrixView* m : parts) {
      std::memcpy(bytes.data() + at, m->data, static_cast<size_t>(m->rows) * row_bytes);
      at += static_cast<size_t>(m->rows) * row_bytes;
    }
    kernels::MatrixView view =
        prepare({.dtype = first.dtype, .data = bytes.data(), .rows = rows, .cols = first.cols},
                WeightSource::kHostMemory);
    if (view.prepared == nullptr) return std::nullopt;  // it would read our copy: keep the parts
    view.data = nullptr;  // matmul reads the prepared copy only; `bytes` goes now
    return view;
  };
  for (const LayerWeights& w : weights_.layers) {
    DeviceLayer& d = layers_.emplace_back();
    if (w.wqkv) {
      d.wqkv = prepare(*w.wqkv);
    } else if (!(d.wqkv = stack({&w.wq, &w.wk, &w.wv}))) {
      d.wq = prepare(w.wq);
      d.wk = prepare(w.wk);
      d.wv = prepare(w.wv);
    }
    d.wo = prepare(w.wo);
    if (w.w_gate_up) {
      d.w_gate_up = prepare(*w.w_gate_up);
    } else if (!(d.w_gate_up = stack({&w.w_gate, &w.w_up}))) {
      d.w_gate = prepare(w.w_gate);
      d.w_up = prepare(w.w_up);
    }
    d.w_down = prepare(w.w_down);
    d.attn_norm = upload(w.attn_norm);
    d.ffn_norm = upload(w.ffn_norm);
    d.bq = upload(w.bq);
    d.bk = upload(w.bk);
    d.bv = upload(w.bv);
    d.q_norm = upload(w.q_norm);
    d.k_norm = upload(w.k_norm);
  }
  output_norm_ = upload(weights_.output_norm);
  output_ = prepare(weights_.output);
  // A tied embedding is the output matrix: one prepared copy serves both.
  const bool tied = weights_.token_embd.data == weights_.output.data;
  token_embd_ = tied ? output_ : b.prepare_lookup_table(weights_.token_embd);
}

void LlamaModel::prepare_cache(KvCache& cache) const {
  if (rotates_keys(cache) && !cache.key_smoothing())
    cache.set_key_smoothing(key_smoothing(cache.dtype()));
}

std::vector<int32_t> LlamaModel::precise_kv_streams(kernels::DType dtype) const {
  if (!kernels::is_block_kv_dtype(dtype)) return {};
  const std::span<const int32_t> streams = key_smoothing(dtype)->precise_streams();
  return {streams.begin(), streams.end()};
}

std::shared_ptr<const KeySmoothing> LlamaModel::key_smoothing(kernels::DType dtype) const {
  const std::lock_guard lock(smoothing_mutex_);
  std::shared_ptr<const KeySmoothing>& memo = smoothings_[dtype];
  if (!memo) memo = measure_key_smoothing(dtype);
  return memo;
}

std::shared_ptr<const KeySmoothing> LlamaModel::measure_key_smoothing(kernels::DType dtype) const {
  kernels::Backend& b = *backend_;
  const ModelConfig& c = config_;
  const KeySmoothing::Shape shape{.num_layers = c.num_layers,
                                  .num_heads = c.num_heads,
                                  .num_kv_heads = c.num_kv_heads,
                                  .head_dim = c.head_dim,
                                  .rope_dims = rope_.num_dims,
                                  .rope_neox = rope_.ordering == kernels::RopeOrdering::kNeox};
  KeySmoothing::Builder builder(shape, dtype);
  const auto n = static_cast<int32_t>(std::min<int64_t>(kSmoothingTokens, c.context_length));
  if (n < 2) return builder.make(b);  // nothing to measure on: the identity
  auto [cache, block_table] = KvCache::for_one_sequence(b, c, n, 16, kernels::DType::kF32);
  Batch batch;
  batch.begin_sequence(block_table);
  std::mt19937 rng(kSmoothingSeed);
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  for (int32_t t = 0; t < n; ++t) batch.add(static_cast<TokenId>(token(rng)), t, t == n - 1);
  std::vector<float> host_q(static_cast<size_t>(n * c.q_dim())),
      host_k(static_cast<size_t>(n * c.kv_dim()));
  ForwardScratch scratch;
  scratch.on_projected = [&](int64_t layer, int64_t rows) {
    b.download(host_q.data(), scratch.q.as<const float>(), host_q.size() * sizeof(float));
    b.download(host_k.data(), scratch.k.as<const float>(), host_k.size() * sizeof(float));
    builder.measure_layer(layer, host_q, host_k, rows);
  };
  std::vector<float> logits;
  forward(batch, cache, scratch, logits);
  return builder.make(b);
}

std::string LlamaModel::fingerprint() const {
  uint64_t hash = 14695981039346656037ull;
  const auto mix = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  };
  const std::string shape = config_.summary();
  mix(shape.data(), shape.size());
  const auto mix_matrix = [&](const kernels::MatrixView& m) {
    const int64_t header[3] = {static_cast<int64_t>(m.dtype), m.rows, m.cols};
    mix(header, sizeof(header));
    const size_t bytes = kernels::row_bytes(m.dtype, m.cols) * static_cast<size_t>(m.rows);
    const size_t edge = std::min<size_t>(bytes, 4096);
    mix(m.data, edge);
    mix(static_cast<const uint8_t*>(m.data) + bytes - edge, edge);
  };
  const auto mix_floats = [&](const std::vector<float>& v) {
    mix(v.data(), v.size() * sizeof(float));
  };
  mix_matrix(weights_.token_embd);
  for (const LayerWeights& w : weights_.layers) {
    mix_floats(w.attn_norm);
    mix_floats(w.ffn_norm);
    for (const std::vector<float>* v : {&w.bq, &w.bk, &w.bv, &w.q_norm, &w.k_norm}) mix_floats(*v);
    for (const kernels::MatrixView* m : w.matrices()) mix_matrix(*m);
  }
  mix_floats(weights_.output_norm);
  mix_matrix(weights_.output);
  return fmt::format("{:016x}", hash);
}

// Where new token i (at `position`) of stream (layer, kv_head) goes: (slice, slot).
std::pair<int32_t, int32_t> new_row(const SequenceKv& kv, const KvCache& cache, int64_t layer,
                                    int32_t kv_head, int32_t i, int32_t position) {
  const kv::SliceShape shape = cache.slice_shape();
  const int32_t stream = shape.stream_index(static_cast<int32_t>(layer), kv_head);
  if (!kv.shares_block_table()) return kv.streams[static_cast<size_t>(stream)].new_rows[i];
  const kv::PageId page{kv.block_table[static_cast<size_t>(position / shape.page_size)]};
  return {static_cast<int32_t>(shape.dense_slice(page, stream).value), position % shape.page_size};
}

void LlamaModel::check_batch(const Batch& batch, const KvCache& cache) const {
  int64_t expected_first = 0;
  for (const BatchSequence& seq : batch.sequences) {
    if (seq.first_token != expected_first || seq.num_tokens <= 0) {
      fail("batch sequences must cover the tokens contiguously, in order");
    }
    expected_first += seq.num_tokens;
    if (!seq.kv.shares_block_table()) {
      const auto& streams = seq.kv.streams;
      if (static_cast<int64_t>(streams.size()) != config_.num_layers * config_.num_kv_heads) {
        fail("a sequence with streams of its own needs one per layer and KV head");
      }
      const int64_t num_slices =
          int64_t{cache.num_pages()} * config_.num_layers * config_.num_kv_heads;
      for (const KvStream& stream : streams) {
        if (static_cast<int32_t>(stream.new_rows.size()) != seq.num_tokens)
          fail("a stream misses new rows");
        if (int64_t{stream.key_offset} + stream.num_keys >
            static_cast<int64_t>(stream.slices.size()) * cache.page_size()) {
          fail("a stream has more keys than slots");
        }
        for (int32_t slice : stream.slices) {
          if (slice < 0 || slice >= num_slices) fail("slice {} is outside the KV cache", slice);
        }
        for (const auto& [slice, slot] : stream.new_rows) {
          if (slice < 0 || slice >= num_slices || slot < 0 || slot >= cache.page_size())
            fail("new row (slice {}, slot {}) is outside the KV cache", slice, slot);
        }
        if (!stream.areas.empty()) {
          const int32_t s = static_cast<int32_t>(&stream - streams.data());
          if (cache.precise_rank(s / config_.num_kv_heads, s % config_.num_kv_heads) < 0)
            fail("stream {} has f16 areas but is not a precise stream of the cache", s);
          if (stream.areas.size() != stream.slices.size() ||
              stream.new_area_rows.size() != stream.new_rows.size())
            fail("a precise stream's areas must match its slices and new rows");
          for (int32_t area : stream.areas) {
            if (area < 0 || area >= cache.num_precise_areas())
              fail("area {} is outside the KV cache's f16 copy", area);
          }
          for (const auto& [area, slot] : stream.new_area_rows) {
            if (area < 0 || area >= cache.num_precise_areas() || slot < 0 ||
                slot >= cache.page_size())
              fail("new row (area {}, slot {}) is outside the KV cache's f16 copy", area, slot);
          }
        }
        if (stream.selection) {
          if (stream.key_offset != 0 || stream.num_dropped != 0)
            fail("a Quest stream must hold every key");
          if (stream.selection->choose && stream.selection->top_k < 1)
            fail("a choosing Quest stream must read at least one slice");
          if (stream.selection->choose && stream.selection->num_summarized > 0 &&
              !stream.selection->summaries) {
            fail("a choosing Quest stream needs its slice summaries");
          }
        }
      }
      continue;
    }
    for (int32_t page : seq.kv.block_table) {
      if (page < 0 || page >= cache.num_pages())
        fail("page id {} is outside the KV cache ({} pages)", page, cache.num_pages());
    }
    const int64_t capacity = static_cast<int64_t>(seq.kv.block_table.size()) * cache.page_size();
    for (int32_t i = seq.first_token; i < seq.first_token + seq.num_tokens; ++i) {
      if (batch.positions[i] < 0 || batch.positions[i] >= capacity) {
        fail("position {} is outside the sequence's {} KV slots", batch.positions[i], capacity);
      }
      if (i > seq.first_token && batch.positions[i] != batch.positions[i - 1] + 1) {
        fail("positions of a sequence's tokens must be consecutive");
      }
    }
  }
  if (expected_first != batch.size()) fail("batch has tokens outside any sequence");
  for (int64_t i = 0; i < batch.size(); ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= config_.vocab_size) {
      fail("token id {} is outside the vocabulary (size {})", batch.tokens[i], config_.vocab_size);
    }
  }
}

void LlamaModel::reserve(kernels::Backend& backend, int64_t n, ForwardScratch& s) const {
  const ModelConfig& c = config_;
  grow(backend, s.x, n * c.dim);
  grow(backend, s.norm, n * c.dim);
  grow(backend, s.q, n * c.q_dim());
  grow(backend, s.k, n * c.kv_dim());
  grow(backend, s.v, n * c.kv_dim());
  grow(backend, s.attn, n * c.q_dim());
  grow(backend, s.gate, n * c.ffn_dim);
  grow(backend, s.up, n * c.ffn_dim);
  grow(backend, s.q_group, n * c.q_dim());
  grow(backend, s.out_group, n * c.q_dim());
  grow(backend, s.lse, n * c.num_heads);
  int64_t fused = 0;
  for (const DeviceLayer& w : layers_) {
    if (w.wqkv) fused = std::max(fused, w.wqkv->rows);
    if (w.w_gate_up) fused = std::max(fused, w.w_gate_up->rows);
  }
  if (fused > 0) grow(backend, s.fused, n * fused);
}

void LlamaModel::project_qkv(kernels::Backend& backend, const DeviceLayer& w, int64_t layer,
                             int64_t n, const int32_t* positions, bool with_kv,
                             const KeySmoothing* smoothing, ForwardScratch& s) const {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), head_dim = c.head_dim;
  float* q = s.q.as<float>();
  float* k = s.k.as<float>();
  float* v = s.v.as<float>();
  if (w.wqkv) {  // one pass over the fused weights; row t is [q | k | v]
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    float* fused = s.fused.as<float>();
    backend.matmul(*w.wqkv, s.norm.as<const float>(), n, fused);
    backend.copy_rows_2d({fused, qkv_dim}, {q, q_dim}, n, q_dim);
    if (with_kv) {
      backend.copy_rows_2d({fused + q_dim, qkv_dim}, {k, kv_dim}, n, kv_dim);
      backend.copy_rows_2d({fused + q_dim + kv_dim, qkv_dim}, {v, kv_dim}, n, kv_dim);
    }
  } else {
    backend.matmul(w.wq, s.norm.as<const float>(), n, q);
    if (with_kv) {
      backend.matmul(w.wk, s.norm.as<const float>(), n, k);
      backend.matmul(w.wv, s.norm.as<const float>(), n, v);
    }
  }
  // Bias, then each head's RMSNorm, then RoPE (the order of qwen2 / qwen3).
  const std::span<const int32_t> row_positions(positions, static_cast<size_t>(n));
  const auto finish = [&](float* x, int64_t dim, const float* bias, const float* head_norm,
                          int64_t num_heads, const float* shift, const float* scale) {
    if (bias) backend.add_bias(bias, {x, dim}, n, dim);
    if (head_norm) backend.rmsnorm(x, head_norm, c.rms_eps, x, n * num_heads, head_dim);
    backend.rope(rope_, row_positions, {x, dim}, num_heads);
    if (!smoothing) return;
    if (shift) backend.add_bias(shift, {x, dim}, n, dim);
    backend.scale_columns(scale, {x, dim}, n, dim);
    // The heads the smoothing rotates (a query head as its kv head), runs of them per call.
    const int64_t group = KeySmoothing::rotation_group(head_dim);
    const int64_t heads_per_kv = num_heads / c.num_kv_heads;
    for (int64_t h = 0; h < num_heads;) {
      if (!smoothing->rotates(layer, h / heads_per_kv)) {
        ++h;
        continue;
      }
      int64_t end = h + 1;
      while (end < num_heads && smoothing->rotates(layer, end / heads_per_kv)) ++end;
      backend.rotate_heads({x + h * head_dim, dim}, n, (end - h) * head_dim / group, group);
      h = end;
    }
  };
  finish(q, q_dim, w.bq, w.q_norm, c.num_heads, nullptr,
         smoothing ? smoothing->query_scale(layer) : nullptr);
  if (!with_kv) return;
  finish(k, kv_dim, w.bk, w.k_norm, c.num_kv_heads,
         smoothing ? smoothing->key_shift(layer) : nullptr,
         smoothing ? smoothing->key_scale(layer) : nullptr);
  if (w.bv) backend.add_bias(w.bv, {v, kv_dim}, n, kv_dim);
}

// After a layer's attention (s.attn): x += Wo·attn, then x += Wdown·(silu(Wgate·n) * Wup·n)
// with n = norm(x).
void LlamaModel::finish_layer(kernels::Backend& backend, const DeviceLayer& w, int64_t n,
                              ForwardScratch& s) const {
  const ModelConfig& c = config_;
  const int64_t dim = c.dim, ffn = c.ffn_dim;
  float* x = s.x.as<float>();
  float* norm = s.norm.as<float>();
  float* gate = s.gate.as<float>();
  backend.matmul(w.wo, s.attn.as<const float>(), n, norm);
  backend.add(norm, x, n * dim);
  backend.rmsnorm(x, w.ffn_norm, c.rms_eps, norm, n, dim);
  if (w.w_gate_up) {  // one pass over the fused weights; row t is [gate | up]
    float* fused = s.fused.as<float>();
    backend.matmul(*w.w_gate_up, norm, n, fused);
    backend.silu_mul({fused, 2 * ffn}, {fused + ffn, 2 * ffn}, {gate, ffn}, n, ffn);
  } else {
    float* up = s.up.as<float>();
    backend.matmul(w.w_gate, norm, n, gate);
    backend.matmul(w.w_up, norm, n, up);
    backend.silu_mul({gate, ffn}, {up, ffn}, {gate, ffn}, n, ffn);
  }
  backend.matmul(w.w_down, gate, n, norm);
  backend.add(norm, x, n * dim);
}

void LlamaModel::forward(const Batch& batch, KvCache& cache, ForwardScratch& s,
                         std::vector<float>& logits,
                         std::vector<StreamOutputs>* stream_outputs) const {
  kernels::Backend& backend = *backend_;
  check_batch(batch, cache);
  if (stream_outputs) {
    const auto num_streams = static_cast<size_t>(config_.num_layers * config_.num_kv_heads);
    stream_outputs->assign(batch.sequences.size(), {});
    for (StreamOutputs& outputs : *stream_outputs) {
      outputs.attention.resize(num_streams);
      outputs.chosen_slices.resize(num_streams);
    }
  }
  const int64_t n = batch.size();
  const ModelConfig& c = config_;
  const int64_t dim = c.dim, head_dim = c.head_dim;
  reserve(backend, n, s);
  float* x = s.x.as<float>();
  float* norm = s.norm.as<float>();

  backend.get_rows(token_embd_, batch.tokens, x);

  std::vector<SequenceRows> sequences;
  sequences.reserve(batch.sequences.size());
  for (const BatchSequence& seq : batch.sequences) {
    sequences.push_back(
        {.kv = &seq.kv,
         .first_token = seq.first_token,
         .num_tokens = seq.num_tokens,
         .positions = &batch.positions[seq.first_token],
         .out = stream_outputs ? &(*stream_outputs)[&seq - batch.sequences.data()] : nullptr});
  }

  prepare_cache(cache);
  s.kv_offsets.resize(static_cast<size_t>(n * c.num_kv_heads));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = layers_[l];
    backend.rmsnorm(x, w.attn_norm, c.rms_eps, norm, n, dim);
    project_qkv(backend, w, l, n, batch.positions.data(), /*with_kv=*/true, cache.key_smoothing(),
                s);
    if (s.on_projected) s.on_projected(l, n);
    // Every new token's K/V, row (token t, kv head h) of s.k / s.v: one store per K and V.
    for (const BatchSequence& seq : batch.sequences) {
      for (int32_t t = seq.first_token; t < seq.first_token + seq.num_tokens; ++t) {
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          const auto [slice, slot] =
              new_row(seq.kv, cache, l, h, t - seq.first_token, batch.positions[t]);
          s.kv_offsets[t * c.num_kv_heads + h] = cache.row_offset(slice, slot);
        }
      }
    }
    cache.write_rows({s.k.as<const float>(), head_dim}, {s.v.as<const float>(), head_dim},
                     s.kv_offsets);
    // Rows of precise streams also go to the streams' f16 copy (kv_cache.h): a dense
    // sequence's to its pages' areas, a sparse one's to its stream's areas, if it has them.
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t rank = cache.precise_rank(l, h);
      if (rank < 0) continue;
      for (const BatchSequence& seq : batch.sequences) {
        s.precise_offsets.resize(static_cast<size_t>(seq.num_tokens));
        if (seq.kv.shares_block_table()) {
          for (int32_t i = 0; i < seq.num_tokens; ++i) {
            const int32_t position = batch.positions[seq.first_token + i];
            s.precise_offsets[i] = cache.precise_row_offset(
                rank, seq.kv.block_table[static_cast<size_t>(position / cache.page_size())],
                position % cache.page_size());
          }
        } else {
          const KvStream& stream = seq.kv.streams[static_cast<size_t>(l * c.num_kv_heads + h)];
          if (stream.areas.empty()) continue;
          for (int32_t i = 0; i < seq.num_tokens; ++i) {
            const auto [area, slot] = stream.new_area_rows[static_cast<size_t>(i)];
            s.precise_offsets[i] = cache.area_row_offset(area, slot);
          }
        }
        const int64_t first_row = (int64_t{seq.first_token} * c.num_kv_heads + h) * head_dim;
        const int64_t stride = c.num_kv_heads * head_dim;
        cache.write_precise_rows({s.k.as<const float>() + first_row, stride},
                                 {s.v.as<const float>() + first_row, stride}, s.precise_offsets);
      }
    }
    attend(backend, sequences, l, cache, s);
    finish_layer(backend, w, n, s);
  }

  // Final norm and output head, only for the tokens that want logits.
  s.row_ids.clear();
  for (int32_t t = 0; t < n; ++t) {
    if (batch.want_logits[t]) s.row_ids.push_back(t);
  }
  const auto num_out = static_cast<int64_t>(s.row_ids.size());
  float* rows = grow(backend, s.rows, num_out * dim);
  float* out = grow(backend, s.logits, num_out * c.vocab_size);
  backend.gather_rows({x, dim}, s.row_ids, {rows, dim}, dim);
  backend.rmsnorm(rows, output_norm_, c.rms_eps, rows, num_out, dim);
  backend.matmul(output_, rows, num_out, out);
  logits.resize(static_cast<size_t>(num_out * c.vocab_size));
  backend.download(logits.data(), out, logits.size() * sizeof(float));
}

}  // namespace sieve::model
