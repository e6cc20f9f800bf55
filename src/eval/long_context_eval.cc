#include "eval/long_context_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>

#include "engine/engine.h"
#include "eval/eval_requests.h"
#include "model/kv_cache.h"
#include "util/error.h"
#include "util/svg_plot.h"

namespace sieve::eval {

namespace {

using tok::TokenId;

constexpr int32_t kPageSize = 16;  // the evaluation engine's KV page size (tokens)

std::string lowercase(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

NeedleOutcome score(const NeedleCase& c, const EvalOutput& out, const tok::Tokenizer& tokenizer) {
  NeedleOutcome outcome;
  const auto num_forced = static_cast<ptrdiff_t>(c.forced.size());
  if (c.scoring == NeedleScoring::kForced) {
    for (const NeedleQuery& q : c.queries) {
      bool matched = true;
      std::vector<TokenId> chosen;
      for (int32_t k = q.answer_begin; k < q.answer_end; ++k) {
        const auto at = static_cast<size_t>(k);
        const bool have = at < out.steps.size() && !out.steps[at].top.empty();
        const TokenId greedy = have ? out.steps[at].top.front().id : -1;
        matched = matched && greedy == c.forced[at];
        if (have) chosen.push_back(greedy);
      }
      outcome.num_queries_exact += matched;
      if (!outcome.answer.empty()) outcome.answer += " | ";
      outcome.answer += tokenizer.decode(chosen);
      outcome.answer_tokens.insert(outcome.answer_tokens.end(), chosen.begin(), chosen.end());
    }
  } else {
    if (static_cast<ptrdiff_t>(out.tokens.size()) > num_forced)
      outcome.answer_tokens.assign(out.tokens.begin() + num_forced, out.tokens.end());
    outcome.answer = tokenizer.decode(outcome.answer_tokens);
    if (c.scoring == NeedleScoring::kStartsWith) {
      const size_t first = outcome.answer.find_first_not_of(" \t\r\n");
      const std::string_view text = first == std::string::npos
                                        ? std::string_view()
                                        : std::string_view(outcome.answer).substr(first);
      outcome.num_queries_exact = text.starts_with(c.queries.front().value);
    } else {
      const std::string text = lowercase(outcome.answer);
      for (const NeedleQuery& q : c.queries)
        outcome.num_queries_exact += text.find(lowercase(q.value)) != std::string::npos;
    }
  }
  outcome.exact = outcome.num_queries_exact == static_cast<int32_t>(c.queries.size());
  return outcome;
}

// Runs one setting's cases on an engine of its own. Dense: per haystack (length, case_idx) the
// case whose asked needle is deepest goes first, so the others find their prompt up to their
// needle in the prefix cache; a sparse prompt compressed once keeps its pages private anyway.
std::vector<EvalOutput> run_setting(std::shared_ptr<const model::Model> model,
                                    std::shared_ptr<const tok::Tokenizer> tokenizer,
                                    const std::vector<NeedleCase>& cases,
                                    const std::vector<std::string>& policies,
                                    const PolicySetting& setting, const LongContextConfig& config) {
  int64_t total_pages = 0, largest = 0;
  for (const NeedleCase& c : cases) {
    const int64_t pages =
        (static_cast<int64_t>(c.prompt.size()) + c.max_tokens + kPageSize - 1) / kPageSize + 1;
    total_pages += pages;
    largest = std::max(largest, pages);
  }
  const int64_t num_precise =
      config.precise_kv_heads ? std::ssize(model->precise_kv_streams(setting.kv_dtype)) : 0;
  const auto page_bytes = static_cast<int64_t>(
      model::KvCache::bytes_per_page(model->config(), kPageSize, setting.kv_dtype, num_precise));
  const int64_t cap = static_cast<int64_t>(config.kv_memory_bytes) / page_bytes;
  if (cap < largest) {
    fail("one case needs {} MiB of {} KV but the pool may take {} MiB; give it more --kv-memory",
         (largest * page_bytes + (1 << 20) - 1) >> 20, model::kv_dtype_name(setting.kv_dtype),
         config.kv_memory_bytes >> 20);
  }
  engine::Engine engine({.num_kv_pages = static_cast<int32_t>(std::min(total_pages, cap)),
                         .page_size = kPageSize,
                         .max_batch_tokens = config.max_batch_tokens,
                         .sparse_prefill_chunk = config.sparse_prefill_chunk,
                         .max_num_seqs = 256,
                         .max_queued = static_cast<int32_t>(cases.size()) + 1,
                         .enable_prefix_caching = true,
                         .kv_dtype = setting.kv_dtype,
                         .precise_kv_heads = config.precise_kv_heads,
                         .calibration = config.calibration},
                        std::move(model), std::move(tokenizer));
  std::vector<EvalRequest> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    const NeedleCase& c = cases[i];
    const bool forced = c.scoring == NeedleScoring::kForced;
    requests.push_back({.prompt = c.prompt,
                        .forced = c.forced,
                        .max_tokens = c.max_tokens,
                        .policy = policies[i],
                        .logprobs = forced ? std::optional<int32_t>(1) : std::nullopt,
                        .ignore_eos = forced});
  }
  if (setting.family != "full") return run_eval_requests(engine, requests);

  std::map<std::pair<int32_t, int32_t>, size_t> deepest;  // (length, case_idx) -> case
  for (size_t i = 0; i < cases.size(); ++i) {
    auto [it, added] = deepest.try_emplace({cases[i].length, cases[i].case_idx}, i);
    if (!added && cases[i].needle_depth > cases[it->second].needle_depth) it->second = i;
  }
  std::vector<size_t> first, rest;
  std::vector<bool> is_first(cases.size());
  for (const auto& [group, i] : deepest) is_first[i] = true;
  for (size_t i = 0; i < cases.size(); ++i) (is_first[i] ? first : rest).push_back(i);
  std::vector<EvalOutput> outputs(cases.size());
  for (const std::vector<size_t>* wave : {&first, &rest}) {
    std::vector<EvalRequest> batch;
    for (size_t i : *wave) batch.push_back(requests[i]);
    std::vector<EvalOutput> done = run_eval_requests(engine, batch);
    for (size_t j = 0; j < wave->size(); ++j) outputs[(*wave)[j]] = std::move(done[j]);
  }
  return outputs;
}

NeedleResult summarize(NeedleTask task, const PolicySetting& setting,
                       const std::vector<NeedleCase>& cases, const std::vector<EvalOutput>& outputs,
                       const tok::Tokenizer& tokenizer, const std::vector<int32_t>& lengths,
                       const std::vector<double>& depths) {
  NeedleResult result{.task = task, .setting = setting};
  for (int32_t length : lengths) {
    for (double depth : depths) result.cells.push_back({.length = length, .depth = depth});
  }
  double kept = 0;
  int32_t num_exact = 0, num_queries = 0, num_queries_exact = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const NeedleCase& c = cases[i];
    NeedleOutcome outcome = score(c, outputs[i], tokenizer);
    const size_t row =
        static_cast<size_t>(std::find(lengths.begin(), lengths.end(), c.length) - lengths.begin());
    const size_t column =
        static_cast<size_t>(std::find(depths.begin(), depths.end(), c.depth) - depths.begin());
    NeedleCell& cell = result.cells[row * depths.size() + column];
    ++cell.num_cases;
    cell.num_exact += outcome.exact;
    cell.num_queries += static_cast<int32_t>(c.queries.size());
    cell.num_queries_exact += outcome.num_queries_exact;
    cell.mean_needle_depth += c.needle_depth;
    num_exact += outcome.exact;
    num_queries += static_cast<int32_t>(c.queries.size());
    num_queries_exact += outcome.num_queries_exact;
    const engine::Usage& usage = outputs[i].usage;
    kept +=
        usage.kv_dense_pages > 0 ? static_cast<double>(usage.kv_pages) / usage.kv_dense_pages : 1.0;
    result.prompt_tokens += usage.prompt_tokens;
    result.cached_prompt_tokens += usage.cached_prompt_tokens;
    result.outcomes.push_back(std::move(outcome));
  }
  for (NeedleCell& cell : result.cells) {
    if (cell.num_cases > 0) cell.mean_needle_depth /= cell.num_cases;
  }
  const auto n = static_cast<double>(cases.size());
  result.accuracy = n > 0 ? num_exact / n : 0.0;
  result.query_accuracy =
      num_queries > 0 ? static_cast<double>(num_queries_exact) / num_queries : 0.0;
  result.kv_kept = n > 0 ? kept / n : 1.0;
  return result;
}

}  // namespace

