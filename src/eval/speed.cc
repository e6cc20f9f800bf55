#include "eval/speed.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/generator.h"
#include "kernels/ops.h"
#include "util/thread_pool.h"

namespace sieve::eval {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

BandwidthResult measure_read_bandwidth(ThreadPool& pool, uint64_t bytes, int repetitions) {
  const uint64_t num_words = bytes / sizeof(uint64_t);
  // In memory of the kind the packed weights get (huge pages where the kernel gives them), so the
  // roofline and decode's weight reads pay the same page walks.
  const auto free_buffer = [bytes = num_words * sizeof(uint64_t)](uint64_t* p) {
    kernels::free_packed(p, bytes);
  };
  const std::unique_ptr<uint64_t[], decltype(free_buffer)> buffer(
      static_cast<uint64_t*>(kernels::allocate_packed(num_words * sizeof(uint64_t))), free_buffer);
  const int num_threads = pool.num_threads();
  const int64_t per_thread = static_cast<int64_t>((num_words + num_threads - 1) / num_threads);
  // First touch from the thread that will read each part (NUMA placement), nonzero content.
  pool.parallel_for(
      num_threads,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const uint64_t lo = t * per_thread, hi = std::min<uint64_t>(num_words, lo + per_thread);
          for (uint64_t i = lo; i < hi; ++i) buffer[i] = i;
        }
      },
      1);
  std::vector<uint64_t> sums(num_threads);
  BandwidthResult result{.bytes = num_words * sizeof(uint64_t), .repetitions = repetitions};
  double total = 0.0;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto start = Clock::now();
    pool.parallel_for(
        num_threads,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            const uint64_t lo = t * per_thread, hi = std::min<uint64_t>(num_words, lo + per_thread);
            // Four independent accumulators; integer adds vectorise without reassociation flags.
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            uint64_t i = lo;
            for (; i + 4 <= hi; i += 4) {
              s0 += buffer[i];
              s1 += buffer[i + 1];
              s2 += buffer[i + 2];
              s3 += buffer[i + 3];
            }
            for (; i < hi; ++i) s0 += buffer[i];
            sums[t] = s0 + s1 + s2 + s3;
          }
        },
        1);
    const double gbps =
        static_cast<double>(result.bytes) / seconds_between(start, Clock::now()) / 1e9;
    result.best_gb_per_s = std::max(result.best_gb_per_s, gbps);
    total += gbps;
  }
  result.mean_gb_per_s = total / std::max(1, repetitions);
  // Keep the sums observable so the loop cannot be optimised away.
  volatile uint64_t sink = 0;
  for (uint64_t s : sums) sink = sink + s;
  return result;
}

uint64_t layer_matmul_params(const model::Weights& weights) {
  auto params = [](const kernels::MatrixView& m) { return static_cast<uint64_t>(m.rows) * m.cols; };
  uint64_t total = 0;
  for (const model::LayerWeights& layer : weights.layers) {
    total += params(layer.wq) + params(layer.wk) + params(layer.wv) + params(layer.wo) +
             params(layer.w_gate) + params(layer.w_up) + params(layer.w_down);
  }
  return total;
}

ModelSpeed measure_model_speed(const model::LlamaModel& model, int64_t prompt_tokens,
                               int64_t decode_tokens) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> prompt(prompt_tokens);
  for (int64_t i = 0; i < prompt_tokens; ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  engine::GenerateOptions options{.max_tokens = static_cast<int32_t>(decode_tokens + 1),
                                  .sampling = {.temperature = 0.0f}};
  // The first sampled token comes from the prompt's logits; decode speed counts the steps
  // after it, each of which is one full forward pass for one token.
  Clock::time_point first_token_time{}, last_token_time{};
  int64_t generated = 0;
  engine::GenerationStats stats =
      engine::generate(model, prompt, options, [&](int32_t, std::span<const float>) {
        (generated == 0 ? first_token_time : last_token_time) = Clock::now();
        ++generated;
        return true;
      });
  ModelSpeed speed;
  speed.prompt_tokens = prompt_tokens;
  speed.prompt_tokens_per_s = stats.prompt_tokens_per_second();
  speed.decode_tokens = generated - 1;
  speed.decode_tokens_per_s =
      speed.decode_tokens > 0
          ? speed.decode_tokens / seconds_between(first_token_time, last_token_time)
          : 0.0;
  speed.bytes_per_token = model.weights().bytes_per_token();
  speed.decode_gb_per_s = speed.bytes_per_token * speed.decode_tokens_per_s / 1e9;
  speed.matmul_params_per_token = layer_matmul_params(model.weights());
  speed.prompt_gflop_per_s = 2.0 * speed.matmul_params_per_token * speed.prompt_tokens_per_s / 1e9;
  return speed;
}

}  // namespace sieve::eval
