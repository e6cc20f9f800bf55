#pragma once
// Turns token pieces into printable text as they arrive: bytes of an unfinished UTF-8
// character are held back until the character is complete.
#include <string>
#include <string_view>

namespace sieve::engine {

class Utf8Stream {
 public:
  // Appends bytes and returns the longest prefix of pending bytes that ends on a character
  // boundary (invalid sequences are passed through once they can no longer complete).
  std::string push(std::string_view bytes);
  // Whatever is still held back.
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace sieve::engine
