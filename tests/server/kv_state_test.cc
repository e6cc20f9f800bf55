// GET /v1/kv/state against a real engine on stories260K. Most tests step the engine on the test
// thread (it is never start()ed), so a snapshot is taken at a known step: the HTTP threads
// submit, cancel and ask, the test decides when the engine moves. The last test runs the
// engine's own loop and polls while requests finish.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <numeric>
#include <thread>

#include "engine/kv_snapshots.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "server/kv_state.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

using namespace std::chrono_literals;

struct Reply {
  int status = -1;
  json body;
};

// Distinct first words: no two prompts share a cached block.
std::string story(const std::string& opening, int repeats) {
  std::string text = opening;
  for (int i = 0; i < repeats; ++i)
    text += " The little dog ran to the park and played with a ball.";
  return text;
}

class KvStateTest : public ::testing::Test {
 protected:
  static constexpr int32_t kNumPages = 256;

  static void SetUpTestSuite() {
    loaded_ = new model::LoadedModel(
        model::load_model({.model_path = sieve::testing::shared_path("models/stories260K.gguf")}));
  }
  static void TearDownTestSuite() {
    delete loaded_;
    loaded_ = nullptr;
  }

  void SetUp() override { start({}); }
  void TearDown() override { stop(); }

  void start(std::string api_key) {
    engine_ = std::make_shared<engine::Engine>(engine::EngineConfig{.num_kv_pages = kNumPages},
                                               loaded_->model, loaded_->tokenizer);
    server_ = std::make_unique<HttpServer>(ServerConfig{.port = 0, .api_key = api_key});
    api_key_ = api_key;
    server_->bind();
    listener_ = std::thread([this] { server_->listen(); });
    server_->set_backend({.engine = engine_,
                          .tokenizer = loaded_->tokenizer,
                          .model_name = "stories",
                          .context_length = 512,
                          .render_chat = [](const json&) { return std::string(); }});
  }
  void stop() {
    if (!server_) return;
    engine_->start();  // lets anything still running finish or be cancelled by the shutdown
    server_->shutdown();
    listener_.join();
    engine_->stop();
    server_.reset();
  }
  void restart_with_key(std::string key) {
    stop();
    start(std::move(key));
  }

  std::unique_ptr<httplib::Client> client(std::optional<std::string> key = {}) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(30s);
    const std::string bearer = key.value_or(api_key_);
    if (!bearer.empty()) c->set_bearer_token_auth(bearer);
    return c;
  }

  std::future<Reply> post(json body) {
    return std::async(std::launch::async, [this, body = std::move(body)] {
      auto reply = client()->Post("/v1/completions", body.dump(), "application/json");
      if (!reply) return Reply{};
      return Reply{reply->status, json::parse(reply->body)};
    });
  }

  // Steps the engine until `ready` (or gives up: the test then fails on what it finds), with
  // `pause` after each step.
  template <typename Fn>
  void step_until(Fn&& ready, int max_steps = 2000, std::chrono::milliseconds pause = 0ms) {
    for (int i = 0; i < max_steps && !ready(); ++i) {
      if (!engine_->step() || pause > 0ms) std::this_thread::sleep_for(std::max(pause, 1ms));
    }
  }
  template <typename T>
  T await(std::future<T>& f, std::chrono::milliseconds pause = 0ms) {
    step_until([&] { return f.wait_for(0s) == std::future_status::ready; }, 20000, pause);
    return f.get();
  }

  // GET /v1/kv/state?query, answered at a step the test drives. Until the request reaches the
  // engine, steps are paced (a token per 2 ms): the requests it looks at must still be running.
  Reply state(const std::string& query = "", std::optional<std::string> key = {}) {
    std::future<Reply> reply = std::async(std::launch::async, [&] {
      auto r = client(key)->Get(query.empty() ? "/v1/kv/state" : "/v1/kv/state?" + query);
      if (!r) return Reply{};
      return Reply{r->status, json::parse(r->body)};
    });
    return await(reply, 2ms);
  }

  inline static model::LoadedModel* loaded_ = nullptr;
  std::shared_ptr<engine::Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread listener_;
  std::string api_key_;
};

