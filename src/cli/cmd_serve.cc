// `sieve serve`: an OpenAI-compatible HTTP server over the engine.
//
// Start-up order: bind the port first (so /health can say 503 while loading), load the model
// with a progress bar, build the engine, then turn ready. SIGINT/SIGTERM drain gracefully.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <semaphore>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/model_options.h"
#include "hf/generation_config.h"
#include "hf/hf_model.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

struct ServeOptions {
  ModelOptions model;
  EngineOptions engine;
  server::ServerConfig server;
  std::string chat_template_file;
  std::string tool_call_parser = "auto";
  std::string kv_policy = "full";
  std::string generation_config = "auto";
  double shutdown_grace_seconds = 10.0;
  size_t max_body_mib = 8;
  double request_timeout_seconds = 30.0;
  double keep_alive_timeout_seconds = 5.0;
  double write_timeout_seconds = 30.0;
  bool no_webui = false;
};

// --generation-config: "vllm" (none), "auto" (the model folder's generation_config.json, else
// its config.json's eos_token_id, if it is a folder: hf::read_folder_generation_config), or a
// folder holding a generation_config.json. Every id must be in the vocabulary.
std::optional<std::pair<std::string, hf::GenerationConfig>> generation_defaults(
    const std::string& option, const std::string& model_path, size_t vocab_size) {
  std::optional<std::pair<std::string, hf::GenerationConfig>> found;
  if (option == "auto") {
    if (hf::is_model_folder(model_path))
      found = hf::read_folder_generation_config(hf::model_folder(model_path));
  } else if (option != "vllm") {
    const std::optional<std::string> path = hf::find_generation_config(option);
    if (!path) fail("--generation-config {}: no generation_config.json there", option);
    found = std::pair(*path, hf::read_generation_config(*path));
  }
  if (!found) return std::nullopt;
  for (int32_t id : found->second.eos_token_ids) {
    if (static_cast<size_t>(id) >= vocab_size)
      fail("{}: eos_token_id {} is outside the vocabulary ({} tokens)", found->first, id,
           vocab_size);
  }
  return found;
}

std::string describe(const hf::GenerationConfig& d) {
  std::vector<std::string> parts;
  if (d.temperature) parts.push_back(fmt::format("temperature {}", *d.temperature));
  if (d.top_p) parts.push_back(fmt::format("top_p {}", *d.top_p));
  if (d.top_k) parts.push_back(fmt::format("top_k {}", *d.top_k));
  if (d.min_p) parts.push_back(fmt::format("min_p {}", *d.min_p));
  if (d.repetition_penalty)
    parts.push_back(fmt::format("repetition_penalty {}", *d.repetition_penalty));
  if (d.max_new_tokens) parts.push_back(fmt::format("max_tokens at most {}", *d.max_new_tokens));
  if (!d.eos_token_ids.empty())
    parts.push_back(fmt::format("stop_token_ids {}", fmt::join(d.eos_token_ids, ",")));
  return parts.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(parts, ", "));
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Signals only post a semaphore; the main thread does the shutdown work.
std::counting_semaphore<16> g_signalled{0};
void on_signal(int) { g_signalled.release(); }

class LoadProgress {
 public:
  LoadProgress() : tty_(isatty(STDERR_FILENO) != 0) {}
  void operator()(double fraction) {
    const int percent = static_cast<int>(fraction * 100.0 + 0.5);
    if (tty_) {
      constexpr int kWidth = 40;
      const int filled = percent * kWidth / 100;
      fmt::print(stderr, "\rloading weights [{}{}] {:3d}%{}", std::string(filled, '#'),
                 std::string(kWidth - filled, '.'), percent, percent >= 100 ? "\n" : "");
    } else if (percent >= next_line_percent_) {
      fmt::print(stderr, "loading weights: {}%\n", percent);
      next_line_percent_ = percent / 25 * 25 + 25;
    }
    std::fflush(stderr);
  }

