#pragma once
// Options shared by the commands that load a model.
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "kernels/paged_attention.h"
#include "model/loader.h"

namespace sieve::cli {

// --prefill-attention, the arithmetic of prompt chunks' attention, as --kv-dtype is added
// (kv_dtype_option.h): the parsed choice written into `dots` (which must outlive the parse), an
// unknown name a parse error listing kernels::parse_prefill_dots' names.
inline CLI::Option* add_prefill_attention_option(CLI::App& command, kernels::PrefillDots& dots) {
  const CLI::Validator known(
      [](std::string& name) -> std::string {
        if (kernels::parse_prefill_dots(name)) return {};
        return fmt::format("unknown prefill attention '{}'; use one of {}", name,
                           kernels::kPrefillDotsNames);
      },
      "f32|bf16-pv|bf16", "prefill attention");
  return command
      .add_option_function<std::string>(
          "--prefill-attention",
          [&dots](const std::string& name) { dots = *kernels::parse_prefill_dots(name); },
          "Arithmetic of prompt chunks' attention on CPUs with AVX512-BF16 (e.g. Zen 4): "
          "f32; bf16-pv (p.v as bf16 dot products: 16k prompts ~1.2x faster, about f16 KV's "
          "error); bf16 (q.k too: ~1.4x, about q8 KV's error). Decode stays f32")
      ->default_str(std::string(kernels::prefill_dots_name(dots)))
      ->check(known);
}

struct ModelOptions {
  std::string model_path;
  std::string tokenizer_path;
  int threads = 0;  // 0: all hardware threads
  std::string device = "cpu";
  int64_t context_size = 0;  // 0: the file's
  std::string rope_scaling;  // empty: the file's
  float rope_scale = 0.0f;   // 0: the file's
  int64_t yarn_original_context = 0;
  std::string quantize;  // empty: the weights as stored
  kernels::PrefillDots prefill_dots = kernels::PrefillDots::kF32;

  void add_to(CLI::App& command) {
    command
        .add_option("-m,--model", model_path,
                    "Model: a GGUF file, a Hugging Face folder (config.json + safetensors) or its "
                    ".safetensors file, or a llama2.c .bin checkpoint")
        ->required()
        ->check(CLI::ExistingPath);
    command
        .add_option("--tokenizer", tokenizer_path,
                    "llama2.c tokenizer file (only for llama2.c checkpoints)")
        ->check(CLI::ExistingFile);
    command.add_option("-t,--threads", threads, "Worker threads (default: all cores)")
        ->check(CLI::NonNegativeNumber);
    command
        .add_option("--device", device,
                    fmt::format("Backend the model runs on: {} (reference: the scalar "
                                "kernels, for checking results; slow)",
                                kernels::kBackendDevices))
        ->capture_default_str();
    command
        .add_option("--ctx-size", context_size,
                    "Context (positions per sequence) instead of the model file's; beyond the "
                    "context it was trained for, stretch its RoPE with --rope-scaling")
        ->check(CLI::PositiveNumber);
    command
        .add_option("--rope-scaling", rope_scaling,
                    "RoPE scaling instead of the file's: none, linear or yarn")
        ->check(CLI::IsMember({"none", "linear", "yarn"}));
    command
        .add_option("--rope-scale", rope_scale,
                    "RoPE context scaling factor (the context is stretched by it; linear unless "
                    "--rope-scaling or the file says yarn)")
        ->check(CLI::Range(1.0f, 1e6f));
    command.add_option("--quantize", quantize,
                       "Convert the weights at load, in memory, as `sieve quantize` writes them "
                       "(q8_0, q4_0, q4_k_m, q6_k, ...; e.g. a Hugging Face folder's BF16 "
                       "weights); default: as the file stores them");
    add_prefill_attention_option(command, prefill_dots);
    command
        .add_option("--yarn-orig-ctx", yarn_original_context,
                    "YaRN: the context the model was trained for (default: the file's)")
        ->check(CLI::PositiveNumber);
  }
  model::LoadOptions load_options() const {
    if (prefill_dots != kernels::PrefillDots::kF32 && device == "cpu" &&
        !kernels::bf16_attention_supported()) {
      fmt::print(stderr,
                 "sieve: --prefill-attention {}: this CPU has no AVX512-BF16 dot products (or "
                 "runs another SIMD target); prompts' attention stays f32\n",
                 kernels::prefill_dots_name(prefill_dots));
    }
    model::ContextOverrides context;
    if (context_size > 0) context.context_length = context_size;
    if (!rope_scaling.empty()) context.rope_scaling = model::parse_rope_scaling(rope_scaling);
    if (rope_scale > 0.0f) context.rope_scale = rope_scale;
    if (yarn_original_context > 0) context.yarn_original_context = yarn_original_context;
    return {.model_path = model_path,
            .tokenizer_path = tokenizer_path,
            .backend = {.device = device, .threads = threads, .prefill_dots = prefill_dots},
            .context = context,
            .quantize = quantize};
  }
};

}  // namespace sieve::cli
