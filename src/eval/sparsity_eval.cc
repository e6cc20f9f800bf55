#include "eval/sparsity_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "eval/eval_requests.h"
#include "model/kv_cache.h"
#include "sparsity/policy_spec.h"
#include "util/error.h"
#include "util/svg_plot.h"

namespace sieve::eval {

namespace {

using tok::TokenId;

constexpr int32_t kPageSize = 16;  // the evaluation engine's KV page size (tokens)

struct Case {
  std::vector<TokenId> prompt;
  std::vector<TokenId> forced;  // the true continuation, or the retrieval cue
  int32_t max_tokens = 0;
  bool retrieval = false;
  std::vector<TokenId> answer;  // retrieval: the span tokens after the cue
};

std::vector<Case> make_cases(const std::vector<TokenId>& text, TokenId bos,
                             const SparsityEvalConfig& c) {
  const int64_t segment = c.prompt_tokens + c.continuation_tokens;
  const auto text_size = static_cast<int64_t>(text.size());
  if (text_size < c.num_prompts * segment) {
    fail("the text has {} tokens; {} prompts of {} + {} tokens need {}", text_size, c.num_prompts,
         c.prompt_tokens, c.continuation_tokens, c.num_prompts * segment);
  }
  if (c.retrieval_cue <= 0 || c.retrieval_cue >= c.retrieval_span)
    fail("the retrieval cue must be shorter than the span");
  const int64_t filler_len = c.prompt_tokens - 1 - c.retrieval_span;
  if (c.retrieval_prompts > 0 &&
      (filler_len <= c.retrieval_cue || text_size < 2 * (filler_len + c.retrieval_span)))
    fail("retrieval needs prompts longer than the span and a text of at least twice a prompt");
  std::vector<Case> cases;
  for (int32_t i = 0; i < c.num_prompts; ++i) {
    const auto begin = text.begin() + i * segment;
    Case lm{.max_tokens = c.continuation_tokens};
    lm.prompt.push_back(bos);
    lm.prompt.insert(lm.prompt.end(), begin, begin + (c.prompt_tokens - 1));
    lm.forced.assign(begin + (c.prompt_tokens - 1),
                     begin + (c.prompt_tokens - 1 + c.continuation_tokens));
    cases.push_back(std::move(lm));
  }
  // Retrieval: a span, then filler from elsewhere in the text (never overlapping the span, so the
  // answer is only in the span); the cue comes after compression, or ends the prompt.
  std::mt19937_64 rng(c.seed);
  std::uniform_int_distribution<int64_t> span_at(0, text_size - c.retrieval_span);
  std::uniform_int_distribution<int64_t> filler_at(0, text_size - filler_len);
  for (int32_t i = 0; i < c.retrieval_prompts; ++i) {
    const int64_t s = span_at(rng);
    int64_t f = filler_at(rng);
    while (f < s + c.retrieval_span && s < f + filler_len) f = filler_at(rng);
    const auto span = text.begin() + s;
    Case r{.max_tokens = c.retrieval_span, .retrieval = true};
    r.prompt.push_back(bos);
    r.prompt.insert(r.prompt.end(), span, span + c.retrieval_span);
    if (c.retrieval_cue_in_prompt) {
      r.prompt.insert(r.prompt.end(), text.begin() + f,
                      text.begin() + f + (filler_len - c.retrieval_cue));
      r.prompt.insert(r.prompt.end(), span, span + c.retrieval_cue);
      r.max_tokens = c.retrieval_span - c.retrieval_cue;
    } else {
      r.prompt.insert(r.prompt.end(), text.begin() + f, text.begin() + f + filler_len);
      r.forced.assign(span, span + c.retrieval_cue);
    }
    r.answer.assign(span + c.retrieval_cue, span + c.retrieval_span);
    cases.push_back(std::move(r));
  }
  return cases;
}

std::vector<EvalOutput> run_cases(std::shared_ptr<const model::Model> model,
                                  std::shared_ptr<const tok::Tokenizer> tokenizer,
                                  const std::vector<Case>& cases,
                                  const std::vector<std::string>& policies,
                                  std::shared_ptr<const sparsity::CalibrationProfile> calibration,
                                  kernels::DType kv_dtype, bool precise_kv_heads) {
  int64_t pages = 0;
  for (const Case& c : cases)
    pages += (static_cast<int64_t>(c.prompt.size()) + c.max_tokens) / kPageSize + 2;
  engine::Engine engine({.num_kv_pages = static_cast<int32_t>(2 * pages),
                         .page_size = kPageSize,
                         .max_batch_tokens = 512,
                         .max_num_seqs = 256,
                         .max_queued = 4096,
                         .enable_prefix_caching = false,
                         .kv_dtype = kv_dtype,
                         .precise_kv_heads = precise_kv_heads,
                         .calibration = std::move(calibration)},
                        std::move(model), std::move(tokenizer));
  std::vector<EvalRequest> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    requests.push_back({.prompt = cases[i].prompt,
                        .forced = cases[i].forced,
                        .max_tokens = cases[i].max_tokens,
                        .policy = policies[i],
                        .logprobs = cases[i].retrieval ? std::nullopt : std::optional<int32_t>(0),
                        .full_logprobs = !cases[i].retrieval});
  }
  return run_eval_requests(engine, requests);
}

// log p of every vocabulary entry, from a full-distribution SampleResult.
std::vector<double> distribution(const engine::SampleResult& step, size_t vocab) {
  std::vector<double> lp(vocab, -INFINITY);
  for (const engine::TokenLogprob& t : step.top) lp[static_cast<size_t>(t.id)] = t.logprob;
  return lp;
}

}  // namespace