const json* find_sequence(const json& state, const std::string& id, int index = 0) {
  for (const json& s : state["sequences"]) {
    if (s["id"] == id && s["index"] == index) return &s;
  }
  return nullptr;
}

// Three requests decoding (a dense one, an n = 2 one whose samples share their prompt's pages,
// a snapkv one): every field is there and adds up, ids are the ones the responses carry, and the
// compressed request holds fewer pages than its context would dense. Afterwards nothing is left.
TEST_F(KvStateTest, FieldsAddUpWhileRequestsDecodeAndThePoolEmptiesAfterwards) {
  const json common = {{"max_tokens", 200}, {"temperature", 0}, {"ignore_eos", true}};
  json dense = common, pair = common, snap = common;
  dense["prompt"] = story("Once upon a time", 2);
  pair["prompt"] = story("Lily saw a bird", 2);
  pair["n"] = 2;
  pair["temperature"] = 1.0;
  pair["seed"] = 7;
  snap["prompt"] = story("Tom had a red ball", 8);  // ~100 tokens: 7 pages dense
  snap["kv_policy"] = "snapkv:B=16,W=8";
  std::future<Reply> dense_reply = post(dense), pair_reply = post(pair), snap_reply = post(snap);
  // All four sequences decoding (the pair forks after its first token).
  step_until([&] { return engine_->stats().num_running == 4; });
  engine_->step();

  const Reply r = state();
  ASSERT_EQ(r.status, 200) << r.body;
  const json& s = r.body;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(s["time"].get<double>(), now, 60.0);
  EXPECT_EQ(s["model"], "stories");
  EXPECT_EQ(s["kv_dtype"], "f32");
  EXPECT_EQ(s["page_tokens"], 16);
  EXPECT_EQ(s["bytes_per_page"], engine_->kv_bytes_per_page());
  EXPECT_EQ(s["precise_heads"], json::array()) << "f32 pages keep every head as it is";
  EXPECT_EQ(s["precise_spare_areas"], json({{"total", 0}, {"free", 0}, {"copies_dropped", 0}}));
  const json& pool = s["pool"];
  EXPECT_EQ(pool["pages_total"], kNumPages);
  EXPECT_EQ(pool["pages_used"].get<int>() + pool["pages_free"].get<int>(), kNumPages) << pool;
  EXPECT_LE(pool["pages_cached_free"], pool["pages_free"]);
  EXPECT_LE(pool["pages_cached"], pool["pages_total"]);
  EXPECT_EQ(s["requests"]["running"], 4);
  EXPECT_EQ(s["requests"]["waiting"], 0);
  ASSERT_EQ(s["sequences"].size(), 4u) << s;

  int held = 0, shared = 0;
  for (const json& q : s["sequences"]) {
    EXPECT_EQ(q["state"], "decode") << q;
    EXPECT_EQ(q["context_tokens"].get<int>(),
              q["prompt_tokens"].get<int>() + q["generated_tokens"].get<int>());
    // The token sampled last is computed by the next step.
    EXPECT_EQ(q["computed_tokens"].get<int>(), q["context_tokens"].get<int>() - 1) << q;
    EXPECT_GE(q["generated_tokens"].get<int>(), 1);
    EXPECT_EQ(q["pages_dense"].get<int>(), (q["computed_tokens"].get<int>() + 15) / 16);
    held += q["pages_held"].get<int>();
    shared += q["pages_shared"].get<int>();
  }
  // Only the pair shares pages, each shared page with the other sample (reference count 2): the
  // pool's pages in use are the pages held, the shared ones once.
  EXPECT_GT(shared, 0);
  EXPECT_EQ(pool["pages_used"].get<int>(), held - shared / 2) << s;

  // The ids are the response ids the clients get; the pair's samples are indices 0 and 1.
  const Reply dense_done = await(dense_reply), pair_done = await(pair_reply),
              snap_done = await(snap_reply);
  ASSERT_EQ(dense_done.status, 200) << dense_done.body;
  ASSERT_EQ(pair_done.status, 200) << pair_done.body;
  ASSERT_EQ(snap_done.status, 200) << snap_done.body;
  const std::string dense_id = dense_done.body["id"], pair_id = pair_done.body["id"],
                    snap_id = snap_done.body["id"];
  EXPECT_TRUE(dense_id.starts_with("cmpl-"));
  const json* d = find_sequence(s, dense_id);
  ASSERT_TRUE(d) << dense_id << " " << s;
  EXPECT_EQ((*d)["policy"], "full");
  EXPECT_FALSE((*d)["compressed"]);
  EXPECT_EQ((*d)["pages_held"], (*d)["pages_dense"]);
  EXPECT_EQ((*d)["pages_shared"], 0);
  EXPECT_TRUE((*d)["attention_recovery"].is_null());
  for (int i = 0; i < 2; ++i) {
    const json* p = find_sequence(s, pair_id, i);
    ASSERT_TRUE(p) << pair_id << " index " << i;
    EXPECT_EQ((*p)["pages_held"], (*p)["pages_dense"]);
    EXPECT_EQ((*p)["prompt_tokens"], pair_done.body["usage"]["prompt_tokens"]);
  }
  const json* c = find_sequence(s, snap_id);
  ASSERT_TRUE(c) << snap_id;
  EXPECT_EQ((*c)["policy"], "snapkv:B=16,W=8,P=7,pool=max");
  EXPECT_TRUE((*c)["compressed"]);
  EXPECT_GE((*c)["pages_dense"].get<int>(), 7);
  EXPECT_LT((*c)["pages_held"].get<int>(), (*c)["pages_dense"].get<int>()) << *c;
  ASSERT_TRUE((*c)["attention_recovery"].is_number()) << *c;
  EXPECT_GT((*c)["attention_recovery"].get<double>(), 0.0);
  EXPECT_LE((*c)["attention_recovery"].get<double>(), 1.0 + 1e-6);

  // Finished: no sequence left, every page back (cached prefixes stay, free).
  const Reply after = state();
  ASSERT_EQ(after.status, 200);
  EXPECT_TRUE(after.body["sequences"].empty()) << after.body;
  EXPECT_EQ(after.body["pool"]["pages_used"], 0);
  EXPECT_EQ(after.body["pool"]["pages_free"], kNumPages);
  EXPECT_EQ(after.body["requests"]["running"], 0);
  // Its figures are kept as they stood at its last step (what the client's usage reports),
  const json& finished = after.body["finished"];
  ASSERT_EQ(finished.size(), 4u) << after.body;
  for (size_t i = 0; i < finished.size(); ++i) {
    const json& f = finished[i];
    EXPECT_EQ(f["finish_reason"], "length") << f;
    EXPECT_EQ(f["generated_tokens"], 200) << f;
    EXPECT_FALSE(f.contains("state")) << f;
    EXPECT_LE(f["finished_at"].get<double>(), after.body["time"].get<double>());
    if (i > 0) {
      EXPECT_LE(f["finished_at"].get<double>(), finished[i - 1]["finished_at"].get<double>());
    }
  }
  const json as_state = {{"sequences", finished}};  // find_sequence reads "sequences"
  const json* fd = find_sequence(as_state, dense_id);
  ASSERT_TRUE(fd) << finished;
  EXPECT_EQ((*fd)["policy"], "full");
  EXPECT_EQ((*fd)["pages_held"], dense_done.body["usage"]["kv_cache"]["pages"]);
  EXPECT_EQ((*fd)["pages_dense"], dense_done.body["usage"]["kv_cache"]["dense_pages"]);
  const json* fc = find_sequence(as_state, snap_id);
  ASSERT_TRUE(fc) << finished;
  EXPECT_EQ((*fc)["policy"], "snapkv:B=16,W=8,P=7,pool=max");
  EXPECT_TRUE((*fc)["compressed"]);
  EXPECT_EQ((*fc)["pages_held"], snap_done.body["usage"]["kv_cache"]["pages"]);
  EXPECT_LT((*fc)["pages_held"].get<int>(), (*fc)["pages_dense"].get<int>()) << *fc;
  EXPECT_TRUE((*fc)["attention_recovery"].is_number()) << *fc;
  EXPECT_TRUE(find_sequence(as_state, pair_id, 1));

  // and so are its heads: a dashboard whose overview still listed it asks for them a step later.
  const Reply snap_heads = state("request=" + snap_id);
  ASSERT_EQ(snap_heads.status, 200) << snap_heads.body;
  const json& h = snap_heads.body["heads"];
  EXPECT_EQ(h["request"], snap_id);
  EXPECT_EQ(h["index"], 0);
  EXPECT_EQ(h["finish_reason"], "length");
  ASSERT_EQ(h["kept"].size(), static_cast<size_t>(h["layers"].get<int>())) << h;
  const int dense_tokens = (*fc)["computed_tokens"].get<int>();
  for (const json& layer : h["kept"]) {
    ASSERT_EQ(layer.size(), static_cast<size_t>(h["kv_heads"].get<int>())) << h;
    for (const json& head : layer) {
      EXPECT_EQ(head["kind"], "snapkv") << head;
      EXPECT_GT(head["tokens"].get<int>(), 0) << head;
      EXPECT_LT(head["tokens"].get<int>(), dense_tokens) << head;
    }
  }
  // Without an index, the lowest finished choice; with one, that choice.
  const Reply pair_first = state("request=" + pair_id),
              pair_second = state("request=" + pair_id + "&index=1");
  ASSERT_EQ(pair_first.status, 200) << pair_first.body;
  ASSERT_EQ(pair_second.status, 200) << pair_second.body;
  EXPECT_EQ(pair_first.body["heads"]["index"], 0);
  EXPECT_EQ(pair_second.body["heads"]["index"], 1);
  EXPECT_EQ(pair_second.body["heads"]["kept"][0][0]["kind"], "full");
  const json* pair_second_entry = find_sequence(as_state, pair_id, 1);
  EXPECT_EQ(pair_second.body["heads"]["kept"][0][0]["tokens"],
            (*pair_second_entry)["computed_tokens"])
      << "a dense head holds every computed token";
}

