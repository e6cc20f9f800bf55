// `sieve batch`: run a file of prompts through the continuous-batching engine at once.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <random>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

struct BatchOptions {
  ModelOptions model;
  EngineOptions engine;
  std::string prompts_path;
  std::string kv_policy = "full";
  int32_t max_tokens = 128;
  engine::SamplingParams sampling{.temperature = 0.0f};
  bool json = false;
};

struct Item {
  std::string prompt;
  std::optional<int32_t> max_tokens;
};

// One prompt per line; a line that is a JSON object takes {"prompt": ..., "max_tokens": ...}.
std::vector<Item> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open '{}'", path);
  std::vector<Item> items;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    if (line.front() != '{') {
      items.push_back({line, std::nullopt});
      continue;
    }
    nlohmann::json object = nlohmann::json::parse(line, nullptr, false);
    if (object.is_discarded() || !object.contains("prompt") || !object["prompt"].is_string()) {
      fail("{}:{}: expected a JSON object with a string \"prompt\"", path, line_no);
    }
    Item item{object["prompt"].get<std::string>(), std::nullopt};
    if (object.contains("max_tokens")) {
      if (!object["max_tokens"].is_number_integer())
        fail("{}:{}: \"max_tokens\" must be an integer", path, line_no);
      item.max_tokens = object["max_tokens"].get<int32_t>();
    }
    items.push_back(std::move(item));
  }
  if (items.empty()) fail("'{}' has no prompts", path);
  return items;
}

struct Result {
  std::vector<tok::TokenId> tokens;
  std::string text;
  engine::RequestEvent last;
};

void run_batch(const BatchOptions& options) {
  const std::vector<Item> items = read_prompts(options.prompts_path);
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  engine::EngineConfig config = options.engine.engine_config();
  config.model_path = options.model.model_path;
  engine::Engine engine(config, loaded.model, loaded.tokenizer);
  check_speculative_option(engine, config.speculative);
  const sparsity::PolicySpec kv_policy = sparsity::parse_policy(options.kv_policy);
  engine.check_policy(kv_policy);

  std::vector<Result> results(items.size());
  std::vector<std::optional<std::string>> rejections(items.size());
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    engine::Request request{.prompt = loaded.tokenizer->encode(items[i].prompt),
                            .params = options.sampling,
                            .kv_policy = kv_policy};
    request.params.max_tokens = items[i].max_tokens.value_or(options.max_tokens);
    auto submitted =
        engine.submit(std::move(request), [&results, i](const engine::RequestEvent& event) {
          Result& r = results[i];
          r.tokens.insert(r.tokens.end(), event.tokens.begin(), event.tokens.end());
          r.text += event.text;
          if (event.finish) r.last = event;
        });
    if (const auto* rejection = std::get_if<engine::AdmissionError>(&submitted))
      rejections[i] = rejection->message;
  }
  engine.run_until_idle();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int64_t prompt_tokens = 0, generated = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Result& r = results[i];
    prompt_tokens += r.last.usage.prompt_tokens;
    generated += r.last.usage.completion_tokens;
    const std::string finish =
        r.last.finish ? std::string(engine::finish_reason_name(r.last.finish->reason)) : "";
    if (options.json) {
      nlohmann::json out = {{"index", i},
                            {"prompt", items[i].prompt},
                            {"text", r.text},
                            {"tokens", r.tokens},
                            {"finish_reason", finish},
                            {"usage",
                             {{"prompt_tokens", r.last.usage.prompt_tokens},
                              {"completion_tokens", r.last.usage.completion_tokens},
                              {"cached_prompt_tokens", r.last.usage.cached_prompt_tokens},
                              {"kv_cache",
                               {{"pages", r.last.usage.kv_pages},
                                {"dense_pages", r.last.usage.kv_dense_pages},
                                {"bytes", r.last.usage.kv_bytes}}}}},
                            {"queue_seconds", r.last.timings.queue_seconds},
                            {"time_to_first_token_seconds", r.last.timings.first_token_seconds},
                            {"total_seconds", r.last.timings.total_seconds}};
      if (config.speculative.enabled()) {
        out["usage"]["speculative"] = {{"draft_tokens", r.last.usage.spec_draft_tokens},
                                       {"accepted_tokens", r.last.usage.spec_accepted_tokens}};
      }
      if (rejections[i])
        out["error"] = *rejections[i];
      else if (r.last.error)
        out["error"] = *r.last.error;
      fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      fmt::print("=== {} ===\n{}{}\n", i, items[i].prompt,
                 rejections[i] ? " [rejected: " + *rejections[i] + "]" : r.text);
    }
  }
  const engine::EngineStats stats = engine.stats();
  fmt::print(stderr,
             "{} prompts in {:.2f} s: {} prompt + {} generated tokens, {:.1f} generated tokens/s, "
             "{} steps, "
             "{} preemptions, prefix cache hits {}/{} tokens\n",
             items.size(), seconds, prompt_tokens, generated, generated / seconds, stats.num_steps,
             stats.num_preemptions, stats.kv.num_prefix_hit_tokens,
             stats.kv.num_prefix_query_tokens);
}

}  // namespace

void add_batch_command(CLI::App& app) {
  auto options = std::make_shared<BatchOptions>();
  options->sampling.seed = std::random_device{}();
  CLI::App* command = app.add_subcommand(
      "batch",
      "Run a file of prompts (one per line, or JSONL with \"prompt\") through the batching engine");
  options->model.add_to(*command);
  options->engine.add_to(*command);
  command->add_option("-f,--file", options->prompts_path, "Prompts file")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate per prompt")
      ->capture_default_str();
  command->add_option("--temp", options->sampling.temperature, "Temperature (0 = greedy)")
      ->capture_default_str();
  command->add_option("--top-k", options->sampling.top_k, "Top-k (0 = all)")->capture_default_str();
  command->add_option("--top-p", options->sampling.top_p, "Top-p")->capture_default_str();
  command->add_option("--seed", options->sampling.seed, "Random seed (default: random)");
  command->add_flag("--ignore-eos", options->sampling.ignore_eos,
                    "Keep generating after end-of-generation tokens");
  command->add_flag("--json", options->json,
                    "One JSON object per prompt (text, tokens, usage, timings)");
  command
      ->add_option("--kv-policy", options->kv_policy,
                   "KV sparsity policy of every request (README's table; e.g. snapkv:B=1024)")
      ->capture_default_str();
  command->callback([options] { run_batch(*options); });
}

}  // namespace sieve::cli
