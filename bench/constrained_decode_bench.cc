// Decode speed with a json_schema constraint against the same decode unconstrained, in one run:
// the cost of constrained decoding as the engine pays it (mask per step, applied to the logits,
// grammar state advanced by each token). Prints timings and ratios; asserts nothing.
//
//   build/bench/constrained_decode_bench MODEL.gguf [MODEL.gguf ...]
//     (bench/constrained_decode.sh makes 32k- and 102k-vocabulary models and runs it)
//
// Per model: the schema's compile time (parse + GBNF + first mask, cold, then from the cache);
// then at each batch size B, ROUNDS rounds of [free, constrained] (order alternating per round):
// B requests at once into a fresh engine, each a short prompt and OUTPUT_TOKENS sampled tokens
// (TEMPERATURE, default 1; ignore_eos: every run does the same number of steps; a finished
// grammar then allows only EOS, which costs the same mask work). At temperature > 0 constrained
// sampling skips the exp of refused tokens, which can make it faster than free sampling;
// TEMPERATURE=0 (greedy: an argmax either way) shows the mask's own cost. Decode tok/s counts
// tokens after each request's first, over the time after the last request's first token.
// Environment: ROUNDS (3), OUTPUT_TOKENS (64), BATCHES ("1,16"), TEMPERATURE (1), THREADS (all
// cores).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/grammar_cache.h"
#include "model/loader.h"
#include "order_schema.h"

namespace {

using namespace sieve;
using Clock = std::chrono::steady_clock;
using bench::kOrderSchema;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

std::vector<int> env_list(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  std::stringstream in(v ? v : fallback);
  std::vector<int> out;
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct RunResult {
  double decode_tokens_per_s = 0.0;
  double wall_seconds = 0.0;
};

RunResult run_batch(const model::LoadedModel& loaded, int batch, int output_tokens,
                    float temperature, std::shared_ptr<const grammar::TokenMasker> constraint) {
  const int32_t prompt_tokens = 8;
  const int32_t pages_per_seq = (prompt_tokens + output_tokens) / 16 + 2;
  engine::EngineConfig config{.num_kv_pages = batch * pages_per_seq + 4,
                              .page_size = 16,
                              .max_batch_tokens = 512,
                              .max_num_seqs = std::max(batch, 1),
                              .max_queued = std::max(batch, 1),
                              .enable_prefix_caching = false};
  engine::Engine engine(config, loaded.model, loaded.tokenizer);
  const int32_t vocab = loaded.model->config().vocab_size;
  std::vector<Clock::time_point> first(static_cast<size_t>(batch));
  std::vector<int> count(static_cast<size_t>(batch), 0);
  Clock::time_point last_token;
  for (int i = 0; i < batch; ++i) {
    engine::Request request;
    for (int t = 0; t < prompt_tokens; ++t)
      request.prompt.push_back(static_cast<engine::TokenId>((7919 * (i * 31 + t) + 13) % vocab));
    request.params.temperature = temperature;
    request.params.seed = static_cast<uint64_t>(i + 1);
    request.params.max_tokens = output_tokens;
    request.params.ignore_eos = true;
    request.params.constraint = constraint;
    const auto idx = static_cast<size_t>(i);
    engine.submit(request, [&, idx](const engine::RequestEvent& event) {
      const auto now = Clock::now();
      if (count[idx] == 0) first[idx] = now;
      count[idx] += static_cast<int>(event.tokens.size());
      last_token = now;
    });
  }
  const auto start = Clock::now();
  engine.run_until_idle();
  const auto decode_start = *std::max_element(first.begin(), first.end());
  int64_t decode_tokens = 0;
  for (int i = 0; i < batch; ++i) {
    // Tokens after the last request's first token: every sequence is decoding then.
    decode_tokens += count[static_cast<size_t>(i)] - 1;
  }
  RunResult r;
  r.wall_seconds = seconds(Clock::now() - start);
  const double decode_seconds = seconds(last_token - decode_start);
  r.decode_tokens_per_s = decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [MODEL.gguf ...]\n", argv[0]);
    return 2;
  }
  const int rounds = env_int("ROUNDS", 3);
  const int output_tokens = env_int("OUTPUT_TOKENS", 64);
  const char* temperature_env = std::getenv("TEMPERATURE");
  const float temperature = temperature_env ? std::strtof(temperature_env, nullptr) : 1.0f;
  std::printf("temperature %.2f, %d output tokens per request, %d rounds\n", temperature,
              output_tokens, rounds);
  const std::vector<int> batches = env_list("BATCHES", "1,16");
  for (int m = 1; m < argc; ++m) {
    const model::LoadedModel loaded = model::load_model(
        {.model_path = argv[m], .backend = {.device = "cpu", .threads = env_int("THREADS", 0)}});
    std::printf("model %s: vocabulary %lld tokens\n", argv[m],
                static_cast<long long>(loaded.model->config().vocab_size));

    auto start = Clock::now();
    grammar::GrammarCache cache(grammar::Vocabulary::from_tokenizer(*loaded.tokenizer));
    const double vocabulary_ms = seconds(Clock::now() - start) * 1e3;
    start = Clock::now();
    auto masker = cache.get({grammar::GrammarKind::kJsonSchema, kOrderSchema});
    const double compile_ms = seconds(Clock::now() - start) * 1e3;
    start = Clock::now();
    grammar::TokenBitset mask;
    masker->fill_mask(masker->new_state(), mask);
    const double first_mask_ms = seconds(Clock::now() - start) * 1e3;
    start = Clock::now();
    cache.get({grammar::GrammarKind::kJsonSchema, kOrderSchema});
    const double cached_us = seconds(Clock::now() - start) * 1e6;
    std::printf(
        "  vocabulary trie %.1f ms (once per model); schema compile %.2f ms + first mask %.2f ms "
        "(cold); from the cache %.1f us\n",
        vocabulary_ms, compile_ms, first_mask_ms, cached_us);

    for (int batch : batches) {
      std::vector<double> free_tps, constrained_tps, ratios;
      for (int round = 0; round < rounds; ++round) {
        RunResult free_run, constrained_run;
        if (round % 2 == 0) {
          free_run = run_batch(loaded, batch, output_tokens, temperature, nullptr);
          constrained_run = run_batch(loaded, batch, output_tokens, temperature, masker);
        } else {
          constrained_run = run_batch(loaded, batch, output_tokens, temperature, masker);
          free_run = run_batch(loaded, batch, output_tokens, temperature, nullptr);
        }
        free_tps.push_back(free_run.decode_tokens_per_s);
        constrained_tps.push_back(constrained_run.decode_tokens_per_s);
        ratios.push_back(constrained_run.decode_tokens_per_s / free_run.decode_tokens_per_s);
        std::printf("  batch %2d round %d: free %.1f tok/s, json_schema %.1f tok/s, ratio %.3f\n",
                    batch, round, free_run.decode_tokens_per_s, constrained_run.decode_tokens_per_s,
                    ratios.back());
      }
      std::printf(
          "  batch %2d median: free %.1f tok/s, json_schema %.1f tok/s, constrained/free %.3f "
          "(median of the rounds' ratios)\n",
          batch, median(free_tps), median(constrained_tps), median(ratios));
    }
  }
  return 0;
}
