#include "engine/model_runner.h"

namespace sieve::engine {

const std::vector<float>& ModelRunner::run(const sched::ScheduleOutput& out, const TokensOf& tokens_of) {
  for (const sched::ScheduledCopy& planned : out.page_copies) {
    cache_.copy_page(planned.copy.src.value, planned.copy.dst.value);
  }
  batch_.clear();
  for (const sched::ScheduledSequence& s : out.scheduled) {
    std::vector<int32_t> table(s.block_table.size());
    for (size_t i = 0; i < table.size(); ++i) table[i] = s.block_table[i].value;
    batch_.begin_sequence(std::move(table));
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

}  // namespace sieve::engine
