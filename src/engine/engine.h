#pragma once
// The serving engine: continuous batching over a paged KV cache.
//
// The path of one request:
//   Request (prompt ids + SamplingParams + kv_policy)
//     └─ Engine::submit ──► checked and planned, or refused: AdmissionError (engine/admission.h)
//   Engine::step(), a pipeline:
//     admit()                        pending ──► Scheduler waiting queue (one sequence), or
//                                    refused at the queue limit (RequestEvent::refused)
//     (cancellations, then KV snapshots asked for: request_kv_snapshot, engine/kv_snapshot.h)
//     propose_drafts()               speculative decoding: decoding sequences get draft tokens
//                                    (ngram: prompt lookup; draft_model: the draft model's own
//                                    passes over its own paged KV, engine/draft_model.h)
//     out    = scheduler.schedule()  ids and counts: who computes which tokens
//     draft_self_sparse(out)         self-speculation's draft passes (sparse views of the
//                                    sequences' own pages: sink + window, or Quest's choice
//                                    by key summaries) fill in their drafts; k per sequence
//                                    is fixed or adaptive (spec/draft_length.h)
//     prefill_draft_model(out)       draft_model: the draft model computes the step's prompt
//                                    chunks too
//     plan_row_requests(out)         what sparse sequences' decode rows must do (Quest slice
//                                    reads, attention weights), from their controllers
//     logits = runner.run(out)       streams' tables → Batch → LlamaModel::forward
//     process_outputs(out, logits)   fork the n - 1 other samples (first token only), then per
//                                    sample Sampler (verifying drafts) → StopMatcher →
//                                    RequestEvent → sink
//     apply_sparsity()               compress completed prompts, drop keys that left a window
//   finished or cancelled ──► Scheduler::finish ──► pages back to the pool in the same step
//
// Threading: submit(), cancel() and request_kv_snapshot() may be called from any thread;
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
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/admission.h"
#include "engine/draft_model.h"
#include "engine/kv_snapshot.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "kernels/backend.h"
#include "kv/kv_manager.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "sched/scheduler.h"
#include "sparsity/calibration.h"
#include "sparsity/policy_spec.h"
#include "spec/speculative_config.h"
#include "spec/step_cost.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace sieve::engine {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

struct EngineConfig {
  int32_t num_kv_pages = 0;  // 0: derived from kv_memory_bytes
  // The page pool in bytes; unset: default_kv_memory_bytes (sized from the model).
  std::optional<uint64_t> kv_memory_bytes;
  int32_t page_size = 16;
  int32_t max_batch_tokens = 512;
  // A request with a bounded sparse policy (streaming, snapkv, pyramidkv, h2o heads) is
  // compressed every this many prompt tokens (rounded up to pages and to its observation
  // window), so a long prompt holds at most its budget + one chunk; 0: once, after the prompt.
  int32_t sparse_prefill_chunk = 512;
  int32_t max_num_seqs = 64;
  int32_t max_queued = 1024;
  bool enable_prefix_caching = true;
  // K/V element type (model/kv_cache.h): kF32; kF16 (half the KV memory and half the bytes
  // decode attention reads per key; rounding moves logprobs by ~1e-3); kQ8_0 / kQ4_1 (q8 / q4:
  // 0.27x / 0.16x of f32's bytes; the model's head_dim must be a multiple of 32, checked when
  // the engine is made). kv_memory_bytes counts real bytes: a q4 pool has ~3.2x the pages of an
  // f16 one.
  kernels::DType kv_dtype = model::kKvDefaultDType;
  // Which KV heads are streaming-like (`sieve calibrate`), for lserve and heads:...@profile=F.
  // Must be for this model (LlamaModel::fingerprint()); null: such policies are refused.
  std::shared_ptr<const sparsity::CalibrationProfile> calibration;
  // Speculative decoding for requests that do not say (spec/speculative_config.h). Drafts are
  // verified exactly: greedy output equals plain decoding's token for token, and so does sampled
  // output for the same seed (see Engine::verify_draft). Sequences with a sparse KV policy decode
  // without drafts (their windows move one token per step, which a k-token verification step
  // would not reproduce).
  //
  // draft_model: the engine loads speculative.model (when that is the method here) once, at
  // construction, on the target's backend, and refuses a draft whose vocabulary is not the
  // target's. Its KV pool mirrors the target's (the same page size and number of pages, see
  // engine/draft_model.h), and both come out of kv_memory_bytes: each page of the budget costs the
  // target's bytes plus the draft's. A request may ask for draft_model only with this file.
  spec::SpeculativeConfig speculative;
  // The target model's file, for messages (a draft_model with another vocabulary); may be empty.
  std::string model_path;
};

