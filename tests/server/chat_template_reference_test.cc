// The real-template expectations of chat_template_cases.h against @huggingface/jinja (npm, pinned
// in tests/hf/reference): every expected prompt (and every raise_exception message) is what
// Hugging Face's JavaScript Jinja renders for the same template and context, so the hand-worked
// expectations that sieve's renderer is held to are not the project's reading alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "chat_template_cases.h"
#include "node_script.h"

namespace sieve::server {
namespace {

using nlohmann::ordered_json;

TEST(ChatTemplateReference, HuggingFaceJinjaRendersEveryExpectedPrompt) {
  const std::vector<templates::TemplateCase> cases = templates::real_template_cases();
  ordered_json input = ordered_json::array();
  for (const templates::TemplateCase& c : cases) {
    input.push_back({{"name", c.name}, {"source", c.source}, {"context", c.context}});
  }
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("sieve_template_cases_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << input.dump();
  const ordered_json results = ordered_json::parse(testing::run_node_script(
      "tests/hf/reference", "render_cases.mjs", "'" + file.string() + "'"));
  std::filesystem::remove(file);
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const templates::TemplateCase& c = cases[i];
    const ordered_json& got = results[i];
    SCOPED_TRACE(c.name);
    ASSERT_EQ(got.at("name"), c.name);
    if (c.raises) {  // the reference's raise_exception throws the template's message
      ASSERT_TRUE(got.contains("error")) << "the reference rendered: " << got.value("rendered", "");
      EXPECT_EQ(got["error"].get<std::string>(), c.expected);
    } else {
      ASSERT_TRUE(got.contains("rendered")) << "the reference failed: " << got["error"];
      EXPECT_EQ(got["rendered"].get<std::string>(), c.expected);
    }
  }
  std::cout << cases.size() << " expectations rendered alike by @huggingface/jinja\n";
}

}  // namespace
}  // namespace sieve::server
