// `sieve quantize`: convert a GGUF model's weights to another type, and report how closely the
// result follows the original.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>

#include "cli/commands.h"
#include "eval/compare.h"
#include "kernels/backend.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct QuantizeOptions {
  std::string in_path;
  std::string out_path;
  std::string type;
  bool pure = false;
  bool compare = false;
  std::vector<std::string> prompts = {"Once upon a time", "The little dog",
                                      "Lily and Tom went to the park"};
  int32_t compare_tokens = 64;
  int threads = 0;
  bool json = false;
};

std::string mix_names() {
  std::string names;
  for (const model::QuantMix& mix : model::quant_mixes())
    names += (names.empty() ? "" : ", ") + std::string(mix.name);
  return names;
}

void quantize(const QuantizeOptions& options) {
  std::optional<model::QuantMix> mix = model::parse_quant_mix(options.type);
  if (!mix) fail("unknown type '{}' (choose one of {})", options.type, mix_names());
  ThreadPool pool(options.threads);
  model::QuantizeReport report =
      model::quantize_model(options.in_path, options.out_path, *mix, pool, options.pure);
  std::map<std::string, int> type_counts;
  for (const auto& tensor : report.tensors) ++type_counts[tensor.to_type];
  nlohmann::json out = {{"input", options.in_path},    {"output", options.out_path},
                        {"type", mix->name},           {"pure", options.pure},
                        {"file_type", mix->file_type}, {"tensor_types", type_counts},
                        {"bytes_in", report.bytes_in}, {"bytes_out", report.bytes_out}};
  for (const auto& tensor : report.tensors) {
    out["tensors"][tensor.name] = tensor.to_type;
    if (!tensor.note.empty()) out["notes"].push_back(tensor.name + ": " + tensor.note);
  }
  if (!options.json) {
    std::string counts;
    for (const auto& [type, count] : type_counts) {
      counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", type, count);
    }
    fmt::print("wrote {} ({}{}; tensors: {}): tensor data {:.2f} MB -> {:.2f} MB\n",
               options.out_path, mix->name, options.pure ? ", pure" : "", counts,
               report.bytes_in / 1e6, report.bytes_out / 1e6);
    for (const auto& tensor : report.tensors) {
      if (!tensor.note.empty()) fmt::print("  {}: {}\n", tensor.name, tensor.note);
    }
  }
  if (options.compare) {
    const kernels::BackendOptions backend{.device = "cpu", .threads = options.threads};
    model::LoadedModel reference =
        model::load_model({.model_path = options.in_path, .backend = backend});
    model::LoadedModel candidate =
        model::load_model({.model_path = options.out_path, .backend = backend});
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& text : options.prompts)
      prompts.push_back(reference.tokenizer->encode(text));
    eval::ModelAgreement agreement =
        eval::compare_models(*reference.model, *candidate.model, prompts, options.compare_tokens);
    out["comparison"] = {{"prompts", options.prompts.size()},
                         {"tokens_per_prompt", options.compare_tokens},
                         {"top1_agreement", agreement.top1_agreement()},
                         {"greedy_identical_tokens", agreement.free_run_tokens},
                         {"greedy_total_tokens", agreement.free_run_total},
                         {"max_abs_logit_error", agreement.max_abs_logit_error}};
    if (!options.json) {
      fmt::print(
          "against {}: greedy tokens identical {}/{} ({:.1f}%), top-1 agreement on the same "
          "context {:.1f}%, max |logit error| {:.5f}\n",
          options.in_path, agreement.free_run_tokens, agreement.free_run_total,
          100.0 * agreement.free_run_agreement(), 100.0 * agreement.top1_agreement(),
          agreement.max_abs_logit_error);
    }
  }
  if (options.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* command = app.add_subcommand("quantize",
                                         "Convert a GGUF model's weights to another type or to one "
                                         "of llama.cpp's mixes (Q4_K_M, Q5_K_M, ...), "
                                         "choosing each tensor's type as llama-quantize does");
  command
      ->add_option("input", options->in_path,
                   "Input model: GGUF, or a Hugging Face folder (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingPath);
  command->add_option("output", options->out_path, "Output GGUF path")->required();
  command
      ->add_option(
          "type", options->type,
          "Target: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s/m/l, q4_k_s, q4_k_m, "
          "q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs (q4_k = q4_k_m, q5_k = q5_k_m)")
      ->required();
  command->add_flag(
      "--pure", options->pure,
      "Every matrix in the target's base type (no higher-precision output/attn_v/ffn_down), as "
      "llama-quantize --pure");
  command->add_flag(
      "--compare", options->compare,
      "Afterwards, compare greedy generations and logits of the output against the input");
  command->add_option("--compare-prompt", options->prompts, "Prompt for --compare (repeatable)");
  command
      ->add_option("--compare-tokens", options->compare_tokens,
                   "Tokens generated per prompt for --compare")
      ->capture_default_str();
  command->add_option("-t,--threads", options->threads, "Worker threads (default: all cores)");
  command->add_flag("--json", options->json, "Print the report as JSON");
  command->callback([options] { quantize(*options); });
}

}  // namespace sieve::cli
