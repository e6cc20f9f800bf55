#pragma once
// Loads a model and its tokenizer from a GGUF file, a Hugging Face folder (config.json +
// safetensors, read as the GGUF llama.cpp's converter would make of it: hf/hf_model.h), or a
// llama2.c checkpoint plus its tokenizer file, as a Model (a LlamaModel for every family sieve
// runs today).
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace sieve::gguf {
class File;
}

namespace sieve::model {

struct LoadOptions {
  std::string model_path;      // .gguf, a Hugging Face folder (or its .safetensors), or a
                               // llama2.c .bin checkpoint
  std::string tokenizer_path;  // llama2.c tokenizer .bin (required for llama2.c checkpoints)
  // Called while the weights are read into memory (fraction done, 0..1). Reading them at load
  // time (instead of on first use through the mapping) makes the first request as fast as the
  // rest and surfaces I/O errors before the server says it is ready.
  std::function<void(double fraction)> on_progress;
  // Where the model runs, chosen here once: the weights are prepared on this backend and every
  // op runs on it (Model::backend()); whoever runs the model uses that one.
  kernels::BackendOptions backend;
  // Set: the model runs on this backend instead of a new one made from `backend` (a draft model
  // beside its target, so the two share one set of worker threads and one memory).
  std::shared_ptr<kernels::Backend> shared_backend;
  // The served context and RoPE scaling, when not the file's.
  ContextOverrides context;
  // A `sieve quantize` target (q8_0, q4_k_m, ...; model/model_file.h): the weights are converted
  // at load, in memory, as `sieve quantize` would write them (vLLM's --quantization); empty: as
  // the file stores them. GGUF files and Hugging Face folders only.
  std::string quantize;
};

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const tok::Tokenizer> tokenizer;
  std::string name;  // general.name, else the file name
  std::optional<std::string>
      chat_template;  // tokenizer.chat_template (a folder: its tokenizer_config.json)
};

// Throws sieve::Error with a clear message (bad file, unsupported architecture or tensor type).
LoadedModel load_model(const LoadOptions& options);

// The tokenizer alone (works on vocabulary-only GGUF files).
std::shared_ptr<const tok::Tokenizer> load_tokenizer(const LoadOptions& options);

bool is_gguf_file(const std::string& path);

// A GGUF file, or a Hugging Face folder (or a .safetensors / index file in one) as GGUF: what
// loading, `sieve quantize` and `sieve convert` read. Throws sieve::Error naming the file.
gguf::File open_model_file(const std::string& path);

}  // namespace sieve::model
