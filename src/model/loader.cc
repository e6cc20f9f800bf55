#include "model/loader.h"

#include <filesystem>
#include <fstream>

#include "gguf/gguf.h"
#include "hf/hf_model.h"
#include "hf/hf_tokenizer.h"
#include "model/llama.h"
#include "model/model_file.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::model {

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}'", path);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

gguf::File open_model_file(const std::string& path) {
  if (hf::is_model_folder(path)) return hf::open_model_folder(path);
  return gguf::File::open(path);
}

namespace {

// The tokenizer a GGUF file (or a folder read as one) describes.
tok::Vocab vocab_of(const gguf::File& file, const std::string& path) {
  if (hf::is_model_folder(path) && !file.find("tokenizer.ggml.model")) {
    fail("'{}' has no tokenizer.json: sieve needs the folder's tokenizer beside its weights",
         hf::model_folder(path));
  }
  return tok::load_vocab(file);
}

}  // namespace

std::shared_ptr<const tok::Tokenizer> load_tokenizer(const LoadOptions& options) {
  if (hf::is_model_folder(options.model_path)) {
    // The tokenizer files alone: the weights are not opened.
    return tok::Tokenizer::create(
        vocab_of(hf::open_tokenizer_folder(options.model_path), options.model_path));
  }
  if (is_gguf_file(options.model_path)) {
    return tok::Tokenizer::create(
        vocab_of(gguf::File::open(options.model_path), options.model_path));
  }
  return load_model(options).tokenizer;
}

namespace {

// LoadOptions::quantize: the file's weights converted in memory.
std::shared_ptr<const gguf::File> quantize_at_load(std::shared_ptr<const gguf::File> file,
                                                   const LoadOptions& options) {
  const std::optional<QuantMix> mix = parse_quant_mix(options.quantize);
  if (!mix) {
    std::string names;
    for (const QuantMix& m : quant_mixes())
      names += (names.empty() ? "" : ", ") + std::string(m.name);
    fail("--quantize {}: not a quantization sieve writes (choose one of {})", options.quantize,
         names);
  }
  ThreadPool pool(options.backend.threads);
  return std::make_shared<const gguf::File>(quantize_file(std::move(file), *mix, pool).file);
}

// Reads one byte per page of every tensor so the mapping is resident, reporting progress.
void touch_tensors(const gguf::File& file, const std::function<void(double)>& on_progress) {
  uint64_t total = 0;
  for (const gguf::TensorInfo& tensor : file.tensors()) total += file.tensor_data(tensor).size();
  uint64_t done = 0;
  volatile uint8_t sink = 0;
  constexpr size_t kPage = 4096;
  constexpr uint64_t kReportEvery = 64ull << 20;
  uint64_t next_report = 0;
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    std::span<const uint8_t> data = file.tensor_data(tensor);
    for (size_t i = 0; i < data.size(); i += kPage) sink = sink + data[i];
    done += data.size();
    if (on_progress && done >= next_report) {
      on_progress(total == 0 ? 1.0 : static_cast<double>(done) / total);
      next_report = done + kReportEvery;
    }
  }
  if (on_progress) on_progress(1.0);
}

}  // namespace

LoadedModel load_model(const LoadOptions& options) {
  std::shared_ptr<kernels::Backend> backend =
      options.shared_backend ? options.shared_backend : kernels::make_backend(options.backend);
  LoadedModel loaded;
  loaded.name = std::filesystem::path(options.model_path).filename().string();
  if (hf::is_model_folder(options.model_path) || is_gguf_file(options.model_path)) {
    auto file = std::make_shared<const gguf::File>(open_model_file(options.model_path));
    if (!options.quantize.empty()) file = quantize_at_load(std::move(file), options);
    if (auto name = file->get_string("general.name"); name && !name->empty()) loaded.name = *name;
    loaded.chat_template = file->get_string("tokenizer.chat_template");
    ModelConfig config = config_from_gguf(*file);
    apply_context_overrides(config, options.context);
    loaded.tokenizer = tok::Tokenizer::create(vocab_of(*file, options.model_path));
    Weights weights = weights_from_gguf(file, config);
    if (options.on_progress) touch_tensors(*file, options.on_progress);
    loaded.model = std::make_shared<const LlamaModel>(std::move(config), std::move(weights),
                                                      std::move(backend));
  } else {
    if (!options.quantize.empty()) {
      fail(
          "'{}': --quantize converts GGUF files and Hugging Face folders, not llama2.c checkpoints",
          options.model_path);
    }
    if (options.tokenizer_path.empty()) {
      fail(
          "'{}' is not a GGUF file; for a llama2.c checkpoint also give its tokenizer file "
          "(--tokenizer tok512.bin)",
          options.model_path);
    }
    Llama2cModel checkpoint = load_llama2c_checkpoint(options.model_path);
    apply_context_overrides(checkpoint.config, options.context);
    loaded.tokenizer = tok::Tokenizer::create(
        tok::load_llama2c_vocab(options.tokenizer_path, checkpoint.config.vocab_size));
    loaded.model = std::make_shared<const LlamaModel>(
        std::move(checkpoint.config), std::move(checkpoint.weights), std::move(backend));
    if (options.on_progress) options.on_progress(1.0);
  }
  const int64_t vocab = loaded.model->config().vocab_size;
  if (static_cast<int64_t>(loaded.tokenizer->vocab().size()) != vocab) {
    fail("tokenizer has {} tokens but the model's output has {}", loaded.tokenizer->vocab().size(),
         vocab);
  }
  return loaded;
}

}  // namespace sieve::model
