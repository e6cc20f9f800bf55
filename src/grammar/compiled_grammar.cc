#include "grammar/compiled_grammar.h"

#include <algorithm>

#include "util/error.h"

namespace sieve::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar) : grammar_(std::move(grammar)) {
  elements_.push_back({ElementKind::kRule, grammar_.root_idx});
  elements_.push_back({ElementKind::kEnd, 0});
  rule_alts_.resize(grammar_.rules.size());
  for (size_t r = 0; r < grammar_.rules.size(); ++r) {
    for (const Sequence& seq : grammar_.rules[r].alternatives) {
      rule_alts_[r].push_back(static_cast<uint32_t>(elements_.size()));
      for (const Element& e : seq) {
        if (e.kind == Element::Kind::kRule) {
          elements_.push_back({ElementKind::kRule, e.rule_idx});
          continue;
        }
        CharClass cls;
        cls.ranges = e.ranges;
        for (const CharRange& range : e.ranges) {
          for (uint32_t c = range.lo; c <= std::min<uint32_t>(range.hi, 127); ++c) {
            cls.ascii[c >> 6] |= uint64_t{1} << (c & 63);
          }
        }
        elements_.push_back({ElementKind::kChar, static_cast<uint32_t>(classes_.size())});
        classes_.push_back(std::move(cls));
      }
      elements_.push_back({ElementKind::kEnd, 0});
    }
  }
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::from_gbnf(std::string_view text) {
  return std::make_shared<const CompiledGrammar>(parse_gbnf(text));
}

namespace detail {
namespace {

constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};

// Moves the stack past its top character and re-expands it into out.
void pop_and_expand(const CompiledGrammar& g, std::span<const uint32_t> stack, StackSet& out,
                    std::vector<uint32_t>& scratch) {
  scratch.assign(stack.begin(), stack.end() - 1);
  const uint32_t next = stack.back() + 1;
  if (g.element(next).kind != ElementKind::kEnd) scratch.push_back(next);
  expand(g, scratch, out);
}

bool accept_code_point(const CompiledGrammar& g, const StackSet& in, uint32_t cp, StackSet& out,
                       std::vector<uint32_t>& scratch) {
  in.for_each([&](std::span<const uint32_t> stack) {
    if (stack.empty() || stack.back() == kCut) return;
    const FlatElement& top = g.element(stack.back());
    if (g.char_class(top.arg).contains(cp)) pop_and_expand(g, stack, out, scratch);
  });
  return !out.empty();
}

bool keep_viable(const CompiledGrammar& g, const StackSet& in, const Utf8Partial& p,
                 StackSet& out) {
  const uint32_t lo = p.lo();
  const uint32_t hi = p.hi();
  if (lo > hi) return false;
  in.for_each([&](std::span<const uint32_t> stack) {
    if (stack.empty() || stack.back() == kCut) return;
    if (g.char_class(g.element(stack.back()).arg).intersects(lo, hi)) out.add(stack);
  });
  return !out.empty();
}

}  // namespace

uint32_t Utf8Partial::lo() const {
  return std::max(value << (6 * remaining), kMinForLength[length]);
}

uint32_t Utf8Partial::hi() const {
  const uint32_t v = (value << (6 * remaining)) | ((uint32_t{1} << (6 * remaining)) - 1);
  return std::min(v, kMaxCodePoint);
}

void StackSet::add(std::span<const uint32_t> stack) {
  uint64_t h = 1469598103934665603ull ^ stack.size();
  for (uint32_t x : stack) h = (h ^ x) * 1099511628211ull;
  size_t offset = 0;
  for (uint64_t other : hashes_) {
    const uint32_t n = data_[offset];
    if (other == h && n == stack.size() &&
        std::equal(stack.begin(), stack.end(),
                   data_.begin() + static_cast<ptrdiff_t>(offset) + 1)) {
      return;
    }
    offset += n + 1;
  }
  if (hashes_.size() >= kMaxStacks) {
    fail(
        "grammar too ambiguous: the text so far can be parsed in more than {} ways (e.g. "
        "repetitions of repetitions over the same characters); make the grammar less ambiguous",
        kMaxStacks);
  }
  hashes_.push_back(h);
  data_.push_back(static_cast<uint32_t>(stack.size()));
  data_.insert(data_.end(), stack.begin(), stack.end());
}

void expand(const CompiledGrammar& g, std::vector<uint32_t>& stack, StackSet& out) {
  // Depth first over the rules at the top, each rule entered a frame on an explicit stack (a
  // chain of 10^5 rules, or of rules that match nothing, is 10^5 frames, not 10^5 calls). A frame
  // holds the stack as it was below the rule (base) while its alternatives are tried; when all
  // are, the stack is put back as it came.
  struct Frame {
    uint32_t top;  // the rule's position
    bool has_next;
    size_t base;
    std::span<const uint32_t> alternatives;
    size_t next_alt;
  };
  thread_local std::vector<Frame> frames;
  frames.clear();  // what a throw (StackSet::add: too many stacks) left
  // The top of the stack: a character or the end is a finished expansion; a rule is entered.
  const auto enter = [&] {
    if (stack.empty() || stack.back() == kCut) {
      out.add(stack);
      return;
    }
    const uint32_t top = stack.back();
    const FlatElement& e = g.element(top);
    if (e.kind == ElementKind::kChar) {
      out.add(stack);
      return;
    }
    // A rule: the continuation after it goes below, then each alternative on top.
    stack.pop_back();
    const bool has_next = g.element(top + 1).kind != ElementKind::kEnd;
    if (has_next) stack.push_back(top + 1);
    frames.push_back({top, has_next, stack.size(), g.alternatives(e.arg), 0});
  };
  enter();
  while (!frames.empty()) {
    Frame& f = frames.back();
    stack.resize(f.base);
    if (f.next_alt < f.alternatives.size()) {
      const uint32_t alt = f.alternatives[f.next_alt++];
      if (g.element(alt).kind != ElementKind::kEnd) stack.push_back(alt);
      enter();  // may add a frame: f is not used after it
      continue;
    }
    if (f.has_next) stack.pop_back();
    stack.push_back(f.top);
    frames.pop_back();
  }
  if (frames.capacity() > 4096) frames = {};  // a hostile chain's frames are not kept per thread
}

bool advance_byte(const CompiledGrammar& g, const StackSet& in, const Utf8Partial& partial,
                  uint8_t byte, StackSet& out, Utf8Partial& out_partial,
                  std::vector<uint32_t>& scratch) {
  out.clear();
  Utf8Partial p = partial;
  if (!p.active()) {
    if (byte < 0x80) {
      out_partial = {};
      return accept_code_point(g, in, byte, out, scratch);
    }
    if (byte >= 0xC2 && byte <= 0xDF) {
      p = {static_cast<uint32_t>(byte & 0x1F), 1, 2};
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      p = {static_cast<uint32_t>(byte & 0x0F), 2, 3};
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      p = {static_cast<uint32_t>(byte & 0x07), 3, 4};
    } else {
      return false;
    }
  } else {
    if ((byte & 0xC0) != 0x80) return false;
    p.value = (p.value << 6) | (byte & 0x3F);
    --p.remaining;
    if (!p.active()) {
      if (p.value < kMinForLength[p.length]) return false;  // overlong
      out_partial = {};
      return accept_code_point(g, in, p.value, out, scratch);  // classes hold no surrogates
    }
  }
  out_partial = p;
  return keep_viable(g, in, p, out);
}

StackSet initial_stacks(const CompiledGrammar& g) {
  StackSet out;
  std::vector<uint32_t> stack = {CompiledGrammar::kStartPos};
  expand(g, stack, out);
  return out;
}

}  // namespace detail
}  // namespace sieve::grammar
