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
#include "util/error.h"

namespace sieve::model {

namespace {

// Grows `buffer` (backend memory) to hold at least `floats` floats; its contents are scratch.
float* grow(kernels::Backend& backend, kernels::DeviceBuffer& buffer, int64_t floats) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, 1)) * sizeof(float);
  if (buffer.bytes() < bytes) buffer = backend.allocate(std::max(bytes, buffer.bytes() * 3 / 2));
  return buffer.as<float>();
}

// A block-quantized KV cache (q8 / q4, kv_cache.h) stores keys rotated by a normalized
// Walsh–Hadamard transform (kernels::rotate_heads), and the queries that read them are rotated
// alike: q·k is unchanged, and a key channel's outlier is spread over its quantization block
// instead of setting the block's scale (attention output's rel. L2 error against f32 with one
// outlier key channel, tests/kernels/paged_attention_test.cc: q8 2.5e-2 -> 1.0e-2 rotated, q4
// 0.25 -> 0.15). The transform works on powers of two: groups of the largest one
// dividing head_dim (a multiple of 32 there, so >= 32): the whole head at 64 or 128, blocks of
// 32 at 96. The rotation follows the key smoothing below. f32 / f16 caches are neither smoothed
// nor rotated (their outputs stay bit for bit).
bool rotates_keys(const KvCache& cache) { return kernels::is_block_kv_dtype(cache.dtype()); }
int64_t rotation_size(int64_t head_dim) { return head_dim & -head_dim; }

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
// engine makes one (ensure_key_smoothing: measure_key_smoothing), from a forward
// pass over kSmoothingTokens pseudo-random tokens with an f32 cache. copy-lm, K alone
// quantized (V and Q exact), rotated: top-1 0.70 -> 0.82 (q4), 0.980 -> 0.992 (q8, with V q8).
// Cost: one f32 prefill of kSmoothingTokens (copy-lm's whole q4 cache, mean KL: 64 tokens
// 0.31, 128 0.24, 256 0.18, 512 0.12, 1024 0.12, none 0.34; the teacher-forced test prefers
// 256 to 512), only for a model that gets a q8 / q4 cache (~0.2 s on the generated 57M model).
constexpr int64_t kSmoothingTokens = 256;
constexpr uint32_t kSmoothingSeed = 20260501;

}  // namespace

// Every quantized matrix the forward pass multiplies by (Q8_0, Q4_0 .. Q5_1, IQ4_NL, Q2_K .. Q6_K,
// IQ4_XS), and every F16 / BF16 one, gets the CPU backend's packed copy (kernels::pack_for_matmul,
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
    if (view.packed == nullptr) return std::nullopt;  // it would read our copy: keep the parts
    view.data = nullptr;  // matmul reads the packed copy only; `bytes` goes now
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

void LlamaModel::ensure_key_smoothing() const {
  // Measuring writes smoothing_ and the layers' pointers into it: setup that belongs to
  // construction, deferred to the first use on a quantized cache (the model object itself is
  // never const; the engine holds it through a pointer to const).
  std::call_once(smoothing_measured_,
                 [this] { const_cast<LlamaModel*>(this)->measure_key_smoothing(); });
}

