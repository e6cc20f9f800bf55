// `sieve perplexity`: llama.cpp-compatible perplexity over a text file.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/kv_dtype_option.h"
#include "cli/model_options.h"
#include "eval/perplexity.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

struct PerplexityOptions {
  ModelOptions model;
  std::string text_path;
  int64_t context = 512;
  int64_t chunks = 0;  // 0: every whole chunk of the text
  kernels::DType kv_dtype = model::kKvDefaultDType;
  bool precise_kv_heads = true;
  bool json = false;
};

void run_perplexity(const PerplexityOptions& options) {
  std::ifstream in(options.text_path, std::ios::binary);
  if (!in) fail("cannot open '{}'", options.text_path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp's -f does

  model::LoadedModel loaded = model::load_model(options.model.load_options());
  const tok::Vocab& vocab = loaded.tokenizer->vocab();
  if (!vocab.bos) fail("the model's vocabulary has no BOS token, which this method needs");
  std::vector<tok::TokenId> tokens =
      loaded.tokenizer->encode(text, {.add_special = true, .parse_special = false});
  if (options.chunks > 0 && static_cast<int64_t>(tokens.size()) > options.chunks * options.context)
    tokens.resize(static_cast<size_t>(options.chunks * options.context));
  eval::PerplexityResult result = eval::perplexity(
      *loaded.model, tokens, *vocab.bos, options.context,
      [&](const eval::PerplexityResult& r) {
        if (!options.json)
          fmt::print(stderr, "[{}]{:.4f} ", r.running_ppl.size(), r.running_ppl.back());
      },
      options.kv_dtype, options.precise_kv_heads);
  const double tokens_per_second = result.num_chunks * result.context / result.seconds;
  if (options.json) {
    nlohmann::json out = {
        {"n_ctx", result.context},         {"n_tokens", tokens.size()},
        {"n_chunks", result.num_chunks},   {"scored_tokens", result.scored_tokens},
        {"mean_nll", result.mean_nll},     {"ppl", result.ppl},
        {"ppl_stderr", result.ppl_stderr}, {"running_ppl", result.running_ppl},
        {"seconds", result.seconds},       {"tokens_per_second", tokens_per_second}};
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print(stderr, "\n");
    fmt::print(
        "Final estimate: PPL = {:.4f} +/- {:.5f}  ({} chunks of {}, {} scored tokens, "
        "{:.0f} tokens/s)\n",
        result.ppl, result.ppl_stderr, result.num_chunks, result.context, result.scored_tokens,
        tokens_per_second);
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto options = std::make_shared<PerplexityOptions>();
  CLI::App* command = app.add_subcommand(
      "perplexity",
      "Perplexity of a model on a text file (the method of llama.cpp's llama-perplexity)");
  options->model.add_to(*command);
  command->add_option("-f,--file", options->text_path, "Text file")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("-c,--ctx", options->context, "Chunk size in tokens")->capture_default_str();
  command
      ->add_option("--chunks", options->chunks,
                   "Score only the first N chunks, as llama-perplexity's --chunks (default: all)")
      ->check(CLI::NonNegativeNumber);
  // llama-perplexity caches K/V in F16 by default: --kv-dtype f16 compares like with like.
  add_kv_dtype_option(*command, options->kv_dtype);
  add_precise_kv_heads_option(*command, options->precise_kv_heads);
  command->add_flag("--json", options->json, "Print the result as JSON");
  command->callback([options] { run_perplexity(*options); });
}

}  // namespace sieve::cli
