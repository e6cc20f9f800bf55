// libFuzzer target for constrained decoding's front end, which reads request fields (`grammar`,
// `response_format.json_schema`, a tool's `parameters`): arbitrary bytes as a GBNF grammar or as
// a JSON Schema, compiled, then run over a few bytes of text.
//
// The first byte picks the reading (even: GBNF, odd: JSON Schema) and how many of the last bytes
// are the text fed to the automaton; the rest is the grammar or schema. Findings are crashes
// (deep recursion included), sanitizer reports, hangs and out-of-memory: every bad input must
// end in sieve::Error.
//
// Seeds: fuzz/make_grammar_corpus.sh OUT_DIR writes the grammars and schemas of the unit tests.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_state.h"
#include "grammar/json_schema.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool schema = (data[0] & 1) != 0;
  const size_t text_len = std::min<size_t>((data[0] >> 1) % 16, size - 1);
  const std::string_view spec(reinterpret_cast<const char*>(data + 1), size - 1 - text_len);
  const std::string_view text(reinterpret_cast<const char*>(data + size - text_len), text_len);
  try {
    const std::string gbnf = schema ? sieve::grammar::json_schema_to_gbnf(spec) : std::string(spec);
    sieve::grammar::GrammarState state(sieve::grammar::CompiledGrammar::from_gbnf(gbnf));
    for (char c : text) {
      if (!state.accept_bytes(std::string_view(&c, 1))) break;
    }
    (void)state.can_end();
  } catch (const sieve::Error&) {
    // Expected for most inputs: a clear error is the correct outcome.
  }
  return 0;
}
