#pragma once
// Options shared by the commands that load a model.
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <string>

#include "model/loader.h"

namespace sieve::cli {

struct ModelOptions {
  std::string model_path;
  std::string tokenizer_path;
  int threads = 0;  // 0: all hardware threads
  std::string device = "cpu";

  void add_to(CLI::App& command) {
    command.add_option("-m,--model", model_path, "Model file: GGUF, or a llama2.c .bin checkpoint")
        ->required()
        ->check(CLI::ExistingFile);
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
  }
  model::LoadOptions load_options() const {
    return {.model_path = model_path,
            .tokenizer_path = tokenizer_path,
            .backend = {.device = device, .threads = threads}};
  }
};

}  // namespace sieve::cli
