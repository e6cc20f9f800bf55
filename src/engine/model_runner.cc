#include "engine/model_runner.h"

#include <algorithm>

#include "sparsity/selection.h"

namespace sieve::engine {

model::SequenceKv ModelRunner::sequence_kv(sched::SeqId seq, const kv::SparseAppend* append) {
  model::SequenceKv view;
  if (auto it = want_attention_.find(seq); it != want_attention_.end())
    view.want_attention = it->second;
  if (!kv_.is_sparse(seq)) {
    for (kv::PageId page : kv_.block_table(seq)) view.block_table.push_back(page.value);
    return view;
  }
  const kv::SparseLayout& layout = kv_.sparse_layout(seq);
  PageSelectState* page_select = nullptr;
  if (auto it = page_select_.find(seq); it != page_select_.end()) page_select = &it->second;
  view.streams.resize(layout.streams.size());
  for (size_t s = 0; s < layout.streams.size(); ++s) {
    const kv::SparseStream& from = layout.streams[s];
    model::KvStream& to = view.streams[s];
    to.slices.reserve(from.slices.size());
    for (kv::SliceId slice : from.slices) to.slices.push_back(static_cast<int32_t>(slice.value));
    to.key_offset = from.first_slot;
    to.num_keys = from.num_tokens;
    to.num_dropped = from.num_dropped;
    if (!append) continue;
    // The engine appends every new token to every stream (drops happen after the step).
    const int32_t first = append->first_index.at(s).value();
    for (int32_t i = first; i < from.num_tokens; ++i) {
      const kv::SlotAddress at = layout.address(static_cast<int32_t>(s), i);
      to.new_rows.emplace_back(static_cast<int32_t>(at.slice.value), at.slot);
    }
    // Quest reads a subset of slices on decode rows of streams that hold every key.
    if (page_select && page_select->streams[s] && from.num_tokens - first == 1 &&
        from.first_slot == 0 && from.num_dropped == 0) {
      plan_page_reads(*page_select, s, to, first);
    }
  }
  if (page_select && append) ++page_select->num_decode_steps;
  return view;
}

void ModelRunner::select_pages(sched::SeqId seq,
                               std::vector<std::optional<sparsity::PageSelectHead>> heads) {
  PageSelectState& state = page_select_[seq];
  state = {};
  for (auto& head : heads) {
    if (head)
      state.streams.emplace_back(PageSelectStream{.head = *head});
    else
      state.streams.emplace_back();
  }
}

// Brings the stream's slice summaries up to date (slices filled by earlier steps; the keys of
// this step are not written yet) and says which slices its decode row reads: a fresh choice
// every reuse_steps decode steps, else the last choice plus every slice new since.
void ModelRunner::plan_page_reads(PageSelectState& state, size_t stream_idx,
                                  model::KvStream& stream, int32_t num_written) {
  PageSelectStream& p = *state.streams[stream_idx];
  const int32_t page_size = cache_.page_size();
  const int64_t summary_floats = 2 * model_.config().head_dim;
  const int32_t num_full = num_written / page_size;
  if (num_full > p.num_summarized) {
    p.summaries.resize(static_cast<size_t>(num_full * summary_floats));
    cache_.summarize_slices(stream.slices, p.num_summarized, num_full, p.summaries.data());
    p.num_summarized = num_full;
  }
  p.num_keys = stream.num_keys;
  model::SliceSelection selection;
  const auto num_slices = static_cast<int32_t>(stream.slices.size());
  if (p.chosen.empty() || state.num_decode_steps % p.head.reuse_steps == 0) {
    selection.choose = true;
    selection.summaries = p.summaries.data();
    selection.num_summarized = p.num_summarized;
    selection.top_k = static_cast<int32_t>(p.head.top_k_pages);
    selection.forced = sparsity::forced_pages(p.num_keys, page_size, p.head);
  } else {
    selection.reuse = p.chosen;
    for (int32_t b = std::max(p.num_slices_at_choice - 1, 0); b < num_slices; ++b) {
      if (selection.reuse.empty() || b > selection.reuse.back()) selection.reuse.push_back(b);
    }
  }
  stream.selection = std::move(selection);
}

const std::vector<float>& ModelRunner::run(const sched::ScheduleOutput& out,
                                           const TokensOf& tokens_of) {
  for (const sched::ScheduledCopy& planned : out.page_copies) {
    cache_.copy_page(planned.copy.src.value, planned.copy.dst.value);
  }
  batch_.clear();
  step_index_.clear();
  for (const sched::ScheduledSequence& s : out.scheduled) {
    step_index_[s.seq_id] = batch_.sequences.size();
    batch_.begin_sequence(sequence_kv(s.seq_id, s.stream_slots ? &*s.stream_slots : nullptr));
    std::span<const int32_t> tokens = tokens_of(s.seq_id);
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      const int32_t position = s.num_computed_before + i;
      batch_.add(tokens[position], position, s.samples && i + 1 == s.num_new_tokens);
    }
  }
  logits_.clear();
  if (batch_.size() > 0) model_.forward(batch_, cache_, backend_, scratch_, logits_, &outputs_);
  // Quest: the choices made this step are reused until the next one.
  for (size_t index = 0; index < out.scheduled.size(); ++index) {
    auto it = page_select_.find(out.scheduled[index].seq_id);
    if (it == page_select_.end()) continue;
    const model::SequenceKv& view = batch_.sequences[index].kv;
    const model::StreamOutputs& step = outputs_[index];
    for (size_t stream = 0; stream < view.streams.size(); ++stream) {
      const model::KvStream& kv_stream = view.streams[stream];
      if (!kv_stream.selection || !kv_stream.selection->choose) continue;
      PageSelectStream& p = *it->second.streams[stream];
      p.chosen = step.chosen_slices[stream];
      p.num_slices_at_choice = static_cast<int32_t>(kv_stream.slices.size());
    }
  }
  return logits_;
}

void ModelRunner::apply(const kv::CompactionPlan& plan) {
  for (const kv::TokenMove& move : plan.token_moves) {
    cache_.copy_row(move.src.slice.value, move.src.slot, move.dst.slice.value, move.dst.slot);
  }
  copy_slices(plan.slice_moves);
}

void ModelRunner::copy_slices(std::span<const kv::SliceMove> moves) {
  for (const kv::SliceMove& move : moves) cache_.copy_slice(move.src.value, move.dst.value);
}

const ModelRunner::ObservationScores& ModelRunner::observe(sched::SeqId seq,
                                                           std::span<const int32_t> tokens,
                                                           int32_t window) {
  const auto n = static_cast<int32_t>(tokens.size());
  window = std::min(window, n);
  std::vector<int32_t> positions(static_cast<size_t>(window));
  for (int32_t i = 0; i < window; ++i) positions[i] = n - window + i;
  const model::SequenceKv view = sequence_kv(seq, nullptr);
  model_.observe(tokens.subspan(n - window), positions, view, cache_, backend_, scratch_,
                 scores_.values);
  scores_.offsets.assign(1, 0);
  for (int32_t length : kv_.stream_lengths(seq, n))
    scores_.offsets.push_back(scores_.offsets.back() + static_cast<size_t>(length));
  return scores_;
}

const std::vector<std::vector<float>>* ModelRunner::attention(sched::SeqId seq) const {
  auto it = step_index_.find(seq);
  if (it == step_index_.end() || batch_.sequences[it->second].kv.want_attention.empty())
    return nullptr;
  return &outputs_[it->second].attention;
}

}  // namespace sieve::engine
