#pragma once
// A small OpenAI-style streaming server for the load generator's tests: each request streams
// its tokens as SSE chunks, the first after first_chunk_delay, then one every chunk_delay,
// then (optionally) a usage chunk and [DONE]. Runs on 127.0.0.1 at a free port.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace sieve::testing {

struct FakeServerOptions {
  std::chrono::milliseconds first_chunk_delay{0};
  std::chrono::milliseconds chunk_delay{0};
  int64_t default_tokens = 4;  // when the request has no max_tokens
  bool send_usage = true;
  int status = 200;  // anything else answers with an OpenAI error body
  std::string error_message = "the server is overloaded";
  int64_t error_after_chunks = -1;  // >= 0: send an error event after that many chunks
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeServerOptions options) : options_(std::move(options)) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(128); };
    const auto handler = [this](const httplib::Request& request, httplib::Response& response) {
      handle(request, response);
    };
    server_.Post("/v1/completions", handler);
    server_.Post("/v1/chat/completions", handler);
    port_ = server_.bind_to_any_port("127.0.0.1");
    raise_listen_backlog(port_);
    // The socket listens from bind on, so clients connecting before the thread runs just wait.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t num_requests() const { return num_requests_; }
  int max_in_flight() const { return max_in_flight_; }
  nlohmann::json last_body() const {
    std::lock_guard lock(mutex_);
    return last_body_;
  }
  size_t num_distinct_prompts() const {
    std::lock_guard lock(mutex_);
    return prompts_.size();
  }

 private:
  // cpp-httplib 0.11 listens with a backlog of 5; a burst of connections beyond that is
  // dropped and retried by TCP a second later. Listening again on the bound socket raises it.
  static void raise_listen_backlog(int port) {
    for (int fd = 3; fd < 1024; ++fd) {
      sockaddr_in address{};
      socklen_t length = sizeof(address);
      int listening = 0;
      socklen_t flag_length = sizeof(listening);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
      if (address.sin_family != AF_INET || ntohs(address.sin_port) != port) continue;
      if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_length) != 0 || !listening)
        continue;
      ::listen(fd, 1024);
    }
  }

  void handle(const httplib::Request& request, httplib::Response& response) {
    ++num_requests_;
    nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
    {
      std::lock_guard lock(mutex_);
      last_body_ = body;
      prompts_.insert(body.contains("prompt") ? body["prompt"].dump()
                                              : body.value("messages", nlohmann::json()).dump());
    }
    if (options_.status != 200) {
      response.status = options_.status;
      response.set_content(nlohmann::json{{"error", {{"message", options_.error_message}}}}.dump(),
                           "application/json");
      return;
    }
    const bool chat = request.path.find("chat") != std::string::npos;
    const int64_t num_tokens = body.value("max_tokens", options_.default_tokens);
    const int64_t prompt_tokens =
        chat ? 7 : static_cast<int64_t>(body.value("prompt", std::string()).size());
    const int now_in_flight = ++in_flight_;
    for (int seen = max_in_flight_;
         now_in_flight > seen && !max_in_flight_.compare_exchange_weak(seen, now_in_flight);) {
    }
    response.set_chunked_content_provider(
        "text/event-stream",
        [this, chat, num_tokens, prompt_tokens](size_t, httplib::DataSink& sink) {
          const auto send = [&](const nlohmann::json& chunk) {
            const std::string event = "data: " + chunk.dump() + "\n\n";
            return sink.write(event.data(), event.size());
          };
          for (int64_t i = 0; i < num_tokens; ++i) {
            std::this_thread::sleep_for(i == 0 ? options_.first_chunk_delay : options_.chunk_delay);
            if (i == options_.error_after_chunks) {
              send({{"error", {{"message", options_.error_message}}}});
              break;
            }
            nlohmann::json choice = {{"index", 0}, {"finish_reason", nullptr}};
            if (chat) {
              choice["delta"] = {{"content", " tok"}};
            } else {
              choice["text"] = " tok";
            }
            if (i + 1 == num_tokens) choice["finish_reason"] = "length";
            if (!send({{"object", "text_completion"}, {"choices", {choice}}})) break;
          }
          if (options_.send_usage) {
            send(
                {{"choices", nlohmann::json::array()},
                 {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", num_tokens}}}});
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          --in_flight_;
          sink.done();
          return true;
        });
  }

  FakeServerOptions options_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int64_t> num_requests_{0};
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  mutable std::mutex mutex_;
  nlohmann::json last_body_;
  std::set<std::string> prompts_;
};

// A loopback port nobody listens on (bound, then released).
inline int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace sieve::testing
