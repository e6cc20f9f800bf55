#pragma once
// Each subcommand registers its options and callback on the top-level app.
#include <CLI/CLI.hpp>

namespace sieve::cli {

void add_run_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_gen_model_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_batch_command(CLI::App& app);
void add_bench_engine_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_bench_serve_command(CLI::App& app);
void add_soak_command(CLI::App& app);

}  // namespace sieve::cli
