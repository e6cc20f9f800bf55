// `sieve calibrate`: writes the calibration profile lserve and heads:...@profile=F need
// (which KV heads are streaming-like), from sample prompts of a text file or random tokens.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "eval/calibration.h"
#include "sparsity/calibration.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

struct CalibrateOptions {
  ModelOptions model;
  std::string text_path;  // empty: random token prompts
  int32_t num_samples = 8;
  int32_t prompt_len = 0;  // 0: 512, or less where the context is shorter
  uint32_t seed = 1;
  eval::CalibrationConfig config;
  std::string out_path;
};

// Consecutive prompt_len-token pieces of the text, each starting with BOS when the vocabulary
// adds one; or random non-special tokens.
std::vector<std::vector<int32_t>> sample_prompts(const CalibrateOptions& o,
                                                 const tok::Tokenizer& tokenizer) {
  std::vector<std::vector<int32_t>> prompts;
  const std::optional<tok::TokenId> bos = tokenizer.vocab().bos;
  if (!o.text_path.empty()) {
    std::ifstream in(o.text_path, std::ios::binary);
    if (!in) fail("cannot open '{}'", o.text_path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::vector<tok::TokenId> ids = tokenizer.encode(buffer.str(), {.add_special = false});
    const size_t piece = static_cast<size_t>(o.prompt_len) - (bos ? 1 : 0);
    for (size_t start = 0;
         prompts.size() < static_cast<size_t>(o.num_samples) && start + piece <= ids.size();
         start += piece) {
      std::vector<int32_t> prompt;
      if (bos) prompt.push_back(*bos);
      prompt.insert(prompt.end(), ids.begin() + static_cast<std::ptrdiff_t>(start),
                    ids.begin() + static_cast<std::ptrdiff_t>(start + piece));
      prompts.push_back(std::move(prompt));
    }
    if (prompts.size() < static_cast<size_t>(o.num_samples)) {
      fail("'{}' has {} tokens: not enough for {} prompts of {}", o.text_path, ids.size(),
           o.num_samples, o.prompt_len);
    }
    return prompts;
  }
  const tok::Vocab& vocab = tokenizer.vocab();
  std::vector<int32_t> normal;
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (vocab.types.empty() || vocab.types[id] == tok::TokenType::kNormal)
      normal.push_back(static_cast<int32_t>(id));
  }
  if (normal.empty()) fail("the vocabulary has no normal tokens to make random prompts from");
  std::mt19937 rng(o.seed);
  std::uniform_int_distribution<size_t> pick(0, normal.size() - 1);
  for (int32_t s = 0; s < o.num_samples; ++s) {
    std::vector<int32_t> prompt;
    if (bos) prompt.push_back(*bos);
    while (std::ssize(prompt) < o.prompt_len) prompt.push_back(normal[pick(rng)]);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

void run_calibrate(CalibrateOptions options) {
  model::LoadedModel loaded = model::load_model(options.model.load_options());
  if (options.prompt_len == 0) {
    options.prompt_len =
        static_cast<int32_t>(std::min<int64_t>(512, loaded.model->config().context_length - 1));
  }
  const std::vector<std::vector<int32_t>> prompts = sample_prompts(options, *loaded.tokenizer);
  const sparsity::CalibrationProfile profile =
      eval::calibrate(*loaded.model, loaded.name, prompts, options.config);
  sparsity::save_calibration(profile, options.out_path);
  fmt::print("{} prompts of {} tokens; streaming score per layer (KV heads in order):\n",
             prompts.size(), options.prompt_len);
  for (int64_t l = 0; l < profile.num_layers; ++l) {
    std::string row;
    for (int64_t h = 0; h < profile.num_kv_heads; ++h)
      row += fmt::format(" {:.3f}", profile.score(l, h));
    fmt::print("  layer {:>3}:{}\n", l, row);
  }
  fmt::print("wrote {} (model fingerprint {})\n", options.out_path, profile.model_fingerprint);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto options = std::make_shared<CalibrateOptions>();
  CLI::App* command = app.add_subcommand(
      "calibrate", "Measure which KV heads are streaming-like (the profile lserve needs)");
  options->model.add_to(*command);
  command
      ->add_option("-f,--file", options->text_path,
                   "Text the sample prompts come from (default: random tokens)")
      ->check(CLI::ExistingFile);
  command->add_option("--samples", options->num_samples, "Sample prompts")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--prompt-len", options->prompt_len,
                   "Tokens per sample prompt (default 512, or the context - 1 where that is less)")
      ->check(CLI::Range(2, 1 << 20));
  command->add_option("--sinks", options->config.num_sinks, "Attention sinks: the first S tokens")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--window", options->config.window, "Local window: the last W tokens")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--rows", options->config.observation_rows,
                   "Last prompt rows whose attention is measured")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", options->seed, "Seed of the random prompts")->capture_default_str();
  command->add_option("-o,--output", options->out_path, "Profile file to write (JSON)")->required();
  command->callback([options] { run_calibrate(*options); });
}

}  // namespace sieve::cli
