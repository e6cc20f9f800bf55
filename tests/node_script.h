#pragma once
// Runs a reference script with node (npm packages the tests compare sieve against, e.g. the
// Hugging Face JavaScript ports in tests/hf/reference). Needs SIEVE_NODE (the node executable,
// found by CMake) and SIEVE_SOURCE_DIR defined for the test target.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace sieve::testing {

// stdout of `node <script> <args>`, run in `dir` (relative to the source tree); a test failure
// carrying node's stderr, and an exception, when node fails. A missing node or package fails.
inline std::string run_node_script(const std::string& dir, const std::string& script,
                                   const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path where = fs::path(SIEVE_SOURCE_DIR) / dir;
  const fs::path err = fs::temp_directory_path() /
                       ("sieve_node_" + std::to_string(::getpid()) + "_" + script + ".err");
  const std::string command = "cd '" + where.string() + "' && '" + SIEVE_NODE + "' " + script +
                              " " + args + " 2>'" + err.string() + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string out;
  std::array<char, 65536> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  std::string message;
  {
    std::ifstream in(err);
    message.assign(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove(err);
  if (status != 0) {
    ADD_FAILURE() << command << " failed (status " << status << "):\n" << message;
    throw std::runtime_error("node failed");
  }
  return out;
}

}  // namespace sieve::testing
