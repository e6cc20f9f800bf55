// `sieve bench`: memory bandwidth and f32 FMA peak, then prompt and decode speed of each model,
// with prefill expressed as a fraction of the FMA peak and decode as one of the bandwidth.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "eval/speed.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/loader.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct BenchOptions {
  std::vector<std::string> model_paths;
  int64_t bandwidth_mib = 1024;
  int repetitions = 5;
  int64_t prompt_tokens = 128;
  int64_t decode_tokens = 32;
  int rounds = 4;
  int threads = 0;
  kernels::PrefillDots prefill_dots = kernels::PrefillDots::kF32;
  bool json = false;
};

// The types of the layers' matrices, in order of first use: "Q8_0", or "Q4_K+Q6_K" for Q4_K_M.
std::string weight_type_name(const model::Model& model) {
  std::vector<std::string> types;
  for (const model::LayerWeights& layer : model.weights().layers) {
    for (const kernels::MatrixView* m :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down}) {
      const std::string type(kernels::to_string(m->dtype));
      if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
    }
  }
  return fmt::format("{}", fmt::join(types, "+"));
}

void bench(const BenchOptions& options) {
  ThreadPool pool(options.threads);  // the bandwidth probe's; each model runs on its own backend
  if (!options.json) {
    fmt::print("threads {}, SIMD target {}\n", pool.num_threads(), kernels::active_target());
  }
  eval::ReadBandwidthProbe probe(pool, static_cast<uint64_t>(options.bandwidth_mib) << 20);
  const eval::BandwidthResult bandwidth = eval::measure_read_bandwidth(probe, options.repetitions);
  eval::FmaPeakProbe fma_probe(pool);
  const double fma_peak = fma_probe.best_pass(options.repetitions);
  nlohmann::json out = {{"threads", pool.num_threads()},
                        {"simd_target", kernels::active_target()},
                        {"bandwidth",
                         {{"bytes", bandwidth.bytes},
                          {"best_gb_per_s", bandwidth.best_gb_per_s},
                          {"mean_gb_per_s", bandwidth.mean_gb_per_s}}},
                        {"fma_peak_gflop_per_s", fma_peak},
                        {"prefill_attention", kernels::prefill_dots_name(options.prefill_dots)},
                        {"models", nlohmann::json::array()}};
  if (!options.json) {
    fmt::print("memory read bandwidth (sum over {:.2f} GiB, best of {}): {:.2f} GB/s\n",
               bandwidth.bytes / double(1 << 30), options.repetitions, bandwidth.best_gb_per_s);
    fmt::print("f32 FMA peak (best of {}): {:.1f} GFLOP/s\n\n", std::max(1, options.repetitions),
               fma_peak);
    fmt::print("{:<40} {:<10} {:>10} {:>12} {:>14} {:>7} {:>12} {:>12} {:>8} {:>9}\n", "model",
               "type", "MB/token", "prompt tok/s", "prompt GFLOP/s", "of peak", "decode tok/s",
               "decode GB/s", "bw util", "adjacent");
  }
  for (const std::string& path : options.model_paths) {
    model::LoadedModel loaded = model::load_model(
        {.model_path = path,
         .backend = {
             .device = "cpu", .threads = options.threads, .prefill_dots = options.prefill_dots}});
    eval::ModelSpeed speed =
        eval::measure_model_speed(*loaded.model, options.prompt_tokens, options.decode_tokens,
                                  &probe, options.rounds, &fma_probe);
    const double utilisation = speed.decode_gb_per_s / bandwidth.best_gb_per_s;
    const std::string file_type = weight_type_name(*loaded.model);
    out["models"].push_back({{"path", path},
                             {"weight_type", file_type},
                             {"bytes_per_token", speed.bytes_per_token},
                             {"prompt_tokens", speed.prompt_tokens},
                             {"prompt_tokens_per_s", speed.prompt_tokens_per_s},
                             {"matmul_params_per_token", speed.matmul_params_per_token},
                             {"prompt_gflop_per_s", speed.prompt_gflop_per_s},
                             {"prompt_fma_peak_gflop_per_s", speed.prompt_fma_peak_gflop_per_s},
                             {"prompt_peak_fraction", speed.prompt_peak_fraction},
                             {"decode_tokens", speed.decode_tokens},
                             {"decode_tokens_per_s", speed.decode_tokens_per_s},
                             {"decode_gb_per_s", speed.decode_gb_per_s},
                             {"bandwidth_utilisation", utilisation},
                             {"round_utilisation", speed.round_utilisation},
                             {"adjacent_utilisation", speed.median_utilisation}});
    if (!options.json) {
      fmt::print(
          "{:<40} {:<10} {:>10.1f} {:>12.1f} {:>14.1f} {:>6.1f}% {:>12.2f} {:>12.2f} {:>7.1f}% "
          "{:>8.1f}%\n",
          path, file_type, speed.bytes_per_token / 1e6, speed.prompt_tokens_per_s,
          speed.prompt_gflop_per_s, 100.0 * speed.prompt_peak_fraction, speed.decode_tokens_per_s,
          speed.decode_gb_per_s, 100.0 * utilisation, 100.0 * speed.median_utilisation);
    }
  }
  if (!options.json) {
    fmt::print(
        "\nprompt GFLOP/s = 2 x (q/k/v/o/gate/up/down parameters of all layers) x prompt tokens / "
        "prompt time; embedding lookup, output matrix and attention scores not counted; of peak = "
        "prompt GFLOP/s / the mean of f32 FMA peak passes just before and after the prompt\n"
        "bw util = decode GB/s / the bandwidth above; adjacent = median over {} decode rounds of "
        "the round's GB/s / the mean of bandwidth passes just before and after it\n",
        options.rounds);
  }
  if (options.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench", "Measure memory bandwidth, then prompt and decode speed of models against it");
  command->add_option("-m,--model", options->model_paths, "GGUF model (repeatable)")
      ->check(CLI::ExistingFile);
  command
      ->add_option("--bandwidth-mib", options->bandwidth_mib, "Buffer size for the bandwidth test")
      ->capture_default_str();
  command->add_option("--reps", options->repetitions, "Bandwidth passes (best is reported)")
      ->capture_default_str();
  command->add_option("--prompt-tokens", options->prompt_tokens, "Prompt length for prompt speed")
      ->capture_default_str();
  command->add_option("--decode-tokens", options->decode_tokens, "Tokens decoded for decode speed")
      ->capture_default_str();
  command
      ->add_option("--rounds", options->rounds,
                   "Decode rounds, each between two bandwidth passes (the adjacent utilisation)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("-t,--threads", options->threads, "Worker threads (default: all cores)");
  add_prefill_attention_option(*command, options->prefill_dots);
  command->add_flag("--json", options->json, "Print the results as JSON");
  command->callback([options] { bench(*options); });
}

}  // namespace sieve::cli
