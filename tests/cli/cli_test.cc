// The `sieve` binary as a user runs it: exit codes, JSON output, clear errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cli/run_sieve.h"
#include "shared_data.h"

namespace sieve {
namespace {

using Result = testing::CliResult;

Result run(const std::string& args, bool merge_stderr = false) {
  return testing::run_sieve(args, merge_stderr);
}

std::string model() { return testing::shared_path("models/stories260K.gguf"); }

TEST(Cli, HelpForEveryCommand) {
  Result top = run("--help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* command : {"run", "batch", "tokenize", "perplexity", "quantize", "gen-model",
                              "bench", "bench-engine", "bench-serve", "calibrate", "soak"}) {
    EXPECT_NE(top.out.find(command), std::string::npos) << command;
    Result help = run(std::string(command) + " --help");
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_NE(help.out.find("Usage"), std::string::npos) << command;
  }
}

TEST(Cli, RunGreedyJsonMatchesGolden) {
  Result r = run("run -m " + model() + " -p 'Once upon a time' -n 16 --temp 0 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json out = nlohmann::json::parse(r.out);
  std::ifstream in(testing::shared_path("golden/stories260K/greedy.json"));
  nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<int> want = golden[0]["tokens"].get<std::vector<int>>();
  want.resize(16);
  EXPECT_EQ(out["tokens"].get<std::vector<int>>(), want);
  EXPECT_EQ(out["prompt_tokens"].get<std::vector<int>>(),
            golden[0]["prompt_tokens"].get<std::vector<int>>());
  EXPECT_GT(out["generated_tokens_per_second"].get<double>(), 0.0);
}

TEST(Cli, RunStreamsTextAndReportsSpeedOnStderr) {
  Result r = run("run -m " + model() + " -p 'Once upon a time' -n 8 --temp 0", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

TEST(Cli, BatchRunsEveryPromptAndMatchesRun) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "sieve_cli_prompts.txt").string();
  {
    std::ofstream out(path);
    out << "Once upon a time\n\n{\"prompt\": \"The little dog\", \"max_tokens\": 5}\nLily and "
           "Ben\n";
  }
  Result r = run("batch -m " + model() + " -f " + path + " -n 12 --json --kv-tokens 512");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["usage"]["completion_tokens"].get<int>(), 5);
  EXPECT_EQ(lines[0]["usage"]["completion_tokens"].get<int>(), 12);
  Result alone = run("run -m " + model() + " -p 'Once upon a time' -n 12 --temp 0 --json");
  ASSERT_EQ(alone.exit_code, 0);
  EXPECT_EQ(lines[0]["tokens"], nlohmann::json::parse(alone.out)["tokens"]);
  std::filesystem::remove(path);

  Result bad = run("batch -m " + model() + " -f /nonexistent/prompts.txt", true);
  EXPECT_NE(bad.exit_code, 0);
}

// run and batch take a request's KV policy: a small window holds fewer pages than dense, and
// a policy the model cannot run is an error before anything is generated.
TEST(Cli, RunAndBatchTakeAKvPolicy) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"));
  std::string text(600, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  for (char& c : text) {
    if (c == '\'' || c == '\n') c = ' ';
  }
  Result r = run("run -m " + model() + " -p '" + text +
                 "' -n 40 --temp 0 --json --kv-policy streaming:S=4,W=16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["kv_policy"], "streaming:S=4,W=16");
  EXPECT_EQ(out["tokens"].size(), 40u);
  EXPECT_LT(out["kv_cache"]["pages"].get<int>(), out["kv_cache"]["dense_pages"].get<int>());

  const std::string path =
      (std::filesystem::temp_directory_path() / "sieve_cli_policy_prompts.txt").string();
  {
    std::ofstream prompts(path);
    prompts << text << "\n";
  }
  Result b = run("batch -m " + model() + " -f " + path + " -n 40 --json --kv-policy snapkv:B=16");
  ASSERT_EQ(b.exit_code, 0) << b.out;
  const nlohmann::json line = nlohmann::json::parse(b.out);
  EXPECT_LT(line["usage"]["kv_cache"]["pages"].get<int>(),
            line["usage"]["kv_cache"]["dense_pages"].get<int>());
  std::filesystem::remove(path);

  Result bad = run("run -m " + model() + " -p hi -n 4 --kv-policy lserve:K=4", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--calibration"), std::string::npos) << bad.out;
}

TEST(Cli, TokenizeVocabOnlyFile) {
  Result r =
      run("tokenize -m " + testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf") +
          " --ids 'Hello world'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "[1, 15043, 3186]\n");
  r = run("tokenize -m " + testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf") +
          " --no-bos --json 'Hello world'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>(),
            (std::vector<int>{15043, 3186}));
}

TEST(Cli, BadModelFileIsAClearError) {
  const std::string path = (std::filesystem::temp_directory_path() / "sieve_cli_bad.gguf").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "GGUF\x03\x00\x00\x00 truncated";
  }
  Result r = run("run -m " + path + " -p hi -n 1", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
  std::filesystem::remove(path);

  r = run("run -m /nonexistent.gguf -p hi", true);
  EXPECT_NE(r.exit_code, 0);
}

TEST(Cli, PromptLongerThanContextIsRejectedUnlessTheContextIsStretched) {
  std::string prompt(3000, 'a');
  for (size_t i = 1; i < prompt.size(); i += 2) prompt[i] = ' ';
  Result r = run("run -m " + model() + " -p '" + prompt + "' -n 1", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("context"), std::string::npos) << r.out.substr(0, 300);
  // A longer context, the model's RoPE stretched to it (as llama.cpp's -c with --rope-scaling).
  Result stretched = run("run -m " + model() + " -p '" + prompt +
                         "' -n 1 -t 2 --ctx-size 4096 --rope-scaling yarn --rope-scale 8");
  EXPECT_EQ(stretched.exit_code, 0) << stretched.out.substr(0, 300);
}

TEST(Cli, ServeRefusesADefaultPolicyItCannotRun) {
  // Checked at start, not left to fail every request: an lserve default needs a profile.
  Result r =
      run("serve -m " + model() + " --port 0 -t 2 --kv-policy lserve:K=4", /*merge_stderr=*/true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--calibration"), std::string::npos) << r.out;
  Result bad =
      run("serve -m " + model() + " --port 0 -t 2 --kv-policy snapkv:B=", /*merge_stderr=*/true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("snapkv"), std::string::npos) << bad.out;
}

// --kv-dtype takes the same names on every command that runs a KV cache; an unknown one is a
// usage error listing them, and a dtype the model cannot store is an error naming its head_dim.
TEST(Cli, KvDTypeIsOneOptionOnEveryCommand) {
  const std::string copy_lm = testing::shared_path("models/copy/copy-lm.gguf");
  for (const char* command : {"run", "batch", "serve", "eval", "bench-engine"}) {
    Result help = run(std::string(command) + " --help");
    EXPECT_NE(help.out.find("f32|f16|q8|q4"), std::string::npos) << command;
    Result bad = run(std::string(command) + " -m " + model() + " --kv-dtype q5", true);
    EXPECT_NE(bad.exit_code, 0) << command;
    EXPECT_NE(bad.out.find("use one of f32, f16, q8, q4"), std::string::npos)
        << command << ": " << bad.out;
  }
  Result small_head = run("run -m " + model() + " -p hi -n 1 --kv-dtype q4", true);
  EXPECT_EQ(small_head.exit_code, 1);
  EXPECT_NE(small_head.out.find("head_dim is 8"), std::string::npos) << small_head.out;
  for (const char* dtype : {"q8", "q4"}) {
    Result r = run("run -m " + copy_lm + " -p 'Once upon a time' -n 8 --temp 0 -t 2 --json " +
                   "--kv-dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << dtype << ": " << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].size(), 8u) << dtype;
  }
}

// llama-perplexity's --chunks, and its default F16 KV cache through --kv-dtype.
TEST(Cli, PerplexityTakesChunksAndAKvDType) {
  const std::string text = testing::shared_path("golden/stories260K/tinystories_valid.txt");
  nlohmann::json by_dtype;
  for (const char* dtype : {"f32", "f16"}) {
    Result r = run("perplexity -m " + model() + " -f " + text + " -c 64 --chunks 3 -t 2 --json " +
                   "--kv-dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << dtype << ": " << r.out;
    by_dtype[dtype] = nlohmann::json::parse(r.out);
    EXPECT_EQ(by_dtype[dtype]["n_chunks"].get<int>(), 3) << dtype;
    EXPECT_EQ(by_dtype[dtype]["scored_tokens"].get<int>(), 3 * 31) << dtype;
  }
  const double f32 = by_dtype["f32"]["ppl"].get<double>(),
               f16 = by_dtype["f16"]["ppl"].get<double>();
  EXPECT_NE(f32, f16);  // the cache's rounding reaches the logits
  EXPECT_NEAR(f16, f32, 1e-2 * f32);
  Result bad = run("perplexity -m " + model() + " -f " + text + " --kv-dtype q5", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("use one of f32, f16, q8, q4"), std::string::npos) << bad.out;
}

// --speculative-config takes vLLM's JSON on every command that builds an engine from options; a
// bad one is a usage error naming the key, and a method the engine cannot run stops serve at
// start. Speculation does not change greedy tokens.
TEST(Cli, SpeculativeConfigIsOneOptionOnEveryEngineCommand) {
  for (const char* command : {"run", "batch", "serve", "bench-engine"}) {
    Result help = run(std::string(command) + " --help");
    EXPECT_NE(help.out.find("--speculative-config"), std::string::npos) << command;
    Result bad = run(
        std::string(command) + " -m " + model() + R"( --speculative-config '{"method":"ngram"}')",
        true);
    EXPECT_NE(bad.exit_code, 0) << command;
    EXPECT_NE(bad.out.find("num_speculative_tokens"), std::string::npos)
        << command << ": " << bad.out;
  }
  Result not_json =
      run("serve -m " + model() + " --port 0 -t 2 --speculative-config '{oops'", true);
  EXPECT_NE(not_json.exit_code, 0);
  EXPECT_NE(not_json.out.find("not valid JSON"), std::string::npos) << not_json.out;
  Result unavailable = run("serve -m " + model() +
                               " --port 0 -t 2 --speculative-config "
                               R"('{"method":"draft_model","num_speculative_tokens":2,)"
                               R"("model":"/nonexistent/draft.gguf"}')",
                           true);
  EXPECT_NE(unavailable.exit_code, 0);  // the draft file is loaded at start: its error names it
  EXPECT_NE(unavailable.out.find("draft model '/nonexistent/draft.gguf': cannot open"),
            std::string::npos)
      << unavailable.out;

  const std::string prompt =
      " -p 'Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom' -n 32 --temp 0 -t 2 "
      "--json";
  Result plain = run("run -m " + model() + prompt);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  Result spec = run("run -m " + model() + prompt +
                    R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4}')");
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  const nlohmann::json p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["tokens"], p["tokens"]);
  EXPECT_FALSE(p.contains("speculative"));
  EXPECT_GT(s["speculative"]["accepted_tokens"].get<int>(), 0) << s["speculative"];
}

// bench-engine on held-out text (--prompt-file): the depth point's speculative variant gives the
// plain point's tokens and says so; concurrent requests read the text from different offsets.
TEST(Cli, BenchEngineOnATextChecksSpeculativeTokensAgainstPlain) {
  const std::string copy = testing::shared_path("models/copy/copy-lm.gguf");
  Result r = run("bench-engine -m " + copy + " -t 2 --concurrency 2 --prompt-tokens 64 " +
                 "--output-tokens 8 --depths 200 --depth-decode-tokens 24 --prompt-file " +
                 testing::shared_path("models/copy/heldout.txt") +
                 " --depth-speculative "
                 "'{\"method\":\"self_sparse\",\"num_speculative_tokens\":2,"
                 "\"kv_policy\":\"streaming:S=4,W=60\"}' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  ASSERT_EQ(out["depths"].size(), 2u);
  const nlohmann::json &plain = out["depths"][0], &speculative = out["depths"][1];
  EXPECT_EQ(plain["speculative"], "none");
  EXPECT_TRUE(plain["same_tokens_as_baseline"].get<bool>());
  // The decode window split into its first step and the steady steps after it.
  const double first = plain["first_step_seconds"].get<double>();
  const double steady = plain["steady_tokens_per_s"].get<double>();
  const double window = plain["decode_seconds"].get<double>();
  ASSERT_GT(first, 0.0);
  ASSERT_GT(steady, 0.0);
  EXPECT_NEAR((plain["decode_tokens"].get<int>() - 1) / steady + first, window, 1e-9 * window);
  EXPECT_NE(speculative["speculative"], "none");
  EXPECT_GT(speculative["spec_draft_tokens"].get<int>(), 0);
  EXPECT_TRUE(speculative["same_tokens_as_baseline"].get<bool>());
  ASSERT_EQ(out["concurrency"].size(), 1u);
  EXPECT_EQ(out["concurrency"][0]["prompt_tokens"], 2 * 64);
  Result empty = run("bench-engine -m " + copy + " --prompt-file /dev/null --depths 8", true);
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.out.find("no text"), std::string::npos) << empty.out;
}

// --depth-twin: every depth > 0 point runs again beside a depth-0 twin, and reports the ratio of
// the two steady rates; the second run generates the first run's greedy tokens.
TEST(Cli, BenchEngineDepthTwinSetsEachDeepPointBesideADepthZeroTwin) {
  const std::string copy = testing::shared_path("models/copy/copy-lm.gguf");
  const std::string args = "bench-engine -m " + copy +
                           " -t 2 --concurrency 1 --prompt-tokens 16 --output-tokens 2 "
                           "--depths 0,200 --depth-decode-tokens 16 --kv-policy full "
                           "--kv-policy streaming:S=4,W=60 --json";
  Result twin = run(args + " --depth-twin");
  ASSERT_EQ(twin.exit_code, 0) << twin.out;
  const nlohmann::json out = nlohmann::json::parse(twin.out);
  EXPECT_TRUE(out["config"]["depth_twin"].get<bool>());
  ASSERT_EQ(out["depths"].size(), 4u);
  for (const nlohmann::json& point : out["depths"]) {
    if (point["depth"].get<int>() == 0) {
      EXPECT_EQ(point["steady_ratio_vs_twin"].get<double>(), 0.0) << point;  // no twin at 0
      continue;
    }
    const double own = point["steady_tokens_per_s"].get<double>();
    const double twin_rate = point["twin_steady_tokens_per_s"].get<double>();
    const double ratio = point["steady_ratio_vs_twin"].get<double>();
    ASSERT_GT(own, 0.0) << point;
    ASSERT_GT(twin_rate, 0.0) << point;
    EXPECT_GT(ratio, 0.0) << point;
    EXPECT_TRUE(point["twin_same_tokens"].get<bool>()) << point;
  }
  Result plain = run(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const nlohmann::json alone = nlohmann::json::parse(plain.out);
  EXPECT_FALSE(alone["config"]["depth_twin"].get<bool>());
  for (const nlohmann::json& point : alone["depths"]) {
    EXPECT_EQ(point["steady_ratio_vs_twin"].get<double>(), 0.0) << point;
    EXPECT_EQ(point["twin_steady_tokens_per_s"].get<double>(), 0.0) << point;
  }
}

TEST(Cli, CalibrateWritesAProfileOfTheModelsHeads) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "sieve_cli_calibration.json").string();
  std::filesystem::remove(path);
  Result r = run("calibrate -m " + model() + " -f " +
                     testing::shared_path("golden/stories260K/tinystories_valid.txt") +
                     " --samples 3 --prompt-len 120 --sinks 4 --window 16 -t 2 -o " + path,
                 true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(path);
  const nlohmann::json profile = nlohmann::json::parse(in);
  EXPECT_EQ(profile["format"], "sieve-calibration");
  EXPECT_EQ(profile["num_samples"], 3);
  EXPECT_FALSE(profile["model"]["fingerprint"].get<std::string>().empty());
  ASSERT_EQ(profile["streaming_scores"].size(), 5u);  // stories260K: 5 layers x 4 KV heads
  double spread_min = 1.0, spread_max = 0.0;
  for (const auto& layer : profile["streaming_scores"]) {
    ASSERT_EQ(layer.size(), 4u);
    for (double score : layer.get<std::vector<double>>()) {
      EXPECT_GE(score, 0.0);
      EXPECT_LE(score, 1.0);
      spread_min = std::min(spread_min, score);
      spread_max = std::max(spread_max, score);
    }
  }
  EXPECT_LT(spread_min, spread_max) << "heads differ in how local their attention is";
  // Too little text for the samples asked is a clear error.
  Result short_text =
      run("calibrate -m " + model() + " -f " + model() + " --samples 100000 -o " + path, true);
  EXPECT_NE(short_text.exit_code, 0);
  std::filesystem::remove(path);
}

// sieve bench: prefill GFLOP/s counts 2 x the layers' matmul parameters per prompt token, and is
// set against the FMA peak.
TEST(Cli, BenchReportsPrefillGflopsAndWeightType) {
  Result r =
      run("bench -m " + model() +
          " --bandwidth-mib 16 --reps 1 --prompt-tokens 32 --decode-tokens 4 --rounds 2 -t 2 "
          "--json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  ASSERT_EQ(out["models"].size(), 1u);
  const nlohmann::json& m = out["models"][0];
  EXPECT_EQ(m["weight_type"], "F32");
  // stories260K: 5 layers of dim 64, 8 heads / 4 KV heads of 8 (kv_dim 32), ffn 172:
  // q 64*64 + k 32*64 + v 32*64 + o 64*64 + gate, up, down 172*64 each = 45312 per layer.
  EXPECT_EQ(m["matmul_params_per_token"], 5 * 45312);
  EXPECT_EQ(m["prompt_tokens"], 32);
  const double expected_gflops = 2.0 * 5 * 45312 * m["prompt_tokens_per_s"].get<double>() / 1e9;
  EXPECT_NEAR(m["prompt_gflop_per_s"].get<double>(), expected_gflops,
              1e-9 * expected_gflops + 1e-12);
  EXPECT_GT(m["prompt_gflop_per_s"].get<double>(), 0.0);
  // Prefill against the FMA peak probed around the prompt.
  EXPECT_GT(out["fma_peak_gflop_per_s"].get<double>(), 0.0);
  const double peak = m["prompt_fma_peak_gflop_per_s"].get<double>();
  ASSERT_GT(peak, 0.0);
  EXPECT_NEAR(m["prompt_peak_fraction"].get<double>(), m["prompt_gflop_per_s"].get<double>() / peak,
              1e-12);
  EXPECT_GT(m["decode_tokens_per_s"].get<double>(), 0.0);
  // Two decode rounds, each set against the bandwidth passes around it; the median of two is
  // their mean.
  ASSERT_EQ(m["round_utilisation"].size(), 2u);
  const double r0 = m["round_utilisation"][0].get<double>(),
               r1 = m["round_utilisation"][1].get<double>();
  EXPECT_GT(r0, 0.0);
  EXPECT_GT(r1, 0.0);
  EXPECT_NEAR(m["adjacent_utilisation"].get<double>(), 0.5 * (r0 + r1), 1e-12);
}

// --prefill-attention takes f32, bf16-pv and bf16 on every command that loads a model and on
// bench (whose JSON records it); anything else is a usage error listing them. A long prompt (a
// prefill chunk of more than 32 rows) runs under each.
TEST(Cli, PrefillAttentionIsOneOptionOnEveryCommand) {
  for (const char* command : {"run", "batch", "serve", "eval", "bench-engine", "bench"}) {
    Result bad = run(std::string(command) + " -m " + model() + " --prefill-attention bf32", true);
    EXPECT_NE(bad.exit_code, 0) << command;
    EXPECT_NE(bad.out.find("f32"), std::string::npos) << command << ": " << bad.out;
    EXPECT_NE(bad.out.find("bf16-pv"), std::string::npos) << command << ": " << bad.out;
  }
  const std::string copy_lm = testing::shared_path("models/copy/copy-lm.gguf");
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "the cat sat on the mat. ";
  for (const char* mode : {"f32", "bf16-pv", "bf16"}) {
    Result r = run("run -m " + copy_lm + " -p '" + prompt + "' -n 8 --temp 0 -t 2 --json " +
                   "--prefill-attention " + mode);
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.out;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    EXPECT_GT(out["prompt_tokens"].size(), 32u) << mode;
    EXPECT_EQ(out["tokens"].size(), 8u) << mode;
  }
  Result bench = run("bench -m " + model() +
                     " --bandwidth-mib 16 --reps 1 --prompt-tokens 64 --decode-tokens 2 "
                     "--rounds 1 -t 2 --prefill-attention bf16 --json");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_EQ(nlohmann::json::parse(bench.out)["prefill_attention"], "bf16");
  Result engine = run("bench-engine -m " + model() +
                      " --concurrency 1 --prompt-tokens 40 --output-tokens 2 --depths 0 -t 2 "
                      "--prefill-attention bf16-pv --json");
  ASSERT_EQ(engine.exit_code, 0) << engine.out;
  EXPECT_EQ(nlohmann::json::parse(engine.out)["config"]["prefill_attention"], "bf16-pv");
}

// --- files sieve must refuse at load ---------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("sieve_cli_" + name)).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// GGUF tensor info: u64 name length, name, u32 dimension count, u64 dims..., u32 ggml type.
void set_tensor_type(std::string& gguf, const std::string& name, uint32_t ggml_type) {
  std::string record(8, '\0');
  const uint64_t length = name.size();
  std::memcpy(record.data(), &length, 8);
  record += name;
  const size_t at = gguf.find(record);
  ASSERT_NE(at, std::string::npos) << name;
  uint32_t num_dims = 0;
  std::memcpy(&num_dims, gguf.data() + at + record.size(), 4);
  std::memcpy(gguf.data() + at + record.size() + 4 + 8 * num_dims, &ggml_type, 4);
}

// Overwrites the value of general.architecture (u32 type 8, u64 length, bytes) in place.
void set_architecture(std::string& gguf, const std::string& arch) {
  const std::string key = "general.architecture";
  const size_t at = gguf.find(key);
  ASSERT_NE(at, std::string::npos);
  uint64_t length = 0;
  std::memcpy(&length, gguf.data() + at + key.size() + 4, 8);
  ASSERT_EQ(length, arch.size()) << "same length keeps every later offset";
  gguf.replace(at + key.size() + 12, arch.size(), arch);
}

// Both `run` and `serve` stop at load with the message, exit code 1, before any request.
void expect_refused_at_load(const std::string& path, const std::vector<std::string>& wanted) {
  for (const std::string& command :
       {"run -m " + path + " -p hi -n 1", "serve -m " + path + " --port 0 -t 2"}) {
    SCOPED_TRACE(command);
    Result r = run(command, /*merge_stderr=*/true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
    for (const std::string& part : wanted)
      EXPECT_NE(r.out.find(part), std::string::npos) << part << " in " << r.out;
  }
}

// A real llama.cpp file whose layer matrices are TQ2_0 (ternary), a type sieve does not run.
TEST(Cli, UnsupportedTensorTypeIsRefusedAtLoad) {
  expect_refused_at_load(
      testing::shared_path("golden/quant/base-TQ2_0.gguf"),
      {"'blk.0.attn_q.weight'", "type TQ2_0", "supported: F32, F16, BF16, Q8_0, Q4_0", "Q4_K",
       "Q6_K", "IQ4_XS", "sieve quantize"});
  // IQ2_XXS (ggml type 16) in place of one F16 matrix: its 256x256 values take fewer bytes,
  // so the file stays valid GGUF.
  std::string bytes = read_file(testing::shared_path("golden/quant/base-F16.gguf"));
  set_tensor_type(bytes, "blk.1.ffn_up.weight", 16);
  const std::string path = write_temp("iq2_xxs.gguf", bytes);
  expect_refused_at_load(path, {"'blk.1.ffn_up.weight'", "type IQ2_XXS", "supported:"});
  std::filesystem::remove(path);
}

// A K-quant matrix needs rows of whole 256-value super-blocks; stories260K's rows are 64 long.
TEST(Cli, KQuantRowsThatAreNotWholeBlocksAreRefusedAtLoad) {
  std::string bytes = read_file(model());
  set_tensor_type(bytes, "blk.0.attn_q.weight", 12);  // Q4_K
  const std::string path = write_temp("q4k_rows.gguf", bytes);
  expect_refused_at_load(
      path, {"'blk.0.attn_q.weight'", "row length 64", "not a multiple of the Q4_K block size 256",
             "32-value blocks", "re-quantize"});
  std::filesystem::remove(path);
}

TEST(Cli, UnknownArchitectureIsRefusedAtLoad) {
  std::string bytes = read_file(testing::shared_path("golden/quant/base-F16.gguf"));
  set_architecture(bytes, "gpt-x");
  const std::string path = write_temp("arch.gguf", bytes);
  expect_refused_at_load(path, {"architecture", "'gpt-x'"});
  std::filesystem::remove(path);
}

// --- sieve quantize --------------------------------------------------------------------------

TEST(Cli, QuantizeRefusesUnknownTypesListingTheChoices) {
  Result r = run("quantize " + model() + " /tmp/sieve_cli_never.gguf q4_k_x", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("unknown type 'q4_k_x'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Q4_K_M"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists("/tmp/sieve_cli_never.gguf"));
}

// Works with this build's quantizers: Q8_0 keeps every matrix Q8_0 (output included).
TEST(Cli, QuantizeQ8_0ComparesAgainstTheInput) {
  const std::string out = (std::filesystem::temp_directory_path() / "sieve_cli_q8_0.gguf").string();
  Result r =
      run("quantize " + model() + " " + out + " q8_0 --compare --compare-tokens 16 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["type"], "Q8_0");
  EXPECT_EQ(report["file_type"], 7);
  EXPECT_EQ(report["tensors"]["output.weight"], "Q8_0");
  EXPECT_EQ(report["tensors"]["blk.0.attn_norm.weight"], "F32");
  EXPECT_EQ(report["comparison"]["tokens_per_prompt"], 16);
  EXPECT_GT(report["comparison"]["top1_agreement"].get<double>(), 0.8);
  EXPECT_LT(report["comparison"]["max_abs_logit_error"].get<double>(), 1.5);
  std::filesystem::remove(out);
}

// The 2-layer base model to Q4_K_M, as llama-quantize chose (golden tensor_type_map), then
// --compare. Waits for the Q4_K / Q6_K quantizers and matmuls of the kernel branches.
TEST(Cli, QuantizeQ4KMFollowsLlamaQuantizeAndTheInput) {
  const std::string input = testing::shared_path("golden/quant/base-F16.gguf");
  const std::string out =
      (std::filesystem::temp_directory_path() / "sieve_cli_q4_k_m.gguf").string();
  Result r = run(
      "quantize " + input + " " + out + " Q4_K_M --compare --compare-tokens 16 -t 2 --json", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(report["type"], "Q4_K_M");
  EXPECT_EQ(report["file_type"], 15);
  std::ifstream in(testing::shared_path("golden/quant/golden.json"));
  for (const nlohmann::json& entry : nlohmann::json::parse(in)) {
    if (entry["file"] == "base-Q4_K_M.gguf") {
      EXPECT_EQ(report["tensors"], entry["tensor_type_map"]);
    }
  }
  EXPECT_GT(report["comparison"]["top1_agreement"].get<double>(), 0.6);
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace sieve
