#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "kernels/attention_scores.h"
#include "kernels/paged_attention.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::model {

namespace {

// Attaches a packed copy (kernels::pack_q8_0_for_matmul) to every Q8_0 matrix the forward
// pass multiplies by; the copies live in weights.storage. matmul() on them runs 2.7x the
// multiply-adds per second of the plain Q8_0 VNNI kernel (bench-engine's shapes, 16-512 rows)
// and streams decode's weights faster; it costs a second copy of those weights in memory
// (the mapped originals are no longer read) and a pass over them at load.
void pack_q8_0_matrices(Weights& weights) {
  auto buffers = std::make_shared<std::vector<std::vector<uint8_t>>>();
  const auto pack = [&](kernels::MatrixView& m) {
    if (m.dtype != kernels::DType::kQ8_0 || m.packed != nullptr) return;
    buffers->push_back(kernels::pack_q8_0_for_matmul(m));
    m.packed = buffers->back().data();  // stays valid when *buffers grows (moved, not copied)
  };
  for (LayerWeights& layer : weights.layers) {
    for (kernels::MatrixView* m : layer.matrices()) pack(*m);
  }
  pack(weights.output);
  if (buffers->empty()) return;
  weights.storage = std::make_shared<std::pair<std::shared_ptr<const void>, decltype(buffers)>>(
      weights.storage, buffers);
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, Weights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  config_.validate();
  if (kernels::packed_q8_0_matmul_supported()) pack_q8_0_matrices(weights_);
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

void LlamaModel::embed(std::span<const TokenId> tokens, ForwardScratch& s) const {
  const kernels::MatrixView& embd = weights_.token_embd;
  const size_t embd_row_bytes = kernels::row_bytes(embd.dtype, embd.cols);
  const int64_t dim = config_.dim;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto* row = static_cast<const uint8_t*>(embd.data) + tokens[t] * embd_row_bytes;
    kernels::dequantize_row(embd.dtype, row, &s.x[t * dim], dim);
  }
}

void LlamaModel::project_qkv(const LayerWeights& w, int64_t n, const int32_t* positions,
                             bool with_kv, ThreadPool& pool, ForwardScratch& s) const {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), head_dim = c.head_dim;
  if (w.wqkv) {  // one pass over the fused weights; row t is [q | k | v]
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    s.fused.resize(static_cast<size_t>(n * qkv_dim));
    kernels::matmul(*w.wqkv, s.norm.data(), n, s.fused.data(), pool);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = &s.fused[t * qkv_dim];
      std::memcpy(&s.q[t * q_dim], row, q_dim * sizeof(float));
      if (!with_kv) continue;
      std::memcpy(&s.k[t * kv_dim], row + q_dim, kv_dim * sizeof(float));
      std::memcpy(&s.v[t * kv_dim], row + q_dim + kv_dim, kv_dim * sizeof(float));
    }
  } else {
    kernels::matmul(w.wq, s.norm.data(), n, s.q.data(), pool);
    if (with_kv) {
      kernels::matmul(w.wk, s.norm.data(), n, s.k.data(), pool);
      kernels::matmul(w.wv, s.norm.data(), n, s.v.data(), pool);
    }
  }
  // Bias, then each head's RMSNorm, then RoPE (the order of qwen2 / qwen3).
  auto finish = [&](float* x, const std::vector<float>& bias, const std::vector<float>& head_norm,
                    int64_t num_heads, int32_t position, std::vector<float>& head) {
    for (size_t i = 0; i < bias.size(); ++i) x[i] += bias[i];
    if (!head_norm.empty()) {
      for (int64_t h = 0; h < num_heads; ++h) {
        head.assign(x + h * head_dim, x + (h + 1) * head_dim);
        kernels::rmsnorm(head.data(), head_norm.data(), c.rms_eps, x + h * head_dim, head_dim);
      }
    }
    kernels::rope(rope_, position, x, num_heads);
  };
  pool.parallel_for(n, [&](int64_t begin, int64_t end) {
    std::vector<float> head;
    for (int64_t t = begin; t < end; ++t) {
      finish(&s.q[t * q_dim], w.bq, w.q_norm, c.num_heads, positions[t], head);
      if (!with_kv) continue;
      finish(&s.k[t * kv_dim], w.bk, w.k_norm, c.num_kv_heads, positions[t], head);
      for (size_t i = 0; i < w.bv.size(); ++i) s.v[t * kv_dim + i] += w.bv[i];
    }
  });
}

