// `sieve bench-serve` as a user runs it, against the fake streaming server in this process.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "fake_server.h"
#include "sieve_serve.h"
#include "cli/run_sieve.h"
#include "shared_data.h"

namespace sieve {
namespace {

using std::chrono::milliseconds;

using Result = testing::CliResult;

// `sieve bench-serve ARGS`, stdout and stderr together.
Result run(const std::string& args) { return testing::run_sieve("bench-serve " + args, true); }

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / name;
}

TEST(BenchServeCli, SweepOfTwoVariantsWritesJsonPlotAndCompares) {
  testing::FakeOpenAiServer server(
      {.first_chunk_delay = milliseconds(5), .chunk_delay = milliseconds(2)});
  const std::string out = temp_path("sieve_bench_serve.json").string();
  const std::string plot = temp_path("sieve_bench_serve.svg").string();
  const Result r =
      run("--base-url " + server.url() + " --model stories --tokenizer " +
          testing::shared_path("models/stories260K.gguf") +
          " --input-len 32 --output-len 6 --num-prompts 6 --sweep-concurrency 1,3 --warmup 1"
          " --goodput ttft:5000 tpot:5000 --extra-body '{\"kv_policy\":\"dense\"}'"
          " --extra-body '{\"kv_policy\":\"snapkv\"}' --seed 1 --out " +
          out + " --plot " + plot);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("v1 c=3"), std::string::npos) << r.out;
  EXPECT_EQ(server.num_requests(), 4 * (6 + 1));
  // Each point has prompts of its own, so that no point measures the prefix cache of another.
  EXPECT_EQ(server.num_distinct_prompts(), 4u * (6 + 1));
  EXPECT_EQ(server.last_body()["kv_policy"], "snapkv");
  EXPECT_EQ(server.last_body()["model"], "stories");

