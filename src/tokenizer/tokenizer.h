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

#include "gguf/gguf.h"

namespace sieve::gguf {
class File;
}

namespace sieve::tok {

using TokenId = int32_t;

// tokenizer.ggml.token_type values.
using TokenType = gguf::TokenType;

enum class VocabKind { kSpm, kBpe };

// How an added token (special or user-defined) is found in the input, as a Hugging Face
// tokenizer.json's added_tokens flags say: lstrip / rstrip: the token takes the white space
// (Unicode White_Space) before / after its text with it, so that white space is not tokenized;
// single_word: the text is the token only where neither neighbouring character is a letter or
// a digit (Unicode Alphabetic or Numeric). GGUF: tokenizer.sieve.added_token_flags (sieve's own
// key: llama.cpp has none), an int32 per token, the sum of the bits below.
struct AddedTokenFlags {
  static constexpr int32_t kLstripBit = 1;
  static constexpr int32_t kRstripBit = 2;
  static constexpr int32_t kSingleWordBit = 4;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;

  int32_t bits() const {
    return (lstrip ? kLstripBit : 0) | (rstrip ? kRstripBit : 0) |
           (single_word ? kSingleWordBit : 0);
  }
  bool any() const { return lstrip || rstrip || single_word; }
  friend bool operator==(const AddedTokenFlags&, const AddedTokenFlags&) = default;
};

struct Vocab {
  VocabKind kind = VocabKind::kSpm;
  std::string pre;                  // tokenizer.ggml.pre ("default" when absent)
  std::vector<std::string> tokens;  // piece text as stored (SPM uses U+2581 for space)
  std::vector<float> scores;        // SPM merge scores (empty for BPE)
  std::vector<TokenType> types;
  std::vector<std::string> merges;  // BPE: "left right", by rank
  std::optional<TokenId> bos, eos, unk, pad, eot;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = true;  // SPM: prepend a space to the text
  // Compose the text (Unicode NFC) before tokenizing it, as a Hugging Face tokenizer.json with
  // the NFC normalizer does (Qwen's). GGUF key tokenizer.sieve.normalizer = "NFC": sieve's own,
  // since llama.cpp's tokenizers ignore the normalizer and have no key for it.
  bool normalize_nfc = false;
  // Per token, or empty when every added token matches its text exactly (no flags).
  std::vector<AddedTokenFlags> added_token_flags;
  size_t size() const { return tokens.size(); }
  friend bool operator==(const Vocab&, const Vocab&) = default;
};

// Reads tokenizer.ggml.* keys. Throws sieve::Error with the key name when data is missing or
// inconsistent (e.g. scores/types arrays of a different length than tokens, ids out of range).
// Defaults follow llama.cpp: "llama" vocabularies add BOS and a space prefix and default to
// unk/bos/eos = 0/1/2; "gpt2" ones add BOS only for the llama3 pre-tokenizers.
// tokenizer.sieve.normalizer may be "NFC" (see Vocab::normalize_nfc); any other value throws. A
// special-token id of 0xFFFFFFFF (or -1) means "none". Token types outside the enum read as
// kUndefined. tokenizer.sieve.added_token_flags, when present, has one entry per token with
// no bits but AddedTokenFlags' (else it throws).
Vocab load_vocab(const gguf::File& file);
// Reads a llama2.c tokenizer file (e.g. tok512.bin): i32 max_token_length, then per token
// f32 score, i32 length, bytes. Produces the same SPM vocabulary as the GGUF conversion.
// Ids 0, 1, 2 become <unk>, <s>, </s> (llama2.c stores "\n<s>\n" etc.), "<0xXX>" pieces are
// byte tokens, spaces become U+2581; bos/eos/unk = 1/2/0. Bytes after the last token are
// ignored. Throws sieve::Error naming the file and token on truncated or malformed data.
Vocab load_llama2c_vocab(const std::string& path, size_t vocab_size);

// Checks the invariants every tokenizer relies on: parallel arrays of equal length (scores may
// be empty, meaning all 0; added_token_flags too, meaning none), no NaN score, unique token texts,
// special ids in range, BOS/EOS ids present when they are to be added. Throws sieve::Error saying
// what is wrong. Tokenizer::create calls it.
void validate(const Vocab& vocab);

struct EncodeOptions {
  bool add_special = true;     // add BOS/EOS as the vocabulary says
  bool parse_special = false;  // recognise special-token text (e.g. "<|eot_id|>") in the input
  // The text continues text encoded before it (the rest of a prompt after ids kept as they
  // were): SPM puts no space in front of its start.
  bool continues = false;
};

// Thread-safe: all methods are const and keep no per-call state in the object.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Validates the vocabulary (see validate()) and builds the SPM or BPE tokenizer; for BPE also
  // compiles the pre-tokenizer, so an unknown tokenizer.ggml.pre throws sieve::Error here.
  static std::unique_ptr<Tokenizer> create(Vocab vocab);

  virtual std::vector<TokenId> encode(std::string_view text, EncodeOptions options = {}) const = 0;
  // The bytes a token stands for (U+2581 -> ' ', <0x0A> -> '\n', byte-level BPE unmapped).
  // Control tokens give "" unless render_special.
  virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
  // Concatenated pieces; SPM strips the single leading space that encode() added at the start
  // of the text: from the first piece, or from the second when the first token is BOS (unlike
  // llama.cpp's detokenize, which keeps it after BOS). No clean-up of spaces before
  // punctuation (llama.cpp's clean_spaces) is done, so decode(encode(text)) == text for all
  // valid UTF-8 (SPM: without U+2581, which SPM cannot tell from a space; BPE: malformed bytes
  // come back as U+FFFD; not the white space an lstrip/rstrip added token took with it). Ids
  // out of range throw sieve::Error.
  virtual std::string decode(std::span<const TokenId> ids, bool render_special = false) const = 0;

  const Vocab& vocab() const { return vocab_; }
  bool is_control(TokenId id) const;
  // End of generation: EOS, EOT, and control tokens named like an end of turn/text
  // ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<end_of_turn>", ...), as llama.cpp does.
  bool is_eog(TokenId id) const;
  std::span<const TokenId> eog_ids() const { return eog_ids_; }  // sorted
  // Token classes for KV sparsity (FastGen keeps special and punctuation tokens). Special: a
  // control or user-defined token (BOS, EOS, chat markers). Punctuation: the token's piece
  // holds at least one Unicode punctuation character (\p{P}) and otherwise only white space
  // ("." "," " ?" "!\n"; not "$" or "a."). From a table built once; false for ids out of range.
  bool is_special(TokenId id) const;
  bool is_punctuation(TokenId id) const;

 protected:
  explicit Tokenizer(Vocab vocab);
  Vocab vocab_;
  std::vector<bool> punctuation_;  // per id; filled by the subclass once pieces are known

 private:
  std::vector<TokenId> eog_ids_;
};

}  // namespace sieve::tok
