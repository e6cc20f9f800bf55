// The Llama family's attention over the paged KV cache (LlamaModel::attend: dense, sparse and
// Quest streams in one batched kernel call per layer; a prompt chunk's last rows may also score
// every key there, SequenceKv::observe_rows) and the passes that reuse it without writing K/V:
// SnapKV's observation scores (observe) and the keys KV policies read (read_keys).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "kernels/attention_scores.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "model/key_smoothing.h"
#include "model/llama.h"
#include "model/llama_internal.h"
#include "util/error.h"

namespace sieve::model {

using detail::grow;
using detail::rotates_keys;

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
  // A layer with a precise stream (kv_cache.h) reads that head of dense sequences from its f16
  // copy, so their heads run as jobs of their own, like streams', each through head_view.
  const bool split_dense = cache.layer_has_precise_streams(layer);
  const auto one_job = [&](const SequenceRows& seq) {
    return seq.kv->shares_block_table() && !split_dense;
  };
  // Keys head g of the sequence holds (all its positions for a dense one).
  const auto keys_of = [&](const SequenceRows& seq, int64_t g) -> int64_t {
    return seq.kv->shares_block_table() ? dense_keys(seq) : stream_of(seq, g).num_keys;
  };

  // Sizes of this layer's outputs, before any pointer into them is taken.
  // Sequences whose last rows score every key this step (SequenceKv::observe_rows).
  const auto observes = [&](const SequenceRows& seq) {
    return !scores && seq.kv->observe_rows > 0 && seq.kv->observe_rows <= seq.num_tokens;
  };
  // The keys of the layer's streams of a sequence, and of the layers before.
  const auto layer_keys = [&](const SequenceRows& seq, int64_t l) {
    int64_t keys = 0;
    for (int64_t g = 0; g < nkv; ++g) {
      keys += seq.kv->shares_block_table()
                  ? dense_keys(seq)
                  : seq.kv->streams[static_cast<size_t>(l * nkv + g)].num_keys;
    }
    return keys;
  };
  int64_t num_weights = 0, num_bounds = 0, num_own = 0, num_rows = 0, num_observed = 0;
  for (const SequenceRows& seq : sequences) {
    num_rows = std::max<int64_t>(num_rows, int64_t{seq.first_token} + seq.num_tokens);
    if (observes(seq)) num_observed += layer_keys(seq, layer);
    if (one_job(seq)) {
      if (dense_wants(seq)) num_weights += nkv * dense_keys(seq);
      continue;
    }
    ++num_own;
    for (int64_t g = 0; g < nkv; ++g) {
      if (wants_attention(seq, first_stream + g)) num_weights += keys_of(seq, g);
      if (seq.kv->shares_block_table()) continue;
      const KvStream& stream = stream_of(seq, g);
      if (chooses(seq, stream)) num_bounds += num_summarized(stream);
    }
  }
  float* weights = num_weights > 0 ? grow(backend, s.weights, num_weights) : nullptr;
  float* bounds = num_bounds > 0 ? grow(backend, s.bounds, num_bounds) : nullptr;
  float* observed = num_observed > 0 ? grow(backend, s.scores, num_observed) : nullptr;
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
    if (one_job(seq)) continue;
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    // Row (f + i) * nkv + g of s.q, in rows of one group's heads, goes to row g * nt + i.
    int32_t* ids = &s.row_ids[f * nkv];
    for (int64_t g = 0; g < nkv; ++g) {
      for (int64_t i = 0; i < nt; ++i) ids[g * nt + i] = static_cast<int32_t>((f + i) * nkv + g);
    }
    backend.gather_rows({q, group_floats}, std::span<const int32_t>(ids, nt * nkv),
                        {q_group + f * q_dim, group_floats}, group_floats);
    for (int64_t g = 0; g < nkv && !seq.kv->shares_block_table(); ++g) {
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
      const bool key_halves = stream.selection->key_halves;
      // Summaries of rotated keys are of the keys rotated back (KvCache::summarize_slices): so
      // is the query the bounds take.
      const float* bound_q = q_group + group_at(f, nt, g);
      if (cache.key_smoothing() && cache.key_smoothing()->rotates(layer, g)) {
        const int64_t rotation = KeySmoothing::rotation_group(head_dim);
        float* unrotated = grow(backend, s.bound_q, nt * group_floats);
        backend.copy(unrotated, bound_q, static_cast<size_t>(nt * group_floats) * sizeof(float));
        backend.rotate_heads({unrotated, head_dim}, nt * group, head_dim / rotation, rotation);
        bound_q = unrotated;
      }
      backend.page_upper_bounds(
          summary_view,
          {.data = stream.selection->summaries,
           .page_stride = kernels::key_summary_floats(head_dim, page_size, key_halves),
           .key_halves = key_halves},
          bound_q, group, num_blocks, bounds + bounds_at);
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
  int64_t weights_at = 0, observed_at = 0;
  for (const SequenceRows& seq : sequences) {
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    const bool observing = observes(seq);
    if (one_job(seq)) {
      const size_t first_observation = s.observations.size();
      // Every stream of the layer reads one block table: one job for all heads reads each page
      // once, through all its heads.
      const int64_t num_keys = dense_keys(seq);
      const bool want = dense_wants(seq);
      if (scores) s.observations.push_back({.num_keys = num_keys, .scores = scores});
      if (observing) {
        s.observations.push_back({.num_keys = num_keys,
                                  .scores = observed + observed_at,
                                  .last_rows = seq.kv->observe_rows});
        observed_at += nkv * num_keys;
      }
      if (want) {  // one extra pass over the row's keys, reusing its log-sum-exp
        need_output(seq);
        s.observations.push_back({.num_keys = num_keys, .scores = weights + weights_at});
        weights_at += nkv * num_keys;
      }
      s.jobs.push_back(
          {.kv = cache.layer_view(layer, seq.kv->block_table),
           .query = {.q = q + f * q_dim,
                     .positions = std::span<const int32_t>(seq.positions, nt),
                     .num_heads = c.num_heads,
                     .scale = scale,
                     .window = window(),
                     .chunk_tiles = scores != nullptr},
           .out = {.out = attn + f * q_dim,
                   .row_lse = want || scores || observing ? lse + f * c.num_heads : nullptr},
           .observations = observations_from(first_observation)});
      continue;
    }
    // Streams of their own: each KV head has its own kept keys, so the query heads of one group
    // ([nt][group][head_dim], gathered in step 1) attend against that stream alone.
    float* head_scores = scores;  // each stream's after the ones before it in the layer
    for (int64_t g = 0; g < nkv; ++g) {
      const int64_t stream_idx = first_stream + g;
      const size_t first_head_observation = s.observations.size();
      // The head's keys: a dense sequence's (split_dense) through head_view, else its stream's.
      kernels::PagedKv view;
      std::span<const int32_t> positions(seq.positions, nt);
      int64_t num_keys = 0;
      if (seq.kv->shares_block_table()) {
        view = cache.head_view(layer, g, seq.kv->block_table);
        num_keys = dense_keys(seq);
      } else {
        const KvStream& stream = stream_of(seq, g);
        int32_t* head_positions = &s.positions[f * nkv + g * nt];
        for (int64_t i = 0; i < nt; ++i) head_positions[i] = seq.positions[i] - stream.num_dropped;
        std::span<const int32_t> slices = stream.slices;
        std::span<const int32_t> areas = stream.areas;  // a precise stream's f16 copy
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
          if (!areas.empty() && slices.size() != areas.size()) {
            scratch.read_areas.resize(scratch.chosen.size());
            for (size_t i = 0; i < scratch.chosen.size(); ++i)
              scratch.read_areas[i] = stream.areas[static_cast<size_t>(scratch.chosen[i])];
            areas = scratch.read_areas;
          }
          if (stream.selection->choose) {
            need_output(seq);
            seq.out->chosen_slices[static_cast<size_t>(stream_idx)] = scratch.chosen;
          }
          head_positions[0] = static_cast<int32_t>((std::ssize(slices) - 1) * page_size +
                                                   (stream.num_keys - 1) % page_size);
        }
        view = areas.empty() ? cache.slice_view(slices, stream.key_offset)
                             : cache.area_view(areas, stream.key_offset);
        positions = std::span<const int32_t>(head_positions, nt);
        num_keys = stream.num_keys;
      }
      const bool want = wants_attention(seq, stream_idx);
      if (head_scores) {  // observation pass: every row's attention over this head's keys
        s.observations.push_back({.num_keys = num_keys, .scores = head_scores});
        head_scores += num_keys;
      }
      if (observing) {  // the same for the step's last rows
        s.observations.push_back({.num_keys = num_keys,
                                  .scores = observed + observed_at,
                                  .last_rows = seq.kv->observe_rows});
        observed_at += num_keys;
      }
      if (want) {  // one extra pass over this row's keys, reusing its log-sum-exp
        need_output(seq);
        s.observations.push_back({.num_keys = num_keys, .scores = weights + weights_at});
        weights_at += num_keys;
      }
      const bool need_lse = want || scores || observing;
      s.jobs.push_back(
          {.kv = view,
           .query = {.q = q_group + group_at(f, nt, g),
                     .positions = positions,
                     .num_heads = group,
                     .scale = scale,
                     .window = window(),
                     .chunk_tiles = scores != nullptr},
           .out = {.out = out_group + group_at(f, nt, g),
                   .row_lse = need_lse ? lse + f * c.num_heads + g * nt * group : nullptr},
           .observations = observations_from(first_head_observation)});
    }
    ++own_idx;
  }
  backend.paged_attention_batch(s.jobs);