namespace {

// family "NAME:K=V,..." is NAME's budget policy with those parameters set (or overridden).
std::string with_overrides(const std::string& policy, std::string_view overrides) {
  if (overrides.empty()) return policy;
  const size_t colon = policy.find(':');
  std::vector<std::pair<std::string, std::string>> params;
  for (std::string_view rest = colon == std::string::npos
                                   ? std::string_view()
                                   : std::string_view(policy).substr(colon + 1);
       !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    params.emplace_back(std::string(item.substr(0, eq)),
                        eq == std::string_view::npos ? "" : std::string(item.substr(eq + 1)));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  for (std::string_view rest = overrides; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) fail("'{}' in '{}' is not KEY=VALUE", item, overrides);
    const std::string key(item.substr(0, eq));
    auto at =
        std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == key; });
    if (at == params.end()) at = params.insert(params.end(), {key, ""});
    at->second = std::string(item.substr(eq + 1));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  std::string out = policy.substr(0, colon);
  for (size_t i = 0; i < params.size(); ++i)
    out += fmt::format("{}{}={}", i == 0 ? ":" : ",", params[i].first, params[i].second);
  return out;
}

// The policy's own budget mapping (sparsity::policy_for_budget), for keep tokens per KV head.
std::string base_policy_for_budget(const std::string& family, double budget, int32_t prompt_len,
                                   int32_t window) {
  const int32_t keep =
      std::max<int32_t>(2 * window, static_cast<int32_t>(std::lround(budget * prompt_len)));
  return sparsity::policy_for_budget(
      family, {.keep_tokens = keep, .window = window, .page_size = kPageSize});
}

}  // namespace

std::string policy_for_budget(const std::string& family_and_overrides, double budget,
                              int32_t prompt_len, int32_t window) {
  const size_t colon = family_and_overrides.find(':');
  const std::string family = family_and_overrides.substr(0, colon);
  const std::string_view overrides = colon == std::string::npos
                                         ? std::string_view()
                                         : std::string_view(family_and_overrides).substr(colon + 1);
  if (family == "layerwise" && !overrides.empty())
    fail("layerwise takes no parameters here ('{}')", family_and_overrides);
  return with_overrides(base_policy_for_budget(family, budget, prompt_len, window), overrides);
}

std::string fastgen_policy(double threshold, int32_t prompt_len, int32_t window) {
  return fmt::format("fastgen:T={},W={},F=0.1", threshold, std::max(2 * window, prompt_len / 8));
}

