// generation_config.json as vLLM's --generation-config auto reads it.
#include "hf/generation_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "error_of.h"

namespace sieve::hf {
namespace {

class GenerationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sieve_generation_config_" +
            std::to_string(::testing::UnitTest::GetInstance()->current_test_info()->line()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "generation_config.json").string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(GenerationConfigTest, ReadsWhatVllmApplies) {
  // Llama 3.1 Instruct's, with Qwen's extra fields.
  const GenerationConfig c = read_generation_config(write(R"({
    "bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
    "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
    "max_new_tokens": 2048, "transformers_version": "4.45.0.dev0"})"));
  EXPECT_FLOAT_EQ(*c.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*c.top_p, 0.9f);
  EXPECT_EQ(*c.top_k, 20);
  EXPECT_FALSE(c.min_p);
  EXPECT_FLOAT_EQ(*c.repetition_penalty, 1.05f);
  EXPECT_EQ(*c.max_new_tokens, 2048);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));

  const GenerationConfig one =
      read_generation_config(write(R"({"eos_token_id": 2, "top_k": 0, "temperature": null})"));
  EXPECT_EQ(one.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(one.top_k) << "0 is no limit";
  EXPECT_FALSE(one.temperature) << "null is absent";
  EXPECT_TRUE(read_generation_config(write("{}")).empty());
  EXPECT_EQ(find_generation_config(dir_.string()), (dir_ / "generation_config.json").string());
  EXPECT_FALSE(find_generation_config((dir_ / "nowhere").string()));
}

TEST_F(GenerationConfigTest, BadFieldsAreErrorsNamingTheFileAndField) {
  const auto error = [&](const std::string& text) {
    return testing::error_of([&] { read_generation_config(write(text)); });
  };
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"temperature": "hot"})", "temperature"},
           {R"({"top_p": 1.5})", "top_p"},
           {R"({"top_k": 2.5})", "top_k"},
           {R"({"max_new_tokens": 0})", "max_new_tokens"},
           {R"({"eos_token_id": [1, "two"]})", "eos_token_id"},
           {R"({"eos_token_id": -3})", "eos_token_id"},
       }) {
    const std::string message = error(text);
    EXPECT_NE(message.find("generation_config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(field), std::string::npos) << message;
  }
  EXPECT_NE(error("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error("{\"top_p\": ").find("generation_config.json"), std::string::npos);
}

TEST_F(GenerationConfigTest, FolderWithoutOneTakesConfigJsonsEosIds) {
  const std::string config_path = (dir_ / "config.json").string();
  EXPECT_FALSE(read_folder_generation_config(dir_.string())) << "no files";
  // Phi-3-like: a list, whose other ids are stop ids too; the sampling fields an old config.json
  // may hold are not taken.
  std::ofstream(config_path) << R"({"eos_token_id": [32000, 32001, 32007], "temperature": 0.7})";
  auto found = read_folder_generation_config(dir_.string());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->first, config_path);
  EXPECT_EQ(found->second.eos_token_ids, (std::vector<int32_t>{32000, 32001, 32007}));
  EXPECT_FALSE(found->second.temperature);
  std::ofstream(config_path) << R"({"eos_token_id": 2})";
  EXPECT_EQ(read_folder_generation_config(dir_.string())->second.eos_token_ids,
            std::vector<int32_t>{2});
  std::ofstream(config_path) << R"({"vocab_size": 100})";
  EXPECT_FALSE(read_folder_generation_config(dir_.string())) << "nothing to apply";
  std::ofstream(config_path) << R"({"eos_token_id": "two"})";
  const std::string message =
      testing::error_of([&] { read_folder_generation_config(dir_.string()); });
  EXPECT_NE(message.find("config.json: 'eos_token_id' must be a token id"), std::string::npos)
      << message;
  // generation_config.json, when there is one, is what applies.
  const std::string path = write(R"({"eos_token_id": [5, 6], "top_k": 4})");
  found = read_folder_generation_config(dir_.string());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->first, path);
  EXPECT_EQ(found->second.eos_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(found->second.top_k, 4);
}

}  // namespace
}  // namespace sieve::hf
