#pragma once
// A Hugging Face folder's tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja)
// as the tokenizer.* keys llama.cpp's converter (convert_hf_to_gguf.py) writes into a GGUF, so
// that tok::load_vocab reads it like any GGUF's tokenizer and `sieve convert` writes it out:
//
//   tokenizer.json                                   tokenizer.ggml.model / pre
//   BPE, ByteLevel, Split regex R (or GPT-2's)       gpt2 / the family sieve knows R by
//   BPE + byte_fallback, "▁" normalizer, no regex    llama (SentencePiece-style) / default
//
//   model.vocab + added_tokens   tokens; token_type: special added -> control, other added ->
//                                user_defined, <0xNN> (llama) -> byte, model.unk_token ->
//                                unknown, ids no file names (config.json vocab_size) -> unused
//   model.merges                 gpt2: merges ("a b", from either of tokenizer.json's forms);
//                                llama: scores, -(rank of the first merge giving the token), the
//                                order in which SentencePiece-style merging then merges pairs
//   normalizer NFC               tokenizer.sieve.normalizer = "NFC" (sieve's key: llama.cpp
//                                ignores the normalizer; tok::Vocab::normalize_nfc)
//   added_tokens' lstrip, rstrip tokenizer.sieve.added_token_flags, int32 per token (sieve's
//   and single_word              key, written only when a token has one: tok::AddedTokenFlags)
//   tokenizer_config.json        bos/eos/unk/pad_token -> *_token_id; add_bos/eos_token (else
//                                the post_processor's TemplateProcessing); chat_template
//   config.json                  bos/eos_token_id when tokenizer_config.json names no bos/eos
//                                token (an id, or a list whose first id is the EOS: the others
//                                are generation_config.h's extra stop ids), else the ids the
//                                post_processor adds
//
// What sieve's tokenizers cannot do is refused, naming the file and the feature, rather than
// tokenized differently: another model type, a pre-tokenizer regex no family of sieve's has,
// normalizers and decoders other than the ones above.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace sieve::hf {

// The tokenizer.* keys of the folder's tokenizer files; empty when it has no tokenizer.json.
// vocab_size (config.json's) pads the token list with unused tokens up to the model's rows.
// Errors (sieve::Error) name the file and the field at fault.
std::vector<gguf::KeyValue> tokenizer_metadata(const std::string& folder,
                                               std::optional<uint64_t> vocab_size);

// The same from the files' texts (tests, fuzzing); an empty text is a file the folder lacks.
// `folder` only labels errors.
struct TokenizerTexts {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string chat_template_jinja;
  std::string config_json;  // only its bos_token_id / eos_token_id are read here
};
std::vector<gguf::KeyValue> tokenizer_metadata(const TokenizerTexts& texts,
                                               const std::string& folder,
                                               std::optional<uint64_t> vocab_size);

// A File of the folder's tokenizer keys alone (no weights are opened): what loading only the
// tokenizer of a folder reads. config.json's vocab_size, if any, pads the tokens.
gguf::File open_tokenizer_folder(const std::string& path);

}  // namespace sieve::hf