// Only the last KvSnapshots::kMaxFinished finished sequences are reported, newest first.
TEST_F(KvStateTest, FinishedRequestsAreTheLastFewNewestFirst) {
  const size_t max_finished = engine::KvSnapshots::kMaxFinished;
  std::vector<std::string> ids;
  for (size_t i = 0; i < max_finished + 4; ++i) {
    std::future<Reply> reply = post({{"prompt", story(fmt::format("Story {} began", i), 1)},
                                     {"max_tokens", 2},
                                     {"ignore_eos", true}});
    const Reply done = await(reply);
    ASSERT_EQ(done.status, 200) << done.body;
    ids.push_back(done.body["id"]);
  }
  const Reply r = state();
  ASSERT_EQ(r.status, 200);
  const json& finished = r.body["finished"];
  ASSERT_EQ(finished.size(), max_finished) << r.body;
  for (size_t i = 0; i < max_finished; ++i) EXPECT_EQ(finished[i]["id"], ids[ids.size() - 1 - i]);
  // Their heads go with them: the newest answers, the first one no longer does.
  const Reply newest = state("request=" + ids.back());
  ASSERT_EQ(newest.status, 200) << newest.body;
  EXPECT_EQ(newest.body["heads"]["finish_reason"], "length");
  EXPECT_EQ(state("request=" + ids.front()).status, 404);
}

