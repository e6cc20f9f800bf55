#pragma once
// Paths to ../shared test data. A test that needs shared data fails loudly when it is
// missing; it never skips.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace sieve::testing {

inline std::string shared_dir() {
  if (const char* env = std::getenv("SIEVE_SHARED_DIR")) return env;
  return SIEVE_SHARED_DIR;
}

// Returns the absolute path of a file under shared/, failing the test if it does not exist.
inline std::string shared_path(const std::string& relative) {
  std::filesystem::path path = std::filesystem::path(shared_dir()) / relative;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "shared test data missing: " << path
                  << " (set SIEVE_SHARED_DIR or configure with -DSIEVE_SHARED_DIR=...)";
    throw std::runtime_error("missing shared data " + path.string());
  }
  return path.string();
}

}  // namespace sieve::testing
