#pragma once
// Errors that reach the user (bad files, bad arguments) are exceptions of type sieve::Error
// carrying a message that says what was wrong; invariants are asserts. Expected outcomes of
// normal operation (e.g. "no free pages") are return values, never exceptions.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sieve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace sieve
