#pragma once
// Why the engine refused a request: one type for every admission outcome, from parameter
// checks (check_sampling_params) to the queue limit, so that callers map `kind` to their own
// answer (an HTTP status) and `param` names the field at fault without reading the message.
#include <optional>
#include <string>
#include <utility>

namespace sieve::engine {

struct AdmissionError {
  enum class Kind {
    kInvalidParams,  // a field of the request is wrong (param says which)
    kTooLong,        // prompt + max_tokens exceeds the model's context
    kNeverFits,      // needs more KV pages than the whole pool has
    kQueueFull,      // load shedding: max_queued requests are already waiting
  };
  Kind kind = Kind::kInvalidParams;
  // The request field at fault, as the OpenAI API names it (SamplingParams' fields carry those
  // names; stop_strings is "stop"); nullopt when no one field is.
  std::optional<std::string> param;
  std::string message;  // what is wrong, in words a user can act on

  static AdmissionError invalid(std::string param, std::string message) {
    return {Kind::kInvalidParams, std::move(param), std::move(message)};
  }
};

}  // namespace sieve::engine
