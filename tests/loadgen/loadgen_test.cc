// The load generator against a fake server that streams at known delays, plus its pure parts
// (SSE parsing, percentiles, arrivals, workloads, reports).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "fake_server.h"
#include "gguf/gguf.h"
#include "loadgen/arrivals.h"
#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/plot.h"
#include "loadgen/raw_http.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/soak.h"
#include "loadgen/sse.h"
#include "loadgen/workload.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve::loadgen {
namespace {

using std::chrono::milliseconds;
using testing::FakeOpenAiServer;
using testing::FakeServerOptions;

std::shared_ptr<const tok::Tokenizer> stories_tokenizer() {
  static std::shared_ptr<const tok::Tokenizer> tokenizer = [] {
    gguf::File file = gguf::File::open(testing::shared_path("models/stories260K.gguf"));
    return std::shared_ptr<const tok::Tokenizer>(tok::Tokenizer::create(tok::load_vocab(file)));
  }();
  return tokenizer;
}

Prompt prompt_of(int64_t output_tokens) {
  Prompt p;
  p.text = "Once upon a time";
  p.output_tokens = output_tokens;
  return p;
}

RequestRecord send(const std::string& url, ClientConfig config, const Prompt& prompt) {
  config.base_url = url;
  return send_request(parse_base_url(url), config, prompt, Clock::now());
}

// --- SSE ---------------------------------------------------------------------------------------

TEST(SseParser, EventsSplitAcrossArbitraryPieces) {
  const std::string stream =
      "data: {\"a\":1}\n\n: a comment\r\ndata: line one\r\ndata: line two\r\n\r\nevent: "
      "x\ndata:[DONE]\n\n";
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    SseParser parser;
    std::vector<std::string> events;
    for (size_t i = 0; i < stream.size(); i += piece) {
      for (std::string& e : parser.feed(std::string_view(stream).substr(i, piece)))
        events.push_back(std::move(e));
    }
    EXPECT_TRUE(parser.finish().empty());
    ASSERT_EQ(events.size(), 3u) << "piece size " << piece;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "line one\nline two");
    EXPECT_EQ(events[2], "[DONE]");
  }
}

TEST(SseParser, FinishReturnsAnUnterminatedEvent) {
  SseParser parser;
  EXPECT_TRUE(parser.feed("data: partial").empty());
  EXPECT_EQ(parser.finish(), std::vector<std::string>{"partial"});
}

// --- metrics -----------------------------------------------------------------------------------

TEST(Metrics, PercentilesOfAHandComputedExample) {
  // rank = p/100 * (n-1) over 1..10: p50 -> 4.5 -> 5.5; p90 -> 8.1 -> 9.1; p99 -> 8.91 -> 9.91.
  const Distribution d = distribution({7, 3, 10, 1, 5, 2, 9, 4, 8, 6});
  EXPECT_EQ(d.count, 10);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.median, 5.5);
  EXPECT_NEAR(d.p90, 9.1, 1e-12);
  EXPECT_NEAR(d.p99, 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_DOUBLE_EQ(percentile({42}, 99), 42);
  EXPECT_EQ(distribution({}).count, 0);
}

TEST(Metrics, SummaryTpotThroughputAndGoodput) {
  const auto record = [](double ttft, double e2el, int64_t tokens) {
    RequestRecord r;
    r.ok = true;
    r.ttft_s = ttft;
    r.e2el_s = e2el;
    r.output_tokens = tokens;
    r.requested_output_tokens = 5;
    r.prompt_tokens = 10;
    r.itl_s = std::vector<double>(static_cast<size_t>(std::max<int64_t>(tokens - 1, 0)), 0.25);
    return r;
  };
  RequestRecord failed;
  failed.error = "HTTP 503: busy";
  // TPOT: (1.1 - 0.1) / 4 = 0.25 s; (2.2 - 0.2) / 4 = 0.5 s; a one-token output has none.
  const std::vector<RequestRecord> records = {record(0.1, 1.1, 5), record(0.2, 2.2, 5),
                                              record(0.3, 0.3, 1), failed, failed};
  GoodputSlo slo = parse_goodput({"ttft:250", "tpot:300"});
  const RunSummary s = summarize(records, 4.0, slo);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.errors.at("HTTP 503: busy"), 2);
  EXPECT_EQ(s.output_tokens, 11);
  EXPECT_EQ(s.input_tokens, 30);
  EXPECT_EQ(s.output_shorter, 1);
  EXPECT_DOUBLE_EQ(s.request_throughput, 3 / 4.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 11 / 4.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 41 / 4.0);
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_NEAR(s.tpot_ms.mean, 375, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 8);
  EXPECT_NEAR(s.ttft_ms.median, 200, 1e-9);
  // Good: the first (ttft 100, tpot 250); the second misses TPOT, the third misses TTFT.
  EXPECT_EQ(s.good_requests, 1);
  ASSERT_TRUE(s.goodput);
  EXPECT_DOUBLE_EQ(*s.goodput, 0.25);
  EXPECT_FALSE(summarize(records, 4.0, {}).goodput);
}

