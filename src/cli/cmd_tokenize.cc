// `sieve tokenize`: print the tokens of a text (works on vocabulary-only GGUF files).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/loader.h"

namespace sieve::cli {

namespace {

struct TokenizeOptions {
  std::string model_path;
  std::string tokenizer_path;
  std::string text;
  bool no_bos = false;
  bool ids_only = false;
  bool parse_special = false;
  bool json = false;
};

void tokenize(const TokenizeOptions& options) {
  auto tokenizer = model::load_tokenizer({options.model_path, options.tokenizer_path});
  std::vector<tok::TokenId> ids = tokenizer->encode(
      options.text, {.add_special = !options.no_bos, .parse_special = options.parse_special});
  if (options.json) {
    nlohmann::json pieces = nlohmann::json::array();
    for (tok::TokenId id : ids) pieces.push_back(tokenizer->token_to_piece(id, true));
    nlohmann::json out = {{"ids", ids}, {"pieces", pieces}, {"count", ids.size()}};
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (options.ids_only) {
    fmt::print("[{}]\n", fmt::join(ids, ", "));
  } else {
    for (tok::TokenId id : ids) {
      nlohmann::json piece = tokenizer->token_to_piece(id, true);
      fmt::print("{:>7} -> {}\n", id,
                 piece.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  }
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text");
  command
      ->add_option("-m,--model", options->model_path,
                   "GGUF model, vocabulary-only GGUF file, or Hugging Face folder (its "
                   "tokenizer.json)")
      ->required()
      ->check(CLI::ExistingPath);
  command
      ->add_option("--tokenizer", options->tokenizer_path,
                   "llama2.c tokenizer file (for .bin models)")
      ->check(CLI::ExistingFile);
  command->add_option("text", options->text, "Text to tokenize")->required();
  command->add_flag("--no-bos", options->no_bos, "Do not add BOS/EOS tokens");
  command->add_flag("--ids", options->ids_only, "Print only the ids, as a list");
  command->add_flag("--parse-special", options->parse_special,
                    "Recognise special-token text such as <s>");
  command->add_flag("--json", options->json, "Print JSON: ids, pieces and count");
  command->callback([options] { tokenize(*options); });
}

}  // namespace sieve::cli