void LlamaModel::measure_key_smoothing() {
  kernels::Backend& b = *backend_;
  const ModelConfig& c = config_;
  const int64_t head_dim = c.head_dim, nkv = c.num_kv_heads, group = c.group_size();
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const auto n = static_cast<int32_t>(std::min<int64_t>(kSmoothingTokens, c.context_length));
  if (n < 2) return;
  auto [cache, block_table] = KvCache::for_one_sequence(b, c, n, 16, kernels::DType::kF32);
  Batch batch;
  batch.begin_sequence(block_table);
  std::mt19937 rng(kSmoothingSeed);
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  for (int32_t t = 0; t < n; ++t) batch.add(static_cast<TokenId>(token(rng)), t, t == n - 1);
  // Per layer: sums of k, k^2 ([kv_dim]) and q^2 ([q_dim]) over the tokens, in double.
  std::vector<double> k_sum(static_cast<size_t>(c.num_layers * kv_dim)), k_sq(k_sum.size()),
      q_sq(static_cast<size_t>(c.num_layers * q_dim));
  std::vector<float> host_q(static_cast<size_t>(n * q_dim)),
      host_k(static_cast<size_t>(n * kv_dim));
  ForwardScratch scratch;
  scratch.on_projected = [&](int64_t layer, int64_t rows) {
    b.download(host_q.data(), scratch.q.as<const float>(), host_q.size() * sizeof(float));
    b.download(host_k.data(), scratch.k.as<const float>(), host_k.size() * sizeof(float));
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t i = 0; i < kv_dim; ++i) {
        const double x = host_k[static_cast<size_t>(t * kv_dim + i)];
        k_sum[static_cast<size_t>(layer * kv_dim + i)] += x;
        k_sq[static_cast<size_t>(layer * kv_dim + i)] += x * x;
      }
      for (int64_t i = 0; i < q_dim; ++i) {
        const double x = host_q[static_cast<size_t>(t * q_dim + i)];
        q_sq[static_cast<size_t>(layer * q_dim + i)] += x * x;
      }
    }
  };
  std::vector<float> logits;
  forward(batch, cache, scratch, logits);

  // Per layer: key_shift [kv_dim], key_scale [kv_dim], query_scale [q_dim].
  const int64_t per_layer = 2 * kv_dim + q_dim;
  std::vector<float> host(static_cast<size_t>(c.num_layers * per_layer));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    float* shift = host.data() + l * per_layer;
    float* key_scale = shift + kv_dim;
    float* query_scale = key_scale + kv_dim;
    for (int64_t h = 0; h < nkv; ++h) {
      // sd(k_c) and rms(q_c) over the group's query heads, each shared by a RoPE pair (RoPE
      // mixes the two channels of a pair, so only a common scale commutes with it).
      std::vector<double> s(static_cast<size_t>(head_dim));
      double max_sd = 0.0, max_rms = 0.0;
      std::vector<double> sd(static_cast<size_t>(head_dim)), rms(static_cast<size_t>(head_dim));
      for (int64_t i = 0; i < head_dim; ++i) {
        const size_t k_at = static_cast<size_t>(l * kv_dim + h * head_dim + i);
        const double mean = k_sum[k_at] / n;
        shift[h * head_dim + i] = static_cast<float>(-mean);
        sd[static_cast<size_t>(i)] = std::max(0.0, k_sq[k_at] / n - mean * mean);
        double q_ms = 0.0;
        for (int64_t g = 0; g < group; ++g)
          q_ms += q_sq[static_cast<size_t>(l * q_dim + (h * group + g) * head_dim + i)];
        rms[static_cast<size_t>(i)] = q_ms / (n * group);
      }
      const int64_t rotated = rope_.num_dims, half = rotated / 2;
      const bool neox = rope_.ordering == kernels::RopeOrdering::kNeox;
      for (int64_t i = 0; i < head_dim; ++i) {  // the (mean squares of) each pair, averaged
        const int64_t j = i >= rotated ? i : neox ? (i < half ? i + half : i - half) : (i ^ 1);
        if (j < i) continue;
        const auto ui = static_cast<size_t>(i), uj = static_cast<size_t>(j);
        sd[ui] = sd[uj] = std::sqrt((sd[ui] + sd[uj]) / 2);
        rms[ui] = rms[uj] = std::sqrt((rms[ui] + rms[uj]) / 2);
      }
      for (int64_t i = 0; i < head_dim; ++i) {
        max_sd = std::max(max_sd, sd[static_cast<size_t>(i)]);
        max_rms = std::max(max_rms, rms[static_cast<size_t>(i)]);
      }
      // Floors keep dead channels from getting extreme scales.
      double log_sum = 0.0;
      for (int64_t i = 0; i < head_dim; ++i) {
        const auto ui = static_cast<size_t>(i);
        s[ui] = std::sqrt(std::max(sd[ui], 1e-3 * max_sd + 1e-30) /
                          std::max(rms[ui], 1e-3 * max_rms + 1e-30));
        log_sum += std::log(s[ui]);
      }
      const double norm = std::exp(-log_sum / static_cast<double>(head_dim));
      for (int64_t i = 0; i < head_dim; ++i) {
        const double si = s[static_cast<size_t>(i)] * norm;
        key_scale[h * head_dim + i] = static_cast<float>(1.0 / si);
        for (int64_t g = 0; g < group; ++g)
          query_scale[(h * group + g) * head_dim + i] = static_cast<float>(si);
      }
    }
  }
  smoothing_ = b.allocate(host.size() * sizeof(float));
  b.upload(smoothing_.data(), host.data(), host.size() * sizeof(float));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const float* at = smoothing_.as<const float>() + l * per_layer;
    DeviceLayer& d = layers_[static_cast<size_t>(l)];
    d.key_shift = at;
    d.key_scale = at + kv_dim;
    d.query_scale = at + 2 * kv_dim;
  }
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