// The default page pool's ceiling: the fixed default `sieve serve` had before the pool was sized
// from the model. A model whose full default pool is larger (a 7B model with f32 KV holds ~1k
// tokens in it) should be given --kv-memory from the memory the machine can spare.
inline constexpr uint64_t kDefaultKvMemoryCapBytes = 512ull << 20;

// The page pool when EngineConfig::kv_memory_bytes is unset: room for max_num_seqs sequences of
// the model's whole context each, in pages of the KV dtype, at most kDefaultKvMemoryCapBytes
// and at least one page. stories260K (5 layers x 4 KV heads x head_dim 8, f32 K and V, 20 KiB
// per 16-token page; context 512; 64 sequences): 64 x 32 pages = 40 MiB. Throws sieve::Error
// when the dtype cannot store the model's heads (KvCache::bytes_per_page).
uint64_t default_kv_memory_bytes(const model::ModelConfig& model, const EngineConfig& config);

struct Request {
  std::vector<TokenId> prompt;
  SamplingParams params;
  // Which KV to keep (sparsity/policy_spec.h); the default keeps everything. The engine runs the
  // per-(layer, KV head) plans made of full, sink + window (streaming), observation-window
  // top-B (snapkv, pyramidkv), heavy-hitter (h2o) and page-selecting (quest, lserve) heads,
  // composed by layerwise / heads / layers; others are refused.
  sparsity::PolicySpec kv_policy;
  // Overrides EngineConfig::speculative for this request ({"method": "none"} turns it off).
  std::optional<spec::SpeculativeConfig> speculative;
  // Prompt logprobs (vLLM's prompt_logprobs): nullopt: none; N in [0, kMaxTopLogprobs]: each
  // prompt token's log-probability given the tokens before it, and the top N there
  // (RequestEvent::prompt_logprobs). Such a request computes its whole prompt: it takes no
  // prefix-cache hit (cached tokens have no logits), though it publishes its pages for others.
  // Each prompt row is reduced to (logprob, top N) in the step that computes it. With a sparse
  // kv_policy compressed chunk by chunk, a later chunk's rows attend to the keys kept so far
  // (what the model really computed); compressed only at the prompt's end, they are dense.
  std::optional<int32_t> prompt_logprobs;
  // Echoed back in KV snapshots only (engine/kv_snapshot.h).
  RequestLabel label;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  // KV pages the sequence held when it finished, and what the same tokens take dense; the same
  // in bytes (pages x the cache's bytes per page: its dtype's).
  int32_t kv_pages = 0;
  int32_t kv_dense_pages = 0;
  int64_t kv_bytes = 0;
  int64_t kv_dense_bytes = 0;
  // Attention mass the kept keys received from the observation rows, over all keys, averaged
  // over the scored streams (SnapKV/PyramidKV/H2O); unset when no stream was scored.
  std::optional<float> attention_recovery;
  // Speculative decoding: draft tokens proposed and verified, and how many of them the target
  // accepted (the tokens sampled after them are not counted).
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;
  // draft_model: the pages the draft model's KV held for this sample when it finished (beside
  // kv_pages, in the draft's pool), and their bytes.
  int32_t spec_draft_kv_pages = 0;
  int64_t spec_draft_kv_bytes = 0;
};

