#include "eval/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>
#include <thread>
#include <variant>

#include "engine/engine.h"
#include "sparsity/policy_spec.h"
#include "util/clock.h"
#include "util/error.h"

namespace sieve::eval {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int32_t pages_for_tokens(int64_t tokens, int32_t page_size) {
  return static_cast<int32_t>((tokens + page_size - 1) / page_size);
}

// The pages one depth request of prompt_len + max_tokens tokens needs: a sparse policy may
// briefly hold a chunk's dense pages and their compressed copy, and its streams may start
// mid-slice: a chunk and a few pages more than dense.
int32_t depth_pages_needed(int64_t prompt_len, int32_t max_tokens, int32_t page_size) {
  return pages_for_tokens(prompt_len + max_tokens, page_size) +
         pages_for_tokens(engine::EngineConfig{}.sparse_prefill_chunk, page_size) + 4;
}

engine::EngineConfig engine_config(const EngineBenchConfig& config, int32_t pages_needed,
                                   int32_t max_num_seqs) {
  engine::EngineConfig ec;
  ec.page_size = config.page_size;
  ec.max_batch_tokens = config.max_batch_tokens;
  ec.max_num_seqs = std::max(1, max_num_seqs);
  ec.max_queued = std::max(ec.max_queued, max_num_seqs);
  ec.enable_prefix_caching = false;  // every point pays for every prompt token
  ec.kv_dtype = config.kv_dtype;
  ec.precise_kv_heads = config.precise_kv_heads;
  ec.speculative = config.speculative;
  ec.calibration = config.calibration;
  if (config.kv_memory_bytes) {
    ec.num_kv_pages = 0;
    ec.kv_memory_bytes = *config.kv_memory_bytes;
  } else {
    ec.num_kv_pages = pages_needed;
  }
  return ec;
}

engine::SamplingParams bench_params(int32_t max_tokens) {
  engine::SamplingParams params;
  params.temperature = 0.0f;  // greedy
  params.ignore_eos = true;   // always exactly max_tokens
  params.max_tokens = max_tokens;
  return params;
}

// What one request's finish event left behind.
struct Finished {
  bool done = false;
  std::optional<std::string> error;
  engine::Usage usage;
  engine::Timings timings;
  std::vector<Clock::time_point> token_times;  // when each token's event arrived
  std::vector<double> token_cpu_seconds;       // process CPU time then (std::clock)
  std::vector<int32_t> tokens;                 // what it generated
};

engine::RequestId submit_or_fail(engine::Engine& engine, engine::Request request, Finished& slot) {
  auto submitted = engine.submit(std::move(request), [&slot](const engine::RequestEvent& event) {
    if (!event.tokens.empty())
      slot.token_times.insert(slot.token_times.end(), event.tokens.size(), Clock::now());
    slot.tokens.insert(slot.tokens.end(), event.tokens.begin(), event.tokens.end());
    if (!event.tokens.empty()) {
      slot.token_cpu_seconds.insert(slot.token_cpu_seconds.end(), event.tokens.size(),
                                    static_cast<double>(std::clock()) / CLOCKS_PER_SEC);
    }
    if (!event.finish) return;
    slot.done = true;
    slot.error = event.error;
    slot.usage = event.usage;
    slot.timings = event.timings;
  });
  if (auto* rejection = std::get_if<engine::AdmissionError>(&submitted)) {
    fail("bench-engine: the engine refused a request: {}", rejection->message);
  }
  return std::get<engine::RequestId>(submitted);
}

void check_finished(const Finished& slot) {
  if (!slot.done) fail("bench-engine: a request never finished");
  if (slot.error) fail("bench-engine: a request failed: {}", *slot.error);
}

void check_config(const EngineBenchConfig& config) {
  if (config.page_size <= 0) fail("--page-size must be positive");
  if (config.max_batch_tokens <= 0) fail("--max-batch-tokens must be positive");
  if (config.prompt_tokens <= 0) fail("--prompt-tokens must be positive");
  if (config.output_tokens <= 0) fail("--output-tokens must be positive");
  if (config.depth_decode_tokens <= 0) fail("--depth-decode-tokens must be positive");
  for (int32_t c : config.concurrency) {
    if (c <= 0) fail("--concurrency values must be positive (got {})", c);
  }
  for (int32_t d : config.depths) {
    if (d < 0) fail("--depths values must be >= 0 (got {})", d);
  }
  if (config.depth_policies.empty()) fail("give at least one --kv-policy");
  for (const std::string& policy : config.depth_policies)
    (void)sparsity::parse_policy(policy);  // names the problem
}

}  // namespace

