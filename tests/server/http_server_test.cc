// HttpServer in-process with a real engine on stories260K: readiness, auth, a request, and a
// graceful shutdown; the end-to-end behaviour with real clients is in e2e/serve.test.mjs.
#include "server/http_server.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <sstream>
#include <thread>

#include "model/loader.h"
#include "server/chat_template.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

TEST(HttpServerTest, HealthAndReadyAre503UntilTheModelIsLoadedThenServes) {
  HttpServer server({.port = 0, .api_key = "k"});
  server.bind();
  std::thread listener([&] { server.listen(); });
  httplib::Client client("127.0.0.1", server.port());
  client.set_bearer_token_auth("k");

  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(client.Get("/ready")->status, 503);
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
                      .model_aliases = {"tiny"},
                      .context_length = 512,
                      .render_chat = [chatml](const json& c) { return chatml->render(c); }});

  httplib::Client anonymous("127.0.0.1", server.port());
  EXPECT_EQ(anonymous.Get("/health")->status, 200);  // the probes need no key
  EXPECT_EQ(anonymous.Get("/ready")->status, 200);
  EXPECT_EQ(anonymous.Post("/ready", "", "text/plain")->status, 405);
  EXPECT_EQ(anonymous.Get("/v1/models")->status, 401);
  const json cards = json::parse(client.Get("/v1/models")->body)["data"];
  ASSERT_EQ(cards.size(), 2u);
  EXPECT_EQ(cards[0]["id"], "stories");
  EXPECT_EQ(cards[1]["id"], "tiny");
  EXPECT_EQ(cards[1]["root"], "stories");
  EXPECT_EQ(client.Get("/v1/models/tiny")->status, 200);
  auto aliased = client.Post(
      "/v1/completions", R"({"model":"tiny","prompt":"Once","max_tokens":2})", "application/json");
  ASSERT_EQ(aliased->status, 200) << aliased->body;
  EXPECT_EQ(json::parse(aliased->body)["model"], "tiny");  // the name the request gave
  EXPECT_EQ(
      client.Post("/v1/completions", R"({"model":"other","prompt":"Once"})", "application/json")
          ->status,
      404);
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

