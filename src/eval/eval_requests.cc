#include "eval/eval_requests.h"

#include <map>

#include "sparsity/policy_spec.h"
#include "util/error.h"

namespace sieve::eval {

std::vector<EvalOutput> run_eval_requests(engine::Engine& engine,
                                          std::span<const EvalRequest> requests) {
  std::vector<EvalOutput> outputs(requests.size());
  std::vector<std::optional<std::string>> errors(requests.size());
  std::map<engine::RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    const EvalRequest& r = requests[i];
    engine::Request request{.prompt = r.prompt, .kv_policy = sparsity::parse_policy(r.policy)};
    request.params.max_tokens = r.max_tokens;
    request.params.ignore_eos = r.ignore_eos;
    request.params.forced_tokens = r.forced;
    request.params.logprobs = r.logprobs;
    request.params.full_logprobs = r.full_logprobs;
    auto submitted = engine.submit(
        std::move(request), [&outputs, &errors, &index](const engine::RequestEvent& event) {
          const size_t at = index.at(event.request_id);
          EvalOutput& out = outputs[at];
          out.tokens.insert(out.tokens.end(), event.tokens.begin(), event.tokens.end());
          out.steps.insert(out.steps.end(), event.logprobs.begin(), event.logprobs.end());
          if (event.finish) out.usage = event.usage;
          if (event.error) errors[at] = event.error;
        });
    if (const auto* rejection = std::get_if<engine::AdmissionError>(&submitted)) {
      fail("policy '{}' refused: {}", r.policy, rejection->message);
    }
    index[std::get<engine::RequestId>(submitted)] = i;
  }
  engine.run_until_idle();
  for (const auto& error : errors) {
    if (error) fail("an evaluation request failed: {}", *error);
  }
  return outputs;
}

}  // namespace sieve::eval