// `length` tokens of `text` from `start` on, wrapping around its end.
std::vector<int32_t> text_prompt(const std::vector<int32_t>& text, int64_t start, int32_t length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t i = 0; i < length; ++i)
    prompt[static_cast<size_t>(i)] = text[static_cast<size_t>(start + i) % text.size()];
  return prompt;
}

std::vector<int32_t> bench_prompt(int64_t vocab_size, int32_t length, uint64_t index) {
  constexpr int64_t kFirstId = 3;  // skip llama's unk/bos/eos
  const int64_t range = std::max<int64_t>(1, vocab_size - kFirstId);
  const int64_t first = vocab_size > kFirstId ? kFirstId : 0;
  std::vector<int32_t> prompt(std::max(0, length));
  const uint64_t stream = splitmix64(index * 0x2545f4914f6cdd1dull + 0x5eed);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>(first + static_cast<int64_t>(splitmix64(stream + i) % range));
  }
  return prompt;
}

ConcurrencyPoint measure_concurrency(const std::shared_ptr<const model::Model>& model,
                                     const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                                     const EngineBenchConfig& config, int32_t concurrency) {
  check_config(config);
  const int64_t vocab = model->config().vocab_size;
  const int32_t pages_needed =
      concurrency *
      pages_for_tokens(int64_t{config.prompt_tokens} + config.output_tokens, config.page_size);
  engine::Engine engine(engine_config(config, pages_needed, concurrency), model, tokenizer);

  // Prompts are built before the clock starts.
  std::vector<engine::Request> requests(concurrency);
  for (int32_t i = 0; i < concurrency; ++i) {
    // Offset the indices by the concurrency so that no two points share prompts either.
    requests[i].prompt =
        config.prompt_text.empty()
            ? bench_prompt(vocab, config.prompt_tokens, (uint64_t{1} << 32) * concurrency + i)
            : text_prompt(config.prompt_text, int64_t{i} * config.prompt_tokens,
                          config.prompt_tokens);
    requests[i].params = bench_params(config.output_tokens);
  }
  std::vector<Finished> finished(concurrency);

  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock();
  for (int32_t i = 0; i < concurrency; ++i)
    submit_or_fail(engine, std::move(requests[i]), finished[i]);
  engine.run_until_idle();
  const double wall = seconds_between(start, Clock::now());
  const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;

  ConcurrencyPoint point;
  point.concurrency = concurrency;
  point.num_kv_pages = engine.config().num_kv_pages;
  point.wall_seconds = wall;
  point.cpu_seconds = cpu;
  double ttft_sum = 0.0, tpot_sum = 0.0;
  int32_t tpot_count = 0;
  for (const Finished& f : finished) {
    check_finished(f);
    point.prompt_tokens += f.usage.prompt_tokens;
    point.generated_tokens += f.usage.completion_tokens;
    ttft_sum += f.timings.first_token_seconds;
    if (f.usage.completion_tokens > 1) {
      tpot_sum += (f.timings.total_seconds - f.timings.first_token_seconds) /
                  (f.usage.completion_tokens - 1);
      ++tpot_count;
    }
  }
  point.generated_tokens_per_s = wall > 0 ? point.generated_tokens / wall : 0.0;
  point.generated_tokens_per_cpu_s = cpu > 0 ? point.generated_tokens / cpu : 0.0;
  point.total_tokens_per_s = wall > 0 ? (point.prompt_tokens + point.generated_tokens) / wall : 0.0;
  point.mean_ttft_seconds = ttft_sum / concurrency;
  point.mean_tpot_seconds = tpot_count > 0 ? tpot_sum / tpot_count : 0.0;
  // The decode phase: from the moment the last request got its first token (every prompt is
  // in the cache, all C sequences decode together) to the last token.
  Clock::time_point all_started = start, last = start;
  for (const Finished& f : finished) {
    if (f.token_times.empty()) continue;
    all_started = std::max(all_started, f.token_times.front());
    last = std::max(last, f.token_times.back());
  }
  for (const Finished& f : finished) {
    point.decode_phase_tokens +=
        std::count_if(f.token_times.begin(), f.token_times.end(),
                      [&](Clock::time_point t) { return t > all_started; });
  }
  point.decode_phase_seconds = seconds_between(all_started, last);
  point.decode_phase_tokens_per_s =
      point.decode_phase_seconds > 0 ? point.decode_phase_tokens / point.decode_phase_seconds : 0.0;
  const engine::EngineStats stats = engine.stats();
  point.steps = stats.num_steps;
  point.preemptions = stats.num_preemptions;
  return point;
}

