#include "grammar/grammar_state.h"

namespace sieve::grammar {

GrammarState::GrammarState(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), stacks_(detail::initial_stacks(*grammar_)) {}

bool GrammarState::accept_bytes(std::string_view bytes) {
  if (bytes.empty()) return true;
  detail::StackSet a = stacks_;
  detail::StackSet b;
  detail::Utf8Partial partial = partial_;
  std::vector<uint32_t> scratch;
  for (char c : bytes) {
    if (!detail::advance_byte(*grammar_, a, partial, static_cast<uint8_t>(c), b, partial,
                              scratch)) {
      return false;
    }
    std::swap(a, b);
  }
  stacks_ = std::move(a);
  partial_ = partial;
  return true;
}

bool GrammarState::can_end() const {
  if (partial_.active()) return false;
  bool found = false;
  stacks_.for_each([&](std::span<const uint32_t> stack) { found = found || stack.empty(); });
  return found;
}

bool GrammarState::can_continue() const {
  bool found = false;
  stacks_.for_each([&](std::span<const uint32_t> stack) { found = found || !stack.empty(); });
  return found;
}

}  // namespace sieve::grammar
