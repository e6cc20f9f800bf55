#pragma once
// The serving engine: continuous batching over a paged KV cache.
//
// The path of one request:
//   Request (prompt ids + SamplingParams + kv_policy)
//     └─ Engine::submit ──► checked and planned (the sparsity driver's admission bound), or
//                            refused: AdmissionError (engine/admission.h)
//   Engine::step(), its stages in order:
//     admit()                         pending ──► Scheduler waiting queue (one sequence, one
//                                     Sample: engine/sample.h), or refused at the queue limit
//     apply_cancellations()           pages back to the pool
//     snapshots_.serve()              KV snapshots asked for (engine/kv_snapshots.h)
//     speculative_.propose()          decoding sequences get draft tokens (ngram, draft model,
//                                     self_sparse placeholders: engine/speculative_driver.h)
//     out = scheduler_.schedule()     ids and counts: who computes which tokens
//     restart_preempted(out)          preempted sequences drop what they held beside their KV
//     sparsity_.plan_rows(out)        what compressed sequences' decode rows read and return
//                                     (engine/sparsity_driver.h)
//     speculative_.draft(out)         self-speculation's draft passes; the draft model's prefill
//     logits = run_model(out)         streams' tables → Batch → Model::forward
//     process_outputs(out, logits)    per sampling row: fork the n - 1 other samples (first token
//                                     only), then per sample speculative_.verify (sample, verify
//                                     drafts) → outputs_.emit (stop matcher, text, logprobs:
//                                     engine/output_stage.h) → RequestEvent → sink
//     sparsity_.after_step()          compress completed prompts and chunks, drop what decode-time
//                                     policies let go
//   finished or cancelled ──► Scheduler::finish ──► pages back to the pool in the same step
//
// Threading: submit(), cancel(), request_kv_snapshot() and request_prefix_cache_reset() may be
// called from any thread;
// step() runs on one thread (the caller's, or the engine's own loop after start()). Event sinks
// are called on that thread and must not block.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/admission.h"
#include "engine/draft_model.h"
#include "engine/engine_config.h"
#include "engine/kv_snapshot.h"
#include "engine/kv_snapshots.h"
#include "engine/model_runner.h"
#include "engine/output_stage.h"
#include "engine/request.h"
#include "engine/sample.h"
#include "engine/sparsity_driver.h"
#include "engine/speculative_driver.h"
#include "kernels/backend.h"
#include "kv/kv_manager.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace sieve::engine {

struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_prompt_tokens_computed = 0;
  int64_t num_generated_tokens = 0;
  // Speculative decoding (vLLM's spec_decode counters): verification steps with a draft, draft
  // tokens verified, draft tokens accepted, and accepted ones by position in the draft.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;  // [kMaxSpeculativeTokens]
  // Conversations on a compressed cache: requests that continued a parked sequence, and the
  // prompt tokens they did not compute (kv.num_parked_*: what is parked now).
  int64_t num_continued_requests = 0;
  int64_t num_continued_tokens = 0;
  kv::KvStats kv;
  int64_t kv_bytes_per_page = 0;  // of K and V, in the cache's dtype (KvCache::bytes_per_page)
  // draft_model: the draft model's pool (engine/draft_model.h); all zero without one.
  kv::KvStats draft_kv;
  int64_t draft_kv_bytes_per_page = 0;
  // Target and draft together.
  int64_t kv_bytes_used() const {
    return (kv.num_pages - kv.num_free_pages) * kv_bytes_per_page +
           int64_t{draft_kv.num_pages - draft_kv.num_free_pages} * draft_kv_bytes_per_page;
  }
  int64_t kv_bytes_total() const {
    return int64_t{kv.num_pages} * kv_bytes_per_page +
           int64_t{draft_kv.num_pages} * draft_kv_bytes_per_page;
  }
};

class Engine {
 public:
  Engine(const EngineConfig& config, std::shared_ptr<const model::Model> model,
         std::shared_ptr<const tok::Tokenizer> tokenizer);
  ~Engine();

  // Validates and queues a request; its events go to `sink`.
  std::variant<RequestId, AdmissionError> submit(Request request, EventSink sink);
  // Stops a request; its pages are freed at the start of the next step. Unknown ids are ignored.
  void cancel(RequestId id);

  // One iteration on the calling thread. False when there was nothing to do.
  bool step();
  void run_until_idle();
  // A background thread that steps while there is work and sleeps otherwise.
  void start();
  void stop();