namespace {

// Steady decode rates (tokens per second of the engine's own steps, the first decode step left
// out) of a depth point's request and of its depth-0 twin over the same stretch of time.
struct TwinRates {
  double own = 0.0;
  double twin = 0.0;
};

// Runs `engine` (one request just submitted, writing `finished`) to the end with a depth-0 twin
// beside it: a 1-token prompt under the first depth policy, as the depth-0 point runs, in an engine
// of its own. Both prefill first; then their steps alternate, one of the twin's, one of the
// point's, so that whatever slows the machine for a while (a neighbour on a shared host, a busy
// second core) slows both alike and cancels out of the ratio.
TwinRates decode_beside_twin(const std::shared_ptr<const model::Model>& model,
                             const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                             const EngineBenchConfig& config, engine::Engine& engine,
                             Finished& finished) {
  const int32_t max_tokens = config.depth_decode_tokens + 1;
  engine::Engine twin_engine(
      engine_config(config, depth_pages_needed(1, max_tokens, config.page_size), 1), model,
      tokenizer);
  const int64_t vocab = model->config().vocab_size;
  engine::Request request{.prompt = config.prompt_text.empty()
                                        ? bench_prompt(vocab, 1, uint64_t{1} << 48)
                                        : text_prompt(config.prompt_text, 0, 1),
                          .params = bench_params(max_tokens),
                          .kv_policy = sparsity::parse_policy(config.depth_policies.front())};
  Finished twin_finished;
  submit_or_fail(twin_engine, std::move(request), twin_finished);

  struct Stepper {
    engine::Engine* engine;
    Finished* finished;
    int32_t decode_steps = 0;  // steps that gave tokens after the first one
    int32_t tokens = 0;        // their tokens, and their seconds
    double seconds = 0.0;
    // One step; false once the request is done (or the engine idle).
    bool step() {
      if (finished->done) return false;
      const size_t before = finished->tokens.size();
      const auto start = Clock::now();
      const bool worked = engine->step();
      const double elapsed = seconds_between(start, Clock::now());
      const size_t after = finished->tokens.size();
      // The first decode step is apart (a sparse policy compresses the prompt there), as in the
      // steady rate of measure_depth.
      if (before >= 1 && after > before && decode_steps++ > 0) {
        tokens += static_cast<int32_t>(after - before);
        seconds += elapsed;
      }
      return worked;
    }
    void prefill() {
      while (finished->tokens.empty() && step()) {
      }
    }
  };
  Stepper own{&engine, &finished}, twin{&twin_engine, &twin_finished};
  own.prefill();
  twin.prefill();
  for (bool more = true; more;) {
    const bool twin_more = twin.step();
    const bool own_more = own.step();
    more = twin_more || own_more;
  }
  engine.run_until_idle();  // nothing left but the request's end
  twin_engine.run_until_idle();
  check_finished(twin_finished);
  TwinRates rates;
  if (own.seconds > 0) rates.own = own.tokens / own.seconds;
  if (twin.seconds > 0) rates.twin = twin.tokens / twin.seconds;
  return rates;
}

}  // namespace

