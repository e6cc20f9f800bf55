// pyramidkv (PyramidKV): a scored policy (snapkv unless score= says otherwise) whose budget
// shrinks from the lowest layer it covers to the top (B_top = B / beta), the per-layer budgets
// summing to num_layers * B. Its heads are the scored policy's heads with their layer's budget.
#include <algorithm>
#include <cmath>

#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

namespace {

const Param<PyramidKvSpec> kPyramidKvParams[] = {
    {"beta", &PyramidKvSpec::beta, "top layer budget = B / beta",
     AtLeast(1, "(1 = uniform budgets)")},
};

class PyramidKvType final : public ScoredWrapper<PyramidKvSpec> {
 public:
  PyramidKvType() : ScoredWrapper(kPyramidKvParams, {}) {}
  std::string_view name() const override { return "pyramidkv"; }
  std::string_view budget_pattern() const override { return "pyramidkv:B={budget},W={window}"; }

 protected:
  void resolve_spec(const PyramidKvSpec& spec, const std::vector<Cell>& cells,
                    Resolver& resolver) const override {
    std::vector<int64_t> layers;
    for (const Cell& c : cells) layers.push_back(c.layer);
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    const std::vector<int64_t> budgets =
        pyramid_budgets(scored_budget(spec.scored), spec.beta, static_cast<int64_t>(layers.size()));
    for (const Cell& c : cells) {
      const auto rank = std::lower_bound(layers.begin(), layers.end(), c.layer) - layers.begin();
      ScoredSpec layer_spec = spec.scored;
      set_scored_budget(layer_spec, budgets[static_cast<size_t>(rank)]);
      std::visit([&](const auto& head) { resolver.set(c, head); }, layer_spec);
    }
  }
};

}  // namespace

std::vector<int64_t> pyramid_budgets(int64_t mean_budget, double beta, int64_t num_layers) {
  if (num_layers <= 0) return {};
  if (num_layers == 1) return {mean_budget};
  const double mean = static_cast<double>(mean_budget);
  const double top = mean / beta;
  const double bottom = 2.0 * mean - top;
  std::vector<int64_t> budgets(static_cast<size_t>(num_layers));
  std::vector<std::pair<double, int64_t>> remainders;  // (fraction, layer)
  int64_t total = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    const double exact =
        bottom - (bottom - top) * static_cast<double>(l) / static_cast<double>(num_layers - 1);
    const double floor = std::floor(exact);
    budgets[static_cast<size_t>(l)] = static_cast<int64_t>(floor);
    total += budgets[static_cast<size_t>(l)];
    remainders.emplace_back(exact - floor, l);
  }
  // Largest remainders first, ties to the lower layer.
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  int64_t missing = num_layers * mean_budget - total;
  for (size_t i = 0; missing > 0; i = (i + 1) % remainders.size(), --missing) {
    ++budgets[static_cast<size_t>(remainders[i].second)];
  }
  return budgets;
}

const PolicyType& pyramidkv_policy_type() {
  static const PyramidKvType type;
  return type;
}

}  // namespace sieve::sparsity