void LlamaModel::project_qkv(kernels::Backend& backend, const DeviceLayer& w, int64_t n,
                             const int32_t* positions, bool with_kv, bool rotate,
                             ForwardScratch& s) const {
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
    if (rotate && shift) backend.add_bias(shift, {x, dim}, n, dim);
    if (rotate && scale) backend.scale_columns(scale, {x, dim}, n, dim);
    if (rotate) {
      const int64_t group = rotation_size(head_dim);
      backend.rotate_heads({x, dim}, n, dim / group, group);
    }
  };
  finish(q, q_dim, w.bq, w.q_norm, c.num_heads, nullptr, w.query_scale);
  if (!with_kv) return;
  finish(k, kv_dim, w.bk, w.k_norm, c.num_kv_heads, w.key_shift, w.key_scale);
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

  if (rotates_keys(cache)) ensure_key_smoothing();
  s.kv_offsets.resize(static_cast<size_t>(n * c.num_kv_heads));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = layers_[l];
    backend.rmsnorm(x, w.attn_norm, c.rms_eps, norm, n, dim);
    project_qkv(backend, w, n, batch.positions.data(), /*with_kv=*/true, rotates_keys(cache), s);
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

// Per layer, one paged_attention_batch() over every sequence (and, for streams of their own,
// every KV head): the backend decides how to spread them over its threads. Around it, host
// work on integers only, and these backend steps:
//   1. streams of their own: gather each KV head's query heads (s.q -> s.q_group);
//   2. Quest rows that choose: page_upper_bounds of their slices (-> s.bounds), downloaded;
//      the host picks the slices;
//   3. the attention jobs, with their observation passes (attention weights, scores);
//   4. streams of their own: outputs back (s.out_group -> s.attn); attention weights asked for
//      downloaded into the sequence's StreamOutputs.
void LlamaModel::attend(kernels::Backend& backend, std::span<const SequenceRows> sequences,
                        int64_t layer, const KvCache& cache, ForwardScratch& s,
                        float* scores) const {
  const ModelConfig& c = config_;
  const int64_t head_dim = c.head_dim, q_dim = c.q_dim(), nkv = c.num_kv_heads;
  const int64_t group = c.num_heads / nkv, group_floats = group * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t first_stream = layer * nkv;
  const int32_t page_size = cache.page_size();
  const auto wants_attention = [&](const SequenceRows& seq, int64_t stream) {
    return !seq.kv->want_attention.empty() && seq.kv->want_attention[stream] && seq.num_tokens == 1;
  };
  const auto need_output = [](const SequenceRows& seq) {
    if (!seq.out) fail("attention weights or a Quest choice need an output to go to");
  };
  const auto chooses = [](const SequenceRows& seq, const KvStream& stream) {
    return stream.selection && stream.selection->choose && seq.num_tokens == 1;
  };
  const auto num_summarized = [](const KvStream& stream) {
    return std::min<int64_t>(stream.selection->num_summarized, std::ssize(stream.slices));
  };
  const auto stream_of = [&](const SequenceRows& seq, int64_t g) -> const KvStream& {
    return seq.kv->streams[static_cast<size_t>(first_stream + g)];
  };
  // Keys each dense sequence's rows see.
  const auto dense_keys = [](const SequenceRows& seq) {
    return int64_t{seq.positions[seq.num_tokens - 1]} + 1;
  };
  const auto dense_wants = [&](const SequenceRows& seq) {
    for (int64_t h = 0; h < nkv; ++h) {
      if (wants_attention(seq, first_stream + h)) return true;
    }
    return false;
  };

  // Sizes of this layer's outputs, before any pointer into them is taken.
  int64_t num_weights = 0, num_bounds = 0, num_own = 0, num_rows = 0;
  for (const SequenceRows& seq : sequences) {
    num_rows = std::max<int64_t>(num_rows, int64_t{seq.first_token} + seq.num_tokens);
    if (seq.kv->shares_block_table()) {
      if (dense_wants(seq)) num_weights += nkv * dense_keys(seq);
      continue;
    }
    ++num_own;
    for (int64_t g = 0; g < nkv; ++g) {
      const KvStream& stream = stream_of(seq, g);
      if (wants_attention(seq, first_stream + g)) num_weights += stream.num_keys;
      if (chooses(seq, stream)) num_bounds += num_summarized(stream);
    }
  }
  float* weights = num_weights > 0 ? grow(backend, s.weights, num_weights) : nullptr;
  float* bounds = num_bounds > 0 ? grow(backend, s.bounds, num_bounds) : nullptr;
  const float* q = s.q.as<const float>();
  float* attn = s.attn.as<float>();
  float* q_group = s.q_group.as<float>();
  float* out_group = s.out_group.as<float>();
  float* lse = s.lse.as<float>();
  s.slices.resize(static_cast<size_t>(num_own * nkv));
  s.positions.resize(static_cast<size_t>(num_rows * nkv));
  s.row_ids.resize(static_cast<size_t>(num_rows * nkv));
  // Stream g of a sequence starting at row f with nt rows: its query heads, outputs, LSE and
  // positions at these offsets of s.q_group / s.out_group, s.lse, s.positions.
  const auto group_at = [&](int64_t f, int64_t nt, int64_t g) {
    return f * q_dim + g * nt * group_floats;
  };

  // 1. and 2.: each KV head's query heads of streams of their own; Quest's bounds.
  int64_t own_idx = 0, bounds_at = 0;
  for (const SequenceRows& seq : sequences) {
    if (seq.kv->shares_block_table()) continue;
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    // Row (f + i) * nkv + g of s.q, in rows of one group's heads, goes to row g * nt + i.
    int32_t* ids = &s.row_ids[f * nkv];
    for (int64_t g = 0; g < nkv; ++g) {
      for (int64_t i = 0; i < nt; ++i) ids[g * nt + i] = static_cast<int32_t>((f + i) * nkv + g);
    }
    backend.gather_rows({q, group_floats}, std::span<const int32_t>(ids, nt * nkv),
                        {q_group + f * q_dim, group_floats}, group_floats);
    for (int64_t g = 0; g < nkv; ++g) {
      const KvStream& stream = stream_of(seq, g);
      if (!chooses(seq, stream)) continue;
      // A one-head view whose "page" b is summary b.
      SliceScratch& scratch = s.slices[static_cast<size_t>(own_idx * nkv + g)];
      const int64_t num_blocks = num_summarized(stream);
      scratch.slice_ids.resize(static_cast<size_t>(num_blocks));
      for (int32_t b = 0; b < num_blocks; ++b) scratch.slice_ids[b] = b;
      const kernels::PagedKv summary_view{.page_size = page_size,
                                          .head_dim = head_dim,
                                          .num_kv_heads = 1,
                                          .block_table = scratch.slice_ids};
      backend.page_upper_bounds(
          summary_view, {.data = stream.selection->summaries, .page_stride = 2 * head_dim},
          q_group + group_at(f, nt, g), group, num_blocks, bounds + bounds_at);
      bounds_at += num_blocks;
    }
    ++own_idx;
  }
  if (num_bounds > 0) {
    s.host_bounds.resize(static_cast<size_t>(num_bounds));
    backend.download(s.host_bounds.data(), bounds, s.host_bounds.size() * sizeof(float));
  }

  // 3. One job per dense sequence, one per stream of the others.
  s.jobs.clear();
  s.observations.clear();
  // At most two observations per job; reserved so that the jobs' spans into it stay put.
  s.observations.reserve(static_cast<size_t>(2 * (std::ssize(sequences) + num_own * nkv)));
  const auto observations_from = [&](size_t first) {
    return std::span<const kernels::ObservationOutput>(s.observations.data() + first,
                                                       s.observations.size() - first);
  };
  own_idx = 0;
  bounds_at = 0;
  int64_t weights_at = 0;
  for (const SequenceRows& seq : sequences) {
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    if (seq.kv->shares_block_table()) {
      const size_t first_observation = s.observations.size();
      // Every stream of the layer reads one block table: one job for all heads reads each page
      // once, through all its heads.
      const int64_t num_keys = dense_keys(seq);
      const bool want = dense_wants(seq);
      if (scores) s.observations.push_back({.num_keys = num_keys, .scores = scores});
      if (want) {  // one extra pass over the row's keys, reusing its log-sum-exp
        need_output(seq);
        s.observations.push_back({.num_keys = num_keys, .scores = weights + weights_at});
        weights_at += nkv * num_keys;
      }
      s.jobs.push_back({.kv = cache.layer_view(layer, seq.kv->block_table),
                        .query = {.q = q + f * q_dim,
                                  .positions = std::span<const int32_t>(seq.positions, nt),
                                  .num_heads = c.num_heads,
                                  .scale = scale,
                                  .window = window()},
                        .out = {.out = attn + f * q_dim,
                                .row_lse = want || scores ? lse + f * c.num_heads : nullptr},
                        .observations = observations_from(first_observation)});
      continue;
    }
    // Streams of their own: each KV head has its own kept keys, so the query heads of one group
    // ([nt][group][head_dim], gathered in step 1) attend against that stream alone.
    float* head_scores = scores;  // each stream's after the ones before it in the layer
    for (int64_t g = 0; g < nkv; ++g) {
      const int64_t stream_idx = first_stream + g;
      const KvStream& stream = stream_of(seq, g);
      const size_t first_head_observation = s.observations.size();
      int32_t* head_positions = &s.positions[f * nkv + g * nt];
      for (int64_t i = 0; i < nt; ++i) head_positions[i] = seq.positions[i] - stream.num_dropped;
      std::span<const int32_t> slices = stream.slices;
      if (stream.selection && nt == 1) {
        std::span<const float> slice_bounds;
        if (chooses(seq, stream)) {
          slice_bounds = std::span<const float>(s.host_bounds)
                             .subspan(static_cast<size_t>(bounds_at),
                                      static_cast<size_t>(num_summarized(stream)));
          bounds_at += num_summarized(stream);
        }
        SliceScratch& scratch = s.slices[static_cast<size_t>(own_idx * nkv + g)];
        slices = select_slices(stream, slice_bounds, scratch);
        if (stream.selection->choose) {
          need_output(seq);
          seq.out->chosen_slices[static_cast<size_t>(stream_idx)] = scratch.chosen;
        }
        head_positions[0] = static_cast<int32_t>((std::ssize(slices) - 1) * page_size +
                                                 (stream.num_keys - 1) % page_size);
      }
      const bool want = wants_attention(seq, stream_idx);
      if (head_scores) {  // observation pass: every row's attention over this stream's keys
        s.observations.push_back({.num_keys = stream.num_keys, .scores = head_scores});
        head_scores += stream.num_keys;
      }
      if (want) {  // one extra pass over this row's keys, reusing its log-sum-exp
        need_output(seq);
        s.observations.push_back({.num_keys = stream.num_keys, .scores = weights + weights_at});
        weights_at += stream.num_keys;
      }
      const bool need_lse = want || scores;
      s.jobs.push_back(
          {.kv = cache.slice_view(slices, stream.key_offset),
           .query = {.q = q_group + group_at(f, nt, g),
                     .positions = std::span<const int32_t>(head_positions, nt),
                     .num_heads = group,
                     .scale = scale,
                     .window = window()},
           .out = {.out = out_group + group_at(f, nt, g),
                   .row_lse = need_lse ? lse + f * c.num_heads + g * nt * group : nullptr},
           .observations = observations_from(first_head_observation)});
    }
    ++own_idx;
  }
  backend.paged_attention_batch(s.jobs);

  // 4. Outputs of streams of their own back into attn; attention weights to the host.
  weights_at = 0;
  for (const SequenceRows& seq : sequences) {
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    if (seq.kv->shares_block_table()) {
      if (!dense_wants(seq)) continue;
      const int64_t num_keys = dense_keys(seq);
      for (int64_t h = 0; h < nkv; ++h) {
        if (!wants_attention(seq, first_stream + h)) continue;
        std::vector<float>& head = seq.out->attention[static_cast<size_t>(first_stream + h)];
        head.resize(static_cast<size_t>(num_keys));
        backend.download(head.data(), weights + weights_at + h * num_keys,
                         head.size() * sizeof(float));
      }
      weights_at += nkv * num_keys;
      continue;
    }
    // Row g * nt + i of out_group goes to row (f + i) * nkv + g of attn (rows of group_floats).
    int32_t* ids = &s.row_ids[f * nkv];
    for (int64_t i = 0; i < nt; ++i) {
      for (int64_t g = 0; g < nkv; ++g) ids[i * nkv + g] = static_cast<int32_t>(g * nt + i);
    }
    backend.gather_rows({out_group + f * q_dim, group_floats},
                        std::span<const int32_t>(ids, nt * nkv), {attn + f * q_dim, group_floats},
                        group_floats);
    for (int64_t g = 0; g < nkv; ++g) {
      if (!wants_attention(seq, first_stream + g)) continue;
      const KvStream& stream = stream_of(seq, g);
      std::vector<float>& head = seq.out->attention[static_cast<size_t>(first_stream + g)];
      head.resize(static_cast<size_t>(stream.num_keys));
      backend.download(head.data(), weights + weights_at, head.size() * sizeof(float));
      weights_at += stream.num_keys;
    }
  }
}

