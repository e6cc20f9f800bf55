// libFuzzer target for reading a Hugging Face tokenizer.json (src/hf/hf_tokenizer.h): the input
// is the file's text (a tokenizer_config.json naming its special tokens beside it).
//
// Properties checked, beyond "no crash, no sanitizer report":
//   - tokenizer_metadata either succeeds or throws sieve::Error; nothing else escapes;
//   - on success the keys load as a vocabulary or are refused with sieve::Error, and a loaded
//     tokenizer encodes a text into ids that are all in range.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gguf/gguf.h"
#include "hf/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string config = R"({"bos_token": "<s>", "eos_token": "</s>", "chat_template": "x"})";
  try {
    const sieve::gguf::File file = sieve::gguf::File::assemble(
        sieve::hf::tokenizer_metadata({text, config, ""}, "fuzz", 300), {}, nullptr);
    const auto tokenizer = sieve::tok::Tokenizer::create(sieve::tok::load_vocab(file));
    for (sieve::tok::TokenId id : tokenizer->encode(
             "Hello  world <s> 12345 \xE2\x96\x81 caf\xC3\xA9\xFF", {.parse_special = true})) {
      if (id < 0 || static_cast<size_t>(id) >= tokenizer->vocab().size()) __builtin_trap();
    }
  } catch (const sieve::Error&) {
  }
  return 0;
}