// The web page's files need no API key and no model (the page asks for the key, and shows that
// the model loads); everything else, and any other method, still does.
TEST(HttpServerTest, WebAssetsAreServedWithoutTheKeyWhileTheModelLoads) {
  static constexpr WebAsset kAssets[] = {
      {"/", "text/html; charset=utf-8", "<!doctype html><p>page</p>"},
      {"/webui/js/main.js", "text/javascript; charset=utf-8", "export {};"}};
  HttpServer server({.port = 0, .api_key = "k", .web_assets = kAssets});
  server.bind();
  std::thread listener([&] { server.listen(); });
  httplib::Client anonymous("127.0.0.1", server.port());

  auto page = anonymous.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->body, "<!doctype html><p>page</p>");
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("script-src 'self'"),
            std::string::npos);
  EXPECT_EQ(page->get_header_value("X-Content-Type-Options"), "nosniff");
  auto script = anonymous.Get("/webui/js/main.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_EQ(script->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(anonymous.Get("/webui/js/other.js")->status, 401);  // not a file of the page
  EXPECT_EQ(anonymous.Post("/", "", "text/plain")->status, 401);
  EXPECT_EQ(anonymous.Get("/v1/models")->status, 401);

  server.shutdown();
  listener.join();

  HttpServer without({.port = 0});  // --no-webui
  without.bind();
  std::thread listener2([&] { without.listen(); });
  httplib::Client client("127.0.0.1", without.port());
  EXPECT_EQ(client.Get("/")->status, 503);  // an API route like any other: the model loads
  without.shutdown();
  listener2.join();
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

// /metrics as series (name and labels, as printed) → value.
std::map<std::string, double> scrape(httplib::Client& client) {
  std::map<std::string, double> values;
  auto reply = client.Get("/metrics");
  EXPECT_TRUE(reply && reply->status == 200);
  if (!reply) return values;
  std::istringstream in(reply->body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t cut = line.rfind(' ');
    values[line.substr(0, cut)] = std::stod(line.substr(cut + 1));
  }
  return values;
}

// Speculative decoding through the server: a server started with an ngram default answers a
// greedy request exactly as plain decoding does (the same request with {"method": "none"}),
// streamed (several tokens per event) or not; usage.speculative and the vllm:spec_decode_*
// counters count the same drafts; a bad or unavailable "speculative" is a 400 naming it.
TEST(HttpServerTest, SpeculationKeepsGreedyTextAndIsCountedInUsageAndMetrics) {
  model::LoadedModel loaded =
      model::load_model({.model_path = sieve::testing::shared_path("models/stories260K.gguf")});
  engine::EngineConfig config{.num_kv_pages = 64};
  config.speculative =
      speculative::parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":4})");
  auto engine = std::make_shared<engine::Engine>(config, loaded.model, loaded.tokenizer);
  engine->start();
  HttpServer server({.port = 0});
  server.bind();
  std::thread listener([&] { server.listen(); });
  server.set_backend({.engine = engine,
                      .tokenizer = loaded.tokenizer,
                      .model_name = "stories",
                      .context_length = 512,
                      .render_chat = [](const json&) { return std::string(); }});
  httplib::Client client("127.0.0.1", server.port());
  const auto wait_idle = [&] {
    for (int i = 0; i < 200 && engine->stats().kv.num_free_pages != 64; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  const json request = {
      {"prompt",
       "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom"},
      {"max_tokens", 48},
      {"temperature", 0},
      {"ignore_eos", true}};
  const auto post = [&](json body) {
    auto reply = client.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(reply);
    if (!reply) return std::pair<int, std::string>{-1, ""};
    return std::pair<int, std::string>{reply->status, reply->body};
  };
  const std::map<std::string, double> before = scrape(client);

  const auto [status, body] = post(request);
  ASSERT_EQ(status, 200) << body;
  const json spec_reply = json::parse(body);
  json plain_request = request;
  plain_request["speculative"] = {{"method", "none"}};
  const auto [plain_status, plain_body] = post(plain_request);
  ASSERT_EQ(plain_status, 200) << plain_body;
  const json plain_reply = json::parse(plain_body);
  const std::string text = spec_reply["choices"][0]["text"];
  EXPECT_EQ(text, plain_reply["choices"][0]["text"]);
  EXPECT_EQ(spec_reply["usage"]["completion_tokens"], 48);
  const json usage = spec_reply["usage"]["speculative"];
  ASSERT_TRUE(usage.is_object()) << spec_reply["usage"];
  EXPECT_GT(usage["accepted_tokens"].get<int64_t>(), 0) << usage;
  EXPECT_GE(usage["draft_tokens"], usage["accepted_tokens"]);
  EXPECT_FALSE(plain_reply["usage"].contains("speculative")) << plain_reply["usage"];

  // Streamed: one chunk per engine event, which carries every token a step accepted.
  json stream_request = request;
  stream_request["stream"] = true;
  stream_request["stream_options"] = {{"include_usage", true}};
  const auto [stream_status, stream_body] = post(stream_request);
  ASSERT_EQ(stream_status, 200) << stream_body;
  std::string streamed;
  int num_text_chunks = 0;
  json stream_usage;
  std::istringstream events(stream_body);
  for (std::string line; std::getline(events, line);) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const json chunk = json::parse(line.substr(6));
    if (!chunk["usage"].is_null()) stream_usage = chunk["usage"];
    if (chunk["choices"].empty()) continue;
    const std::string piece = chunk["choices"][0]["text"];
    streamed += piece;
    num_text_chunks += piece.empty() ? 0 : 1;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_LT(num_text_chunks, 48);
  EXPECT_EQ(stream_usage["speculative"], usage) << stream_usage;

  wait_idle();
  const std::map<std::string, double> after = scrape(client);
  const auto delta = [&](const std::string& series) {
    EXPECT_TRUE(after.contains(series)) << series;
    const auto was = before.find(series);
    return after.contains(series) ? after.at(series) - (was == before.end() ? 0.0 : was->second)
                                  : -1.0;
  };
  const std::string label = R"({model_name="stories"})";
  const double drafts = delta("vllm:spec_decode_num_drafts_total" + label);
  const double draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total" + label);
  const double accepted = delta("vllm:spec_decode_num_accepted_tokens_total" + label);
  EXPECT_GT(drafts, 0);
  EXPECT_EQ(draft_tokens, 2 * usage["draft_tokens"].get<double>());
  EXPECT_EQ(accepted, 2 * usage["accepted_tokens"].get<double>());
  EXPECT_LE(draft_tokens, 4 * drafts);
  double sum = 0, previous = drafts;
  for (int i = 0; i < 4; ++i) {
    const double at = delta(fmt::format(
        R"(vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="stories",position="{}"}})",
        i));
    EXPECT_LE(at, previous) << "position " << i;  // a draft is accepted up to its first miss
    previous = at;
    sum += at;
  }
  EXPECT_EQ(sum, accepted);

  for (const json& bad : {json("ngram"), json({{"method", "ngram"}}),
                          json({{"method", "ngram"}, {"num_speculative_tokens", 2}, {"x", 1}}),
                          // a method the engine cannot run: refused at submit
                          json({{"method", "draft_model"},
                                {"num_speculative_tokens", 2},
                                {"model", "/nonexistent/draft.gguf"}})}) {
    json bad_request = request;
    bad_request["speculative"] = bad;
    const auto [bad_status, bad_body] = post(bad_request);
    EXPECT_EQ(bad_status, 400) << bad;
    EXPECT_EQ(json::parse(bad_body)["error"]["param"], "speculative") << bad_body;
  }

  server.shutdown();
  listener.join();
  engine->stop();
}

}  // namespace
}  // namespace sieve::server