// ?request= gives layers x kv_heads entries, layer-major, of the kinds the policy assigns.
TEST_F(KvStateTest, HeadsShowWhatEachKvHeadKeeps) {
  const model::ModelConfig& mc = loaded_->model->config();
  const auto num_layers = static_cast<int>(mc.num_layers);
  const auto num_kv_heads = static_cast<int>(mc.num_kv_heads);
  ASSERT_GE(num_kv_heads, 2);
  struct Case {
    std::string policy;
    std::function<void(const json& head, int layer, int kv_head, int computed)> check;
  };
  const std::vector<Case> cases = {
      {"streaming:S=4,W=16",
       [](const json& h, int, int, int) {
         EXPECT_EQ(h["kind"], "window");
         EXPECT_EQ(h["tokens"], 4 + 16);  // the window is full and slides
         EXPECT_TRUE(h["pages_read"].is_null());
         EXPECT_TRUE(h["recovery"].is_null());
       }},
      {"quest:K=3,R=1,S=4,W=8",
       [](const json& h, int, int, int computed) {
         EXPECT_EQ(h["kind"], "quest");
         EXPECT_EQ(h["tokens"], computed);  // quest keeps every key
         ASSERT_TRUE(h["pages_read"].is_number()) << h;
         EXPECT_GE(h["pages_read"].get<int>(), 1);
         EXPECT_LT(h["pages_read"].get<int>(), (computed + 15) / 16);  // not every page
         EXPECT_TRUE(h["recovery"].is_null());
       }},
      {"fastgen:T=0.05,W=16,F=0.1",
       [](const json& h, int, int, int computed) {
         const std::string kind = h["kind"];
         EXPECT_TRUE(kind.starts_with("fastgen:") && kind != "fastgen:pending") << kind;
         EXPECT_LE(h["tokens"].get<int>(), computed);
         EXPECT_EQ(kind == "fastgen:full", h["tokens"] == computed) << h;
         ASSERT_TRUE(h["recovery"].is_number()) << h;
         EXPECT_GE(h["recovery"].get<double>(), 1.0 - 0.05 - 1e-6);  // FastGen's own target
       }},
      // Per KV head: the second head of every layer streams, the others stay dense.
      {"heads:(streaming:S=4,W=16)@kv=1,rest=full",
       [](const json& h, int, int kv_head, int computed) {
         EXPECT_EQ(h["kind"], kv_head == 1 ? "window" : "full");
         EXPECT_EQ(h["tokens"], kv_head == 1 ? 20 : computed);
       }},
      // Per layer: the first layer dense, the rest h2o.
      {"layers:full@0,rest=h2o:B=8,W=8",
       [](const json& h, int layer, int, int computed) {
         EXPECT_EQ(h["kind"], layer == 0 ? "full" : "heavy_hitters");
         EXPECT_LE(h["tokens"].get<int>(), layer == 0 ? computed : 8 + 8 + 1);
         EXPECT_EQ(layer == 0, h["tokens"] == computed) << h;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.policy);
    const int64_t generated_before = engine_->stats().num_generated_tokens;
    std::future<Reply> reply = post({{"prompt", story("Ben found a shell", 8)},
                                     {"max_tokens", 300},
                                     {"temperature", 0},
                                     {"ignore_eos", true},
                                     {"kv_policy", c.policy}});
    // Some decode steps after the prompt's compression.
    step_until([&] { return engine_->stats().num_generated_tokens > generated_before; });
    for (int i = 0; i < 8; ++i) engine_->step();
    const Reply all = state();
    ASSERT_EQ(all.status, 200) << all.body;
    ASSERT_EQ(all.body["sequences"].size(), 1u) << all.body;
    const json& seq = all.body["sequences"][0];
    const std::string id = seq["id"];
    const int computed = seq["computed_tokens"];

    const Reply r = state("request=" + id);
    ASSERT_EQ(r.status, 200) << r.body;
    const json& heads = r.body["heads"];
    EXPECT_EQ(heads["request"], id);
    EXPECT_EQ(heads["index"], 0);
    EXPECT_EQ(heads["layers"], num_layers);
    EXPECT_EQ(heads["kv_heads"], num_kv_heads);
    EXPECT_TRUE(heads["finish_reason"].is_null()) << "it still runs";
    ASSERT_EQ(heads["kept"].size(), static_cast<size_t>(num_layers));
    // The same step: the second snapshot was taken after one more step at most.
    const int now_computed = r.body["sequences"][0]["computed_tokens"];
    for (int layer = 0; layer < num_layers; ++layer) {
      ASSERT_EQ(heads["kept"][layer].size(), static_cast<size_t>(num_kv_heads));
      for (int kv = 0; kv < num_kv_heads; ++kv) {
        SCOPED_TRACE(fmt::format("layer {} kv head {}", layer, kv));
        c.check(heads["kept"][layer][kv], layer, kv, now_computed);
      }
    }
    EXPECT_GE(now_computed, computed);
    const Reply done = await(reply);
    EXPECT_EQ(done.status, 200) << done.body;
    EXPECT_EQ(done.body["id"], id);
  }
}

// Errors in the OpenAI shape; the API key guards the route like every /v1 route.
TEST_F(KvStateTest, UnknownRequestIs404AndTheApiKeyIsRequired) {
  restart_with_key("secret");
  const Reply missing = state("request=cmpl-nosuchrequest");
  ASSERT_EQ(missing.status, 404) << missing.body;
  const json& error = missing.body["error"];
  EXPECT_EQ(error["type"], "NotFoundError");
  EXPECT_EQ(error["param"], "request");
  EXPECT_EQ(error["code"], "request_not_found");
  EXPECT_NE(error["message"].get<std::string>().find("cmpl-nosuchrequest"), std::string::npos);

  const Reply bad_index = state("request=cmpl-x&index=-1");
  EXPECT_EQ(bad_index.status, 400);
  EXPECT_EQ(bad_index.body["error"]["param"], "index");
  EXPECT_EQ(state("index=0").status, 400);  // an index of no request

  const Reply anonymous = state("", "");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(anonymous.body["error"]["code"], "invalid_api_key");
  EXPECT_EQ(state("", "wrong").status, 401);
  const Reply ok = state();
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.body["pool"]["pages_used"], 0);
}

