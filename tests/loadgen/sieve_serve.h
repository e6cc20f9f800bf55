#pragma once
// A real `sieve serve` on a loopback port for the length of a test (the built binary, one
// thread, 16 MiB of KV), killed at the end of the scope.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "fake_server.h"  // unused_port()

namespace sieve::testing {

class SieveServe {
 public:
  explicit SieveServe(const std::string& model) : port_(unused_port()) {
    const std::string binary = std::string(SIEVE_BINARY_DIR) + "/sieve";
    const std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::freopen("/dev/null", "w", stdout);
      std::freopen("/dev/null", "w", stderr);
      ::execl(binary.c_str(), binary.c_str(), "serve", "-m", model.c_str(), "--port", port.c_str(),
              "-t", "1", "--kv-memory", "16", static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    // Wait for the model to load (/health answers 503 until then), or for the server to exit.
    httplib::Client client(url());
    for (int attempt = 0; attempt < 600; ++attempt) {
      if (auto response = client.Get("/health"); response && response->status == 200) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "sieve serve did not become ready at " << url();
  }
  ~SieveServe() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  SieveServe(const SieveServe&) = delete;
  SieveServe& operator=(const SieveServe&) = delete;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace sieve::testing