TEST(Metrics, GoodputParsing) {
  const GoodputSlo slo = parse_goodput({"ttft:500", "tpot:12.5", "e2el:9000"});
  EXPECT_EQ(slo.ttft_ms, 500);
  EXPECT_EQ(slo.tpot_ms, 12.5);
  EXPECT_EQ(slo.e2el_ms, 9000);
  for (const char* bad : {"ttft", "ttft:", "ttft:abc", "ttft:-1", "latency:5", "ttft:5ms"}) {
    EXPECT_THROW(parse_goodput({bad}), Error) << bad;
  }
}

// --- arrivals ----------------------------------------------------------------------------------

struct GapStats {
  double mean = 0, cv2 = 0;  // squared coefficient of variation = 1 / shape for gamma gaps
};

GapStats gap_stats(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (size_t i = 1; i < times.size(); ++i) gaps.push_back(times[i] - times[i - 1]);
  GapStats s;
  s.mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / static_cast<double>(gaps.size());
  double var = 0;
  for (double g : gaps) var += (g - s.mean) * (g - s.mean);
  var /= static_cast<double>(gaps.size());
  s.cv2 = var / (s.mean * s.mean);
  return s;
}

TEST(Arrivals, PoissonAndGammaHaveTheRequestedMeanRate) {
  for (const double burstiness : {1.0, 0.5, 4.0}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const std::vector<double> times = arrival_times({8.0, burstiness, seed}, 40001);
      ASSERT_EQ(times.front(), 0.0);
      ASSERT_TRUE(std::is_sorted(times.begin(), times.end()));
      const GapStats s = gap_stats(times);
      // Standard error of the mean gap is about 0.125 * sqrt(cv2 / 40000) < 1%.
      EXPECT_NEAR(s.mean, 1 / 8.0, 0.04 / 8.0) << "b=" << burstiness << " seed " << seed;
      EXPECT_NEAR(s.cv2, 1 / burstiness, 0.1 / burstiness)
          << "b=" << burstiness << " seed " << seed;
    }
  }
}

TEST(Arrivals, SeededAndAllAtOnceWithoutARate) {
  EXPECT_EQ(arrival_times({2.0, 1.0, 7}, 50), arrival_times({2.0, 1.0, 7}, 50));
  EXPECT_NE(arrival_times({2.0, 1.0, 7}, 50), arrival_times({2.0, 1.0, 8}, 50));
  EXPECT_EQ(arrival_times({std::nullopt, 1.0, 7}, 5), std::vector<double>(5, 0.0));
  EXPECT_EQ(arrival_times({INFINITY, 1.0, 7}, 5), std::vector<double>(5, 0.0));
  EXPECT_THROW(arrival_times({0.0, 1.0, 7}, 5), Error);
  EXPECT_THROW(arrival_times({1.0, 0.0, 7}, 5), Error);
}

// --- URLs and request bodies ---------------------------------------------------------------------

TEST(Client, ParsesBaseUrls) {
  ServerUrl u = parse_base_url("http://127.0.0.1:8080");
  EXPECT_EQ(u.origin(), "http://127.0.0.1:8080");
  EXPECT_EQ(u.path_prefix, "");
  EXPECT_EQ(parse_base_url("http://localhost:8000/v1/").path_prefix, "");
  EXPECT_EQ(parse_base_url("https://example.com/proxy/v1").origin(), "https://example.com:443");
  EXPECT_EQ(parse_base_url("https://example.com/proxy/v1").path_prefix, "/proxy");
  EXPECT_EQ(parse_base_url("http://[::1]:9000").host, "::1");
  for (const char* bad : {"", "localhost:8080", "ftp://host", "http://", "http://host:99999",
                          "http://host:port", "http://a b", "http://host?x=1"}) {
    try {
      parse_base_url(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad --base-url"), std::string::npos) << e.what();
    }
  }
}

TEST(Client, RequestBodyForcesLengthsAndMergesExtraBody) {
  ClientConfig config;
  config.model = "m";
  nlohmann::json body = request_body(config, prompt_of(32));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], "Once upon a time");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["max_tokens"], 32);
  EXPECT_EQ(body["min_tokens"], 32);
  EXPECT_EQ(body["ignore_eos"], true);

  config.endpoint = ApiEndpoint::kChat;
  config.extra_body = {
      {"kv_policy", "snapkv"}, {"min_tokens", nullptr}, {"stream_options", {{"x", 1}}}};
  body = request_body(config, prompt_of(8));
  EXPECT_FALSE(body.contains("prompt"));
  EXPECT_EQ(body["messages"],
            nlohmann::json::parse(R"([{"role":"user","content":"Once upon a time"}])"));
  EXPECT_EQ(body["kv_policy"], "snapkv");
  EXPECT_FALSE(body.contains("min_tokens"));                 // null removes a field
  EXPECT_EQ(body["stream_options"]["include_usage"], true);  // objects merge
  EXPECT_EQ(body["stream_options"]["x"], 1);

  config.force_output_len = false;
  config.extra_body = nlohmann::json::object();
  body = request_body(config, prompt_of(8));
  EXPECT_FALSE(body.contains("ignore_eos"));
  EXPECT_FALSE(body.contains("min_tokens"));
}

