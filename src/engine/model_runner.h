#pragma once
// Turns the scheduler's plain ScheduleOutput into model inputs and runs one batched forward
// step: copy-on-write page copies, then one ragged Batch (each scheduled sequence's new
// tokens, its positions and where its streams' K/V live), then Model::forward. Only sequences
// that sample this step ask for logits, and prompt positions whose logprobs a request wants.
#include <functional>
#include <optional>
#include <unordered_map>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "sparsity/stream_policy.h"
#include "speculative/self_sparse_view.h"

namespace sieve::engine {

class ModelRunner {
 public:
  // cache: allocated on model.backend(), where the model runs.
  ModelRunner(const model::Model& model, model::KvCache& cache, const kv::KvManager& kv)
      : model_(model), cache_(cache), kv_(kv) {}

  // What a sequence's sparsity controller asks of this step's rows (streams of their own only).
  struct RowRequests {
    std::vector<uint8_t> want_attention;                         // [stream], empty: none
    std::vector<std::optional<sparsity::PageReads>> page_reads;  // [stream], empty: read all
    // A prompt chunk that ends where the prompt is compressed: its last observe_rows rows score
    // the keys in the step (model::SequenceKv::observe_rows; observed()).
    int32_t observe_rows = 0;
  };
  // `tokens_of(seq)` gives a sequence's known tokens; `requests_of(seq)` (may be empty, or return
  // null) what its sparsity asks. Returns logits [rows][vocab]: for each entry of `out.scheduled`,
  // in order, its num_prompt_logits prompt rows, then, with samples == true, num_draft_tokens + 1
  // rows (its last real token's, then each draft token's). A step holds at most
  // max_batch_tokens rows: prompt logprobs cost [chunk][vocab] floats, never [prompt][vocab].
  using TokensOf = std::function<std::span<const int32_t>(sched::SeqId)>;
  using RequestsOf = std::function<const RowRequests*(sched::SeqId)>;
  // Call copy_pages(out) first (the step's copy-on-write).
  const std::vector<float>& run(const sched::ScheduleOutput& out, const TokensOf& tokens_of,
                                const RequestsOf& requests_of = {});
  // The step's copy-on-write page copies, before anything writes K/V this step (draft passes
  // included).
  void copy_pages(const sched::ScheduleOutput& out);

  // Self-speculation: one draft pass. Row r computes `token` at `position` of a sequence whose
  // streams share a block table, reading only the keys of `view.blocks` (block-table indices,
  // ascending, the position's own block last) with every one of them visible: a sparse view
  // of the sequence's own pages, no copy of them. A Quest view (view.choice) reads, per (layer,
  // KV head), the forced blocks and the best others by q·k upper bound, from key summaries of
  // the sequence's full blocks below `num_verified` (positions computed by the full model; the
  // draft rows' K/V above it are rewritten by verification); newer blocks count as +inf. Its K/V
  // is written at `position` in the sequence's pages (the verification step writes that
  // position again). Returns logits [rows][vocab].
  struct DraftRow {
    sched::SeqId seq;
    int32_t token = 0;
    int32_t position = 0;
    int32_t num_verified = 0;
    speculative::DraftView view;
  };
  const std::vector<float>& run_draft(std::span<const DraftRow> rows);
  // After run(): what the sequence's rows handed back (attention weights, Quest choices); null
  // if it was not in the step.
  const model::StreamOutputs* outputs(sched::SeqId seq) const;

  // Performs a KV manager plan (compression or drops of a sparse sequence, or a sparse fork's
  // copies): token moves in order, slice moves, then the same for precise streams' f16 areas.
  void apply(const kv::CompactionPlan& plan);

  // Observation scores (model::Model::observe) of a sequence that has computed exactly
  // `tokens`: how much attention each key of each stream receives from the last `window` tokens'
  // rows.
  struct ObservationScores {
    std::vector<float> values;
    std::vector<size_t>
        offsets;  // [num_streams + 1]: stream s is values[offsets[s], offsets[s + 1])
    std::span<const float> stream(size_t s) const {
      return std::span<const float>(values).subspan(offsets[s], offsets[s + 1] - offsets[s]);
    }
  };
  const ObservationScores& observe(sched::SeqId seq, std::span<const int32_t> tokens,
                                   int32_t window);
  // After run(): observe(seq, tokens, window)'s scores if the step's last `window` rows of the
  // sequence scored them (RowRequests::observe_rows) and it has computed exactly `num_tokens`;
  // else null.
  const ObservationScores* observed(sched::SeqId seq, int32_t num_tokens, int32_t window);
  // The keys of its streams over its first num_positions positions (model::Model::
  // read_keys), laid out as observe's scores with head_dim floats per key.
  const ObservationScores& read_keys(sched::SeqId seq, int32_t num_positions);

  // Drops what the runner keeps for a sequence (Quest's slice key summaries, a Quest draft
  // view's block summaries): it finished, or its K/V is recomputed.
  void forget(sched::SeqId seq) { summaries_.erase(seq); }
  // A parked sequence continues under a new id (kv::KvManager::adopt): its summaries follow.
  void rename(sched::SeqId from, sched::SeqId to) {
    if (auto node = summaries_.extract(from)) {
      node.key() = to;
      summaries_.insert(std::move(node));
    }
  }

 private:
  // Quest: one stream's key summaries per full slice, by slice index in the stream (so they
  // survive slice moves): [num_summarized][kernels::key_summary_floats()] floats in the model's
  // backend memory (derived from K, which lives there; the forward pass reads them there).
  struct SliceSummaries {
    kernels::DeviceBuffer values;
    int32_t num_summarized = 0;
    bool key_halves = false;
  };

  // The model's view of a sequence's streams (its block table, or each stream's slices);
  // `append` (may be null): where this step's new tokens go in streams of their own.
  model::SequenceKv sequence_kv(sched::SeqId seq, const kv::SparseAppend* append,
                                const RowRequests* requests);
  // Summarizes slices [summary.num_summarized, num_full) of `slices` (full ones) of stream
  // `stream` (from `areas`, its f16 copy, if it has one), growing the buffer; returns the
  // summaries.
  float* summarize(SliceSummaries& summary, int32_t stream, std::span<const int32_t> slices,
                   std::span<const int32_t> areas, int32_t num_full, bool key_halves);
  model::SliceSelection slice_selection(const sparsity::PageReads& reads,
                                        std::vector<SliceSummaries>& summaries, size_t stream_idx,
                                        const model::KvStream& stream, int32_t num_written);

  // to.offsets for the sequence's streams at num_positions, floats_per_key floats a key.
  void set_stream_offsets(sched::SeqId seq, int32_t num_positions, size_t floats_per_key,
                          ObservationScores& to) const;

  const model::Model& model_;
  model::KvCache& cache_;
  const kv::KvManager& kv_;
  ObservationScores scores_;
  ObservationScores keys_;
  std::unordered_map<sched::SeqId, std::vector<SliceSummaries>> summaries_;  // [stream]
  std::unordered_map<sched::SeqId, size_t> step_index_;  // this step's sequences in batch_
  model::Batch batch_;
  std::vector<model::StreamOutputs> outputs_;        // [batch_ sequence]
  std::vector<model::StreamOutputs> draft_outputs_;  // run_draft's (Quest choices, unused)
  model::ForwardScratch scratch_;
  std::vector<float> logits_;
};

}  // namespace sieve::engine