std::vector<PolicySetting> policy_settings(const std::vector<std::string>& families,
                                           const std::vector<double>& budgets,
                                           const std::vector<double>& fastgen_thresholds,
                                           kernels::DType kv_dtype, bool have_calibration) {
  std::vector<PolicySetting> settings = {{"full", 1.0, kernels::DType::kF32}};
  if (kv_dtype != kernels::DType::kF32) settings.push_back({"full", 1.0, kv_dtype});
  // The command line splits "lserve:R=1,B=1,quest" at every comma: a piece that is a bare
  // KEY=VALUE (no family name) belongs to the family before it.
  std::vector<std::string> joined;
  for (const std::string& piece : families) {
    const size_t eq = piece.find('=');
    if (!joined.empty() && eq != std::string::npos && piece.find(':') > eq) {
      joined.back() += "," + piece;
    } else {
      joined.push_back(piece);
    }
  }
  for (const std::string& family : joined) {
    if (family == "full") continue;  // the rows above: f32, and the dtype's own when it differs
    const std::string name = family.substr(0, family.find(':'));
    if (name == "lserve" && !have_calibration) {
      fail("lserve needs a calibration profile (--calibration FILE, written by `sieve calibrate`)");
    }
    for (double budget : family == "fastgen" ? fastgen_thresholds : budgets)
      settings.push_back({family, budget, kv_dtype});
  }
  // An unknown family or parameter fails here, before any work.
  for (const PolicySetting& s : settings)
    (void)sparsity::parse_policy(policy_for_setting(s, 1024, 8));
  return settings;
}

std::string policy_for_setting(const PolicySetting& setting, int32_t prompt_len, int32_t window) {
  if (setting.family == "fastgen") return fastgen_policy(setting.budget, prompt_len, window);
  return policy_for_budget(setting.family, setting.budget, prompt_len, window);
}

std::vector<PolicyFidelity> run_sparsity_eval(
    std::shared_ptr<const model::Model> model, std::shared_ptr<const tok::Tokenizer> tokenizer,
    const std::string& text, const SparsityEvalConfig& config,
    const std::function<void(const PolicyFidelity&)>& on_result) {
  const tok::Vocab& vocab = tokenizer->vocab();
  if (!vocab.bos) fail("the model's vocabulary has no BOS token");
  const std::vector<TokenId> tokens =
      tokenizer->encode(text, {.add_special = false, .parse_special = false});
  const std::vector<Case> cases = make_cases(tokens, *vocab.bos, config);
  const size_t vocab_size = vocab.size();
  const std::vector<PolicySetting> settings =
      policy_settings(config.families, config.budgets, config.fastgen_thresholds, config.kv_dtype,
                      config.calibration != nullptr);

  auto evaluate = [&](const PolicySetting& setting) {
    std::vector<std::string> policies;
    for (const Case& c : cases) {
      policies.push_back(policy_for_setting(setting, static_cast<int32_t>(c.prompt.size()),
                                            config.observation_window));
    }
    return std::make_pair(policies, run_cases(model, tokenizer, cases, policies, config.calibration,
                                              setting.kv_dtype, config.precise_kv_heads));
  };

  // Bytes the f32 cache takes per page, the denominator of kv_bytes_kept.
  const auto f32_page_bytes = static_cast<double>(
      model::KvCache::bytes_per_page(model->config(), kPageSize, kernels::DType::kF32));
  std::vector<PolicyFidelity> out;
  // Not a structured binding: the lambda below captures it (clang 14 cannot capture bindings).
  const auto dense_run = evaluate(settings.front());
  const auto& dense_policies = dense_run.first;
  const auto& dense = dense_run.second;
  auto summarize = [&](const std::string& family, double budget,
                       const std::vector<std::string>& policies,
                       const std::vector<EvalOutput>& results, kernels::DType kv_dtype) {
    PolicyFidelity f{.family = family,
                     .budget = budget,
                     .spec = policies[0],
                     .kv_dtype = std::string(model::kv_dtype_name(kv_dtype))};
    double kept_bytes = 0;
    double kept = 0, agree = 0, kl = 0, nll = 0, recovery = 0;
    double dense_retrieved = 0;
    std::vector<double> retrieved;  // per case: fraction of the span reproduced
    int64_t positions = 0, num_lm = 0, num_recovery = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const EvalOutput& r = results[i];
      if (c.retrieval) {
        double hits = 0;
        for (size_t j = 0; j < c.answer.size(); ++j) {
          const size_t at = c.forced.size() + j;
          hits += at < r.tokens.size() && r.tokens[at] == c.answer[j];
          dense_retrieved += at < dense[i].tokens.size() && dense[i].tokens[at] == c.answer[j];
        }
        retrieved.push_back(hits / static_cast<double>(c.answer.size()));
        continue;
      }
      ++num_lm;
      if (r.usage.attention_recovery) {
        recovery += *r.usage.attention_recovery;
        ++num_recovery;
      }
      kept += r.usage.kv_dense_pages > 0
                  ? static_cast<double>(r.usage.kv_pages) / r.usage.kv_dense_pages
                  : 1.0;
      kept_bytes += r.usage.kv_dense_pages > 0 ? static_cast<double>(r.usage.kv_bytes) /
                                                     (r.usage.kv_dense_pages * f32_page_bytes)
                                               : 1.0;
      for (size_t j = 0; j < r.steps.size() && j < dense[i].steps.size(); ++j) {
        const std::vector<double> p = distribution(dense[i].steps[j], vocab_size);
        const std::vector<double> q = distribution(r.steps[j], vocab_size);
        agree += dense[i].steps[j].top.front().id == r.steps[j].top.front().id;
        double d = 0;
        for (size_t v = 0; v < vocab_size; ++v) {
          if (std::isfinite(p[v]) && p[v] > -50)
            d += std::exp(p[v]) * (p[v] - std::max(q[v], -1e4));
        }
        kl += d;
        nll -= r.steps[j].logprob.value_or(0.0f);
        ++positions;
      }
    }
    f.kv_kept = num_lm ? kept / num_lm : 1.0;
    f.kv_bytes_kept = num_lm ? kept_bytes / num_lm : 1.0;
    f.top1_agreement = positions ? agree / positions : 1.0;
    f.mean_kl = positions ? kl / positions : 0.0;
    f.perplexity = positions ? std::exp(nll / positions) : 0.0;
    const auto n = static_cast<double>(retrieved.size());
    double sum = 0, squares = 0;
    for (double x : retrieved) sum += x;
    f.retrieval = n > 0 ? sum / n : 0.0;
    for (double x : retrieved) squares += (x - f.retrieval) * (x - f.retrieval);
    f.retrieval_ci95 = n > 1 ? 1.96 * std::sqrt(squares / (n - 1) / n) : 0.0;
    const double dense_mean =
        n > 0 ? dense_retrieved /
                    (n * static_cast<double>(config.retrieval_span - config.retrieval_cue))
              : 0.0;
    f.retrieval_vs_dense = dense_mean > 0 ? f.retrieval / dense_mean : 0.0;
    f.attention_recovery = num_recovery ? recovery / num_recovery : -1.0;
    return f;
  };
  PolicyFidelity base = summarize("full", 1.0, dense_policies, dense, kernels::DType::kF32);
  out.push_back(base);
  if (on_result) on_result(base);
  for (size_t i = 1; i < settings.size(); ++i) {
    const PolicySetting& setting = settings[i];
    const auto [policies, results] = evaluate(setting);
    PolicyFidelity f =
        summarize(setting.family, setting.budget, policies, results, setting.kv_dtype);
    f.perplexity_delta = f.perplexity - base.perplexity;
    out.push_back(f);
    if (on_result) on_result(f);
  }
  return out;
}