// --- against the fake server -------------------------------------------------------------------

TEST(Client, MeasuresKnownDelaysOfAStreamingServer) {
  FakeOpenAiServer server(
      {.first_chunk_delay = milliseconds(100), .chunk_delay = milliseconds(50)});
  const RequestRecord r = send(server.url(), {}, prompt_of(6));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(r.num_chunks, 6);
  EXPECT_EQ(r.output_tokens, 6);
  EXPECT_EQ(r.output_tokens_source, TokenSource::kUsage);
  EXPECT_EQ(r.prompt_tokens, 16);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.generated_text, " tok tok tok tok tok tok");
  // The server sleeps before each chunk, so its delays are lower bounds of what the client
  // measures (a loaded machine only adds to them, so no upper bound is checked; two chunks may
  // arrive in one read, so single gaps are not bounded either, only their sum); the parts must
  // add up: TTFT plus the gaps between chunks is at most the whole request.
  EXPECT_GE(r.ttft_s, 0.099);
  ASSERT_EQ(r.itl_s.size(), 5u);
  for (const double gap : r.itl_s) EXPECT_GE(gap, 0.0);
  const double sum_itl = std::accumulate(r.itl_s.begin(), r.itl_s.end(), 0.0);
  EXPECT_GE(sum_itl, 5 * 0.050 - 0.002);
  EXPECT_LE(r.ttft_s + sum_itl, r.e2el_s);
  ASSERT_TRUE(r.tpot_s());
  EXPECT_NEAR(*r.tpot_s(), (r.e2el_s - r.ttft_s) / 5, 1e-12);
  EXPECT_EQ(server.last_body()["max_tokens"], 6);
}

TEST(Client, ChatEndpointAndTokenCountsWithoutUsage) {
  FakeOpenAiServer server({.send_usage = false});
  ClientConfig config;
  config.endpoint = ApiEndpoint::kChat;
  RequestRecord r = send(server.url(), config, prompt_of(5));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_EQ(r.output_tokens_source, TokenSource::kChunks);
  EXPECT_FALSE(r.prompt_tokens);
  EXPECT_TRUE(server.last_body().contains("messages"));

  config.tokenizer = stories_tokenizer().get();
  r = send(server.url(), config, prompt_of(5));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.output_tokens_source, TokenSource::kTokenizer);
  EXPECT_EQ(
      r.output_tokens,
      static_cast<int64_t>(config.tokenizer->encode(r.generated_text, {false, false}).size()));
}

TEST(Client, HttpErrorsCarryStatusAndMessage) {
  FakeOpenAiServer server({.status = 503});
  const RequestRecord r = send(server.url(), {}, prompt_of(4));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.http_status, 503);
  EXPECT_EQ(r.error, "HTTP 503: the server is overloaded");
}

TEST(Client, ErrorEventInsideTheStream) {
  FakeOpenAiServer server({.error_message = "out of KV pages", .error_after_chunks = 2});
  const RequestRecord r = send(server.url(), {}, prompt_of(4));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "server error in stream: out of KV pages");
}

TEST(Client, RefusedConnectionIsAClearError) {
  const std::string url = "http://127.0.0.1:" + std::to_string(testing::unused_port());
  const RequestRecord r = send(url, {}, prompt_of(4));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.http_status, 0);
  EXPECT_NE(r.error.find("cannot connect to " + url), std::string::npos) << r.error;
}

TEST(Client, ReadTimeoutIsReported) {
  FakeOpenAiServer server({.first_chunk_delay = milliseconds(500)});
  ClientConfig config;
  config.timeout_s = 0.15;
  const RequestRecord r = send(server.url(), config, prompt_of(1));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("timed out"), std::string::npos) << r.error;
}

// --- runner ------------------------------------------------------------------------------------

