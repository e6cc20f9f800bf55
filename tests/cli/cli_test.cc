// The `sieve` binary as a user runs it: exit codes, JSON output, clear errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shared_data.h"

namespace sieve {
namespace {

struct Result {
  int exit_code = -1;
  std::string out;  // stdout and stderr together when merge_stderr
};

Result run(const std::string& args, bool merge_stderr = false) {
  std::string command = std::string(SIEVE_BINARY_DIR) + "/sieve " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  Result result;
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.out.append(buffer.data(), n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string model() { return testing::shared_path("models/stories260K.gguf"); }

TEST(Cli, HelpForEveryCommand) {
  Result top = run("--help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* command : {"run", "batch", "tokenize", "perplexity", "quantize", "gen-model", "bench", "bench-engine", "bench-serve", "calibrate"}) {
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
  EXPECT_EQ(out["prompt_tokens"].get<std::vector<int>>(), golden[0]["prompt_tokens"].get<std::vector<int>>());
  EXPECT_GT(out["generated_tokens_per_second"].get<double>(), 0.0);
}

TEST(Cli, RunStreamsTextAndReportsSpeedOnStderr) {
  Result r = run("run -m " + model() + " -p 'Once upon a time' -n 8 --temp 0", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

TEST(Cli, BatchRunsEveryPromptAndMatchesRun) {
  const std::string path = (std::filesystem::temp_directory_path() / "sieve_cli_prompts.txt").string();
  {
    std::ofstream out(path);
    out << "Once upon a time\n\n{\"prompt\": \"The little dog\", \"max_tokens\": 5}\nLily and Ben\n";
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

TEST(Cli, TokenizeVocabOnlyFile) {
  Result r = run("tokenize -m " + testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf") +
                 " --ids 'Hello world'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "[1, 15043, 3186]\n");
  r = run("tokenize -m " + testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf") +
          " --no-bos --json 'Hello world'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>(), (std::vector<int>{15043, 3186}));
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

TEST(Cli, PromptLongerThanContextIsRejected) {
  std::string prompt(3000, 'a');
  for (size_t i = 1; i < prompt.size(); i += 2) prompt[i] = ' ';
  Result r = run("run -m " + model() + " -p '" + prompt + "' -n 1", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("context"), std::string::npos) << r.out.substr(0, 300);
}

TEST(Cli, ServeRefusesADefaultPolicyItCannotRun) {
  // Checked at start, not left to fail every request: an lserve default needs a profile.
  Result r = run("serve -m " + model() + " --port 0 -t 2 --kv-policy lserve:K=4", /*merge_stderr=*/true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--calibration"), std::string::npos) << r.out;
  Result bad = run("serve -m " + model() + " --port 0 -t 2 --kv-policy snapkv:B=", /*merge_stderr=*/true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("snapkv"), std::string::npos) << bad.out;
}

TEST(Cli, CalibrateWritesAProfileOfTheModelsHeads) {
  const std::string path = (std::filesystem::temp_directory_path() / "sieve_cli_calibration.json").string();
  std::filesystem::remove(path);
  Result r = run("calibrate -m " + model() + " -f " + testing::shared_path("golden/stories260K/tinystories_valid.txt") +
                 " --samples 3 --prompt-len 120 --sinks 4 --window 16 -t 2 -o " + path, true);
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
  Result short_text = run("calibrate -m " + model() + " -f " + model() + " --samples 100000 -o " + path, true);
  EXPECT_NE(short_text.exit_code, 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sieve