DepthPoint measure_depth(const std::shared_ptr<const model::Model>& model,
                         const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                         const EngineBenchConfig& config, int32_t depth, const std::string& policy,
                         const speculative::SpeculativeConfig* speculative) {
  check_config(config);
  const int64_t vocab = model->config().vocab_size;
  const int32_t prompt_len = std::max(1, depth);
  const int32_t max_tokens = config.depth_decode_tokens + 1;
  const int64_t context = model->config().context_length;
  if (prompt_len + int64_t{max_tokens} > context) {
    fail("depth {} + {} tokens exceeds the model's context of {} tokens", prompt_len, max_tokens,
         context);
  }
  engine::EngineConfig ec =
      engine_config(config, depth_pages_needed(prompt_len, max_tokens, config.page_size), 1);
  // The engine loads a draft model named by its own config (one per engine).
  if (speculative && speculative->method == speculative::Method::kDraftModel)
    ec.speculative = *speculative;
  engine::Engine engine(ec, model, tokenizer);

  std::vector<int32_t> prompt;
  if (!config.prompt_text.empty()) {
    prompt = text_prompt(config.prompt_text, 0, prompt_len);
  } else if (config.depth_prompt_period > 0) {
    const std::vector<int32_t> span =
        bench_prompt(vocab, config.depth_prompt_period, (uint64_t{1} << 48) + depth);
    for (int32_t i = 0; i < prompt_len; ++i) prompt.push_back(span[i % span.size()]);
  } else {
    prompt = bench_prompt(vocab, prompt_len, (uint64_t{1} << 48) + depth);
  }
  engine::Request request{.prompt = std::move(prompt),
                          .params = bench_params(max_tokens),
                          .kv_policy = sparsity::parse_policy(policy)};
  if (speculative) request.speculative = *speculative;
  const sparsity::PolicySpec request_policy = request.kv_policy;
  const bool with_twin = config.depth_twin && depth > 0;
  std::optional<engine::Request> again;
  if (with_twin) again = request;
  Finished finished;
  submit_or_fail(engine, std::move(request), finished);
  engine.run_until_idle();
  check_finished(finished);
  // The twin pass: the same request again (prefix caching is off: a whole prefill again), its
  // decode steps alternating with the twin's. Only the twin ratio comes from it.
  std::optional<TwinRates> twin;
  bool twin_same_tokens = false;
  if (with_twin) {
    Finished second;
    submit_or_fail(engine, std::move(*again), second);
    twin = decode_beside_twin(model, tokenizer, config, engine, second);
    check_finished(second);
    twin_same_tokens = second.tokens == finished.tokens;
  }

  DepthPoint point;
  point.depth = depth;
  point.policy = sparsity::to_string(request_policy);
  const speculative::SpeculativeConfig& spec_config =
      speculative ? *speculative : config.speculative;
  if (spec_config.enabled()) {
    point.speculative = fmt::format("{} k={}", speculative::method_name(spec_config.method),
                                    spec_config.num_speculative_tokens);
    if (spec_config.method == speculative::Method::kSelfSparse)
      point.speculative += " " + sparsity::to_string(spec_config.kv_policy);
    if (spec_config.adaptive) point.speculative += " adaptive";
  }
  point.tokens = finished.tokens;
  point.spec_draft_tokens = finished.usage.spec_draft_tokens;
  point.spec_accepted_tokens = finished.usage.spec_accepted_tokens;
  point.kv_pages = finished.usage.kv_pages;
  point.kv_dense_pages = finished.usage.kv_dense_pages;
  point.kv_bytes = uint64_t{static_cast<uint32_t>(point.kv_pages)} *
                   static_cast<uint64_t>(engine.kv_bytes_per_page());
  point.draft_kv_bytes = static_cast<uint64_t>(finished.usage.spec_draft_kv_bytes);
  point.prompt_tokens = prompt_len;
  point.num_kv_pages = engine.config().num_kv_pages;
  // Submit to the first sampled token: the whole (chunked) prefill of the prompt.
  point.prompt_seconds = finished.timings.first_token_seconds;
  point.prompt_tokens_per_s = point.prompt_seconds > 0 ? prompt_len / point.prompt_seconds : 0.0;
  const std::vector<double>& ts = finished.timings.token_seconds;
  if (ts.size() >= 2) {
    point.decode_tokens = static_cast<int32_t>(ts.size() - 1);
    point.decode_seconds = ts.back() - ts.front();
    point.decode_tokens_per_s =
        point.decode_seconds > 0 ? point.decode_tokens / point.decode_seconds : 0.0;
    std::vector<double> gaps;
    for (size_t i = 1; i < ts.size(); ++i) gaps.push_back(ts[i] - ts[i - 1]);
    std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2),
                     gaps.end());
    point.itl_p50_seconds = gaps[gaps.size() / 2];
    point.first_step_seconds = ts[1] - ts[0];
    if (ts.size() >= 3 && ts.back() > ts[1])
      point.steady_tokens_per_s = static_cast<double>(ts.size() - 2) / (ts.back() - ts[1]);
  }
  if (finished.token_cpu_seconds.size() >= 2)
    point.decode_cpu_seconds =
        finished.token_cpu_seconds.back() - finished.token_cpu_seconds.front();
  point.steps = engine.stats().num_steps;
  if (twin && twin->own > 0 && twin->twin > 0) {
    point.twin_steady_tokens_per_s = twin->twin;
    point.steady_ratio_vs_twin = twin->own / twin->twin;
    point.twin_same_tokens = twin_same_tokens;
  }
  return point;
}

