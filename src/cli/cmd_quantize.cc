// `sieve quantize`: convert a GGUF model's weights to another type, and report how closely the
// result follows the original.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "eval/compare.h"
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
  bool compare = false;
  std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park"};
  int32_t compare_tokens = 64;
  int threads = 0;
  bool json = false;
};

void quantize(const QuantizeOptions& options) {
  std::optional<kernels::DType> dtype = model::parse_dtype(options.type);
  if (!dtype) fail("unknown type '{}' (choose f32, f16, bf16, q8_0 or q4_0)", options.type);
  ThreadPool pool(options.threads);
  model::QuantizeReport report = model::quantize_model(options.in_path, options.out_path, *dtype, pool);
  nlohmann::json out = {{"input", options.in_path},
                        {"output", options.out_path},
                        {"type", kernels::to_string(*dtype)},
                        {"bytes_in", report.bytes_in},
                        {"bytes_out", report.bytes_out}};
  for (const auto& tensor : report.tensors) {
    if (!tensor.note.empty()) out["notes"].push_back(tensor.name + ": " + tensor.note);
  }
  if (!options.json) {
    fmt::print("wrote {} ({}): tensor data {:.2f} MB -> {:.2f} MB\n", options.out_path,
               kernels::to_string(*dtype), report.bytes_in / 1e6, report.bytes_out / 1e6);
    for (const auto& tensor : report.tensors) {
      if (!tensor.note.empty()) fmt::print("  {}: {}\n", tensor.name, tensor.note);
    }
  }
  if (options.compare) {
    model::LoadedModel reference = model::load_model({options.in_path, ""});
    model::LoadedModel candidate = model::load_model({options.out_path, ""});
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& text : options.prompts) prompts.push_back(reference.tokenizer->encode(text));
    eval::ModelAgreement agreement =
        eval::compare_models(*reference.model, *candidate.model, prompts, options.compare_tokens, pool);
    out["comparison"] = {{"prompts", options.prompts.size()},
                         {"tokens_per_prompt", options.compare_tokens},
                         {"top1_agreement", agreement.top1_agreement()},
                         {"greedy_identical_tokens", agreement.free_run_tokens},
                         {"greedy_total_tokens", agreement.free_run_total},
                         {"max_abs_logit_error", agreement.max_abs_logit_error}};
    if (!options.json) {
      fmt::print("against {}: greedy tokens identical {}/{} ({:.1f}%), top-1 agreement on the same "
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
  CLI::App* command = app.add_subcommand(
      "quantize", "Convert a GGUF model's weights to F32, F16, BF16, Q8_0 or Q4_0");
  command->add_option("input", options->in_path, "Input GGUF model")->required()->check(CLI::ExistingFile);
  command->add_option("output", options->out_path, "Output GGUF path")->required();
  command->add_option("type", options->type, "Target type: f32, f16, bf16, q8_0, q4_0")->required();
  command->add_flag("--compare", options->compare,
                    "Afterwards, compare greedy generations and logits of the output against the input");
  command->add_option("--compare-prompt", options->prompts, "Prompt for --compare (repeatable)");
  command->add_option("--compare-tokens", options->compare_tokens, "Tokens generated per prompt for --compare")
      ->capture_default_str();
  command->add_option("-t,--threads", options->threads, "Worker threads (default: all cores)");
  command->add_flag("--json", options->json, "Print the report as JSON");
  command->callback([options] { quantize(*options); });
}

}  // namespace sieve::cli
