#pragma once
// Options of the commands that run the serving engine (run, batch, serve).
#include <CLI/CLI.hpp>

#include <optional>

#include "cli/kv_dtype_option.h"
#include "cli/speculative_option.h"
#include "engine/engine.h"

namespace sieve::cli {

struct EngineOptions {
  std::optional<int64_t> kv_memory_mib;  // unset: engine::default_kv_memory_bytes
  int64_t kv_tokens = 0;                 // when set, sizes the pool instead of kv_memory_mib
  std::string calibration_path;
  engine::EngineConfig config;

  void add_to(CLI::App& command) {
    command
        .add_option("--kv-memory", kv_memory_mib,
                    "KV cache size in MiB (the page pool; default: room for --max-num-seqs "
                    "sequences of the model's whole context, at most 512 MiB)")
        ->check(CLI::PositiveNumber);
    command
        .add_option("--kv-tokens", kv_tokens, "KV cache size in tokens (instead of --kv-memory)")
        ->check(CLI::PositiveNumber);
    command.add_option("--page-size", config.page_size, "Tokens per KV page")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    command
        .add_option("--max-batch-tokens", config.max_batch_tokens,
                    "Tokens computed per engine step (chunked prefill)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    command
        .add_option("--sparse-prefill-chunk", config.sparse_prefill_chunk,
                    "Compress a sparse-policy prompt every this many tokens (0: once, at its end)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    command.add_option("--max-num-seqs", config.max_num_seqs, "Sequences running at once")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    command.add_option("--max-queued", config.max_queued, "Requests waiting at most")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    command.add_flag("--no-prefix-caching{false}", config.enable_prefix_caching,
                     "Do not reuse KV pages of earlier prompts");
    command
        .add_option("--max-parked-share", config.max_parked_share,
                    "Share of the KV pool that finished compressed requests may keep for a next "
                    "turn that continues them (0: none); taken back before anyone is preempted")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    add_kv_dtype_option(command, config.kv_dtype);
    add_precise_kv_heads_option(command, config.precise_kv_heads);
    add_speculative_config_option(command, config.speculative);
    command
        .add_option("--calibration", calibration_path,
                    "Calibration profile of the model's KV heads (`sieve calibrate`), for lserve "
                    "and heads:...@profile")
        ->check(CLI::ExistingFile);
  }

  engine::EngineConfig engine_config() const {
    engine::EngineConfig c = config;
    if (kv_memory_mib) c.kv_memory_bytes = static_cast<uint64_t>(*kv_memory_mib) << 20;
    if (!calibration_path.empty()) {
      c.calibration = std::make_shared<const sparsity::CalibrationProfile>(
          sparsity::load_calibration(calibration_path));
    }
    if (kv_tokens > 0)
      c.num_kv_pages = static_cast<int32_t>((kv_tokens + c.page_size - 1) / c.page_size);
    return c;
  }
};

}  // namespace sieve::cli
