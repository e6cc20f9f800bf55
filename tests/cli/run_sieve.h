#pragma once
// Runs the built `sieve` binary as a user would, for the CLI tests.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace sieve::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout, and stderr with it when merge_stderr
};

inline CliResult run_sieve(const std::string& args, bool merge_stderr = false) {
  const std::string command =
      std::string(SIEVE_BINARY_DIR) + "/sieve " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  CliResult result;
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace sieve::testing
