#include "engine/model_runner.h"

#include <algorithm>

#include "kernels/attention_scores.h"
#include "sparsity/selection.h"

namespace sieve::engine {

model::SequenceKv ModelRunner::sequence_kv(sched::SeqId seq, const kv::SparseAppend* append,
                                           const RowRequests* requests) {
  model::SequenceKv view;
  if (requests) {
    view.want_attention = requests->want_attention;
    view.observe_rows = requests->observe_rows;
  }
  if (!kv_.is_sparse(seq)) {
    for (kv::PageId page : kv_.block_table(seq)) view.block_table.push_back(page.value);
    return view;
  }
  const kv::SparseLayout& layout = kv_.sparse_layout(seq);
  view.streams.resize(layout.streams.size());
  for (size_t s = 0; s < layout.streams.size(); ++s) {
    const kv::SparseStream& from = layout.streams[s];
    model::KvStream& to = view.streams[s];
    to.slices.reserve(from.slices.size());
    for (kv::SliceId slice : from.slices) to.slices.push_back(static_cast<int32_t>(slice.value));
    for (kv::AreaId area : from.areas) to.areas.push_back(area.value);
    to.key_offset = from.first_slot;
    to.num_keys = from.num_tokens;
    to.num_dropped = from.num_dropped;
    if (!append) continue;
    // The engine appends every new token to every stream (drops happen after the step).
    const int32_t first = append->first_index.at(s).value();
    for (int32_t i = first; i < from.num_tokens; ++i) {
      const kv::SlotAddress at = layout.address(static_cast<int32_t>(s), i);
      to.new_rows.emplace_back(static_cast<int32_t>(at.slice.value), at.slot);
      if (!from.f16_copy) continue;
      const kv::AreaSlot area = layout.area_address(static_cast<int32_t>(s), i);
      to.new_area_rows.emplace_back(area.area.value, area.slot);
    }
    // Quest reads a subset of slices on decode rows of streams that hold every key.
    if (requests && s < requests->page_reads.size() && requests->page_reads[s] &&
        from.num_tokens - first == 1 && from.first_slot == 0 && from.num_dropped == 0) {
      to.selection = slice_selection(*requests->page_reads[s], summaries_[seq], s, to, first);
    }
  }
  return view;
}

// Brings the stream's slice summaries up to date (slices filled by earlier steps; the keys of
// this step are not written yet) and hands the model the policy's read plan with them.
model::SliceSelection ModelRunner::slice_selection(const sparsity::PageReads& reads,
                                                   std::vector<SliceSummaries>& summaries,
                                                   size_t stream_idx, const model::KvStream& stream,
                                                   int32_t num_written) {
  if (summaries.size() <= stream_idx) summaries.resize(stream_idx + 1);
  SliceSummaries& summary = summaries[stream_idx];
  summarize(summary, static_cast<int32_t>(stream_idx), stream.slices, stream.areas,
            num_written / cache_.page_size(), reads.key_halves);
  return {.choose = reads.choose,
          .summaries = reads.choose ? summary.values.as<float>() : nullptr,
          .num_summarized = reads.choose ? summary.num_summarized : 0,
          .key_halves = reads.key_halves,
          .top_k = reads.top_k,
          .forced = reads.forced,
          .reuse = reads.reuse};
}

float* ModelRunner::summarize(SliceSummaries& summary, int32_t stream,
                              std::span<const int32_t> slices, std::span<const int32_t> areas,
                              int32_t num_full, bool key_halves) {
  if (summary.key_halves != key_halves) {  // another layout: summarize again
    summary.num_summarized = 0;
    summary.key_halves = key_halves;
  }
  const int64_t summary_floats =
      kernels::key_summary_floats(model_.config().head_dim, cache_.page_size(), key_halves);
  if (num_full > summary.num_summarized) {
    const size_t kept_bytes = summary.num_summarized * summary_floats * sizeof(float);
    const size_t bytes = num_full * summary_floats * sizeof(float);
    if (summary.values.bytes() < bytes) {  // grow by half again: a stream fills a slice at a time
      kernels::Backend& backend = model_.backend();
      kernels::DeviceBuffer grown =
          backend.allocate(std::max(bytes, summary.values.bytes() * 3 / 2));
      if (kept_bytes > 0) backend.copy(grown.data(), summary.values.data(), kept_bytes);
      summary.values = std::move(grown);
    }
    cache_.summarize_slices(stream, slices, areas, summary.num_summarized, num_full, key_halves,
                            summary.values.as<float>());
    summary.num_summarized = num_full;
  }
  return summary.values.as<float>();
}

void ModelRunner::copy_pages(const sched::ScheduleOutput& out) {
  for (const sched::ScheduledCopy& planned : out.page_copies) {
    cache_.copy_page(planned.copy.src.value, planned.copy.dst.value);
  }
}

const std::vector<float>& ModelRunner::run_draft(std::span<const DraftRow> rows) {
  const kv::SliceShape shape = cache_.slice_shape();
  const int32_t page_size = shape.page_size;
  batch_.clear();
  for (const DraftRow& row : rows) {
    std::span<const kv::PageId> table = kv_.block_table(row.seq);
    const kv::PageId own_page = table[static_cast<size_t>(row.position / page_size)];
    const std::vector<int32_t>& blocks = row.view.blocks;
    model::SequenceKv view;
    view.streams.resize(static_cast<size_t>(shape.num_streams()));
    const auto num_keys =
        static_cast<int32_t>(blocks.size() - 1) * page_size + row.position % page_size + 1;
    // A Quest view lists every block up to the row's own, so stream slice b is block b and a
    // block's summary stays valid from draft step to draft step (full verified blocks only).
    std::vector<SliceSummaries>* summaries = nullptr;
    if (row.view.choice) {
      summaries = &summaries_[row.seq];
      summaries->resize(static_cast<size_t>(shape.num_streams()));
    }
    const int32_t num_full = std::min(row.num_verified, row.position) / page_size;
    for (int32_t s = 0; s < shape.num_streams(); ++s) {
      model::KvStream& stream = view.streams[static_cast<size_t>(s)];
      for (int32_t block : blocks) {
        stream.slices.push_back(
            static_cast<int32_t>(shape.dense_slice(table[static_cast<size_t>(block)], s).value));
      }
      stream.num_keys = num_keys;
      // Key j of the view is visible to the row iff j <= position - num_dropped: all of them.
      stream.num_dropped = row.position + 1 - num_keys;
      stream.new_rows.emplace_back(static_cast<int32_t>(shape.dense_slice(own_page, s).value),
                                   row.position % page_size);
      if (!summaries) continue;
      SliceSummaries& summary = (*summaries)[static_cast<size_t>(s)];
      float* values = summarize(summary, s, stream.slices, {}, num_full, /*key_halves=*/false);
      stream.selection = model::SliceSelection{.choose = true,
                                               .summaries = values,
                                               .num_summarized = summary.num_summarized,
                                               .top_k = row.view.choice->top_k,
                                               .forced = row.view.choice->forced};
    }
    batch_.begin_sequence(std::move(view));
    batch_.add(row.token, row.position, /*logits=*/true);
  }
  logits_.clear();
  if (batch_.size() > 0) model_.forward(batch_, cache_, scratch_, logits_, &draft_outputs_);
  return logits_;
}

const std::vector<float>& ModelRunner::run(const sched::ScheduleOutput& out,
                                           const TokensOf& tokens_of,
                                           const RequestsOf& requests_of) {
  batch_.clear();
  step_index_.clear();
  for (const sched::ScheduledSequence& s : out.scheduled) {
    step_index_[s.seq_id] = batch_.sequences.size();
    batch_.begin_sequence(sequence_kv(s.seq_id, s.stream_slots ? &*s.stream_slots : nullptr,
                                      requests_of ? requests_of(s.seq_id) : nullptr));
    std::span<const int32_t> tokens = tokens_of(s.seq_id);
    // A sampling sequence's last token gives its next one; each of its draft tokens (and the
    // token before them) gives the target's distribution that verifies the next draft. Prompt
    // logprobs: the first num_prompt_logits tokens give the next prompt token's.
    const int32_t first_logits = s.num_new_tokens - 1 - s.num_draft_tokens;
    for (int32_t i = 0; i < s.num_new_tokens; ++i) {
      const int32_t position = s.num_computed_before + i;
      batch_.add(tokens[position], position,
                 i < s.num_prompt_logits || (s.samples && i >= first_logits));
    }
  }
  logits_.clear();
  if (batch_.size() > 0) model_.forward(batch_, cache_, scratch_, logits_, &outputs_);
  return logits_;
}

void ModelRunner::apply(const kv::CompactionPlan& plan) {
  for (const kv::TokenMove& move : plan.token_moves) {
    cache_.copy_row(move.src.slice.value, move.src.slot, move.dst.slice.value, move.dst.slot);
  }
  for (const kv::SliceMove& move : plan.slice_moves)
    cache_.copy_slice(move.src.value, move.dst.value);
  for (const kv::AreaRowMove& move : plan.area_row_moves) {
    cache_.copy_area_row(move.src.area.value, move.src.slot, move.dst.area.value, move.dst.slot);
  }
  for (const kv::AreaMove& move : plan.area_moves) cache_.copy_area(move.src.value, move.dst.value);
}

void ModelRunner::set_stream_offsets(sched::SeqId seq, int32_t num_positions, size_t floats_per_key,
                                     ObservationScores& to) const {
  to.offsets.assign(1, 0);
  for (int32_t length : kv_.stream_lengths(seq, num_positions))
    to.offsets.push_back(to.offsets.back() + static_cast<size_t>(length) * floats_per_key);
}

const ModelRunner::ObservationScores& ModelRunner::observe(sched::SeqId seq,
                                                           std::span<const int32_t> tokens,
                                                           int32_t window) {
  const auto n = static_cast<int32_t>(tokens.size());
  window = std::min(window, n);
  std::vector<int32_t> positions(static_cast<size_t>(window));
  for (int32_t i = 0; i < window; ++i) positions[i] = n - window + i;
  const model::SequenceKv view = sequence_kv(seq, nullptr, nullptr);
  model_.observe(tokens.subspan(n - window), positions, view, cache_, scratch_, scores_.values);
  set_stream_offsets(seq, n, 1, scores_);
  return scores_;
}

const ModelRunner::ObservationScores& ModelRunner::read_keys(sched::SeqId seq,
                                                             int32_t num_positions) {
  const model::SequenceKv view = sequence_kv(seq, nullptr, nullptr);
  model_.read_keys(view, num_positions, cache_, scratch_, keys_.values);
  const auto head_dim = static_cast<size_t>(model_.config().head_dim);
  set_stream_offsets(seq, num_positions, head_dim, keys_);
  return keys_;
}

const ModelRunner::ObservationScores* ModelRunner::observed(sched::SeqId seq, int32_t num_tokens,
                                                            int32_t window) {
  auto it = step_index_.find(seq);
  if (it == step_index_.end()) return nullptr;
  model::StreamOutputs& out = outputs_[it->second];
  if (out.observed.empty() || out.observed_rows != window || out.observed_through != num_tokens)
    return nullptr;
  scores_.values = std::move(out.observed);
  out.observed.clear();
  set_stream_offsets(seq, num_tokens, 1, scores_);
  if (scores_.offsets.back() != scores_.values.size()) return nullptr;
  return &scores_;
}

const model::StreamOutputs* ModelRunner::outputs(sched::SeqId seq) const {
  auto it = step_index_.find(seq);
  return it == step_index_.end() ? nullptr : &outputs_[it->second];
}

}  // namespace sieve::engine