TEST(Runner, ConcurrencyLimitHoldsAndEveryRequestIsRecorded) {
  FakeOpenAiServer server({.first_chunk_delay = milliseconds(60), .chunk_delay = milliseconds(10)});
  const std::vector<Prompt> prompts(12, prompt_of(3));
  RunPoint point;
  point.label = "c=4";
  point.max_concurrency = 4;
  point.extra_body = {{"kv_policy", "dense"}};
  std::vector<int64_t> progress;
  const RunResult run = run_point(parse_base_url(server.url()), {}, prompts, {prompt_of(2)}, point,
                                  {}, [&](int64_t done, int64_t total, int64_t failed) {
                                    EXPECT_EQ(total, 12);
                                    EXPECT_EQ(failed, 0);
                                    progress.push_back(done);
                                  });
  EXPECT_EQ(server.num_requests(), 13);  // one warmup
  EXPECT_EQ(progress.size(), 12u);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(run.summary.completed, 12);
  EXPECT_EQ(run.summary.output_tokens, 36);
  EXPECT_LE(server.max_in_flight(), 4);
  EXPECT_LE(run.summary.max_in_flight, 4);
  EXPECT_GE(run.summary.max_in_flight, 2);
  EXPECT_EQ(server.last_body()["kv_policy"], "dense");
  // Three waves of four requests, each at least 60 + 2*10 ms.
  EXPECT_GE(run.summary.duration_s, 3 * 0.080 - 0.005);
  for (const RequestRecord& r : run.records) {
    EXPECT_TRUE(r.ok);
    EXPECT_LE(r.start_s + r.e2el_s, run.summary.duration_s + 1e-9);
  }
}

TEST(Runner, KeptAliveConnectionsReconnectWhenTheServerClosesThem) {
  // cpp-httplib servers close a connection after 5 requests; 40 requests on 2 connections
  // need several reconnects.
  FakeOpenAiServer server({});
  RunPoint point;
  point.max_concurrency = 2;
  const RunResult run = run_point(parse_base_url(server.url()), {},
                                  std::vector<Prompt>(40, prompt_of(2)), {}, point, {});
  EXPECT_EQ(run.summary.completed, 40);
  for (const auto& [reason, count] : run.summary.errors) ADD_FAILURE() << count << " x " << reason;
}

TEST(Runner, SixtyFourRequestsInFlight) {
  FakeOpenAiServer server({.first_chunk_delay = milliseconds(100), .chunk_delay = milliseconds(5)});
  RunPoint point;
  point.max_concurrency = 64;
  const RunResult run = run_point(parse_base_url(server.url()), {},
                                  std::vector<Prompt>(64, prompt_of(4)), {}, point, {});
  EXPECT_EQ(run.summary.completed, 64);
  EXPECT_EQ(run.summary.output_tokens, 64 * 4);
  // Every request waits 100 ms for its first chunk, so they overlap unless sent one by one.
  EXPECT_GE(server.max_in_flight(), 16);
}

TEST(Runner, RequestRateSpacesTheSends) {
  FakeOpenAiServer server({});
  RunPoint point;
  point.request_rate = 50.0;
  RunOptions options;
  options.seed = 3;
  const RunResult run = run_point(parse_base_url(server.url()), {},
                                  std::vector<Prompt>(10, prompt_of(1)), {}, point, options);
  const std::vector<double> arrivals = arrival_times({50.0, 1.0, 3}, 10);
  ASSERT_EQ(run.summary.completed, 10);
  for (size_t i = 0; i < 10; ++i) EXPECT_GE(run.records[i].start_s, arrivals[i]) << i;
}

// --- workloads ---------------------------------------------------------------------------------

TEST(Workload, RandomPromptsHaveExactTokenLengthsAndASharedPrefix) {
  const std::shared_ptr<const tok::Tokenizer> tokenizer = stories_tokenizer();
  const std::vector<Prompt> prompts = random_prompts(tokenizer.get(), {.input_len = 96,
                                                                       .output_len = 20,
                                                                       .range_ratio = 0.25,
                                                                       .shared_prefix_len = 24,
                                                                       .num_prompts = 16,
                                                                       .seed = 5});
  ASSERT_EQ(prompts.size(), 16u);
  std::mt19937_64 rng(5);
  const std::string prefix = exact_length_text(*tokenizer, 24, rng);
  EXPECT_EQ(tokenizer->encode(prefix, {false, false}).size(), 24u);
  std::set<int64_t> lengths;
  for (const Prompt& p : prompts) {
    ASSERT_TRUE(p.input_tokens);
    EXPECT_EQ(static_cast<int64_t>(tokenizer->encode(p.text, {false, false}).size()),
              *p.input_tokens);
    EXPECT_GE(*p.input_tokens, 72);
    EXPECT_LE(*p.input_tokens, 120);
    EXPECT_GE(p.output_tokens, 15);
    EXPECT_LE(p.output_tokens, 25);
    EXPECT_TRUE(p.text.starts_with(prefix));
    lengths.insert(*p.input_tokens);
  }
  EXPECT_GT(lengths.size(), 1u);
  // Same seed, same prompts.
  const std::vector<Prompt> again = random_prompts(tokenizer.get(), {.input_len = 96,
                                                                     .output_len = 20,
                                                                     .range_ratio = 0.25,
                                                                     .shared_prefix_len = 24,
                                                                     .num_prompts = 16,
                                                                     .seed = 5});
  EXPECT_EQ(again[7].text, prompts[7].text);
}