struct Timings {
  double queue_seconds = 0.0;         // arrival to first scheduled
  double first_token_seconds = 0.0;   // arrival to first sampled token (TTFT)
  double total_seconds = 0.0;         // arrival to finish
  std::vector<double> token_seconds;  // arrival to each sampled token
};

// One step's news for one sample of one request.
struct RequestEvent {
  RequestId request_id = 0;
  int32_t sample_idx = 0;
  std::vector<TokenId> tokens;         // sampled this step (more than one: accepted drafts)
  std::string text;                    // text now safe to stream (may be empty: held back)
  std::vector<SampleResult> logprobs;  // per token, when the request asked for logprobs
  // Request::prompt_logprobs, on each sample's first event (null otherwise): [prompt tokens],
  // in order; entry i holds prompt token i, its logprob under the logits at position i - 1 and
  // the top N there (largest first, ties to the lowest id); entry 0 has neither (nothing comes
  // before it). Shared by the request's samples.
  std::shared_ptr<const std::vector<SampleResult>> prompt_logprobs;
  std::optional<Finish> finish;
  std::optional<std::string> error;  // the request failed; finish is set too
  bool cancelled = false;            // the error is cancel()'s
  // The error is a refusal found when the engine came to admit the request after submit()
  // accepted it (the queue filled meanwhile): what submit() would have returned.
  std::optional<AdmissionError> refused;
  Usage usage;      // meaningful with finish
  Timings timings;  // meaningful with finish
};
using EventSink = std::function<void(const RequestEvent&)>;

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
  Engine(const EngineConfig& config, std::shared_ptr<const model::LlamaModel> model,
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
  static constexpr std::chrono::seconds kSnapshotWatchWindow{3};
  // Throws sieve::Error naming the problem if `policy` cannot run on this engine (e.g. lserve
  // without a calibration profile): a server checks its default policy once at start.
  void check_policy(const sparsity::PolicySpec& policy) const { (void)resolve_policy(policy); }
  // The same for a speculative decoding configuration (e.g. a draft_model with another
  // vocabulary, or a method this engine cannot run).
  void check_speculative(const spec::SpeculativeConfig& speculative) const;
  const EngineConfig& config() const { return config_; }
  const model::LlamaModel& model() const { return *model_; }
  // Bytes of K and V one page takes in this engine's cache (config().kv_dtype).
  int64_t kv_bytes_per_page() const { return kv_bytes_per_page_; }

 private:
  struct Sample;
  struct PendingRequest;
  // The stages of step(), in order.
  void admit();
  void apply_cancellations();
  void restart_preempted(const std::vector<sched::SeqId>& preempted);
  void propose_drafts();
  // Gives back what a sequence holds beside its target KV (the draft model's pages, Quest's
  // summaries): it finished, was cancelled or preempted.
  void forget(sched::SeqId seq);
  void draft_self_sparse(const sched::ScheduleOutput& out);
  void prefill_draft_model(const sched::ScheduleOutput& out);
  void plan_row_requests(const sched::ScheduleOutput& out);
  void process_outputs(const sched::ScheduleOutput& out, const std::vector<float>& logits);
  // Prompt logprobs: reduces the step's prompt rows of `scheduled` (num_prompt_logits rows of
  // [vocab] logits) to each next prompt token's logprob and the top N, kept in the sample until
  // its first event.
  void record_prompt_logprobs(const sched::ScheduledSequence& scheduled, Sample& sample,
                              std::span<const float> rows);
  // A request with max_tokens 0: its samples finish with "length" once the prompt is computed,
  // without sampling.
  void finish_unsampled(sched::SeqId seq, Sample& sample);
  void record_step_cost(const sched::ScheduleOutput& out, double seconds);
  void publish_stats();
  // Answers the queued request_kv_snapshot calls (stepping thread, between steps).
  void serve_kv_snapshots();
  KvSnapshot make_kv_snapshot() const;
  std::optional<KvSnapshot::Heads> kv_heads(const KvSnapshotQuery& query) const;
  // Parallel sampling: starts the n - 1 other samples of `seq`'s request, which sampled its
  // first token this step; returns all of the request's sequences, `seq` first.
  std::vector<sched::SeqId> fork_samples(sched::SeqId seq, Sample& first);
  void finish_sample(sched::SeqId seq, RequestEvent& event);
  // The tokens `seq` samples from its step's logits rows (one per row: its last real token's,
  // then each draft token's), stopping after the first that differs from the draft.
  std::vector<SampleResult> verify_draft(sched::SeqId seq, Sample& sample,
                                         std::span<const float> rows, int32_t num_drafts);
  // Keeps the accepted drafts, appends the last sampled token, runs the stop matcher over them
  // and sends the event (finishing the sample if it stopped).
  void emit_tokens(sched::SeqId seq, Sample& sample, std::span<SampleResult> results,
                   int32_t num_drafts, Clock::time_point now);
  // KV sparsity after a step: compress sequences whose prompt is now complete, and keep the
  // windows of sink + window streams at their size.
  void compress(sched::SeqId seq, Sample& sample);
  void drop_out_of_window(sched::SeqId seq, Sample& sample);
  void apply_sparsity();
  sparsity::SparsityPlan resolve_policy(const sparsity::PolicySpec& policy) const;

  EngineConfig config_;
  std::shared_ptr<const model::LlamaModel> model_;
  std::shared_ptr<const tok::Tokenizer> tokenizer_;
  std::vector<TokenId> eos_ids_;
  std::shared_ptr<const model::LlamaModel> draft_model_;  // null: no draft_model speculation
  kv::KvManager kv_;
  model::KvCache cache_;
  sched::Scheduler scheduler_;
  ModelRunner runner_;
  std::unique_ptr<DraftModelProposer> draft_;  // with draft_model_
  spec::StepCost step_cost_;                   // what a draft token costs, for adaptive k
  int64_t kv_bytes_per_page_ = 0;

  // Owned by the stepping thread.
  std::unordered_map<sched::SeqId, std::unique_ptr<Sample>> samples_;
  std::vector<sched::SeqId> to_compress_;  // prompt complete this step, sparse plan
  std::unordered_map<sched::SeqId, ModelRunner::RowRequests> row_requests_;  // this step's
  uint64_t next_seq_id_ = 1;
  int64_t num_steps_ = 0;
  int64_t num_prompt_tokens_computed_ = 0;
  int64_t num_generated_tokens_ = 0;
  int64_t spec_num_drafts_ = 0;
  int64_t spec_num_draft_tokens_ = 0;
  int64_t spec_num_accepted_tokens_ = 0;
  std::vector<int64_t> spec_accepted_per_position_ =
      std::vector<int64_t>(spec::kMaxSpeculativeTokens, 0);

  // Shared with submit()/cancel() callers.
  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::vector<std::unique_ptr<PendingRequest>> pending_;
  std::vector<RequestId> cancelled_;
  std::atomic<RequestId> next_request_id_{1};
  EngineStats published_stats_;
  struct SnapshotAsk {
    KvSnapshotQuery query;
    KvSnapshotSink done;
  };
  std::vector<SnapshotAsk> snapshot_asks_;
  // snapshot_asks_ is not empty: the one thing step() reads when nobody asked (relaxed; the
  // mutex orders the queue itself).
  std::atomic<bool> snapshot_asked_{false};
  // Someone polled within kSnapshotWatchWindow (until watched_until_): publish_stats() publishes
  // watched_snapshot_ each step.
  std::atomic<bool> watched_{false};
  Clock::time_point watched_until_;
  std::shared_ptr<const KvSnapshot> watched_snapshot_;

  std::thread loop_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace sieve::engine
