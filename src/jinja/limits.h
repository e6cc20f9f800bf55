#pragma once
// What one render may spend (Limits) and what a template's raise_exception() throws (Raised):
// the parts of the template engine that its user (server/chat_template.h) sets and catches.
#include <cstddef>

#include "util/error.h"

namespace sieve::jinja {

struct Limits {
  std::size_t max_output_bytes = std::size_t{16} << 20;
  // Expression evaluations + statements + loop iterations over one render.
  std::size_t max_steps = 10'000'000;
  // Bytes of strings and list/dict slots created over one render (bounds the time spent copying
  // as well as memory: `{% set s = s + s %}` in a loop stops here).
  std::size_t max_allocated_bytes = std::size_t{512} << 20;
  // Nested macro calls.
  int max_call_depth = 16;
};

// What raise_exception("...") in a template throws: the message is the template's own.
class Raised : public Error {
 public:
  using Error::Error;
};

}  // namespace sieve::jinja