TEST(Workload, PromptsShareOneOfSeveralPrefixes) {
  const std::shared_ptr<const tok::Tokenizer> tokenizer = stories_tokenizer();
  const std::vector<Prompt> prompts = random_prompts(tokenizer.get(), {.input_len = 64,
                                                                       .output_len = 4,
                                                                       .shared_prefix_len = 32,
                                                                       .num_prompts = 24,
                                                                       .seed = 3,
                                                                       .num_prefixes = 3});
  ASSERT_EQ(prompts.size(), 24u);
  std::mt19937_64 rng(3);  // the prefixes are drawn first
  std::vector<std::string> prefixes;
  for (int g = 0; g < 3; ++g) prefixes.push_back(exact_length_text(*tokenizer, 32, rng));
  EXPECT_EQ(std::set<std::string>(prefixes.begin(), prefixes.end()).size(), 3u);
  std::vector<int> group_sizes(3, 0);
  std::vector<int> groups;
  for (const Prompt& p : prompts) {
    const auto group =
        std::find_if(prefixes.begin(), prefixes.end(),
                     [&](const std::string& prefix) { return p.text.starts_with(prefix); });
    ASSERT_NE(group, prefixes.end()) << p.text;
    groups.push_back(static_cast<int>(group - prefixes.begin()));
    ++group_sizes[static_cast<size_t>(groups.back())];
    EXPECT_EQ(tokenizer->encode(p.text, {false, false}).size(), 64u);
  }
  for (int size : group_sizes) EXPECT_GT(size, 0);
  // Not taking turns: a balancer alternating between replicas must not line up with the groups.
  bool turns = true;
  for (size_t i = 0; i < groups.size(); ++i) turns = turns && groups[i] == static_cast<int>(i % 3);
  EXPECT_FALSE(turns);
  EXPECT_THROW(random_prompts(
                   tokenizer.get(),
                   {.input_len = 64, .shared_prefix_len = 32, .num_prompts = 1, .num_prefixes = 0}),
               Error);
}

TEST(Workload, LongExactPrompt) {
  std::mt19937_64 rng(11);
  const std::string text = exact_length_text(*stories_tokenizer(), 2000, rng);
  EXPECT_EQ(stories_tokenizer()->encode(text, {false, false}).size(), 2000u);
}

TEST(Workload, ExactLengthsWithByteLevelBpe) {
  gguf::File file =
      gguf::File::open(testing::shared_path("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  const std::unique_ptr<tok::Tokenizer> tokenizer = tok::Tokenizer::create(tok::load_vocab(file));
  const std::vector<Prompt> prompts = random_prompts(
      tokenizer.get(),
      {.input_len = 300, .output_len = 8, .shared_prefix_len = 50, .num_prompts = 3, .seed = 2});
  for (const Prompt& p : prompts) EXPECT_EQ(tokenizer->encode(p.text, {false, false}).size(), 300u);
}

TEST(Workload, RejectsInconsistentLengths) {
  EXPECT_THROW(random_prompts(nullptr, {.input_len = 0, .num_prompts = 1}), Error);
  EXPECT_THROW(random_prompts(nullptr, {.input_len = 10, .range_ratio = 1.0, .num_prompts = 1}),
               Error);
  EXPECT_THROW(
      random_prompts(nullptr, {.input_len = 10, .shared_prefix_len = 10, .num_prompts = 1}), Error);
  const std::vector<Prompt> words = random_prompts(nullptr, {.input_len = 10, .num_prompts = 2});
  EXPECT_FALSE(words[0].input_tokens);
  EXPECT_FALSE(words[0].text.empty());
}

TEST(Workload, JsonlDataset) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "sieve_loadgen_dataset.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "Once upon a time", "output_len": 7})"
        << "\n\n"
        << R"({"messages": [{"role": "user", "content": "hi"}]})"
        << "\n";
  }
  const std::vector<Prompt> lines =
      load_jsonl_prompts(path.string(), {.default_output_len = 9, .endpoint = ApiEndpoint::kChat},
                         stories_tokenizer().get());
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<Prompt> prompts = cycle_prompts(lines, 0, 3);
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[0].output_tokens, 7);
  EXPECT_EQ(
      prompts[0].input_tokens,
      static_cast<int64_t>(stories_tokenizer()->encode("Once upon a time", {false, false}).size()));
  EXPECT_EQ(prompts[1].output_tokens, 9);
  EXPECT_TRUE(prompts[1].messages);
  EXPECT_EQ(prompts[2].text, prompts[0].text);  // reused in order
  EXPECT_EQ(cycle_prompts(lines, 1, 2)[1].text, prompts[0].text);
  try {
    load_jsonl_prompts(path.string(), {.endpoint = ApiEndpoint::kCompletions}, nullptr);
    ADD_FAILURE() << "messages accepted for /v1/completions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":3: chat"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path);
    out << "{\"prompt\": 3}\n";
  }
  EXPECT_THROW(load_jsonl_prompts(path.string(), {}, nullptr), Error);
  std::filesystem::remove(path);
  EXPECT_THROW(load_jsonl_prompts(path.string(), {}, nullptr), Error);
}

