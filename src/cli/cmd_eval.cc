// `sieve eval`: fidelity of KV sparsity policies against the dense cache (table, JSON, SVG), or
// with --task needle-in-a-haystack accuracy over lengths x depths (cli/eval_long_context.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/eval_long_context.h"
#include "cli/kv_dtype_option.h"
#include "cli/model_options.h"
#include "eval/sparsity_eval.h"
#include "util/error.h"
#include "util/text_file.h"

namespace sieve::cli {

namespace {

struct EvalOptions {
  ModelOptions model;
  std::string text_path;
  eval::SparsityEvalConfig config;
  std::string json_path;
  std::string plot_path;
  std::string calibration_path;
  std::string retrieval_cue;  // empty: after (fidelity), prompt (--task)
  LongContextOptions long_context;
  std::vector<CLI::Option*> fidelity_options;  // refused with --task
};

void run_eval(EvalOptions options) {
  if (!options.calibration_path.empty()) {
    options.config.calibration = std::make_shared<const sparsity::CalibrationProfile>(
        sparsity::load_calibration(options.calibration_path));
  }
  const auto given = [](const std::vector<CLI::Option*>& list) -> const CLI::Option* {
    for (const CLI::Option* option : list) {
      if (option->count() > 0) return option;
    }
    return nullptr;
  };
  if (!options.long_context.tasks.empty()) {
    if (const CLI::Option* option = given(options.fidelity_options))
      fail("{} measures fidelity; it does not go with --task", option->get_name());
    run_long_context_eval({.model = options.model,
                           .text_path = options.text_path,
                           .sweep = options.config,
                           .question_in_prompt = options.retrieval_cue != "after",
                           .json_path = options.json_path},
                          options.long_context);
    return;
  }
  if (const CLI::Option* option = given(options.long_context.own_options))
    fail("{} needs --task (needle in a haystack)", option->get_name());
  options.config.retrieval_cue_in_prompt = options.retrieval_cue == "prompt";
  std::ifstream in(options.text_path, std::ios::binary);
  if (!in) fail("cannot open '{}'", options.text_path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  const eval::SparsityEvalConfig& c = options.config;
  fmt::print(
      "{} prompts of {} tokens, {} forced continuation tokens each; retrieval: {} cases of a "
      "{}-token span, {} given {} (95% interval over cases); KV pages in {}, compared with the "
      "f32 dense cache\n",
      c.num_prompts, c.prompt_tokens, c.continuation_tokens, c.retrieval_prompts, c.retrieval_span,
      c.retrieval_cue,
      c.retrieval_cue_in_prompt ? "at the prompt's end, before compression" : "after compression",
      model::kv_dtype_name(c.kv_dtype));
  fmt::print("{:<10} {:>5} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>9} {:>15} {:>8} {:>8}  {}\n",
             "policy", "dtype", "budget", "kv kept", "KV bytes", "top-1", "KL", "ppl", "ppl delta",
             "retrieval", "vs dense", "recovery", "spec (first prompt)");
  const auto results = eval::run_sparsity_eval(
      loaded.model, loaded.tokenizer, buffer.str(), options.config,
      [](const eval::PolicyFidelity& f) {
        const std::string budget = f.family == "fastgen" ? fmt::format("T={:g}", f.budget)
                                                         : fmt::format("{:.3f}", f.budget);
        fmt::print(
            "{:<10} {:>5} {:>7} {:>8.3f} {:>8.3f} {:>7.3f} {:>8.4f} {:>8.4f} {:>+9.4f} {:>15} "
            "{:>8.3f} {:>8}  {}\n",
            f.family, f.kv_dtype, budget, f.kv_kept, f.kv_bytes_kept, f.top1_agreement, f.mean_kl,
            f.perplexity, f.perplexity_delta,
            fmt::format("{:.3f} ± {:.3f}", f.retrieval, f.retrieval_ci95), f.retrieval_vs_dense,
            f.attention_recovery < 0 ? std::string("-")
                                     : fmt::format("{:.3f}", f.attention_recovery),
            f.spec);
        std::fflush(stdout);
      });
  if (!options.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& f : results) {
      const bool fastgen = f.family == "fastgen";  // a threshold, not a budget
      rows.push_back({{"family", f.family},
                      {"budget", fastgen ? nlohmann::json(nullptr) : nlohmann::json(f.budget)},
                      {"threshold", fastgen ? nlohmann::json(f.budget) : nlohmann::json(nullptr)},
                      {"spec", f.spec},
                      {"kv_dtype", f.kv_dtype},
                      {"kv_kept", f.kv_kept},
                      {"kv_bytes_kept", f.kv_bytes_kept},
                      {"top1_agreement", f.top1_agreement},
                      {"mean_kl", f.mean_kl},
                      {"perplexity", f.perplexity},
                      {"perplexity_delta", f.perplexity_delta},
                      {"retrieval", f.retrieval},
                      {"retrieval_ci95", f.retrieval_ci95},
                      {"retrieval_vs_dense", f.retrieval_vs_dense},
                      {"attention_recovery", f.attention_recovery < 0
                                                 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(f.attention_recovery)}});
    }
    nlohmann::json doc = {{"model", options.model.model_path},
                          {"text", options.text_path},
                          {"num_prompts", c.num_prompts},
                          {"prompt_tokens", c.prompt_tokens},
                          {"continuation_tokens", c.continuation_tokens},
                          {"retrieval_prompts", c.retrieval_prompts},
                          {"retrieval_cue", c.retrieval_cue_in_prompt ? "prompt" : "after"},
                          {"seed", c.seed},
                          {"kv_dtype", model::kv_dtype_name(c.kv_dtype)},
                          {"reference", "f32 full"},
                          {"results", rows}};
    write_file(options.json_path, doc.dump(2) + "\n");
  }
  if (!options.plot_path.empty()) {
    write_file(
        options.plot_path,
        eval::fidelity_svg(results, fmt::format("KV sparsity fidelity: {} ({} prompts of {})",
                                                loaded.name, c.num_prompts, c.prompt_tokens)));
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* command =
      app.add_subcommand("eval",
                         "Fidelity of KV sparsity policies against the dense cache; with --task, "
                         "needle-in-a-haystack accuracy over lengths x depths");
  options->model.add_to(*command);
  eval::SparsityEvalConfig& c = options->config;
  command
      ->add_option("-f,--file", options->text_path, "Text the prompts and continuations come from")
      ->required()
      ->check(CLI::ExistingFile);
  command
      ->add_option("--policies", c.families,
                   "Policy families (streaming, h2o, snapkv, pyramidkv, adakv, layerwise, fastgen, "
                   "quest, lserve, keydiff), each with parameters of its own if given "
                   "(snapkv:G=11, lserve:R=1,B=1)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--budgets", c.budgets, "KV budgets as fractions of the prompt (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  command
      ->add_option(
          "--fastgen-thresholds", c.fastgen_thresholds,
          "fastgen's thresholds T (it keeps what recovers >= 1 - T of the attention; no budget)")
      ->delimiter(',')
      ->capture_default_str();
  options->fidelity_options.push_back(
      command
          ->add_option("--prompts", c.num_prompts, "Prompts (language modelling: top-1, KL, ppl)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber));
  options->fidelity_options.push_back(
      command
          ->add_option("--retrieval-prompts", c.retrieval_prompts,
                       "Retrieval cases (a span at the start, filler, the span's start as a cue; "
                       "the 95% interval narrows as 1/sqrt of this)")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber));
  command
      ->add_option("--retrieval-cue", options->retrieval_cue,
                   "Where the retrieval cue (the question) goes: after (forced after compression: "
                   "the question comes after the document) or prompt (the prompt's last tokens, "
                   "seen before compression; default: after, with --task: prompt)")
      ->check(CLI::IsMember({"after", "prompt"}));
  command
      ->add_option("--seed", c.seed,
                   "Where the retrieval spans and fillers come from (--task: the cases)")
      ->capture_default_str();
  options->fidelity_options.push_back(
      command->add_option("--prompt-tokens", c.prompt_tokens, "Tokens per prompt")
          ->capture_default_str()
          ->check(CLI::PositiveNumber));
  options->fidelity_options.push_back(
      command
          ->add_option("--continuation", c.continuation_tokens,
                       "Forced continuation tokens compared per prompt")
          ->capture_default_str()
          ->check(CLI::PositiveNumber));
  command->add_option("--window", c.observation_window, "Observation window of snapkv/pyramidkv")
      ->capture_default_str();
  command
      ->add_option("--calibration", options->calibration_path,
                   "Calibration profile for lserve (sieve calibrate)")
      ->check(CLI::ExistingFile);
  add_kv_dtype_option(*command, c.kv_dtype)
      ->description(
          "K/V element type of the policies' pages (f32, f16, q8, q4); the reference stays the "
          "f32 dense cache, and a non-f32 dtype adds a 'full' row in that dtype");
  add_precise_kv_heads_option(*command, c.precise_kv_heads);
  command->add_option("--json", options->json_path, "Write the results as JSON");
  options->fidelity_options.push_back(command->add_option(
      "--plot", options->plot_path, "Write an SVG plot (top-1 agreement vs KV kept)"));
  options->long_context.add_to(*command);
  command->callback([options] { run_eval(*options); });
}

}  // namespace sieve::cli