std::vector<int32_t> top_slices(std::span<const float> bounds, std::span<const int32_t> forced,
                                int32_t top_k) {
  const auto num_slices = static_cast<int32_t>(bounds.size());
  std::vector<int32_t> chosen;
  if (num_slices <= top_k) {
    for (int32_t b = 0; b < num_slices; ++b) chosen.push_back(b);
    return chosen;
  }
  std::vector<uint8_t> taken(bounds.size(), 0);
  for (int32_t b : forced) {
    if (b < 0 || b >= num_slices) fail("forced slice {} is outside the stream", b);
    taken[b] = 1;
  }
  std::vector<int32_t> others;
  for (int32_t b = 0; b < num_slices; ++b) (taken[b] ? chosen : others).push_back(b);
  const auto room = std::max<int64_t>(0, top_k - std::ssize(chosen));
  const auto better = [&](int32_t a, int32_t b) {
    const bool a_nan = std::isnan(bounds[a]), b_nan = std::isnan(bounds[b]);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && bounds[a] != bounds[b]) return bounds[a] > bounds[b];
    return a < b;
  };
  const auto take = std::min<int64_t>(room, std::ssize(others));
  std::partial_sort(others.begin(), others.begin() + take, others.end(), better);
  chosen.insert(chosen.end(), others.begin(), others.begin() + take);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// Quest: the slices one decode row of `stream` reads: a choice from `bounds` (one per
