#pragma once
// The engine's output stage: what a step's logits rows and sampled tokens become for the caller.
//   prompt rows      → prompt logprobs (Request::prompt_logprobs), sent with the first event
//   sampled tokens   → StopMatcher (stop tokens, stop strings, text held back while it may still
//                      begin one) → RequestEvent with text and logprobs
//   finished sample  → its Usage and Timings
// Sampling (and draft verification) is the speculative driver's; what the scheduler does with the
// tokens is the engine's. Owned by the stepping thread.
#include <cstdint>
#include <span>

#include "engine/request.h"
#include "engine/sample.h"
#include "engine/sampler.h"
#include "kv/kv_manager.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace sieve::engine {

class OutputStage {
 public:
  OutputStage(const tok::Tokenizer& tokenizer, const model::ModelConfig& model,
              const sched::Scheduler& scheduler, const kv::KvManager& kv, int32_t page_size,
              int64_t kv_bytes_per_page)
      : tokenizer_(tokenizer),
        model_(model),
        scheduler_(scheduler),
        kv_(kv),
        page_size_(page_size),
        kv_bytes_per_page_(kv_bytes_per_page) {}

  // A scheduled sequence's step, before its sampling rows: first-schedule timings, prompt tokens
  // computed, and its prompt rows ([num_prompt_logits][vocab]) reduced to each next prompt
  // token's logprob and the top N, kept in the sample until its first event.
  void on_scheduled(const sched::ScheduledSequence& scheduled, Sample& first,
                    std::span<const float> prompt_rows, Clock::time_point now);
  // The sample's prompt is done (it samples this step): its prompt logprobs go with the first
  // events of it and of the samples it forks.
  void on_prompt_done(Sample& first);
  // The event for `results`, the tokens sampled this step in order (accepted drafts, then the
  // one sampled after them), `num_known` tokens being known before them. The stop matcher sees
  // them one by one, as without a draft: a stop ends the event there, and event.tokens holds the
  // tokens emitted.
  RequestEvent emit(Sample& sample, std::span<SampleResult> results, int64_t num_known,
                    Clock::time_point now);
  // A request with max_tokens 0: its sample finishes with "length" once the prompt is computed,
  // without sampling.
  RequestEvent finish_unsampled(Sample& sample);
  // A finished sample's usage (its target KV; the draft model's is the speculative driver's) and
  // timings, taken before the scheduler lets the sequence go.
  void finish(sched::SeqId seq, Sample& sample, RequestEvent& event) const;

  int64_t num_prompt_tokens_computed() const { return num_prompt_tokens_computed_; }
  int64_t num_generated_tokens() const { return num_generated_tokens_; }

 private:
  void record_prompt_logprobs(const sched::ScheduledSequence& scheduled, Sample& sample,
                              std::span<const float> rows) const;

  const tok::Tokenizer& tokenizer_;
  const model::ModelConfig& model_;
  const sched::Scheduler& scheduler_;
  const kv::KvManager& kv_;
  const int32_t page_size_;
  const int64_t kv_bytes_per_page_;
  int64_t num_prompt_tokens_computed_ = 0;
  int64_t num_generated_tokens_ = 0;
};

}  // namespace sieve::engine
