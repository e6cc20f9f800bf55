#pragma once
// `sieve eval`: fidelity of KV sparsity policies against the dense cache, through the engine.
//
// For each policy family × KV budget (a fraction of the prompt), every prompt runs with its true
// continuation forced (teacher forcing), so dense and sparse see the same tokens and their next-
// token distributions can be compared position by position:
//   kv kept       pages held at the end / pages of the same tokens dense (same dtype)
//   kv bytes      bytes held at the end / bytes of the same tokens dense in f32
//   top-1         argmax(sparse) == argmax(dense), averaged over continuation positions
//   KL            KL(dense || sparse) over the whole vocabulary, mean over positions (nats)
//   ppl           perplexity of the true continuation under the policy (dense: the baseline)
//   retrieval     a span of text appears early in the prompt, a filler follows; after the
//                 prompt is compressed, the span's first tokens are forced (the question arrives
//                 after compression) and the model continues greedily: the fraction of the
//                 span's remaining tokens it reproduces. Spans and fillers are drawn from the
//                 text at seeded random places (retrieval_prompts cases, independent of the
//                 language-modelling prompts), and the mean comes with a 95% confidence
//                 interval over the cases. With retrieval_cue_in_prompt the cue instead ends the
//                 prompt (the question is part of the prompt, as in needle-in-a-haystack and
//                 RULER: the setting SnapKV's observation window was designed for), so a
//                 policy that evicts at prefill sees the question before it chooses
// The reference is always the f32 dense cache: with kv_dtype q8 / q4 (or f16) every policy runs
// on pages of that dtype, and a "full" row in it comes first after the reference, so what the
// dtype costs and what sparsity costs on top of it are both measured against f32 (issue 13).
// The compression happens after prefill, as in serving; all requests of one setting run as one
// batch. FastGen takes no budget: it keeps what recovers >= 1 - T of each head's attention, so
// its settings are thresholds T (fastgen_thresholds) and the KV it keeps is measured, like every
// family's kv kept; mapping budgets to thresholds would claim a size FastGen does not promise.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"
#include "sparsity/calibration.h"
#include "tokenizer/tokenizer.h"

namespace sieve::eval {

struct SparsityEvalConfig {
  // lserve needs `calibration`; quest and lserve read about budget * prompt tokens per step
  // (whole pages) but keep every key of their dynamic heads.
  std::vector<std::string> families = {"streaming", "h2o",       "snapkv",  "pyramidkv",
                                       "adakv",     "layerwise", "fastgen", "quest"};
  std::vector<double> budgets = {0.5, 0.25, 0.125};  // kept tokens per head / prompt tokens
  std::vector<double> fastgen_thresholds = {0.02, 0.05, 0.1, 0.2};  // T, in place of budgets
  int32_t num_prompts = 8;
  int32_t prompt_tokens = 256;
  int32_t continuation_tokens = 32;
  int32_t retrieval_span = 16;    // tokens of the span to recall
  int32_t retrieval_cue = 4;      // of which the first ones are given after compression
  int32_t retrieval_prompts = 8;  // retrieval cases
  // false: the cue is forced after compression (the question comes after the document);
  // true: the cue is the prompt's last tokens (same prompt length: the filler is shorter).
  bool retrieval_cue_in_prompt = false;
  uint64_t seed = 1;  // where the retrieval spans and fillers are taken from
  int32_t observation_window = 8;
  std::shared_ptr<const sparsity::CalibrationProfile> calibration;  // for lserve
  kernels::DType kv_dtype = kernels::DType::kF32;  // of the policies' pages (not the reference's)
  bool precise_kv_heads = true;                    // engine::EngineConfig's
};

struct PolicyFidelity {
  std::string family;            // "full" for the baseline
  double budget = 1.0;           // requested fraction; fastgen: its threshold T
  std::string spec;              // the policy string of the first prompt (budgets scale per prompt)
  std::string kv_dtype = "f32";  // of its pages (model::kv_dtype_name)
  double kv_kept = 1.0;          // pages held / dense pages
  double kv_bytes_kept = 1.0;    // bytes held / bytes of the same tokens dense in f32
  double top1_agreement = 1.0;
  double mean_kl = 0.0;
  double perplexity = 0.0;
  double perplexity_delta = 0.0;  // minus the dense perplexity
  double retrieval = 0.0;         // fraction of span tokens reproduced, mean over cases
  double retrieval_ci95 = 0.0;    // half-width of its 95% confidence interval (normal, over cases)
  double retrieval_vs_dense = 1.0;
  double attention_recovery = -1.0;  // mean over prompts; -1: the policy scores nothing
};

// The policy string of `family` keeping about budget * prompt_len tokens per KV head.
std::string policy_for_budget(const std::string& family, double budget, int32_t prompt_len,
                              int32_t window);
// FastGen at threshold T: local window (also its profiling rows) prompt_len / 8 (at least
// 2 * window), frequent set 10% of the prompt.
std::string fastgen_policy(double threshold, int32_t prompt_len, int32_t window);

// One setting of a sweep: a policy family at a budget (fastgen: at threshold T) on pages of
// kv_dtype.
struct PolicySetting {
  std::string family;  // "full", or a family with parameters of its own ("snapkv:G=11")
  double budget = 1.0;
  kernels::DType kv_dtype = kernels::DType::kF32;
};
// The settings a sweep runs, in order: the f32 dense reference; "full" in kv_dtype when that is
// not f32; every other family at each budget (fastgen at each threshold) in kv_dtype. A family's
// own parameters may have come split at their commas: {"lserve:R=1", "B=1"} is one family. Throws
// sieve::Error for an unknown family, or lserve without a calibration profile.
std::vector<PolicySetting> policy_settings(const std::vector<std::string>& families,
                                           const std::vector<double>& budgets,
                                           const std::vector<double>& fastgen_thresholds,
                                           kernels::DType kv_dtype, bool have_calibration);
// The policy string of `setting` for a prompt of prompt_len tokens.
std::string policy_for_setting(const PolicySetting& setting, int32_t prompt_len, int32_t window);

// `text`: the source of prompts and continuations (consecutive segments). Progress lines go to
// `on_result` as each setting finishes. The first result is the dense f32 baseline (the
// reference); with another kv_dtype the second is "full" in that dtype.
std::vector<PolicyFidelity> run_sparsity_eval(
    std::shared_ptr<const model::Model> model, std::shared_ptr<const tok::Tokenizer> tokenizer,
    const std::string& text, const SparsityEvalConfig& config,
    const std::function<void(const PolicyFidelity&)>& on_result = {});

// An SVG line plot: top-1 agreement (and retrieval) against KV kept, one line per family.
std::string fidelity_svg(const std::vector<PolicyFidelity>& results, const std::string& title);

}  // namespace sieve::eval