namespace sieve::server {
namespace {

// A model's engine served in-process on a free port, stopped at the end of the scope.
class ServedEngine {
 public:
  ServedEngine(const std::string& model_file, const std::string& name, int64_t context_length,
               ServerConfig config = {.port = 0})
      : loaded_(model::load_model({.model_path = sieve::testing::shared_path(model_file)})),
        engine_(std::make_shared<engine::Engine>(engine::EngineConfig{.num_kv_pages = 256},
                                                 loaded_.model, loaded_.tokenizer)),
        server_(std::move(config)) {
    engine_->start();
    server_.bind();
    listener_ = std::thread([this] { server_.listen(); });
    server_.set_backend({.engine = engine_,
                         .tokenizer = loaded_.tokenizer,
                         .model_name = name,
                         .context_length = context_length,
                         .render_chat = [](const json&) { return std::string(); }});
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_.port());
  }
  ~ServedEngine() {
    server_.shutdown();
    listener_.join();
    engine_->stop();
  }
  httplib::Client& client() { return *client_; }
  // POST /v1/completions, expecting 200.
  json complete(const json& body) {
    auto reply = client_->Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(reply && reply->status == 200) << (reply ? reply->body : "no reply");
    return reply ? json::parse(reply->body) : json();
  }

 private:
  model::LoadedModel loaded_;
  std::shared_ptr<engine::Engine> engine_;
  HttpServer server_;
  std::thread listener_;
  std::unique_ptr<httplib::Client> client_;
};

// A conversation's next turn on a compressed cache, through the server: the second request's
// prompt is the first's prompt + its text + more, so it continues from the parked K/V; counted in
// usage.prompt_tokens_details.cached_tokens, usage.kv_cache.continued_tokens, vLLM's
// prefix-cache counters and sieve's own (the engine tests check the continued tokens
// themselves). After POST /reset_prefix_cache the same next turn starts cold.
TEST(HttpServerTest, ANextTurnContinuesFromTheCompressedCacheAndIsCounted) {
  ServedEngine served("models/copy/copy-lm.gguf", "copy", 1024);
  httplib::Client& client = served.client();
  const auto complete = [&](const std::string& prompt) {
    return served.complete({{"prompt", prompt},
                            {"max_tokens", 16},
                            {"temperature", 0},
                            {"kv_policy", "snapkv:B=32,W=8"}});
  };
  std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and ran to get it.";
  const json turn1 = complete(prompt);
  EXPECT_EQ(turn1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  prompt += turn1["choices"][0]["text"].get<std::string>() + " Her mother called her home.";
  const json turn2 = complete(prompt);
  const int64_t cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  // Everything turn 1 computed: its prompt and output but the last token (this text
  // re-tokenizes to the ids turn 1 generated).
  EXPECT_EQ(cached, turn1["usage"]["prompt_tokens"].get<int64_t>() +
                        turn1["usage"]["completion_tokens"].get<int64_t>() - 1)
      << turn2;
  EXPECT_EQ(turn1["usage"]["kv_cache"]["continued_tokens"], 0);
  EXPECT_EQ(turn2["usage"]["kv_cache"]["continued_tokens"], cached);
  // The engine publishes its counters at the end of the step that answered: poll for them.
  std::map<std::string, double> metrics = scrape(client);
  for (int i = 0; i < 500 && metrics[R"(sieve:parked_sequences{model_name="copy"})"] < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    metrics = scrape(client);
  }
  EXPECT_EQ(metrics[R"(sieve:continued_requests_total{model_name="copy"})"], 1);
  EXPECT_EQ(metrics[R"(sieve:continued_prompt_tokens_total{model_name="copy"})"],
            static_cast<double>(cached));
  EXPECT_EQ(metrics[R"(sieve:parked_sequences{model_name="copy"})"], 1) << "turn 2's own";
  EXPECT_GE(metrics[R"(vllm:prefix_cache_hits_total{model_name="copy"})"],
            static_cast<double>(cached));

  auto reset = client.Post("/reset_prefix_cache", "", "application/json");
  ASSERT_TRUE(reset);
  EXPECT_EQ(reset->status, 200) << reset->body;
  EXPECT_EQ(json::parse(reset->body), json({{"reset", true}}));
  const json cold = complete(prompt);
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << cold;
  EXPECT_EQ(cold["usage"]["kv_cache"]["continued_tokens"], 0);
  metrics = scrape(client);
  EXPECT_EQ(metrics[R"(sieve:continued_requests_total{model_name="copy"})"], 1);
}

// A conversation whose answer does not re-tokenize to the ids the model wrote (stories260K,
// sampled): plain tokenization leaves the parked K/V at the answer's first token and computes
// the history again; with the answers' ids remembered (the default) the next turn continues
// from all of turn 1. Several seeds: at least one must re-tokenize differently, and every one
// continues whole.
TEST(HttpServerTest, ANextTurnThatResendsTheAnswerAsTextKeepsItsIdsAndContinues) {
  struct Turns {
    int64_t turn1_computed = 0;  // turn 1's prompt and output but the last token
    int64_t turn2_cached = 0;
  };
  const auto converse = [](size_t remembered_answers, int seed) {
    ServedEngine served("models/stories260K.gguf", "stories", 512,
                        {.port = 0, .remembered_answers = remembered_answers});
    const auto complete = [&](const std::string& prompt) {
      return served.complete({{"prompt", prompt},
                              {"max_tokens", 24},
                              {"temperature", 1.0},
                              {"seed", seed},
                              {"kv_policy", "streaming:S=4,W=16"}});
    };
    std::string prompt =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball under a tree. She loved to";
    const json turn1 = complete(prompt);
    prompt += turn1["choices"][0]["text"].get<std::string>() + " One day, her mom said";
    const json turn2 = complete(prompt);
    return Turns{
        .turn1_computed = turn1["usage"]["prompt_tokens"].get<int64_t>() +
                          turn1["usage"]["completion_tokens"].get<int64_t>() - 1,
        .turn2_cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>()};
  };
  int retokenized = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    const Turns plain = converse(0, seed);
    const Turns kept = converse(256, seed);
    EXPECT_EQ(kept.turn1_computed, plain.turn1_computed) << "seed " << seed << ": same answer";
    EXPECT_EQ(kept.turn2_cached, kept.turn1_computed) << "seed " << seed;
    EXPECT_LE(plain.turn2_cached, plain.turn1_computed) << "seed " << seed;
    retokenized += plain.turn2_cached < plain.turn1_computed;
  }
  EXPECT_GT(retokenized, 0) << "no answer re-tokenized differently: the test shows nothing";
}

}  // namespace
}  // namespace sieve::server
