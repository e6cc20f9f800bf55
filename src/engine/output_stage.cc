#include "engine/output_stage.h"

#include <algorithm>
#include <cassert>
#include <utility>
#include <vector>

#include "util/clock.h"

namespace sieve::engine {

void OutputStage::on_scheduled(const sched::ScheduledSequence& scheduled, Sample& first,
                               std::span<const float> prompt_rows, Clock::time_point now) {
  if (!first.first_scheduled) {
    first.first_scheduled = now;
    first.timings.queue_seconds = seconds_between(first.arrival, now);
    first.cached_prompt_tokens = scheduled.num_computed_before;
  }
  if (scheduled.num_computed_before < first.num_prompt_tokens) {
    num_prompt_tokens_computed_ +=
        std::min(scheduled.num_new_tokens, first.num_prompt_tokens - scheduled.num_computed_before);
  }
  if (scheduled.num_prompt_logits > 0) record_prompt_logprobs(scheduled, first, prompt_rows);
}

void OutputStage::record_prompt_logprobs(const sched::ScheduledSequence& scheduled, Sample& sample,
                                         std::span<const float> rows) const {
  const auto vocab = static_cast<size_t>(model_.vocab_size);
  std::span<const int32_t> tokens = scheduler_.tokens(scheduled.seq_id);
  const auto first = static_cast<size_t>(scheduled.num_computed_before);
  // Chunks come in order and never from the prefix cache; a recompute after preemption starts
  // again from position 0.
  assert(sample.prompt_rows.size() >= first + 1);
  sample.prompt_rows.resize(first + 1);
  for (size_t i = 0; i < static_cast<size_t>(scheduled.num_prompt_logits); ++i) {
    const std::span<const float> row = rows.subspan(i * vocab, vocab);
    const TokenId next = tokens[first + i + 1];
    SampleResult result{.token = next, .top = top_logprobs(row, *sample.prompt_logprobs)};
    // One log-sum-exp pass per row (O(V) exps, the reduction's main cost): the top list's first
    // entry gives it back (lse = its logit - its logprob).
    result.logprob = result.top.empty()
                         ? static_cast<float>(token_logprob(row, next))
                         : static_cast<float>(static_cast<double>(row[next]) -
                                              static_cast<double>(row[result.top[0].id]) +
                                              result.top[0].logprob);
    sample.prompt_rows.push_back(std::move(result));
  }
}

void OutputStage::on_prompt_done(Sample& first) {
  if (first.prompt_rows.empty()) return;
  first.unsent_prompt_logprobs =
      std::make_shared<const std::vector<SampleResult>>(std::exchange(first.prompt_rows, {}));
}

RequestEvent OutputStage::emit(Sample& sample, std::span<SampleResult> results, int64_t num_known,
                               Clock::time_point now) {
  RequestEvent event{.request_id = sample.request_id,
                     .sample_idx = sample.sample_idx,
                     .prompt_logprobs = std::move(sample.unsent_prompt_logprobs)};
  int32_t num_emitted = 0;
  for (SampleResult& result : results) {
    ++num_emitted;
    event.tokens.push_back(result.token);
    StopUpdate update = sample.stop.push(result.token, tokenizer_.token_to_piece(result.token));
    if (!update.finish && num_known + num_emitted >= model_.context_length) {
      StopUpdate rest = sample.stop.finish(FinishReason::kLength);
      update.text += rest.text;
      update.finish = rest.finish;
    }
    event.text += update.text;
    if (sample.params.logprobs) event.logprobs.push_back(std::move(result));
    sample.timings.token_seconds.push_back(seconds_between(sample.arrival, now));
    if (update.finish) {
      event.finish = update.finish;
      break;
    }
  }
  num_generated_tokens_ += num_emitted;
  sample.timings.first_token_seconds = sample.timings.token_seconds.front();
  return event;
}

RequestEvent OutputStage::finish_unsampled(Sample& sample) {
  return RequestEvent{.request_id = sample.request_id,
                      .sample_idx = sample.sample_idx,
                      .prompt_logprobs = std::move(sample.unsent_prompt_logprobs),
                      .finish = sample.stop.finish(FinishReason::kLength).finish};
}

void OutputStage::finish(sched::SeqId seq, Sample& sample, RequestEvent& event) const {
  sample.timings.total_seconds = seconds_between(sample.arrival, Clock::now());
  const int64_t num_tokens = static_cast<int64_t>(scheduler_.tokens(seq).size());
  const int32_t kv_pages = kv_.num_pages_held(seq);
  const auto kv_dense_pages = static_cast<int32_t>((num_tokens - 1 + page_size_ - 1) / page_size_);
  event.usage = {.prompt_tokens = sample.num_prompt_tokens,
                 .completion_tokens = scheduler_.num_output_tokens(seq),
                 .cached_prompt_tokens = sample.cached_prompt_tokens,
                 .continued_prompt_tokens = sample.continued_prompt_tokens,
                 .kv_pages = kv_pages,
                 .kv_dense_pages = kv_dense_pages,
                 .kv_bytes = kv_pages * kv_bytes_per_page_,
                 .kv_dense_bytes = kv_dense_pages * kv_bytes_per_page_,
                 .attention_recovery = sample.attention_recovery,
                 .spec_draft_tokens = sample.spec_draft_tokens,
                 .spec_accepted_tokens = sample.spec_accepted_tokens};
  event.timings = std::move(sample.timings);
}

}  // namespace sieve::engine