 private:
  bool tty_;
  int next_line_percent_ = 0;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open chat template '{}'", path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void serve(ServeOptions options) {
  // Logs go to stderr, like the progress bar; stdout stays free for the caller.
  spdlog::set_default_logger(spdlog::stderr_color_mt("sieve"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  options.server.shutdown_grace = to_ms(options.shutdown_grace_seconds);
  server::HttpLimits& limits = options.server.limits;
  limits.max_body_bytes = options.max_body_mib << 20;
  limits.request_timeout = to_ms(options.request_timeout_seconds);
  limits.keep_alive_timeout = to_ms(options.keep_alive_timeout_seconds);
  limits.write_timeout = to_ms(options.write_timeout_seconds);
  if (!options.no_webui) options.server.web_assets = server::embedded_web_assets();
  server::HttpServer http(options.server);
  http.bind();
  spdlog::info("listening on http://{}:{} (/ready answers 503 until the model is loaded)",
               options.server.host, http.port());
  if (http.metrics_port() >= 0) {
    spdlog::info("probes: http://{}:{}/health, /ready and /metrics", options.server.host,
                 http.metrics_port());
  }
  std::thread listener([&] { http.listen(); });

  try {
    const sparsity::PolicySpec default_policy = sparsity::parse_policy(options.kv_policy);
    LoadProgress progress;
    model::LoadOptions load = options.model.load_options();
    load.on_progress = [&](double f) { progress(f); };
    model::LoadedModel loaded = model::load_model(load);
    const model::ModelConfig& mc = loaded.model->config();

    std::string template_source;
    std::string template_origin;
    if (!options.chat_template_file.empty()) {
      template_source = read_text_file(options.chat_template_file);
      template_origin = options.chat_template_file;
    } else if (loaded.chat_template) {
      template_source = *loaded.chat_template;
      template_origin = "the model's tokenizer.chat_template";
    } else {
      template_source = std::string(server::chatml_template());
      template_origin = "ChatML (the model has no chat template)";
    }
    auto chat_template =
        std::make_shared<const server::ChatTemplate>(server::ChatTemplate::parse(template_source));
    const server::ToolCallFormat tool_call_format =
        options.tool_call_parser == "auto"
            ? server::detect_tool_call_format(template_source)
            : *server::parse_tool_call_format(options.tool_call_parser);

    const auto generation = generation_defaults(options.generation_config, options.model.model_path,
                                                loaded.tokenizer->vocab().size());

    engine::EngineConfig config = options.engine.engine_config();
    config.model_path = options.model.model_path;
    auto engine = std::make_shared<engine::Engine>(config, loaded.model, loaded.tokenizer);
    engine->check_policy(default_policy);  // e.g. a default lserve needs --calibration
    check_speculative_option(*engine, config.speculative);
    engine->start();
    const engine::EngineConfig& ec = engine->config();
    const std::vector<std::string>& names = options.server.served_model_names;
    const std::string name = names.empty() ? loaded.name : names.front();
    const std::vector<std::string> aliases =
        names.size() > 1 ? std::vector<std::string>(names.begin() + 1, names.end())
                         : std::vector<std::string>{};
    spdlog::info("model '{}' from {}: {} layers, {} heads ({} KV), vocab {}, context {} tokens",
                 name, options.model.model_path, mc.num_layers, mc.num_heads, mc.num_kv_heads,
                 mc.vocab_size, mc.context_length);
    std::string precise;
    for (int32_t stream : engine->precise_kv_streams()) {
      precise += fmt::format("{}layer {} kv head {}", precise.empty() ? "" : ", ",
                             stream / mc.num_kv_heads, stream % mc.num_kv_heads);
    }
    spdlog::info(
        "KV cache: {} pages of {} tokens ({} tokens, {:.1f} MiB of {}{}); max {} sequences, {} "
        "batched tokens, {} queued",
        ec.num_kv_pages, ec.page_size, static_cast<int64_t>(ec.num_kv_pages) * ec.page_size,
        static_cast<double>(engine->kv_bytes_per_page()) * ec.num_kv_pages / (1 << 20),
        model::kv_dtype_name(ec.kv_dtype), precise.empty() ? "" : "; also in f16: " + precise,
        ec.max_num_seqs, ec.max_batch_tokens, ec.max_queued);
    spdlog::info("default kv_policy: {}; speculative decoding: {}",
                 sparsity::to_string(default_policy), speculative::to_json(ec.speculative));
    spdlog::info(
        "compute: {} backend, {} threads, prefill attention {}; chat template: {}; tool calls: "
        "{}{}; API key: {}",
        loaded.model->backend().name(), loaded.model->backend().num_threads(),
        kernels::bf16_attention_supported()
            ? kernels::prefill_dots_name(options.model.prefill_dots)
            : kernels::prefill_dots_name(kernels::PrefillDots::kF32),
        template_origin, server::tool_call_format_name(tool_call_format),
        options.tool_call_parser == "auto" ? " (detected)" : "",
        options.server.api_key.empty() ? "none" : "required");
    if (generation) {
      spdlog::info("sampling defaults from {} (--generation-config vllm: none): {}",
                   generation->first, describe(generation->second));
    }
    spdlog::info(
        "HTTP: {} I/O threads; up to {} connections (+{} for /health and /metrics); request "
        "timeout {:.0f} s, keep-alive {:.0f} s, headers {} bytes / {} lines, body {} MiB; CORS: {}",
        options.server.io_threads, limits.max_connections, limits.reserved_connections,
        options.request_timeout_seconds, options.keep_alive_timeout_seconds,
        limits.max_header_bytes, limits.max_header_count, options.max_body_mib,
        options.server.allowed_origins.empty()
            ? std::string("off")
            : fmt::format("{}", fmt::join(options.server.allowed_origins, ", ")));
    http.set_backend(
        {.engine = engine,
         .tokenizer = loaded.tokenizer,
         .model_name = name,
         .model_aliases = aliases,
         .context_length = mc.context_length,
         .render_chat = [chat_template](
                            const server::json& context) { return chat_template->render(context); },
         .default_kv_policy = default_policy,
         .grammars = std::make_shared<grammar::GrammarCache>(
             grammar::Vocabulary::from_tokenizer(*loaded.tokenizer)),
         .tool_call_format = tool_call_format,
         .sampling_defaults = generation ? generation->second : hf::GenerationConfig{}});
    spdlog::info("ready: http://{}:{}/v1 serves '{}'{}", options.server.host, http.port(), name,
                 aliases.empty() ? "" : fmt::format(" (aliases: {})", fmt::join(aliases, ", ")));
    if (!options.no_webui) {
      spdlog::info("web page (chat, KV dashboard, compare): http://{}:{}/", options.server.host,
                   http.port());
    }

    g_signalled.acquire();
    spdlog::info("shutting down: /ready answers 503; {} request(s) in flight, grace {:.1f} s",
                 http.num_active_requests(), options.shutdown_grace_seconds);
    http.shutdown();
    listener.join();
    engine->stop();
    spdlog::info("stopped");
  } catch (...) {
    http.shutdown();
    listener.join();
    throw;
  }
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command =
      app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  options->model.add_to(*command);
  command->add_option("--host", options->server.host, "Address to listen on")
      ->capture_default_str();
  command->add_option("--port", options->server.port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  command->add_option("--api-key", options->server.api_key,
                      "Require 'Authorization: Bearer KEY' on every route but /health and /ready");
  command
      ->add_option("--served-model-name", options->server.served_model_names,
                   "Model name(s) clients use; the first names the model in responses and "
                   "metrics, the others are aliases requests may give too (space- or "
                   "comma-separated; default: general.name of the GGUF, else the file name)")
      ->delimiter(',');
  command
      ->add_option(
          "--chat-template", options->chat_template_file,
          "Jinja chat template file (default: the model's tokenizer.chat_template, else ChatML)")
      ->check(CLI::ExistingFile);
  command
      ->add_option("--tool-call-parser", options->tool_call_parser,
                   "How the model writes tool calls, read back into tool_calls: llama3_json, "
                   "hermes (Qwen2.5/Qwen3, Hermes), mistral, none; auto: from the chat template")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "llama3_json", "hermes", "mistral"}));
  command
      ->add_option("--max-body", options->max_body_mib, "Largest request body in MiB (413 above)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--metrics-port", options->server.metrics_port,
                   "Also serve GET /health, /ready and /metrics on this port, with a thread of "
                   "its own (0: any free port; default: off)")
      ->check(CLI::Range(0, 65535));
  command
      ->add_option("--allowed-origins", options->server.allowed_origins,
                   "Origins whose browser pages may call the API (CORS), e.g. "
                   "https://chat.example.com; '*' for any (default: none)")
      ->delimiter(',');
  command->add_flag("--no-webui", options->no_webui,
                    "Serve no web page at / (chat, KV dashboard, compare)");
  command
      ->add_option("--max-connections", options->server.limits.max_connections,
                   "Open client connections served; beyond it new ones get a fast 503 (a reserve "
                   "still answers /health and /metrics)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--request-timeout", options->request_timeout_seconds,
                   "Seconds a client has to send a whole request (head and body) from its first "
                   "byte; a client that trickles bytes is dropped when it expires")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--keep-alive-timeout", options->keep_alive_timeout_seconds,
                   "Seconds an idle keep-alive connection stays open")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--write-timeout", options->write_timeout_seconds,
                   "Seconds a write may wait for a client that does not read before it is "
                   "dropped (its request is cancelled)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--max-header-bytes", options->server.limits.max_header_bytes,
                   "Largest request line + headers in bytes (431 above)")
      ->capture_default_str()
      ->check(CLI::Range(1024, 1 << 20));
  command
      ->add_option("--max-header-count", options->server.limits.max_header_count,
                   "Most header lines in a request (431 above)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--max-stream-buffer", options->server.limits.max_stream_buffer_bytes,
                   "Bytes of a response stream that may wait for a slow client before it is "
                   "dropped and its request cancelled")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--io-threads", options->server.io_threads,
                   "Threads of the HTTP event loop (they never wait on a client)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  command
      ->add_option(
          "--shutdown-grace", options->shutdown_grace_seconds,
          "Seconds running requests get to finish on SIGINT/SIGTERM before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--remembered-answers", options->server.remembered_answers,
                   "Recent answers whose token ids a next turn keeps when it sends the answer "
                   "back as text, so that it continues the conversation's cache (0: prompts are "
                   "always tokenized afresh)")
      ->capture_default_str();
  command
      ->add_option("--kv-policy", options->kv_policy,
                   "Default KV sparsity policy for requests without \"kv_policy\" (e.g. "
                   "streaming:S=4,W=1024, "
                   "snapkv:B=1024, layerwise:L=2,rest=snapkv:B=512)")
      ->capture_default_str();
  command
      ->add_option("--generation-config", options->generation_config,
                   "Sampling defaults for what requests leave out: auto (a Hugging Face "
                   "folder's generation_config.json: temperature, top_p, top_k, min_p, "
                   "repetition_penalty, max_new_tokens as a cap, eos_token_id as stop ids; "
                   "without one, config.json's eos_token_id as stop ids), vllm "
                   "(none: OpenAI's defaults), or a folder holding a generation_config.json")
      ->capture_default_str();
  options->engine.add_to(*command);
  command->callback([options] { serve(*options); });
}

}  // namespace sieve::cli
