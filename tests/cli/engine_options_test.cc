// The engine options every engine command shares: what the command line turns into.
#include "cli/engine_options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sieve::cli {
namespace {

engine::EngineConfig parse(std::vector<std::string> args) {
  CLI::App app;
  EngineOptions options;
  options.add_to(app);
  args.insert(args.begin(), "sieve");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return options.engine_config();
}

// No --kv-memory leaves the pool to the engine's default, sized from the model
// (engine::default_kv_memory_bytes); --kv-memory and --kv-tokens win.
TEST(EngineOptions, KvPoolDefaultsToTheModelsSizeUnlessGiven) {
  const engine::EngineConfig by_default = parse({});
  EXPECT_FALSE(by_default.kv_memory_bytes.has_value());
  EXPECT_EQ(by_default.num_kv_pages, 0);

  EXPECT_EQ(parse({"--kv-memory", "100"}).kv_memory_bytes, 100ull << 20);
  const engine::EngineConfig by_tokens = parse({"--kv-tokens", "100", "--page-size", "16"});
  EXPECT_EQ(by_tokens.num_kv_pages, 7);
}

}  // namespace
}  // namespace sieve::cli
