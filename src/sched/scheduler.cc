#include "sched/scheduler.h"

#include <algorithm>
#include <cassert>

namespace sieve::sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvManager& kv) : config_(config), kv_(kv) {}

void Scheduler::add(SeqId seq, std::vector<int32_t> prompt, int32_t max_new_tokens,
                    const SequenceOptions& options) {
  assert(!seqs_.contains(seq) && !prompt.empty());
  const int64_t max_total = static_cast<int64_t>(prompt.size()) + std::max(0, max_new_tokens);
  assert(config_.max_model_len <= 0 || max_total <= config_.max_model_len);
  [[maybe_unused]] const int64_t peak_pages =
      options.max_pages ? *options.max_pages : kv_.num_pages_for(static_cast<int32_t>(max_total));
  assert(peak_pages <= kv_.num_pages());
  Sequence& s = seqs_[seq];
  s.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  s.tokens = std::move(prompt);
  s.max_total_tokens = static_cast<int32_t>(max_total);
  s.options = options;
  assert(options.num_computed == 0 ||
         (kv_.contains(seq) && options.num_computed < s.num_prompt_tokens));
  s.num_computed = options.num_computed;
  waiting_.push_back(seq);
}

kv::CompactionPlan Scheduler::fork(SeqId parent, SeqId child) {
  const Sequence& p = seqs_.at(parent);
  assert(p.running && !seqs_.contains(child));
  Sequence& c = seqs_.emplace(child, p).first->second;
  std::optional<kv::CompactionPlan> copies = kv_.fork(parent, child);
  if (copies) {
    running_.push_back(child);
    return std::move(*copies);
  }
  c.num_computed = 0;
  c.running = false;
  waiting_.push_front(child);
  return {};
}

std::span<const int32_t> Scheduler::tokens(SeqId seq) const { return seqs_.at(seq).tokens; }
int32_t Scheduler::num_computed(SeqId seq) const { return seqs_.at(seq).num_computed; }
int32_t Scheduler::num_output_tokens(SeqId seq) const {
  const Sequence& s = seqs_.at(seq);
  return static_cast<int32_t>(s.tokens.size()) - s.num_prompt_tokens;
}

SchedulerStats Scheduler::stats() const {
  return {static_cast<int32_t>(running_.size()), static_cast<int32_t>(waiting_.size()),
          num_preemptions_};
}

void Scheduler::drop_draft(Sequence& s) {
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.num_draft_tokens));
  s.num_draft_tokens = 0;
}

void Scheduler::preempt(SeqId seq, ScheduleOutput& out) {
  Sequence& s = seqs_.at(seq);
  drop_draft(s);
  kv_.free(seq);
  s.num_computed = 0;
  s.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  // A victim already scheduled this step (a decode admitted after the sequence that needs its
  // pages) gives its tokens back.
  auto scheduled = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                                [&](const ScheduledSequence& x) { return x.seq_id == seq; });
  if (scheduled != out.scheduled.end()) {
    out.num_batched_tokens -= scheduled->num_new_tokens;
    out.scheduled.erase(scheduled);
  }
  out.preempted.push_back(seq);
  ++num_preemptions_;
}

bool Scheduler::reserve_running(SeqId seq, int32_t num_tokens, ScheduleOutput& out,
                                std::optional<kv::SparseAppend>& stream_slots) {
  const int32_t num_computed = seqs_.at(seq).num_computed;
  for (;;) {
    if (std::optional<kv::StepSlots> slots = kv_.reserve(seq, num_computed, num_tokens)) {
      if (slots->page_copy) out.page_copies.push_back({seq, *slots->page_copy});
      stream_slots = std::move(slots->append);
      return true;
    }
    // Out of pages: the most recently admitted sequence makes room (possibly `seq` itself).
    const SeqId victim = running_.back();
    preempt(victim, out);
    if (victim == seq) return false;
  }
}

void Scheduler::add_scheduled(SeqId seq, int32_t num_new, ScheduleOutput& out,
                              std::optional<kv::SparseAppend> stream_slots) {
  const Sequence& s = seqs_.at(seq);
  const int32_t num_prompt_logits =
      wants_prompt_logits(s)
          ? std::max(0,
                     std::min(s.num_computed + num_new, s.num_prompt_tokens - 1) - s.num_computed)
          : 0;
  out.scheduled.push_back(
      {.seq_id = seq,
       .num_computed_before = s.num_computed,
       .num_new_tokens = num_new,
       .samples = s.num_computed + num_new == static_cast<int32_t>(s.tokens.size()),
       .num_draft_tokens = s.num_draft_tokens,
       .num_prompt_logits = num_prompt_logits,
       .stream_slots = std::move(stream_slots)});
  out.num_batched_tokens += num_new;
}

