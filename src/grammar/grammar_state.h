#pragma once
// The matching state of one sequence: where it stands in the grammar after the bytes accepted so
// far. Bytes, not tokens: a token's bytes may end inside a multi-byte UTF-8 character, and the
// state then keeps the partial character (the next token must complete it).
//
// Copies are explicit (fork()): for n > 1 choices, beam/speculative branches. A state is a few
// short stacks, so a fork costs about as much as copying a few dozen integers.
#include <memory>
#include <string_view>

#include "grammar/compiled_grammar.h"

namespace sieve::grammar {

class TokenMasker;

class GrammarState {
 public:
  explicit GrammarState(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarState(GrammarState&&) = default;
  GrammarState& operator=(GrammarState&&) = default;

  // Advances over all of `bytes`, or returns false and leaves the state as it was when the
  // grammar cannot take them. Empty input is accepted. Throws sieve::Error (state unchanged)
  // when a grammar is too ambiguous (detail::kMaxStacks).
  bool accept_bytes(std::string_view bytes);
  // True when the text so far is a complete sentence of the grammar (EOS allowed): no partial
  // character pending and some stack finished.
  bool can_end() const;
  // False once no character can follow (the grammar has finished; only EOS is left).
  bool can_continue() const;
  bool in_partial_char() const { return partial_.active(); }

  GrammarState fork() const { return GrammarState(*this); }
  const CompiledGrammar& grammar() const { return *grammar_; }
  // For TokenMasker; the stacks are an implementation detail.
  const detail::StackSet& stacks() const { return stacks_; }
  const detail::Utf8Partial& partial() const { return partial_; }

 private:
  GrammarState(const GrammarState&) = default;
  GrammarState& operator=(const GrammarState&) = default;

  std::shared_ptr<const CompiledGrammar> grammar_;
  detail::StackSet stacks_;
  detail::Utf8Partial partial_;
};

}  // namespace sieve::grammar
