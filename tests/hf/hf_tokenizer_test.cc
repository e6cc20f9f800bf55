// tokenizer.json / tokenizer_config.json read as GGUF tokenizer keys (hf/hf_tokenizer.h): a
// small byte-level tokenizer written here tokenizes by its merges; malformed files and features
// sieve's tokenizers lack are errors naming the file and what is wrong. (Real tokenizers against
// Hugging Face's own code: hf_reference_test.cc.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "error_of.h"
#include "gguf/gguf.h"
#include "hf/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace sieve {
namespace {

using nlohmann::json;
using testing::error_of;

// GPT-2's byte alphabet for the printable ASCII bytes is the byte itself; a space is U+0120.
json byte_level_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = id++;
  vocab["\xC4\xA0"] = id++;  // "Ġ", a space
  for (const char* merged : {"he", "ll", "hell", "hello", "\xC4\xA0w"}) vocab[merged] = id++;
  return {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", id}, {"content", "<|end|>"}, {"special", true}},
        {{"id", id + 1}, {"content", "<tool>"}, {"special", false}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"h e", json::array({"l", "l"}), "he ll", "hell o"})}}},
  };
}

json config() {
  return {{"eos_token", "<|end|>"},
          {"add_bos_token", false},
          {"chat_template",
           {{{"name", "default"}, {"template", "{{ messages }}"}},
            {{"name", "tool_use"}, {"template", "{{ tools }}"}}}}};
}

std::vector<gguf::KeyValue> metadata(const json& tokenizer, const json& tokenizer_config) {
  return hf::tokenizer_metadata(
      {tokenizer.dump(), tokenizer_config.is_null() ? "" : tokenizer_config.dump(), ""}, "dir",
      std::nullopt);
}

std::unique_ptr<tok::Tokenizer> tokenizer_of(const json& tokenizer, const json& tokenizer_config,
                                             std::optional<uint64_t> vocab_size = std::nullopt) {
  const gguf::File file = gguf::File::assemble(
      hf::tokenizer_metadata({tokenizer.dump(), tokenizer_config.dump(), ""}, "dir", vocab_size),
      {}, nullptr);
  return tok::Tokenizer::create(tok::load_vocab(file));
}

TEST(HfTokenizer, ByteLevelTokenizerMergesAsItsMergesSay) {
  const auto tokenizer = tokenizer_of(byte_level_tokenizer(), config());
  const tok::Vocab& vocab = tokenizer->vocab();
  EXPECT_EQ(vocab.kind, tok::VocabKind::kBpe);
  EXPECT_EQ(vocab.pre, "gpt-2");
  EXPECT_EQ(vocab.merges, (std::vector<std::string>{"h e", "l l", "he ll", "hell o"}));
  const tok::TokenId end = static_cast<tok::TokenId>(vocab.size()) - 2;
  EXPECT_EQ(vocab.eos, end);
  EXPECT_FALSE(vocab.add_bos);
  EXPECT_EQ(vocab.types[end], tok::TokenType::kControl);
  EXPECT_EQ(vocab.types[end + 1], tok::TokenType::kUserDefined);
  // "hello" merges to one token; " w" is not a merge, so two; the special tokens are cut out.
  const std::vector<tok::TokenId> ids =
      tokenizer->encode("hello w<|end|><tool>", {.parse_special = true});
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(tokenizer->token_to_piece(ids[0]), "hello");
  EXPECT_EQ(tokenizer->decode(ids, true), "hello w<|end|><tool>");
  EXPECT_EQ(ids[3], end);
  EXPECT_EQ(ids[4], end + 1);
}

