#pragma once
// The message of the sieve::Error an action throws: the tests of bad input check what it says.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "util/error.h"

namespace sieve::testing {

// A test failure (and "") when the action throws no sieve::Error.
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

}  // namespace sieve::testing
