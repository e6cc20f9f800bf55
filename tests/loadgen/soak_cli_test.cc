// `sieve soak` as a user runs it, against a real `sieve serve`: a short soak with abuse, whose
// conversations continue earlier turns under every policy.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli/run_sieve.h"
#include "shared_data.h"
#include "sieve_serve.h"

namespace sieve {
namespace {

TEST(SoakCli, AShortSoakWithAbuseAndConversationsPasses) {
  testing::SieveServe server(testing::shared_path("models/stories260K.gguf"));
  const std::string out = (std::filesystem::temp_directory_path() / "sieve_soak_cli.json").string();
  const testing::CliResult r = testing::run_sieve(
      "soak --base-url " + server.url() +
          " --duration 6 --clients 6 --slow-loris 2 --slow-readers 1 --seed 3 --out " + out,
      true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("result: PASS"), std::string::npos) << r.out;
  std::ifstream in(out);
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["passed"], true);
  EXPECT_EQ(report["greedy_mismatches"], 0);
  EXPECT_EQ(report["kv_pages_used_after"], 0);
  // Every catalogue request of one answer has a next turn; the sparse ones continued their
  // parked state when served right after their first turn (`full`'s two reuse the prefix cache).
  const nlohmann::json& conversations = report["conversations"];
  EXPECT_EQ(conversations["references"], 18);
  EXPECT_EQ(conversations["references_continued"], 16);
  EXPECT_GT(conversations["next_turns_continued"].get<int64_t>(), 0) << r.out;
  EXPECT_GT(report["outcomes"]["conversation"]["completed"].get<int64_t>(), 0);
  EXPECT_GT(report["outcomes"]["malformed"].size(), 0u);
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace sieve