// After a layer's attention (s.attn): x += Wo·attn, then x += Wdown·(silu(Wgate·n) * Wup·n)
// with n = norm(x).
void LlamaModel::finish_layer(const LayerWeights& w, int64_t n, ThreadPool& pool,
                              ForwardScratch& s) const {
  const ModelConfig& c = config_;
  const int64_t dim = c.dim;
  kernels::matmul(w.wo, s.attn.data(), n, s.norm.data(), pool);
  for (int64_t i = 0; i < n * dim; ++i) s.x[i] += s.norm[i];
  for (int64_t t = 0; t < n; ++t)
    kernels::rmsnorm(&s.x[t * dim], w.ffn_norm.data(), c.rms_eps, &s.norm[t * dim], dim);
  const int64_t ffn = c.ffn_dim;
  if (w.w_gate_up) {  // one pass over the fused weights; row t is [gate | up]
    s.fused.resize(static_cast<size_t>(n * 2 * ffn));
    kernels::matmul(*w.w_gate_up, s.norm.data(), n, s.fused.data(), pool);
    for (int64_t t = 0; t < n; ++t) {
      float* gate = &s.fused[t * 2 * ffn];
      kernels::silu_mul(gate, gate + ffn, ffn);
      std::memcpy(&s.gate[t * ffn], gate, ffn * sizeof(float));
    }
  } else {
    kernels::matmul(w.w_gate, s.norm.data(), n, s.gate.data(), pool);
    kernels::matmul(w.w_up, s.norm.data(), n, s.up.data(), pool);
    for (int64_t t = 0; t < n; ++t) kernels::silu_mul(&s.gate[t * ffn], &s.up[t * ffn], ffn);
  }
  kernels::matmul(w.w_down, s.gate.data(), n, s.norm.data(), pool);
  for (int64_t i = 0; i < n * dim; ++i) s.x[i] += s.norm[i];
}

