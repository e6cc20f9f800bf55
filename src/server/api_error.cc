#include "server/api_error.h"

#include <fmt/format.h>

namespace sieve::server {

json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param ? json(*param) : json(nullptr)},
            {"code", code ? json(*code) : json(nullptr)}}}};
}

void throw_invalid(std::string param, std::string message) {
  throw ApiException(
      ApiError{.status = 400, .message = std::move(message), .param = std::move(param)});
}

ApiError model_not_found(const std::string& name) {
  return ApiError{.status = 404,
                  .message = fmt::format("The model `{}` does not exist.", name),
                  .type = "NotFoundError",
                  .param = "model",
                  .code = "model_not_found"};
}

ApiError admission_api_error(const engine::AdmissionError& refusal) {
  ApiError error{.status = 400, .message = refusal.message, .param = refusal.param};
  switch (refusal.kind) {
    case engine::AdmissionError::Kind::kQueueFull:
      error.status = 503;
      error.type = "server_overloaded";
      error.code = "queue_full";
      break;
    case engine::AdmissionError::Kind::kTooLong:
      error.code = "context_length_exceeded";
      break;
    case engine::AdmissionError::Kind::kNeverFits:
      error.code = "kv_cache_too_small";
      break;
    case engine::AdmissionError::Kind::kInvalidParams:
      break;
  }
  return error;
}

}  // namespace sieve::server
