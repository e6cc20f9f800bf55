// `sieve bench-engine`: throughput of the continuous-batching Engine against concurrency, and
// single-sequence decode speed against context depth. The measuring is in eval/engine_bench.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/kv_dtype_option.h"
#include "cli/model_options.h"
#include "cli/speculative_option.h"
#include "eval/engine_bench.h"
#include "kernels/ops.h"
#include "model/loader.h"

namespace sieve::cli {

namespace {

struct BenchEngineOptions {
  ModelOptions model;
  eval::EngineBenchConfig config;
  int64_t kv_memory_mib = 0;  // 0: sized per point
  std::string calibration_path;
  std::string prompt_file;
  bool json = false;
};

nlohmann::json to_json(const eval::ConcurrencyPoint& p) {
  return {{"concurrency", p.concurrency},
          {"num_kv_pages", p.num_kv_pages},
          {"prompt_tokens", p.prompt_tokens},
          {"generated_tokens", p.generated_tokens},
          {"wall_seconds", p.wall_seconds},
          {"cpu_seconds", p.cpu_seconds},
          {"generated_tokens_per_cpu_s", p.generated_tokens_per_cpu_s},
          {"generated_tokens_per_s", p.generated_tokens_per_s},
          {"total_tokens_per_s", p.total_tokens_per_s},
          {"mean_ttft_seconds", p.mean_ttft_seconds},
          {"mean_tpot_seconds", p.mean_tpot_seconds},
          {"decode_phase_tokens", p.decode_phase_tokens},
          {"decode_phase_seconds", p.decode_phase_seconds},
          {"decode_phase_tokens_per_s", p.decode_phase_tokens_per_s},
          {"steps", p.steps},
          {"preemptions", p.preemptions},
          {"speedup_vs_c1", p.speedup_vs_c1}};
}

nlohmann::json to_json(const eval::DepthPoint& p) {
  return {{"depth", p.depth},
          {"policy", p.policy},
          {"speculative", p.speculative},
          {"draft_kv_bytes", p.draft_kv_bytes},
          {"spec_draft_tokens", p.spec_draft_tokens},
          {"spec_accepted_tokens", p.spec_accepted_tokens},
          {"kv_pages", p.kv_pages},
          {"kv_dense_pages", p.kv_dense_pages},
          {"kv_bytes", p.kv_bytes},
          {"ratio_vs_baseline", p.ratio_vs_baseline},
          {"itl_p50_seconds", p.itl_p50_seconds},
          {"first_step_seconds", p.first_step_seconds},
          {"steady_tokens_per_s", p.steady_tokens_per_s},
          {"steady_ratio_vs_depth0", p.steady_ratio_vs_depth0},
          {"twin_steady_tokens_per_s", p.twin_steady_tokens_per_s},
          {"steady_ratio_vs_twin", p.steady_ratio_vs_twin},
          {"twin_same_tokens", p.twin_same_tokens},
          {"itl_ratio_vs_baseline", p.itl_ratio_vs_baseline},
          {"prompt_tokens", p.prompt_tokens},
          {"num_kv_pages", p.num_kv_pages},
          {"prompt_seconds", p.prompt_seconds},
          {"prompt_tokens_per_s", p.prompt_tokens_per_s},
          {"decode_tokens", p.decode_tokens},
          {"decode_seconds", p.decode_seconds},
          {"decode_tokens_per_s", p.decode_tokens_per_s},
          {"decode_cpu_seconds", p.decode_cpu_seconds},
          {"cpu_ratio_vs_baseline", p.cpu_ratio_vs_baseline},
          {"same_tokens_as_baseline", p.same_tokens_as_baseline},
          {"steps", p.steps},
          {"ratio_vs_depth0", p.ratio_vs_depth0}};
}

std::string ratio(double r) { return r > 0 ? fmt::format("{:.2f}x", r) : std::string("-"); }

void print_concurrency_row(const eval::ConcurrencyPoint& p) {
  fmt::print(
      "{:>5} {:>8} {:>9.2f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.2f} {:>11.1f} {:>6} {:>7} {:>8} "
      "{:>10.1f}\n",
      p.concurrency, p.generated_tokens, p.wall_seconds, p.generated_tokens_per_s,
      p.total_tokens_per_s, 1e3 * p.mean_ttft_seconds, 1e3 * p.mean_tpot_seconds,
      p.decode_phase_tokens_per_s, p.steps, p.preemptions, ratio(p.speedup_vs_c1),
      p.generated_tokens_per_cpu_s);
  std::fflush(stdout);
}

void print_depth_row(const eval::DepthPoint& p) {
  const std::string acceptance =
      p.spec_draft_tokens > 0
          ? fmt::format("{:.2f}", static_cast<double>(p.spec_accepted_tokens) / p.spec_draft_tokens)
          : std::string("-");
  fmt::print(
      "{:>6} {:>7} {:>9.2f} {:>12.1f} {:>7} {:>12.2f} {:>8} {:>9.2f} {:>12.2f} {:>8} {:>8} "
      "{:>9.2f} {:>9.3f} {:>8} {:>10.3f} {:>8} {:>6} {:>5}  {} | {}{}\n",
      p.depth, p.prompt_tokens, p.prompt_seconds, p.prompt_tokens_per_s, p.decode_tokens,
      p.decode_tokens_per_s, ratio(p.ratio_vs_depth0), 1e3 * p.first_step_seconds,
      p.steady_tokens_per_s, ratio(p.steady_ratio_vs_depth0), ratio(p.steady_ratio_vs_twin),
      static_cast<double>(p.kv_bytes) / (1 << 20),
      p.kv_dense_pages > 0 ? static_cast<double>(p.kv_pages) / p.kv_dense_pages : 0.0,
      ratio(p.ratio_vs_baseline), 1e3 * p.itl_p50_seconds, ratio(p.itl_ratio_vs_baseline),
      acceptance, p.same_tokens_as_baseline ? "yes" : "no", p.policy, p.speculative,
      p.draft_kv_bytes > 0 ? fmt::format(" (+ draft KV {:.3f} MiB)",
                                         static_cast<double>(p.draft_kv_bytes) / (1 << 20))
                           : std::string());
  std::fflush(stdout);
}

void bench_engine(BenchEngineOptions options) {
  eval::EngineBenchConfig& config = options.config;
  if (options.kv_memory_mib > 0)
    config.kv_memory_bytes = static_cast<uint64_t>(options.kv_memory_mib) << 20;
  if (!options.calibration_path.empty()) {
    config.calibration = std::make_shared<const sparsity::CalibrationProfile>(
        sparsity::load_calibration(options.calibration_path));
  }
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  const model::ModelConfig& mc = loaded.model->config();
  if (!options.prompt_file.empty()) {
    std::ifstream in(options.prompt_file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().empty()) fail("--prompt-file {}: no text in it", options.prompt_file);
    config.prompt_text = loaded.tokenizer->encode(text.str());
  }

  eval::EngineBenchProgress progress;
  bool depth_header = false;
  if (!options.json) {
    const int threads = loaded.model->backend().num_threads();
    fmt::print("model {} (dim {}, {} layers, vocab {}, ctx {})\n", options.model.model_path, mc.dim,
               mc.num_layers, mc.vocab_size, mc.context_length);
    fmt::print(
        "threads {}, SIMD target {}, page size {}, KV dtype {}, max batch tokens {}, prefix "
        "caching off, speculative {}\n\n",
        threads, kernels::active_target(), config.page_size, model::kv_dtype_name(config.kv_dtype),
        config.max_batch_tokens, speculative::to_json(config.speculative));
    fmt::print(
        "throughput vs concurrency: {} prompt + {} generated tokens per request, greedy, "
        "ignore_eos\n",
        config.prompt_tokens, config.output_tokens);
    fmt::print("{:>5} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11} {:>6} {:>7} {:>8} {:>10}\n",
               "C", "gen tok", "wall s", "gen tok/s", "all tok/s", "TTFT ms", "TPOT ms",
               "dec tok/s", "steps", "preempt", "vs C=1", "gen/cpu-s");
    std::fflush(stdout);
    progress.on_concurrency = print_concurrency_row;
    progress.on_depth = [&](const eval::DepthPoint& p) {
      if (!depth_header) {
        fmt::print(
            "\ndecode vs context depth: one sequence, {} decode tokens after the first, prefill in "
            "chunks of {}; 1st ms: the first decode step (where a sparse policy compresses the "
            "prompt), steady: the steps after it; vs twin (--depth-twin): the steady rate of a "
            "second run whose steps alternate with a depth-0 twin's, against the twin's\n",
            config.depth_decode_tokens, config.max_batch_tokens);
        fmt::print(
            "{:>6} {:>7} {:>9} {:>12} {:>7} {:>12} {:>8} {:>9} {:>12} {:>8} {:>8} {:>9} {:>9} "
            "{:>8} {:>10} {:>8} {:>6} {:>5}  {} | {}\n",
            "depth", "prompt", "prefill s", "prompt tok/s", "decode", "decode tok/s", "vs d=0",
            "1st ms", "steady tok/s", "vs d=0", "vs twin", "KV MiB", "KV/dense", "vs first",
            "ITL p50 ms", "vs first", "accept", "same", "kv_policy", "speculative");
        depth_header = true;
      }
      print_depth_row(p);
    };
  }

  eval::EngineBenchResult result =
      eval::run_engine_bench(loaded.model, loaded.tokenizer, config, progress);

  if (options.json) {
    nlohmann::json out = {
        {"model", options.model.model_path},
        {"model_config",
         {{"dim", mc.dim},
          {"layers", mc.num_layers},
          {"vocab_size", mc.vocab_size},
          {"context_length", mc.context_length}}},
        {"threads", result.threads},
        {"simd_target", kernels::active_target()},
        {"config",
         {{"prompt_tokens", config.prompt_tokens},
          {"output_tokens", config.output_tokens},
          {"concurrency", config.concurrency},
          {"depths", config.depths},
          {"depth_decode_tokens", config.depth_decode_tokens},
          {"depth_policies", config.depth_policies},
          {"depth_twin", config.depth_twin},
          {"kv_memory_mib", options.kv_memory_mib > 0 ? nlohmann::json(options.kv_memory_mib)
                                                      : nlohmann::json(nullptr)},
          {"max_batch_tokens", config.max_batch_tokens},
          {"page_size", config.page_size},
          {"kv_dtype", model::kv_dtype_name(config.kv_dtype)},
          {"prefill_attention", kernels::prefill_dots_name(options.model.prefill_dots)},
          {"speculative", nlohmann::json::parse(speculative::to_json(config.speculative))},
          {"prefix_caching", false}}},
        {"concurrency", nlohmann::json::array()},
        {"depths", nlohmann::json::array()}};
    for (const eval::ConcurrencyPoint& p : result.concurrency)
      out["concurrency"].push_back(to_json(p));
    for (const eval::DepthPoint& p : result.depths) out["depths"].push_back(to_json(p));
    fmt::print("{}\n", out.dump(2));
  }
}

}  // namespace

void add_bench_engine_command(CLI::App& app) {
  auto options = std::make_shared<BenchEngineOptions>();
  eval::EngineBenchConfig& config = options->config;
  CLI::App* command = app.add_subcommand(
      "bench-engine",
      "Measure the batching engine: throughput vs concurrency, decode speed vs context depth");
  options->model.add_to(*command);
  command
      ->add_option("--prompt-tokens", config.prompt_tokens,
                   "Prompt length of each concurrent request")
      ->capture_default_str();
  command
      ->add_option("--output-tokens", config.output_tokens,
                   "Tokens generated by each concurrent request")
      ->capture_default_str();
  command
      ->add_option("--concurrency", config.concurrency,
                   "Concurrent requests per point (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  command
      ->add_option("--depths", config.depths,
                   "Context depths for single-sequence decode (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  command
      ->add_option("--depth-decode-tokens", config.depth_decode_tokens,
                   "Decode steps timed at each depth")
      ->capture_default_str();
  command
      ->add_option(
          "--kv-policy", config.depth_policies,
          "KV policy of the depth points (repeat for several; each depth runs each, the first is "
          "the baseline of the 'vs first' ratio)")
      ->capture_default_str();
  command->add_option("--kv-memory-mib", options->kv_memory_mib,
                      "KV pool size (default: exactly enough pages for each point)");
  command
      ->add_option("--max-batch-tokens", config.max_batch_tokens, "Tokens computed per engine step")
      ->capture_default_str();
  command->add_option("--page-size", config.page_size, "KV page size in tokens")
      ->capture_default_str();
  add_kv_dtype_option(*command, config.kv_dtype);
  add_precise_kv_heads_option(*command, config.precise_kv_heads);
  add_speculative_config_option(*command, config.speculative);
  command
      ->add_option_function<std::vector<std::string>>(
          "--depth-speculative",
          [&config](const std::vector<std::string>& texts) {
            for (const std::string& text : texts)
              config.depth_speculative.push_back(speculative::parse_speculative_config(text));
          },
          "Also run each depth point with this speculative config (vLLM's JSON; repeat for "
          "several): decode tok/s against the first point, and the draft acceptance")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  command->add_flag(
      "--depth-twin", config.depth_twin,
      "Also run each depth > 0 point a second time, its decode steps alternating with those of "
      "a depth-0 twin in an engine beside it: 'vs twin' is the ratio of their steady rates, "
      "which a machine whose speed drifts between points (a shared host) leaves alone");
  command
      ->add_option("--depth-prompt-period", config.depth_prompt_period,
                   "Depth prompts repeat a random span of this many tokens (text that repeats "
                   "itself, for prompt lookup); 0: random tokens")
      ->capture_default_str();
  command
      ->add_option("--prompt-file", options->prompt_file,
                   "Prompts are this text's tokens (e.g. held-out text; repeated where it runs "
                   "out): a depth prompt from its start, concurrent request i from i prompt "
                   "lengths in; default: random tokens")
      ->check(CLI::ExistingFile);
  command
      ->add_option("--calibration", options->calibration_path,
                   "Calibration profile of the model's KV heads (`sieve calibrate`), for lserve")
      ->check(CLI::ExistingFile);
  command->add_flag("--json", options->json, "Print the results as one JSON object");
  command->callback([options] { bench_engine(*options); });
}

}  // namespace sieve::cli
