// libFuzzer target for the tokenizers: arbitrary bytes as text through the three reference
// vocabularies (SPM llama, byte-level BPE gpt-2 and deepseek-llm).
//
// Findings are crashes, sanitizer reports, and broken invariants (abort):
//   - every id is in range and decodes;
//   - decode(encode(text)) == text for valid UTF-8 text, with and without BOS/EOS (SPM: unless
//     the text holds U+2581, which SPM cannot tell from an escaped space);
//   - BPE with parse_special: decode(ids, render_special) == text (special pieces are their text).
//
// Vocabularies are read from $SIEVE_SHARED_DIR/golden/tokenizer, else ../shared/golden/tokenizer
// relative to the working directory.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using sieve::tok::EncodeOptions;
using sieve::tok::TokenId;
using sieve::tok::Tokenizer;

struct Loaded {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
};

std::vector<Loaded> load_all() {
  const char* env = std::getenv("SIEVE_SHARED_DIR");
  const std::filesystem::path shared = env != nullptr ? env : "../shared";
  std::vector<Loaded> out;
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm"}) {
    const auto path =
        shared / "golden" / "tokenizer" / (std::string("ggml-vocab-") + name + ".gguf");
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr,
                   "tokenizer_fuzz: missing %s\n  set SIEVE_SHARED_DIR to the shared data folder "
                   "or run from a directory next to it (default ../shared)\n",
                   path.c_str());
      std::abort();
    }
    try {
      const sieve::gguf::File file = sieve::gguf::File::open(path.string());
      out.push_back({name, Tokenizer::create(sieve::tok::load_vocab(file))});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tokenizer_fuzz: cannot load %s: %s\n", path.c_str(), e.what());
      std::abort();
    }
  }
  return out;
}

[[noreturn]] void finding(const Loaded& loaded, const char* what, std::string_view text,
                          const std::string& decoded) {
  std::fprintf(stderr, "tokenizer_fuzz: %s: %s\n  input   (%zu bytes)\n  decoded (%zu bytes)\n",
               loaded.name.c_str(), what, text.size(), decoded.size());
  std::abort();
}

void check_ids(const Loaded& loaded, const std::vector<TokenId>& ids, std::string_view text) {
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= loaded.tokenizer->vocab().size()) {
      finding(loaded, "token id out of range", text, "");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Loaded> tokenizers = load_all();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid_utf8 = sieve::tok::unicode::is_valid_utf8(text);
  const bool has_spm_space = text.find(sieve::tok::unicode::kSpmSpace) != std::string_view::npos;

  for (const Loaded& loaded : tokenizers) {
    const Tokenizer& tokenizer = *loaded.tokenizer;
    const bool spm = tokenizer.vocab().kind == sieve::tok::VocabKind::kSpm;
    const bool expect_round_trip = valid_utf8 && !(spm && has_spm_space);

    for (bool add_special : {false, true}) {
      const auto ids = tokenizer.encode(text, EncodeOptions{.add_special = add_special});
      check_ids(loaded, ids, text);
      const std::string decoded = tokenizer.decode(ids);
      if (expect_round_trip && decoded != text) {
        finding(loaded,
                add_special ? "decode(encode(text, add_special)) != text"
                            : "decode(encode(text)) != text",
                text, decoded);
      }
    }

    const auto special =
        tokenizer.encode(text, EncodeOptions{.add_special = false, .parse_special = true});
    check_ids(loaded, special, text);
    const std::string rendered = tokenizer.decode(special, /*render_special=*/true);
    if (!spm && valid_utf8 && rendered != text) {
      finding(loaded, "decode(encode(text, parse_special), render_special) != text", text,
              rendered);
    }
    for (TokenId id : special) (void)tokenizer.token_to_piece(id, true);
    (void)tokenizer.decode(special);
  }
  return 0;
}
