#pragma once
// The engine's speculative driver: drafts for decoding sequences, and their exact verification.
// Per step:
//   before schedule   propose(): ngram drafts (prompt lookup), the draft model's drafts
//                     (engine/draft_model.h), self_sparse placeholders; k fixed or adaptive
//                     (speculative/draft_length.h, from the measured step costs,
//                     speculative/step_cost.h)
//   before run        draft(): self-speculation's draft passes over sparse views of the
//                     sequences' own pages fill the placeholders in; the draft model computes
//                     the step's prompt chunks
//   after run         verify(): one sample per row, stopping at the first that differs from the
//                     draft; resolve(): the scheduler keeps the accepted drafts the stop matcher
//                     let through, and the counters move
// Sequences with a sparse KV policy, or about to fork their n - 1 samples, get no draft (see
// EngineConfig::speculative). Owned by the stepping thread.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/draft_model.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sample.h"
#include "engine/sampler.h"
#include "kv/kv_manager.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "speculative/speculative_config.h"
#include "speculative/step_cost.h"
#include "tokenizer/tokenizer.h"

namespace sieve::engine {

// vLLM's spec_decode counters, and the draft model's pool (all zero without one).
struct SpeculativeStats {
  int64_t num_drafts = 0;  // verification steps with a draft
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [kMaxSpeculativeTokens]
  kv::KvStats draft_kv;
  int64_t draft_kv_bytes_per_page = 0;
};

class SpeculativeDriver {
 public:
  // draft_model's drafter, when config.speculative names one (null otherwise).
  static std::shared_ptr<const model::Model> load_draft_model(const EngineConfig& config,
                                                              const model::Model& target,
                                                              const tok::Tokenizer& tokenizer);
  // `draft_model` (may be null) gets a pool of `num_pages`, mirroring the target's.
  SpeculativeDriver(const EngineConfig& config, const model::ModelConfig& target,
                    std::shared_ptr<const model::Model> draft_model, int32_t num_pages,
                    sched::Scheduler& scheduler, ModelRunner& runner);

  // Throws sieve::Error naming the problem if `speculative` cannot run on this engine (a
  // draft_model other than the one loaded, a self_sparse view that is not one).
  void check(const speculative::SpeculativeConfig& speculative) const;

  // Before schedule(): decoding sequences that speculate get their draft for this step.
  void propose(const Samples& samples);
  // After schedule(), before the run: self_sparse's draft passes, draft_model's prompt chunks.
  void draft(const sched::ScheduleOutput& out, const Samples& samples);
  // After the run: the step's forward time, which decode-only steps feed to adaptive k.
  void record_step_time(const sched::ScheduleOutput& out, double seconds);

  // The tokens `seq` samples from its step's logits rows (one per row: its last real token's,
  // then each draft token's), stopping after the first that differs from the draft.
  std::vector<SampleResult> verify(sched::SeqId seq, Sample& sample, std::span<const float> rows,
                                   int32_t num_drafts);
  // After the stop matcher: `num_accepted` of the `num_drafts` drafts were accepted, and the
  // first `num_kept` of them are kept (a stop among them ends the sample there).
  void resolve(sched::SeqId seq, Sample& sample, int32_t num_drafts, int32_t num_accepted,
               int32_t num_kept);

  // Gives back the sequence's draft model pages: it finished, was cancelled or preempted (it
  // drafts again once it decodes).
  void release(sched::SeqId seq);
  // A finished sample's draft model KV.
  void add_usage(sched::SeqId seq, Usage& usage) const;
  SpeculativeStats stats() const;

 private:
  void draft_self_sparse(const sched::ScheduleOutput& out, const Samples& samples);
  void prefill_draft_model(const sched::ScheduleOutput& out, const Samples& samples);

  const EngineConfig& config_;
  const model::ModelConfig& target_;
  sched::Scheduler& scheduler_;
  ModelRunner& runner_;
  std::unique_ptr<DraftModelProposer> draft_;  // null: no draft_model speculation
  speculative::StepCost step_cost_;            // what a draft token costs, for adaptive k
  int64_t num_drafts_ = 0;
  int64_t num_draft_tokens_ = 0;
  int64_t num_accepted_tokens_ = 0;
  std::vector<int64_t> accepted_per_position_ =
      std::vector<int64_t>(speculative::kMaxSpeculativeTokens, 0);
};

}  // namespace sieve::engine