EngineBenchResult run_engine_bench(const std::shared_ptr<const model::Model>& model,
                                   const std::shared_ptr<const tok::Tokenizer>& tokenizer,
                                   const EngineBenchConfig& config,
                                   const EngineBenchProgress& progress) {
  check_config(config);
  // Fail before minutes of measuring, not after.
  const int64_t context = model->config().context_length;
  for (int32_t d : config.depths) {
    if (std::max(1, d) + int64_t{config.depth_decode_tokens} + 1 > context) {
      fail("depth {} + {} tokens exceeds the model's context of {} tokens", d,
           config.depth_decode_tokens + 1, context);
    }
  }
  if (int64_t{config.prompt_tokens} + config.output_tokens > context) {
    fail("--prompt-tokens + --output-tokens ({}) exceeds the model's context of {} tokens",
         int64_t{config.prompt_tokens} + config.output_tokens, context);
  }
  EngineBenchResult result;
  result.threads = model->backend().num_threads();

  // The references are the C=1 and depth-0 points, measured first when listed so the progress
  // callbacks can already show the ratios.
  std::vector<int32_t> concurrency = config.concurrency;
  std::stable_partition(concurrency.begin(), concurrency.end(), [](int32_t c) { return c == 1; });
  std::vector<int32_t> depths = config.depths;
  std::stable_partition(depths.begin(), depths.end(), [](int32_t d) { return d == 0; });

  // Warm-up, not reported: pages the weights in and starts the worker threads once.
  {
    EngineBenchConfig warm = config;
    warm.depth_decode_tokens = 2;
    (void)measure_depth(model, tokenizer, warm, 0);
  }

  std::optional<double> c1;
  for (int32_t c : concurrency) {
    ConcurrencyPoint point = measure_concurrency(model, tokenizer, config, c);
    if (c == 1 && !c1) c1 = point.generated_tokens_per_s;
    if (c1 && *c1 > 0) point.speedup_vs_c1 = point.generated_tokens_per_s / *c1;
    if (progress.on_concurrency) progress.on_concurrency(point);
    result.concurrency.push_back(point);
  }
  std::optional<double> d0;
  double steady_d0 = 0.0;
  for (int32_t d : depths) {
    std::optional<DepthPoint> baseline;
    std::vector<std::pair<std::string, const speculative::SpeculativeConfig*>> variants;
    for (const std::string& policy : config.depth_policies) {
      variants.emplace_back(policy, nullptr);
      for (const speculative::SpeculativeConfig& s : config.depth_speculative)
        variants.emplace_back(policy, &s);
    }
    for (const auto& [policy, speculative] : variants) {
      DepthPoint point = measure_depth(model, tokenizer, config, d, policy, speculative);
      if (!baseline) baseline = point;
      if (baseline->decode_tokens_per_s > 0)
        point.ratio_vs_baseline = point.decode_tokens_per_s / baseline->decode_tokens_per_s;
      if (point.itl_p50_seconds > 0)
        point.itl_ratio_vs_baseline = baseline->itl_p50_seconds / point.itl_p50_seconds;
      if (point.decode_cpu_seconds > 0)
        point.cpu_ratio_vs_baseline = baseline->decode_cpu_seconds / point.decode_cpu_seconds;
      // Greedy: speculation must give the baseline's tokens (a sparse policy need not).
      point.same_tokens_as_baseline = point.tokens == baseline->tokens;
      if (d == 0 && !d0) {
        d0 = point.decode_tokens_per_s;
        steady_d0 = point.steady_tokens_per_s;
      }
      if (d0 && *d0 > 0) point.ratio_vs_depth0 = point.decode_tokens_per_s / *d0;
      if (steady_d0 > 0) point.steady_ratio_vs_depth0 = point.steady_tokens_per_s / steady_d0;
      if (progress.on_depth) progress.on_depth(point);
      result.depths.push_back(point);
    }
  }
  return result;
}

}  // namespace sieve::eval
