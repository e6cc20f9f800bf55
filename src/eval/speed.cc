#include "eval/speed.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/generator.h"
#include "kernels/ops.h"
#include "util/clock.h"
#include "util/thread_pool.h"

namespace sieve::eval {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

template <class Fn>
void ReadBandwidthProbe::for_each_share(const Fn& fn) {
  const int num_threads = pool_.num_threads();
  const uint64_t per_thread = (num_words_ + num_threads - 1) / num_threads;
  pool_.parallel_for(
      num_threads,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const uint64_t lo = std::min<uint64_t>(num_words_, t * per_thread);
          fn(t, lo, std::min<uint64_t>(num_words_, lo + per_thread));
        }
      },
      1);
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, uint64_t bytes)
    : pool_(pool),
      num_words_(bytes / sizeof(uint64_t)),
      // In memory of the kind the packed weights get (huge pages where the kernel gives them),
      // so the roofline and decode's weight reads pay the same page walks.
      buffer_(static_cast<uint64_t*>(kernels::allocate_packed(num_words_ * sizeof(uint64_t)))) {
  // First touch from the thread that will read each part (NUMA placement), nonzero content.
  for_each_share([&](int64_t, uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; ++i) buffer_[i] = i;
  });
}

ReadBandwidthProbe::~ReadBandwidthProbe() {
  kernels::free_packed(buffer_, num_words_ * sizeof(uint64_t));
}

double ReadBandwidthProbe::pass() {
  std::vector<uint64_t> sums(pool_.num_threads());
  const auto start = Clock::now();
  for_each_share([&](int64_t t, uint64_t lo, uint64_t hi) {
    sums[t] = kernels::sum_words(buffer_ + lo, static_cast<int64_t>(hi - lo));
  });
  const double gb_per_s = static_cast<double>(bytes()) / seconds_between(start, Clock::now()) / 1e9;
  // Keep the sums observable so the loop cannot be optimised away.
  volatile uint64_t sink = 0;
  for (uint64_t s : sums) sink = sink + s;
  return gb_per_s;
}

BandwidthResult measure_read_bandwidth(ReadBandwidthProbe& probe, int repetitions) {
  BandwidthResult result{.bytes = probe.bytes(), .repetitions = repetitions};
  double total = 0.0;
  for (int rep = 0; rep < repetitions; ++rep) {
    const double gb_per_s = probe.pass();
    result.best_gb_per_s = std::max(result.best_gb_per_s, gb_per_s);
    total += gb_per_s;
  }
  result.mean_gb_per_s = total / std::max(1, repetitions);
  return result;
}

FmaPeakProbe::FmaPeakProbe(ThreadPool& pool, int64_t iterations)
    : pool_(pool), iterations_(iterations) {}

double FmaPeakProbe::pass() {
  const int num_threads = pool_.num_threads();
  std::vector<double> flops(num_threads, 0.0);
  std::vector<float> sums(num_threads, 0.0f);
  const auto start = Clock::now();
  pool_.parallel_for(
      num_threads,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) sums[t] = kernels::fma_chains(iterations_, &flops[t]);
      },
      1);
  const double seconds = seconds_between(start, Clock::now());
  double total = 0.0;
  for (double f : flops) total += f;
  volatile float sink = 0.0f;  // the chains' results stay observable
  for (float v : sums) sink = sink + v;
  return total / seconds / 1e9;
}

