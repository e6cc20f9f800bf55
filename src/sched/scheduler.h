#pragma once
// Iteration-level scheduling (continuous batching) over the paged KV cache.
//
// A sequence is two counters and its tokens — no prefill/decode modes:
//   tokens        prompt + sampled output so far ("known")
//   num_computed  how many of them have K/V in the cache
// Each step hands out a token budget (max_batch_tokens):
//   1. running sequences with one token left to compute (decodes), in admission order;
//   2. running sequences still in their prompt (chunked prefill: at most the remaining budget);
//   3. waiting sequences, FIFO, while pages and the sequence limit allow (prefix-cache hits
//      count as computed and cost no budget).
// When pages run out, the most recently admitted running sequence is preempted: its pages are
// freed and it goes back to the front of the queue to be recomputed later. Admission is the
// engine's: add() takes only sequences that fit in an empty pool, so none waits forever.
//
// Speculative decoding: before a step the engine may give a decoding sequence draft tokens
// (set_draft). They are appended to its tokens, so the step computes its last real token and the
// drafts in one go, still as a decode (never split: drafts that do not fit the budget are dropped),
// and every one of those rows yields logits. After the step the engine keeps the accepted prefix
// (resolve_draft): the rejected drafts leave the tokens and their K/V slots and pages are given
// back. Draft tokens are never published to the prefix cache; a sequence preempted or not
// scheduled loses its drafts.
//
// Dense or compressed by a sparsity policy (kv/kv_manager.h), a running sequence takes its
// step's room with one KvManager::reserve; a compressed one's ScheduledSequence carries where its
// streams' new tokens go. Preemption frees it like any other; it is recomputed from its tokens,
// dense at first.
//
// The scheduler deals in ids and counts only; it emits one plain ScheduleOutput that the model
// runner turns into batch inputs (block tables, positions).
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_manager.h"

namespace sieve::sched {

using kv::SeqId;

struct SchedulerConfig {
  int32_t max_batch_tokens = 512;  // tokens computed per step, over all sequences
  int32_t max_num_seqs = 64;       // running sequences at most
  int32_t max_model_len = 0;       // context length: prompt + output tokens at most
};

struct ScheduledSequence {
  SeqId seq_id;
  int32_t num_computed_before = 0;  // position of the first token computed this step
  int32_t num_new_tokens = 0;
  // The step computes the sequence's last known token, so its logits give the next token.
  bool samples = false;
  // The last num_draft_tokens of the new tokens are draft tokens (set_draft): the step's logits
  // rows are the last num_draft_tokens + 1 tokens', in order.
  int32_t num_draft_tokens = 0;
  // Prompt logprobs (SequenceOptions::prompt_logits): the first num_prompt_logits of the new
  // tokens are prompt positions before the prompt's last one whose logits rows are wanted too
  // (each gives the next prompt token's distribution); their rows come before the sampling row.
  int32_t num_prompt_logits = 0;
  // Streams of their own (a sparse sequence): where each stream's new tokens go
  // (kv::SparseLayout::address with first_index[s] + i). Streams sharing a block table write
  // position t at block_table(seq)[t / page_size]. Read either from the KvManager before the
  // next call that changes the sequence.
  std::optional<kv::SparseAppend> stream_slots;
};

// Copy-on-write for a sequence that shares the page it is about to write.
struct ScheduledCopy {
  SeqId seq_id;
  kv::PageCopy copy;
};

struct ScheduleOutput {
  std::vector<ScheduledSequence> scheduled;  // decodes first, then prefill chunks, then new
  std::vector<ScheduledCopy> page_copies;    // copy-on-write: do these before the forward pass
  std::vector<SeqId> preempted;              // lost their pages this step; will be recomputed
  int32_t num_batched_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_preemptions = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvManager& kv);

  struct SequenceOptions {
    uint64_t extra_key = 0;  // separates prefix-cache namespaces (see kv::BlockHash)
    // The most pages the sequence can ever hold, for a request that will be compressed
    // (kv::sparse_peak_pages); nullopt: its dense size. At most the pool's pages.
    std::optional<int64_t> max_pages;
    // > 0 (a multiple of the page size): no step computes tokens across a multiple of it and a
    // prefix-cache hit covers at most its first chunk less one page (a step still ends on the
    // first boundary), so a request compressed chunk by chunk is compressed at the same
    // positions whatever else runs.
    int32_t chunk_boundary = 0;
    // Neither reads cached prefixes nor publishes its pages: they stay its own, so compressing
    // it turns them sparse in place instead of copying.
    bool private_kv = false;
    // Prompt logprobs: until its first sampled token, every prompt position but the last also
    // yields a logits row (ScheduledSequence::num_prompt_logits), and the prompt reads no cached
    // prefix (cached tokens have no logits; it still publishes its pages). A recompute after
    // preemption before that token yields the rows again; one after it yields none.
    bool prompt_logits = false;
    // A continuation (kv/kv_manager.h, parked sequences): the KV manager already holds the first
    // `num_computed` tokens' K/V under this SeqId (KvManager::adopt). The sequence waits
    // holding them; if its first step finds no room while nothing runs, it lets them go and is
    // computed from the start (reported as preempted).
    int32_t num_computed = 0;
  };
  // Queues a new sequence that the caller has admitted (engine::Engine decides admission):
  // prompt + max_new_tokens within max_model_len, its peak pages within the pool. Asserted.
  void add(SeqId seq, std::vector<int32_t> prompt, int32_t max_new_tokens,
           const SequenceOptions& options);
  void add(SeqId seq, std::vector<int32_t> prompt, int32_t max_new_tokens) {
    add(seq, std::move(prompt), max_new_tokens, SequenceOptions{});
  }
  // Starts `child` as a running copy of running sequence `parent` (parallel sampling, n > 1):
  // a dense child shares every page, its own writes go through copy-on-write. Call right after
  // the step in which the parent sampled its first token, before appending that token to either.
  // A sparse parent's child gets fresh pages: the returned slice and area copies must be performed
  // before anything changes the parent's K/V (a compress or drop of the parent included); if the
  // pool lacks the pages the child waits and is recomputed from its tokens (nothing returned).
  kv::CompactionPlan fork(SeqId parent, SeqId child);