  // 4. Outputs of streams of their own back into attn; attention weights and observed scores
  // to the host.
  weights_at = 0;
  observed_at = 0;
  for (const SequenceRows& seq : sequences) {
    const int64_t f = seq.first_token, nt = seq.num_tokens;
    if (observes(seq)) {
      need_output(seq);
      int64_t total = 0, before = 0;
      for (int64_t l = 0; l < c.num_layers; ++l) {
        if (l == layer) before = total;
        total += layer_keys(seq, l);
      }
      std::vector<float>& to = seq.out->observed;
      to.resize(static_cast<size_t>(total));
      const int64_t keys = layer_keys(seq, layer);
      backend.download(to.data() + before, observed + observed_at,
                       static_cast<size_t>(keys) * sizeof(float));
      observed_at += keys;
      seq.out->observed_rows = seq.kv->observe_rows;
      seq.out->observed_through = seq.positions[nt - 1] + 1;
    }
    if (one_job(seq)) {
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
      const int64_t num_keys = keys_of(seq, g);
      std::vector<float>& head = seq.out->attention[static_cast<size_t>(first_stream + g)];
      head.resize(static_cast<size_t>(num_keys));
      backend.download(head.data(), weights + weights_at, head.size() * sizeof(float));
      weights_at += num_keys;
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
                              std::span<const int32_t> window_positions,
                              const KeySmoothing* smoothing, kernels::Backend& backend,
                              ForwardScratch& s,
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
    project_qkv(backend, w, l, n, window_positions.data(), /*with_kv=*/false, smoothing, s);
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
  // The window's queries are smoothed as the cache's keys were stored (forward() gave a q8 / q4
  // cache its smoothing before writing the first key).
  if (rotates_keys(cache) && !cache.key_smoothing())
    fail("observe: the q8 / q4 cache holds no keys of this model yet");
  observe_rows(window_tokens, window_positions, cache.key_smoothing(), backend, s, [&](int64_t l) {
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
  // q8 / q4 caches store keys smoothed and rotated (kv_cache.h): policies get them back as the
  // model computed them (a key's direction is what KeyDiff scores, and the shift alone moves
  // every key's cosine to the mean).
  const KeySmoothing* smoothing = cache.key_smoothing();
  const int64_t group = KeySmoothing::rotation_group(c.head_dim);
  std::vector<float> shift, scale;
  // One view at a time through the scratch buffer: a layer's (shared table) or a stream's keys,
  // kv heads [first_head, + view.num_kv_heads) of layer l.
  const auto read = [&](int64_t l, int64_t first_head, const kernels::PagedKv& view,
                        int64_t num_keys) {
    const int64_t head_floats = num_keys * c.head_dim;
    const int64_t floats = view.num_kv_heads * head_floats;
    float* buffer = grow(backend, s.scores, floats);
    backend.gather_keys(view, num_keys, buffer);
    for (int64_t i = 0; smoothing && i < view.num_kv_heads; ++i) {
      if (smoothing->rotates(l, first_head + i))
        backend.rotate_heads({buffer + i * head_floats, c.head_dim}, num_keys, c.head_dim / group,
                             group);
    }
    const size_t at = keys.size();
    keys.resize(at + static_cast<size_t>(floats));
    backend.download(keys.data() + at, buffer, static_cast<size_t>(floats) * sizeof(float));
    if (!smoothing) return;
    for (int64_t i = 0; i < view.num_kv_heads; ++i) {
      const int64_t channel0 = (first_head + i) * c.head_dim;
      float* head = keys.data() + at + i * head_floats;
      for (int64_t t = 0; t < num_keys; ++t) {
        for (int64_t ch = 0; ch < c.head_dim; ++ch) {
          float& x = head[t * c.head_dim + ch];
          x = x / scale[channel0 + ch] - shift[channel0 + ch];  // project_qkv: (k + shift) * scale
        }
      }
    }
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (smoothing) {
      const auto kv_dim = static_cast<size_t>(c.kv_dim());
      shift.resize(kv_dim);
      scale.resize(kv_dim);
      backend.download(shift.data(), smoothing->key_shift(l), kv_dim * sizeof(float));
      backend.download(scale.data(), smoothing->key_scale(l), kv_dim * sizeof(float));
    }
    if (kv.shares_block_table()) {
      read(l, 0, cache.layer_view(l, kv.block_table), num_positions);
      continue;
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const KvStream& stream = kv.streams[static_cast<size_t>(l * c.num_kv_heads + h)];
      read(l, h,
           stream.areas.empty() ? cache.slice_view(stream.slices, stream.key_offset)
                                : cache.area_view(stream.areas, stream.key_offset),
           stream.num_keys);
    }
  }
}

}  // namespace sieve::model
