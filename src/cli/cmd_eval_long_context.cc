// `sieve eval --task ...`: the needle-in-a-haystack grid (options, table, JSON, heatmaps, cases).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/eval_long_context.h"
#include "eval/long_context_eval.h"
#include "model/kv_cache.h"
#include "server/chat_template.h"
#include "server/chat_request.h"
#include "util/text_file.h"
#include "server/chat_template.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}'", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The template a chat server would use: --chat-template, else the model's, else ChatML; the
// context as the server builds it (server::chat_template_context).
eval::ChatRenderer chat_renderer(const model::LoadedModel& loaded, const std::string& path,
                                 std::string& origin) {
  std::string source;
  if (!path.empty()) {
    source = read_file(path);
    origin = path;
  } else if (loaded.chat_template) {
    source = *loaded.chat_template;
    origin = "the model's";
  } else {
    source = std::string(server::chatml_template());
    origin = "ChatML (the model has none)";
  }
  auto chat_template =
      std::make_shared<const server::ChatTemplate>(server::ChatTemplate::parse(source));
  std::shared_ptr<const tok::Tokenizer> tokenizer = loaded.tokenizer;
  return [chat_template, tokenizer](const std::string& message) {
    const server::json messages = {{{"role", "user"}, {"content", message}}};
    return chat_template->render(server::chat_template_context(messages, true, *tokenizer));
  };
}

// The text a server tokenizes to `prompt` (special tokens parsed, BOS added when the
// vocabulary wants one): special tokens written out, the BOS it adds left out.
std::string prompt_text(const tok::Tokenizer& tokenizer, std::span<const tok::TokenId> prompt) {
  const tok::Vocab& vocab = tokenizer.vocab();
  if (vocab.add_bos && vocab.bos && !prompt.empty() && prompt.front() == *vocab.bos)
    prompt = prompt.subspan(1);
  return tokenizer.decode(prompt, true);
}

std::string budget_label(const eval::PolicySetting& s) {
  if (s.family == "full") return "-";
  return s.family == "fastgen" ? fmt::format("T={:g}", s.budget) : fmt::format("{:g}", s.budget);
}

// A name for a setting's file: letters, digits, '.', '-' and '_' only.
std::string file_name(const eval::NeedleResult& r) {
  std::string name = fmt::format("{}_{}_{}_{}", eval::needle_task_name(r.task), r.setting.family,
                                 budget_label(r.setting), model::kv_dtype_name(r.setting.kv_dtype));
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_')
      ch = '-';
  }
  return name + ".svg";
}

// Accuracy as a fraction of dense ("-" when dense got nothing right).
std::string vs_dense(const eval::NeedleResult& r) {
  return r.accuracy_vs_dense ? fmt::format("{:.2f}", *r.accuracy_vs_dense) : "-";
}

void print_result(const eval::NeedleResult& r) {
  fmt::print(
      "{} {} {} budget {}: {:.3f} exact ({} of dense), {:.3f} of the asked values; KV kept "
      "{:.3f}; {:.1f} s, {} prompt tokens ({} from the prefix cache); {}\n",
      eval::needle_task_name(r.task), r.setting.family, model::kv_dtype_name(r.setting.kv_dtype),
      budget_label(r.setting), r.accuracy, vs_dense(r), r.query_accuracy, r.kv_kept, r.seconds,
      r.prompt_tokens, r.cached_prompt_tokens, r.spec);
  std::vector<int32_t> lengths;
  for (const eval::NeedleCell& cell : r.cells) {
    if (std::find(lengths.begin(), lengths.end(), cell.length) == lengths.end())
      lengths.push_back(cell.length);
  }
  std::string header = fmt::format("  {:>7}", "depth");
  for (int32_t length : lengths) header += fmt::format(" {:>7}", length);
  fmt::print("{}\n", header);
  const size_t num_depths = r.cells.size() / lengths.size();
  for (size_t d = 0; d < num_depths; ++d) {
    std::string row = fmt::format("  {:>6.0f}%", r.cells[d].depth * 100);
    for (size_t l = 0; l < lengths.size(); ++l) {
      const eval::NeedleCell& cell = r.cells[l * num_depths + d];
      row += fmt::format(" {:>6.0f}%", cell.accuracy() * 100);
    }
    fmt::print("{}\n", row);
  }
  std::string all = fmt::format("  {:>7}", "all");
  for (int32_t length : lengths) all += fmt::format(" {:>6.0f}%", r.accuracy_at(length) * 100);
  fmt::print("{}\n", all);
  std::fflush(stdout);
}

