#pragma once
// Compiled grammars and their mask tables, per model, keyed by what the request sent: the
// sampler asks this cache for a TokenMasker, so a schema is compiled once and its masks' key
// tables (token_masker.h) are shared by every request that sends it again. Thread-safe.
//
//   GrammarCache cache(Vocabulary::from_tokenizer(tokenizer));              // once per model
//   auto masker = cache.get({GrammarKind::kJsonSchema, schema_text});       // per request
//   GrammarState state = masker->new_state();                               // per sequence
//   each step: masker->fill_mask(state, mask); sample from mask; masker->accept_token(state, id)
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/token_masker.h"

namespace sieve::grammar {

enum class GrammarKind : uint8_t {
  kGbnf,        // text: a GBNF grammar (grammar.h)
  kJsonObject,  // any JSON object; text unused
  kJsonSchema,  // text: a JSON Schema (json_schema.h)
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kGbnf;
  std::string text;
};

// GBNF text for a spec; throws sieve::Error (the message is meant for the client: a 400).
std::string spec_to_gbnf(const GrammarSpec& spec);

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 64,
                        MaskerOptions options = {});

  // The masker for the spec, compiled on a miss (outside the lock); throws sieve::Error for a
  // bad grammar or schema. Least recently used entries go beyond `capacity`. JSON Schemas are
  // keyed by their parsed content (whitespace and number spelling do not matter; key order
  // does, as properties are written in declared order).
  std::shared_ptr<const TokenMasker> get(const GrammarSpec& spec);

  size_t size() const;
  size_t num_compiled() const;  // misses so far

 private:
  std::shared_ptr<const Vocabulary> vocabulary_;
  size_t capacity_;
  MaskerOptions options_;
  mutable std::mutex mutex_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const TokenMasker> masker;
    std::list<std::string>::iterator lru_pos;
  };
  std::unordered_map<std::string, Entry> entries_;
  size_t num_compiled_ = 0;
};

}  // namespace sieve::grammar
