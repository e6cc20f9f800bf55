#pragma once
// `sieve eval --task`: needle-in-a-haystack accuracy (eval/needle_task.h) over a grid of
// lengths x depths, for every KV policy x budget x KV dtype, through the engine.
//
// Per task: the cases of every (length, depth) cell are made once; each policy setting runs all
// of them as one batch on an engine of its own (greedy; the f32 dense cache first, as the
// reference), and each cell's accuracy is the fraction of its cases answered exactly. Dense
// settings submit, per haystack, the case with the deepest needle first: the others then find
// their prompt up to their own needle in the prefix cache. A sparse policy compresses each
// prompt once, after it (sparse_prefill_chunk 0, as the methods' papers measure), or every
// sparse_prefill_chunk tokens (as `sieve serve` does); such prompts take no prefix-cache hit.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eval/needle_task.h"
#include "eval/sparsity_eval.h"
#include "model/model.h"
#include "sparsity/calibration.h"
#include "tokenizer/tokenizer.h"

namespace sieve::eval {

struct LongContextConfig {
  std::vector<NeedleTask> tasks = {NeedleTask::kSingle};
  NeedleTaskConfig needles;      // framing, question place, values, counts, seed (task: each)
  std::vector<int32_t> lengths;  // empty: default_needle_lengths
  std::vector<double> depths = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  std::optional<int32_t> cases_per_cell;  // unset: default_cases_per_cell
  std::vector<std::string> families = {"streaming", "h2o",       "snapkv",  "pyramidkv",
                                       "adakv",     "layerwise", "fastgen", "quest"};
  std::vector<double> budgets = {0.5, 0.25, 0.125};  // kept tokens per head / prompt tokens
  std::vector<double> fastgen_thresholds = {0.02, 0.05, 0.1, 0.2};  // T, in place of budgets
  int32_t observation_window = 8;
  std::shared_ptr<const sparsity::CalibrationProfile> calibration;  // for lserve
  kernels::DType kv_dtype = kernels::DType::kF32;  // of the policies' pages (not the reference's)
  bool precise_kv_heads = true;                    // engine::EngineConfig's
  uint64_t kv_memory_bytes = uint64_t{1} << 30;    // the page pool of each setting, at most
  int32_t sparse_prefill_chunk = 0;                // 0: compress once, after the prompt
  int32_t max_batch_tokens = 512;                  // tokens per engine step (chunked prefill)
};

// 1/4, 1/2 and all of the context, less the answer's room, in whole pages of 16 tokens.
std::vector<int32_t> default_needle_lengths(int64_t context, int32_t answer_room);
// Cases per (length, depth) cell unless given: 4 below 16k tokens, 2 from there (a 32k prompt
// is ~25 s of prefill for a 5M-parameter model on two cores).
int32_t default_cases_per_cell(int32_t length);

struct NeedleCell {
  int32_t length = 0;
  double depth = 0.0;
  int32_t num_cases = 0;
  int32_t num_exact = 0;
  int32_t num_queries = 0;  // asked values, over the cases
  int32_t num_queries_exact = 0;
  double mean_needle_depth = 0.0;  // where the asked needles really were (sentence ends)
  double accuracy() const { return num_cases ? static_cast<double>(num_exact) / num_cases : 0.0; }
};

struct NeedleOutcome {
  std::vector<tok::TokenId> answer_tokens;  // generated (kForced: the greedy choices at answers)
  std::string answer;                       // their text (kForced: per answer, " | " between)
  int32_t num_queries_exact = 0;
  bool exact = false;
};

struct NeedleResult {
  NeedleTask task = NeedleTask::kSingle;
  PolicySetting setting;
  std::string spec;  // the policy string of the first case (budgets scale per prompt)
  std::map<int32_t, std::string> spec_by_length;  // that of each length's first case
  double seconds = 0.0;
  double kv_kept = 1.0;              // pages held at the end / pages of the same tokens dense, mean
  int64_t prompt_tokens = 0;         // over the cases
  int64_t cached_prompt_tokens = 0;  // of which the prefix cache had
  std::vector<NeedleCell> cells;     // length-major, in the config's depth order
  std::vector<NeedleOutcome> outcomes;  // per case, as LongContextRun::cases
  double accuracy = 0.0;
  double query_accuracy = 0.0;
  // accuracy / the f32 dense accuracy of the same task; unset when that is 0.
  std::optional<double> accuracy_vs_dense;
  double accuracy_at(int32_t length) const;
};

struct NeedleCaseSet {
  NeedleTask task = NeedleTask::kSingle;
  std::vector<NeedleCase> cases;  // by length, case_idx, depth
};

struct LongContextRun {
  int64_t context = 0;  // the model's positions per sequence
  std::vector<int32_t> lengths;
  std::vector<NeedleCaseSet> case_sets;
  std::vector<NeedleResult> results;  // per task: the f32 dense reference first
};

// `haystack`: any text. Throws sieve::Error before any model work for a length the model's
// context cannot hold with its answer, an unknown policy family, or a task it cannot make.
// `on_result` sees each setting as it finishes.
LongContextRun run_long_context_eval(
    std::shared_ptr<const model::Model> model, std::shared_ptr<const tok::Tokenizer> tokenizer,
    const std::string& haystack, const LongContextConfig& config,
    const std::function<void(const NeedleResult&)>& on_result = {});

// The picture of needle-in-a-haystack results: depth (rows, 0% at the top) x length (columns),
// each cell coloured by accuracy (red 0 .. yellow .. green 1) and labelled with its percentage.
std::string needle_heatmap_svg(const NeedleResult& result, const std::string& title,
                               const std::string& subtitle);

}  // namespace sieve::eval