  EngineStats stats() const;
  // The KV cache as it stands between two steps (engine/kv_snapshot.h). `done` is called once,
  // on the stepping thread, at the next step boundary (an idle loop wakes for it) or by stop();
  // it must not block: post the answer's work elsewhere. Any thread. While someone polls (an
  // ask without label_id in the last kSnapshotWatchWindow), every step's end also publishes
  // one, and such asks get it at once, on the calling thread: at most one step old.
  void request_kv_snapshot(KvSnapshotQuery query, KvSnapshotSink done);
  static constexpr std::chrono::seconds kSnapshotWatchWindow = KvSnapshots::kWatchWindow;
  // vLLM's reset_prefix_cache: frees the parked conversations and forgets every cached prefix
  // block, so that what comes next starts cold (a benchmark's first round, a soak's references).
  // Only while no request is queued or runs; otherwise nothing changes and `done` gets false.
  // Any thread; `done` is called once, on the stepping thread at the next step boundary (an idle
  // loop wakes for it) or by stop(), and must not block.
  using ResetSink = std::function<void(bool reset)>;
  void request_prefix_cache_reset(ResetSink done);
  // Throws sieve::Error naming the problem if `policy` cannot run on this engine (e.g. lserve
  // without a calibration profile): a server checks its default policy once at start.
  void check_policy(const sparsity::PolicySpec& policy) const { (void)sparsity_.resolve(policy); }
  // The same for a speculative decoding configuration (e.g. a draft_model with another
  // vocabulary, or a method this engine cannot run).
  void check_speculative(const speculative::SpeculativeConfig& speculative) const {
    speculative_.check(speculative);
  }
  const EngineConfig& config() const { return config_; }
  const model::Model& model() const { return *model_; }
  // The (layer * num_kv_heads + kv head) streams the cache also keeps in f16 (model::KvCache).
  std::span<const int32_t> precise_kv_streams() const { return precise_kv_streams_; }
  // Bytes of K and V one page takes in this engine's cache (config().kv_dtype).
  int64_t kv_bytes_per_page() const { return kv_bytes_per_page_; }

 private:
  struct PendingRequest;
  // `draft_model`: SpeculativeDriver::load_draft_model's, loaded before the pools are sized.
  Engine(const EngineConfig& config, std::shared_ptr<const model::Model> model,
         std::shared_ptr<const tok::Tokenizer> tokenizer,
         std::shared_ptr<const model::Model> draft_model);
  // The engine's own stages of step() (the others are its stage objects').
  void admit();
  void apply_cancellations();
  void restart_preempted(const std::vector<sched::SeqId>& preempted);
  // The target's forward pass over the step; its time feeds adaptive k.
  const std::vector<float>& run_model(const sched::ScheduleOutput& out);
  // Gives back what a sequence holds beside its target KV (the draft model's pages, Quest's
  // summaries): it finished, was cancelled or preempted.
  void forget(sched::SeqId seq);
  void process_outputs(const sched::ScheduleOutput& out, const std::vector<float>& logits);
  EngineStats make_stats() const;
  void publish_stats();
  // Parallel sampling: starts the n - 1 other samples of `seq`'s request, which sampled its
  // first token this step; returns all of the request's sequences, `seq` first.
  std::vector<sched::SeqId> fork_samples(sched::SeqId seq, Sample& first);
  // Sends `event` to the sample's sink, finishing the sample first if the event does.
  void send(sched::SeqId seq, Sample& sample, RequestEvent event);
  void finish_sample(sched::SeqId seq, Sample& sample, RequestEvent& event);
  // Conversations on a compressed cache (EngineConfig::max_parked_share): a finished sample with
  // a sparse policy parks its K/V and controller; a new request whose prompt extends a parked
  // sequence's tokens under the same policy takes them over (returns the tokens it continues
  // from, 0 for none); parked sequences the KV manager freed to make room are forgotten.
  bool can_park(sched::SeqId seq, const Sample& sample, const RequestEvent& event) const;
  static uint64_t parking_key(const Sample& sample);
  int32_t continue_parked(sched::SeqId seq, Sample& sample, std::span<const TokenId> prompt);
  void forget_evicted_parked();
  void serve_prefix_cache_resets();
  // Runs the output stage over the sampled tokens, keeps the accepted drafts it let through,
  // appends the last sampled token and sends the event (finishing the sample if it stopped).
  void emit_tokens(sched::SeqId seq, Sample& sample, std::span<SampleResult> results,
                   int32_t num_drafts, Clock::time_point now);

  EngineConfig config_;
  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tok::Tokenizer> tokenizer_;
  std::vector<TokenId> eos_ids_;
  // cache_'s precise streams (EngineConfig::precise_kv_heads), known before the pool is sized.
  std::vector<int32_t> precise_kv_streams_;
  kv::KvManager kv_;
  model::KvCache cache_;
  int64_t kv_bytes_per_page_ = 0;  // cache_'s
  sched::Scheduler scheduler_;
  ModelRunner runner_;
  SpeculativeDriver speculative_;
  SparsityDriver sparsity_;
  OutputStage outputs_;

  // Owned by the stepping thread.
  Samples samples_;
  struct ParkedState {
    std::unique_ptr<sparsity::SparsityController> sparsity;
    std::optional<float> attention_recovery;
  };
  std::unordered_map<sched::SeqId, ParkedState> parked_;  // kv_.is_parked(seq)
  int64_t num_continued_requests_ = 0;
  int64_t num_continued_tokens_ = 0;
  KvSnapshots snapshots_;
  uint64_t next_seq_id_ = 1;
  int64_t num_steps_ = 0;

  // Shared with submit()/cancel() callers.
  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::vector<std::unique_ptr<PendingRequest>> pending_;
  std::vector<RequestId> cancelled_;
  std::vector<ResetSink> prefix_cache_resets_;
  std::atomic<bool> prefix_cache_reset_asked_{false};  // prefix_cache_resets_ is not empty
  std::atomic<RequestId> next_request_id_{1};
  EngineStats published_stats_;

  std::thread loop_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace sieve::engine