// summarized slice; the newer ones count as +inf), or the choice it reuses. Every slice keeps
// its place in key order, so the row sees the chosen keys in order and itself last: its
// position among them is computed by the caller.
std::span<const int32_t> LlamaModel::select_slices(const KvStream& stream,
                                                   std::span<const float> bounds,
                                                   SliceScratch& s) const {
  const SliceSelection& selection = *stream.selection;
  const auto num_slices = static_cast<int32_t>(stream.slices.size());
  if (selection.choose) {
    s.slice_bounds.assign(static_cast<size_t>(num_slices), std::numeric_limits<float>::infinity());
    std::copy(bounds.begin(), bounds.end(), s.slice_bounds.begin());
    s.chosen = top_slices(s.slice_bounds, selection.forced, selection.top_k);
  } else {
    s.chosen = selection.reuse;
  }
  if (s.chosen.empty() || s.chosen.back() != num_slices - 1)
    fail("a Quest selection must read the newest slice");
  if (std::ssize(s.chosen) == num_slices) return stream.slices;
  s.read_slices.resize(s.chosen.size());
  for (size_t i = 0; i < s.chosen.size(); ++i) {
    const int32_t b = s.chosen[i];
    if (b < 0 || b >= num_slices || (i > 0 && b <= s.chosen[i - 1]))
      fail("a Quest selection must be ascending slice indices");
    s.read_slices[i] = stream.slices[static_cast<size_t>(b)];
  }
  return s.read_slices;
}

