// `sieve run`: generate text from a prompt, streaming it to stdout.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/generator.h"
#include "engine/text_stream.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct RunOptions {
  ModelOptions model;
  std::string prompt;
  int32_t max_tokens = 128;
  engine::SamplingParams sampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
  bool no_bos = false;
  bool ignore_eos = false;
  bool json = false;
};

void run(const RunOptions& options) {
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  const tok::Tokenizer& tokenizer = *loaded.tokenizer;
  std::vector<tok::TokenId> prompt =
      tokenizer.encode(options.prompt, {.add_special = !options.no_bos, .parse_special = true});
  ThreadPool pool(options.model.threads);

  engine::GenerateOptions generate_options{.max_tokens = options.max_tokens,
                                           .sampling = options.sampling};
  if (!options.ignore_eos) {
    generate_options.is_stop_token = [&](tok::TokenId id) { return tokenizer.is_eog(id); };
  }
  engine::Utf8Stream stream;
  std::vector<tok::TokenId> generated;
  std::string text;
  if (!options.json) {
    std::fputs(options.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  engine::GenerationStats stats = engine::generate(
      *loaded.model, prompt, generate_options, pool,
      [&](tok::TokenId token, std::span<const float>) {
        generated.push_back(token);
        std::string piece = stream.push(tokenizer.token_to_piece(token));
        text += piece;
        if (!options.json) {
          std::fputs(piece.c_str(), stdout);
          std::fflush(stdout);
        }
        return true;
      });
  std::string rest = stream.flush();
  text += rest;
  if (options.json) {
    nlohmann::json out = {
        {"prompt_tokens", prompt},
        {"tokens", generated},
        {"text", text},
        {"seed", options.sampling.seed},
        {"prompt_tokens_per_second", stats.prompt_tokens_per_second()},
        {"generated_tokens_per_second", stats.generated_tokens_per_second()},
        {"prompt_seconds", stats.prompt_seconds},
        {"generate_seconds", stats.generate_seconds},
        {"threads", pool.num_threads()},
    };
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}\n", rest);
    std::fflush(stdout);
    fmt::print(stderr,
               "\nprompt: {} tokens in {:.3f} s ({:.1f} tokens/s) | generation: {} tokens in "
               "{:.3f} s ({:.1f} tokens/s) | {} threads\n",
               stats.prompt_tokens, stats.prompt_seconds, stats.prompt_tokens_per_second(),
               stats.generated_tokens, stats.generate_seconds,
               stats.generated_tokens_per_second(), pool.num_threads());
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  options->sampling.seed = std::random_device{}();
  CLI::App* command = app.add_subcommand("run", "Generate text from a prompt, streaming it to stdout");
  options->model.add_to(*command);
  command->add_option("-p,--prompt", options->prompt, "Prompt text")->required();
  command->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--temp", options->sampling.temperature, "Temperature (0 = greedy)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--top-k", options->sampling.top_k, "Keep the K most likely tokens (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--top-p", options->sampling.top_p, "Nucleus sampling mass")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  command->add_option("--min-p", options->sampling.min_p, "Drop tokens below min-p times the top probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  command->add_option("--seed", options->sampling.seed, "Random seed (default: random)");
  command->add_flag("--no-bos", options->no_bos, "Do not add the BOS token");
  command->add_flag("--ignore-eos", options->ignore_eos, "Keep generating after end-of-generation tokens");
  command->add_flag("--json", options->json, "Print one JSON object (tokens, text, speeds) instead of streaming");
  command->callback([options] { run(*options); });
}

}  // namespace sieve::cli
