#include "model/loader.h"

#include <fstream>

#include "gguf/gguf.h"
#include "util/error.h"

namespace sieve::model {

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}'", path);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

std::shared_ptr<const tok::Tokenizer> load_tokenizer(const LoadOptions& options) {
  if (is_gguf_file(options.model_path)) {
    gguf::File file = gguf::File::open(options.model_path);
    return tok::Tokenizer::create(tok::load_vocab(file));
  }
  return load_model(options).tokenizer;
}

LoadedModel load_model(const LoadOptions& options) {
  LoadedModel loaded;
  if (is_gguf_file(options.model_path)) {
    auto file = std::make_shared<const gguf::File>(gguf::File::open(options.model_path));
    ModelConfig config = config_from_gguf(*file);
    loaded.tokenizer = tok::Tokenizer::create(tok::load_vocab(*file));
    Weights weights = weights_from_gguf(file, config);
    loaded.model = std::make_shared<const LlamaModel>(std::move(config), std::move(weights));
  } else {
    if (options.tokenizer_path.empty()) {
      fail("'{}' is not a GGUF file; for a llama2.c checkpoint also give its tokenizer file "
           "(--tokenizer tok512.bin)", options.model_path);
    }
    Llama2cModel checkpoint = load_llama2c_checkpoint(options.model_path);
    loaded.tokenizer = tok::Tokenizer::create(
        tok::load_llama2c_vocab(options.tokenizer_path, checkpoint.config.vocab_size));
    loaded.model = std::make_shared<const LlamaModel>(std::move(checkpoint.config),
                                                      std::move(checkpoint.weights));
  }
  const int64_t vocab = loaded.model->config().vocab_size;
  if (static_cast<int64_t>(loaded.tokenizer->vocab().size()) != vocab) {
    fail("tokenizer has {} tokens but the model's output has {}", loaded.tokenizer->vocab().size(), vocab);
  }
  return loaded;
}

}  // namespace sieve::model
