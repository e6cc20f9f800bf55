// `sieve gen-model`: write a deterministic random-weight Llama GGUF for tests and benchmarks.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "cli/commands.h"
#include "model/model_file.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct GenModelOptions {
  model::RandomModelSpec spec;
  std::string type = "f16";
  std::string out_path;
  int threads = 0;
  bool json = false;
};

void gen_model(GenModelOptions options) {
  std::optional<kernels::DType> dtype = model::parse_dtype(options.type);
  if (!dtype) fail("unknown type '{}' (choose f32, f16, bf16, q8_0 or q4_0)", options.type);
  options.spec.dtype = *dtype;
  ThreadPool pool(options.threads);
  model::write_random_model(options.spec, options.out_path, pool);
  const uintmax_t bytes = std::filesystem::file_size(options.out_path);
  if (options.json) {
    const model::RandomModelSpec& s = options.spec;
    nlohmann::json out = {{"path", options.out_path},
                          {"bytes", bytes},
                          {"type", kernels::to_string(s.dtype)},
                          {"dim", s.dim},
                          {"layers", s.num_layers},
                          {"heads", s.num_heads},
                          {"kv_heads", s.num_kv_heads},
                          {"ffn", s.ffn_dim},
                          {"ctx", s.context_length},
                          {"rope_base", s.rope_base},
                          {"seed", s.seed}};
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print(stderr, "wrote {} ({:.1f} MB)\n", options.out_path, bytes / 1e6);
  }
}

}  // namespace

void add_gen_model_command(CLI::App& app) {
  auto options = std::make_shared<GenModelOptions>();
  model::RandomModelSpec& spec = options->spec;
  CLI::App* command = app.add_subcommand(
      "gen-model", "Write a deterministic random-weight Llama GGUF with a real vocabulary");
  command->add_option("--dim", spec.dim, "Embedding size")->capture_default_str();
  command->add_option("--layers", spec.num_layers, "Layers")->capture_default_str();
  command->add_option("--heads", spec.num_heads, "Attention heads")->capture_default_str();
  command->add_option("--kv-heads", spec.num_kv_heads, "Key/value heads (GQA)")
      ->capture_default_str();
  command->add_option("--ffn", spec.ffn_dim, "Feed-forward size")->capture_default_str();
  command->add_option("--ctx", spec.context_length, "Context length")->capture_default_str();
  command->add_option("--rope-base", spec.rope_base, "RoPE frequency base")->capture_default_str();
  command->add_option("--type", options->type, "Weight type: f32, f16, bf16, q8_0, q4_0")
      ->capture_default_str();
  command->add_option("--vocab", spec.vocab_path, "GGUF file to copy the tokenizer from")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--seed", spec.seed, "Random seed")->capture_default_str();
  command->add_option("-o,--output", options->out_path, "Output GGUF path")->required();
  command->add_option("-t,--threads", options->threads, "Worker threads (default: all cores)");
  command->add_flag("--json", options->json, "Print what was written as JSON");
  command->callback([options] { gen_model(*options); });
}

}  // namespace sieve::cli