nlohmann::json result_json(const eval::NeedleResult& r) {
  const bool fastgen = r.setting.family == "fastgen";
  const bool full = r.setting.family == "full";
  nlohmann::json cells = nlohmann::json::array();
  for (const eval::NeedleCell& cell : r.cells) {
    cells.push_back({{"length", cell.length},
                     {"depth", cell.depth},
                     {"cases", cell.num_cases},
                     {"exact", cell.num_exact},
                     {"accuracy", cell.accuracy()},
                     {"queries", cell.num_queries},
                     {"queries_exact", cell.num_queries_exact},
                     {"mean_needle_depth", cell.mean_needle_depth}});
  }
  std::vector<int32_t> lengths;
  for (const eval::NeedleCell& cell : r.cells) {
    if (std::find(lengths.begin(), lengths.end(), cell.length) == lengths.end())
      lengths.push_back(cell.length);
  }
  nlohmann::json per_length = nlohmann::json::array();
  for (int32_t length : lengths)
    per_length.push_back({{"length", length},
                          {"accuracy", r.accuracy_at(length)},
                          {"spec", r.spec_by_length.at(length)}});
  nlohmann::json cases = nlohmann::json::array();
  for (size_t i = 0; i < r.outcomes.size(); ++i) {
    const eval::NeedleOutcome& o = r.outcomes[i];
    cases.push_back({{"id", i},
                     {"answer", o.answer},
                     {"answer_tokens", o.answer_tokens},
                     {"queries_exact", o.num_queries_exact},
                     {"exact", o.exact}});
  }
  return {{"task", eval::needle_task_name(r.task)},
          {"family", r.setting.family},
          {"budget", fastgen || full ? nlohmann::json(nullptr) : nlohmann::json(r.setting.budget)},
          {"threshold", fastgen ? nlohmann::json(r.setting.budget) : nlohmann::json(nullptr)},
          {"kv_dtype", model::kv_dtype_name(r.setting.kv_dtype)},
          {"spec", r.spec},
          {"seconds", r.seconds},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_prompt_tokens", r.cached_prompt_tokens},
          {"kv_kept", r.kv_kept},
          {"accuracy", r.accuracy},
          {"accuracy_vs_dense",
           r.accuracy_vs_dense ? nlohmann::json(*r.accuracy_vs_dense) : nlohmann::json(nullptr)},
          {"query_accuracy", r.query_accuracy},
          {"lengths", per_length},
          {"cells", cells},
          {"cases", cases}};
}

}  // namespace

void LongContextOptions::add_to(CLI::App& command) {
  command
      .add_option("--task", tasks,
                  "Needle-in-a-haystack instead of fidelity: single, multi-key, multi-value, "
                  "multi-query (comma list); the grid of --lengths x --depths for every policy")
      ->delimiter(',')
      ->check(CLI::IsMember({"single", "multi-key", "multi-value", "multi-query"}));
  own_options = {
      command
          .add_option("--lengths", lengths,
                      "--task: prompt lengths in tokens, question included (default: 1/4, 1/2 "
                      "and all of the context, less the answer's room)")
          ->delimiter(',')
          ->check(CLI::PositiveNumber),
      command
          .add_option("--depths", depth_percents,
                      "--task: needle depths, % of the haystack before it (default 0,10,...,100)")
          ->delimiter(',')
          ->check(CLI::Range(0.0, 100.0)),
      command
          .add_option("--cases", cases_per_cell,
                      "--task: cases per (length, depth) cell (default: 4 below 16k tokens, 2 "
                      "from 16k)")
          ->check(CLI::PositiveNumber),
      command
          .add_option("--framing", framing,
                      "--task: completion (the needle's start is the cue: base and tiny models) "
                      "or instruct (the chat template asks the question in words)")
          ->capture_default_str()
          ->check(CLI::IsMember({"completion", "instruct"})),
      command
          .add_option("--chat-template", chat_template_path,
                      "--framing instruct: a Jinja chat template instead of the model's")
          ->check(CLI::ExistingFile),
      command
          .add_option("--value-kind", value_kind,
                      "--task: values are lowercase words or 4-digit groups")
          ->capture_default_str()
          ->check(CLI::IsMember({"words", "digits"})),
      command
          .add_option("--value-tokens", value_tokens,
                      "--task: MIN,MAX tokens of a value (with its leading space)")
          ->delimiter(',')
          ->expected(2)
          ->capture_default_str(),
      command
          .add_option("--distractors", num_distractors,
                      "--task multi-key: needles under other keys")
          ->capture_default_str(),
      command.add_option("--num-values", num_values, "--task multi-value: values of the key")
          ->capture_default_str(),
      command.add_option("--queries", num_queries, "--task multi-query: keys placed and asked")
          ->capture_default_str(),
      command
          .add_option("--kv-memory", kv_memory_mib,
                      "--task: KV page pool of each setting in MiB, at most (cases wait for room)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber),
      command
          .add_option("--sparse-prefill-chunk", sparse_prefill_chunk,
                      "--task: compress a sparse prompt every this many tokens, as `sieve serve` "
                      "does (0: once, after the prompt, as the policies' papers measure)")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber),
      command.add_option("--heatmap-dir", heatmap_dir,
                         "--task: write one SVG heatmap (depth x length) per setting here"),
      command.add_option("--write-cases", cases_path,
                         "--task: write every case (prompt text, needles, questions) as JSON "
                         "lines"),
  };
}

