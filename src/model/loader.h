#pragma once
// Loads a model and its tokenizer from a GGUF file, or from a llama2.c checkpoint plus its
// tokenizer file. Both produce the same in-memory LlamaModel.
#include <memory>
#include <string>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace sieve::model {

struct LoadOptions {
  std::string model_path;      // .gguf, or a llama2.c .bin checkpoint
  std::string tokenizer_path;  // llama2.c tokenizer .bin (required for llama2.c checkpoints)
};

struct LoadedModel {
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const tok::Tokenizer> tokenizer;
};

// Throws sieve::Error with a clear message (bad file, unsupported architecture or tensor type).
LoadedModel load_model(const LoadOptions& options);

// The tokenizer alone (works on vocabulary-only GGUF files).
std::shared_ptr<const tok::Tokenizer> load_tokenizer(const LoadOptions& options);

bool is_gguf_file(const std::string& path);

}  // namespace sieve::model
