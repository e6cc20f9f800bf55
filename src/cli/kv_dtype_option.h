#pragma once
// --kv-dtype, the same names and the same error on every command that runs a KV cache (serve,
// run, batch, eval, bench-engine): model::parse_kv_dtype's.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>

#include "model/kv_cache.h"

namespace sieve::cli {

// Adds --kv-dtype to `command`, writing the parsed type into `dtype` (which must outlive the
// parse). An unknown name is a parse error listing the valid ones.
inline CLI::Option* add_kv_dtype_option(CLI::App& command, kernels::DType& dtype) {
  const CLI::Validator known(
      [](std::string& name) -> std::string {
        if (model::parse_kv_dtype(name)) return {};
        return fmt::format("unknown KV dtype '{}'; use one of {}", name, model::kKvDTypeNames);
      },
      "f32|f16|q8|q4", "KV dtype");
  return command
      .add_option_function<std::string>(
          "--kv-dtype", [&dtype](const std::string& name) { dtype = *model::parse_kv_dtype(name); },
          "K/V element type: f32; f16 (half the memory and decode reads); q8 or q4 (8- or 4-bit "
          "blocks of 32 with their scales, 0.27x / 0.16x of f32's bytes; head_dim a multiple of "
          "32)")
      ->default_str(std::string(model::kv_dtype_name(dtype)))
      ->check(known);
}

// Adds --no-precise-kv-heads (engine::EngineConfig::precise_kv_heads) to `command`.
inline CLI::Option* add_precise_kv_heads_option(CLI::App& command, bool& precise) {
  return command.add_flag("--no-precise-kv-heads{false}", precise,
                          "q8 / q4: do not keep the few heads those bits round far worse than "
                          "the others (found by the key calibration pass) in f16 as well");
}

}  // namespace sieve::cli
