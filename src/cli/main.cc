// sieve: serve Llama-family models on the CPU and keep only the KV cache that matters.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>

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
  sieve::cli::add_gen_model_command(app);
  sieve::cli::add_bench_command(app);
  sieve::cli::add_bench_engine_command(app);
  sieve::cli::add_serve_command(app);
  sieve::cli::add_bench_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