  std::ifstream in(out);
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["schema_version"], 1);
  EXPECT_EQ(report["config"]["input_len"], 32);
  ASSERT_EQ(report["runs"].size(), 4u);
  for (const nlohmann::json& run : report["runs"]) {
    EXPECT_EQ(run["summary"]["completed"], 6);
    EXPECT_EQ(run["summary"]["output_tokens"], 36);
    ASSERT_EQ(run["requests"].size(), 6u);
    // Goodput counts the requests within both SLOs (5 s TTFT and TPOT): recounted here from
    // each request's own figures, not assumed from how fast this machine happened to be.
    int within_slo = 0;
    for (const nlohmann::json& request : run["requests"]) {
      within_slo +=
          request["ttft_ms"].get<double>() <= 5000 && request["tpot_ms"].get<double>() <= 5000;
    }
    EXPECT_EQ(run["summary"]["good_requests"], within_slo);
    for (const nlohmann::json& request : run["requests"]) {
      EXPECT_EQ(request["output_tokens_source"], "usage");
      EXPECT_EQ(request["output_tokens"], request["num_chunks"]);
      EXPECT_EQ(request["input_tokens"], 32);
      // The fake server's prompt_tokens is the prompt's length in bytes.
      EXPECT_GT(request["prompt_tokens"].get<int>(), 0);
      EXPECT_EQ(request["itl_ms"].size(), 5u);
    }
  }
  EXPECT_EQ(report["runs"][3]["label"], "v1 c=3");
  EXPECT_EQ(report["runs"][3]["extra_body"]["kv_policy"], "snapkv");
  EXPECT_LE(report["runs"][1]["summary"]["max_in_flight"].get<int>(), 3);

  std::ifstream svg_in(plot);
  const std::string svg((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(svg.starts_with("<svg"));
  EXPECT_NE(svg.find("snapkv"), std::string::npos);

  const Result compared = run("--compare " + out + " " + out);
  ASSERT_EQ(compared.exit_code, 0) << compared.out;
  EXPECT_NE(compared.out.find("[v0 c=1]"), std::string::npos) << compared.out;
  EXPECT_NE(compared.out.find("1.00x"), std::string::npos) << compared.out;
  std::filesystem::remove(out);
  std::filesystem::remove(plot);
}

TEST(BenchServeCli, ClearErrors) {
  Result r = run("--base-url localhost:8080 --num-prompts 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("bad --base-url 'localhost:8080'"), std::string::npos) << r.out;

  const std::string refused = "http://127.0.0.1:" + std::to_string(testing::unused_port());
  r = run("--base-url " + refused + " --num-prompts 2 --input-len 8 --output-len 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("cannot connect to " + refused), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every request failed"), std::string::npos) << r.out;

  r = run("--base-url http://127.0.0.1:1 --sweep-concurrency 1,2 --max-concurrency 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--sweep-concurrency"), std::string::npos) << r.out;

  r = run("--base-url http://127.0.0.1:1 --goodput ttft:fast");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("bad --goodput item 'ttft:fast'"), std::string::npos) << r.out;

  r = run("--base-url http://127.0.0.1:1 --extra-body '[1]'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("must be a JSON object"), std::string::npos) << r.out;

  r = run("--compare /nonexistent/a.json /nonexistent/b.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("cannot open '/nonexistent/a.json'"), std::string::npos) << r.out;
}

TEST(BenchServeCli, ServerWithoutExactLengthSupportIsReported) {
  // A server that ignores max_tokens and always streams 3 tokens.
  testing::FakeOpenAiServer server({.default_tokens = 3});
  const std::string dataset = temp_path("sieve_bench_serve.jsonl").string();
  {
    std::ofstream out(dataset);
    out << R"({"prompt": "Once upon a time"})"
        << "\n";
  }
  const Result r = run("--base-url " + server.url() + "/v1 --dataset " + dataset +
                       " --output-len 5 --num-prompts 2 --extra-body '{\"max_tokens\": null}'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("2 requests produced fewer"), std::string::npos) << r.out;
  EXPECT_FALSE(server.last_body().contains("max_tokens"));
  std::filesystem::remove(dataset);
}

TEST(BenchServeCli, TokenCountsEqualSieveServeUsage) {
  const std::string model = testing::shared_path("models/stories260K.gguf");
  testing::SieveServe server(model);
  const std::string out = temp_path("sieve_bench_serve_real.json").string();
  for (const char* endpoint : {"completions", "chat"}) {
    const Result r = run(
        "--base-url " + server.url() + " --endpoint " + endpoint + " --tokenizer " + model +
        " --input-len 48 --output-len 12 --range-ratio 0.5 --num-prompts 6 --sweep-concurrency 1,3"
        " --out " +
        out);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream in(out);
    const nlohmann::json report = nlohmann::json::parse(in);
    for (const nlohmann::json& run : report["runs"]) {
      EXPECT_EQ(run["summary"]["completed"], 6) << endpoint;
      EXPECT_EQ(run["summary"]["output_shorter"], 0) << endpoint;
      for (const nlohmann::json& request : run["requests"]) {
        // ignore_eos + min_tokens give exactly the requested length, counted by the server.
        EXPECT_EQ(request["output_tokens_source"], "usage");
        EXPECT_EQ(request["output_tokens"], request["requested_output_tokens"]) << endpoint;
        // The streamed text re-encodes to as many tokens as the server says it produced, give
        // or take merges across token boundaries.
        EXPECT_GE(request["num_chunks"].get<int>(), 1);
        EXPECT_LE(request["num_chunks"].get<int>(), request["output_tokens"].get<int>());
        if (std::string(endpoint) == "completions") {
          EXPECT_EQ(request["prompt_tokens"].get<int>(),
                    request["input_tokens"].get<int>() + 1);  // + BOS
        }
      }
    }
  }
  std::filesystem::remove(out);
}

// Multi-turn conversations against sieve serve on a compressed cache: every later turn resends
// the answer as text, and continues from all that the turn before computed (its prompt and
// output but the last token), because the server keeps the answer's ids.
TEST(BenchServeCli, MultiTurnConversationsContinueFromTheCompressedCache) {
  const std::string model = testing::shared_path("models/stories260K.gguf");
  testing::SieveServe server(model);
  const std::string out = temp_path("sieve_bench_serve_turns.json").string();
  const Result r = run("--base-url " + server.url() + " --tokenizer " + model +
                       " --input-len 48 --output-len 12 --num-prompts 3 --max-concurrency 3"
                       " --multi-turn 3 --turn-input-len 16 --seed 2"
                       " --extra-body '{\"kv_policy\":\"streaming:S=4,W=16\"}' --out " +
                       out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(out);
  const nlohmann::json report = nlohmann::json::parse(in);
  ASSERT_EQ(report["runs"].size(), 1u);
  const nlohmann::json& requests = report["runs"][0]["requests"];
  ASSERT_EQ(requests.size(), 9u);
  std::map<std::pair<int, int>, const nlohmann::json*> by_turn;
  for (const nlohmann::json& request : requests) {
    by_turn[{request["conversation"].get<int>(), request["turn"].get<int>()}] = &request;
  }
  ASSERT_EQ(by_turn.size(), 9u);
  for (int c = 0; c < 3; ++c) {
    for (int t = 1; t < 3; ++t) {
      const nlohmann::json& before = *by_turn.at({c, t - 1});
      const nlohmann::json& now = *by_turn.at({c, t});
      EXPECT_EQ(now["cached_tokens"].get<int>(),
                before["prompt_tokens"].get<int>() + before["output_tokens"].get<int>() - 1)
          << "conversation " << c << " turn " << t;
    }
  }
  ASSERT_EQ(report["runs"][0]["turns"].size(), 3u);
  EXPECT_GT(report["runs"][0]["turns"][2]["cached_share"].get<double>(), 0.5);
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace sieve
