// `sieve bench-serve`: load-test any OpenAI-compatible server (sieve serve, llama-server, vLLM)
// with streaming requests; TTFT, TPOT, ITL, E2E latency, throughput and goodput, as tables, a
// JSON file with every request and an SVG plot. The measuring is in loadgen/.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <optional>

#include "cli/commands.h"
#include "loadgen/client.h"
#include "loadgen/plot.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/workload.h"
#include "model/loader.h"
#include "util/error.h"
#include "util/text_file.h"

namespace sieve::cli {

namespace {

struct BenchServeOptions {
  std::string base_url;
  std::string api_key;
  std::string model;
  std::string endpoint = "completions";
  std::string dataset = "random";
  std::string tokenizer_path;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;
  int64_t shared_prefix_len = 0;
  int64_t num_prefixes = 1;
  int64_t num_prompts = 100;
  int64_t multi_turn = 0;  // turns per conversation (0: single requests)
  std::optional<int64_t> turn_input_len;
  std::optional<double> request_rate;
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  std::vector<int> sweep_concurrency;
  std::vector<std::string> goodput;
  int64_t warmup = 0;
  uint64_t seed = 0;
  std::vector<std::string> extra_bodies;
  double timeout_s = 600;
  bool no_ignore_eos = false;
  std::string out_path;
  std::string plot_path;
  std::vector<std::string> compare;
};

nlohmann::json parse_extra_body(const std::string& text) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("--extra-body '{}' is not JSON: {}", text, e.what());
  }
  if (!body.is_object()) fail("--extra-body '{}' must be a JSON object", text);
  return body;
}

void compare(const BenchServeOptions& options) {
  const nlohmann::json a = loadgen::read_report(options.compare[0]);
  const nlohmann::json b = loadgen::read_report(options.compare[1]);
  fmt::print("{}", loadgen::format_comparison(a, options.compare[0], b, options.compare[1]));
  if (!options.plot_path.empty()) {
    std::vector<loadgen::PlotSeries> series = loadgen::plot_series(a, "A ");
    for (loadgen::PlotSeries& s : loadgen::plot_series(b, "B ")) series.push_back(std::move(s));
    write_file(
        options.plot_path,
        loadgen::render_svg(series, "A: " + options.compare[0] + "  vs  B: " + options.compare[1]));
    fmt::print(stderr, "plot written to {}\n", options.plot_path);
  }
}

std::vector<loadgen::RunPoint> run_points(const BenchServeOptions& options) {
  std::vector<nlohmann::json> variants;
  for (const std::string& text : options.extra_bodies) variants.push_back(parse_extra_body(text));
  const bool several_variants = variants.size() > 1;
  if (variants.empty()) variants.push_back(nlohmann::json::object());
  std::vector<loadgen::RunPoint> points;
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string prefix = several_variants ? fmt::format("v{} ", v) : "";
    const auto add = [&](std::optional<int> concurrency, std::optional<double> rate,
                         std::string label) {
      loadgen::RunPoint point;
      point.label = prefix + label;
      point.request_rate = rate;
      point.burstiness = options.burstiness;
      point.max_concurrency = concurrency;
      if (!options.extra_bodies.empty()) point.variant = static_cast<int>(v);
      point.extra_body = variants[v];
      points.push_back(std::move(point));
    };
    if (!options.sweep_concurrency.empty()) {
      for (int c : options.sweep_concurrency) {
        if (c <= 0) fail("--sweep-concurrency values must be positive (got {})", c);
        add(c, std::nullopt, fmt::format("c={}", c));
      }
    } else {
      std::string label =
          options.request_rate ? fmt::format("rate={:g}", *options.request_rate) : "rate=inf";
      if (options.max_concurrency) label += fmt::format(" c={}", *options.max_concurrency);
      add(options.max_concurrency, options.request_rate, label);
    }
  }
  return points;
}