// A client that leaves mid-stream cancels its request: its pages go back at the next step and it
// leaves the snapshot.
TEST_F(KvStateTest, ACancelledRequestLeavesNoPageBehind) {
  std::atomic<bool> got_chunk{false}, hang_up{false};
  std::future<bool> aborted = std::async(std::launch::async, [&] {
    json body = {{"prompt", story("Sam ate a pie", 4)},
                 {"max_tokens", 400},
                 {"ignore_eos", true},
                 {"stream", true}};
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.headers = {{"Content-Type", "application/json"}};
    request.body = body.dump();
    request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      got_chunk = true;
      return !hang_up;  // false closes the connection
    };
    return !client()->send(request);
  });
  step_until([&] { return engine_->stats().num_generated_tokens > 2; });
  const Reply during = state();
  ASSERT_EQ(during.status, 200);
  ASSERT_EQ(during.body["sequences"].size(), 1u) << during.body;
  EXPECT_GT(during.body["pool"]["pages_used"].get<int>(), 0);
  hang_up = true;
  EXPECT_TRUE(await(aborted));
  EXPECT_TRUE(got_chunk);
  step_until([&] { return engine_->stats().kv.num_free_pages == kNumPages; });
  EXPECT_LT(engine_->stats().num_generated_tokens, 400);  // cancelled, not finished
  const Reply after = state();
  EXPECT_TRUE(after.body["sequences"].empty()) << after.body;
  EXPECT_EQ(after.body["pool"]["pages_used"], 0);
  ASSERT_EQ(after.body["finished"].size(), 1u) << after.body;
  EXPECT_EQ(after.body["finished"][0]["finish_reason"], "cancelled");
  EXPECT_GT(after.body["finished"][0]["pages_held"].get<int>(), 0);
  const Reply heads = state("request=" + after.body["finished"][0]["id"].get<std::string>());
  ASSERT_EQ(heads.status, 200) << heads.body;
  EXPECT_EQ(heads.body["heads"]["finish_reason"], "cancelled");
}