std::vector<int32_t> default_needle_lengths(int64_t context, int32_t answer_room) {
  const auto whole = [](int64_t tokens) {
    return static_cast<int32_t>(tokens / kPageSize * kPageSize);
  };
  std::vector<int32_t> lengths = {whole(context / 4), whole(context / 2),
                                  whole(context - answer_room)};
  lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [](int32_t l) { return l <= 0; }),
                lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

int32_t default_cases_per_cell(int32_t length) { return length < 16384 ? 4 : 2; }

double NeedleResult::accuracy_at(int32_t length) const {
  int32_t num_cases = 0, num_exact = 0;
  for (const NeedleCell& cell : cells) {
    if (cell.length != length) continue;
    num_cases += cell.num_cases;
    num_exact += cell.num_exact;
  }
  return num_cases ? static_cast<double>(num_exact) / num_cases : 0.0;
}

LongContextRun run_long_context_eval(std::shared_ptr<const model::Model> model,
                                     std::shared_ptr<const tok::Tokenizer> tokenizer,
                                     const std::string& haystack, const LongContextConfig& config,
                                     const std::function<void(const NeedleResult&)>& on_result) {
  // Everything that can be refused is refused first, before any model work.
  const std::vector<PolicySetting> settings =
      policy_settings(config.families, config.budgets, config.fastgen_thresholds, config.kv_dtype,
                      config.calibration != nullptr);
  if (config.tasks.empty()) fail("no task to run");
  if (config.depths.empty()) fail("no depth to put the needle at");
  for (double depth : config.depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) fail("depth {}% is not in 0..100%", depth * 100);
  }
  if (config.cases_per_cell && *config.cases_per_cell < 1) fail("cases per cell must be >= 1");
  LongContextRun run{.context = model->config().context_length};
  std::vector<NeedleCaseMaker> makers;
  int32_t room = 0;
  for (NeedleTask task : config.tasks) {
    NeedleTaskConfig task_config = config.needles;
    task_config.task = task;
    makers.emplace_back(tokenizer, haystack, task_config);
    room = std::max(room, makers.back().answer_room());
  }
  run.lengths = config.lengths.empty() ? default_needle_lengths(run.context, room) : config.lengths;
  if (run.lengths.empty()) fail("the model's context ({}) holds no case", run.context);
  for (int32_t length : run.lengths) {
    if (length < 1) fail("length {} is not a positive number of tokens", length);
    for (const NeedleCaseMaker& maker : makers) {
      if (length + maker.answer_room() > run.context) {
        fail(
            "length {} does not fit the model's context of {} tokens: {} cases need up to {} "
            "positions after it for their answer; use lengths up to {}, or a longer context "
            "(--ctx-size, with --rope-scaling beyond what the model was trained for)",
            length, run.context, needle_task_name(maker.config().task), maker.answer_room(),
            run.context - maker.answer_room());
      }
    }
  }
  for (const NeedleCaseMaker& maker : makers) {
    NeedleCaseSet set{.task = maker.config().task};
    for (int32_t length : run.lengths) {
      const int32_t num_cases = config.cases_per_cell.value_or(default_cases_per_cell(length));
      for (int32_t case_idx = 0; case_idx < num_cases; ++case_idx) {
        for (NeedleCase& c : maker.make_cases(length, case_idx, config.depths))
          set.cases.push_back(std::move(c));
      }
    }
    run.case_sets.push_back(std::move(set));
  }

  for (const NeedleCaseSet& set : run.case_sets) {
    double dense_accuracy = 0.0;
    for (const PolicySetting& setting : settings) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::string> policies;
      for (const NeedleCase& c : set.cases) {
        policies.push_back(policy_for_setting(setting, static_cast<int32_t>(c.prompt.size()),
                                              config.observation_window));
      }
      const std::vector<EvalOutput> outputs =
          run_setting(model, tokenizer, set.cases, policies, setting, config);
      NeedleResult result =
          summarize(set.task, setting, set.cases, outputs, *tokenizer, run.lengths, config.depths);
      result.spec = policies.front();
      for (size_t i = 0; i < set.cases.size(); ++i)
        result.spec_by_length.try_emplace(set.cases[i].length, policies[i]);
      result.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (&setting == &settings.front()) dense_accuracy = result.accuracy;
      if (dense_accuracy > 0) result.accuracy_vs_dense = result.accuracy / dense_accuracy;
      if (on_result) on_result(result);
      run.results.push_back(std::move(result));
    }
  }
  return run;
}