nlohmann::json config_json(const BenchServeOptions& o, const loadgen::GoodputSlo& slo) {
  const auto optional = [](const auto& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  nlohmann::json extra = nlohmann::json::array();
  for (const std::string& text : o.extra_bodies) extra.push_back(parse_extra_body(text));
  return {{"base_url", o.base_url},
          {"model", o.model},
          {"endpoint", o.endpoint},
          {"dataset", o.dataset},
          {"tokenizer",
           o.tokenizer_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.tokenizer_path)},
          {"input_len", o.input_len},
          {"output_len", o.output_len},
          {"range_ratio", o.range_ratio},
          {"shared_prefix_len", o.shared_prefix_len},
          {"num_prefixes", o.num_prefixes},
          {"num_prompts", o.num_prompts},
          {"multi_turn", o.multi_turn},
          {"turn_input_len", optional(o.turn_input_len)},
          {"request_rate", optional(o.request_rate)},
          {"burstiness", o.burstiness},
          {"max_concurrency", optional(o.max_concurrency)},
          {"sweep_concurrency", o.sweep_concurrency},
          {"goodput",
           {{"ttft_ms", optional(slo.ttft_ms)},
            {"tpot_ms", optional(slo.tpot_ms)},
            {"e2el_ms", optional(slo.e2el_ms)}}},
          {"warmup", o.warmup},
          {"seed", o.seed},
          {"extra_body", extra},
          {"ignore_eos", !o.no_ignore_eos},
          {"timeout_s", o.timeout_s}};
}

std::string plot_title(const BenchServeOptions& options) {
  std::string title =
      options.model.empty() ? options.base_url : options.model + " at " + options.base_url;
  if (options.dataset == "random") {
    title += fmt::format(", {} in / {} out tokens", options.input_len, options.output_len);
  } else {
    title += ", " + options.dataset;
  }
  return title;
}