// --- reports -----------------------------------------------------------------------------------

RunResult example_run(const std::string& label, int concurrency, double throughput_scale) {
  RunResult run;
  run.point.label = label;
  run.point.max_concurrency = concurrency;
  RequestRecord r;
  r.ok = true;
  r.ttft_s = 0.1;
  r.e2el_s = 0.5;
  r.itl_s = {0.1, 0.1, 0.2};
  r.num_chunks = 4;
  r.output_tokens = 4;
  r.requested_output_tokens = 4;
  RequestRecord failed;
  failed.error = "cannot connect";
  run.records = {r, r, failed};
  run.summary = summarize(run.records, 1.0 / throughput_scale, {});
  return run;
}

TEST(Report, JsonSchemaIsStable) {
  const nlohmann::json report =
      make_report({{"model", "m"}}, {example_run("c=1", 1, 1), example_run("c=2", 2, 2)});
  EXPECT_EQ(report["schema_version"], kSchemaVersion);
  for (const char* key : {"schema_version", "tool", "created_at", "config", "runs"}) {
    EXPECT_TRUE(report.contains(key)) << key;
  }
  ASSERT_EQ(report["runs"].size(), 2u);
  const nlohmann::json& run = report["runs"][0];
  for (const char* key : {"label", "request_rate", "burstiness", "max_concurrency", "variant",
                          "extra_body", "summary", "requests"}) {
    EXPECT_TRUE(run.contains(key)) << key;
  }
  for (const char* key :
       {"completed", "failed", "duration_s", "input_tokens", "output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "goodput", "good_requests", "output_shorter",
        "output_longer", "max_in_flight", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "errors"}) {
    EXPECT_TRUE(run["summary"].contains(key)) << key;
  }
  for (const char* key : {"count", "mean", "median", "p90", "p99", "min", "max"}) {
    EXPECT_TRUE(run["summary"]["itl_ms"].contains(key)) << key;
  }
  ASSERT_EQ(run["requests"].size(), 3u);
  for (const char* key :
       {"index", "ok", "error", "http_status", "start_ms", "ttft_ms", "tpot_ms", "e2el_ms",
        "itl_ms", "num_chunks", "output_tokens", "output_tokens_source", "requested_output_tokens",
        "prompt_tokens", "input_tokens", "finish_reason"}) {
    EXPECT_TRUE(run["requests"][0].contains(key)) << key;
  }
  EXPECT_EQ(run["requests"][0]["itl_ms"].size(), 3u);
  EXPECT_NEAR(run["requests"][0]["tpot_ms"].get<double>(), 400.0 / 3, 1e-9);
  EXPECT_EQ(run["requests"][2]["error"], "cannot connect");
  EXPECT_EQ(run["summary"]["errors"][0]["count"], 1);
  RunSummary many;
  many.errors = {{"a", 1}, {"b", 3}, {"c", 2}};
  const nlohmann::json ordered = to_json(many)["errors"];
  EXPECT_EQ(ordered[0]["reason"], "b");
  EXPECT_EQ(ordered[2]["reason"], "a");
}

