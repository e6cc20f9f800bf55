#pragma once
// draft_model speculation's proposer: a smaller model with the target's vocabulary drafts k
// tokens per step for each speculating sequence, greedily (argmax, like self_sparse: the
// verification treats a draft as one-hot, see SpeculativeDriver::verify).
//
// The draft model keeps its own paged KV, in its own layers and dims: a second KvManager and
// KvCache beside the target's, with the same page size and the same number of pages, both
// carved from the one --kv-memory budget (pages_for: budget / (target + draft bytes per page)).
// Why a mirror pool and not pages from the target's PagePool: a page is one page id across every
// layer of one model's layout (model/kv_cache.h), so the draft's pages cannot be the target's
// without a second page layout in one buffer; a mirror of the same page count holds the draft
// K/V of every token the target pool can hold, so the target's admission and preemption stay as
// they are and count all memory. A speculating sequence holds at most as many draft pages as its
// dense target pages; when the target shares pages (prefix hits, n > 1) and the draft pool runs
// short, the sequence that finds no page drafts nothing that step (it keeps what it computed and
// tries again next step): speculation degrades, output never changes.
//
// One sequence's draft K/V, over one engine step:
//
//   prompt chunks    the draft computes each prompt chunk the target computes (prefill()), so
//                    its prompt is part of the time to first token
//   target tokens    t0 t1 ... t(n-1)                      known, t(n-1) not yet computed
//   draft KV         t0 ... t(m-1)                         m <= n: what it computed earlier
//   catch-up         t(m) ... t(n-1) in chunks of up to max_batch_tokens (all sequences
//                    together) -> logits of t(n-1) -> d0
//   drafting         d0 -> d1, d1 -> d2, ... d(k-2) -> d(k-1): one forward pass per draft token,
//                    batched across sequences
//   after the step   the target accepted a of the k and sampled one more; the next call keeps the
//                    draft KV's longest prefix that equals the tokens (t0 .. t(n-1) d0 .. d(a-1)),
//                    truncates the rest (KvManager::truncate) and catches up from there.
//
// Pages go back on release() (finish, cancel, preemption). A forked sample (n > 1) starts without
// draft K/V (its parent has none yet: it forks at its first token) and catches up on its own; the
// draft pool's prefix cache (on when the engine's is) shares the prompt's full pages.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.h"
#include "kv/kv_manager.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace sieve::engine {

struct DraftModelConfig {
  int32_t num_pages = 0;  // the same as the target's pool
  int32_t page_size = 16;
  bool enable_prefix_caching = true;
  kernels::DType kv_dtype = model::kKvDefaultDType;  // f32 when the draft's head_dim forbids it
  int32_t max_batch_tokens = 512;                    // catch-up tokens per forward pass
};

class DraftModelProposer {
 public:
  DraftModelProposer(std::shared_ptr<const model::Model> model, const DraftModelConfig& config);

  // Loads `draft_path` on `target`'s backend and checks that it has the target's vocabulary:
  // the same number of tokens and the same text for each. Throws sieve::Error naming both files
  // otherwise (`target_path` may be empty: the target's general.name is named instead).
  static std::shared_ptr<const model::Model> load(const std::string& draft_path,
                                                  const model::Model& target,
                                                  const tok::Tokenizer& target_tokenizer,
                                                  const std::string& target_path);

  // The draft cache's element type for a wanted one: it, when the draft's head_dim can be stored
  // in it (q8 / q4 need a multiple of 32), else f32.
  static kernels::DType kv_dtype_for(const model::ModelConfig& draft, kernels::DType wanted);

  // One sequence that wants a draft this step: its known tokens (no draft among them; the last
  // one is not computed by the target yet) and how many draft tokens at most.
  struct Want {
    sched::SeqId seq;
    std::span<const int32_t> tokens;
    int32_t max_drafts = 0;
  };
  // Drafts for every want, in order (shorter than asked, or empty, when the pool is short).
  std::vector<std::vector<int32_t>> propose(std::span<const Want> wants);
  // The draft computes a prompt chunk with the target (the sequence's tokens through the
  // chunk's end), so that its prompt costs time to first token, not the first decode step. A
  // short pool leaves the rest to propose()'s catch-up.
  struct Prefill {
    sched::SeqId seq;
    std::span<const int32_t> tokens;
  };
  void prefill(std::span<const Prefill> chunks);
  // Gives the sequence's draft pages back (no-op if it has none).
  void release(sched::SeqId seq);

  const model::Model& model() const { return *model_; }
  kv::KvStats kv_stats() const { return kv_.stats(); }
  int32_t num_pages_held(sched::SeqId seq) const {
    return kv_.contains(seq) ? kv_.num_pages_held(seq) : 0;
  }
  int64_t kv_bytes_per_page() const { return bytes_per_page_; }
  kernels::DType kv_dtype() const { return cache_.dtype(); }

 private:
  struct Drafting;
  bool done(const Drafting& d) const;
  // Catch-up and drafting passes until every sequence is done.
  void run_passes(std::vector<Drafting>& drafting);
  // Makes room for `seq`'s next tokens (admitting it first if new: its prefix-cache hit counts as
  // computed): as many as it lacks of `tokens`, up to `budget`. nullopt if the pool is short.
  std::optional<sched::ScheduledSequence> schedule(sched::SeqId seq,
                                                   std::span<const int32_t> tokens, int32_t budget,
                                                   sched::ScheduleOutput& out);
  // Runs one forward pass over `out`, records what each sequence computed and returns the argmax
  // of each sampling row, in order.
  std::vector<int32_t> run(const sched::ScheduleOutput& out, std::span<Drafting*> by_seq);

  std::shared_ptr<const model::Model> model_;
  DraftModelConfig config_;
  kv::KvManager kv_;
  model::KvCache cache_;
  ModelRunner runner_;
  int64_t bytes_per_page_ = 0;
  // The tokens whose K/V the draft holds, per sequence: [0, their size) are computed.
  std::unordered_map<sched::SeqId, std::vector<int32_t>> computed_;
};

}  // namespace sieve::engine