void bench_serve(const BenchServeOptions& options) {
  if (!options.compare.empty()) {
    compare(options);
    return;
  }
  if (options.base_url.empty()) fail("--base-url is required (or --compare A.json B.json)");
  if (options.endpoint != "completions" && options.endpoint != "chat") {
    fail("--endpoint must be completions or chat (got '{}')", options.endpoint);
  }
  if (!options.sweep_concurrency.empty() && (options.request_rate || options.max_concurrency)) {
    fail(
        "--sweep-concurrency runs its own concurrency points; drop "
        "--request-rate/--max-concurrency");
  }
  if (options.num_prompts <= 0)
    fail("--num-prompts must be positive (got {})", options.num_prompts);
  if (options.warmup < 0) fail("--warmup must not be negative");
  if (options.multi_turn < 0) fail("--multi-turn must not be negative");
  if (options.multi_turn > 0 && options.dataset != "random")
    fail("--multi-turn builds its conversations from the random dataset");
  if (!(options.timeout_s > 0)) fail("--timeout must be positive");
  const loadgen::ServerUrl url = loadgen::parse_base_url(options.base_url);
  const loadgen::GoodputSlo slo = loadgen::parse_goodput(options.goodput);
  const std::vector<loadgen::RunPoint> points = run_points(options);

  std::shared_ptr<const tok::Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty())
    tokenizer = model::load_tokenizer({options.tokenizer_path, ""});
  loadgen::ClientConfig client;
  client.base_url = options.base_url;
  client.endpoint =
      options.endpoint == "chat" ? loadgen::ApiEndpoint::kChat : loadgen::ApiEndpoint::kCompletions;
  client.model = options.model;
  client.api_key = options.api_key;
  client.force_output_len = !options.no_ignore_eos;
  client.timeout_s = options.timeout_s;
  client.tokenizer = tokenizer.get();

  // Every point gets prompts of its own: a point sending the prompts of an earlier one would
  // measure the server's prefix cache. Warmup prompts come after the measured ones.
  const int64_t prompts_per_point = options.num_prompts + options.warmup;
  std::vector<loadgen::Prompt> dataset;
  if (options.dataset == "random") {
    if (!tokenizer) {
      fmt::print(
          stderr,
          "note: without --tokenizer the random prompts are words of unknown token length\n");
    }
  } else {
    dataset = loadgen::load_jsonl_prompts(options.dataset, {options.output_len, client.endpoint},
                                          tokenizer.get());
    const int64_t needed = prompts_per_point * static_cast<int64_t>(points.size());
    if (needed > static_cast<int64_t>(dataset.size())) {
      fmt::print(
          stderr,
          "note: the dataset has {} prompts and the run sends {}; repeated prompts can hit the "
          "server's prefix cache\n",
          dataset.size(), needed);
    }
  }
  const auto point_prompts = [&](size_t point_idx) {
    if (options.dataset != "random") {
      return loadgen::cycle_prompts(dataset, static_cast<int64_t>(point_idx) * prompts_per_point,
                                    prompts_per_point);
    }
    return loadgen::random_prompts(
        tokenizer.get(),
        {options.input_len, options.output_len, options.range_ratio, options.shared_prefix_len,
         prompts_per_point, options.seed + point_idx, options.num_prefixes});
  };

  fmt::print(stderr, "POST {} at {} ({} point{}, {} prompts each)\n",
             loadgen::endpoint_path(client.endpoint), url.origin() + url.path_prefix, points.size(),
             points.size() == 1 ? "" : "s", options.num_prompts);
  std::vector<loadgen::RunResult> runs;
  for (size_t point_idx = 0; point_idx < points.size(); ++point_idx) {
    const loadgen::RunPoint& point = points[point_idx];
    std::vector<loadgen::Prompt> prompts = point_prompts(point_idx);
    const std::vector<loadgen::Prompt> warmup(prompts.begin() + options.num_prompts, prompts.end());
    prompts.resize(static_cast<size_t>(options.num_prompts));
    if (options.multi_turn > 0) {
      // Conversation c: prompt c opens it, then turns of new text, each its own random prompt.
      const std::vector<loadgen::Prompt> later = loadgen::random_prompts(
          tokenizer.get(), {options.turn_input_len.value_or(options.input_len), options.output_len,
                            options.range_ratio, 0, options.num_prompts * (options.multi_turn - 1),
                            options.seed + 7919 + point_idx, 1});
      std::vector<loadgen::Conversation> conversations(prompts.size());
      for (size_t c = 0; c < prompts.size(); ++c) {
        conversations[c].turns.push_back(prompts[c]);
        for (int64_t t = 1; t < options.multi_turn; ++t) {
          loadgen::Prompt next =
              later[c * static_cast<size_t>(options.multi_turn - 1) + static_cast<size_t>(t - 1)];
          next.text = "\n\n" + next.text;  // a new paragraph after the answer
          conversations[c].turns.push_back(std::move(next));
        }
      }
      loadgen::ProgressDisplay display(stderr, point.label,
                                       options.num_prompts * options.multi_turn);
      loadgen::RunResult run = loadgen::run_conversations(
          url, client, conversations, point, {options.seed + point_idx, slo, 1024},
          [&](int64_t done, int64_t, int64_t failed) { display.update(done, failed); });
      display.finish();
      runs.push_back(std::move(run));
      continue;
    }
    loadgen::ProgressDisplay display(stderr, point.label, options.num_prompts);
    loadgen::RunResult run = loadgen::run_point(
        url, client, prompts, warmup, point, {options.seed + point_idx, slo, 1024},
        [&](int64_t done, int64_t, int64_t failed) { display.update(done, failed); });
    display.finish();
    runs.push_back(std::move(run));
  }

  const nlohmann::json report = loadgen::make_report(config_json(options, slo), runs);
  if (runs.size() == 1) {
    fmt::print("{}", loadgen::format_run_details(report["runs"][0]));
  } else {
    fmt::print("{}", loadgen::format_sweep_table(report));
    for (const nlohmann::json& run : report["runs"]) {
      fmt::print("{}", loadgen::format_errors(run["summary"]["errors"],
                                              run["label"].get<std::string>() + ": "));
    }
  }
  int64_t counted_by_chunks = 0, short_outputs = 0;
  for (const loadgen::RunResult& run : runs) {
    short_outputs += run.summary.output_shorter + run.summary.output_longer;
    for (const loadgen::RequestRecord& r : run.records) {
      counted_by_chunks += r.ok && r.output_tokens_source == loadgen::TokenSource::kChunks;
    }
  }
  if (counted_by_chunks > 0) {
    fmt::print(stderr,
               "note: the server sent no usage for {} requests; their output tokens are counted as "
               "stream chunks (give --tokenizer MODEL.gguf to count tokens)\n",
               counted_by_chunks);
  }
  if (runs.size() > 1 && short_outputs > 0) {
    fmt::print(
        stderr,
        "warning: {} requests did not produce the requested number of tokens; the server may not "
        "support ignore_eos/min_tokens\n",
        short_outputs);
  }
  if (!options.out_path.empty()) {
    // Generated texts from other servers may hold invalid UTF-8: written replaced, not thrown.
    write_file(options.out_path,
               report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fmt::print(stderr, "results written to {}\n", options.out_path);
  }
  if (!options.plot_path.empty()) {
    write_file(options.plot_path,
               loadgen::render_svg(loadgen::plot_series(report), plot_title(options)));
    fmt::print(stderr, "plot written to {}\n", options.plot_path);
  }
  int64_t failed = 0;
  for (const loadgen::RunResult& run : runs) failed += run.summary.failed;
  if (failed == static_cast<int64_t>(runs.size()) * options.num_prompts) {
    fail("every request failed (see the reasons above)");
  }
}

}  // namespace

