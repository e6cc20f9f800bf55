#pragma once
// Turns the scheduler's plain ScheduleOutput into model inputs and runs one batched forward
// step: copy-on-write page copies, then one ragged Batch (each scheduled sequence's new
// tokens, its positions and where its streams' K/V live), then LlamaModel::forward. Only sequences
// that sample this step ask for logits.
#include <functional>
#include <unordered_map>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/llama.h"
#include "sched/scheduler.h"
#include "sparsity/policy_spec.h"

namespace sieve::engine {

class ModelRunner {
 public:
  // backend: runs the model (and allocated `cache`); must outlive the runner.
  ModelRunner(const model::LlamaModel& model, model::KvCache& cache, kernels::Backend& backend,
              const kv::KvManager& kv)
      : model_(model), cache_(cache), backend_(backend), kv_(kv) {}

  // `tokens_of(seq)` gives a sequence's known tokens. Returns logits [num sampling seqs][vocab],
  // rows in the order of `out.scheduled` entries with samples == true.
  using TokensOf = std::function<std::span<const int32_t>(sched::SeqId)>;
  const std::vector<float>& run(const sched::ScheduleOutput& out, const TokensOf& tokens_of);

  // Performs a KV manager plan (compression or drops of a sparse sequence, or a sparse fork's
  // slice copies): token moves in order, then slice moves.
  void apply(const kv::CompactionPlan& plan);
  void copy_slices(std::span<const kv::SliceMove> moves);

  // Observation scores (model::LlamaModel::observe) of a sequence that has computed exactly
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

  // H2O: the streams of `seq` whose decode attention weights run() should return; and after
  // run(), those weights ([stream] -> one per key, the new token last; empty if not computed).
  void want_attention(sched::SeqId seq, std::vector<uint8_t> streams) {
    want_attention_[seq] = std::move(streams);
  }
  // Quest: from the next step on, the decode rows of the streams with a head here read only the
  // slices sparsity::select_pages() picks by q·k bounds from per-slice key summaries (kept here,
  // per stream and logical slice, so they survive slice moves); [stream], nullopt: read all.
  void select_pages(sched::SeqId seq, std::vector<std::optional<sparsity::PageSelectHead>> heads);
  void forget(sched::SeqId seq) {
    want_attention_.erase(seq);
    page_select_.erase(seq);
  }
  const std::vector<std::vector<float>>* attention(sched::SeqId seq) const;

 private:
  struct PageSelectStream {
    sparsity::PageSelectHead head;
    std::vector<float> summaries;  // [num_summarized][2][head_dim]: key min, max of full slices
    int32_t num_summarized = 0;
    int32_t num_keys = 0;         // this step's, for the choice
    std::vector<int32_t> chosen;  // slice indices read since the last choice
    int32_t num_slices_at_choice = 0;
  };
  struct PageSelectState {
    std::vector<std::optional<PageSelectStream>> streams;  // [stream]
    int64_t num_decode_steps = 0;                          // since select_pages()
  };

  // The model's view of a sequence's streams (its block table, or each stream's slices);
  // `append` (may be null): where this step's new tokens go in streams of their own.
  model::SequenceKv sequence_kv(sched::SeqId seq, const kv::SparseAppend* append);
  void plan_page_reads(PageSelectState& state, size_t stream_idx, model::KvStream& stream,
                       int32_t num_written);

  const model::LlamaModel& model_;
  model::KvCache& cache_;
  kernels::Backend& backend_;
  const kv::KvManager& kv_;
  ObservationScores scores_;
  std::unordered_map<sched::SeqId, std::vector<uint8_t>> want_attention_;
  std::unordered_map<sched::SeqId, PageSelectState> page_select_;
  std::unordered_map<sched::SeqId, size_t> step_index_;  // this step's sequences in batch_
  model::Batch batch_;
  std::vector<model::StreamOutputs> outputs_;  // [batch_ sequence]
  model::ForwardScratch scratch_;
  std::vector<float> logits_;
};

}  // namespace sieve::engine
