#pragma once
// Turns the scheduler's plain ScheduleOutput into model inputs and runs one batched forward
// step: copy-on-write page copies, then one ragged Batch (each scheduled sequence's new
// tokens, its positions and its block table), then LlamaModel::forward. Only sequences that
// sample this step ask for logits.
#include <functional>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/llama.h"
#include "sched/scheduler.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::engine {

class ModelRunner {
 public:
  ModelRunner(const model::LlamaModel& model, model::KvCache& cache, ThreadPool& pool)
      : model_(model), cache_(cache), pool_(pool) {}

  // `tokens_of(seq)` gives a sequence's known tokens. Returns logits [num sampling seqs][vocab],
  // rows in the order of `out.scheduled` entries with samples == true.
  using TokensOf = std::function<std::span<const int32_t>(sched::SeqId)>;
  const std::vector<float>& run(const sched::ScheduleOutput& out, const TokensOf& tokens_of);

 private:
  const model::LlamaModel& model_;
  model::KvCache& cache_;
  ThreadPool& pool_;
  model::Batch batch_;
  model::ForwardScratch scratch_;
  std::vector<float> logits_;
};

}  // namespace sieve::engine
