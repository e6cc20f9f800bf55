// `sieve convert DIR OUT.gguf [TYPE]`: a Hugging Face folder written as the GGUF llama.cpp's
// converter makes of it (hf/hf_model.h), the weights as stored or converted to TYPE by
// `sieve quantize`'s code.
#include <fmt/format.h>

#include "cli/commands.h"
#include "hf/hf_model.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::cli {

namespace {

struct ConvertOptions {
  std::string in_path;
  std::string out_path;
  std::string type;  // empty: the folder's types
  int threads = 0;
};

void convert(const ConvertOptions& options) {
  if (!hf::is_model_folder(options.in_path)) {
    fail("'{}' is not a Hugging Face model folder (config.json + *.safetensors)", options.in_path);
  }
  if (options.type.empty()) {
    const gguf::File input = model::open_model_file(options.in_path);
    model::write_model_file(input, options.out_path);
    fmt::print("wrote {} ({} tensors as stored)\n", options.out_path, input.tensors().size());
    return;
  }
  std::optional<model::QuantMix> mix = model::parse_quant_mix(options.type);
  if (!mix) fail("unknown type '{}' (see `sieve quantize --help`)", options.type);
  ThreadPool pool(options.threads);
  const model::QuantizeReport report =
      model::quantize_model(options.in_path, options.out_path, *mix, pool);
  fmt::print("wrote {} ({}): tensor data {:.2f} MB -> {:.2f} MB\n", options.out_path, mix->name,
             report.bytes_in / 1e6, report.bytes_out / 1e6);
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto options = std::make_shared<ConvertOptions>();
  CLI::App* command = app.add_subcommand(
      "convert",
      "Write a Hugging Face model folder (config.json + safetensors) as a GGUF file with "
      "llama.cpp's architecture keys and tensor names");
  command->add_option("input", options->in_path, "Hugging Face folder, or its .safetensors file")
      ->required()
      ->check(CLI::ExistingPath);
  command->add_option("output", options->out_path, "Output GGUF path")->required();
  command->add_option("type", options->type,
                      "Weight type or mix as for `sieve quantize` (f16, bf16, q8_0, q4_k_m, ...); "
                      "default: the folder's (F32, F16 or BF16 as stored)");
  command->add_option("-t,--threads", options->threads, "Worker threads (default: all cores)");
  command->callback([options] { convert(*options); });
}

}  // namespace sieve::cli