namespace {

// Red (0) through yellow (0.5) to green (1).
std::string accuracy_colour(double accuracy) {
  constexpr std::array<std::array<double, 3>, 3> kStops = {
      {{215, 48, 39}, {254, 224, 139}, {26, 152, 80}}};
  const double x = std::clamp(accuracy, 0.0, 1.0) * 2;
  const auto lo = static_cast<size_t>(std::min(1.0, std::floor(x)));
  const double t = x - static_cast<double>(lo);
  std::array<int, 3> rgb{};
  for (size_t i = 0; i < 3; ++i)
    rgb[i] = static_cast<int>(std::lround(kStops[lo][i] + t * (kStops[lo + 1][i] - kStops[lo][i])));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

std::string percent(double fraction) { return fmt::format("{:.0f}%", fraction * 100); }

}  // namespace

std::string needle_heatmap_svg(const NeedleResult& result, const std::string& title,
                               const std::string& subtitle) {
  std::vector<int32_t> lengths;
  std::vector<double> depths;
  for (const NeedleCell& cell : result.cells) {
    if (std::find(lengths.begin(), lengths.end(), cell.length) == lengths.end())
      lengths.push_back(cell.length);
    if (std::find(depths.begin(), depths.end(), cell.depth) == depths.end())
      depths.push_back(cell.depth);
  }
  std::vector<std::string> subtitle_lines;
  for (size_t from = 0; from <= subtitle.size();) {
    const size_t to = std::min(subtitle.find('\n', from), subtitle.size());
    subtitle_lines.push_back(subtitle.substr(from, to - from));
    from = to + 1;
  }
  size_t widest = title.size() * 9 / 7;  // the title's font is 16 against the subtitle's 12
  for (const std::string& line : subtitle_lines) widest = std::max(widest, line.size());
  constexpr double kCellWidth = 76, kCellHeight = 26;
  constexpr double kLeft = 92, kBottom = 60, kRight = 96;
  const double top = 48 + 16 * static_cast<double>(subtitle_lines.size());
  const double grid_w = kCellWidth * static_cast<double>(lengths.size());
  const double grid_h = kCellHeight * static_cast<double>(depths.size());
  // At most about 7.2 pixels per character of 12-pixel sans-serif.
  const double width = std::max(kLeft + grid_w + kRight, 7.2 * static_cast<double>(widest) + 40);
  const double height = top + grid_h + kBottom;
  const double left = (width - grid_w - kRight + kLeft) / 2;  // the grid centred
  std::string svg = svg::document_begin(width, height, title);
  for (size_t i = 0; i < subtitle_lines.size(); ++i) {
    svg +=
        fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text>)"
                    "\n",
                    width / 2, 42 + 16 * static_cast<double>(i), svg::escape(subtitle_lines[i]));
  }
  for (const NeedleCell& cell : result.cells) {
    const auto column = static_cast<double>(std::find(lengths.begin(), lengths.end(), cell.length) -
                                            lengths.begin());
    const auto row =
        static_cast<double>(std::find(depths.begin(), depths.end(), cell.depth) - depths.begin());
    const double x = left + column * kCellWidth, y = top + row * kCellHeight;
    const bool empty = cell.num_cases == 0;
    svg += fmt::format(
        R"(<g><title>length {}, depth {}: {} of {} cases exact; needle at {} on average</title>)"
        R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}" stroke="white"/>)"
        R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text></g>)"
        "\n",
        cell.length, percent(cell.depth), cell.num_exact, cell.num_cases,
        percent(cell.mean_needle_depth), x, y, kCellWidth, kCellHeight,
        empty ? "#cccccc" : accuracy_colour(cell.accuracy()), x + kCellWidth / 2,
        y + kCellHeight / 2 + 4, empty ? "-" : percent(cell.accuracy()));
  }
  for (size_t r = 0; r < depths.size(); ++r) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)"
                       "\n",
                       left - 6, top + (static_cast<double>(r) + 0.5) * kCellHeight + 4,
                       percent(depths[r]));
  }
  for (size_t c = 0; c < lengths.size(); ++c) {
    svg += fmt::format(
        R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)"
        "\n",
        left + (static_cast<double>(c) + 0.5) * kCellWidth, top + grid_h + 16, lengths[c]);
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text>)"
                     "\n",
                     left + grid_w / 2, top + grid_h + 38, "context length (tokens)");
  svg += fmt::format(
      R"svg(<text x="{0:.1f}" y="{1:.1f}" font-size="12" text-anchor="middle" transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)svg"
      "\n",
      left - 72, top + grid_h / 2, "needle depth");
  // The colour scale: 100% at the top.
  const double bar_x = left + grid_w + 24;
  svg += R"(<defs><linearGradient id="accuracy" x1="0" y1="1" x2="0" y2="0">)";
  for (double stop : {0.0, 0.5, 1.0})
    svg += fmt::format(R"(<stop offset="{}" stop-color="{}"/>)", stop, accuracy_colour(stop));
  svg += "</linearGradient></defs>\n";
  svg += fmt::format(
      R"svg(<rect x="{:.1f}" y="{:.1f}" width="16" height="{:.1f}" fill="url(#accuracy)" stroke="#444"/>)svg"
      "\n",
      bar_x, top, grid_h);
  for (double stop : {0.0, 0.5, 1.0}) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text>)"
                       "\n",
                       bar_x + 22, top + (1 - stop) * grid_h + 4, percent(stop));
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11">exact</text>)"
                     "\n",
                     bar_x - 4, top + grid_h + 16);
  svg += "</svg>\n";
  return svg;
}

}  // namespace sieve::eval