TEST(Report, ReadBackCompareAndPlot) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "sieve_loadgen_report.json";
  const nlohmann::json a = make_report({}, {example_run("c=1", 1, 1), example_run("c=4", 4, 1)});
  const nlohmann::json b = make_report({}, {example_run("c=1", 1, 2), example_run("c=4", 4, 3)});
  {
    std::ofstream out(path);
    out << a.dump();
  }
  EXPECT_EQ(read_report(path.string())["runs"].size(), 2u);
  {
    std::ofstream out(path);
    out << R"({"schema_version": 99, "runs": []})";
  }
  EXPECT_THROW(read_report(path.string()), Error);
  std::filesystem::remove(path);
  EXPECT_THROW(read_report(path.string()), Error);

  const std::string comparison = format_comparison(a, "a.json", b, "b.json");
  EXPECT_NE(comparison.find("[c=1]"), std::string::npos);
  EXPECT_NE(comparison.find("2.00x"), std::string::npos) << comparison;  // c=1 throughput doubled
  EXPECT_NE(comparison.find("3.00x"), std::string::npos) << comparison;  // c=4 tripled
  EXPECT_NE(format_sweep_table(a).find("c=4"), std::string::npos);
  EXPECT_NE(format_run_details(a["runs"][0]).find("failed x1: cannot connect"), std::string::npos);
  nlohmann::json errors = nlohmann::json::array();
  for (int i = 1; i <= 7; ++i)
    errors.push_back({{"reason", fmt::format("reason {}", i)}, {"count", 8 - i}});
  EXPECT_EQ(format_errors(errors, "c=1: "),
            "c=1: failed x7: reason 1\nc=1: failed x6: reason 2\nc=1: failed x5: reason 3\nc=1: "
            "failed x4: reason 4\n"
            "c=1: failed x3: reason 5\nc=1: ... and 2 other reasons (all in the JSON output)\n");

  std::vector<PlotSeries> series = plot_series(a, "A ");
  ASSERT_EQ(series.size(), 1u);
  ASSERT_EQ(series[0].points.size(), 2u);
  EXPECT_EQ(series[0].points[1].concurrency, 4);
  EXPECT_DOUBLE_EQ(series[0].points[0].output_throughput, 8);
  for (PlotSeries& s : plot_series(b, "B ")) series.push_back(std::move(s));
  const std::string svg = render_svg(series, "a & b");
  EXPECT_TRUE(svg.starts_with("<svg"));
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_NE(svg.find("a &amp; b"), std::string::npos);
  // Per series: one throughput line, p50 and p99 for TTFT and TPOT.
  size_t polylines = 0;
  for (size_t at = 0; (at = svg.find("<polyline", at)) != std::string::npos; ++at) ++polylines;
  EXPECT_EQ(polylines, 2u * 5);
}