void run_long_context_eval(const SharedEvalOptions& shared, const LongContextOptions& options) {
  const std::string haystack = read_file(shared.text_path);
  model::LoadedModel loaded = model::load_model(shared.model.load_options());
  const eval::SparsityEvalConfig& sweep = shared.sweep;
  eval::LongContextConfig config{.lengths = options.lengths,
                                 .cases_per_cell = options.cases_per_cell,
                                 .families = sweep.families,
                                 .budgets = sweep.budgets,
                                 .fastgen_thresholds = sweep.fastgen_thresholds,
                                 .observation_window = sweep.observation_window,
                                 .calibration = sweep.calibration,
                                 .kv_dtype = sweep.kv_dtype,
                                 .precise_kv_heads = sweep.precise_kv_heads,
                                 .kv_memory_bytes = static_cast<uint64_t>(options.kv_memory_mib)
                                                    << 20,
                                 .sparse_prefill_chunk = options.sparse_prefill_chunk};
  config.tasks.clear();
  for (const std::string& task : options.tasks)
    config.tasks.push_back(*eval::parse_needle_task(task));
  if (!options.depth_percents.empty()) {
    config.depths.clear();
    for (double percent : options.depth_percents) config.depths.push_back(percent / 100);
  }
  eval::NeedleTaskConfig& needles = config.needles;
  needles.framing = options.framing == "instruct" ? eval::NeedleFraming::kInstruct
                                                  : eval::NeedleFraming::kCompletion;
  needles.question_in_prompt = shared.question_in_prompt;
  needles.value_kind = options.value_kind == "digits" ? eval::NeedleValueKind::kDigits
                                                      : eval::NeedleValueKind::kWords;
  needles.value_min_tokens = options.value_tokens.at(0);
  needles.value_max_tokens = options.value_tokens.at(1);
  needles.num_distractors = options.num_distractors;
  needles.num_values = options.num_values;
  needles.num_queries = options.num_queries;
  needles.seed = sweep.seed;
  std::string template_origin;
  if (needles.framing == eval::NeedleFraming::kInstruct)
    needles.render_chat = chat_renderer(loaded, options.chat_template_path, template_origin);
  else if (!options.chat_template_path.empty())
    fail("--chat-template is for --framing instruct");

  const std::string question_place = needles.question_in_prompt
                                         ? "ends the prompt"
                                         : "comes after the prompt (forced after compression)";
  fmt::print(
      "needle in a haystack: {} on {}; {} framing{}, the question {}; values of {}..{} tokens "
      "({}); seed {}; KV pages in {}, compared with the f32 dense cache; sparse prompts "
      "compressed {}\n",
      fmt::join(options.tasks, ", "), shared.text_path, options.framing,
      template_origin.empty() ? "" : fmt::format(" (chat template: {})", template_origin),
      question_place, needles.value_min_tokens, needles.value_max_tokens, options.value_kind,
      needles.seed, model::kv_dtype_name(config.kv_dtype),
      config.sparse_prefill_chunk > 0 ? fmt::format("every {} tokens", config.sparse_prefill_chunk)
                                      : std::string("once, after the prompt"));
  std::fflush(stdout);
  const eval::LongContextRun run =
      eval::run_long_context_eval(loaded.model, loaded.tokenizer, haystack, config,
                                  [](const eval::NeedleResult& r) { print_result(r); });

  const std::string framing_line =
      fmt::format("{} framing, question {}", options.framing,
                  needles.question_in_prompt ? "in the prompt" : "after compression");
  if (!options.heatmap_dir.empty()) {
    std::filesystem::create_directories(options.heatmap_dir);
    for (const eval::NeedleResult& r : run.results) {
      const bool full = r.setting.family == "full";
      const std::string title = fmt::format(
          "{}: {}{}, KV {}", eval::needle_task_name(r.task), r.setting.family,
          full ? " (dense)"
               : fmt::format(" {} {}", r.setting.family == "fastgen" ? "threshold" : "budget",
                             budget_label(r.setting)),
          model::kv_dtype_name(r.setting.kv_dtype));
      const std::string subtitle =
          fmt::format("{}, {}\n{:.0f}% exact ({} of dense), KV kept {:.2f}: {}", loaded.name,
                      framing_line, r.accuracy * 100, vs_dense(r), r.kv_kept, r.spec);
      write_file((std::filesystem::path(options.heatmap_dir) / file_name(r)).string(),
                 eval::needle_heatmap_svg(r, title, subtitle));
    }
  }
  if (!options.cases_path.empty()) {
    std::string lines;
    for (const eval::NeedleCaseSet& set : run.case_sets) {
      for (size_t i = 0; i < set.cases.size(); ++i) {
        const eval::NeedleCase& c = set.cases[i];
        nlohmann::json placed = nlohmann::json::array();
        for (const eval::PlacedNeedle& n : c.needles) {
          placed.push_back(
              {{"key", n.key}, {"value", n.value}, {"haystack_offset", n.haystack_offset}});
        }
        nlohmann::json queries = nlohmann::json::array();
        for (const eval::NeedleQuery& q : c.queries)
          queries.push_back({{"key", q.key}, {"value", q.value}});
        const nlohmann::json line = {{"task", eval::needle_task_name(set.task)},
                                     {"id", i},
                                     {"length", c.length},
                                     {"depth", c.depth},
                                     {"needle_depth", c.needle_depth},
                                     {"case", c.case_idx},
                                     {"haystack_tokens", c.num_haystack_tokens},
                                     {"needles", placed},
                                     {"queries", queries},
                                     {"prompt_tokens", c.prompt.size()},
                                     {"prompt", prompt_text(*loaded.tokenizer, c.prompt)},
                                     {"forced", loaded.tokenizer->decode(c.forced, true)},
                                     {"max_tokens", c.max_tokens}};
        lines += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      }
    }
    write_file(options.cases_path, lines);
  }
  if (!shared.json_path.empty()) {
    nlohmann::json results = nlohmann::json::array();
    for (const eval::NeedleResult& r : run.results) results.push_back(result_json(r));
    nlohmann::json cases_per_cell = nlohmann::json::object();
    for (int32_t length : run.lengths) {
      cases_per_cell[std::to_string(length)] =
          options.cases_per_cell.value_or(eval::default_cases_per_cell(length));
    }
    const nlohmann::json doc = {{"model", shared.model.model_path},
                                {"text", shared.text_path},
                                {"context", run.context},
                                {"tasks", options.tasks},
                                {"framing", options.framing},
                                {"retrieval_cue", needles.question_in_prompt ? "prompt" : "after"},
                                {"lengths", run.lengths},
                                {"depths", config.depths},
                                {"cases_per_cell", cases_per_cell},
                                {"value",
                                 {{"kind", options.value_kind},
                                  {"min_tokens", needles.value_min_tokens},
                                  {"max_tokens", needles.value_max_tokens}}},
                                {"distractors", needles.num_distractors},
                                {"num_values", needles.num_values},
                                {"queries", needles.num_queries},
                                {"seed", needles.seed},
                                {"kv_dtype", model::kv_dtype_name(config.kv_dtype)},
                                {"sparse_prefill_chunk", config.sparse_prefill_chunk},
                                {"reference", "f32 full"},
                                {"results", results}};
    write_file(shared.json_path,
               doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace sieve::cli
