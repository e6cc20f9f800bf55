#include "engine/model_runner.h"

namespace sieve::engine {

int32_t ModelRunner::cache_slice(kv::SliceId slice) const {
  const kv::SliceShape shape = kv_.slice_shape();
  const int64_t per_page = shape.slices_per_page();
  const int32_t page = static_cast<int32_t>(slice.value / per_page);
  const int64_t stream = slice.value % per_page;
  return static_cast<int32_t>(cache_.slice_index(page, stream / shape.num_kv_heads, stream % shape.num_kv_heads));
}

std::shared_ptr<const model::SparseSequence> ModelRunner::sparse_view(sched::SeqId seq,
                                                                      const kv::SparseAppend* append) const {
  const kv::SparseLayout& layout = kv_.sparse_layout(seq);
  auto view = std::make_shared<model::SparseSequence>();
  view->streams.resize(layout.streams.size());
  if (auto it = want_attention_.find(seq); it != want_attention_.end()) {
    view->want_attention = it->second;
    view->attention.resize(layout.streams.size());
  }
  for (size_t s = 0; s < layout.streams.size(); ++s) {
    const kv::SparseStream& from = layout.streams[s];
    model::SparseStream& to = view->streams[s];
    to.slices.reserve(from.slices.size());
    for (kv::SliceId slice : from.slices) to.slices.push_back(cache_slice(slice));
    to.key_offset = from.first_slot;
    to.num_keys = from.num_tokens;
    to.num_dropped = from.num_dropped;
    if (!append) continue;
    // The engine appends every new token to every stream (drops happen after the step).
    const int32_t first = append->first_index.at(s).value();
    for (int32_t i = first; i < from.num_tokens; ++i) {
      const kv::SlotAddress at = layout.address(static_cast<int32_t>(s), i);
      to.new_rows.emplace_back(cache_slice(at.slice), at.slot);
    }
  }
  return view;
}

const std::vector<float>& ModelRunner::run(const sched::ScheduleOutput& out, const TokensOf& tokens_of) {
  for (const sched::ScheduledCopy& planned : out.page_copies) {
    cache_.copy_page(planned.copy.src.value, planned.copy.dst.value);
  }
  batch_.clear();
  step_views_.clear();
  for (const sched::ScheduledSequence& s : out.scheduled) {
    std::vector<int32_t> table(s.block_table.size());
    for (size_t i = 0; i < table.size(); ++i) table[i] = s.block_table[i].value;
    batch_.begin_sequence(std::move(table));
    if (s.sparse_append) {
      batch_.sequences.back().sparse = sparse_view(s.seq_id, &*s.sparse_append);
      step_views_[s.seq_id] = batch_.sequences.back().sparse;
    }
    std::span<const int32_t> tokens = tokens_of(s.seq_id);
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      const int32_t position = s.num_computed_before + i;
      batch_.add(tokens[position], position, s.samples && i + 1 == s.num_new_tokens);
    }
  }
  logits_.clear();
  if (batch_.size() > 0) model_.forward(batch_, cache_, pool_, scratch_, logits_);
  return logits_;
}

void ModelRunner::apply(const kv::CompactionPlan& plan) {
  for (const kv::TokenMove& move : plan.token_moves) {
    cache_.copy_row(cache_slice(move.src.slice), move.src.slot, cache_slice(move.dst.slice), move.dst.slot);
  }
  copy_slices(plan.slice_moves);
}

void ModelRunner::copy_slices(std::span<const kv::SliceMove> moves) {
  for (const kv::SliceMove& move : moves) cache_.copy_slice(cache_slice(move.src), cache_slice(move.dst));
}

const ModelRunner::ObservationScores& ModelRunner::observe(sched::SeqId seq, std::span<const int32_t> tokens,
                                                           int32_t window) {
  const auto n = static_cast<int32_t>(tokens.size());
  window = std::min(window, n);
  std::vector<int32_t> positions(static_cast<size_t>(window));
  for (int32_t i = 0; i < window; ++i) positions[i] = n - window + i;
  const kv::SliceShape shape = kv_.slice_shape();
  scores_.offsets.assign(1, 0);
  if (kv_.is_sparse(seq)) {
    const std::shared_ptr<const model::SparseSequence> view = sparse_view(seq, nullptr);
    model_.observe(tokens.subspan(n - window), positions, *view, cache_, pool_, scratch_, scores_.values);
    for (const model::SparseStream& stream : view->streams) scores_.offsets.push_back(scores_.offsets.back() + stream.num_keys);
  } else {
    std::vector<int32_t> table;
    for (kv::PageId page : kv_.block_table(seq)) table.push_back(page.value);
    model_.observe(tokens.subspan(n - window), positions, table, cache_, pool_, scratch_, scores_.values);
    for (int32_t s = 0; s < shape.num_streams(); ++s) scores_.offsets.push_back(scores_.offsets.back() + n);
  }
  return scores_;
}

const std::vector<std::vector<float>>* ModelRunner::attention(sched::SeqId seq) const {
  auto it = step_views_.find(seq);
  return it == step_views_.end() || it->second->want_attention.empty() ? nullptr : &it->second->attention;
}

}  // namespace sieve::engine