void Scheduler::schedule_running(bool decodes, ScheduleOutput& out) {
  // Iterate over a snapshot: preemption removes entries from running_.
  const std::vector<SeqId> order = running_;
  for (SeqId seq : order) {
    const int32_t budget = config_.max_batch_tokens - out.num_batched_tokens;
    if (budget == 0) return;
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || !it->second.running) continue;  // preempted earlier this step
    Sequence& s = it->second;
    const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    if ((remaining - s.num_draft_tokens == 1) != decodes || remaining == 0) continue;
    if (std::any_of(out.scheduled.begin(), out.scheduled.end(),
                    [&](const ScheduledSequence& x) { return x.seq_id == seq; })) {
      continue;
    }
    const int32_t num_new = chunk_limit(s, s.num_computed, std::min(remaining, budget));
    if (num_new < remaining && s.num_draft_tokens > 0) {
      // A decode is never split: the drafts that do not fit wait for no one.
      const int32_t cut = std::min(s.num_draft_tokens, remaining - num_new);
      s.tokens.resize(s.tokens.size() - static_cast<size_t>(cut));
      s.num_draft_tokens -= cut;
    }
    std::optional<kv::SparseAppend> stream_slots;
    if (!reserve_running(seq, it->second.num_computed + num_new, out, stream_slots)) continue;
    add_scheduled(seq, num_new, out, std::move(stream_slots));
  }
}

void Scheduler::schedule_waiting(ScheduleOutput& out) {
  for (;;) {
    const int32_t budget = config_.max_batch_tokens - out.num_batched_tokens;
    if (budget == 0 || waiting_.empty() ||
        static_cast<int32_t>(running_.size()) >= config_.max_num_seqs)
      return;
    const SeqId seq = waiting_.front();
    Sequence& s = seqs_.at(seq);
    if (s.num_computed > 0) {  // a continuation: its K/V is held already
      if (!admit_continuation(seq, budget, out)) return;
      continue;
    }
    kv::PrefixMatch match =
        s.options.private_kv || wants_prompt_logits(s)
            ? kv::PrefixMatch{.num_prompt_tokens = static_cast<int32_t>(s.tokens.size()),
                              .extra_key = s.options.extra_key}
            : kv_.lookup_prefix(s.tokens, s.options.extra_key);
    // A hit ends a page before the first boundary, so that the step computing up to it ends
    // there and the engine compresses at the boundary as it does without a hit (a hit up to the
    // boundary skipped that compression: the next chunk attended to the whole first one).
    const int32_t boundary = s.options.chunk_boundary;
    if (boundary > 0 && match.num_cached_tokens >= boundary) {
      const int32_t page_size = kv_.config().page_size;
      const size_t blocks = static_cast<size_t>((boundary - page_size) / page_size);
      match.pages.resize(blocks);
      match.hashes.resize(blocks);
      match.num_cached_tokens = boundary - page_size;
    }
    const int32_t num_new = chunk_limit(
        s, match.num_cached_tokens,
        std::min(static_cast<int32_t>(s.tokens.size()) - match.num_cached_tokens, budget));
    if (!kv_.admit(seq, match, match.num_cached_tokens + num_new)) return;  // wait for pages
    waiting_.pop_front();
    s.num_computed = match.num_cached_tokens;
    s.running = true;
    running_.push_back(seq);
    add_scheduled(seq, num_new, out, std::nullopt);
  }
}

bool Scheduler::admit_continuation(SeqId seq, int32_t budget, ScheduleOutput& out) {
  Sequence& s = seqs_.at(seq);
  const int32_t num_new = chunk_limit(
      s, s.num_computed, std::min(static_cast<int32_t>(s.tokens.size()) - s.num_computed, budget));
  std::optional<kv::StepSlots> slots = kv_.reserve(seq, s.num_computed, s.num_computed + num_new);
  if (!slots) {
    if (!running_.empty()) return false;  // wait for pages
    // Nothing runs to give pages back: start from the first token like any other.
    kv_.free(seq);
    s.num_computed = 0;
    out.preempted.push_back(seq);
    return true;
  }
  waiting_.pop_front();
  s.running = true;
  running_.push_back(seq);
  if (slots->page_copy) out.page_copies.push_back({seq, *slots->page_copy});
  add_scheduled(seq, num_new, out, std::move(slots->append));
  return true;
}

