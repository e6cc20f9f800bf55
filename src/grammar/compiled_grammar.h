#pragma once
// A grammar flattened for matching, and the pushdown automaton that runs on it.
//
// Recognizer: llama.cpp's design, a nondeterministic pushdown automaton holding a *set of
// stacks*. A stack lists element positions still to match, bottom first; its top is always a
// character class once expanded (or the stack is empty: the text may end there). A character
// moves each stack whose top class holds it past that class and re-expands it; stacks that
// cannot take the character drop out. Why this and not Earley: the mask needs to run the
// automaton over every byte of a vocabulary trie, and with right-recursive repetitions (see
// grammar.h) and tail positions not pushed, the stacks stay short and few, so one step is a
// few small vector copies, and a stack's *top few positions* are a good cache key for the
// token masks (token_masker.h). Left recursion, which this design cannot run, is refused when
// the grammar is parsed.
//
// Layout: all alternatives back to back, each closed by kEnd:
//   [0]: Rule(root) kEnd   (the start)
//   then per rule, per alternative: elements... kEnd
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace sieve::grammar {

struct CharClass {
  uint64_t ascii[2] = {0, 0};  // bit c: code point c < 128 is in the class
  std::vector<CharRange> ranges;
  bool contains(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    for (const CharRange& r : ranges) {
      if (cp < r.lo) return false;
      if (cp <= r.hi) return true;
    }
    return false;
  }
  bool intersects(uint32_t lo, uint32_t hi) const {
    for (const CharRange& r : ranges) {
      if (r.lo <= hi && lo <= r.hi) return true;
    }
    return false;
  }
};

enum class ElementKind : uint8_t { kChar, kRule, kEnd };

struct FlatElement {
  ElementKind kind = ElementKind::kEnd;
  uint32_t arg = 0;  // kChar: class index; kRule: rule index
};

class CompiledGrammar {
 public:
  explicit CompiledGrammar(Grammar grammar);
  // parse_gbnf + compile; throws sieve::Error.
  static std::shared_ptr<const CompiledGrammar> from_gbnf(std::string_view text);

  const Grammar& grammar() const { return grammar_; }
  const FlatElement& element(uint32_t pos) const { return elements_[pos]; }
  const CharClass& char_class(uint32_t idx) const { return classes_[idx]; }
  std::span<const uint32_t> alternatives(uint32_t rule_idx) const { return rule_alts_[rule_idx]; }
  size_t num_elements() const { return elements_.size(); }

  static constexpr uint32_t kStartPos = 0;

 private:
  Grammar grammar_;
  std::vector<FlatElement> elements_;
  std::vector<CharClass> classes_;
  std::vector<std::vector<uint32_t>> rule_alts_;  // per rule: first position of each alternative
};

namespace detail {

// Marks the bottom of a stack cut down to its top few positions (token_masker.cc): reaching it
// means the text went on into what lay below the cut.
inline constexpr uint32_t kCut = 0xFFFFFFFFu;

// Bytes of a code point seen so far: the code points they can start lie in [lo(), hi()].
struct Utf8Partial {
  uint32_t value = 0;     // payload bits so far
  uint8_t remaining = 0;  // continuation bytes still to come; 0: at a code point boundary
  uint8_t length = 0;     // bytes of the whole sequence
  bool active() const { return remaining != 0; }
  uint32_t lo() const;
  uint32_t hi() const;
  friend bool operator==(const Utf8Partial&, const Utf8Partial&) = default;
};

// At most this many stacks: an ambiguous grammar (e.g. `(x+ x+)*`) can reach a number of
// stacks that grows with every character, which would make each step (and a mask walk) slow.
// Adding one more throws sieve::Error "grammar too ambiguous". JSON grammars need under 10.
inline constexpr size_t kMaxStacks = 128;

// A set of stacks, stored back to back as [n, pos_0 .. pos_{n-1}] (pos_{n-1} is the top), with
// no duplicates.
class StackSet {
 public:
  void clear() {
    data_.clear();
    hashes_.clear();
  }
  bool empty() const { return hashes_.empty(); }
  size_t size() const { return hashes_.size(); }
  void add(std::span<const uint32_t> stack);
  template <typename F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < data_.size();) {
      const uint32_t n = data_[i];
      f(std::span<const uint32_t>(data_.data() + i + 1, n));
      i += n + 1;
    }
  }
  const std::vector<uint32_t>& data() const { return data_; }
  friend bool operator==(const StackSet& a, const StackSet& b) { return a.data_ == b.data_; }

 private:
  std::vector<uint32_t> data_;
  std::vector<uint64_t> hashes_;
};

// Adds the expansions of `stack` (its top may be a rule or a continuation) to out: stacks whose
// tops are characters, the empty stack (the text may end) or kCut. `stack` is restored.
void expand(const CompiledGrammar& g, std::vector<uint32_t>& stack, StackSet& out);

// One byte: out = the stacks of `in` that survive it (stacks topped by a character only).
// Returns false when none does.
bool advance_byte(const CompiledGrammar& g, const StackSet& in, const Utf8Partial& partial,
                  uint8_t byte, StackSet& out, Utf8Partial& out_partial,
                  std::vector<uint32_t>& scratch);

// Stacks of the start state.
StackSet initial_stacks(const CompiledGrammar& g);

}  // namespace detail
}  // namespace sieve::grammar