void LlamaModel::observe_rows(std::span<const TokenId> window_tokens,
                              std::span<const int32_t> window_positions, bool rotate,
                              kernels::Backend& backend, ForwardScratch& s,
                              const std::function<void(int64_t layer)>& attend_and_score) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(window_tokens.size());
  if (n == 0 || static_cast<int64_t>(window_positions.size()) != n)
    fail("observe needs window tokens and positions");
  reserve(backend, n, s);
  float* x = s.x.as<float>();
  backend.get_rows(token_embd_, window_tokens, x);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = layers_[l];
    backend.rmsnorm(x, w.attn_norm, c.rms_eps, s.norm.as<float>(), n, c.dim);
    // Only Q: the window's K/V are in the cache already.
    project_qkv(backend, w, n, window_positions.data(), /*with_kv=*/false, rotate, s);
    attend_and_score(l);
    if (l + 1 == c.num_layers) break;  // the last layer's output feeds nothing here
    finish_layer(backend, w, n, s);
  }
}

void LlamaModel::observe(std::span<const TokenId> window_tokens,
                         std::span<const int32_t> window_positions, const SequenceKv& kv,
                         const KvCache& cache, ForwardScratch& s,
                         std::vector<float>& scores) const {
  kernels::Backend& backend = *backend_;
  const ModelConfig& c = config_;
  if (window_positions.empty()) fail("observe needs window tokens and positions");
  // Scores go stream after stream; a layer's streams are consecutive.
  std::vector<size_t> layer_offsets(static_cast<size_t>(c.num_layers) + 1, 0);
  if (kv.shares_block_table()) {
    const int64_t num_keys = int64_t{window_positions.back()} + 1;
    if (num_keys > static_cast<int64_t>(kv.block_table.size()) * cache.page_size())
      fail("observe window is outside the block table");
    for (int64_t l = 0; l < c.num_layers; ++l)
      layer_offsets[l + 1] = layer_offsets[l] + static_cast<size_t>(c.num_kv_heads * num_keys);
  } else {
    if (static_cast<int64_t>(kv.streams.size()) != c.num_layers * c.num_kv_heads)
      fail("observe: wrong stream count");
    for (int64_t l = 0; l < c.num_layers; ++l) {
      layer_offsets[l + 1] = layer_offsets[l];
      for (int64_t h = 0; h < c.num_kv_heads; ++h)
        layer_offsets[l + 1] += kv.streams[l * c.num_kv_heads + h].num_keys;
    }
  }
  scores.assign(layer_offsets.back(), 0.0f);
  size_t layer_floats = 0;
  for (int64_t l = 0; l < c.num_layers; ++l)
    layer_floats = std::max(layer_floats, layer_offsets[l + 1] - layer_offsets[l]);
  // One layer's scores in backend memory, downloaded after its attention.
  float* layer_scores = grow(backend, s.scores, static_cast<int64_t>(layer_floats));
  const SequenceRows rows{.kv = &kv,
                          .first_token = 0,
                          .num_tokens = static_cast<int32_t>(window_tokens.size()),
                          .positions = window_positions.data()};
  if (rotates_keys(cache)) ensure_key_smoothing();
  observe_rows(window_tokens, window_positions, rotates_keys(cache), backend, s, [&](int64_t l) {
    attend(backend, std::span<const SequenceRows>(&rows, 1), l, cache, s, layer_scores);
    backend.download(scores.data() + layer_offsets[l], layer_scores,
                     (layer_offsets[l + 1] - layer_offsets[l]) * sizeof(float));
  });
}

