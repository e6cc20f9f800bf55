// sieve: serve Llama-family models on the CPU and keep only the KV cache that matters.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "sieve - an LLM engine for Llama-family GGUF models on the CPU.\n"
      "Run `sieve COMMAND --help` for the options of a command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sieve 0.1.0");
  sieve::cli::add_run_command(app);
  sieve::cli::add_batch_command(app);
  sieve::cli::add_tokenize_command(app);
  sieve::cli::add_perplexity_command(app);
  sieve::cli::add_quantize_command(app);
  sieve::cli::add_convert_command(app);
  sieve::cli::add_gen_model_command(app);
  sieve::cli::add_bench_command(app);
  sieve::cli::add_bench_engine_command(app);
  sieve::cli::add_serve_command(app);
  sieve::cli::add_eval_command(app);
  sieve::cli::add_calibrate_command(app);
  sieve::cli::add_bench_serve_command(app);
  sieve::cli::add_soak_command(app);
  // `sieve bench serve ...` (the spelling vLLM users know) is `sieve bench-serve ...`.
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() > 2 && args[1] == "bench" && args[2] == "serve") {
    args.erase(args.begin() + 2);
    args[1] = "bench-serve";
  }
  std::vector<char*> arg_pointers;
  for (std::string& a : args) arg_pointers.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
