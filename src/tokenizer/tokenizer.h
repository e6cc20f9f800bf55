#pragma once
// Tokenizers built from GGUF metadata (tokenizer.ggml.*) or from a llama2.c tokenizer file:
//   - "llama": SentencePiece-style BPE over scores, with byte fallback and a leading space.
//   - "gpt2":  byte-level BPE over merges, with the pre-tokenizer split rules selected by
//              tokenizer.ggml.pre (llama3, qwen2, gpt-2, deepseek-llm, deepseek-coder, falcon,
//              starcoder, mpt, refact, ...).
// Special/control tokens, BOS/EOS handling and detokenization live here too.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::gguf {
class File;
}

namespace sieve::tok {

using TokenId = int32_t;

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

enum class VocabKind { kSpm, kBpe };

struct Vocab {
  VocabKind kind = VocabKind::kSpm;
  std::string pre;  // tokenizer.ggml.pre ("default" when absent)
  std::vector<std::string> tokens;       // piece text as stored (SPM uses U+2581 for space)
  std::vector<float> scores;             // SPM merge scores (empty for BPE)
  std::vector<TokenType> types;
  std::vector<std::string> merges;       // BPE: "left right", by rank
  std::optional<TokenId> bos, eos, unk, pad, eot;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = true;          // SPM: prepend a space to the text
  size_t size() const { return tokens.size(); }
};

// Reads tokenizer.ggml.* keys. Throws sieve::Error with the key name when data is missing or
// inconsistent (e.g. scores/types arrays of a different length than tokens, ids out of range).
Vocab load_vocab(const gguf::File& file);
// Reads a llama2.c tokenizer file (e.g. tok512.bin): i32 max_token_length, then per token
// f32 score, i32 length, bytes. Produces the same SPM vocabulary as the GGUF conversion.
Vocab load_llama2c_vocab(const std::string& path, size_t vocab_size);

struct EncodeOptions {
  bool add_special = true;    // add BOS/EOS as the vocabulary says
  bool parse_special = false; // recognise special-token text (e.g. "<|eot_id|>") in the input
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static std::unique_ptr<Tokenizer> create(Vocab vocab);

  virtual std::vector<TokenId> encode(std::string_view text, EncodeOptions options = {}) const = 0;
  // The bytes a token stands for (U+2581 -> ' ', <0x0A> -> '\n', byte-level BPE unmapped).
  // Control tokens give "" unless render_special.
  virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
  // Concatenated pieces; SPM strips the single leading space that encode() added when the
  // first token is at the start of the text (as llama.cpp does with remove_special).
  virtual std::string decode(std::span<const TokenId> ids, bool render_special = false) const = 0;

  const Vocab& vocab() const { return vocab_; }
  bool is_control(TokenId id) const;
  bool is_eog(TokenId id) const;  // end of generation: EOS, EOT

 protected:
  explicit Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
  Vocab vocab_;
};

}  // namespace sieve::tok