double FmaPeakProbe::best_pass(int passes) {
  double best = 0.0;
  for (int i = 0; i < std::max(1, passes); ++i) best = std::max(best, pass());
  return best;
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

ModelSpeed measure_model_speed(const model::Model& model, int64_t prompt_tokens,
                               int64_t decode_tokens, ReadBandwidthProbe* probe, int rounds,
                               FmaPeakProbe* fma_probe) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> prompt(prompt_tokens);
  for (int64_t i = 0; i < prompt_tokens; ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  engine::GenerateOptions options{.max_tokens = static_cast<int32_t>(decode_tokens + 1),
                                  .sampling = {.temperature = 0.0f}};
  rounds =
      probe == nullptr
          ? 1
          : static_cast<int>(std::clamp<int64_t>(rounds, 1, std::max<int64_t>(1, decode_tokens)));
  // Round r is decode steps [round_start(r), round_start(r + 1)); probes[r] is read just before
  // its first step, probes[rounds] after the last step.
  const auto round_start = [&](int64_t r) { return r * decode_tokens / rounds; };
  // The first sampled token comes from the prompt's logits; decode speed counts the steps
  // after it, each of which is one full forward pass for one token: the time from the callback's
  // return to its next call (the probe's passes run inside the callback, outside that time).
  std::vector<double> round_seconds(rounds, 0.0);
  std::vector<int64_t> round_steps(rounds, 0);
  std::vector<double> probes;
  int64_t calls = 0;
  int round = 0;
  Clock::time_point resumed{};
  // The FMA peak just before the prompt and right after it (outside its time), each the best of
  // a few passes.
  constexpr int kPeakPasses = 3;
  double peak_before = fma_probe != nullptr ? fma_probe->best_pass(kPeakPasses) : 0.0;
  double peak_after = 0.0;
  engine::GenerationStats stats =
      engine::generate(model, prompt, options, [&](int32_t, std::span<const float>) {
        if (calls == 0 && fma_probe != nullptr) peak_after = fma_probe->best_pass(kPeakPasses);
        if (calls > 0) {  // decode step calls - 1 has just ended
          round_seconds[round] += seconds_between(resumed, Clock::now());
          ++round_steps[round];
        }
        while (probe != nullptr && std::ssize(probes) <= rounds &&
               round_start(std::ssize(probes)) == calls) {
          probes.push_back(probe->pass());
        }
        round = std::clamp(static_cast<int>(std::ssize(probes)) - 1, 0, rounds - 1);
        ++calls;
        resumed = Clock::now();
        return true;
      });
  ModelSpeed speed;
  speed.prompt_tokens = prompt_tokens;
  speed.prompt_tokens_per_s = stats.prompt_tokens_per_second();
  speed.decode_tokens = std::max<int64_t>(0, calls - 1);
  double decode_seconds = 0.0;
  for (double s : round_seconds) decode_seconds += s;
  speed.decode_tokens_per_s = speed.decode_tokens > 0 ? speed.decode_tokens / decode_seconds : 0.0;
  speed.bytes_per_token = model.weights().bytes_per_token();
  speed.decode_gb_per_s = speed.bytes_per_token * speed.decode_tokens_per_s / 1e9;
  speed.matmul_params_per_token = layer_matmul_params(model.weights());
  speed.prompt_gflop_per_s = 2.0 * speed.matmul_params_per_token * speed.prompt_tokens_per_s / 1e9;
  if (fma_probe != nullptr && calls > 0) {
    speed.prompt_fma_peak_gflop_per_s = 0.5 * (peak_before + peak_after);
    speed.prompt_peak_fraction = speed.prompt_gflop_per_s / speed.prompt_fma_peak_gflop_per_s;
  }
  if (probe != nullptr) {
    for (int r = 0; r + 1 < std::ssize(probes); ++r) {  // rounds with a probe on both sides
      if (round_steps[r] == 0 || round_seconds[r] <= 0.0) continue;
      const double gb_per_s = speed.bytes_per_token * round_steps[r] / round_seconds[r] / 1e9;
      speed.round_utilisation.push_back(gb_per_s / (0.5 * (probes[r] + probes[r + 1])));
    }
    std::vector<double> sorted = speed.round_utilisation;
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) {
      const size_t n = sorted.size();
      speed.median_utilisation =
          n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    }
  }
  return speed;
}

}  // namespace sieve::eval
