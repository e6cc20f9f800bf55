// `sieve run`: generate text from a prompt, streaming it to stdout.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <algorithm>
#include <random>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/engine_options.h"
#include "engine/engine.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct RunOptions {
  ModelOptions model;
  EngineOptions engine;
  std::string prompt;
  std::string kv_policy = "full";
  int32_t max_tokens = 128;
  engine::SamplingParams sampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
  bool no_bos = false;
  bool json = false;
};

void run(RunOptions options) {
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  const tok::Tokenizer& tokenizer = *loaded.tokenizer;
  std::vector<tok::TokenId> prompt =
      tokenizer.encode(options.prompt, {.add_special = !options.no_bos, .parse_special = true});
  const int64_t context = loaded.model->config().context_length;
  if (static_cast<int64_t>(prompt.size()) >= context) {
    fail("the prompt has {} tokens but the model's context is {}", prompt.size(), context);
  }
  options.sampling.max_tokens = static_cast<int32_t>(
      std::min<int64_t>(options.max_tokens, context - static_cast<int64_t>(prompt.size())));
  const sparsity::PolicySpec kv_policy = sparsity::parse_policy(options.kv_policy);
  // One dense sequence: the pool needs only the pages it can fill. A sparse one's admission
  // bound is the engine's (kv::sparse_peak_pages): it gets the engine's default pool.
  engine::EngineConfig config = options.engine.engine_config();
  config.model_path = options.model.model_path;
  if (std::holds_alternative<sparsity::FullSpec>(kv_policy.policy)) {
    config.num_kv_pages = static_cast<int32_t>(
        (prompt.size() + *options.sampling.max_tokens + config.page_size - 1) / config.page_size);
  }
  engine::Engine engine(config, loaded.model, loaded.tokenizer);
  check_speculative_option(engine, config.speculative);
  engine.check_policy(kv_policy);

  std::vector<tok::TokenId> generated;
  std::string text;
  engine::RequestEvent last;
  if (!options.json) {
    std::fputs(options.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  auto submitted =
      engine.submit({.prompt = prompt, .params = options.sampling, .kv_policy = kv_policy},
                    [&](const engine::RequestEvent& event) {
                      generated.insert(generated.end(), event.tokens.begin(), event.tokens.end());
                      text += event.text;
                      if (!options.json) {
                        std::fputs(event.text.c_str(), stdout);
                        std::fflush(stdout);
                      }
                      if (event.finish) last = event;
                    });
  if (const auto* rejection = std::get_if<engine::AdmissionError>(&submitted))
    fail("{}", rejection->message);
  engine.run_until_idle();
  if (last.error) fail("{}", *last.error);

  const engine::Timings& t = last.timings;
  const double prompt_tps = t.first_token_seconds > 0 ? prompt.size() / t.first_token_seconds : 0.0;
  const double decode_seconds = t.total_seconds - t.first_token_seconds;
  const double generate_tps =
      generated.size() > 1 && decode_seconds > 0 ? (generated.size() - 1) / decode_seconds : 0.0;
  const std::string finish =
      last.finish ? std::string(engine::finish_reason_name(last.finish->reason)) : "";
  if (options.json) {
    nlohmann::json out = {
        {"prompt_tokens", prompt},
        {"tokens", generated},
        {"text", text},
        {"finish_reason", finish},
        {"seed", options.sampling.seed},
        {"time_to_first_token_seconds", t.first_token_seconds},
        {"total_seconds", t.total_seconds},
        {"prompt_tokens_per_second", prompt_tps},
        {"generated_tokens_per_second", generate_tps},
        {"threads", loaded.model->backend().num_threads()},
        {"kv_policy", sparsity::to_string(kv_policy)},
        {"kv_cache",
         {{"pages", last.usage.kv_pages},
          {"dense_pages", last.usage.kv_dense_pages},
          {"bytes", last.usage.kv_bytes}}},
    };
    if (config.speculative.enabled()) {
      out["speculative"] = {{"draft_tokens", last.usage.spec_draft_tokens},
                            {"accepted_tokens", last.usage.spec_accepted_tokens}};
    }
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("\n");
    std::fflush(stdout);
    fmt::print(
        stderr,
        "\nprompt: {} tokens, first token after {:.3f} s ({:.1f} tokens/s) | generation: {} tokens "
        "({:.1f} tokens/s) | finish: {}\n",
        prompt.size(), t.first_token_seconds, prompt_tps, generated.size(), generate_tps, finish);
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  options->sampling.seed = std::random_device{}();
  CLI::App* command =
      app.add_subcommand("run", "Generate text from a prompt, streaming it to stdout");
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
  command
      ->add_option("--min-p", options->sampling.min_p,
                   "Drop tokens below min-p times the top probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  command->add_option("--seed", options->sampling.seed, "Random seed (default: random)");
  command->add_flag("--no-bos", options->no_bos, "Do not add the BOS token");
  command->add_flag("--ignore-eos", options->sampling.ignore_eos,
                    "Keep generating after end-of-generation tokens");
  command->add_flag("--json", options->json,
                    "Print one JSON object (tokens, text, speeds) instead of streaming");
  options->engine.add_to(*command);
  command
      ->add_option("--repeat-penalty", options->sampling.repetition_penalty,
                   "Repetition penalty (1 = off)")
      ->capture_default_str();
  command->add_option("--stop", options->sampling.stop_strings, "Stop string (repeatable)");
  command
      ->add_option("--kv-policy", options->kv_policy,
                   "KV sparsity policy of the request (README's table; e.g. snapkv:B=1024)")
      ->capture_default_str();
  command->callback([options] { run(*options); });
}

}  // namespace sieve::cli
