#pragma once
// `sieve eval --task ...`: needle-in-a-haystack accuracy over lengths x depths for every KV
// policy (eval/long_context_eval.h): its options, and its report (table, JSON, one SVG heatmap
// per setting, the cases as JSON lines).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "eval/sparsity_eval.h"

namespace sieve::cli {

struct LongContextOptions {
  std::vector<std::string> tasks;  // empty: `sieve eval` measures fidelity instead
  std::vector<int32_t> lengths;
  std::vector<double> depth_percents;
  std::optional<int32_t> cases_per_cell;
  std::string framing = "completion";
  std::string chat_template_path;
  std::string value_kind = "words";
  std::vector<int32_t> value_tokens = {6, 10};
  int32_t num_distractors = 3;
  int32_t num_values = 4;
  int32_t num_queries = 4;
  int64_t kv_memory_mib = 1024;
  int32_t sparse_prefill_chunk = 0;
  std::string heatmap_dir;
  std::string cases_path;
  // The options only this mode takes (besides --task), refused without it.
  std::vector<CLI::Option*> own_options;

  void add_to(CLI::App& command);
};

// What the fidelity mode shares with this one: the model, the text, the sweep (families,
// budgets, fastgen thresholds, window, calibration, kv dtype, seed) and where JSON goes.
struct SharedEvalOptions {
  const ModelOptions& model;
  const std::string& text_path;
  const eval::SparsityEvalConfig& sweep;
  bool question_in_prompt = true;
  const std::string& json_path;
};

void run_long_context_eval(const SharedEvalOptions& shared, const LongContextOptions& options);

}  // namespace sieve::cli