void LlamaModel::forward(const Batch& batch, KvCache& cache, ThreadPool& pool, ForwardScratch& s,
                         std::vector<float>& logits,
                         std::vector<StreamOutputs>* stream_outputs) const {
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
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), head_dim = c.head_dim;
  s.x.resize(n * dim);
  s.norm.resize(n * dim);
  s.q.resize(n * q_dim);
  s.k.resize(n * kv_dim);
  s.v.resize(n * kv_dim);
  s.attn.resize(n * q_dim);
  s.gate.resize(n * c.ffn_dim);
  s.up.resize(n * c.ffn_dim);

  embed(batch.tokens, s);

  auto norm_all = [&](const std::vector<float>& weight) {
    for (int64_t t = 0; t < n; ++t) {
      kernels::rmsnorm(&s.x[t * dim], weight.data(), c.rms_eps, &s.norm[t * dim], dim);
    }
  };

  std::vector<const BatchSequence*> short_sequences, long_sequences;
  for (const BatchSequence& seq : batch.sequences) {
    // Short ones attend concurrently; attend's scratch buffers (streams of their own, attention
    // weights) are shared, so those run one at a time.
    const bool shared_scratch = !seq.kv.shares_block_table() || !seq.kv.want_attention.empty();
    (seq.num_tokens <= 4 && !shared_scratch ? short_sequences : long_sequences).push_back(&seq);
  }

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    norm_all(w.attn_norm);
    project_qkv(w, n, batch.positions.data(), /*with_kv=*/true, pool, s);
    for (const BatchSequence& seq : batch.sequences) {
      pool.parallel_for(seq.num_tokens, [&](int64_t begin, int64_t end) {
        for (int64_t t = seq.first_token + begin; t < seq.first_token + end; ++t) {
          for (int32_t h = 0; h < c.num_kv_heads; ++h) {
            const auto [slice, slot] =
                new_row(seq.kv, cache, l, h, t - seq.first_token, batch.positions[t]);
            cache.write_row(slice, slot, &s.k[t * kv_dim + h * head_dim],
                            &s.v[t * kv_dim + h * head_dim]);
          }
        }
      });
    }
    auto attend_sequence = [&](const BatchSequence& seq, ThreadPool& attention_pool) {
      StreamOutputs* out =
          stream_outputs ? &(*stream_outputs)[&seq - batch.sequences.data()] : nullptr;
      attend(seq.kv, l, seq.first_token, seq.num_tokens, &batch.positions[seq.first_token], cache,
             attention_pool, s, out);
    };
    // Short sequences (decodes), when there are enough of them: one sequence per task, each
    // attention single-threaded, instead of one pool dispatch (and key split + merge) per
    // sequence. Prefill chunks use the whole pool each.
    if (short_sequences.size() >= 2 * static_cast<size_t>(pool.num_threads())) {
      pool.parallel_for(
          static_cast<int64_t>(short_sequences.size()),
          [&](int64_t begin, int64_t end) {
            thread_local ThreadPool inline_pool(1);
            for (int64_t i = begin; i < end; ++i) attend_sequence(*short_sequences[i], inline_pool);
          },
          1);
    } else {
      for (const BatchSequence* seq : short_sequences) attend_sequence(*seq, pool);
    }
    for (const BatchSequence* seq : long_sequences) attend_sequence(*seq, pool);
    finish_layer(w, n, pool, s);
  }

  // Final norm and output head, only for the tokens that want logits.
  const int64_t num_out = batch.num_logits();
  s.rows.resize(num_out * dim);
  int64_t out_idx = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!batch.want_logits[t]) continue;
    kernels::rmsnorm(&s.x[t * dim], weights_.output_norm.data(), c.rms_eps, &s.rows[out_idx * dim],
                     dim);
    ++out_idx;
  }
  logits.resize(num_out * c.vocab_size);
  kernels::matmul(weights_.output, s.rows.data(), num_out, logits.data(), pool);
}