TEST(HfTokenizer, AddedTokenFlagsTakeWhiteSpaceOrWholeWords) {
  // Without flags there is no sieve key: the keys are llama.cpp's converter's, as before.
  EXPECT_FALSE(gguf::File::assemble(metadata(byte_level_tokenizer(), config()), {}, nullptr)
                   .find("tokenizer.sieve.added_token_flags"));
  json tokenizer = byte_level_tokenizer();
  tokenizer["added_tokens"][0]["rstrip"] = true;  // <|end|>, as Phi-3's chat tokens
  tokenizer["added_tokens"][1]["lstrip"] = true;  // <tool>
  tokenizer["added_tokens"][1]["single_word"] = true;
  const gguf::File file = gguf::File::assemble(metadata(tokenizer, config()), {}, nullptr);
  const auto flagged = tok::Tokenizer::create(tok::load_vocab(file));
  const tok::Vocab& vocab = flagged->vocab();
  const tok::TokenId end = static_cast<tok::TokenId>(vocab.size()) - 2, tool = end + 1;
  ASSERT_EQ(vocab.added_token_flags.size(), vocab.size());
  EXPECT_EQ(vocab.added_token_flags[end], (tok::AddedTokenFlags{.rstrip = true}));
  EXPECT_EQ(vocab.added_token_flags[tool],
            (tok::AddedTokenFlags{.lstrip = true, .single_word = true}));
  EXPECT_EQ(file.get_i32_array("tokenizer.sieve.added_token_flags")->at(tool),
            tok::AddedTokenFlags::kLstripBit | tok::AddedTokenFlags::kSingleWordBit);
  auto encode = [&](std::string_view text) {
    return flagged->encode(text, {.parse_special = true});
  };
  const tok::TokenId hello = encode("hello")[0];
  EXPECT_EQ(encode("hello<|end|> \n\nhello"), (std::vector<tok::TokenId>{hello, end, hello}));
  EXPECT_EQ(encode("hello  <tool>"), (std::vector<tok::TokenId>{hello, tool}));
  // Inside a word <tool> is text; the tokens give back their text alone.
  const std::vector<tok::TokenId> inside = encode("hello<tool>");
  EXPECT_EQ(std::find(inside.begin(), inside.end(), tool), inside.end());
  EXPECT_EQ(flagged->decode(inside, true), "hello<tool>");
  EXPECT_EQ(flagged->decode(encode("hello<|end|> \n\nhello"), true), "hello<|end|>hello");
}

TEST(HfTokenizer, BosAndEosFallBackToConfigJsonsIds) {
  auto vocab_of = [](const json& tokenizer_config, const json& model_config) {
    return tok::load_vocab(gguf::File::assemble(
        hf::tokenizer_metadata(
            {byte_level_tokenizer().dump(), tokenizer_config.dump(), "", model_config.dump()},
            "dir", std::nullopt),
        {}, nullptr));
  };
  const json no_special_tokens = {{"add_bos_token", false}};
  const tok::Vocab plain = vocab_of(no_special_tokens, json::object());
  EXPECT_FALSE(plain.bos);
  EXPECT_FALSE(plain.eos);
  const tok::TokenId end = static_cast<tok::TokenId>(plain.size()) - 2;
  // An id, or a list whose first id is the EOS (the others are stop ids: generation_config.h).
  const tok::Vocab from_config =
      vocab_of(no_special_tokens, {{"bos_token_id", 3}, {"eos_token_id", {end, 4, 5}}});
  EXPECT_EQ(from_config.bos, 3);
  EXPECT_EQ(from_config.eos, end);
  EXPECT_EQ(vocab_of(no_special_tokens, {{"eos_token_id", 7}}).eos, 7);
  EXPECT_FALSE(vocab_of(no_special_tokens, {{"eos_token_id", json::array()}}).eos);
  // tokenizer_config.json's tokens win.
  EXPECT_EQ(vocab_of(config(), {{"eos_token_id", 4}}).eos, end);
  // A folder's config.json is read beside its tokenizer files.
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() /
      ("sieve_hf_tokenizer_" + std::to_string(::getpid()) + "_config_ids");
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "tokenizer.json") << byte_level_tokenizer().dump();
  std::ofstream(folder / "tokenizer_config.json") << no_special_tokens.dump();
  std::ofstream(folder / "config.json") << json{{"eos_token_id", {end, 4}}}.dump();
  EXPECT_EQ(tok::load_vocab(hf::open_tokenizer_folder(folder.string())).eos, end);
  std::filesystem::remove_all(folder);
  for (const auto& [model_config, expected] : std::vector<std::pair<json, std::string>>{
           {{{"eos_token_id", 100000}}, "dir/config.json: eos_token_id 100000 is not a token id"},
           {{{"bos_token_id", "1"}}, "dir/config.json: bos_token_id is \"1\", expected a token id"},
           {{{"eos_token_id", {-1}}}, "dir/config.json: eos_token_id is -1"},
           {json::array(), "dir/config.json: not a JSON object"},
       }) {
    const std::string error =
        error_of([&, &model_config = model_config] { vocab_of(no_special_tokens, model_config); });
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  }
}