ScheduleOutput Scheduler::schedule() {
  ScheduleOutput out;
  schedule_running(/*decodes=*/true, out);
  schedule_running(/*decodes=*/false, out);
  // No admissions in a step that had to preempt: the pool is full.
  if (out.preempted.empty()) schedule_waiting(out);
  // Drafts of a sequence the budget left out are stale by its next step.
  for (SeqId seq : running_) {
    Sequence& s = seqs_.at(seq);
    if (s.num_draft_tokens > 0 &&
        std::none_of(out.scheduled.begin(), out.scheduled.end(),
                     [&](const ScheduledSequence& x) { return x.seq_id == seq; })) {
      drop_draft(s);
    }
  }
  // Copies planned for sequences preempted later in the step would write pages they no
  // longer own (and which may already belong to someone else).
  std::erase_if(out.page_copies, [&](const ScheduledCopy& copy) {
    return std::find(out.preempted.begin(), out.preempted.end(), copy.seq_id) !=
           out.preempted.end();
  });
  return out;
}

void Scheduler::on_step_done(const ScheduleOutput& out) {
  for (const ScheduledSequence& scheduled : out.scheduled) {
    auto it = seqs_.find(scheduled.seq_id);
    if (it == seqs_.end() || !it->second.running) continue;  // finished or preempted since
    Sequence& s = it->second;
    s.num_computed = scheduled.num_computed_before + scheduled.num_new_tokens;
    // Draft tokens are published once verified (resolve_draft).
    if (!s.options.private_kv) {
      kv_.commit_full_blocks(scheduled.seq_id, s.tokens, s.num_computed - s.num_draft_tokens);
    }
  }
}

int32_t Scheduler::chunk_limit(const Sequence& s, int32_t from, int32_t wanted) {
  const int32_t boundary = s.options.chunk_boundary;
  if (boundary <= 0) return wanted;
  return std::min(wanted, boundary - from % boundary);
}

void Scheduler::append_token(SeqId seq, int32_t token) {
  Sequence& s = seqs_.at(seq);
  assert(s.num_draft_tokens == 0 && "resolve the draft first");
  s.tokens.push_back(token);
}

int32_t Scheduler::max_draft_tokens(SeqId seq) const {
  const Sequence& s = seqs_.at(seq);
  return std::max(0, s.max_total_tokens - static_cast<int32_t>(s.tokens.size()) - 1);
}

void Scheduler::set_draft(SeqId seq, std::span<const int32_t> draft) {
  Sequence& s = seqs_.at(seq);
  assert(s.running && s.num_draft_tokens == 0 &&
         s.num_computed + 1 == static_cast<int32_t>(s.tokens.size()));
  assert(static_cast<int32_t>(draft.size()) <= max_draft_tokens(seq));
  s.tokens.insert(s.tokens.end(), draft.begin(), draft.end());
  s.num_draft_tokens = static_cast<int32_t>(draft.size());
}

void Scheduler::set_draft_token(SeqId seq, int32_t index, int32_t token) {
  Sequence& s = seqs_.at(seq);
  assert(index >= 0 && index < s.num_draft_tokens);
  s.tokens[s.tokens.size() - static_cast<size_t>(s.num_draft_tokens - index)] = token;
}

void Scheduler::resolve_draft(SeqId seq, int32_t num_accepted) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || !it->second.running) return;
  Sequence& s = it->second;
  assert(num_accepted >= 0 && num_accepted <= s.num_draft_tokens);
  const auto known = static_cast<int32_t>(s.tokens.size()) - s.num_draft_tokens + num_accepted;
  s.tokens.resize(static_cast<size_t>(known));
  s.num_draft_tokens = 0;
  // The step computed the last real token and every draft; the accepted ones' K/V is right.
  s.num_computed = std::min(s.num_computed, known);
  kv_.truncate(seq, s.num_computed);
  if (!s.options.private_kv) kv_.commit_full_blocks(seq, s.tokens, s.num_computed);
}

void Scheduler::finish_and_park(SeqId seq, uint64_t key) {
  auto it = seqs_.find(seq);
  assert(it != seqs_.end() && it->second.running && it->second.num_draft_tokens == 0);
  const Sequence& s = it->second;
  kv_.park(seq, std::span(s.tokens).first(static_cast<size_t>(s.num_computed)), key);
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  seqs_.erase(it);
}

void Scheduler::extend_prompt(SeqId seq, std::span<const int32_t> tokens) {
  Sequence& s = seqs_.at(seq);
  assert(s.num_draft_tokens == 0);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.num_prompt_tokens = static_cast<int32_t>(s.tokens.size());
  s.max_total_tokens += static_cast<int32_t>(tokens.size());
}

void Scheduler::finish(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  if (it->second.running) {
    kv_.free(seq);
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    if (kv_.contains(seq)) kv_.free(seq);  // a continuation waits holding its K/V
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  seqs_.erase(it);
}

}  // namespace sieve::sched