// The engine's own loop, requests starting and finishing while a dashboard polls: every answer
// is whole and adds up, and the pool ends empty.
TEST_F(KvStateTest, PollingWhileRequestsFinishIsConsistent) {
  engine_->start();
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 12; ++i) {
    json body = {{"prompt", story(fmt::format("Story {} began", i), 1 + i % 3)},
                 {"max_tokens", 8 + 4 * (i % 5)},
                 {"ignore_eos", true}};
    if (i % 3 == 1) body["kv_policy"] = "streaming:S=4,W=16";
    if (i % 3 == 2) body["n"] = 2;
    replies.push_back(post(body));
  }
  auto poller = client();
  int num_polls = 0;
  for (bool all_done = false; !all_done; ++num_polls) {
    auto r = poller->Get("/v1/kv/state");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json s = json::parse(r->body);
    EXPECT_EQ(s["pool"]["pages_used"].get<int>() + s["pool"]["pages_free"].get<int>(), kNumPages);
    int held = 0;
    for (const json& q : s["sequences"]) held += q["pages_held"].get<int>();
    EXPECT_GE(held, s["pool"]["pages_used"].get<int>()) << s;
    all_done = std::all_of(replies.begin(), replies.end(),
                           [](auto& f) { return f.wait_for(0s) == std::future_status::ready; });
  }
  EXPECT_GT(num_polls, 1);
  for (auto& f : replies) EXPECT_EQ(f.get().status, 200);
  // The step that finished a request freed its pages; the snapshot comes from a later boundary.
  auto r = poller->Get("/v1/kv/state");
  ASSERT_TRUE(r);
  const json s = json::parse(r->body);
  EXPECT_TRUE(s["sequences"].empty()) << s;
  EXPECT_EQ(s["pool"]["pages_used"], 0);
}