void LlamaModel::attend(const SequenceKv& kv, int64_t layer, int32_t first_token,
                        int32_t num_tokens, const int32_t* positions, const KvCache& cache,
                        ThreadPool& pool, ForwardScratch& s, StreamOutputs* out,
                        float* scores) const {
  const ModelConfig& c = config_;
  const int64_t head_dim = c.head_dim, q_dim = c.q_dim();
  const int64_t group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t first_stream = layer * c.num_kv_heads;
  const auto wants_attention = [&](int64_t stream) {
    return !kv.want_attention.empty() && kv.want_attention[stream] && num_tokens == 1;
  };
  const auto need_output = [&] {
    if (!out) fail("attention weights or a Quest choice need an output to go to");
  };

  if (kv.shares_block_table()) {
    // Every stream of the layer reads one block table: one kernel call for all heads reads
    // each page once, through all its heads.
    const kernels::AttentionQuery query{
        .q = &s.q[first_token * q_dim],
        .positions = std::span<const int32_t>(positions, num_tokens),
        .num_heads = c.num_heads,
        .scale = scale,
        .window = window()};
    const kernels::PagedKv view = cache.layer_view(layer, kv.block_table);
    bool want = false;
    for (int64_t h = 0; h < c.num_kv_heads; ++h) want = want || wants_attention(first_stream + h);
    // (Short sequences attend concurrently on shared scratch; they never get here with either.)
    if (want || scores) s.lse.resize(static_cast<size_t>(num_tokens * c.num_heads));
    kernels::paged_attention(
        view, query,
        {.out = &s.attn[first_token * q_dim], .row_lse = want || scores ? s.lse.data() : nullptr},
        pool);
    const int64_t num_keys = int64_t{positions[num_tokens - 1]} + 1;
    if (scores) kernels::observation_scores(view, query, s.lse.data(), num_keys, scores, pool);
    if (want) {  // one extra pass over the row's keys, reusing its log-sum-exp
      need_output();
      s.out_group.assign(static_cast<size_t>(c.num_kv_heads * num_keys), 0.0f);
      kernels::observation_scores(view, query, s.lse.data(), num_keys, s.out_group.data(), pool);
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        if (!wants_attention(first_stream + h)) continue;
        const float* head = &s.out_group[h * num_keys];
        out->attention[first_stream + h].assign(head, head + num_keys);
      }
    }
    return;
  }

  // Streams of their own: each KV head has its own kept keys, so the query heads of one group
  // are gathered into a [num_tokens][group][head_dim] block per head and attended against that
  // stream.
  const int64_t q_floats = num_tokens * group * head_dim;  // per KV head
  s.q_group.resize(static_cast<size_t>(c.num_kv_heads * q_floats));
  s.out_group.resize(s.q_group.size());
  s.positions.resize(static_cast<size_t>(c.num_kv_heads * num_tokens));
  s.lse.resize(static_cast<size_t>(c.num_kv_heads * num_tokens * group));
  s.slices.resize(static_cast<size_t>(c.num_kv_heads));
  auto attend_head = [&](int64_t g, ThreadPool& head_pool) {
    const size_t stream_idx = static_cast<size_t>(first_stream + g);
    const KvStream& stream = kv.streams[stream_idx];
    // Observation scores: each stream's after the ones before it in the layer.
    float* head_scores = scores;
    for (int64_t h = 0; head_scores && h < g; ++h)
      head_scores += kv.streams[stream_idx - g + h].num_keys;
    float* q_group = &s.q_group[g * q_floats];
    float* out_group = &s.out_group[g * q_floats];
    int32_t* head_positions = &s.positions[g * num_tokens];
    float* lse = &s.lse[g * num_tokens * group];
    for (int32_t i = 0; i < num_tokens; ++i) {
      std::memcpy(&q_group[i * group * head_dim],
                  &s.q[(first_token + i) * q_dim + g * group * head_dim],
                  group * head_dim * sizeof(float));
      head_positions[i] = positions[i] - stream.num_dropped;
    }
    const kernels::AttentionQuery query{
        .q = q_group,
        .positions = std::span<const int32_t>(head_positions, num_tokens),
        .num_heads = group,
        .scale = scale,
        .window = window()};
    std::span<const int32_t> slices = stream.slices;
    if (stream.selection && num_tokens == 1) {
      slices = select_slices(stream, q_group, group, cache.page_size(), s.slices[g]);
      if (stream.selection->choose) {
        need_output();
        out->chosen_slices[stream_idx] = s.slices[g].chosen;
      }
      head_positions[0] = static_cast<int32_t>((std::ssize(slices) - 1) * cache.page_size() +
                                               (stream.num_keys - 1) % cache.page_size());
    }
    const kernels::PagedKv view = cache.slice_view(slices, stream.key_offset);
    const bool want = wants_attention(static_cast<int64_t>(stream_idx));
    kernels::paged_attention(
        view, query, {.out = out_group, .row_lse = want || head_scores ? lse : nullptr}, head_pool);
    if (head_scores) {  // observation pass: every row's attention over this stream's keys
      kernels::observation_scores(view, query, lse, stream.num_keys, head_scores, head_pool);
    }
    if (want) {  // one extra pass over this row's keys, reusing its log-sum-exp
      need_output();
      std::vector<float>& weights = out->attention[stream_idx];
      weights.assign(static_cast<size_t>(stream.num_keys), 0.0f);
      kernels::observation_scores(view, query, lse, stream.num_keys, weights.data(), head_pool);
    }
    for (int32_t i = 0; i < num_tokens; ++i) {
      std::memcpy(&s.attn[(first_token + i) * q_dim + g * group * head_dim],
                  &out_group[i * group * head_dim], group * head_dim * sizeof(float));
    }
  };

  // A decode row: one KV head per thread, each attention single-threaded (no key split and
  // merge, one dispatch per layer instead of one per head). Longer rows use the whole pool.
  if (num_tokens == 1 && pool.num_threads() > 1 && c.num_kv_heads >= pool.num_threads()) {
    std::vector<std::exception_ptr>& errors = s.head_errors;
    errors.assign(static_cast<size_t>(c.num_kv_heads), nullptr);
    pool.parallel_for(
        c.num_kv_heads,
        [&](int64_t begin, int64_t end) {
          thread_local ThreadPool inline_pool(1);
          for (int64_t g = begin; g < end; ++g) {
            try {
              attend_head(g, inline_pool);
            } catch (...) {  // a worker must not throw: rethrown on the caller's thread below
              errors[g] = std::current_exception();
            }
          }
        },
        1);
    for (const std::exception_ptr& error : errors) {
      if (error) std::rethrow_exception(error);
    }
  } else {
    for (int64_t g = 0; g < c.num_kv_heads; ++g) attend_head(g, pool);
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

// Quest: the slices one decode row of `stream` reads (its query heads at
// q_group). Every slice keeps its place in key order, so the row sees the chosen keys in order
// and itself last: its position among them is computed by the caller.
std::span<const int32_t> LlamaModel::select_slices(const KvStream& stream, const float* q_group,
                                                   int64_t group, int32_t page_size,
                                                   SliceScratch& s) const {
  const SliceSelection& selection = *stream.selection;
  const auto num_slices = static_cast<int32_t>(stream.slices.size());
  if (selection.choose) {
    // Bounds from the per-slice summaries: a one-head view whose "page" b is summary b.
    const int32_t num_summarized = std::min(selection.num_summarized, num_slices);
    s.slice_ids.resize(static_cast<size_t>(num_summarized));
    for (int32_t b = 0; b < num_summarized; ++b) s.slice_ids[b] = b;
    s.slice_bounds.assign(static_cast<size_t>(num_slices), std::numeric_limits<float>::infinity());
    const kernels::PagedKv summary_view{.page_size = page_size,
                                        .head_dim = config_.head_dim,
                                        .num_kv_heads = 1,
                                        .block_table = s.slice_ids};
    kernels::page_upper_bounds(summary_view,
                               {.data = selection.summaries, .page_stride = 2 * config_.head_dim},
                               q_group, group, num_summarized, s.slice_bounds.data());
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
                              std::span<const int32_t> window_positions, ThreadPool& pool,
                              ForwardScratch& s,
                              const std::function<void(int64_t layer)>& attend_and_score) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(window_tokens.size());
  if (n == 0 || static_cast<int64_t>(window_positions.size()) != n)
    fail("observe needs window tokens and positions");
  const int64_t dim = c.dim, q_dim = c.q_dim();
  s.x.resize(n * dim);
  s.norm.resize(n * dim);
  s.q.resize(n * q_dim);
  s.attn.resize(n * q_dim);
  s.gate.resize(n * c.ffn_dim);
  s.up.resize(n * c.ffn_dim);
  s.lse.resize(n * c.num_heads);
  embed(window_tokens, s);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    for (int64_t t = 0; t < n; ++t)
      kernels::rmsnorm(&s.x[t * dim], w.attn_norm.data(), c.rms_eps, &s.norm[t * dim], dim);
    // Only Q: the window's K/V are in the cache already.
    project_qkv(w, n, window_positions.data(), /*with_kv=*/false, pool, s);
    attend_and_score(l);
    if (l + 1 == c.num_layers) break;  // the last layer's output feeds nothing here
    finish_layer(w, n, pool, s);
  }
}

void LlamaModel::observe(std::span<const TokenId> window_tokens,
                         std::span<const int32_t> window_positions, const SequenceKv& kv,
                         const KvCache& cache, ThreadPool& pool, ForwardScratch& s,
                         std::vector<float>& scores) const {
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
  observe_rows(window_tokens, window_positions, pool, s, [&](int64_t l) {
    attend(kv, l, 0, static_cast<int32_t>(window_tokens.size()), window_positions.data(), cache,
           pool, s, /*out=*/nullptr, scores.data() + layer_offsets[l]);
  });
}

}  // namespace sieve::model
