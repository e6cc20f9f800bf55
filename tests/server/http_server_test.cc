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

}  // namespace
}  // namespace sieve::server