void add_bench_serve_command(CLI::App& app) {
  auto options = std::make_shared<BenchServeOptions>();
  CLI::App* command = app.add_subcommand("bench-serve",
                                         "Benchmark an OpenAI-compatible server: TTFT, TPOT, ITL, "
                                         "throughput, goodput (or --compare two results)");
  command->add_option("--base-url", options->base_url, "Server URL, e.g. http://127.0.0.1:8080");
  command->add_option("--api-key", options->api_key, "Sent as 'Authorization: Bearer KEY'");
  command->add_option("--model", options->model, "Model name sent in each request");
  command
      ->add_option("--endpoint", options->endpoint,
                   "completions (/v1/completions) or chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->capture_default_str();
  command
      ->add_option("--dataset", options->dataset,
                   "random, or a JSONL file of {\"prompt\"|\"messages\", \"output_len\"?} lines")
      ->capture_default_str();
  command
      ->add_option(
          "--tokenizer", options->tokenizer_path,
          "GGUF file whose tokenizer builds exact-length prompts and counts tokens without usage")
      ->check(CLI::ExistingFile);
  command->add_option("--input-len", options->input_len, "Prompt tokens (random dataset)")
      ->capture_default_str();
  command->add_option("--output-len", options->output_len, "Output tokens to request")
      ->capture_default_str();
  command
      ->add_option("--range-ratio", options->range_ratio,
                   "Draw lengths uniformly from [len*(1-r), len*(1+r)]")
      ->capture_default_str();
  command
      ->add_option(
          "--shared-prefix-len", options->shared_prefix_len,
          "Tokens at the start of every random prompt that are the same (part of --input-len)")
      ->capture_default_str();
  command
      ->add_option("--num-prefixes", options->num_prefixes,
                   "Different shared prefixes, one drawn at random per prompt (groups of requests "
                   "sharing a system prompt)")
      ->capture_default_str();
  command
      ->add_option("--multi-turn", options->multi_turn,
                   "Conversations of N turns instead of single requests: each of --num-prompts "
                   "users sends its next turn (the conversation so far + new text) once the "
                   "previous answer is complete; reports TTFT and cached tokens per turn")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--turn-input-len", options->turn_input_len,
                      "--multi-turn: new tokens each later turn adds (default: --input-len)");
  command->add_option("--num-prompts", options->num_prompts, "Requests per point")
      ->capture_default_str();
  command->add_option("--request-rate", options->request_rate,
                      "Poisson arrivals at R requests/s (default: all at once)");
  command
      ->add_option("--burstiness", options->burstiness, "Gamma arrivals: 1 is Poisson, <1 burstier")
      ->capture_default_str();
  command->add_option("--max-concurrency", options->max_concurrency,
                      "Most requests in flight at once");
  command
      ->add_option("--sweep-concurrency", options->sweep_concurrency,
                   "Run one point per concurrency (comma list)")
      ->delimiter(',');
  command->add_option("--goodput", options->goodput,
                      "SLOs for goodput, e.g. ttft:500 tpot:50 (also e2el:MS)");
  command->add_option("--warmup", options->warmup, "Unmeasured requests before each point")
      ->capture_default_str();
  command
      ->add_option("--seed", options->seed, "Seed of prompts and arrivals (point k uses seed + k)")
      ->capture_default_str();
  command
      ->add_option("--extra-body", options->extra_bodies,
                   "JSON merged into each request body (repeat to compare variants in one sweep)")
      ->take_all()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  command
      ->add_option("--timeout", options->timeout_s, "Seconds to wait for a connection or for data")
      ->capture_default_str();
  command->add_flag("--no-ignore-eos", options->no_ignore_eos,
                    "Do not send ignore_eos/min_tokens (for servers that reject them)");
  command->add_option("--out", options->out_path,
                      "JSON file with the config, summaries and every request");
  command->add_option("--plot", options->plot_path,
                      "SVG plot: throughput vs concurrency, TTFT/TPOT vs throughput");
  command
      ->add_option("--compare", options->compare, "Print two result files side by side with ratios")
      ->expected(2);
  command->callback([options] { bench_serve(*options); });
}

}  // namespace sieve::cli