std::string fidelity_svg(const std::vector<PolicyFidelity>& results, const std::string& title) {
  // One line per family, from the dense point (1, 1) down to its tightest budget.
  std::vector<std::string> families;
  std::vector<svg::Line> lines;
  for (const PolicyFidelity& r : results) {
    if (r.family == "full") continue;
    auto it = std::find(families.begin(), families.end(), r.family);
    if (it == families.end()) {
      families.push_back(r.family);
      lines.push_back({svg::kColours[(families.size() - 1) % std::size(svg::kColours)], false, {}});
      if (!results.empty() && results.front().family == "full") {
        lines.back().points.emplace_back(results.front().kv_kept, results.front().top1_agreement);
      }
      it = families.end() - 1;
    }
    lines[static_cast<size_t>(it - families.begin())].points.emplace_back(r.kv_kept,
                                                                          r.top1_agreement);
  }
  for (svg::Line& line : lines) std::sort(line.points.begin(), line.points.end());
  const double height = std::max(svg::kPanelHeight + 40,
                                 svg::kTop + 60 + 20.0 * static_cast<double>(families.size()));
  std::string out = svg::document_begin(svg::kPanelWidth + 160, height, title);
  out += svg::panel(0, 30, "top-1 agreement vs KV kept", "KV kept (fraction of dense pages)",
                    "top-1 agreement with dense", lines, false);
  for (size_t f = 0; f < families.size(); ++f) {
    out += svg::legend_entry(svg::kPanelWidth + 10, 30 + svg::kTop + 20.0 * static_cast<double>(f),
                             lines[f].colour, families[f]);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace sieve::eval