  ScheduleOutput schedule();
  // After the model ran `out`: the scheduled tokens are computed; full blocks are published to
  // the prefix cache.
  void on_step_done(const ScheduleOutput& out);
  // A sampled token becomes known (it is computed in a later step).
  void append_token(SeqId seq, int32_t token);
  // Speculative decoding. set_draft: a running sequence with exactly one token left to compute
  // and no draft gets `draft` appended to its tokens, to be verified by the next step.
  // resolve_draft, after that step: its first `num_accepted` draft tokens become known and
  // computed, the others leave its tokens and K/V (kv::KvManager::truncate); then the full blocks
  // are published. A sequence that finished meanwhile is ignored.
  void set_draft(SeqId seq, std::span<const int32_t> draft);
  // Draft token `index` becomes `token` (a drafter that needs the step's pages before it knows
  // its tokens sets placeholders first, then fills them in after schedule()).
  void set_draft_token(SeqId seq, int32_t index, int32_t token);
  void resolve_draft(SeqId seq, int32_t num_accepted);
  int32_t num_draft_tokens(SeqId seq) const { return seqs_.at(seq).num_draft_tokens; }
  // The most draft tokens set_draft takes now: the accepted drafts and the token sampled after
  // them must stay within the sequence's prompt + max_new_tokens.
  int32_t max_draft_tokens(SeqId seq) const;
  // Finished or cancelled, waiting or running: forgets the sequence and frees its pages now.
  void finish(SeqId seq);
  // Finished, running, no draft: forgets the sequence but parks its K/V in the KV manager under
  // `key` (KvManager::park) for a later prompt that continues it.
  void finish_and_park(SeqId seq, uint64_t key);
  // The prompt grows by `tokens` after the sequence's known ones (the continuation reference:
  // engine/request.h, Request::then_prompt); they are computed like a prompt's.
  void extend_prompt(SeqId seq, std::span<const int32_t> tokens);

  bool contains(SeqId seq) const { return seqs_.contains(seq); }
  // Running (scheduled last step or admitted), not waiting or preempted.
  bool is_running(SeqId seq) const {
    auto it = seqs_.find(seq);
    return it != seqs_.end() && it->second.running;
  }
  std::span<const int32_t> tokens(SeqId seq) const;
  int32_t num_computed(SeqId seq) const;
  int32_t num_output_tokens(SeqId seq) const;
  SchedulerStats stats() const;
  bool idle() const { return running_.empty() && waiting_.empty(); }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;
    int32_t num_prompt_tokens = 0;
    int32_t num_computed = 0;
    int32_t max_total_tokens = 0;  // prompt + max_new_tokens
    int32_t num_draft_tokens = 0;  // the last ones of `tokens`, unverified
    SequenceOptions options;
    bool running = false;
  };
  // Prompt logprobs still to compute: the sequence wants them and has sampled nothing yet.
  static bool wants_prompt_logits(const Sequence& s) {
    return s.options.prompt_logits && static_cast<int32_t>(s.tokens.size()) == s.num_prompt_tokens;
  }
  // At most `wanted` tokens from position `from` on, not across the sequence's chunk boundary.
  static int32_t chunk_limit(const Sequence& s, int32_t from, int32_t wanted);
  // Makes room for `seq` to hold `num_tokens` tokens and have its next write page private,
  // preempting the most recently admitted other sequences as needed. False if `seq` itself
  // had to be preempted.
  // Streams of their own get their slots in `stream_slots`.
  bool reserve_running(SeqId seq, int32_t num_tokens, ScheduleOutput& out,
                       std::optional<kv::SparseAppend>& stream_slots);
  void preempt(SeqId seq, ScheduleOutput& out);
  static void drop_draft(Sequence& s);
  // The step's remaining budget is max_batch_tokens - out.num_batched_tokens.
  void schedule_running(bool decodes, ScheduleOutput& out);
  void schedule_waiting(ScheduleOutput& out);
  // The waiting front holds its K/V (SequenceOptions::num_computed): schedule its next chunk.
  // False: no pages yet, it keeps waiting (and so does everyone behind it).
  bool admit_continuation(SeqId seq, int32_t budget, ScheduleOutput& out);
  void add_scheduled(SeqId seq, int32_t num_new, ScheduleOutput& out,
                     std::optional<kv::SparseAppend> stream_slots);

  SchedulerConfig config_;
  kv::KvManager& kv_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> running_;  // admission order
  std::deque<SeqId> waiting_;   // FIFO; preempted sequences go back to the front
  int64_t num_preemptions_ = 0;
};

}  // namespace sieve::sched