void LlamaModel::read_keys(const SequenceKv& kv, int32_t num_positions, const KvCache& cache,
                           ForwardScratch& s, std::vector<float>& keys) const {
  kernels::Backend& backend = *backend_;
  const ModelConfig& c = config_;
  if (kv.shares_block_table() &&
      num_positions > static_cast<int64_t>(kv.block_table.size()) * cache.page_size())
    fail("read_keys: positions outside the block table");
  if (!kv.shares_block_table() &&
      static_cast<int64_t>(kv.streams.size()) != c.num_layers * c.num_kv_heads)
    fail("read_keys: wrong stream count");
  keys.clear();
  // One view at a time through the scratch buffer: a layer's (shared table) or a stream's keys.
  const auto read = [&](const kernels::PagedKv& view, int64_t num_keys) {
    const int64_t floats = view.num_kv_heads * num_keys * c.head_dim;
    float* buffer = grow(backend, s.scores, floats);
    backend.gather_keys(view, num_keys, buffer);
    const size_t at = keys.size();
    keys.resize(at + static_cast<size_t>(floats));
    backend.download(keys.data() + at, buffer, static_cast<size_t>(floats) * sizeof(float));
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (kv.shares_block_table()) {
      read(cache.layer_view(l, kv.block_table), num_positions);
      continue;
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const KvStream& stream = kv.streams[static_cast<size_t>(l * c.num_kv_heads + h)];
      read(cache.slice_view(stream.slices, stream.key_offset), stream.num_keys);
    }
  }
}

}  // namespace sieve::model