TEST(Report, ProgressWithoutATerminalPrintsPlainLines) {
  std::FILE* file = std::tmpfile();
  ProgressDisplay display(file, "c=2", 20);
  for (int64_t done = 1; done <= 20; ++done) display.update(done, done / 10);
  display.finish();
  std::rewind(file);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), file));
  std::fclose(file);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            11);  // the first completion, then one per 10%
  EXPECT_NE(text.find("c=2: 20/20 done, 2 failed"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

// Chunked framing decoded the same whatever pieces the bytes arrive in; trailers are skipped.
TEST(ChunkedDecoder, BodyFromPiecesOfAnySize) {
  const std::string raw = "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n";
  for (size_t piece : {1, 2, 3, 7, 64}) {
    ChunkedDecoder decoder;
    std::string body;
    for (size_t i = 0; i < raw.size(); i += piece) body += decoder.feed(raw.substr(i, piece));
    EXPECT_EQ(body, "hello, world") << "pieces of " << piece;
    EXPECT_TRUE(decoder.done());
    EXPECT_EQ(decoder.error(), "");
  }
  ChunkedDecoder bad;
  EXPECT_EQ(bad.feed("zz\r\nhello"), "");
  EXPECT_NE(bad.error().find("bad chunk size"), std::string::npos) << bad.error();
}

// The soak's raw client reads a real server's chunked SSE stream to its end.
TEST(RawConnection, ReadsAStreamedResponseToItsEnd) {
  testing::FakeOpenAiServer server({.default_tokens = 3});
  const ServerUrl url = parse_base_url(server.url());
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  auto opened = RawConnection::open(url, deadline);
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<RawConnection>>(opened))
      << std::get<std::string>(opened);
  RawConnection& connection = *std::get<0>(opened);
  const std::string body = R"({"prompt": "hi", "stream": true})";
  ASSERT_FALSE(connection.send(
      http_request("POST", "/v1/completions", url, body, {"Content-Type: application/json"}),
      deadline));
  auto head = connection.read_head(deadline);
  ASSERT_TRUE(std::holds_alternative<ResponseHead>(head)) << std::get<std::string>(head);
  EXPECT_EQ(std::get<ResponseHead>(head).status, 200);
  SseParser parser;
  std::vector<std::string> events;
  for (;;) {
    BodyRead read = connection.read_body(7, deadline);  // small reads: many pieces
    if (read.status != BodyRead::Status::kData) {
      EXPECT_EQ(read.status, BodyRead::Status::kEnd) << read.error;
      break;
    }
    for (std::string& e : parser.feed(read.bytes)) events.push_back(std::move(e));
  }
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
}

// The per-layer and per-head compositions name only layers and KV heads the model has (the
// 2-layer copy model, 1 KV head: a 3-layer catalogue asked for a layer it does not have).
TEST(Soak, CatalogueFitsTheModelsLayersAndKvHeads) {
  for (const ModelShape shape :
       {ModelShape{1, 1}, ModelShape{2, 1}, ModelShape{2, 4}, ModelShape{}}) {
    int64_t max_layer = -1, max_head = -1;
    for (const SoakRequest& r : soak_catalogue(shape)) {
      if (r.kv_policy.starts_with("layers:")) {
        const size_t at = r.kv_policy.rfind('@');
        const std::string list = r.kv_policy.substr(at + 1, r.kv_policy.find(',', at) - at - 1);
        max_layer = std::max<int64_t>(max_layer, list.back() - '0');
      }
      if (r.kv_policy.starts_with("heads:")) {
        const size_t at = r.kv_policy.find("@kv=") + 4;
        const std::string list = r.kv_policy.substr(at, r.kv_policy.find(',', at) - at);
        max_head = std::max<int64_t>(max_head, list.back() - '0');
      }
    }
    EXPECT_EQ(max_layer, std::min<int64_t>(shape.num_layers, 3) - 1) << shape.num_layers;
    EXPECT_EQ(max_head, std::min<int64_t>(shape.num_kv_heads, 2) - 1) << shape.num_kv_heads;
  }
}

// The soak's normal requests cover both endpoints, n > 1, logprobs and stop strings, and every
// policy on both endpoints.
TEST(Soak, CatalogueCoversEveryKind) {
  const std::vector<SoakRequest> catalogue = soak_catalogue({});
  std::map<std::string, std::set<ApiEndpoint>> policies;
  bool n2[2] = {}, logprobs[2] = {}, stop[2] = {};
  for (const SoakRequest& r : catalogue) {
    const int e = r.endpoint == ApiEndpoint::kChat ? 1 : 0;
    policies[r.kv_policy].insert(r.endpoint);
    n2[e] |= r.n > 1;
    logprobs[e] |= r.logprobs;
    stop[e] |= !r.stop.empty();
    const nlohmann::json body = r.body();
    EXPECT_EQ(body["stream"], true);
    EXPECT_EQ(body["temperature"], 0.0);
    EXPECT_EQ(body.contains("messages"), e == 1);
  }
  for (int e : {0, 1}) EXPECT_TRUE(n2[e] && logprobs[e] && stop[e]) << "endpoint " << e;
  for (const char* name : {"full", "streaming", "h2o", "snapkv", "pyramidkv", "adakv", "fastgen",
                           "quest", "lserve", "layerwise", "heads", "layers"}) {
    const auto it = std::find_if(policies.begin(), policies.end(),
                                 [&](const auto& p) { return p.first.starts_with(name); });
    ASSERT_NE(it, policies.end()) << name;
    EXPECT_EQ(it->second.size(), 2u) << name;
  }
}

// A conversation's next turn resends the first turn's prompt and answer before its own text:
// as user and assistant messages on chat, concatenated on completions.
TEST(Soak, NextTurnsResendThePromptAndAnswer) {
  const std::vector<SoakRequest> catalogue = soak_catalogue({});
  for (const SoakRequest& first : catalogue) {
    if (first.n != 1) continue;
    const SoakRequest next = next_turn(first, "ANSWER", 0);
    EXPECT_EQ(next.endpoint, first.endpoint);
    EXPECT_EQ(next.kv_policy, first.kv_policy);
    EXPECT_NE(next.label().find("next turn"), std::string::npos);
    const nlohmann::json body = next.body();
    if (first.endpoint == ApiEndpoint::kChat) {
      ASSERT_EQ(body["messages"].size(), 3u);
      EXPECT_EQ(body["messages"][0]["content"], first.prompt);
      EXPECT_EQ(body["messages"][1],
                nlohmann::json({{"role", "assistant"}, {"content", "ANSWER"}}));
      EXPECT_EQ(body["messages"][2]["content"], next.prompt);
    } else {
      EXPECT_EQ(body["prompt"], first.prompt + "ANSWER" + next.prompt);
    }
    EXPECT_FALSE(body.contains("stop"));
  }
  EXPECT_EQ(next_turn(catalogue[0], "", 1).n, 2);
  EXPECT_TRUE(next_turn(catalogue[0], "", 0).logprobs);
}

}  // namespace
}  // namespace sieve::loadgen
