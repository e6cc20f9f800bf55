#pragma once
// The engine's sparsity driver: the glue between a request's SparsityController (which decides)
// and the KV manager and model runner (which move keys and run rows). Per request and step:
//   submit        admission bound: the controller, its prefill chunks and the most pages the
//                 request can hold at once (kv::sparse_peak_pages)
//   before run    row plans: which slices each decode row reads (Quest, LServe), which
//                 streams hand back attention weights (H2O, FastGen), and which prompt chunks
//                 score their last rows in the step (the chunk after which the prompt is
//                 compressed: SnapKV's window)
//   after run     a prompt chunk that ended on a boundary, or a prompt just finished:
//                 observe (the scores of the last rows: from the step, or by running them
//                 again) → propose (keep-sets) → compress (KV manager's
//                 plan, applied by the runner) → commit (the controller's new state);
//                 a decode step: each stream drops what its policy lets go
// Owned by the stepping thread (admit() runs on submit()'s and only reads).
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/admission.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/sample.h"
#include "kv/kv_manager.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "sparsity/controller.h"
#include "sparsity/policy_spec.h"
#include "tokenizer/tokenizer.h"

namespace sieve::engine {

// A request's sparsity terms, decided at submit() and shared by its samples.
struct SparseAdmission {
  std::unique_ptr<sparsity::SparsityController> controller;  // null: dense
  // Prefill is compressed at every multiple of this many positions (0: only at its end), so
  // the prompt never holds more than the policy's budget + one chunk.
  int32_t chunk_boundary = 0;
  // Keeps its pages out of the prefix cache so that its one compression, of the whole prompt,
  // adopts them in place instead of copying them (no chunks, n = 1). A chunked request shares
  // prefixes like any other: leaving the cached pages copies one chunk at most.
  bool private_kv = false;
  // The most pages the request holds at once (dense: prompt + max_tokens); the scheduler's
  // bound (max_pages) for a sparse one.
  int64_t pages_needed = 0;
};

class SparsityDriver {
 public:
  SparsityDriver(const EngineConfig& config, const model::ModelConfig& model,
                 const tok::Tokenizer& tokenizer, kv::KvManager& kv,
                 const sched::Scheduler& scheduler, ModelRunner& runner)
      : config_(config),
        model_(model),
        tokenizer_(tokenizer),
        kv_(kv),
        scheduler_(scheduler),
        runner_(runner) {}

  // The policy a request runs: a sliding-window model (Mistral 7B v0.1) never attends to keys
  // older than its window, so a dense request keeps just the window (sink-free streaming) and
  // the pages of older keys go back to the pool as it runs.
  sparsity::PolicySpec with_model_window(sparsity::PolicySpec policy) const;
  // The request's terms, or why its kv_policy cannot run here (param "kv_policy").
  std::variant<SparseAdmission, AdmissionError> admit(const sparsity::PolicySpec& policy,
                                                      int64_t prompt_tokens, int64_t max_new_tokens,
                                                      int32_t n) const;
  // The policy's plan, with the engine's calibration profile. Throws sieve::Error naming the
  // problem (a policy that needs a profile when there is none names --calibration).
  sparsity::SparsityPlan resolve(const sparsity::PolicySpec& policy) const;

  // Before the step's run: what each compressed sequence's decode rows must do.
  void plan_rows(const sched::ScheduleOutput& out, const Samples& samples);
  // This step's plan for `seq`; null: its rows read everything and return nothing.
  const ModelRunner::RowRequests* row_requests(sched::SeqId seq) const;

  // After the step's run, as the outputs are processed: a prefill chunk that samples nothing
  // (compressed if it ended on a chunk boundary), and a sample whose prompt is done (compressed
  // once the step is over).
  void on_prefill_chunk(const sched::ScheduledSequence& scheduled, const Sample& sample);
  void on_prompt_done(sched::SeqId seq, const Sample& sample);
  // A preempted sequence is recomputed from its tokens as a dense one: its controller starts
  // again, and compresses when that is done.
  void on_preempted(Sample& sample);
  // The step's end: compress the sequences marked above, and let decode-time policies drop keys.
  void after_step(Samples& samples);
  // The step's end for one sample that finishes in it and is parked (engine.h): what after_step
  // would have done to it.
  void settle(sched::SeqId seq, Sample& sample);
  // The continuation reference (Request::then_prompt): more prompt follows from the next step
  // on; this step's end still treats the sequence as decoding.
  void on_prompt_extended(sched::SeqId seq) { extended_.push_back(seq); }

 private:
  void compress(sched::SeqId seq, Sample& sample);
  void drop_out_of_window(sched::SeqId seq, Sample& sample);

  const EngineConfig& config_;
  const model::ModelConfig& model_;
  const tok::Tokenizer& tokenizer_;
  kv::KvManager& kv_;
  const sched::Scheduler& scheduler_;
  ModelRunner& runner_;
  std::vector<sched::SeqId> to_compress_;  // prompt complete this step, sparse plan
  std::vector<sched::SeqId> extended_;     // on_prompt_extended this step
  std::unordered_map<sched::SeqId, ModelRunner::RowRequests> row_requests_;  // this step's
};

}  // namespace sieve::engine
