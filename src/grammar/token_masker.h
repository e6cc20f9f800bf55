#pragma once
// Allowed-token masks for one (grammar, vocabulary) pair. Shared by every sequence that uses the
// grammar; thread-safe (its caches take a mutex; the walks run outside it).
//
// How a mask is made, without testing every token from scratch (XGrammar's idea, on the stack
// set of grammar/compiled_grammar.h):
//   1. The mask of a state is the union of the masks of its stacks (the automaton is a union of
//      independent branches).
//   2. A stack's mask mostly depends only on its top few positions (`context_depth`): the
//      positions of the innermost rules, e.g. "inside a JSON string, before the closing quote".
//      For that *key* (top positions, a cut marker below them, any partial UTF-8 character) the
//      vocabulary trie is walked once with the cut stack, pruning every subtree the grammar
//      rejects, and the result is cached: the tokens accepted without reaching the cut, plus
//      the trie nodes where the cut was reached with bytes still to come.
//   3. Only those context-dependent subtrees (e.g. tokens `",` `"}` ending a string) are walked
//      again per state, with the real stack below the cut.
//   4. Whole states repeat (every character of a long string leaves the same state), so the
//      final mask is cached per state too.
// A mask is exact: a token is allowed iff the state accepts all its bytes (tests compare it with
// that brute force). Costs: a cold key walks the trie nodes its grammar positions accept (for
// "any string character": most of the vocabulary); warm, a mask is a hash lookup and a copy of
// vocab_size / 8 bytes.
//
// Dead ends: parse_gbnf refuses rules that can never finish and character classes that match
// nothing, so every state can be continued to a complete text; a vocabulary with a token for
// every byte (byte-level BPE; SentencePiece's <0xHH> tokens) then always leaves a token or EOS
// allowed. A vocabulary without them could strand a grammar: fill_mask returns the count so a
// caller can see an empty mask.
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_state.h"
#include "grammar/vocabulary.h"

namespace sieve::grammar {

struct MaskerOptions {
  uint32_t context_depth = 3;       // stack positions in a cache key (>= 1)
  size_t max_cached_states = 1024;  // whole-state masks kept (vocab_size / 8 bytes each); 0: none
};

struct MaskerStats {
  size_t num_keys = 0;          // key walks done
  size_t num_state_hits = 0;    // masks served from the whole-state cache
  size_t num_state_misses = 0;  // masks assembled from key tables
};

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const CompiledGrammar> grammar,
              std::shared_ptr<const Vocabulary> vocabulary, MaskerOptions options = {});

  GrammarState new_state() const { return GrammarState(grammar_); }
  // out := allowed tokens (resized to the vocabulary): text tokens whose bytes the state accepts,
  // and the EOG tokens iff state.can_end(). Returns the number of allowed tokens. Throws
  // sieve::Error for a grammar too ambiguous to run (compiled_grammar.h, kMaxStacks).
  size_t fill_mask(const GrammarState& state, TokenBitset& out) const;
  // Advances the state by a sampled token. An EOG token is accepted iff can_end() (the state is
  // left as is); a special token never. Returns false, state unchanged, when not allowed.
  bool accept_token(GrammarState& state, TokenId id) const;

  const CompiledGrammar& grammar() const { return *grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  MaskerStats stats() const;

 private:
  struct KeyTable {
    TokenBitset accepted;                // tokens accepted without reaching the cut
    std::vector<uint32_t> cut_subtrees;  // trie nodes reached at the cut, with tokens below
  };
  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  std::shared_ptr<const KeyTable> key_table(const std::vector<uint32_t>& key,
                                            std::span<const uint32_t> key_stack,
                                            const detail::Utf8Partial& partial) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  MaskerOptions options_;

  mutable std::mutex mutex_;
  mutable std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const KeyTable>, VectorHash>
      keys_;
  mutable std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const TokenBitset>, VectorHash>
      states_;
  mutable MaskerStats stats_;
};

}  // namespace sieve::grammar