TEST(HfTokenizer, ChatTemplatesAndPaddingAreTheConvertersKeys) {
  const gguf::File file = gguf::File::assemble(
      hf::tokenizer_metadata({byte_level_tokenizer().dump(), config().dump(), ""}, "dir", 200), {},
      nullptr);
  EXPECT_EQ(file.get_string("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(file.get_string("tokenizer.chat_template.tool_use"), "{{ tools }}");
  const tok::Vocab vocab = tok::load_vocab(file);
  ASSERT_EQ(vocab.size(), 200u);
  EXPECT_EQ(vocab.tokens[199], "[PAD199]");
  EXPECT_EQ(vocab.types[199], tok::TokenType::kUnused);
  // chat_template.jinja takes the place of tokenizer_config.json's.
  const gguf::File with_file = gguf::File::assemble(
      hf::tokenizer_metadata({byte_level_tokenizer().dump(), config().dump(), "{{ x }}"}, "dir",
                             std::nullopt),
      {}, nullptr);
  EXPECT_EQ(with_file.get_string("tokenizer.chat_template"), "{{ x }}");
}

TEST(HfTokenizer, MalformedTokenizerJsonIsAnErrorNamingTheFileAndField) {
  struct Case {
    std::function<void(json&)> change;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](json& t) { t = json::array(); }, "tokenizer.json: not a JSON object"},
      {[](json& t) { t.erase("model"); }, "tokenizer.json: the file has no \"model\""},
      {[](json& t) { t["model"]["type"] = "Unigram"; }, "model type 'Unigram' is not supported"},
      {[](json& t) { t["model"]["vocab"]["he"] = -1; }, "model.vocab['he'] is -1"},
      {[](json& t) { t["model"]["vocab"]["he"] = "1"; }, "model.vocab['he'] is \"1\""},
      {[](json& t) { t["model"]["vocab"]["he"] = 0; }, "gives id 0 to 'he', which is '!'"},
      {[](json& t) { t["model"]["merges"] = 3; }, "model.merges is 3, expected a list"},
      {[](json& t) { t["model"]["merges"][0] = "hello"; }, "model.merges[0] is \"hello\""},
      {[](json& t) {
         t["model"]["merges"][1] = json::array({1, 2});
       },
       "model.merges[1] is [1,2]"},
      {[](json& t) { t["added_tokens"][0].erase("id"); }, "added_tokens[0] needs \"id\""},
      {[](json& t) { t["added_tokens"][0]["rstrip"] = "yes"; },
       "added_tokens[0].rstrip is \"yes\", expected true or false"},
      {[](json& t) { t["model"]["dropout"] = 0.1; }, "BPE dropout is not supported"},
      {[](json& t) {
         t["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer 'Lowercase' is not supported"},
      {[](json& t) {
         t["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}"}}}, {"behavior", "Isolated"}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
       },
       "the pre_tokenizer's regex '\\p{N}"},
      {[](json& t) {
         t["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer 'Whitespace' is not supported"},
      {[](json& t) {
         t["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor 'BertProcessing' is not supported"},
      {[](json& t) { t["model"]["byte_fallback"] = true; },
       "pre_tokenizer 'ByteLevel' is not supported for a SentencePiece-style tokenizer"},
  };
  for (const Case& c : cases) {
    json tokenizer = byte_level_tokenizer();
    c.change(tokenizer);
    const std::string error = error_of([&] { metadata(tokenizer, config()); });
    EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
  EXPECT_NE(error_of([&] {
              hf::tokenizer_metadata({"{", "", ""}, "dir", std::nullopt);
            }).find("dir/tokenizer.json: the file is not valid JSON"),
            std::string::npos);
}

TEST(HfTokenizer, MalformedTokenizerConfigIsAnErrorNamingTheFile) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array(), "tokenizer_config.json: not a JSON object"},
      {{{"bos_token", "<nope>"}}, "bos_token '<nope>' is not a token of tokenizer.json"},
      {{{"eos_token", {{"lstrip", false}}}}, "eos_token has no \"content\""},
      {{{"eos_token", 7}}, "eos_token is 7, expected a string"},
      {{{"add_bos_token", "yes"}}, "add_bos_token is \"yes\", expected true or false"},
      {{{"chat_template", 3}}, "chat_template is 3, expected a string or a list"},
      {{{"chat_template", {{{"name", "default"}}}}}, "need \"name\" and \"template\""},
  };
  for (const auto& [tokenizer_config, expected] : cases) {
    const std::string error = error_of([&tokenizer_config = tokenizer_config] {
      metadata(byte_level_tokenizer(), tokenizer_config);
    });
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace sieve