// Once a dashboard polls, each step's end publishes a snapshot and the next overview poll gets
// it without waiting for a step (the engine does not step here); ?request= still waits.
TEST_F(KvStateTest, WhileWatchedTheOverviewIsAnsweredAtOnceFromTheLastStep) {
  std::future<Reply> reply =
      post({{"prompt", story("Ann baked bread", 2)}, {"max_tokens", 100}, {"ignore_eos", true}});
  step_until([&] { return engine_->stats().num_generated_tokens > 0; });
  const Reply first = state();  // waits for a boundary, and starts the watch
  ASSERT_EQ(first.status, 200);
  engine_->step();  // publishes at its end
  const int64_t generated = engine_->stats().num_generated_tokens;
  auto r = client()->Get("/v1/kv/state");  // no step runs meanwhile
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json s = json::parse(r->body);
  ASSERT_EQ(s["sequences"].size(), 1u) << s;
  EXPECT_EQ(s["sequences"][0]["generated_tokens"], generated);
  EXPECT_GT(s["sequences"][0]["generated_tokens"].get<int>(),
            first.body["sequences"][0]["generated_tokens"].get<int>());
  EXPECT_GE(s["time"].get<double>(), first.body["time"].get<double>());
  EXPECT_EQ(await(reply).status, 200);
}

TEST(KvStateQueryTest, ParsesRequestAndIndexAndIgnoresOtherKeys) {
  KvStateQuery q = parse_kv_state_query("request=cmpl-ab%2Dc&index=3&_=1733130000");
  ASSERT_FALSE(q.error);
  EXPECT_EQ(q.query.label_id, "cmpl-ab-c");
  EXPECT_EQ(q.query.choice, 3);
  EXPECT_FALSE(parse_kv_state_query("").query.label_id);
  EXPECT_EQ(parse_kv_state_query("request=").error->param, "request");
  EXPECT_EQ(parse_kv_state_query("request=a&index=x").error->param, "index");
  EXPECT_EQ(parse_kv_state_query("request=a&index=2x").error->param, "index");
  EXPECT_EQ(parse_kv_state_query("index=1").error->param, "index");
}

}  // namespace
}  // namespace sieve::server
