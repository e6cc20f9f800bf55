// HttpServer in-process with a real engine on stories260K: readiness, auth, a request, and a
// graceful shutdown; the end-to-end behaviour with real clients is in e2e/serve.test.mjs.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "model/loader.h"
#include "server/chat_template.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

TEST(HttpServerTest, HealthIs503UntilTheModelIsLoadedThenServes) {
  HttpServer server({.port = 0, .api_key = "k"});
  server.bind();
  std::thread listener([&] { server.listen(); });
  httplib::Client client("127.0.0.1", server.port());
  client.set_bearer_token_auth("k");

  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 503);
  EXPECT_EQ(json::parse(models->body)["error"]["message"], "the model is still loading");

  model::LoadedModel loaded =
      model::load_model({.model_path = sieve::testing::shared_path("models/stories260K.gguf")});
  auto engine = std::make_shared<engine::Engine>(engine::EngineConfig{.num_kv_pages = 64},
                                                 loaded.model, loaded.tokenizer);
  engine->start();
  auto chatml = std::make_shared<const ChatTemplate>(ChatTemplate::parse(chatml_template()));
  server.set_backend({.engine = engine,
                      .tokenizer = loaded.tokenizer,
                      .model_name = "stories",
                      .context_length = 512,
                      .render_chat = [chatml](const json& c) { return chatml->render(c); }});

  httplib::Client anonymous("127.0.0.1", server.port());
  EXPECT_EQ(anonymous.Get("/health")->status, 200);  // /health needs no key
  EXPECT_EQ(anonymous.Get("/v1/models")->status, 401);
  auto reply = client.Post("/v1/completions",
                           R"({"prompt":"Once upon a time","max_tokens":8,"temperature":0})",
                           "application/json");
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->status, 200) << reply->body;
  const json body = json::parse(reply->body);
  EXPECT_EQ(body["model"], "stories");
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  // The engine publishes its stats at the end of the step that finished the request.
  for (int i = 0; i < 200 && engine->stats().kv.num_free_pages != 64; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine->stats().kv.num_free_pages, 64);

  server.shutdown();
  listener.join();
  engine->stop();
  EXPECT_EQ(server.num_active_requests(), 0);
}

// A q4 KV cache on copy-lm (head_dim 32): usage.kv_cache and /metrics count bytes of the q4
// pages (pages x the engine's bytes per page), and the pool --kv-memory buys is counted in them.
TEST(HttpServerTest, KvUsageAndMetricsReportBytesOfTheKvDType) {
  model::LoadedModel loaded =
      model::load_model({.model_path = sieve::testing::shared_path("models/copy/copy-lm.gguf")});
  const uint64_t kv_memory = 2ull << 20;
  auto engine = std::make_shared<engine::Engine>(
      engine::EngineConfig{.kv_memory_bytes = kv_memory, .kv_dtype = kernels::DType::kQ4_1},
      loaded.model, loaded.tokenizer);
  const int64_t page_bytes = engine->kv_bytes_per_page();
  ASSERT_EQ(static_cast<size_t>(page_bytes),
            model::KvCache::bytes_per_page(loaded.model->config(), 16, kernels::DType::kQ4_1));
  const int32_t num_pages = engine->config().num_kv_pages;
  EXPECT_EQ(num_pages, static_cast<int32_t>(kv_memory / page_bytes));
  engine->start();
  HttpServer server({.port = 0});
  server.bind();
  std::thread listener([&] { server.listen(); });
  server.set_backend({.engine = engine,
                      .tokenizer = loaded.tokenizer,
                      .model_name = "copy",
                      .context_length = 1024,
                      .render_chat = [](const json&) { return std::string(); }});
  httplib::Client client("127.0.0.1", server.port());
  auto reply = client.Post(
      "/v1/completions",
      R"({"prompt":"Once upon a time, there was a little girl named Lily. She loved to play outside","max_tokens":24,"temperature":0,"n":2})",
      "application/json");
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->status, 200) << reply->body;
  const json kv = json::parse(reply->body)["usage"]["kv_cache"];
  ASSERT_GT(kv["pages"].get<int64_t>(), 0) << kv;
  EXPECT_EQ(kv["bytes"].get<int64_t>(), kv["pages"].get<int64_t>() * page_bytes) << kv;
  EXPECT_EQ(kv["dense_bytes"].get<int64_t>(), kv["dense_pages"].get<int64_t>() * page_bytes) << kv;

  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  const std::string& text = metrics->body;
  const auto value_of = [&](const std::string& series) {
    const size_t at = text.find("\n" + series + "{");
    EXPECT_NE(at, std::string::npos) << series;
    if (at == std::string::npos) return -1.0;
    return std::stod(text.substr(text.find("} ", at) + 2));
  };
  EXPECT_EQ(value_of("sieve:kv_cache_total_bytes"), static_cast<double>(num_pages * page_bytes));
  EXPECT_LE(value_of("sieve:kv_cache_total_bytes"), static_cast<double>(kv_memory));
  const double used = value_of("sieve:kv_cache_used_bytes");
  EXPECT_EQ(used, value_of("sieve:kv_pages_used") * static_cast<double>(page_bytes));
  EXPECT_EQ(value_of("sieve:kv_bytes_kept_total"),
            static_cast<double>(kv["pages"].get<int64_t>() * page_bytes));
  EXPECT_NE(text.find(R"(cache_dtype="q4")"), std::string::npos);

  server.shutdown();
  listener.join();
  engine->stop();
}

}  // namespace
}  // namespace sieve::server
